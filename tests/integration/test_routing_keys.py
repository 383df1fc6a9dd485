"""Per-table keys of a routed upsert/CDC sink (iceberg_sink/table/keys.py): from a key column in the
rows, from an existing table's identifier fields, or the builder's default. Equality deletes of a
later checkpoint must apply by each table's own key; every table read back by Iceberg Java and
DuckDB equals its model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, _faults
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

# One shape for every table's rows: which columns a table uses depends on its key.
DDL = "tbl string, pk string, region string, id long, sku string, name string, lsn long, op string"
COLUMNS = ["region", "id", "sku", "name", "lsn"]


class Crash(Exception):
    pass


class Model:
    """Each table's rows by its key, as the sink must leave them."""

    def __init__(self, keys: dict[str, tuple[str, ...]]) -> None:
        self.keys = keys
        self.tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in keys}
        self.lsn = 0

    def change(self, table: str, op: str, **values: Any) -> tuple[Any, ...]:
        self.lsn += 1
        row = {c: values.get(c) for c in COLUMNS} | {"lsn": self.lsn}
        key = tuple(row[k] for k in self.keys[table])
        if op == "D":
            self.tables[table].pop(key, None)
        else:
            self.tables[table][key] = row
        short = table.split(".")[1]
        return (short, values.get("pk"), row["region"], row["id"], row["sku"], row["name"], self.lsn, op)

    def expected(self, table: str, columns: list[str]) -> list[dict[str, Any]]:
        rows = [{c: r[c] for c in columns} for r in self.tables[table].values()]
        return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def frame(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, DDL).repartition(2)


def check(java: JavaIcebergReader, catalog: Catalog, model: Model) -> None:
    for name in model.tables:
        table = catalog.load_table(name)
        columns = table.schema().column_names
        expected = model.expected(name, columns)
        for reader, got in (("Iceberg Java", java.read(table.metadata_location)), ("DuckDB", None)):
            rows = got if got is not None else duckdb_read(table.metadata_location)
            actual = sorted(
                ({c: r[c] for c in columns} for r in normalize(rows, columns)),
                key=lambda r: json.dumps(r, sort_keys=True, default=str),
            )
            assert actual == expected, f"{name} read by {reader}"


def snapshots_per_checkpoint(table: Any) -> list[int]:
    return [int(s.summary["iceberg-sink.checkpoint-id"]) for s in table.snapshots()]


def keyed_sink(catalog_props: dict[str, str], **cdc: Any) -> IcebergSink:
    return (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="keys")
        .create_if_missing()
        .cdc(op_column="op", order_by="lsn", **cdc)
        .build()
    )


def test_each_routed_table_is_keyed_by_the_key_its_rows_name(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaIcebergReader,
) -> None:
    # keys.orders: (region, id), named by its rows as a string (with and without a space);
    # keys.plain: no key in its rows, so the builder's default key (id).
    catalog.create_namespace("keys")
    sink = keyed_sink(catalog_props, key=["id"], key_column="pk")
    model = Model({"keys.orders": ("region", "id"), "keys.plain": ("id",)})
    ckpt = str(tmp_path / "ck")
    first = [
        model.change("keys.orders", "I", pk="region, id", region="eu", id=1, name="a"),
        model.change("keys.orders", "I", pk="region,id", region="us", id=1, name="b"),  # same id, other region
        model.change("keys.orders", "I", pk="region,id", region="eu", id=2, name="c"),
        model.change("keys.plain", "I", id=1, name="p1", sku="s"),
        model.change("keys.plain", "I", id=2, name="p2"),
    ]
    sink.write(frame(spark, first), checkpoint_location=ckpt)
    orders = catalog.load_table("keys.orders")
    assert [orders.schema().find_column_name(i) for i in orders.schema().identifier_field_ids] == ["region", "id"]
    # The key column is not stored.
    assert "pk" not in orders.schema().column_names
    second = [
        # An update of (us, 1) must not touch (eu, 1): the delete is by (region, id), not id.
        model.change("keys.orders", "U", pk="region,id", region="us", id=1, name="b2"),
        model.change("keys.orders", "D", pk="region,id", region="eu", id=2),
        # Rows may leave the key column null once the table has its key (its identifier fields).
        model.change("keys.orders", "I", region="asia", id=1, name="d"),
        model.change("keys.plain", "U", id=2, name="p2b"),
    ]
    sink.write(frame(spark, second), checkpoint_location=ckpt)
    check(java_reader, catalog, model)
    assert snapshots_per_checkpoint(catalog.load_table("keys.orders")) == [0, 1]


