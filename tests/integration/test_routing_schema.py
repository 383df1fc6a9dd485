"""Each routed table's input is its own columns (TableBinding.own_columns, routing.carried_columns).

A multi-table Debezium stream expands ``after``/``before`` into the union of every source table's
columns; a table's rows hold null in the others'. Per table and batch, the columns with a value in at
least one of its rows (plus its own and the key/op/order columns) are its input: creation and schema
evolution see only those, and the writer leaves the others (all null there) out. Every table is
read back by Iceberg Java and DuckDB and compared with its model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, SchemaMismatchError
from tests.integration.test_debezium import event
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

CUSTOMERS_V1 = [("id", "int64"), ("name", "string")]
CUSTOMERS_V2 = [("id", "int64"), ("name", "string"), ("email", "string")]  # ALTER TABLE customers ADD email
ORDERS = [("id", "int64"), ("customer_id", "int64"), ("amount", "float64")]


class Topic:
    """One Debezium topic carrying the change events of several source tables, and each table's model."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.models: dict[str, dict[int, dict[str, Any]]] = {}
        self.lsn = 0

    def batch(self) -> None:
        self.batches.append([])

    def change(self, table: str, op: str, row: dict[str, Any], columns: list[tuple[str, str]] | None) -> None:
        self.lsn += 10
        model = self.models.setdefault(table, {})
        before = model.get(row["id"])
        if before is not None:
            before = {k: v for k, v in before.items() if k != "lsn"}
        value = event(op, self.lsn, before if op in ("u", "d") else None, None if op == "d" else row, columns, table)
        self.batches[-1].append({"key": json.dumps({"id": row["id"]}), "value": value})
        if op == "d":
            model.pop(row["id"], None)
            self.batches[-1].append({"key": json.dumps({"id": row["id"]}), "value": None})  # tombstone
        else:
            model[row["id"]] = {**row, "lsn": self.lsn}

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        for i, rows in enumerate(self.batches):
            path = folder / f"part-{i:03d}.json"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def check_readers(java: JavaIcebergReader, table: Table, model: dict[int, dict[str, Any]]) -> None:
    columns = [f.name for f in table.schema().fields]
    want = sorted(({c: row.get(c) for c in columns} for row in model.values()), key=lambda r: r["id"])
    assert normalize(java.read(table.metadata_location), ["id"]) == want, f"{table.name()}: Iceberg Java"
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want, f"{table.name()}: DuckDB"


def test_routed_debezium_stream_evolves_each_table_with_its_own_columns_only(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    topic = Topic()
    topic.batch()  # checkpoint 0: both tables created, each with its own columns
    for i in range(1, 4):
        topic.change("customers", "r", {"id": i, "name": f"c{i}"}, CUSTOMERS_V1)
        topic.change("orders", "r", {"id": 10 + i, "customer_id": i, "amount": i * 1.5}, ORDERS)
    topic.batch()  # checkpoint 1: customers is altered mid-batch (email); orders only deletes and updates
    topic.change("customers", "u", {"id": 1, "name": "c1b"}, CUSTOMERS_V1)
    topic.change("orders", "d", {"id": 11}, ORDERS)
    topic.change("customers", "c", {"id": 4, "name": "c4", "email": "c4@example.com"}, CUSTOMERS_V2)
    topic.change("customers", "u", {"id": 2, "name": "c2", "email": None}, CUSTOMERS_V2)
    topic.change("orders", "u", {"id": 12, "customer_id": 2, "amount": 99.0}, ORDERS)
    topic.batch()  # checkpoint 2: schemas.enable=false, types inferred from the documents
    topic.change("orders", "c", {"id": 14, "customer_id": 4, "amount": 4.0}, None)
    topic.change("customers", "u", {"id": 3, "name": "c3", "email": "c3@example.com"}, None)
    topic.change("customers", "d", {"id": 2}, None)
    topic.write(tmp_path / "topic")

    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="source_table", namespace="cdc")
        .create_if_missing(partition_by=["bucket(2, id)"])
        .debezium(value_column="value", table_fields=("table",))  # the pre-issue-18 names (docs/cdc.md)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .schema_evolution("add-columns")
        .build()
    )
    stream = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
    query = sink.start(stream.json(str(tmp_path / "topic")), str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None

    customers = catalog.load_table("cdc.customers")  # type: ignore[attr-defined]
    orders = catalog.load_table("cdc.orders")  # type: ignore[attr-defined]
    assert sorted(f.name for f in customers.schema().fields) == ["email", "id", "lsn", "name"]
    assert sorted(f.name for f in orders.schema().fields) == ["amount", "customer_id", "id", "lsn"]
    # customers was created without email and evolved once; orders never changed.
    assert [sorted(s.column_names) for s in customers.schemas().values()] == [
        ["id", "lsn", "name"],
        ["email", "id", "lsn", "name"],
    ]
    assert len(orders.schemas()) == 1
    assert not customers.schema().find_field("email").required
    for table in (customers, orders):
        assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]
    check_readers(java_reader, customers, topic.models["customers"])
    check_readers(java_reader, orders, topic.models["orders"])
    assert sorted(topic.models["customers"]) == [1, 3, 4]


