"""Debezium envelopes (iceberg_sink/sources/debezium.py) end to end, with a source schema change mid-stream.

Events have Debezium's real shape: ``{"schema": ..., "payload": {"before", "after", "op", "source":
{"db", "schema", "table", "lsn", ...}, "ts_ms"}}`` (or the payload alone), Kafka-style rows with a
``value`` column, tombstones (null values) after deletes. The table read back by Iceberg Java and
DuckDB must equal the model: applying every change in lsn order to a dict.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.types import IntegerType, LongType, StringType
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, IcebergSinkError, InvalidInputError, _faults
from iceberg_sink.sources import debezium as debezium_module
from iceberg_sink.sources.debezium import UNAVAILABLE_VALUE, read_envelope
from iceberg_sink.vocab.columns import REJECT_COLUMN
from tests.helpers import driver_env
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

V1 = [("id", "int64"), ("name", "string"), ("qty", "int32")]
# ALTER TABLE customers ALTER qty TYPE bigint, ADD note text
V2 = [("id", "int64"), ("name", "string"), ("qty", "int64"), ("note", "string")]


def connect_schema(columns: list[tuple[str, str]]) -> dict[str, Any]:
    row = {
        "type": "struct",
        "fields": [{"type": t, "optional": name != "id", "field": name} for name, t in columns],
        "optional": True,
        "name": "srv.public.customers.Value",
    }
    source = {
        "type": "struct",
        "fields": [
            {"type": "string", "optional": False, "field": "version"},
            {"type": "string", "optional": False, "field": "connector"},
            {"type": "string", "optional": False, "field": "name"},
            {"type": "int64", "optional": False, "field": "ts_ms"},
            {"type": "string", "optional": False, "field": "db"},
            {"type": "string", "optional": False, "field": "schema"},
            {"type": "string", "optional": False, "field": "table"},
            {"type": "int64", "optional": True, "field": "lsn"},
        ],
        "optional": False,
        "name": "io.debezium.connector.postgresql.Source",
        "field": "source",
    }
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            source,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
        "optional": False,
        "name": "srv.public.customers.Envelope",
    }


def event(
    op: str,
    lsn: int,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    columns: list[tuple[str, str]] | None,
    table: str = "customers",
) -> str:
    payload = {
        "before": before,
        "after": after,
        "source": {
            "version": "2.7.3.Final",
            "connector": "postgresql",
            "name": "srv",
            "ts_ms": 1_700_000_000_000 + lsn,
            "snapshot": "true" if op == "r" else "false",
            "db": "inventory",
            "schema": "public",
            "table": table,
            "txId": 500 + lsn,
            "lsn": lsn,
        },
        "op": op,
        "ts_ms": 1_700_000_000_100 + lsn,
        "transaction": None,
    }
    return json.dumps({"schema": connect_schema(columns), "payload": payload} if columns else payload)


class Source:
    """A Debezium topic as JSON-lines files (one per micro-batch) and the model of its table."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.model: dict[int, dict[str, Any]] = {}
        self.lsn = 0

    def batch(self) -> list[dict[str, Any]]:
        self.batches.append([])
        return self.batches[-1]

    def change(
        self, op: str, row: dict[str, Any], columns: list[tuple[str, str]] | None, key_only: bool = False
    ) -> None:
        self.lsn += 10
        key = {"id": row["id"]}
        before = self.model.get(row["id"])
        before_image = None if before is None else (key if key_only else {k: before.get(k) for k, _ in (columns or V2)})
        if before_image is not None:
            before_image = {k: v for k, v in before_image.items() if k != "lsn" and k != "source_table"}
        value = event(op, self.lsn, before_image if op in ("u", "d") else None, None if op == "d" else row, columns)
        self.batches[-1].append({"key": json.dumps(key), "value": value})
        if op == "d":
            self.model.pop(row["id"], None)
            # Kafka tombstone for log compaction: a null value with the same key.
            self.batches[-1].append({"key": json.dumps(key), "value": None})
        else:
            # The table's own name: its schema is PostgreSQL's default (read_envelope's default names).
            self.model[row["id"]] = {**row, "lsn": self.lsn, "source_table": "customers"}

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for i, rows in enumerate(self.batches):
            path = folder / f"part-{i:03d}.json"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def test_debezium_stream_with_schema_change_mid_stream(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    src = Source()
    src.batch()  # the connector's initial snapshot, then live changes
    for i in range(1, 6):
        src.change("r", {"id": i, "name": f"n{i}", "qty": i}, V1)
    src.change("c", {"id": 6, "name": "n6", "qty": 6}, V1)
    src.batch()
    src.change("u", {"id": 1, "name": "n1b", "qty": 10}, V1)
    src.change("d", {"id": 2}, V1, key_only=True)  # REPLICA IDENTITY DEFAULT: the key only in before
    src.change("c", {"id": 7, "name": "n7", "qty": 7}, V1)
    # The source table is altered within this batch: later events carry the new schema.
    src.change("u", {"id": 3, "name": "n3", "qty": 2**40, "note": "big"}, V2)
    src.change("c", {"id": 8, "name": "n8", "qty": 8, "note": None}, V2)
    src.change("u", {"id": 7, "name": "n7b", "qty": 70, "note": "x"}, V2)  # same key twice in a batch
    src.batch()  # schemas.enable=false: the payload alone; types inferred from the documents
    src.change("d", {"id": 4}, None)
    src.change("u", {"id": 5, "name": "n5b", "qty": 55, "note": "late"}, None)
    src.change("c", {"id": 9, "name": "n9", "qty": 9, "note": "nine"}, None)
    src.change("d", {"id": 9}, None)
    src.write(tmp_path / "topic")

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.customers")
        .create_if_missing(partition_by=["bucket(4, id)"])
        .debezium(value_column="value")
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .schema_evolution("add-and-widen")
        .build()
    )
    stream = (
        spark.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "topic"))
    )
    sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True}).awaitTermination()

    table = sink.load_table()
    schema = table.schema()
    assert [f.name for f in schema.fields] == ["id", "name", "qty", "lsn", "source_table", "note"]
    assert schema.find_field("id").field_type == LongType() and schema.find_field("id").required
    assert schema.find_field("qty").field_type == LongType()  # widened from int32 mid-stream
    assert schema.find_field("note").field_type == StringType() and not schema.find_field("note").required
    assert table.schemas()[0].find_field("qty").field_type == IntegerType()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]
    columns = [f.name for f in schema.fields]
    want = sorted(({c: row.get(c) for c in columns} for row in src.model.values()), key=lambda r: r["id"])
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want
    assert sorted(src.model) == [1, 3, 5, 6, 7, 8]


