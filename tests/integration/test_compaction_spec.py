"""Compaction against the corners of the Iceberg spec that lose or resurrect rows.

Global equality deletes (unpartitioned spec) after partition-spec evolution, null-safe equality
deletes, schema evolution at every nesting level, commit retries after dropped groups, and the sort
order id of sorted output. Every table is read back by Apache Iceberg Java and DuckDB before and
after compaction; the two reads must be equal (and equal the model where there is one).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)
from pyspark.sql import SparkSession

from iceberg_sink import CompactionConfig, IcebergSink
from iceberg_sink._iceberg import producer, row_delta
from iceberg_sink._iceberg.files import arrow_schema
from iceberg_sink._iceberg.projection import key_schema
from iceberg_sink.committer.committer import RetryPolicy
from iceberg_sink.errors import CommitRetriesExhaustedError
from iceberg_sink.topology.compaction import compact
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from tests.integration.test_cdc import apply, frame, random_changes
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop


def both_read(java_reader: JavaIcebergReader, table: Table, key: str = "id") -> list[dict[str, Any]]:
    """The table read by Iceberg Java; DuckDB must read the same rows."""
    java = normalize(java_reader.read(table.metadata_location), [key])
    assert normalize(duckdb_read(table.metadata_location), [key]) == java
    return java


def live_delete_files(table: Table) -> list[dict[str, Any]]:
    return [f for f in table.inspect.files().to_pylist() if f["content"] != 0]


def evolve_spec(table: Table, partition_by: str | None) -> None:
    with table.update_spec() as update:
        if partition_by is None:
            update.remove_field(table.spec().fields[0].name)
        else:
            update.add_identity(partition_by)


# --- bug 4: global equality deletes -------------------------------------------------------------


def test_global_equality_deletes_survive_compaction(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Equality deletes of an unpartitioned spec apply to every partition of every spec: compaction
    must apply them when rewriting, and keep them while any other live file still needs them."""
    rng = random.Random(44)
    model: dict[int, dict[str, Any]] = {}
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.g")
        .create_if_missing(format_version=2)  # equality deletes; PyIceberg changes the spec (not on v3)
        # region is a function of id (r{id % 3}): a key row never moves between partitions.
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
        .build()
    )
    lsn = 0

    def checkpoint() -> None:
        nonlocal lsn
        changes = random_changes(rng, model, lsn, 40, keys=30)
        lsn = max(c["lsn"] for c in changes)
        sink.write(frame(spark, changes))
        apply(model, changes)

    # Unpartitioned, then partitioned by region, unpartitioned again: the deletes written now are
    # global and hit rows of every region. Then partitioned again, with only new keys, so that no
    # later partition delete hides what the global ones delete.
    checkpoint()
    checkpoint()
    for partition_by in ("region", None):
        evolve_spec(sink.load_table(), partition_by)
        checkpoint()
        checkpoint()
    evolve_spec(sink.load_table(), "region")
    inserts = [
        {"id": 1000 + i, "region": f"r{i % 3}", "v": "late" * i, "n": i, "lsn": lsn + 1 + i, "op": "I"}
        for i in range(12)
    ]
    sink.write(frame(spark, inserts))
    table = sink.load_table()
    unpartitioned = {s.spec_id for s in table.metadata.partition_specs if not s.fields}
    global_deletes = [f for f in live_delete_files(table) if f["spec_id"] in unpartitioned]
    assert global_deletes and len(unpartitioned) >= 1
    # The reference is the table as the readers see it now. (It is not the model: this stream's
    # partitioned deletes do not reach rows written before the spec changed, which is the CDC
    # writer's business, not compaction's.)
    before = both_read(java_reader, table)

    # Only region r0 of the partitioned specs: the global deletes apply to its rows, and are kept
    # because data files of the other regions and specs still need them.
    result = sink.compact(spark, partition_filter=lambda spec_id, values: values == ("r0",))
    assert result.committed_groups > 0
    table = sink.load_table()
    assert both_read(java_reader, table) == before
    still = {f["file_path"] for f in live_delete_files(table)}
    assert {f["file_path"] for f in global_deletes} <= still

    # Everything: no delete file is needed any more, and none is left.
    sink.compact(spark)
    table = sink.load_table()
    assert both_read(java_reader, table) == before
    assert live_delete_files(table) == []
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == before


# --- bug 6: equality deletes match null to null ------------------------------------------------


NULLS_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "tag", StringType(), required=False),
    NestedField(3, "code", IntegerType(), required=False),
    NestedField(
        4,
        "s",
        StructType(
            NestedField(5, "a", IntegerType(), required=False), NestedField(6, "b", StringType(), required=False)
        ),
        required=False,
    ),
    NestedField(7, "v", StringType(), required=False),
)