def test_key_from_an_existing_tables_identifier_fields_and_array_keys(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaIcebergReader,
) -> None:
    catalog.create_namespace("keys")
    # Created by someone else, keyed by sku: the routed sink (no key=) takes its identifier fields.
    schema = Schema(
        NestedField(1, "sku", StringType(), required=True),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "lsn", LongType(), required=False),
        identifier_field_ids=[1],
    )
    catalog.create_table("keys.items", schema, properties={"format-version": "2"})
    sink = keyed_sink(catalog_props, key_column="pk")
    model = Model({"keys.items": ("sku",), "keys.people": ("id",)})
    ckpt = str(tmp_path / "ck")
    rows = [
        model.change("keys.items", "I", sku="s1", name="one"),
        model.change("keys.items", "I", sku="s2", name="two"),
        model.change("keys.people", "I", pk=None, id=5, name="x"),
    ]
    # keys.people names its key as an array; the Spark column must be array<string> then.
    df = frame(spark, rows).selectExpr(
        "tbl", "CASE WHEN tbl = 'people' THEN array('id') END AS pk", "region", "id", "sku", "name", "lsn", "op"
    )
    sink.write(df, checkpoint_location=ckpt)
    people = catalog.load_table("keys.people")
    assert [people.schema().find_column_name(i) for i in people.schema().identifier_field_ids] == ["id"]
    more = [
        model.change("keys.items", "U", sku="s1", name="one-b"),
        model.change("keys.items", "D", sku="s2"),
        model.change("keys.people", "U", id=5, name="y"),
    ]
    sink.write(frame(spark, more), checkpoint_location=ckpt)
    check(java_reader, catalog, model)
    assert catalog.load_table("keys.items").schema().column_names[:3] == ["sku", "name", "lsn"]


def test_conflicting_or_missing_keys_are_clear_errors_before_any_commit(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path
) -> None:
    catalog.create_namespace("keys")
    sink = keyed_sink(catalog_props, key_column="pk")
    ckpt = str(tmp_path / "ck")
    model = Model({"keys.a": ("id",), "keys.b": ("id",)})
    sink.write(
        frame(spark, [model.change("keys.a", "I", pk="id", id=1, name="x")]), checkpoint_location=ckpt, checkpoint_id=0
    )
    before = catalog.load_table("keys.a").current_snapshot()
    # Rows naming another key than the table's identifier fields.
    with pytest.raises(InvalidInputError, match=r"keys.a: its rows name key \['name'\] in column 'pk' but the table"):
        sink.write(
            frame(spark, [model.change("keys.a", "I", pk="name", id=2, name="y")]),
            checkpoint_location=ckpt,
            checkpoint_id=1,
        )
    # Two keys for one table in one batch.
    with pytest.raises(InvalidInputError, match=r"keys.b: its rows name different keys in column 'pk'"):
        sink.write(
            frame(
                spark,
                [model.change("keys.b", "I", pk="id", id=1), model.change("keys.b", "I", pk="id,name", id=2, name="n")],
            ),
            checkpoint_location=ckpt,
            checkpoint_id=1,
        )
    # No key anywhere: no key column value, no identifier fields, no key=.
    with pytest.raises(InvalidSinkConfigError, match=r"keys.b: no upsert/CDC key: its rows name none in column 'pk'"):
        sink.write(frame(spark, [model.change("keys.b", "I", id=1)]), checkpoint_location=ckpt, checkpoint_id=1)
    with pytest.raises(InvalidInputError, match=r"holds the op column 'op'"):
        sink.write(
            frame(spark, [model.change("keys.b", "I", pk="op", id=1)]), checkpoint_location=ckpt, checkpoint_id=1
        )
    with pytest.raises(
        InvalidInputError, match=r"expected a string \('a,b'\) or an array of strings.*received type int"
    ):
        sink.write(
            frame(spark, [model.change("keys.b", "I", id=1)]).selectExpr("* EXCEPT (pk)", "1 AS pk"),
            checkpoint_location=ckpt,
            checkpoint_id=1,
        )
    assert catalog.load_table("keys.a").current_snapshot() == before
    assert not catalog.table_exists("keys.b")


def test_builder_key_options(catalog_props: dict[str, str], catalog: Catalog) -> None:
    base = IcebergSink.builder().catalog("test", **catalog_props)
    with pytest.raises(InvalidSinkConfigError, match=r"key_column\): a per-row key needs \.route"):
        base.table("db.t").create_if_missing().cdc(op_column="op", key=["id"], key_column="pk").build()
    with pytest.raises(InvalidSinkConfigError, match=r"key_column\): expected a column name that is not a key column"):
        IcebergSink.builder().catalog("test", **catalog_props).route(table_column="t", namespace="keys").upsert(
            key=["id"], key_column="id"
        ).build()
    with pytest.raises(InvalidSinkConfigError, match=r"table db.t does not exist: .cdc/.upsert need key"):
        IcebergSink.builder().catalog("test", **catalog_props).table("db.t").create_if_missing().upsert().build()
    # A single-table sink given no key takes an existing table's identifier fields.
    catalog.create_namespace("db")
    schema = Schema(
        NestedField(1, "k", LongType(), required=True),
        NestedField(2, "v", StringType(), required=False),
        identifier_field_ids=[1],
    )
    catalog.create_table("db.t", schema, properties={"format-version": "2"})
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.t").upsert().build()
    assert sink.config.changes is not None and sink.config.changes.key == ("k",)
    catalog.create_table("db.nokey", Schema(*schema.fields), properties={"format-version": "2"})
    with pytest.raises(InvalidSinkConfigError, match=r"db.nokey: no upsert/CDC key: the table has no identifier"):
        IcebergSink.builder().catalog("test", **catalog_props).table("db.nokey").upsert().build()


