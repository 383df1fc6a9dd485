"""Debezium truncate events under ``.debezium(truncate="apply")``: the table is emptied at that point of
the change order, rows before it in the batch deleted, rows after it kept.

Each test fails on the code before truncate="apply" was built (the builder refused it). Tables are read
back by Iceberg Java and DuckDB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, _faults
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.sources.debezium import read_envelope
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


def event(op: str, lsn: int | None, row: dict[str, Any] | None = None, table: str = "items") -> str:
    """A PostgreSQL connector's event (schemas.enable=false); a truncate carries no before or after."""
    payload: dict[str, Any] = {
        "op": op,
        "ts_ms": 1_700_000_000_000,
        "source": {"connector": "postgresql", "db": "inventory", "schema": "public", "table": table, "lsn": lsn},
    }
    if op != "t":
        payload["before"] = row if op == "d" else None
        payload["after"] = None if op == "d" else row
    return json.dumps(payload)


def frame(spark: SparkSession, values: list[str]) -> DataFrame:
    """Kafka-style records; a truncate's message key is null (Debezium sends none), the others' the id."""

    def key(v: str) -> str | None:
        if not v.startswith("{"):
            return None  # garbage
        payload = json.loads(v)
        row = payload.get("after") or payload.get("before")
        return json.dumps({"id": row["id"]}) if row else None

    return spark.createDataFrame(
        [("items", 0, i, key(v), v) for i, v in enumerate(values)],
        "topic string, partition int, offset long, key string, value string",
    )


def sink(lake: Path, format_version: int | None = None) -> IcebergSink:
    return (
        IcebergSink.builder()
        .embedded(lake)
        .table("cdc.items")
        .create_if_missing(format_version=format_version)
        .debezium(value_column="value", table_column=None, truncate="apply")
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )


def read_back(java_reader: JavaIcebergReader, table: Table) -> list[dict[str, Any]]:
    location = table.metadata_location
    java = normalize(java_reader.read(location).select(["id", "name"]), ["id"])
    duck = normalize(duckdb_read(location).select(["id", "name"]), ["id"])
    assert java == duck, "Iceberg Java and DuckDB disagree"
    return java


def live_paths(table: Table) -> set[str]:
    table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        e.data_file.file_path
        for m in snapshot.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def row(i: int, name: str) -> dict[str, Any]:
    return {"id": i, "name": name}


BEFORE = [event("c", 1, row(1, "a")), event("c", 2, row(2, "b")), event("c", 3, row(3, "c"))]
# Checkpoint 1: changes before the truncate (lsn < 10), the truncate, changes after it. The event at
# lsn 9 arrives after the truncate but is ordered before it: order_by decides, so it is dropped.
AROUND = [
    event("u", 4, row(1, "a2")),
    event("c", 5, row(4, "d")),
    event("t", 10),
    event("c", 11, row(5, "e")),
    event("c", 9, row(6, "late but older")),
    event("u", 12, row(2, "b after")),
    event("d", 13, row(3, "c")),
]
AFTER = [{"id": 2, "name": "b after"}, {"id": 5, "name": "e"}]


def test_truncate_mid_batch_keeps_only_the_changes_after_it(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = sink(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, BEFORE), checkpoint_location=ckpt, checkpoint_id=0)
    before = live_paths(s.load_table())
    outcome = s.write(frame(spark, AROUND), checkpoint_location=ckpt, checkpoint_id=1)
    assert outcome is not None and outcome.snapshot is not None
    table = s.load_table()
    assert read_back(java_reader, table) == AFTER
    summary = outcome.snapshot.summary
    assert summary is not None and summary.operation.value == "overwrite"
    assert summary["deleted-data-files"] == str(len(before)) and summary["total-records"] == "2"
    assert not live_paths(table) & before  # every file of checkpoint 0 removed, not deleted by key
    # A checkpoint that only truncates commits a "delete" snapshot that leaves the table empty.
    only = s.write(frame(spark, [event("t", 20)]), checkpoint_location=ckpt, checkpoint_id=2)
    assert only is not None and only.snapshot is not None and only.snapshot.summary is not None
    assert only.snapshot.summary.operation.value == "delete"
    assert read_back(java_reader, s.load_table()) == []


def test_the_reader_turns_a_truncate_into_a_row_with_its_order_and_table(spark: SparkSession) -> None:
    out = read_envelope(frame(spark, [event("c", 1, row(1, "a")), event("t", 2)]), truncate="apply", key_from="key")
    got = sorted((r["op"], r["lsn"], r["source_table"], r["id"], r["key_columns"]) for r in out.collect())
    assert got == [
        ("c", 1, "items", 1, ["id"]),
        ("t", 2, "items", None, None),
    ]
    # The op column says it holds truncates (the change reduction applies them only then).
    assert out.schema["op"].metadata == {"iceberg_sink.truncates": True}
    assert read_envelope(frame(spark, [event("c", 1, row(1, "a"))]), truncate="skip").schema["op"].metadata == {}


