"""SinkMetrics: file size histograms and the Flink-named view."""

from __future__ import annotations

import attrs

from iceberg_sink.observe.metrics import HISTOGRAM_WINDOW, QUANTILES, MetricsSnapshot, SinkMetrics, TableActivity

FLINK_WRITER = {
    "flushedDataFiles",
    "flushedDeleteFiles",
    "lastFlushDurationMs",
    "dataFilesSizeHistogram",
    "deleteFilesSizeHistogram",
    "deadLetterRecords",  # ours (.dead_letter): rows written to the dead-letter table
}
FLINK_COMMITTER = {
    "lastCheckpointDurationMs",
    "lastCommitDurationMs",
    "elapsedSecondsSinceLastSuccessfulCommit",
    "committedDataFilesCount",
    "committedDataFilesRecordCount",
    "committedDataFilesByteCount",
    "committedDeleteFilesCount",
    "committedDeleteFilesRecordCount",
    "committedDeleteFilesByteCount",
}
FLINK_MAINTENANCE = {"triggered", "succeededTasks", "failedTasks", "lastRunDurationMs"}


def test_histogram_statistics_over_a_sliding_window() -> None:
    metrics = SinkMetrics()
    assert metrics.snapshot().data_files_size_histogram.count == 0
    metrics.flushed(range(1, 101), [7])
    data = metrics.snapshot().data_files_size_histogram
    assert (data.count, data.total, data.min, data.max, data.mean) == (100, 5050, 1, 100, 50.5)
    assert [q for q, _ in data.quantiles] == list(QUANTILES)
    # Dropwizard's interpolation at q * (n + 1): the median of 1..100 is 50.5, the 99th percentile 99.99.
    assert data.quantile(0.5) == 50.5 and round(data.quantile(0.99), 2) == 99.99
    assert round(data.stddev, 4) == 29.0115
    deletes = metrics.snapshot().delete_files_size_histogram
    assert (deletes.count, deletes.min, deletes.max, deletes.quantile(0.999)) == (1, 7, 7, 7.0)
    # Count and sum cover every file; the statistics only the newest HISTOGRAM_WINDOW.
    metrics.flushed([1000] * HISTOGRAM_WINDOW, [])
    data = metrics.snapshot().data_files_size_histogram
    assert data.count == 100 + HISTOGRAM_WINDOW and data.total == 5050 + 1000 * HISTOGRAM_WINDOW
    assert data.min == data.max == 1000


def test_flink_view_names_every_metric_of_flinks_sink() -> None:
    metrics = SinkMetrics()
    metrics.add(committed_data_files=3, committed_data_files_record_count=30, compactions_triggered=2)
    metrics.add(conversion_added_dvs=4, conversion_added_position_delete_files=1)
    metrics.set(last_commit_duration_ms=12.6, last_compaction_duration_ms=99.4)
    flink = metrics.snapshot().flink()
    assert set(flink) == {
        "IcebergStreamWriter",
        "IcebergFilesCommitter",
        "maintenance",
        "deadLetterRecordsBySourceTable",
    }
    assert set(flink["IcebergStreamWriter"]) == FLINK_WRITER
    assert set(flink["IcebergFilesCommitter"]) == FLINK_COMMITTER
    assert set(flink["maintenance"]) == {"RewriteDataFiles", "ConvertEqualityDeletes"}
    rewrite = flink["maintenance"]["RewriteDataFiles"]
    assert FLINK_MAINTENANCE | {
        "addedDataFileNum",
        "addedDataFileSize",
        "removedDataFileNum",
        "removedDataFileSize",
    } == set(rewrite)
    convert = flink["maintenance"]["ConvertEqualityDeletes"]
    assert set(convert) >= FLINK_MAINTENANCE
    # v2 conversions write position delete files, v3 ones deletion vectors: both are counted.
    assert (convert["addedPositionDeleteFileNum"], convert["addedDVNum"]) == (1, 4)
    committer = flink["IcebergFilesCommitter"]
    assert committer["committedDataFilesCount"] == 3 and committer["committedDataFilesRecordCount"] == 30
    assert committer["lastCommitDurationMs"] == 13 and rewrite["triggered"] == 2 and rewrite["lastRunDurationMs"] == 99
    # Before the first commit Flink's gauge counts from the operator's start; the snake_case field stays None.
    assert metrics.snapshot().elapsed_seconds_since_last_successful_commit is None
    assert committer["elapsedSecondsSinceLastSuccessfulCommit"] == 0


def test_existing_snapshot_fields_keep_their_names() -> None:
    names = {f.name for f in attrs.fields(MetricsSnapshot)}
    assert {
        "commits",
        "committed_data_files",
        "committed_records",
        "last_commit_duration_ms",
        "compactions_triggered",
    } <= names


def test_per_table_views_count_each_table_and_the_sink() -> None:
    """Each routed table's job updates a view: the sink's counters, and the table's own. Pending
    checkpoints are each table's own count, and the sink's their sum (not the last table's)."""
    metrics = SinkMetrics()
    a, b = metrics.for_table("db.a"), metrics.for_table("db.b")
    a.add(commits=1, committed_records=5, committed_data_files=2)
    a.committed()
    b.add(deferred_commits=1)
    b.set(pending_checkpoints=3)
    a.set(pending_checkpoints=1)

    def counts(snapshot: MetricsSnapshot) -> list[TableActivity]:
        return [attrs.evolve(t, seconds_since_last_commit=0.0) for t in snapshot.tables]

    assert counts(metrics.for_table("db.a").snapshot()) == counts(metrics.snapshot())  # one shared state
    snap = metrics.snapshot()
    assert (snap.commits, snap.committed_records, snap.pending_checkpoints, snap.deferred_commits) == (1, 5, 4, 1)
    by_name = {t.table: t for t in snap.tables}
    assert list(by_name) == ["db.a", "db.b"]
    assert (by_name["db.a"].commits, by_name["db.a"].committed_records, by_name["db.a"].pending_checkpoints) == (
        1,
        5,
        1,
    )
    assert (by_name["db.b"].commits, by_name["db.b"].deferred_commits, by_name["db.b"].pending_checkpoints) == (0, 1, 3)
    assert by_name["db.a"].seconds_since_last_commit <= by_name["db.b"].seconds_since_last_commit


def test_a_tables_pending_reason_is_its_own_and_the_sinks_is_any_tables() -> None:
    """Why checkpoints are pending, per table: a table whose checkpoints landed clears its reason,
    not another table's; the sink's is the newest reason of a table still pending."""
    metrics = SinkMetrics()
    a, b = metrics.for_table("db.a"), metrics.for_table("db.b")
    assert metrics.snapshot().pending_reason is None
    a.add(deferred_commits=1, catalog_locked_commits=1)
    a.set(pending_checkpoints=1, pending_reason="locked")
    b.set(pending_checkpoints=1, pending_reason="unreachable")
    assert metrics.snapshot().pending_reason == "unreachable"
    b.set(pending_checkpoints=0, pending_reason=None)
    snap = metrics.snapshot()
    assert (snap.pending_reason, snap.catalog_locked_commits) == ("locked", 1)
    assert [(t.table, t.pending_reason, t.catalog_locked_commits) for t in snap.tables] == [
        ("db.a", "locked", 1),
        ("db.b", None, 0),
    ]
    a.set(pending_checkpoints=0, pending_reason=None)
    assert metrics.snapshot().pending_reason is None
