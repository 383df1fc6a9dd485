"""Flink-named metrics, per-batch progress records and the Prometheus endpoint, on a real stream.

The expected numbers come from the table itself: the summaries of the snapshots the stream and
its compactions committed.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.table import Table
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from iceberg_sink import IcebergSink, InvalidSinkConfigError
from iceberg_sink.observe.metrics import HistogramStatistics
from iceberg_sink.vocab.summary_keys import JobKeys

BATCHES = 4
ROWS = 40
DDL = "id long, v string, lsn long"


def write_changes(source: Path) -> dict[int, str]:
    """Upserts in files read one per micro-batch: half new keys, half updates; returns the model."""
    source.mkdir(parents=True)
    model: dict[int, str] = {}
    for b in range(BATCHES):
        ids = [b * ROWS // 2 + i for i in range(ROWS)]  # overlaps the previous batch by half
        values = [f"v{b}-{i}" for i in ids]
        model.update(zip(ids, values, strict=True))
        lsn = [b * 1000 + i for i in range(ROWS)]
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "v": values, "lsn": pa.array(lsn, pa.int64())}),
            source / f"part-{b:05d}.parquet",
        )
    return model


def sums(table: Table, operation: str, keys: tuple[str, ...]) -> dict[str, int]:
    """Sums of summary ``keys`` over the snapshots of one operation kind."""
    totals = dict.fromkeys(keys, 0)
    for s in table.snapshots():
        assert s.summary is not None
        if s.summary.operation.value == operation:
            for k in keys:
                totals[k] += int(s.summary.get(k) or 0)
    return totals


def run_stream(spark: SparkSession, sink: IcebergSink, source: Path, checkpoint: Path) -> None:
    stream = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = sink.start(stream, str(checkpoint), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_match_the_table_and_are_scraped(spark: SparkSession, tmp_path: Path) -> None:
    model = write_changes(tmp_path / "source")
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        # v2: the committed delete files are the writers' equality deletes, counted as the summary counts them.
        .create_if_missing(format_version=2)
        .upsert(key=["id"])
        .compaction(every_n_commits=2)
        .prometheus(port=0, addr="127.0.0.1", job="users-stream")
        .build()
    )
    try:
        port = sink.prometheus_port
        assert port is not None and port > 0
        assert sink.prometheus_url == f"http://127.0.0.1:{port}/metrics"
        # Before any batch: the endpoint answers with zeros.
        before = scrape(sink.prometheus_url)
        labels = (("job", "users-stream"), ("table", "db.users"))
        assert before[("iceberg_sink_IcebergFilesCommitter_committedDataFilesCount", labels)] == 0

        run_stream(spark, sink, tmp_path / "source", tmp_path / "checkpoint")
        table = sink.load_table()
        assert len(model) == ROWS // 2 * (BATCHES + 1)

        flink = sink.metrics().flink()
        committer = flink["IcebergFilesCommitter"]
        committed = sums(
            table,
            "overwrite",
            ("added-data-files", "added-records", "added-delete-files", "added-files-size"),
        )
        appended = sums(table, "append", ("added-data-files", "added-records", "added-files-size"))
        deletes = sums(table, "overwrite", ("added-equality-deletes", "added-position-deletes"))
        # The first batch only inserts new keys (an append), later ones upsert (row deltas).
        assert committer["committedDataFilesCount"] == committed["added-data-files"] + appended["added-data-files"]
        assert committer["committedDataFilesRecordCount"] == committed["added-records"] + appended["added-records"]
        assert committer["committedDataFilesRecordCount"] == BATCHES * ROWS
        assert committer["committedDeleteFilesCount"] == committed["added-delete-files"] > 0
        assert (
            committer["committedDeleteFilesRecordCount"]
            == deletes["added-equality-deletes"] + deletes["added-position-deletes"]
        )
        assert (
            committer["committedDataFilesByteCount"] + committer["committedDeleteFilesByteCount"]
            == committed["added-files-size"] + appended["added-files-size"]
        )
        assert committer["lastCommitDurationMs"] > 0
        assert committer["lastCheckpointDurationMs"] >= committer["lastCommitDurationMs"]
        assert 0 <= committer["elapsedSecondsSinceLastSuccessfulCommit"] < 600

        writer = flink["IcebergStreamWriter"]
        assert writer["flushedDataFiles"] == committer["committedDataFilesCount"]
        assert writer["flushedDeleteFiles"] >= committer["committedDeleteFilesCount"]
        data_sizes: HistogramStatistics = writer["dataFilesSizeHistogram"]
        assert data_sizes.count == writer["flushedDataFiles"]
        assert data_sizes.total == committer["committedDataFilesByteCount"]
        assert 0 < data_sizes.min <= data_sizes.quantile(0.5) <= data_sizes.max
        assert writer["deleteFilesSizeHistogram"].count == writer["flushedDeleteFiles"]
        assert writer["lastFlushDurationMs"] > 0

        rewrite = flink["maintenance"]["RewriteDataFiles"]
        replaced = sums(
            table,
            "replace",
            ("added-data-files", "deleted-data-files", "added-files-size", "removed-files-size"),
        )
        assert rewrite["triggered"] == BATCHES // 2
        assert rewrite["succeededTasks"] == BATCHES // 2 and rewrite["failedTasks"] == 0
        assert rewrite["addedDataFileNum"] == replaced["added-data-files"] > 0
        assert rewrite["removedDataFileNum"] == replaced["deleted-data-files"]
        assert rewrite["addedDataFileSize"] > 0 and rewrite["removedDataFileSize"] > 0
        assert rewrite["lastRunDurationMs"] > 0
        assert flink["maintenance"]["ConvertEqualityDeletes"]["triggered"] == 0

        # The scrape shows the same numbers, labelled with table and job.
        scraped = scrape(sink.prometheus_url)
        for group in ("IcebergStreamWriter", "IcebergFilesCommitter"):
            for name, value in flink[group].items():
                full = f"iceberg_sink_{group}_{name}"
                if isinstance(value, HistogramStatistics):
                    assert scraped[(full + "_count", labels)] == value.count
                    assert scraped[(full + "_sum", labels)] == value.total
                    assert scraped[(full, (*labels[:1], ("quantile", "0.5"), labels[1]))] == value.quantile(0.5)
                elif name != "elapsedSecondsSinceLastSuccessfulCommit":  # moves between the two reads
                    assert scraped[(full, labels)] == value, full
        task_labels = (("job", "users-stream"), ("table", "db.users"), ("task_name", "RewriteDataFiles"))
        for name, value in rewrite.items():
            assert scraped[(f"iceberg_sink_maintenance_{name}", task_labels)] == value, name
    finally:
        sink.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


class Collecting(StreamingQueryListener):
    """A real listener: on each progress event it takes the sink's record of that batch."""

    def __init__(self, sink: IcebergSink) -> None:
        self.sink = sink
        self.matched: list[tuple[int, dict[str, Any] | None]] = []

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        batch_id = event.progress.batchId
        record = next((p for p in self.sink.progress() if p["checkpoint_id"] == batch_id), None)
        self.matched.append((batch_id, record))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def test_progress_line_per_batch_and_listener(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_changes(tmp_path / "source")
    sink = (
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.users").create_if_missing().upsert(["id"]).build()
    )
    listener = Collecting(sink)
    spark.streams.addListener(listener)
    try:
        with caplog.at_level(logging.INFO, logger="iceberg_sink.progress"):
            run_stream(spark, sink, tmp_path / "source", tmp_path / "checkpoint")
        # Listener events are delivered asynchronously: wait for the bus to drain.
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)  # type: ignore[union-attr]
    finally:
        spark.streams.removeListener(listener)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "iceberg_sink.progress"]
    assert [p["checkpoint_id"] for p in lines] == list(range(BATCHES))
    assert lines == sink.progress()
    table = sink.load_table()
    snapshots = {
        int(s.summary[JobKeys().checkpoint_id]): s.snapshot_id for s in table.snapshots() if s.summary is not None
    }
    for p in lines:
        assert p["status"] == "committed" and p["table"] == "db.users" and p["branch"] == "main"
        assert p["rows"] == ROWS and p["data_files"] >= 1 and p["snapshot_id"] == snapshots[p["checkpoint_id"]]
        assert p["commit_ms"] > 0 and p["write_ms"] > 0 and p["checkpoint_ms"] >= p["commit_ms"]
        assert p["committed_pending"] == [] and p["error"] is None
        phases = p["phases_ms"]
        assert set(phases) == {"read", "plan", "build", "write", "stage", "commit"}, phases
        assert phases["write"] >= p["write_ms"] - 1, (phases, p)
        assert sum(phases.values()) <= p["checkpoint_ms"] + 1 and phases["commit"] >= p["commit_ms"] - 1
    assert len({p["job_id"] for p in lines}) == 1 and lines[0]["job_id"]
    assert sum(p["delete_files"] for p in lines) > 0
    assert sink.last_progress() == lines[-1]
    assert sum(p["rows"] for p in lines) == BATCHES * ROWS and len(model) < BATCHES * ROWS
    # The listener saw each batch id with the sink's record of that very batch.
    matched = dict(listener.matched)
    assert set(range(BATCHES)) <= set(matched)
    for batch_id in range(BATCHES):
        assert matched[batch_id] is not None and matched[batch_id]["checkpoint_id"] == batch_id