def test_a_replayed_truncate_checkpoint_commits_nothing_twice(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = sink(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, BEFORE), checkpoint_location=ckpt, checkpoint_id=0)

    # The driver dies once checkpoint 1's committable is stored: the replay commits that committable,
    # whose truncate survived the store, and writes nothing again.
    def crash(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_MANIFESTS and checkpoint_id == 1:
            raise RuntimeError("driver died")

    _faults.install(crash)
    try:
        with pytest.raises(RuntimeError, match="driver died"):
            s.write(frame(spark, AROUND), checkpoint_location=ckpt, checkpoint_id=1)
    finally:
        _faults.clear()
    stored = CheckpointStore(ckpt).get(1)
    assert stored is not None and stored.truncated
    assert read_back(java_reader, s.load_table()) == sorted(
        [row(1, "a"), row(2, "b"), row(3, "c")], key=lambda r: r["id"]
    )
    first = s.write(frame(spark, AROUND), checkpoint_location=ckpt, checkpoint_id=1)
    assert first is not None and first.snapshot is not None
    table = s.load_table()
    snapshots = len(table.metadata.snapshots)
    assert read_back(java_reader, table) == AFTER
    # Replayed after the commit: the table holds checkpoint 1, nothing is written or removed again.
    again = s.write(frame(spark, AROUND), checkpoint_location=ckpt, checkpoint_id=1)
    assert again is not None and again.already_committed and again.snapshot is None
    table = s.load_table()
    assert len(table.metadata.snapshots) == snapshots
    assert read_back(java_reader, table) == AFTER


def test_a_routed_stream_truncates_only_the_truncated_table(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .route(table_column="source_table", namespace="cdc")
        .create_if_missing()
        .debezium(value_column="value", table_fields=("table",), key_from="key", truncate="apply")
        .cdc(op_column="op", key_column="key_columns", order_by="lsn")
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    first = [
        event("c", 1, row(1, "a"), "orders"),
        event("c", 2, row(1, "x"), "users"),
        event("c", 3, row(2, "y"), "users"),
    ]
    s.write(frame(spark, first), checkpoint_location=ckpt, checkpoint_id=0)
    second = [
        event("c", 4, row(2, "b"), "orders"),
        event("c", 5, row(3, "z"), "users"),
        event("t", 6, table="users"),
        event("c", 7, row(4, "w"), "users"),
        event("u", 8, row(1, "a2"), "orders"),
        event("t", 9, table="ghost"),  # a table never seen, only truncated: nothing to create
    ]
    outcome = s.write(frame(spark, second), checkpoint_location=ckpt, checkpoint_id=1)
    assert outcome is not None and sorted(outcome) == ["cdc.orders", "cdc.users"]
    catalog = s.config.catalog.load()
    assert read_back(java_reader, catalog.load_table("cdc.orders")) == [row(1, "a2"), row(2, "b")]
    assert read_back(java_reader, catalog.load_table("cdc.users")) == [row(4, "w")]
    assert not catalog.table_exists("cdc.ghost")


def test_a_file_another_writer_commits_before_the_truncate_lands_is_removed_too(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """TRUNCATE empties the table as it is when the truncate commits: the files are read again by every
    commit attempt, so rows another writer committed after our batch was written, and that made our
    first attempt lose the compare-and-swap, are removed as well (documented in docs/cdc.md)."""
    s = sink(tmp_path / "lake", format_version=2)  # the other writer, PyIceberg, cannot commit to v3
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, BEFORE), checkpoint_location=ckpt, checkpoint_id=0)
    table = s.load_table()

    def theirs(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_MANIFESTS and checkpoint_id == 1:
            table.refresh()
            table.append(
                pa.Table.from_pylist([{"id": 100, "name": "theirs", "lsn": 0}], schema=table.schema().as_arrow())
            )

    _faults.install(theirs)
    try:
        s.write(frame(spark, AROUND), checkpoint_location=ckpt, checkpoint_id=1)
    finally:
        _faults.clear()
    assert s.metrics().commit_conflict_retries >= 1  # the first attempt was built on the older head
    assert read_back(java_reader, s.load_table()) == AFTER


def test_with_a_dead_letter_table_a_truncate_applies_and_a_refused_event_is_dead_lettered(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.items")
        .create_if_missing()
        .debezium(value_column="value", table_column=None, truncate="apply")
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .dead_letter("cdc.errors")
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, BEFORE), checkpoint_location=ckpt, checkpoint_id=0)
    s.write(frame(spark, [*AROUND, "not json"]), checkpoint_location=ckpt, checkpoint_id=1)
    assert read_back(java_reader, s.load_table()) == AFTER
    errors = s.load_table("cdc.errors").scan().to_arrow().to_pylist()
    assert [e["raw"] for e in errors] == ["not json"]


def test_a_truncate_without_an_order_value_is_placed_by_arrival(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Issue 42, item 4: a truncate without an order value (no ``lsn``) empties the table at its place
    in arrival order: the changes that arrived before it go with the table, those after it stay. It
    sorted before every ordered change (nulls oldest), so the changes before it silently survived it."""
    s = sink(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, BEFORE), checkpoint_location=ckpt, checkpoint_id=0)
    # Ordered changes, then the truncate without lsn, then more ordered changes: only the last survive.
    before_it = [event("u", 4, row(1, "a2")), event("c", 5, row(4, "d")), event("t", None)]
    s.write(frame(spark, [*before_it, event("c", 6, row(5, "e"))]), checkpoint_location=ckpt, checkpoint_id=1)
    assert read_back(java_reader, s.load_table()) == [row(5, "e")]
    # The other order: the truncate first, then changes (an older lsn than the table's included): it
    # empties the table and every change after it stays.
    after_it = [event("t", None), event("c", 7, row(6, "f")), event("u", 3, row(5, "e2"))]
    s.write(frame(spark, after_it), checkpoint_location=ckpt, checkpoint_id=2)
    assert read_back(java_reader, s.load_table()) == [row(5, "e2"), row(6, "f")]
    # An ordered truncate beside one without an order value: a change survives only after both.
    both = [event("c", 8, row(7, "g")), event("t", None), event("c", 9, row(8, "h")), event("t", 10)]
    s.write(frame(spark, [*both, event("c", 11, row(9, "i"))]), checkpoint_location=ckpt, checkpoint_id=3)
    assert read_back(java_reader, s.load_table()) == [row(9, "i")]
