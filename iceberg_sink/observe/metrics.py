"""Counters a sink keeps about its writers, commits, hooks and maintenance runs.

:class:`SinkMetrics` is shared by every job of one sink and updated on the driver: writer metrics
come from the ``WriteResult`` values the stateless writer tasks return, committer metrics from each
commit, maintenance metrics from compaction and equality-delete conversion runs.
:meth:`MetricsSnapshot.flink` names them as Flink's Iceberg sink does (``IcebergStreamWriterMetrics``,
``IcebergFilesCommitterMetrics``, ``TableMaintenanceMetrics``); docs/metrics.md lists every one.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from iceberg_sink.writer.result import WriteResult

HISTOGRAM_WINDOW = 1024
"""Sizes kept for the histograms' statistics (Flink's writer keeps a sliding window of 1,024)."""
QUANTILES = (0.5, 0.75, 0.95, 0.98, 0.99, 0.999)
"""The quantiles a histogram reports (those Flink's Prometheus reporter exports)."""


@attrs.frozen
class HistogramStatistics:
    """Statistics of a file size histogram, like a Flink ``Histogram``.

    ``count`` and ``total`` cover every file since the sink was built; ``min``, ``max``, ``mean``,
    ``stddev`` and ``quantiles`` cover the newest :data:`HISTOGRAM_WINDOW` files (0 when none).
    """

    count: int = 0
    total: int = 0
    min: int = 0
    max: int = 0
    mean: float = 0.0
    stddev: float = 0.0
    quantiles: tuple[tuple[float, float], ...] = ()

    def quantile(self, q: float) -> float:
        return dict(self.quantiles).get(q, 0.0)


class _Histogram:
    """All-time count and sum, and a sliding window of the newest values (not thread-safe)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.window: collections.deque[int] = collections.deque(maxlen=HISTOGRAM_WINDOW)

    def update(self, values: Iterable[int]) -> None:
        for v in values:
            self.count += 1
            self.total += v
            self.window.append(v)

    def statistics(self) -> HistogramStatistics:
        values = sorted(self.window)
        if not values:
            return HistogramStatistics(count=self.count, total=self.total)
        mean = sum(values) / len(values)
        variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0

        def quantile(q: float) -> float:
            # Dropwizard's UniformSnapshot.getValue: linear interpolation at q * (n + 1).
            pos = q * (len(values) + 1)
            if pos < 1:
                return float(values[0])
            if pos >= len(values):
                return float(values[-1])
            lower = values[int(pos) - 1]
            upper = values[int(pos)]
            return lower + (pos - math.floor(pos)) * (upper - lower)

        return HistogramStatistics(
            count=self.count,
            total=self.total,
            min=values[0],
            max=values[-1],
            mean=mean,
            stddev=math.sqrt(variance),
            quantiles=tuple((q, quantile(q)) for q in QUANTILES),
        )


@attrs.frozen
class MetricsSnapshot:
    """A point-in-time copy of a sink's counters."""

    commits: int
    skipped_commits: int
    commit_conflict_retries: int
    committed_data_files: int
    committed_delete_files: int
    committed_records: int
    committed_bytes: int
    last_commit_duration_ms: float
    last_checkpoint_duration_ms: float
    elapsed_seconds_since_last_successful_commit: float | None
    post_commit_hook_failures: int
    vetoed_commits: int
    compactions_triggered: int
    compactions_succeeded: int
    compactions_failed: int
    compactions_noop: int
    compaction_dropped_groups: int
    compaction_replans: int
    compaction_rewritten_files: int
    compaction_added_files: int
    compaction_removed_delete_files: int
    last_compaction_duration_ms: float
    conversions_triggered: int
    conversions_succeeded: int
    conversions_failed: int
    conversion_removed_equality_delete_files: int
    conversion_added_position_delete_files: int
    conversion_added_dvs: int
    last_conversion_duration_ms: float
    last_conversion_error: str | None
    conversion_data_files_read: int
    conversion_duration_ms: float
    conversion_key_index_bytes: int
    # Checkpoints written but not committed because the catalog was unreachable (now), and how many
    # commits were deferred that way (ever).
    pending_checkpoints: int = 0
    deferred_commits: int = 0
    # Why checkpoints are pending now: the cause and the last error of the newest deferral (None
    # when none is pending); and the deferred commits whose SQLite catalog file another process
    # held locked (errors.SQLITE_CATALOG_LOCKED), of all deferred_commits.
    pending_reason: str | None = None
    catalog_locked_commits: int = 0
    # Streams: commits handed to the commit lane, to run beside the next micro-batch (job/lane.py).
    overlapped_commits: int = 0
    # Writers (from the WriteResults of each checkpoint's tasks, aggregated on the driver).
    flushed_data_files: int = 0
    flushed_delete_files: int = 0
    flushed_records: int = 0
    last_flush_duration_ms: float = 0.0
    # Routed sinks: the most Parquet files one writer task of the last written checkpoint held open at
    # once, over all its tables (bounded by iceberg-sink.writer.max-open-files).
    writer_peak_open_files: int = 0
    # Format v3 upserts: data files whose key columns the committer read to resolve deletes to DVs,
    # and key index entries it (or the conversion) loaded from table storage instead.
    key_index_data_files_read: int = 0
    key_index_entries_loaded: int = 0
    data_files_size_histogram: HistogramStatistics = HistogramStatistics()
    delete_files_size_histogram: HistogramStatistics = HistogramStatistics()
    # Committed files, split as Flink's CommitSummary does (committed_records/bytes above are the
    # data records and the data + delete bytes).
    committed_data_files_record_count: int = 0
    committed_data_files_byte_count: int = 0
    committed_delete_files_record_count: int = 0
    committed_delete_files_byte_count: int = 0
    compaction_rewritten_bytes: int = 0
    compaction_added_bytes: int = 0
    # Seconds since the sink was built: Flink's elapsedSecondsSinceLastSuccessfulCommit counts from
    # the operator's start until the first commit.
    uptime_seconds: float = 0.0
    # Per table (each routed table, or a single sink's one), by name: see TableActivity.
    tables: tuple[TableActivity, ...] = ()
    # Rows refused and written to the dead-letter table (.dead_letter), in total and per source
    # table (the table each row was meant for), sorted by table name.
    dead_letter_records: int = 0
    dead_letter_records_by_table: tuple[tuple[str, int], ...] = ()

    def flink(self) -> dict[str, Any]:
        """These metrics under the names of Flink's Iceberg sink, grouped as Flink groups them.

        Returns ``{"IcebergStreamWriter": {...}, "IcebergFilesCommitter": {...}, "maintenance":
        {"RewriteDataFiles": {...}, "ConvertEqualityDeletes": {...}}, "deadLetterRecordsBySourceTable":
        {table: count}}`` (``IcebergStreamWriter.deadLetterRecords`` is this sink's own); histograms are
        :class:`HistogramStatistics`, durations whole milliseconds, counts ints.
        """
        elapsed = self.elapsed_seconds_since_last_successful_commit
        return {
            "IcebergStreamWriter": {
                "flushedDataFiles": self.flushed_data_files,
                "flushedDeleteFiles": self.flushed_delete_files,
                "lastFlushDurationMs": round(self.last_flush_duration_ms),
                "dataFilesSizeHistogram": self.data_files_size_histogram,
                "deleteFilesSizeHistogram": self.delete_files_size_histogram,
                "deadLetterRecords": self.dead_letter_records,
            },
            "deadLetterRecordsBySourceTable": dict(self.dead_letter_records_by_table),
            "IcebergFilesCommitter": {
                "lastCheckpointDurationMs": round(self.last_checkpoint_duration_ms),
                "lastCommitDurationMs": round(self.last_commit_duration_ms),
                "elapsedSecondsSinceLastSuccessfulCommit": int(elapsed if elapsed is not None else self.uptime_seconds),
                "committedDataFilesCount": self.committed_data_files,
                "committedDataFilesRecordCount": self.committed_data_files_record_count,
                "committedDataFilesByteCount": self.committed_data_files_byte_count,
                "committedDeleteFilesCount": self.committed_delete_files,
                "committedDeleteFilesRecordCount": self.committed_delete_files_record_count,
                "committedDeleteFilesByteCount": self.committed_delete_files_byte_count,
            },
            "maintenance": {
                "RewriteDataFiles": {
                    "triggered": self.compactions_triggered,
                    "succeededTasks": self.compactions_succeeded,
                    "failedTasks": self.compactions_failed,
                    "lastRunDurationMs": round(self.last_compaction_duration_ms),
                    "addedDataFileNum": self.compaction_added_files,
                    "addedDataFileSize": self.compaction_added_bytes,
                    "removedDataFileNum": self.compaction_rewritten_files,
                    "removedDataFileSize": self.compaction_rewritten_bytes,
                },
                "ConvertEqualityDeletes": {
                    "triggered": self.conversions_triggered,
                    "succeededTasks": self.conversions_succeeded,
                    "failedTasks": self.conversions_failed,
                    "lastRunDurationMs": round(self.last_conversion_duration_ms),
                    "removedEqDeleteNum": self.conversion_removed_equality_delete_files,
                    "addedPositionDeleteFileNum": self.conversion_added_position_delete_files,
                    "addedDVNum": self.conversion_added_dvs,
                },
            },
        }


@attrs.frozen
class TableActivity:
    """One table's commits by this sink: each routed table's, or a single-table sink's one table.

    Attributes:
        seconds_since_last_commit: since the table's last successful commit, or since the sink first
            wrote to it when it has none yet (as Flink's elapsedSecondsSinceLastSuccessfulCommit
            counts from the start): a stuck table's keeps growing while the others' stay low.
        pending_reason: why the table's checkpoints are pending (None when none is).
        catalog_locked_commits: its deferred commits whose SQLite catalog file another process held locked.
    """

    table: str
    commits: int = 0
    committed_records: int = 0
    committed_data_files: int = 0
    committed_delete_files: int = 0
    pending_checkpoints: int = 0
    deferred_commits: int = 0
    seconds_since_last_commit: float = 0.0
    pending_reason: str | None = None
    catalog_locked_commits: int = 0


# The sink-wide counters that are also kept per table, and what each table's view adds them to.
_TABLE_COUNTERS = frozenset(
    {
        "commits",
        "committed_records",
        "committed_data_files",
        "committed_delete_files",
        "deferred_commits",
        "catalog_locked_commits",
    }
)


class _TableCounters:
    def __init__(self, now: float) -> None:
        self.counts = dict.fromkeys(_TABLE_COUNTERS, 0)
        self.pending = 0
        self.reason: str | None = None  # why its checkpoints are pending (None: none are)
        self.since = now  # the last successful commit, else when the sink first wrote to the table


class _Shared:
    """The state every view of one sink's metrics shares (one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, Any] = {
            f.name: 0 for f in attrs.fields(MetricsSnapshot) if f.name not in ("tables", "dead_letter_records_by_table")
        }
        self.values["elapsed_seconds_since_last_successful_commit"] = None
        self.values["last_conversion_error"] = None
        self.values["pending_reason"] = None
        self.last_success: float | None = None
        self.created = time.monotonic()
        self.data_sizes = _Histogram()
        self.delete_sizes = _Histogram()
        self.progress: collections.deque[dict[str, Any]] = collections.deque(maxlen=100)
        self.tables: dict[str, _TableCounters] = {}
        self.dead_letters: collections.Counter[str] = collections.Counter()


class SinkMetrics:
    """Thread-safe counters shared by every job of one sink (streams may run concurrently).

    :meth:`for_table` gives the view one table's job updates: the same counters, and that table's
    own (:class:`TableActivity`), so a routed sink's stuck table is visible among its many.
    """

    def __init__(self) -> None:
        self._shared = _Shared()
        self._table: _TableCounters | None = None

    def for_table(self, table: str) -> SinkMetrics:
        """The view of these metrics that the job of ``table`` updates (same counters, plus the table's)."""
        view = SinkMetrics.__new__(SinkMetrics)
        view._shared = self._shared
        with self._shared.lock:
            view._table = self._shared.tables.setdefault(table, _TableCounters(time.monotonic()))
        return view

    def flushed(self, data_sizes: Iterable[int], delete_sizes: Iterable[int]) -> None:
        """Record the sizes of the files one checkpoint's writers wrote."""
        with self._shared.lock:
            self._shared.data_sizes.update(data_sizes)
            self._shared.delete_sizes.update(delete_sizes)

    def written(self, results: Iterable[WriteResult], duration_ms: float) -> float:
        """Record what one checkpoint's writer tasks wrote, from their results (the writers keep no
        state); returns the write time in milliseconds, rounded, for the progress record."""
        results = list(results)
        data = [f for r in results for f in r.data_files]
        deletes = [f for r in results for f in (*r.delete_files, *r.conditional_delete_files)]
        self.add(
            flushed_data_files=len(data),
            flushed_delete_files=len(deletes),
            flushed_records=sum(f.record_count for f in data),
        )
        self.set(last_flush_duration_ms=duration_ms)
        self.flushed((f.file_size_in_bytes for f in data), (f.file_size_in_bytes for f in deletes))
        return round(duration_ms, 1)

    def dead_lettered(self, by_table: Mapping[str, int]) -> None:
        """Count the rows of one checkpoint written to the dead-letter table, per source table."""
        with self._shared.lock:
            self._shared.dead_letters.update(by_table)
            self._shared.values["dead_letter_records"] += sum(by_table.values())

    def record_progress(self, progress: dict[str, Any]) -> None:
        """Keep the progress record of one micro-batch (the newest 100 are kept)."""
        with self._shared.lock:
            self._shared.progress.append(progress)

    def progress(self) -> list[dict[str, Any]]:
        """The newest progress records, oldest first."""
        with self._shared.lock:
            return [dict(p) for p in self._shared.progress]

    def add(self, **increments: float) -> None:
        with self._shared.lock:
            for key, value in increments.items():
                self._shared.values[key] += value
                if self._table is not None and key in _TABLE_COUNTERS:
                    self._table.counts[key] += int(value)

    def set(self, **values: float | str | None) -> None:
        with self._shared.lock:
            if self._table is not None and "pending_checkpoints" in values:
                # Each table's job knows its own pending checkpoints; the sink's are their sum.
                self._table.pending = int(values["pending_checkpoints"] or 0)
                values["pending_checkpoints"] = sum(t.pending for t in self._shared.tables.values())
            if self._table is not None and "pending_reason" in values:
                # A table whose checkpoints landed clears its own reason, not another table's.
                reason = values["pending_reason"]
                self._table.reason = None if reason is None else str(reason)
                others = (t.reason for t in self._shared.tables.values() if t.reason is not None)
                values["pending_reason"] = reason if reason is not None else next(others, None)
            self._shared.values.update(values)

    def committed(self) -> None:
        with self._shared.lock:
            now = time.monotonic()
            self._shared.last_success = now
            if self._table is not None:
                self._table.since = now

    def snapshot(self) -> MetricsSnapshot:
        shared = self._shared
        with shared.lock:
            values = dict(shared.values)
            now = time.monotonic()
            if shared.last_success is not None:
                values["elapsed_seconds_since_last_successful_commit"] = now - shared.last_success
            values["uptime_seconds"] = now - shared.created
            values["data_files_size_histogram"] = shared.data_sizes.statistics()
            values["delete_files_size_histogram"] = shared.delete_sizes.statistics()
            values["dead_letter_records_by_table"] = tuple(sorted(shared.dead_letters.items()))
            values["tables"] = tuple(
                TableActivity(
                    table=name,
                    commits=t.counts["commits"],
                    committed_records=t.counts["committed_records"],
                    committed_data_files=t.counts["committed_data_files"],
                    committed_delete_files=t.counts["committed_delete_files"],
                    pending_checkpoints=t.pending,
                    deferred_commits=t.counts["deferred_commits"],
                    seconds_since_last_commit=now - t.since,
                    pending_reason=t.reason,
                    catalog_locked_commits=t.counts["catalog_locked_commits"],
                )
                for name, t in sorted(shared.tables.items())
            )
        return MetricsSnapshot(**values)