def test_prometheus_options_are_checked(tmp_path: Path) -> None:
    builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing()
    with pytest.raises(InvalidSinkConfigError, match=r"prometheus\(port\): expected an integer from 0 to 65535"):
        builder.prometheus(port=70000).build()
    with pytest.raises(InvalidSinkConfigError, match=r"prometheus\(job\): expected a non-empty string"):
        builder.prometheus(port=0, job="").build()
    first = builder.prometheus(port=0, addr="127.0.0.1").build()
    try:
        taken = first.prometheus_port
        with pytest.raises(InvalidSinkConfigError, match=rf"prometheus\(port={taken}.*cannot serve metrics there"):
            builder.prometheus(port=taken, addr="127.0.0.1").build()
    finally:
        first.close()


def test_progress_status_of_empty_replayed_and_failed_batches(spark: SparkSession, tmp_path: Path) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing().upsert(["id"]).build()
    location = str(tmp_path / "checkpoint")
    rows = spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")
    sink.write(rows, checkpoint_location=location, checkpoint_id=0)
    sink.write(rows, checkpoint_location=location, checkpoint_id=0)  # a replay: already in the table
    sink.write(rows.limit(0), checkpoint_location=location, checkpoint_id=1)
    with pytest.raises(Exception, match="null"):
        sink.write(
            spark.createDataFrame([(None, "x")], "id long, v string"), checkpoint_location=location, checkpoint_id=2
        )
    statuses = [(p["checkpoint_id"], p["status"], p["rows"]) for p in sink.progress()]
    assert statuses == [(0, "committed", 2), (0, "skipped", 0), (1, "empty", 0), (2, "failed", 0)]
    failed = sink.last_progress()
    assert failed is not None and failed["error"].startswith("InvalidInputError: ") and failed["snapshot_id"] is None
    assert sink.metrics().commits == 1 and sink.metrics().skipped_commits == 0


