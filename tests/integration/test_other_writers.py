"""Other writers under a running stream: a column renamed or dropped, snapshots expired, a stopped
query's idle retry, and a schema change that meets a catalog outage.

Every table is read back by Apache Iceberg Java and DuckDB.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import EqualTo
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from iceberg_sink import IcebergSink, _faults
from iceberg_sink.topology.maintenance import expire_snapshots
from tests.integration.postgres import PostgresServer, postgres, sql_catalog_properties  # noqa: F401
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

DDL = "tbl string, id long, name string, v long"
SCHEMA = pa.schema([("tbl", pa.string()), ("id", pa.int64()), ("name", pa.string()), ("v", pa.int64())])


class Files:
    """One parquet file per micro-batch of a file stream, in order."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True)
        self.directory = directory
        self.count = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        path = self.directory / f"part-{self.count:05d}.parquet"
        hidden = self.directory / f".{path.name}.tmp"  # the file stream ignores names starting with "."
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), hidden)
        os.utime(hidden, (1_700_000_000 + self.count, 1_700_000_000 + self.count))
        hidden.rename(path)
        self.count += 1

    def start(self, spark: SparkSession, sink: IcebergSink, checkpoint: Path) -> StreamingQuery:
        stream = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(self.directory))
        return sink.start(stream, str(checkpoint))


def rows(start: int, n: int, tbl: str = "t", name: bool = True) -> list[dict[str, Any]]:
    return [{"tbl": tbl, "id": i, "name": f"n{i}" if name else None, "v": i * 10} for i in range(start, start + n)]


def read_both(java: JavaIcebergReader, metadata_location: str) -> list[dict[str, Any]]:
    from_java = normalize(java.read(metadata_location), ["id"])
    assert normalize(duckdb_read(metadata_location), ["id"]) == from_java
    return from_java


# -- a column renamed or dropped by another writer -------------------------------------------------


