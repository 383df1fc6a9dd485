"""SinkMetrics: file size histograms and the Flink-named view."""

from __future__ import annotations

import attrs

from iceberg_sink.observe.metrics import HISTOGRAM_WINDOW, QUANTILES, MetricsSnapshot, SinkMetrics

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
    assert set(flink["maintenance"]["ConvertEqualityDeletes"]) >= FLINK_MAINTENANCE
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