EVENTS_DDL = "tbl string, id long, name string, score double, note string"


def test_without_evolution_only_the_columns_a_tables_rows_carry_must_fit_it(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    catalog.create_namespace("db")  # type: ignore[attr-defined]
    # Two tables of different columns, fed from one stream whose schema is the union of theirs.
    a = catalog.create_table(  # type: ignore[attr-defined]
        "db.a", Schema(NestedField(1, "id", LongType()), NestedField(2, "name", StringType()))
    )
    b = catalog.create_table(  # type: ignore[attr-defined]
        "db.b", Schema(NestedField(1, "id", LongType()), NestedField(2, "score", DoubleType()))
    )
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing()
        .build()
    )
    ckpt = str(tmp_path / "ck")
    # Each table's rows carry its own columns only; db.c is created, without evolution with every
    # input column (its rows leave score and note null: it could never get them later).
    first = [("a", 1, "x", None, None), ("a", 2, "y", None, None), ("b", 1, None, 1.5, None), ("c", 1, "c", None, None)]
    sink.write(spark.createDataFrame(first, EVENTS_DDL).repartition(2), checkpoint_location=ckpt)
    c = catalog.load_table("db.c")  # type: ignore[attr-defined]
    assert c.schema().column_names == ["id", "name", "score", "note"]

    # A value in a column db.a lacks is the clear error naming it; nothing of the batch is written.
    bad = [("a", 3, "z", 2.0, None), ("b", 2, None, 2.5, None)]
    with pytest.raises(SchemaMismatchError, match=r"table db\.a .*\n  - score: column is not in the table"):
        sink.write(spark.createDataFrame(bad, EVENTS_DDL), checkpoint_location=ckpt)
    for name in ("db.a", "db.b", "db.c"):
        assert len(catalog.load_table(name).snapshots()) == 1  # type: ignore[attr-defined]

    # Columns null in all of a table's rows do not matter to it; its own all-null columns are written null.
    good = [
        ("a", 3, "z", None, None),
        ("a", 4, None, None, None),
        ("b", 2, None, 2.5, None),
        ("b", 3, None, None, None),
    ]
    sink.write(spark.createDataFrame(good, EVENTS_DDL), checkpoint_location=ckpt, checkpoint_id=1)
    a, b = catalog.load_table("db.a"), catalog.load_table("db.b")  # type: ignore[attr-defined]
    assert a.schema().column_names == ["id", "name"] and b.schema().column_names == ["id", "score"]
    check_readers(
        java_reader,
        a,
        {1: {"id": 1, "name": "x"}, 2: {"id": 2, "name": "y"}, 3: {"id": 3, "name": "z"}, 4: {"id": 4, "name": None}},
    )
    check_readers(java_reader, b, {1: {"id": 1, "score": 1.5}, 2: {"id": 2, "score": 2.5}, 3: {"id": 3, "score": None}})
    check_readers(java_reader, c, {1: {"id": 1, "name": "c", "score": None, "note": None}})


# -- nested struct fields: each table gets the fields of a shared struct column its rows carry --------


def nested_paths(table: Table) -> list[str]:
    """Every field of ``table``'s schema as a dotted path (structs included), sorted."""
    schema = table.schema()
    return sorted(schema.find_column_name(i) or "" for i in schema._lazy_id_to_field)  # type: ignore[attr-defined]