def test_column_renamed_by_another_writer_is_a_clear_error_not_dropped_values(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Batch 0 fixes the check; another writer renames ``name``; batch 1 still sends ``name``.
    Without schema evolution that is a SchemaMismatchError naming ``name``, and nothing of batch 1
    is committed (before: batch 1 skipped the check and its names were silently dropped)."""
    files = Files(tmp_path / "src")
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing().build()
    query = files.start(spark, sink, tmp_path / "ckpt")
    try:
        files.add(rows(0, 5))
        query.processAllAvailable()
        with sink.load_table().update_schema() as update:
            update.rename_column("name", "full_name")
        files.add(rows(5, 5))
        with pytest.raises(StreamingQueryException) as failure:
            query.processAllAvailable()
    finally:
        query.stop()
    message = str(failure.value)
    assert "SchemaMismatchError" in message and "name" in message, message
    table = sink.load_table()
    got = read_both(java_reader, table.metadata_location)
    assert [(r["id"], r["full_name"]) for r in got] == [(i, f"n{i}") for i in range(5)]


@pytest.mark.parametrize("routed", [False, True], ids=["single", "routed"])
def test_column_dropped_by_another_writer_is_added_back_with_add_columns(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, routed: bool
) -> None:
    """With ``add-columns`` a column another writer dropped is added again for the next batch that
    carries it, so its values are kept (before: they were dropped until the driver restarted)."""
    files = Files(tmp_path / "src")
    builder = IcebergSink.builder().embedded(tmp_path / "lake").create_if_missing().schema_evolution("add-columns")
    builder = builder.route(table_column="tbl", namespace="db") if routed else builder.table("db.t")
    sink = builder.build()
    query = files.start(spark, sink, tmp_path / "ckpt")
    try:
        files.add(rows(0, 5))
        query.processAllAvailable()
        with sink.load_table("db.t").update_schema() as update:
            update.delete_column("name")
        files.add(rows(5, 5))
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    table = sink.load_table("db.t")
    assert "name" in table.schema().column_names
    got = read_both(java_reader, table.metadata_location)
    # Batch 0's names went with the dropped column (the other writer's doing); batch 1's are kept.
    assert [(r["id"], r["name"]) for r in got] == [(i, None) for i in range(5)] + [(i, f"n{i}") for i in range(5, 10)]


# -- a new-key proof made on an empty branch, and an expiry that cut the parent chain ----------------


def test_new_key_proof_on_an_empty_table_is_not_trusted_after_an_expiry_cut_the_chain(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """The checkpoint proves keys 0-4 new on the empty table. Before it commits, another writer
    appends rows with those keys, then a delete-only snapshot, and an expiry of fresh snapshots
    leaves that one parent-less. Its rows were added after the proof: the conditional deletes must
    be committed, so each key is in the table once (before: the parent-less head was taken for the
    branch's first snapshot and both rows of each key stayed)."""
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=2)  # conditional equality deletes; PyIceberg cannot commit to v3
        .upsert(key=["id"])
        .build()
    )
    done: list[int] = []

    def other_writer(point: str, checkpoint_id: int) -> None:
        if point != _faults.BEFORE_WRITE or done:
            return
        done.append(checkpoint_id)
        table = sink.load_table()
        arrow = table.schema().as_arrow()
        theirs = [{"tbl": "x", "id": i, "name": f"theirs{i}", "v": -i} for i in range(5)]
        table.append(pa.Table.from_pylist(theirs, schema=arrow))
        table = sink.load_table()
        table.append(pa.Table.from_pylist([{"tbl": "x", "id": 100, "name": "gone", "v": 0}], schema=arrow))
        table = sink.load_table()
        table.delete(EqualTo("id", 100))  # drops that whole file: a snapshot adding no rows
        head = sink.load_table().current_snapshot()
        assert head is not None and head.summary is not None
        assert int(head.summary.get("added-data-files") or "0") == 0
        expired = expire_snapshots(sink.load_table, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5))
        assert len(expired.expired_snapshot_ids) == 2
        head = sink.load_table().current_snapshot()
        assert head is not None and head.parent_snapshot_id is None

    _faults.install(other_writer)
    try:
        sink.write(spark.createDataFrame(rows(0, 5), DDL))
    finally:
        _faults.clear()
    assert done == [0]
    got = read_both(java_reader, sink.load_table().metadata_location)
    assert [(r["id"], r["name"]) for r in got] == [(i, f"n{i}") for i in range(5)]


# -- a schema change while the catalog is down ---------------------------------------------------------