def commit_equality_deletes(
    table: Table,
    ids: list[int],
    rows: list[dict[str, Any]],
    spec_id: int | None = None,
    partition: tuple[Any, ...] = (),
) -> Table:
    """Another writer's equality delete file (pyarrow + the project's snapshot producer), of the
    current spec or of ``spec_id`` and ``partition``."""
    keys = pa.Table.from_pylist(rows, schema=arrow_schema(key_schema(table.schema(), ids)))
    path = f"{table.location()}/data/other-writer-{uuid.uuid4().hex}-eq-deletes.parquet"
    with table.io.new_output(path).create() as out:
        pq.write_table(keys, out)
    meta = DataFileMeta(
        content=FileContent.EQUALITY_DELETES,
        path=path,
        spec_id=table.spec().spec_id if spec_id is None else spec_id,
        partition=partition,
        record_count=keys.num_rows,
        file_size_in_bytes=len(table.io.new_input(path)),
        equality_ids=tuple(ids),
    )
    prepared = row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(delete_files=(meta,)), {}).prepare()
    return producer.commit_prepared(table, prepared)


def test_equality_deletes_with_null_keys_stay_applied(
    spark: SparkSession, java_reader: JavaIcebergReader, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """An equality delete's null matches a null (Iceberg Java's StructLikeSet), in single, multi
    and nested keys; for a nested field, a null struct and a struct with a null field differ."""
    catalog.create_namespace("db")
    table = catalog.create_table("db.nulls", NULLS_SCHEMA)
    ids = {name: table.schema().find_field(name).field_id for name in ("tag", "code", "s.a", "v")}
    rng = random.Random(6)
    rows = []
    for i in range(150):
        rows.append(
            {
                "id": i,
                "tag": rng.choice([None, "t1", "t2", "x" * 300]),
                "code": rng.choice([None, 1, 2]),
                "s": None if i % 11 == 0 else {"a": rng.choice([None, 1, 2]), "b": f"b{i}"},
                "v": None if i % 5 == 0 else f"v{i % 4}" * 3,
            }
        )
    for start in range(0, 150, 50):
        table.append(pa.Table.from_pylist(rows[start : start + 50], schema=arrow_schema(table.schema())))
    # Another writer's deletes, one key set per file (Iceberg Java 1.9 mixes up nested keys of
    # several rows of one delete file, so nested keys get a file of their own).
    table = commit_equality_deletes(table, [ids["tag"]], [{"tag": None}, {"tag": "x" * 300}])
    table = commit_equality_deletes(
        table,
        [ids["code"], ids["v"]],
        [{"code": None, "v": None}, {"code": 1, "v": None}, {"code": None, "v": "v1v1v1"}],
    )
    table = commit_equality_deletes(table, [ids["s.a"]], [{"s": {"a": None}}])
    table = commit_equality_deletes(table, [ids["code"], ids["s.a"]], [{"code": None, "s": {"a": 2}}])
    table = commit_equality_deletes(table, [ids["s.a"]], [{"s": None}])

    def deleted(r: dict[str, Any]) -> bool:
        s = r["s"]
        return (
            r["tag"] in (None, "x" * 300)
            or (r["code"], r["v"]) in ((None, None), (1, None), (None, "v1v1v1"))
            or (s is not None and s["a"] is None)
            or (r["code"] is None and s is not None and s["a"] == 2)
            or s is None
        )

    model = normalize(
        pa.Table.from_pylist([r for r in rows if not deleted(r)], schema=arrow_schema(table.schema())), ["id"]
    )
    assert 0 < len(model) < 150
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == model
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.nulls").build()
    result = sink.compact(spark)
    assert result.committed_groups == 1 and result.removed_delete_files == 5
    table = catalog.load_table("db.nulls")
    assert live_delete_files(table) == []
    assert both_read(java_reader, table) == model


# --- bug 7: schema evolution at every nesting level --------------------------------------------


EVOLVING_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "n", IntegerType(), required=False),
    NestedField(
        3,
        "s",
        StructType(
            NestedField(4, "a", IntegerType(), required=False), NestedField(5, "b", StringType(), required=False)
        ),
        required=False,
    ),
    NestedField(6, "gone", StringType(), required=False),
    NestedField(
        7,
        "items",
        ListType(
            8,
            StructType(
                NestedField(9, "x", IntegerType(), required=False), NestedField(10, "y", StringType(), required=False)
            ),
            element_required=False,
        ),
        required=False,
    ),
    NestedField(
        11,
        "m",
        MapType(
            12, StringType(), 13, StructType(NestedField(14, "p", IntegerType(), required=False)), value_required=False
        ),
        required=False,
    ),
)


