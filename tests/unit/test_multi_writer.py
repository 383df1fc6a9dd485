"""The routed sink's task writer (writer/multi.py): rows of many tables in one task, the open-file and
buffer limits held across tables, every row written once to its own table's files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink.writer.multi import MultiTableTaskWriter, split_by_column
from tests.helpers import writer_spec

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "s", StringType(), required=False))
ROUTE = "__iceberg_sink_table"


def routed_rows(tables: int, per_table: int, offset: int = 0) -> pa.Table:
    rows = [(f"db.t{t}", offset + t * 1000 + i, "x" * (i % 50)) for i in range(per_table) for t in range(tables)]
    return pa.table(
        {
            ROUTE: pa.array([r[0] for r in rows], pa.string()),
            "id": pa.array([r[1] for r in rows], pa.int64()),
            "s": pa.array([r[2] for r in rows], pa.string()),
        }
    )


def test_split_by_column_keeps_every_row_once() -> None:
    batch = routed_rows(5, 7)
    parts = dict(split_by_column(batch, ROUTE))
    assert sorted(parts) == [f"db.t{t}" for t in range(5)]
    assert sum(p.num_rows for p in parts.values()) == batch.num_rows
    assert all(set(p.column(ROUTE).to_pylist()) == {name} for name, p in parts.items())


def test_split_by_column_keeps_each_tables_row_order_and_null_routes() -> None:
    names = ["db.b", "db.a", None, "db.b", "db.a", "db.b"]
    batch = pa.table({ROUTE: pa.array(names, pa.large_string()), "id": pa.array(range(6), pa.int64())})
    parts = list(split_by_column(batch, ROUTE))
    assert [(name, p.column("id").to_pylist()) for name, p in parts] == [
        ("db.a", [1, 4]),
        ("db.b", [0, 3, 5]),
        (None, [2]),
    ]
    single = pa.table({ROUTE: pa.array(["db.a"] * 3), "id": pa.array([3, 1, 2], pa.int64())})
    assert [(n, p.column("id").to_pylist()) for n, p in split_by_column(single, ROUTE)] == [("db.a", [3, 1, 2])]


@pytest.mark.parametrize("buffer_bytes", [1, 64 * 1024])
def test_open_files_and_buffers_are_bounded_across_tables(catalog: Catalog, buffer_bytes: int) -> None:
    catalog.create_namespace_if_not_exists("db")
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(3), "id_bucket"))
    tables = 40
    specs = {}
    for t in range(tables):
        table = catalog.create_table(f"db.t{t}", schema=SCHEMA, partition_spec=spec)
        # Each table alone may keep 100 files open: the task's limit of 5 must hold across all of them.
        specs[f"db.t{t}"] = writer_spec(table, max_open_files=100, buffer_bytes=buffer_bytes)
    writer = MultiTableTaskWriter(specs, ROUTE, task_id=0, attempt_id=0, max_open_files=5, buffer_bytes=buffer_bytes)
    batches = [routed_rows(tables, 6, offset=b * 100) for b in range(4)]
    for batch in batches:
        writer.write(batch)
        assert writer.open_files <= 5
        assert sum(w.buffered_bytes for w in writer._writers.values()) <= 4 * buffer_bytes + batch.nbytes
    results = writer.complete()
    assert writer.peak_open_files <= 5
    assert sorted(results) == sorted(specs)
    for name, result in results.items():
        ids = []
        for f in result.data_files:
            assert f"/t{name.split('.t')[1]}/" in f.path  # each table's files under its own location
            ids += pq.read_table(f.path.removeprefix("file://")).column("id").to_pylist()
        expected = [
            i for b in batches for i, r in zip(b["id"].to_pylist(), b[ROUTE].to_pylist(), strict=True) if r == name
        ]
        assert sorted(ids) == sorted(expected), name


def test_a_row_for_an_unplanned_table_is_refused_and_files_are_deleted(catalog: Catalog) -> None:
    catalog.create_namespace_if_not_exists("db")
    table = catalog.create_table("db.t0", schema=SCHEMA)
    writer = MultiTableTaskWriter(
        {"db.t0": writer_spec(table, buffer_bytes=1)}, ROUTE, task_id=0, attempt_id=0, max_open_files=5, buffer_bytes=1
    )
    writer.write(routed_rows(1, 3))
    with pytest.raises(ValueError, match=r"routed row to an unplanned table: 'db\.t1'"):
        writer.write(routed_rows(2, 3))
    paths = [p for w in writer._writers.values() for p in w._created_paths]
    assert paths
    writer.abort()
    import os

    assert not any(os.path.exists(p.removeprefix("file://")) for p in paths)


def test_columns_a_table_lacks_are_left_out_when_null_and_refused_when_holding_values(catalog: Catalog) -> None:
    catalog.create_namespace_if_not_exists("db")
    table = catalog.create_table("db.t0", schema=SCHEMA)
    writer = MultiTableTaskWriter(
        {"db.t0": writer_spec(table)}, ROUTE, task_id=0, attempt_id=0, max_open_files=5, buffer_bytes=1 << 20
    )
    # Another routed table's column, null in all of db.t0's rows (routing.carried_columns left it out).
    rows = routed_rows(1, 3).append_column("other", pa.nulls(3, pa.string()))
    writer.write(rows)
    with pytest.raises(ValueError, match=r"unplanned column: 'other' of table 'db\.t0' holds values"):
        writer.write(routed_rows(1, 2).append_column("other", pa.array([None, "v"], pa.string())))
    [result] = writer.complete().values()
    [data] = result.data_files
    written = pq.read_table(data.path.removeprefix("file://"))
    assert written.column_names == ["id", "s"] and written.num_rows == 3


def test_nested_fields_a_table_lacks_are_left_out_when_null_and_refused_when_holding_values(catalog: Catalog) -> None:
    from pyiceberg.types import StructType

    catalog.create_namespace_if_not_exists("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "p", StructType(NestedField(3, "a", StringType(), required=False)), required=False),
    )
    table = catalog.create_table("db.nested", schema=schema)
    writer = MultiTableTaskWriter(
        {"db.nested": writer_spec(table)}, ROUTE, task_id=0, attempt_id=0, max_open_files=5, buffer_bytes=1 << 20
    )
    inner = pa.struct([("x", pa.int64()), ("y", pa.int64())])
    p_type = pa.struct([("a", pa.string()), ("b", pa.string()), ("q", inner)])

    def rows(p: pa.Array) -> pa.Table:
        return pa.table({ROUTE: pa.array(["db.nested"] * len(p)), "id": pa.array(range(len(p)), pa.int64()), "p": p})

    def p_array(a: list[str | None], b: list[str | None], y: list[int | None], mask: list[bool]) -> pa.Array:
        q = pa.StructArray.from_arrays([pa.nulls(len(a), pa.int64()), pa.array(y, pa.int64())], fields=list(inner))
        return pa.StructArray.from_arrays(
            [pa.array(a, pa.string()), pa.array(b, pa.string()), q], fields=list(p_type), mask=pa.array(mask)
        )

    # Other tables' nested fields (p.b, p.q and its fields), null in all of this table's rows, are left out; so is
    # a value under a struct that is null in its row (Spark's count of p.b does not count it either).
    writer.write(rows(p_array(["v", None, None], [None, None, "hidden"], [None, None, None], [False, False, True])))
    with pytest.raises(ValueError, match=r"unplanned column: 'p\.b' of table 'db\.nested' holds values"):
        writer.write(rows(p_array(["v", None], [None, "w"], [None, None], [False, False])))
    with pytest.raises(ValueError, match=r"unplanned column: 'p\.q' of table 'db\.nested' holds values"):
        writer.write(rows(p_array(["v", None], [None, None], [None, 3], [False, False])))
    [result] = writer.complete().values()
    [data] = result.data_files
    written = pq.read_table(data.path.removeprefix("file://"))
    assert written.column("p").to_pylist() == [{"a": "v"}, {"a": None}, None]


def test_fields_of_list_elements_and_map_values_a_table_lacks_are_left_out_when_null_and_refused_otherwise(
    catalog: Catalog,
) -> None:
    from pyiceberg.types import ListType, MapType, StructType

    catalog.create_namespace_if_not_exists("db")
    element = StructType(NestedField(3, "sku", StringType(), required=False))
    schema = Schema(
        NestedField(1, "items", ListType(2, element, element_required=False), required=False),
        NestedField(4, "m", MapType(5, StringType(), 6, element, value_required=False), required=False),
    )
    table = catalog.create_table("db.lists", schema=schema)
    writer = MultiTableTaskWriter(
        {"db.lists": writer_spec(table)}, ROUTE, task_id=0, attempt_id=0, max_open_files=5, buffer_bytes=1 << 20
    )
    union = pa.struct([("sku", pa.string()), ("qty", pa.int64())])

    def rows(items: list[object], m: list[object]) -> pa.Table:
        return pa.table(
            {
                ROUTE: pa.array(["db.lists"] * len(items)),
                "items": pa.array(items, pa.list_(union)),
                "m": pa.array(m, pa.map_(pa.string(), union)),
            }
        )

    # Another table's element field (qty), null in every element of this table's rows: left out.
    writer.write(
        rows([[{"sku": "a", "qty": None}, None], None, []], [[("k", {"sku": "b", "qty": None})], None, [("j", None)]])
    )
    # A sliced batch: the offsets of the slice are used, not the rows before it.
    sliced = rows([[{"sku": None, "qty": 1}], [{"sku": "c", "qty": None}]], [None, None]).slice(1)
    writer.write(sliced)
    with pytest.raises(ValueError, match=r"unplanned column: 'items\[\]\.qty' of table 'db\.lists' holds values"):
        writer.write(rows([[{"sku": "a", "qty": None}], [{"sku": None, "qty": 3}]], [None, None]))
    with pytest.raises(ValueError, match=r"unplanned column: 'm\{\}\.qty' of table 'db\.lists' holds values"):
        writer.write(rows([None], [[("k", {"sku": None, "qty": 4})]]))
    [result] = writer.complete().values()
    [data] = result.data_files
    written = pq.read_table(data.path.removeprefix("file://"))
    assert written.column("items").to_pylist() == [[{"sku": "a"}, None], None, [], [{"sku": "c"}]]
    assert written.column("m").to_pylist() == [[("k", {"sku": "b"})], None, [("j", None)], None]