def customers_sink(lake: Path, evolution: str) -> IcebergSink:
    """One sink, kept across batches: its Debezium reader keeps the last batch's statistics."""
    return (
        IcebergSink.builder()
        .embedded(lake)
        .table("cdc.customers")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .schema_evolution(evolution)
        .build()
    )


def test_a_batch_planned_on_the_last_statistics_is_read_again_when_an_event_differs(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch whose reader's last statistics were plain is planned on them, without the statistics
    job; a new schema part, an event without an order value or a TOAST placeholder makes the sink read
    the batch again, counted, with one progress record per batch and every row as the model says."""
    counted: list[int] = []
    counting = debezium_module.batch_stats
    monkeypatch.setattr(debezium_module, "batch_stats", lambda *a: counted.append(1) or counting(*a))
    src = Source()
    src.batch()  # 0: counted (no statistics yet)
    for i in range(1, 4):
        src.change("r", {"id": i, "name": f"n{i}", "qty": i}, V1)
    src.batch()  # 1: planned on batch 0's
    src.change("u", {"id": 1, "name": "n1b", "qty": 10}, V1)
    src.batch()  # 2: a new schema part: read again
    src.change("u", {"id": 2, "name": "n2b", "qty": 20}, V1)
    src.change("u", {"id": 3, "name": "n3b", "qty": 2**40, "note": "wide"}, V2)
    src.batch()  # 3: an event without an order value: read again (and warned of)
    src.change("c", {"id": 4, "name": "n4", "qty": 4, "note": None}, V2)
    unordered = json.loads(event("c", 0, None, {"id": 5, "name": "n5", "qty": 5, "note": "u"}, V2))
    del unordered["payload"]["source"]["lsn"]
    src.batches[-1].append({"key": json.dumps({"id": 5}), "value": json.dumps(unordered)})
    src.model[5] = {"id": 5, "name": "n5", "qty": 5, "note": "u", "lsn": None, "source_table": "customers"}
    src.batch()  # 4: counted (batch 3's were not plain)
    src.change("u", {"id": 4, "name": "n4b", "qty": 40, "note": "b"}, V2)
    src.batch()  # 5: a TOAST placeholder: read again; the column keeps its stored value
    src.change("u", {"id": 1, "name": UNAVAILABLE_VALUE, "qty": 11, "note": "t"}, V2, key_only=True)
    src.model[1]["name"] = "n1b"
    src.batch()  # 6: counted (batch 5's held a placeholder)
    src.change("d", {"id": 2}, V2, key_only=True)
    src.batch()  # 7: planned on batch 6's
    src.change("u", {"id": 3, "name": "n3c", "qty": 3, "note": None}, V2)
    src.write(tmp_path / "topic")

    sink = customers_sink(tmp_path / "lake", "add-and-widen")
    stream = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
    with caplog.at_level(logging.INFO, logger="iceberg_sink"):
        query = sink.start(stream.json(str(tmp_path / "topic")), str(tmp_path / "ckpt"), trigger={"availableNow": True})
        query.awaitTermination()

    read_again = [r for r in caplog.records if "read again, counted" in r.getMessage()]
    assert len(read_again) == 3  # batches 2, 3 and 5
    assert len(counted) == 6  # every batch but 1 and 7
    assert any("have no order value" in r.getMessage() for r in caplog.records)
    records = sink.progress()
    assert [(r["checkpoint_id"], r["status"]) for r in records] == [(i, "committed") for i in range(8)]
    table = sink.load_table()
    columns = [f.name for f in table.schema().fields]
    want = sorted(({c: row.get(c) for c in columns} for row in src.model.values()), key=lambda r: r["id"])
    assert normalize(table.scan().to_arrow(), ["id"]) == want
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want


def test_a_batch_after_one_that_failed_is_counted_not_planned_on_the_failed_ones_statistics(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Without schema evolution a batch adding a column fails; the next batch, on the old schema part
    alone, must be written: planned on the failed batch's statistics (both parts) it would carry the
    refused column."""
    sink = customers_sink(tmp_path / "lake", "off")

    def write(*events: str) -> None:
        sink.write(spark.createDataFrame([(e,) for e in events], "value string"), str(tmp_path / "ckpt"))

    write(
        event("c", 10, None, {"id": 1, "name": "a", "qty": 1}, V1),
        event("c", 11, None, {"id": 2, "name": "b", "qty": 2}, V1),
    )
    with pytest.raises(IcebergSinkError, match="note"):
        write(
            event("u", 20, None, {"id": 2, "name": "b1", "qty": 2}, V1),
            event("u", 21, None, {"id": 1, "name": "a2", "qty": 5, "note": "new"}, V2),
        )
    write(event("u", 30, None, {"id": 2, "name": "b2", "qty": 3}, V1))
    rows = normalize(sink.load_table().scan().to_arrow().select(["id", "name", "qty"]), ["id"])
    assert rows == [{"id": 1, "name": "a", "qty": 1}, {"id": 2, "name": "b2", "qty": 3}]


def test_read_envelope_rows_ops_and_tables(spark: SparkSession) -> None:
    rows = [
        ("k1", event("r", 1, None, {"id": 1, "name": "a", "qty": 1}, V1)),
        ("k2", event("c", 2, None, {"id": 2, "name": "b", "qty": 2}, None, table="orders")),
        ("k1", event("d", 3, {"id": 1, "name": "a", "qty": 1}, None, V1)),
        ("k1", None),  # tombstone
        ("k3", event("u", 4, {"id": 3}, {"id": 3, "name": "c", "qty": 3}, V1)),
    ]
    df = spark.createDataFrame(rows, "key string, value string")
    out = read_envelope(df, table_fields=("db", "table"), keep=("key",))  # parts escaped and joined with _s_
    assert out.columns == ["key", "id", "name", "qty", "op", "lsn", "source_table"]
    got = sorted(out.collect(), key=lambda r: r["lsn"])
    assert [(r["key"], r["id"], r["name"], r["op"], r["lsn"], r["source_table"]) for r in got] == [
        ("k1", 1, "a", "r", 1, "inventory_s_customers"),
        ("k2", 2, "b", "c", 2, "inventory_s_orders"),
        ("k1", 1, "a", "d", 3, "inventory_s_customers"),  # a delete's row is its before image
        ("k3", 3, "c", "u", 4, "inventory_s_customers"),
    ]
    # With schemas, int32 is int: the payload without a schema is parsed with the batch's union.
    assert out.schema["qty"].dataType.simpleString() == "int"
    # Row images kept as JSON text, for expansion per table after routing.
    raw = read_envelope(df, row_column="row", order_by="ts_ms", order_column="ts").collect()
    assert sorted(json.loads(r["row"])["id"] for r in raw) == [1, 1, 2, 3]
    assert all(r["ts"] > 1_700_000_000_000 for r in raw)


def test_read_envelope_batch_mixing_events_with_and_without_schema_keeps_every_column(spark: SparkSession) -> None:
    """One stream of two connectors (say a topic pattern over two servers), one with schemas.enable
    and one without: the batch's columns are the union of the schema parts and of the documents of
    the events that carry none. Before, the schema parts alone were used and ``note`` of the
    schemaless events was dropped without a word."""
    rows = [
        (event("c", 1, None, {"id": 1, "name": "a", "qty": 1}, V1),),
        (event("c", 2, None, {"id": 2, "name": "b", "qty": 7, "note": "kept"}, None, table="orders"),),
        (event("d", 3, {"id": 2, "name": "b", "qty": 5, "note": "gone"}, None, None, table="orders"),),
    ]
    out = read_envelope(spark.createDataFrame(rows, "value string"))
    assert out.columns == ["id", "name", "qty", "note", "op", "lsn", "source_table"]
    assert out.schema["qty"].dataType.simpleString() == "int"  # a declared column keeps its declared type
    assert out.schema["note"].dataType.simpleString() == "string"
    got = sorted(out.collect(), key=lambda r: r["lsn"])
    assert [(r["id"], r["qty"], r["note"], r["op"]) for r in got] == [
        (1, 1, None, "c"),
        (2, 7, "kept", "c"),
        (2, 5, "gone", "d"),
    ]


def test_read_envelope_called_directly_fails_on_a_refused_event_naming_it(spark: SparkSession) -> None:
    """Called directly, read_envelope gives only its documented columns and a refused event fails the
    job reading it, naming the reason and the event; ``rejects="mark"`` keeps the event as a marked
    row, for the sink (which fails the batch or dead-letters it)."""
    rows = [(event("c", 1, None, {"id": 1, "name": "a", "qty": 1}, V1),), ("{not json",)]
    df = spark.createDataFrame(rows, "value string")
    out = read_envelope(df)
    assert REJECT_COLUMN not in out.columns
    with pytest.raises(Exception, match=r"value is not JSON \(event: value '\{not json'\)"):
        out.collect()
    marked = read_envelope(df, rejects="mark").collect()
    got = sorted((r["id"] or 0, r[REJECT_COLUMN]["reason"] if r[REJECT_COLUMN] else None) for r in marked)
    assert got == [(0, "value is not JSON"), (1, None)]


def test_read_envelope_conflicting_types_name_the_column(spark: SparkSession) -> None:
    clash = [("id", "int64"), ("name", "int32"), ("qty", "int32")]
    df = spark.createDataFrame(
        [
            (event("c", 1, None, {"id": 1, "name": "a", "qty": 1}, V1),),
            (event("c", 2, None, {"id": 2, "name": 5, "qty": 1}, clash),),
        ],
        "value string",
    )
    with pytest.raises(InvalidInputError, match=r"name: is (string|int) in some events and (int|string) in others"):
        read_envelope(df)
    with pytest.raises(InvalidInputError, match=r"expected one of \('fail', 'mark'\), received 'drop'"):
        read_envelope(df, rejects="drop")
    missing = spark.createDataFrame([("x",)], "other string")
    with pytest.raises(InvalidInputError, match=r"expected columns \['value'\]"):
        read_envelope(missing)


def run_driver(root: Path, request: dict[str, Any]) -> str:
    path = root / "request.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    out = root / f"driver-{len(list(root.glob('driver-*')))}.out"
    env = driver_env()
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.evolve_driver", str(path)],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the SIGKILL takes nothing else with it
        )
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out.read_text(encoding="utf-8", errors="replace")


