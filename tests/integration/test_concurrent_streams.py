"""Two streams, compaction and snapshot expiry on one table for many checkpoints: every checkpoint of
each job lands exactly once, conflicts between them are retried and counted, and expiry never removes
what a job needs to recognise its own commits after a restart.

- job A: a CDC sink (inserts, updates, deletes) on keys 0-39, compacting every 3 commits;
- job B: an upsert sink on keys 1000-1039, compacting every 4 commits;
- a thread expiring snapshots (``older_than=now``, ``retain_last`` 1 or 2) through the maintenance API
  every half second while both run;
- job A's stream dies once right after a commit, before Spark records the batch (a failing post-commit
  hook with ``iceberg-sink.post-commit.fail-on-error``); it is restarted only once B has committed
  again and expiry has run, so its last snapshot is neither the head nor among the retained last:
  only the per-job protection of expiry keeps the replayed batch from being written twice.

Every commit is found in the table's metadata log (old metadata files stay), so snapshots expired
during the run are counted too.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, _faults
from iceberg_sink.committer.committer import find_max_committed_checkpoint
from iceberg_sink.topology import maintenance
from iceberg_sink.topology.hooks import CommitResult
from tests.integration.sources import CHANGE_SCHEMA_DDL, apply_changes, write_change_files
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

FILES = 12  # checkpoints of job A
FILES_B = 16  # checkpoints of job B (more, so it still commits after A's restart)
CRASH_AT = 3  # job A's checkpoint whose stream dies after the commit
FORCED_CONFLICTS = 3
UPSERT_DDL = "id long, v string, lsn long"


def write_upsert_files(directory: Path, seed: int) -> list[pa.Table]:
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    tables, lsn = [], 10**6
    for f in range(FILES_B):
        rows = []
        for key in rng.sample(range(1000, 1040), 15):  # distinct keys: one image per key and batch
            lsn += 1
            rows.append({"id": key, "v": f"b{lsn}", "lsn": lsn})
        table = pa.Table.from_pylist(rows, pa.schema([("id", pa.int64()), ("v", pa.string()), ("lsn", pa.int64())]))
        path = directory / f"part-{f:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))  # the stream reads them in this order
        tables.append(table)
    return tables


def history(table: Table) -> dict[int, dict[str, str]]:
    """Every snapshot the table ever had (id -> summary), from every metadata file that was ever current.

    Those are the current file and, recursively, the files each one's metadata log names. A metadata
    file written by a commit attempt that lost its race (or whose catalog update failed) was never
    current: its snapshot never was in the table, and reading it would look like a doubled checkpoint.
    """
    folder = Path(table.location().removeprefix("file://")) / "metadata"
    current = Path(table.metadata_location.removeprefix("file://"))
    seen = {current.name}
    todo = [current]
    snapshots: dict[int, dict[str, str]] = {}
    while todo:
        metadata = json.loads(todo.pop().read_text(encoding="utf-8"))
        for s in metadata.get("snapshots", []):
            snapshots[s["snapshot-id"]] = s.get("summary", {})
        for entry in metadata.get("metadata-log", []):
            earlier = folder / Path(entry["metadata-file"].removeprefix("file://")).name
            if earlier.name not in seen and earlier.exists():
                seen.add(earlier.name)
                todo.append(earlier)
    return snapshots


class ForcedConflicts:
    """A fault handler that makes the first few checkpoint commits lose a race for real: before the
    commit is sent it waits until another writer (the other stream or a compaction) moves the head.

    Each checkpoint id is forced once at most: a commit retried within its backoff reaches the handler
    again before the other writer does, and forcing all of them onto one commit (with the expiry's and
    the compactions' own commits) could use up its retries (the checkpoint would then stay pending
    until the stream's next batch: tests/integration/test_commit_contention.py)."""

    def __init__(self, load_table: Callable[[], Table], times: int) -> None:
        self._load = load_table
        self._left = times
        self._lock = threading.Lock()
        self._forced: set[int] = set()
        self.waited: list[str] = []

    def __call__(self, point: str, checkpoint_id: int) -> None:
        if point != _faults.BEFORE_COMMIT_SEND or self._left <= 0 or not self._lock.acquire(blocking=False):
            return
        try:
            if self._left <= 0 or checkpoint_id in self._forced:
                return
            self._forced.add(checkpoint_id)
            self._left -= 1
            head = self._load().metadata.current_snapshot_id
            deadline = time.monotonic() + 120
            while self._load().metadata.current_snapshot_id == head and time.monotonic() < deadline:
                time.sleep(0.05)
            moved = self._load().metadata.current_snapshot_id != head
            self.waited.append(f"checkpoint {checkpoint_id}: head moved={moved}")
        finally:
            self._lock.release()


def test_two_streams_compaction_and_expiry_commit_everything_once(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    (tmp_path / "wh").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}
    catalog = load_catalog("cs", **props)
    catalog.create_namespace("db")
    catalog.create_table(
        "db.t",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "v", StringType(), required=False),
            NestedField(3, "lsn", LongType(), required=False),
            identifier_field_ids=[1],
        ),
        partition_spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket")),
        properties={"format-version": "2"},
    )

    def load() -> Table:
        return catalog.load_table("db.t")

    changes = write_change_files(tmp_path / "src-a", files=FILES, changes_per_file=20, keys=40, seed=3)
    upserts = write_upsert_files(tmp_path / "src-b", seed=4)

    crashed = threading.Event()

    def crash_once(result: CommitResult) -> None:
        if result.checkpoint_id == CRASH_AT and not crashed.is_set():
            crashed.set()
            raise RuntimeError(f"driver dies after committing checkpoint {CRASH_AT}, before Spark records it")

    def sink_a(crashing: bool) -> IcebergSink:
        builder = (
            IcebergSink.builder()
            .catalog("cs", **props)
            .table("db.t")
            .cdc(op_column="op", key=["id"], order_by="lsn")
            .compaction(every_n_commits=3)
        )
        if crashing:
            builder = builder.post_commit_hook(crash_once).write_option("iceberg-sink.post-commit.fail-on-error", True)
        return builder.build()

    sink_b = (
        IcebergSink.builder()
        .catalog("cs", **props)
        .table("db.t")
        .upsert(key=["id"])
        .compaction(every_n_commits=4)
        .build()
    )

    def stream(source: str, ddl: str) -> object:
        return spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / source))

    expired: list[tuple[float, int]] = []  # (start time, snapshots expired)
    expire_errors: list[str] = []
    stop = threading.Event()

    def expire_loop() -> None:
        rng = random.Random(9)
        while not stop.wait(0.5):
            started = time.monotonic()
            try:
                result = maintenance.expire_snapshots(load, dt.datetime.now(dt.UTC), retain_last=rng.choice([1, 2]))
                expired.append((started, len(result.expired_snapshot_ids)))
            except Exception as e:  # a race with a commit: the next round expires them
                expire_errors.append(repr(e))

    conflicts = ForcedConflicts(load, FORCED_CONFLICTS)
    _faults.install(conflicts)
    expirer = threading.Thread(target=expire_loop, daemon=True)
    expirer.start()
    first_a = sink_a(crashing=True)
    sinks = [first_a, sink_b]
    try:
        query_a = first_a.start(
            stream("src-a", CHANGE_SCHEMA_DDL), str(tmp_path / "ck-a"), trigger={"availableNow": True}
        )
        query_b = sink_b.start(stream("src-b", UPSERT_DDL), str(tmp_path / "ck-b"), trigger={"availableNow": True})
        with pytest.raises(StreamingQueryException, match="driver dies after committing"):
            query_a.awaitTermination(600)
        job_a, job_b = _job_of(tmp_path / "ck-a"), _job_of(tmp_path / "ck-b")
        # Before the restart: B commits three times more and then an expiry runs, so A's last snapshot is
        # neither the head nor among the retained last ones: only the per-job protection keeps it.
        committed_b = find_max_committed_checkpoint(load(), "main", job_b, "iceberg-sink")
        deadline = time.monotonic() + 300
        while find_max_committed_checkpoint(load(), "main", job_b, "iceberg-sink") < committed_b + 3:
            assert query_b.isActive, f"job B stopped before job A's restart: {query_b.exception()}"
            assert time.monotonic() < deadline, "job B did not commit three more checkpoints in 300 s"
            time.sleep(0.1)
        b_moved_on = time.monotonic()
        while not any(started > b_moved_on for started, _ in expired):
            assert time.monotonic() < deadline, f"no expiry ran: {expire_errors}"
            time.sleep(0.1)
        table = load()
        crash_snapshot = _snapshot_of(table, job_a, CRASH_AT)
        assert crash_snapshot is not None, "expiry removed job A's newest snapshot"
        main_chain = [table.metadata.current_snapshot_id]
        while len(main_chain) < 2 and (parent := table.snapshot_by_id(main_chain[-1]).parent_snapshot_id):  # type: ignore[union-attr]
            main_chain.append(parent)
        assert crash_snapshot not in main_chain, "job A's snapshot is still among the last ones: not a test of expiry"
        second_a = sink_a(crashing=False)
        sinks.append(second_a)
        query_a = second_a.start(
            stream("src-a", CHANGE_SCHEMA_DDL), str(tmp_path / "ck-a"), trigger={"availableNow": True}
        )
        query_a.awaitTermination(600)
        query_b.awaitTermination(600)
        for sink in sinks:
            sink.await_compactions(600)
    finally:
        stop.set()
        expirer.join(60)
        _faults.clear()

    table = load()
    jobs = {"A": (job_a, FILES), "B": (job_b, FILES_B)}
    # Every checkpoint of each job is exactly one snapshot over the whole history ...
    seen: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for snapshot_id, summary in history(table).items():
        if "iceberg-sink.job-id" in summary:
            seen[(summary["iceberg-sink.job-id"], summary["iceberg-sink.checkpoint-id"])].append(snapshot_id)
    for name, (job, files) in jobs.items():
        by_checkpoint = {int(cp): ids for (j, cp), ids in seen.items() if j == job}
        assert sorted(by_checkpoint) == list(range(files)), name
        doubled = {cp: ids for cp, ids in by_checkpoint.items() if len(ids) != 1}
        assert not doubled, f"job {name}: checkpoints committed more than once: {doubled}"
        assert find_max_committed_checkpoint(table, "main", job, "iceberg-sink") == files - 1
    # ... and among the retained snapshots.
    retained = [
        (s.summary["iceberg-sink.job-id"], s.summary["iceberg-sink.checkpoint-id"])  # type: ignore[index]
        for s in table.snapshots()
        if s.summary is not None and "iceberg-sink.job-id" in s.summary.additional_properties
    ]
    assert len(retained) == len(set(retained))
    assert len(table.snapshots()) < len(history(table)), "expiry never ran"

    expected = normalize(pa.concat_tables([apply_changes(changes), _last_images(upserts)]), ["id"])
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected, "Iceberg Java"
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected, "DuckDB"

    metrics = [s.metrics() for s in sinks]
    sys.stderr.write(
        f"two streams: {len(history(table))} snapshots in all, {len(table.snapshots())} retained, "
        f"{sum(n for _, n in expired)} expired in {len(expired)} runs ({len(expire_errors)} failed); "
        f"conflict retries {[m.commit_conflict_retries for m in metrics]}, compactions succeeded "
        f"{[m.compactions_succeeded for m in metrics]} failed {[m.compactions_failed for m in metrics]}; "
        f"forced: {conflicts.waited}\n"
    )
    assert sum(m.commit_conflict_retries for m in metrics) >= 1, (conflicts.waited, metrics)
    assert sum(m.compactions_succeeded for m in metrics) >= 1, metrics
    assert sum(n for _, n in expired) > 0, expire_errors


def _job_of(checkpoint: Path) -> str:
    return str(json.loads((checkpoint / "iceberg_sink" / "job.json").read_text(encoding="utf-8"))["job_id"])


def _snapshot_of(table: Table, job: str, checkpoint: int) -> int | None:
    for s in table.snapshots():
        summary = s.summary.additional_properties if s.summary is not None else {}
        if summary.get("iceberg-sink.job-id") == job and summary.get("iceberg-sink.checkpoint-id") == str(checkpoint):
            return s.snapshot_id
    return None


def _last_images(tables: list[pa.Table]) -> pa.Table:
    state: dict[int, dict[str, object]] = {}
    for row in (r for t in tables for r in t.to_pylist()):
        state[int(row["id"])] = row
    return pa.Table.from_pylist(list(state.values()), tables[0].schema)