def test_compaction_reads_old_files_by_field_id_at_every_level(
    spark: SparkSession, java_reader: JavaIcebergReader, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_namespace("db")
    table = catalog.create_table("db.evolve", EVOLVING_SCHEMA)
    old = [
        {
            "id": i,
            "n": None if i % 7 == 0 else i * 1000,
            "s": None if i % 9 == 0 else {"a": i, "b": "old-" + "b" * (i % 50)},
            "gone": f"dropped {i}",
            "items": None if i % 8 == 0 else [{"x": i, "y": f"y{i}"}, None, {"x": None, "y": None}],
            "m": None if i % 6 == 0 else {f"k{i}": {"p": i}, "null": None},
        }
        for i in range(60)
    ]
    for start in range(0, 60, 20):
        table.append(pa.Table.from_pylist(old[start : start + 20], schema=arrow_schema(table.schema())))
    with table.update_schema() as update:
        update.rename_column("s.b", "bee")
        update.rename_column("items.element.y", "why")
        update.rename_column("m.value.p", "pee")
        update.update_column("n", LongType())
        update.update_column("s.a", LongType())
        update.update_column("items.element.x", LongType())
        update.add_column("extra", StringType())
        update.add_column(("s", "c"), LongType())
        update.add_column(("items", "element", "z"), StringType())
        update.add_column(("m", "value", "q"), StringType())
        update.delete_column("gone")
    table = catalog.load_table("db.evolve")
    new = [
        {
            "id": 100 + i,
            "n": 2**40 + i,
            "s": {"a": 2**35, "bee": f"new{i}", "c": -i},
            "items": [{"x": 2**33, "why": "w", "z": "zed"}],
            "m": {"k": {"pee": i, "q": "q" * 200}},
            "extra": None if i % 2 else f"extra{i}",
        }
        for i in range(20)
    ]
    for start in range(0, 20, 10):
        table.append(pa.Table.from_pylist(new[start : start + 10], schema=arrow_schema(table.schema())))
    table = catalog.load_table("db.evolve")
    before = both_read(java_reader, table)
    assert len(before) == 80
    # The old rows as the new schema sees them (renamed, widened, added as null, dropped gone).
    first = next(r for r in before if r["id"] == 1)
    assert first["s"] == {"a": 1, "bee": "old-b", "c": None} and first["n"] == 1000 and "gone" not in first
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.evolve").build()
    result = sink.compact(spark)
    assert result.rewritten_data_files == 5
    table = catalog.load_table("db.evolve")
    assert len(table.inspect.files()) == 1
    assert both_read(java_reader, table) == before


# --- bug 10: retries after dropped groups leave no KeyError and no orphans ---------------------


def racing(load: Callable[[], Table], on_call: dict[int, Callable[[], Table | None]]) -> Callable[[], Table]:
    """A table loader that lets other writers act on the given calls (1: plan, 2: first commit...).

    A hook returning a table makes the loader return it (a stale table: its commit will conflict).
    """
    calls = {"n": 0}

    def loader() -> Table:
        calls["n"] += 1
        hook = on_call.get(calls["n"])
        stale = hook() if hook is not None else None
        return stale if stale is not None else load()

    return loader


def files_on_disk(table: Table) -> set[str]:
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    return {str(p) for p in data_dir.rglob("*.parquet")}


def files_ever_referenced(table: Table) -> set[str]:
    """Every data and delete file of every snapshot of ``table``."""
    paths = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(entry.data_file.file_path.removeprefix("file://"))
    return paths


def partitioned_sink(tmp_path: Path) -> Any:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.r").create_if_missing(partition_by=["p"]).build()
    return sink


def test_retry_after_a_dropped_group_commits_the_rest(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = partitioned_sink(tmp_path)
    for i in range(3):
        sink.write(spark.createDataFrame([(i * 10 + j, j % 2) for j in range(10)], "id long, p long"))

    def other_writers() -> Table:
        # Another compaction takes partition p=0 (that group is dropped), and a stream commits
        # after our load, so our first commit attempt loses the race.
        sink.compact(spark, partition_filter=lambda spec_id, values: values == (0,))
        stale = sink.load_table()
        sink.write(spark.createDataFrame([(100, 1)], "id long, p long"))
        return stale

    # One plan: the dropped groups are not planned again in this run.
    result = compact(spark, racing(sink.load_table, {2: other_writers}), CompactionConfig(max_replans=0))
    assert result.committed_groups == 1 and result.dropped_groups == 1
    table = sink.load_table()
    assert sorted(r["id"] for r in both_read(java_reader, table)) == [*range(30), 100]
    assert files_on_disk(table) <= files_ever_referenced(table)


def test_group_moved_to_a_new_spec_is_dropped_when_its_old_partition_gets_deletes(
    spark: SparkSession, java_reader: JavaIcebergReader, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    """Compaction writes the current spec. An equality delete committed meanwhile in an input file's
    old spec and partition applies to the input files but would not to the new files (other spec):
    that group must not commit, or the deleted rows come back."""
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "p", LongType(), required=True))
    table = catalog.create_table(
        "db.moved", schema, partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"))
    )
    for i in range(2):
        rows = [{"id": i * 10 + j, "p": j % 2} for j in range(10)]
        table.append(pa.Table.from_pylist(rows, schema=arrow_schema(table.schema())))
    evolve_spec(table, None)
    table = catalog.load_table("db.moved")
    old_spec = next(s.spec_id for s in table.metadata.partition_specs if s.fields)
    id_field = table.schema().find_field("id").field_id

    def delete_in_old_partition() -> None:
        current = catalog.load_table("db.moved")
        commit_equality_deletes(current, [id_field], [{"id": 0}, {"id": 12}], spec_id=old_spec, partition=(0,))

    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.moved").build()
    # One plan: the dropped groups are not planned again in this run.
    result = compact(spark, racing(sink.load_table, {2: delete_in_old_partition}), CompactionConfig(max_replans=0))
    table = catalog.load_table("db.moved")
    expected_ids = [i for i in range(20) if i not in (0, 12)]
    assert sorted(r["id"] for r in both_read(java_reader, table)) == expected_ids
    assert result.committed_groups == 1 and result.dropped_groups == 1


def test_final_failed_attempt_deletes_every_new_file(spark: SparkSession, tmp_path: Path) -> None:
    sink = partitioned_sink(tmp_path)
    for i in range(3):
        sink.write(spark.createDataFrame([(i * 10 + j, j % 2) for j in range(10)], "id long, p long"))
    n = {"writes": 0}

    def stale_after_drop() -> Table:
        sink.compact(spark, partition_filter=lambda spec_id, values: values == (0,))
        return stale()

    def stale() -> Table:
        table = sink.load_table()
        n["writes"] += 1
        sink.write(spark.createDataFrame([(1000 + n["writes"], 1)], "id long, p long"))
        return table

    loader = racing(sink.load_table, {2: stale_after_drop, 3: stale})
    with pytest.raises(CommitRetriesExhaustedError):
        compact(spark, loader, CompactionConfig(), retry=RetryPolicy(num_retries=1, min_wait_ms=1))
    table = sink.load_table()
    assert files_on_disk(table) <= files_ever_referenced(table)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [*range(30), 1001, 1002]


# --- sorted output records the table's sort order -----------------------------------------------


def test_sorted_output_records_sort_order_id(
    spark: SparkSession, java_reader: JavaIcebergReader, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    catalog.create_namespace("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "p", LongType(), required=False),
    )
    table = catalog.create_table(
        "db.sorted", schema, partition_spec=PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "p"))
    )
    rng = random.Random(3)
    rows = [
        {"id": rng.choice([None, rng.randrange(1000)]), "name": rng.choice([None, "a", "b", "c"]), "p": i % 2}
        for i in range(300)
    ]
    for start in range(0, 300, 100):
        table.append(pa.Table.from_pylist(rows[start : start + 100], schema=arrow_schema(schema)))
    with table.update_sort_order() as order:
        order.desc("name", IdentityTransform(), NullOrder.NULLS_FIRST)
        order.asc("id", IdentityTransform(), NullOrder.NULLS_LAST)
    table = catalog.load_table("db.sorted")
    order_id = table.sort_order().order_id
    assert order_id > 0 and table.sort_order().fields[0].direction == SortDirection.DESC
    before = both_read(java_reader, table, "id")
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.sorted").build()
    assert sink.compact(spark).added_data_files == 2
    table = catalog.load_table("db.sorted")
    assert both_read(java_reader, table, "id") == before
    entries = table.inspect.entries().to_pylist()
    live = [e for e in entries if e["status"] != 2]
    assert len(live) == 2 and {e["data_file"]["sort_order_id"] for e in live} == {order_id}
    java_files = java_reader.files(table.metadata_location).to_pylist()
    assert {f["sort_order_id"] for f in java_files} == {order_id}
    for f in live:
        with table.io.new_input(f["data_file"]["file_path"]).open() as stream:
            got = pq.read_table(stream).select(["name", "id"]).to_pylist()

        def key(r: dict[str, Any]) -> tuple[Any, ...]:
            name, id_ = r["name"], r["id"]
            # name desc nulls first, then id asc nulls last.
            return (name is not None, tuple(-ord(c) for c in name or ""), id_ is None, id_ or 0)

        assert got == sorted(got, key=key)