def test_driver_killed_right_after_the_schema_change(tmp_path: Path, java_reader: JavaIcebergReader) -> None:
    """SIGKILL of the whole driver between the schema change of checkpoint 1 and anything of its data:
    the restart replays the batch, finds the columns present and commits each checkpoint once."""
    src = Source()
    src.batch()
    for i in range(1, 4):
        src.change("c", {"id": i, "name": f"n{i}", "qty": i}, V1)
    src.batch()
    src.change("u", {"id": 1, "name": "n1b", "qty": 2**35, "note": "wide"}, V2)
    src.change("d", {"id": 2}, V2)
    src.batch()
    src.change("c", {"id": 4, "name": "n4", "qty": 4, "note": "four"}, V2)
    src.write(tmp_path / "topic")
    (tmp_path / "wh").mkdir()
    request: dict[str, Any] = {
        "catalog": {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()},
        "table": "cdc.customers",
        "source": str(tmp_path / "topic"),
        "checkpoint": str(tmp_path / "ckpt"),
        "kill": [_faults.AFTER_SCHEMA_CHANGE, 1],
    }
    out = run_driver(tmp_path, request)
    assert "KILLING at after-schema-change 1" in out, out[-3000:]
    catalog = load_catalog("evolve", **request["catalog"])
    table = catalog.load_table("cdc.customers")
    assert "note" in [f.name for f in table.schema().fields]  # the change landed before the kill ...
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0"]  # type: ignore[index]
    schema_id = table.metadata.current_schema_id

    out = run_driver(tmp_path, {**request, "kill": None})
    assert "DONE" in out, out[-3000:]
    table = catalog.load_table("cdc.customers")
    assert table.metadata.current_schema_id == schema_id  # replay: nothing left to change
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]
    columns = [f.name for f in table.schema().fields]
    want = sorted(({c: row.get(c) for c in columns} for row in src.model.values()), key=lambda r: r["id"])
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want