def test_schema_change_during_an_outage_stops_the_stream_clearly_and_a_restart_loses_nothing(
    spark: SparkSession,
    postgres: PostgresServer,  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    """A routed stream with add-columns: batch 1 is kept pending through the outage; batch 2 is the
    first to carry ``name`` for table db.t, which needs a schema change. That cannot be deferred: the
    stream stops with CatalogUnavailableError saying so. Restarted with the catalog back, batches 1
    and 2 are committed in order and nothing is lost."""
    props = sql_catalog_properties(postgres, "evolve", tmp_path / "wh")
    files = Files(tmp_path / "src")

    def sink() -> IcebergSink:
        return (
            IcebergSink.builder()
            .catalog("pg", **props)
            .route(table_column="tbl", namespace="db")
            .create_if_missing()
            .schema_evolution("add-columns")
            .write_option("commit.retry.num-retries", 2)
            .write_option("commit.retry.min-wait-ms", 20)
            .build()
        )

    first = sink()
    query = files.start(spark, first, tmp_path / "ckpt")
    try:
        files.add(rows(0, 5, name=False))
        query.processAllAvailable()
        postgres.stop()
        files.add(rows(5, 5, name=False))
        query.processAllAvailable()  # pending
        files.add(rows(10, 5))  # carries name: the table needs the column
        with pytest.raises(StreamingQueryException) as failure:
            query.processAllAvailable()
    finally:
        query.stop()
    message = str(failure.value)
    assert "CatalogUnavailableError" in message and "schema change of table db.t" in message, message
    assert "is not kept pending" in message and "restart the stream once the catalog answers" in message, message
    postgres.start()
    second = sink()
    query = files.start(spark, second, tmp_path / "ckpt")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    table = load_catalog("pg", **props).load_table("db.t")
    got = read_both(java_reader, table.metadata_location)
    assert [(r["id"], r["name"]) for r in got] == [(i, None) for i in range(10)] + [(i, f"n{i}") for i in range(10, 15)]


# -- a stopped query's idle retry and a restarted query in the same driver ------------------------------


def test_idle_retry_of_a_stopped_query_does_not_race_the_restarted_query(
    spark: SparkSession,
    postgres: PostgresServer,  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    """Query 1 leaves checkpoint 1 pending (catalog down); its idle-retry thread is retrying when the
    query stops. Query 2 starts on the same checkpoint location in the same driver once the catalog
    is back. The old thread and the new query must not both commit checkpoint 1: one would find its
    staged files gone and fail with a false "nothing of checkpoint 1 is in the table".

    The interleaving is forced at the fault point before a commit attempt prepares: the old thread
    waits there until query 2 has loaded the table for its own attempt; query 2 then waits until
    checkpoint 1 is in the table. Joined at query 2's start (and sharing its lock), the old thread
    commits first and query 2 finds nothing pending."""
    props = sql_catalog_properties(postgres, "idle", tmp_path / "wh")
    files = Files(tmp_path / "src")

    def sink(retry_interval_ms: int) -> IcebergSink:
        return (
            IcebergSink.builder()
            .catalog("pg", **props)
            .table("db.t")
            .create_if_missing()
            .write_option("iceberg-sink.commit.pending-retry-interval-ms", retry_interval_ms)
            .write_option("commit.retry.num-retries", 200)
            .write_option("commit.retry.min-wait-ms", 200)
            .write_option("commit.retry.max-wait-ms", 300)
            .build()
        )

    retrying = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # The idle thread's commit of checkpoint 1 retrying its loads (the batch itself defers
            # without a commit attempt): the thread is inside its retries.
            message = record.getMessage()
            if "checkpoint 1 of job" in message and "the catalog is unreachable (load" in message:
                retrying.set()

    watch = Watch()
    logging.getLogger("iceberg_sink").addHandler(watch)
    query = files.start(spark, sink(200), tmp_path / "ckpt")
    try:
        files.add(rows(0, 5))
        query.processAllAvailable()
        postgres.stop()
        files.add(rows(5, 5))
        query.processAllAvailable()  # checkpoint 1 pending
        assert retrying.wait(30), "the idle retry never started"
    finally:
        query.stop()  # the idle thread is in the middle of its retries
        logging.getLogger("iceberg_sink").removeHandler(watch)
    # The stopped query's idle thread, told apart from any later one by identity.
    old_threads = {t for t in threading.enumerate() if t.name == "iceberg-sink-pending-retry"}
    assert old_threads, "the stopped query's idle-retry thread is not running"

    new_query_loaded = threading.Event()

    def in_table() -> bool:
        try:  # a catalog of its own: connections from before the restart are dead
            table = load_catalog("pg", **props).load_table("db.t")
        except Exception:
            return False
        return any((s.summary or {}).get("iceberg-sink.checkpoint-id") == "1" for s in table.snapshots())

    def interleave(point: str, checkpoint_id: int) -> None:
        if point != _faults.BEFORE_COMMIT_PREPARE or checkpoint_id != 1:
            return
        if threading.current_thread() in old_threads:
            # The old thread: let the new query load first (joined first, it waits here in vain).
            new_query_loaded.wait(20)
            return
        new_query_loaded.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not in_table():
            time.sleep(0.2)

    _faults.install(interleave)
    try:
        postgres.start()
        # No idle retry of its own: the new query's batch is its only committer of checkpoint 1.
        query = files.start(spark, sink(0), tmp_path / "ckpt")
        try:
            files.add(rows(10, 5))
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        _faults.clear()
    assert query.exception() is None
    table = load_catalog("pg", **props).load_table("db.t")
    ids = [int((s.summary or {}).get("iceberg-sink.checkpoint-id") or -1) for s in table.snapshots()]
    assert ids == [0, 1, 2]
    got = read_both(java_reader, table.metadata_location)
    assert [r["id"] for r in got] == list(range(15))