def test_the_read_phase_is_the_batchs_read_and_part_of_its_checkpoint_ms(spark: SparkSession, tmp_path: Path) -> None:
    """Stage 1 of the road (the ``map_batches`` functions, a Debezium reader, ...) runs before the job
    starts the batch's record: its wall time is the record's ``read`` phase and is counted in
    ``checkpoint_ms``, once per batch."""
    pause = 0.4

    def slow(df: Any) -> Any:
        time.sleep(pause)  # a reader's own work on the driver, such as a Debezium batch's plan
        return df

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing()
        .upsert(["id"])
        .map_batches(slow)
        .build()
    )
    location = str(tmp_path / "checkpoint")
    for checkpoint_id in range(2):
        rows = spark.createDataFrame([(1, f"a{checkpoint_id}"), (2, "b")], "id long, v string")
        sink.write(rows, checkpoint_location=location, checkpoint_id=checkpoint_id)
        record = sink.last_progress()
        assert record is not None and record["status"] == "committed", record
        phases = record["phases_ms"]
        assert list(phases)[:2] == ["read", "plan"], phases
        assert pause * 1000 <= phases["read"] < pause * 1000 + 5_000, phases
        assert sum(phases.values()) <= record["checkpoint_ms"] + 1, record
    # Another sink's batch (a replay the table holds), read without the pause: its own read, not the last one's.
    fast = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").upsert(["id"]).build()
    rows = spark.createDataFrame([(1, "a1"), (2, "b")], "id long, v string")
    fast.write(rows, checkpoint_location=location, checkpoint_id=1)
    replay = fast.last_progress()
    assert replay is not None and replay["status"] == "skipped", replay
    assert replay["phases_ms"]["read"] < pause * 1000, replay


