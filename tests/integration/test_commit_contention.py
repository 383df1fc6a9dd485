"""Other writers that win every attempt of a stream's commit: the checkpoint stays pending.

A stream's commit retries a lost compare-and-swap ``commit.retry.num-retries`` times; when another
writer wins every attempt (CommitRetriesExhaustedError) the stream keeps the checkpoint pending, as
it does through a catalog outage (job/pending.py ``defers``), and the next micro-batch (or the
idle retry) commits it first, then its own: nothing lost or doubled, one snapshot per checkpoint, in
checkpoint order. The races are lost for real: before each attempt of the chosen checkpoint is sent,
another writer (PyIceberg, on the same SQLite catalog) appends a row of its own to the table.
Every table is read back by Iceberg Java and DuckDB.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from iceberg_sink import _faults, options
from tests.integration.sources import event_batch
from tests.integration.test_catalog_outage import Feed, step
from tests.integration.test_v3_cdc import delete_files
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

ATTEMPTS = 3  # Feed.builder: commit.retry.num-retries = 2
# The other writer's rows of a keyed CDC table (its key columns are required).
OTHER_ROWS = StructType(
    [
        StructField("id", LongType(), nullable=False),
        StructField("region", StringType(), nullable=False),
        StructField("v", StringType()),
        StructField("n", LongType()),
        StructField("lsn", LongType()),
    ]
)
CHECKPOINT_ID = "iceberg-sink.checkpoint-id"


class OtherWriter:
    """A fault handler: before each attempt of checkpoint ``target`` is sent, another writer commits a
    row of its own to the table (a real lost race), ``times`` times in all."""

    def __init__(self, props: dict[str, str], identifier: str, feed: Feed, target: int, times: int) -> None:
        self._catalog = load_catalog("pg", **props)  # the catalog name Feed.builder gives the sink
        self._identifier = identifier
        self._feed = feed
        self._target = target
        self._lock = threading.Lock()
        self.left = times
        self.snapshots: list[int] = []

    def __call__(self, point: str, checkpoint_id: int) -> None:
        if point != _faults.BEFORE_COMMIT_SEND or checkpoint_id != self._target:
            return
        with self._lock:
            if self.left <= 0:
                return
            self.left -= 1
            table = self._catalog.load_table(self._identifier)
            n = len(self.snapshots)
            if self._feed.cdc:  # a key the feed never uses (its keys are below 30)
                row = {"id": 1000 + n, "region": "zz", "v": "other writer", "n": n, "lsn": 0}
                self._feed.model[1000 + n] = row
            else:
                batch = event_batch(1_000_000 + n, 1)
                self._feed.appended.append(batch)
                row = batch.to_pylist()[0]
            table.append(pa.Table.from_pylist([row], schema=table.schema().as_arrow()))
            snapshot = self._catalog.load_table(self._identifier).current_snapshot()
            assert snapshot is not None
            self.snapshots.append(snapshot.snapshot_id)


def sink_checkpoints(table: Table) -> list[int]:
    """The sink checkpoint id of each of its snapshots, in commit order (the other writer's: none)."""
    return [
        int(s.summary[CHECKPOINT_ID])  # type: ignore[arg-type]
        for s in table.snapshots()
        if s.summary is not None and CHECKPOINT_ID in s.summary.additional_properties
    ]


def check_table(
    props: dict[str, str], feed: Feed, java: JavaIcebergReader, checkpoints: int, others: list[int]
) -> None:
    """Every checkpoint one snapshot, in order, the other writer's snapshots kept; Java and DuckDB agree."""
    table = load_catalog("pg", **props).load_table("db.t")
    assert sink_checkpoints(table) == list(range(checkpoints))
    assert set(others) <= {s.snapshot_id for s in table.snapshots()}
    java_ids = [
        int(json.loads(s["summary"])[CHECKPOINT_ID])
        for s in java.snapshots(table.metadata_location).to_pylist()
        if CHECKPOINT_ID in json.loads(s["summary"])
    ]
    assert java_ids == list(range(checkpoints))
    want = feed.expected()
    assert normalize(java.read(table.metadata_location), [feed.key]) == want
    assert normalize(duckdb_read(table.metadata_location), [feed.key]) == want


def catalog_props(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "wh").mkdir()
    return {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}


@pytest.fixture(autouse=True)
def _clear_faults() -> Any:
    yield
    _faults.clear()


@pytest.mark.parametrize("cdc", [False, True], ids=["append", "cdc"])
def test_checkpoint_whose_every_attempt_lost_stays_pending_and_commits_in_order_next(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, cdc: bool
) -> None:
    props = catalog_props(tmp_path)
    feed = Feed(tmp_path / "src", cdc)
    sink = feed.builder(props, "db.t").write_option(options.PENDING_RETRY_INTERVAL_MS.key, 0).build()
    query = feed.start(spark, sink, tmp_path / "ckpt")
    pending_dir = tmp_path / "ckpt" / "iceberg_sink" / "committables"
    other = OtherWriter(props, "db.t", feed, target=1, times=ATTEMPTS)
    _faults.install(other)
    try:
        step(query, feed)  # checkpoint 0: committed
        step(query, feed)  # checkpoint 1: every attempt lost, pending; the query runs on
        assert query.exception() is None and query.isActive
        assert other.left == 0 and len(other.snapshots) == ATTEMPTS
        assert [p.name for p in pending_dir.glob("*.json")] == [f"{1:020d}.json"]
        metrics = sink.metrics()
        assert metrics.pending_checkpoints == 1 and metrics.deferred_commits == 1, metrics
        assert metrics.commits == 1 and metrics.commit_conflict_retries == ATTEMPTS, metrics
        step(query, feed)  # checkpoint 2: commits 1 first, then itself
        assert query.exception() is None
    finally:
        query.stop()
    assert not list(pending_dir.glob("*.json"))
    metrics = sink.metrics()
    assert metrics.pending_checkpoints == 0 and metrics.commits == 3, metrics
    check_table(props, feed, java_reader, 3, other.snapshots)


def test_idle_stream_commits_a_checkpoint_whose_races_were_lost(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """No new data after the lost races: the idle retry (iceberg_sink/job/idle.py) commits it."""
    props = catalog_props(tmp_path)
    feed = Feed(tmp_path / "src", cdc=True)
    sink = feed.builder(props, "db.t").write_option(options.PENDING_RETRY_INTERVAL_MS.key, 200).build()
    query = feed.start(spark, sink, tmp_path / "ckpt")
    # Two attempts of the idle retry lose too (the other writer wins five in all): it stays pending.
    other = OtherWriter(props, "db.t", feed, target=1, times=ATTEMPTS + 2)
    _faults.install(other)
    try:
        step(query, feed)
        step(query, feed)
        deadline = time.monotonic() + 60
        while sink.metrics().pending_checkpoints and time.monotonic() < deadline:
            time.sleep(0.2)
        metrics = sink.metrics()
        assert metrics.pending_checkpoints == 0 and metrics.commits == 2, metrics
        assert query.exception() is None and query.isActive
        assert other.left == 0
    finally:
        query.stop()
    check_table(props, feed, java_reader, 2, other.snapshots)


def test_no_pending_allowed_fails_the_stream_naming_the_lost_races_and_a_restart_commits_it(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    props = catalog_props(tmp_path)
    feed = Feed(tmp_path / "src", cdc=True)
    sink = feed.builder(props, "db.t").max_pending_checkpoints(0).build()
    query = feed.start(spark, sink, tmp_path / "ckpt")
    other = OtherWriter(props, "db.t", feed, target=1, times=ATTEMPTS)
    _faults.install(other)
    try:
        step(query, feed)
        feed.add()
        with pytest.raises(StreamingQueryException) as failure:
            query.processAllAvailable()
    finally:
        query.stop()
    message = str(failure.value)
    assert "other writers won every commit attempt" in message, message
    assert "limit of 0" in message and options.MAX_PENDING_CHECKPOINTS.key in message, message
    assert "oldest: checkpoint 1" in message, message

    sink = feed.builder(props, "db.t").build()
    query = feed.start(spark, sink, tmp_path / "ckpt")
    try:
        query.processAllAvailable()  # Spark runs batch 1 again: the stored committable is committed
        step(query, feed)
    finally:
        query.stop()
    assert query.exception() is None
    check_table(props, feed, java_reader, 3, other.snapshots)


@pytest.mark.parametrize("atomic", ["off", "auto"])
def test_routed_stream_keeps_only_the_table_whose_races_were_lost_pending(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, atomic: str
) -> None:
    """A routed stream on a PostgreSQL catalog: another writer wins every attempt on db.a only.
    One table at a time ("off"): db.b's checkpoint commits, db.a's stays pending in its own state.
    Atomically ("auto", one PostgreSQL transaction: docs/transactions.md): neither commits it, both
    keep it pending. Either way a later batch with no row for db.a commits what is pending."""
    from iceberg_sink import IcebergSink
    from iceberg_sink.committer.store import CheckpointStore
    from iceberg_sink.job.routing import RoutedJob
    from tests.integration.test_routing import EVENT_DDL, check_readers, expected_events

    props = catalog_props(tmp_path)
    sink = (
        IcebergSink.builder()
        .catalog("pg", **props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing(format_version=2)  # the other writer, PyIceberg, cannot commit to v3
        .upsert(key=["id"])
        .write_option("commit.retry.num-retries", 2)
        .write_option("commit.retry.min-wait-ms", 20)
        .atomic_commits(atomic)
        .build()
    )
    job = RoutedJob(sink.config, str(tmp_path / "ck"), streaming=True)  # what start() runs per micro-batch
    batches = [
        [("a", 1, "a0", 0.0), ("b", 1, "b0", 0.0)],
        [("a", 2, "a1", 1.0), ("b", 2, "b1", 1.0)],
        [("b", 3, "b2", 2.0)],
    ]
    catalog = load_catalog("pg", **props)
    armed = threading.Event()
    theirs: list[int] = []

    def other_writer(point: str, checkpoint_id: int) -> None:
        """Before every commit attempt sent while armed (either table's), a commit to db.a."""
        if point == _faults.BEFORE_COMMIT_SEND and armed.is_set():
            table = catalog.load_table("db.a")
            table.append(table.schema().as_arrow().empty_table())
            theirs.append(catalog.load_table("db.a").metadata.current_snapshot_id or -1)

    def frame(rows: list[tuple[Any, ...]]) -> Any:
        return spark.createDataFrame(rows, EVENT_DDL).repartition(2)

    _faults.install(other_writer)
    job.process(frame(batches[0]), 0)
    armed.set()
    try:
        outcomes = job.process(frame(batches[1]), 1)
    finally:
        armed.clear()
    assert outcomes["db.a"] is not None and outcomes["db.a"].pending, outcomes
    assert outcomes["db.b"] is not None and outcomes["db.b"].pending is (atomic == "auto"), outcomes
    assert CheckpointStore.for_table(str(tmp_path / "ck"), "db.a").pending_ids() == [1]
    assert CheckpointStore.for_table(str(tmp_path / "ck"), "db.b").pending_ids() == ([1] if atomic == "auto" else [])
    assert sink_checkpoints(catalog.load_table("db.b")) == ([0] if atomic == "auto" else [0, 1])
    job.process(frame(batches[2]), 2)  # no row for db.a: its pending checkpoint is committed too
    assert sink_checkpoints(catalog.load_table("db.a")) == [0, 1]
    assert sink_checkpoints(catalog.load_table("db.b")) == [0, 1, 2]
    assert CheckpointStore.for_table(str(tmp_path / "ck"), "db.a").pending_ids() == []
    assert set(theirs) <= {s.snapshot_id for s in catalog.load_table("db.a").snapshots()}
    rows = [r for batch in batches for r in batch]
    for name in ("a", "b"):
        check_readers(java_reader, catalog.load_table(f"db.{name}"), expected_events(rows, name), "id")


def test_v3_cdc_checkpoints_pending_after_lost_races_commit_in_order_as_deletion_vectors(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Format v3: checkpoints 1 and 2 of a CDC stream lose every attempt to another writer (another
    sink appending rows of keys the stream never uses: v3 snapshots with row lineage), so checkpoint 2
    is written while 1 is pending, its keys' proof made on a table without 1's rows. Checkpoint 3
    commits both first, in order; every delete must become a deletion vector that reaches the rows of
    the pending checkpoints (no key twice, none lost), and no equality delete may be committed."""
    from iceberg_sink import IcebergSink

    props = catalog_props(tmp_path)
    feed = Feed(tmp_path / "src", cdc=True, seed=11)

    def builder() -> Any:
        return (
            IcebergSink.builder()
            .catalog("pg", **props)
            .table("db.t")
            .create_if_missing(partition_by=["region"], format_version=3)
            .cdc(op_column="op", key=["id", "region"], order_by="lsn")
            .write_option("commit.retry.num-retries", 2)
            .write_option("commit.retry.min-wait-ms", 20)
            .write_option(options.PENDING_RETRY_INTERVAL_MS.key, 0)
        )

    sink = builder().build()
    others: list[IcebergSink] = []  # built once the stream has created the table
    inside = threading.local()
    theirs: list[int] = []

    def other_writer(point: str, checkpoint_id: int) -> None:
        """Before each attempt of checkpoints 1 and 2 (while armed), the other sink appends a row."""
        if point != _faults.BEFORE_COMMIT_SEND or checkpoint_id not in (1, 2) or getattr(inside, "busy", False):
            return
        inside.busy = True
        try:
            n = len(theirs)
            row = {"id": 1000 + n, "region": "zz", "v": "other writer", "n": n, "lsn": 0}
            if not others:
                others.append(
                    IcebergSink.builder()
                    .catalog("pg", **props)
                    .table("db.t")
                    .write_option(options.SNAPSHOT_PROPERTY_PREFIX.key, "other")  # its own checkpoint ids
                    .build()
                )
            others[0].write(spark.createDataFrame([tuple(row.values())], OTHER_ROWS))
            feed.model[1000 + n] = row
            theirs.append(n)
        finally:
            inside.busy = False

    query = feed.start(spark, sink, tmp_path / "ckpt")
    try:
        step(query, feed)  # 0
        _faults.install(other_writer)
        for _ in range(2):  # 1, 2: pending (2 is deferred behind 1 without an attempt of its own)
            step(query, feed)
        assert query.exception() is None and sink.metrics().pending_checkpoints == 2, sink.metrics()
        _faults.clear()
        step(query, feed)  # 3: commits 1, 2, then itself
        assert query.exception() is None
    finally:
        query.stop()
        _faults.clear()
    assert len(theirs) == 2 * ATTEMPTS, theirs  # 1 lost every attempt twice (at 1 and again at 2)
    table = load_catalog("pg", **props).load_table("db.t")
    assert table.format_version == 3
    check_table(props, feed, java_reader, 4, [])
    deletes = delete_files(table)
    assert deletes, "the checkpoints deleted rows: deletion vectors expected"
    for meta, _ in deletes:  # deletion vectors only, each naming its data file; no equality delete
        assert meta.file_format == "PUFFIN" and meta.referenced_data_file is not None, meta.path
    assert normalize(pyiceberg_read(table.metadata_location), [feed.key]) == feed.expected()