def schema_history(table: Table) -> list[list[str]]:
    out = []
    for s in table.schemas().values():
        out.append(sorted(s.find_column_name(i) or "" for i in s._lazy_id_to_field))  # type: ignore[attr-defined]
    return out


def test_routed_json_stream_gives_each_table_only_the_nested_fields_its_rows_carry(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    from iceberg_sink.sources.readers import read_json
    from tests.integration.test_schema_evolution import json_files

    # One JSON topic for three tables; read_json parses each batch into the union struct `payload`,
    # so every table's rows carry every table's nested fields (null in the others').
    batches: list[list[dict[str, Any]]] = [
        [
            {"tbl": "users", "id": 1, "payload": {"name": "ada", "addr": {"city": "paris"}, "items": [{"sku": "u1"}]}},
            # payload.note is null in all of orders' rows: never added to it.
            {
                "tbl": "orders",
                "id": 1,
                "payload": {"amount": 1.5, "addr": {"zip": "75001"}, "note": None, "items": [{"sku": "o1", "qty": 2}]},
            },
            # Only nulls below payload.addr and in payload.extra: events gets neither.
            {"tbl": "events", "id": 1, "payload": {"kind": "click", "addr": {"city": None}, "extra": None}},
        ],
        [
            # A nested field added mid-stream (addr.country): it lands in users only.
            # The elements of a list of structs are taken per table too: users' items keep sku only.
            {
                "tbl": "users",
                "id": 2,
                "payload": {"name": "bob", "addr": {"city": "rome", "country": "it"}, "items": [{"sku": "u2"}, {}]},
            },
            {"tbl": "orders", "id": 2, "payload": {"amount": 2.5, "note": None, "addr": None, "items": []}},
            # events now carries addr.city and items[].ev: added to it with those fields only (adding
            # ev to users' or orders' items would be refused: no fields are added inside lists).
            {"tbl": "events", "id": 2, "payload": {"kind": "view", "addr": {"city": "oslo"}, "items": [{"ev": 1}]}},
            {"tbl": "events", "id": 3, "payload": {"kind": None}},
        ],
        [
            {"tbl": "orders", "id": 3, "payload": {"amount": 3.0, "addr": {"zip": "00100", "country": None}}},
            {"tbl": "users", "id": 3, "payload": {"addr": {"country": "fr"}}},
            # payload.extra, a string (null only) in batch 0, is a struct now: only events gets it.
            {"tbl": "events", "id": 4, "payload": {"kind": "buy", "extra": {"deep": {"x": 7}}}},
        ],
    ]
    json_files(tmp_path / "src", batches)
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="nest")
        .create_if_missing()
        .map_batches(lambda b: read_json(b, "value"))
        .schema_evolution("add-columns")
        .build()
    )
    stream = spark.readStream.schema("value string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "src"))
    query = sink.start(stream, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None

    users, orders, events = (catalog.load_table(f"nest.{t}") for t in ("users", "orders", "events"))  # type: ignore[attr-defined]
    items = ["payload.items", "payload.items.element"]
    users_v0 = ["id", "payload", "payload.addr", "payload.addr.city", *items, "payload.items.element.sku"]
    assert schema_history(users) == [
        sorted([*users_v0, "payload.name"]),
        sorted([*users_v0, "payload.name", "payload.addr.country"]),
    ]
    orders_v0 = ["id", "payload", "payload.addr", "payload.addr.zip", "payload.amount", *items]
    assert schema_history(orders) == [sorted([*orders_v0, "payload.items.element.qty", "payload.items.element.sku"])]
    events_v1 = [
        "id",
        "payload",
        "payload.addr",
        "payload.addr.city",
        "payload.kind",
        *items,
        "payload.items.element.ev",
    ]
    assert schema_history(events) == [
        ["id", "payload", "payload.kind"],
        sorted(events_v1),
        sorted([*events_v1, "payload.extra", "payload.extra.deep", "payload.extra.deep.x"]),
    ]
    for table in (users, orders, events):
        assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]

    # The rows as each table holds them: every field of its final schema, null where a row had none.
    # events' first row held only nulls below payload.addr, not yet a field of events then: null.
    check_readers(
        java_reader,
        users,
        {
            1: {
                "id": 1,
                "payload": {"name": "ada", "addr": {"city": "paris", "country": None}, "items": [{"sku": "u1"}]},
            },
            2: {
                "id": 2,
                "payload": {
                    "name": "bob",
                    "addr": {"city": "rome", "country": "it"},
                    "items": [{"sku": "u2"}, {"sku": None}],
                },
            },
            3: {"id": 3, "payload": {"name": None, "addr": {"city": None, "country": "fr"}, "items": None}},
        },
    )
    check_readers(
        java_reader,
        orders,
        {
            1: {"id": 1, "payload": {"amount": 1.5, "addr": {"zip": "75001"}, "items": [{"sku": "o1", "qty": 2}]}},
            2: {"id": 2, "payload": {"amount": 2.5, "addr": None, "items": []}},
            3: {"id": 3, "payload": {"amount": 3.0, "addr": {"zip": "00100"}, "items": None}},
        },
    )
    check_readers(
        java_reader,
        events,
        {
            1: {"id": 1, "payload": {"kind": "click", "addr": None, "items": None, "extra": None}},
            2: {"id": 2, "payload": {"kind": "view", "addr": {"city": "oslo"}, "items": [{"ev": 1}], "extra": None}},
            3: {"id": 3, "payload": {"kind": None, "addr": None, "items": None, "extra": None}},
            4: {"id": 4, "payload": {"kind": "buy", "addr": None, "items": None, "extra": {"deep": {"x": 7}}}},
        },
    )


NESTED_DDL = "tbl string, id long, payload struct<name: string, score: double, inner: struct<a: long, b: long>>"


def test_without_evolution_only_the_nested_fields_a_tables_rows_carry_must_fit_it(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType, StructType

    catalog.create_namespace("db")  # type: ignore[attr-defined]
    # Two tables sharing the struct column `payload` with different fields; the stream's is the union.
    a = catalog.create_table(  # type: ignore[attr-defined]
        "db.a",
        Schema(
            NestedField(1, "id", LongType()),
            NestedField(2, "payload", StructType(NestedField(3, "name", StringType()))),
        ),
    )
    b = catalog.create_table(  # type: ignore[attr-defined]
        "db.b",
        Schema(
            NestedField(1, "id", LongType()),
            NestedField(
                2,
                "payload",
                StructType(
                    NestedField(3, "score", DoubleType()),
                    NestedField(4, "inner", StructType(NestedField(5, "a", LongType()))),
                ),
            ),
        ),
    )
    sink = IcebergSink.builder().catalog("test", **catalog_props).route(table_column="tbl", namespace="db").build()
    ckpt = str(tmp_path / "ck")
    first = [
        ("a", 1, ("x", None, None)),
        ("a", 2, (None, None, (None, None))),  # a's payload.name null, the others' fields too
        ("b", 1, (None, 1.5, (10, None))),
        ("b", 2, None),
    ]
    sink.write(spark.createDataFrame(first, NESTED_DDL).repartition(2), checkpoint_location=ckpt)

    # A value in a nested field the table lacks is the clear error naming it; nothing is written.
    for bad, field in (
        (
            [("a", 3, ("z", 2.0, None)), ("b", 3, (None, 2.5, None))],
            "payload.score",
        ),
        ([("b", 3, (None, 2.5, (1, 2)))], "payload.inner.b"),
    ):
        with pytest.raises(SchemaMismatchError, match=rf"table db\.[ab] .*\n  - {field}: "):
            sink.write(spark.createDataFrame(bad, NESTED_DDL), checkpoint_location=ckpt, checkpoint_id=1)
    for name in ("db.a", "db.b"):
        assert len(catalog.load_table(name).snapshots()) == 1  # type: ignore[attr-defined]

    a, b = catalog.load_table("db.a"), catalog.load_table("db.b")  # type: ignore[attr-defined]
    assert nested_paths(a) == ["id", "payload", "payload.name"]
    assert nested_paths(b) == ["id", "payload", "payload.inner", "payload.inner.a", "payload.score"]
    check_readers(java_reader, a, {1: {"id": 1, "payload": {"name": "x"}}, 2: {"id": 2, "payload": {"name": None}}})
    check_readers(
        java_reader,
        b,
        {1: {"id": 1, "payload": {"score": 1.5, "inner": {"a": 10}}}, 2: {"id": 2, "payload": None}},
    )