def test_the_endpoint_binds_the_loopback_interface_unless_told(tmp_path: Path) -> None:
    builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing()
    sink = builder.prometheus(port=0).build()
    try:
        assert sink._prometheus is not None
        assert sink._prometheus._server.server_address[0] == "127.0.0.1"
        assert sink.prometheus_url == f"http://127.0.0.1:{sink.prometheus_port}/metrics"
        assert scrape(sink.prometheus_url)  # served there
    finally:
        sink.close()
    exposed = builder.prometheus(port=0, addr="0.0.0.0").build()  # docs/metrics.md: how to expose it
    try:
        assert exposed._prometheus is not None and exposed._prometheus._server.server_address[0] == "0.0.0.0"
    finally:
        exposed.close()
    with pytest.raises(InvalidSinkConfigError, match=r"prometheus\(max_tables\): expected a positive integer"):
        builder.prometheus(max_tables=0).build()


def test_a_routed_sink_has_bounded_per_table_series_where_a_stuck_table_shows(
    spark: SparkSession, tmp_path: Path, java_reader: Any
) -> None:
    """Five routed tables, two series of their own (the most records), the other three in
    ``table="other"``; a table that stops receiving rows keeps a growing commit age."""
    import time

    from tests.interop.readers import duckdb_read, normalize

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .route(table_column="tbl", namespace="db")
        .create_if_missing()
        .prometheus(port=0, max_tables=2, job="routed-job")
        .build()
    )
    sizes = {"a": 5, "b": 4, "c": 3, "d": 2, "e": 1}
    rows = [(t, i, f"{t}{i}") for t, n in sizes.items() for i in range(n)]
    ckpt = str(tmp_path / "ckpt")
    try:
        sink.write(spark.createDataFrame(rows, "tbl string, id long, v string"), checkpoint_location=ckpt)
        time.sleep(2)
        # Only a and e get rows now: b, c and d are "stuck".
        later = [("a", 100, "a100"), ("e", 100, "e100")]
        sink.write(spark.createDataFrame(later, "tbl string, id long, v string"), checkpoint_location=ckpt)
        scraped = scrape(sink.prometheus_url or "")

        def table_metric(name: str) -> dict[str, float]:
            return {
                dict(labels)["table"]: value
                for (metric, labels), value in scraped.items()
                if metric == f"iceberg_sink_table_{name}" and dict(labels)["job"] == "routed-job"
            }

        assert table_metric("committedRecords") == {"db.a": 6, "db.b": 4, "other": 3 + 2 + 2}
        assert table_metric("commits") == {"db.a": 2, "db.b": 1, "other": 4}
        assert table_metric("tables") == {"db.a": 1, "db.b": 1, "other": 3}
        assert table_metric("pendingCheckpoints") == {"db.a": 0, "db.b": 0, "other": 0}
        age = table_metric("elapsedSecondsSinceLastSuccessfulCommit")
        assert set(age) == {"db.a", "db.b", "other"}
        assert age["db.b"] >= 2 and age["other"] >= 2 > age["db.a"]  # other: its stalest table (c, d)
        # The sink-wide series keep their single label; nothing else names a table.
        labels = {dict(k[1]).get("table") for k in scraped}
        assert labels == {"routed", "db.a", "db.b", "other"}
        # What the series count is what the tables hold (Iceberg Java and DuckDB).
        for t, n in sizes.items():
            table = sink.load_table(f"db.{t}")
            extra = [{"id": 100, "v": f"{t}100"}] if t in ("a", "e") else []
            expected = sorted([{"id": i, "v": f"{t}{i}"} for i in range(n)] + extra, key=lambda r: r["id"])
            assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected
            assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected
    finally:
        sink.close()