def test_crash_between_two_differently_keyed_tables_commits_replays_once(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaIcebergReader,
) -> None:
    catalog.create_namespace("keys")
    model = Model({"keys.orders": ("region", "id"), "keys.skus": ("sku",)})
    ckpt = str(tmp_path / "ck")
    first = [
        model.change("keys.orders", "I", pk="region,id", region="eu", id=1, name="a"),
        model.change("keys.skus", "I", pk="sku", sku="x", name="a"),
    ]
    keyed_sink(catalog_props, key_column="pk").write(frame(spark, first), checkpoint_location=ckpt)
    second = [
        model.change("keys.orders", "U", pk="region,id", region="eu", id=1, name="b"),
        model.change("keys.skus", "D", pk="sku", sku="x"),
        model.change("keys.skus", "I", pk="sku", sku="y", name="c"),
    ]
    commits = []

    def crash(point: str, checkpoint: int) -> None:
        if point == _faults.AFTER_COMMIT and checkpoint == 1:
            commits.append(point)
            raise Crash("driver died after the first table's commit")

    _faults.install(crash)
    try:
        with pytest.raises(Crash):
            keyed_sink(catalog_props, key_column="pk").write(frame(spark, second), checkpoint_location=ckpt)
    finally:
        _faults.clear()
    # A restarted sink replays checkpoint 1: the committed table is skipped, the other committed.
    keyed_sink(catalog_props, key_column="pk").write(frame(spark, second), checkpoint_location=ckpt, checkpoint_id=1)
    for name in model.tables:
        assert snapshots_per_checkpoint(catalog.load_table(name)) == [0, 1], name
    check(java_reader, catalog, model)


def kafka_key(fields: dict[str, Any], with_schema: bool) -> str:
    """A Debezium message key: the source row's primary key (JsonConverter, with or without schema)."""
    if not with_schema:
        return json.dumps(fields)
    types = {str: "string", int: "int64"}
    schema = {
        "type": "struct",
        "fields": [{"type": types[type(v)], "optional": False, "field": k} for k, v in fields.items()],
        "optional": False,
    }
    return json.dumps({"schema": schema, "payload": fields})


def test_debezium_message_keys_key_each_routed_table(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaIcebergReader,
) -> None:
    from tests.integration.test_debezium import event

    lines = [("line_no", "int64"), ("order_no", "int64"), ("item", "string")]
    people = [("email", "string"), ("name", "string")]
    models: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {"dbz.order_lines": {}, "dbz.people": {}}
    lsn = 0

    def change(table: str, op: str, row: dict[str, Any], key: dict[str, Any], with_schema: bool) -> list[Any]:
        nonlocal lsn
        lsn += 1
        columns = lines if table == "order_lines" else people
        before = {**key} if op in ("u", "d") else None
        value = event(op, lsn, before, None if op == "d" else row, columns if with_schema else None, table=table)
        model = models[f"dbz.{table}"]
        if op == "d":
            model.pop(tuple(key.values()), None)
        else:
            model[tuple(key.values())] = {**row, "lsn": lsn}
        out = [(kafka_key(key, with_schema), value)]
        return out + ([(kafka_key(key, with_schema), None)] if op == "d" else [])  # the tombstone

    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .debezium(key_from="key", table_fields=("table",))  # the pre-issue-18 names (docs/cdc.md)
        .route(table_column="source_table", namespace="dbz")
        .create_if_missing()
        .cdc(op_column="op", order_by="lsn", key_column="key_columns")
        .schema_evolution("add-columns")
        .build()
    )
    catalog.create_namespace("dbz")
    ckpt = str(tmp_path / "ck")
    batch: list[Any] = []
    # Order lines are keyed by (order_no, line_no): line 1 of two orders are different rows.
    for order in (10, 11):
        for line in (1, 2):
            row = {"line_no": line, "order_no": order, "item": f"i{order}-{line}"}
            batch += change("order_lines", "c", row, {"order_no": order, "line_no": line}, with_schema=True)
    batch += change("people", "r", {"email": "a@x", "name": "A"}, {"email": "a@x"}, with_schema=False)
    batch += change("people", "r", {"email": "b@x", "name": "B"}, {"email": "b@x"}, with_schema=False)
    sink.write(spark.createDataFrame(batch, "key string, value string"), checkpoint_location=ckpt)
    batch = []
    batch += change(
        "order_lines", "u", {"line_no": 1, "order_no": 10, "item": "new"}, {"order_no": 10, "line_no": 1}, True
    )
    batch += change("order_lines", "d", {}, {"order_no": 11, "line_no": 2}, True)
    batch += change("people", "d", {}, {"email": "a@x"}, False)
    batch += change("people", "u", {"email": "b@x", "name": "B2"}, {"email": "b@x"}, False)
    sink.write(spark.createDataFrame(batch, "key string, value string"), checkpoint_location=ckpt)

    for name, key in (("dbz.order_lines", ["order_no", "line_no"]), ("dbz.people", ["email"])):
        table = catalog.load_table(name)
        assert [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids] == key, name
        assert "key_columns" not in table.schema().column_names
        columns = [c for c in table.schema().column_names]
        expected = sorted(
            ({c: r.get(c) for c in columns} for r in models[name].values()), key=lambda r: json.dumps(r, default=str)
        )
        for reader, rows in (("Iceberg Java", java_reader.read(table.metadata_location)), ("DuckDB", None)):
            got = normalize(rows if rows is not None else duckdb_read(table.metadata_location), columns)
            assert sorted(got, key=lambda r: json.dumps(r, default=str)) == expected, f"{name} read by {reader}"


