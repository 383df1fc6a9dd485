"""Hundreds of small tables in one Debezium stream, with source schema changes mid-stream.

One Kafka-style topic (a ``value`` column of Debezium JSON envelopes, with the schema part in the
first two micro-batches and without it in the third) carries the change events of 330 source tables
of three shapes. It is routed by the envelope's ``source.table`` to one Iceberg table each
(``.route(table_column="source_table", namespace=...)``) through a real streaming query, with
inserts, updates, deletes, tombstones and ``.schema_evolution("add-columns")``:

- checkpoint 0: the connector's snapshot of 300 tables (every table created when first seen);
- checkpoint 1: changes to every other table; every fifth table of those is altered (``ADD note``)
  mid-batch, its later events carry the new column; 20 new tables appear;
- checkpoint 2: changes without the schema part (``schemas.enable=false``) to every third table, a
  new column ``extra`` in some of them (its type inferred from the documents), and 10 more new tables
  whose events do carry the schema part (two connectors' configurations in one batch).

Each table gets exactly one snapshot per checkpoint that routes rows to it, and every table read back
by Iceberg Java (all tables in one request: tests/interop/readers.py ``read_many``) and by DuckDB equals
its model: every change applied in lsn order to a dict.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.types import BooleanType, DoubleType, LongType, StringType
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from tests.integration.test_routing_schema import Topic
from tests.interop.readers import JavaIcebergReader, duckdb_read_many, normalize

pytestmark = pytest.mark.interop

FIRST, SECOND, THIRD = 300, 20, 10  # tables first seen in checkpoints 0, 1 and 2
ROWS = 4  # rows per table in its first batch
SHAPES = [
    [("id", "int64"), ("name", "string")],
    [("id", "int64"), ("qty", "int64"), ("price", "float64")],
    [("id", "int64"), ("name", "string"), ("flag", "boolean")],
]
TYPES = {"id": LongType(), "name": StringType(), "qty": LongType(), "price": DoubleType(), "flag": BooleanType()}


def source_row(table: int, key: int, version: int, columns: list[tuple[str, str]]) -> dict[str, Any]:
    """One row image of a source table (every value derived from the table, key and version)."""
    values = {
        "id": key,
        "name": f"t{table}-{key}-v{version}",
        "qty": table * 100 + key + version,
        "price": table + key / 4 + 0.125,  # never a whole number: inferred as double without a schema
        "flag": (table + key + version) % 2 == 0,
        "note": f"note-{table}-{key}-{version}",
        "extra": table * 1000 + key,
    }
    return {name: values[name] for name, _ in columns}


def build_topic() -> tuple[Topic, dict[str, list[int]], dict[str, list[str]]]:
    """The topic, each table's checkpoints and each table's added columns (in order)."""
    topic = Topic()
    columns: dict[int, list[tuple[str, str]]] = {}
    touched: dict[str, list[int]] = {}
    added: dict[str, list[str]] = {}

    def name(t: int) -> str:
        return f"src_{t:03d}"

    def change(t: int, op: str, key: int, version: int, schema: bool = True) -> None:
        row = source_row(t, key, version, columns[t]) if op != "d" else {"id": key}
        topic.change(name(t), op, row, columns[t] if schema else None)
        checkpoint = len(topic.batches) - 1
        if touched.setdefault(name(t), [])[-1:] != [checkpoint]:
            touched[name(t)].append(checkpoint)

    def create(t: int, op: str) -> None:
        columns[t] = list(SHAPES[t % len(SHAPES)])
        for key in range(ROWS):
            change(t, op, key, 0)

    topic.batch()  # checkpoint 0: the connector's initial snapshot
    for t in range(FIRST):
        create(t, "r")

    topic.batch()  # checkpoint 1: live changes; ALTER TABLE ... ADD note in some tables mid-batch
    for t in range(0, FIRST, 2):
        change(t, "u", 0, 1)
        change(t, "d", 1, 1)  # with its tombstone
        if t % 5 == 0:
            columns[t] = [*columns[t], ("note", "string")]
            added.setdefault(name(t), []).append("note")
        change(t, "c", ROWS, 1)
        change(t, "u", 2, 1)
        change(t, "u", 2, 2)  # the same key twice in one batch
    for t in range(FIRST, FIRST + SECOND):
        create(t, "c")  # tables first seen in a later batch
    change(FIRST, "d", 3, 1)
    change(FIRST + 1, "c", 9, 1)
    change(FIRST + 1, "d", 9, 1)  # inserted and deleted within the batch: never in the table

    topic.batch()  # checkpoint 2: schemas.enable=false, types inferred from the documents ...
    for t in range(0, FIRST + SECOND, 3):
        if t % 9 == 0:
            columns[t] = [*columns[t], ("extra", "int64")]
            added.setdefault(name(t), []).append("extra")
        change(t, "u", 3, 3, schema=False)
        change(t, "d", 0, 3, schema=False)
        change(t, "c", ROWS + 1, 3, schema=False)
    for t in range(FIRST + SECOND, FIRST + SECOND + THIRD):
        create(t, "c")  # ... beside events with the schema part
    return topic, touched, added


def test_hundreds_of_tables_from_one_debezium_stream_with_schema_changes_mid_stream(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    topic, touched, added = build_topic()
    topic.write(tmp_path / "topic")
    names = sorted(touched)
    assert len(names) == FIRST + SECOND + THIRD

    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="source_table", namespace="cdc")
        .create_if_missing()
        .debezium(value_column="value", table_fields=("table",))  # the pre-issue-18 names (docs/cdc.md)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .schema_evolution("add-columns")
        .build()
    )
    stream = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
    started = time.monotonic()
    query = sink.start(stream.json(str(tmp_path / "topic")), str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(900)
    assert query.exception() is None
    stream_seconds = time.monotonic() - started

    assert sorted(".".join(i) for i in catalog.list_tables("cdc")) == [f"cdc.{n}" for n in names]  # type: ignore[attr-defined]
    assert sink.metrics().commits == sum(len(c) for c in touched.values())
    tables = {n: catalog.load_table(f"cdc.{n}") for n in names}  # type: ignore[attr-defined]
    for n, table in tables.items():
        # One snapshot per table per checkpoint that routed rows to it; none for the others.
        assert [int(s.summary["iceberg-sink.checkpoint-id"]) for s in table.snapshots()] == touched[n], n  # type: ignore[index]
        schema = table.schema()
        t = int(n.split("_")[1])
        base = [c for c, _ in SHAPES[t % len(SHAPES)]]
        # Created with its own columns (never another shape's), then evolved in the order its source was.
        assert schema.column_names == [*base, "lsn", *added.get(n, [])], n
        assert len(table.schemas()) == 1 + len(added.get(n, [])), n
        for column in base:
            assert schema.find_field(column).field_type == TYPES[column], (n, column)
        for column in added.get(n, []):
            field = schema.find_field(column)
            assert not field.required and field.field_type == (StringType() if column == "note" else LongType())

    read_started = time.monotonic()
    locations = [tables[n].metadata_location for n in names]
    java = java_reader.read_many(locations)
    java_seconds = time.monotonic() - read_started
    duck = duckdb_read_many(locations)
    read_seconds = time.monotonic() - read_started
    for n, java_rows, duck_rows in zip(names, java, duck, strict=True):
        columns = tables[n].schema().column_names
        model = topic.models[n]
        want = sorted(({c: row.get(c) for c in columns} for row in model.values()), key=lambda r: r["id"])
        assert normalize(java_rows, ["id"]) == want, f"{n}: Iceberg Java"
        assert normalize(duck_rows, ["id"]) == want, f"{n}: DuckDB"
    # Sanity of the model itself: deletes happened, a table evolved in each way, late tables exist.
    assert sorted(topic.models["src_000"]) == [2, 3, ROWS, ROWS + 1]
    assert sorted(topic.models[f"src_{FIRST + 1:03d}"]) == list(range(ROWS))
    print(f"stream {stream_seconds:.1f} s, reads {read_seconds:.1f} s (Java {java_seconds:.1f} s), {len(names)} tables")


def test_writer_tasks_hold_at_most_max_open_files_over_many_tables(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """60 small tables in few writer tasks (adaptive execution coalesces the small shuffle partitions),
    every table's file opened at its first row (``buffer-bytes`` 1): without the task-wide limit a
    task holds all of its tables' files open (60 with the limit disabled). The metric shows the limit
    was reached and held; every table reads back whole."""
    tables, per_table, limit = 60, 5, 4
    rows = [(f"t{t:02d}", t * 100 + i, f"r{i}", float(i)) for i in range(per_table) for t in range(tables)]
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="open")
        .create_if_missing()
        .write_option("iceberg-sink.writer.max-open-files", limit)
        .write_option("iceberg-sink.writer.buffer-bytes", 1)
        .build()
    )
    sink.write(spark.createDataFrame(rows, "tbl string, id long, name string, score double").repartition(2))
    assert sink.metrics().writer_peak_open_files == limit
    names = [f"t{t:02d}" for t in range(tables)]
    loaded = [catalog.load_table(f"open.{n}") for n in names]  # type: ignore[attr-defined]
    locations = [t.metadata_location for t in loaded]
    for name, java_rows, duck_rows in zip(
        names, java_reader.read_many(locations), duckdb_read_many(locations), strict=True
    ):
        want = [{"id": r[1], "name": r[2], "score": r[3]} for r in sorted(rows) if r[0] == name]
        assert normalize(java_rows, ["id"]) == want, f"{name}: Iceberg Java"
        assert normalize(duck_rows, ["id"]) == want, f"{name}: DuckDB"