def test_cli_runs_a_routed_debezium_pipeline_with_per_table_keys(
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    java_reader: JavaIcebergReader,
) -> None:
    from iceberg_sink.cli import EXIT_OK, EXIT_USAGE, main
    from tests.integration.test_debezium import event

    topic = tmp_path / "topic"
    topic.mkdir()
    records = [
        {"key": kafka_key({"sku": "s1"}, False), "value": event("c", 1, None, {"sku": "s1", "qty": 3}, None, "stock")},
        {
            "key": kafka_key({"a": 1, "b": 2}, True),
            "value": event("c", 2, None, {"a": 1, "b": 2, "w": "x"}, None, "pairs"),
        },
        {
            "key": kafka_key({"a": 1, "b": 3}, True),
            "value": event("c", 3, None, {"a": 1, "b": 3, "w": "y"}, None, "pairs"),
        },
        {
            "key": kafka_key({"sku": "s1"}, False),
            "value": event("u", 4, {"sku": "s1"}, {"sku": "s1", "qty": 4}, None, "stock"),
        },
        {"key": kafka_key({"a": 1, "b": 2}, True), "value": event("d", 5, {"a": 1, "b": 2}, None, None, "pairs")},
        {"key": kafka_key({"a": 1, "b": 2}, True), "value": None},
    ]
    (topic / "part-0.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = tmp_path / "routed.yaml"
    config.write_text(
        "source: {type: files, path: topic, format: json, schema: 'key string, value string'}\n"
        "sink:\n"
        "  embedded: lake\n"
        "  route: {table_column: source_table, namespace: inv}\n"
        "  create_if_missing: true\n"
        "  debezium: {key_from: key, table_fields: [table]}\n"
        "  cdc: {op_column: op, order_by: lsn, key_column: key_columns}\n"
        "  schema_evolution: add-columns\n"
        "checkpoint_location: ckpt\n"
    )
    assert main(["run", str(config), "--available-now", "--json"]) == EXIT_OK, capsys.readouterr().err[-3000:]
    doc = json.loads(capsys.readouterr().out)
    assert doc["commits"] == 2 and doc["snapshot_id"] is None and "source_table" in doc["table"]
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("inv.stock").build()
    want = {
        "inv.stock": ([{"sku": "s1", "qty": 4, "lsn": 4}], ["sku"]),
        "inv.pairs": ([{"a": 1, "b": 3, "w": "y", "lsn": 3}], ["a", "b"]),
    }
    for name, (rows, key) in want.items():
        table = sink.load_table(name)
        assert [table.schema().find_column_name(i) for i in table.schema().identifier_field_ids] == key
        columns = list(rows[0])
        assert sorted(table.schema().column_names) == sorted(columns), name
        for got in (java_reader.read(table.metadata_location), duckdb_read(table.metadata_location)):
            assert normalize(got, key) == rows, name
    # Exactly one of table and route.
    bad = tmp_path / "bad.yaml"
    bad.write_text(config.read_text().replace("  embedded: lake\n", "  embedded: lake\n  table: inv.x\n"))
    assert main(["run", str(bad), "--validate-only"]) == EXIT_USAGE
    assert "sink: expected one of table (one table) or route (many tables), received both" in capsys.readouterr().err
