"""Counters a sink keeps about its commits, hooks and compactions (like Flink's committer metrics)."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs


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
    last_conversion_duration_ms: float
    last_conversion_error: str | None
    conversion_data_files_read: int
    conversion_duration_ms: float
    conversion_key_index_bytes: int
    # Checkpoints written but not committed because the catalog was unreachable (now), and how many
    # commits were deferred that way (ever).
    pending_checkpoints: int = 0
    deferred_commits: int = 0


class SinkMetrics:
    """Thread-safe counters shared by every job of one sink (streams may run concurrently)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {f.name: 0 for f in attrs.fields(MetricsSnapshot)}
        self._values["elapsed_seconds_since_last_successful_commit"] = None
        self._values["last_conversion_error"] = None
        self._last_success: float | None = None

    def add(self, **increments: float) -> None:
        with self._lock:
            for key, value in increments.items():
                self._values[key] += value

    def set(self, **values: float | str | None) -> None:
        with self._lock:
            self._values.update(values)

    def committed(self) -> None:
        with self._lock:
            self._last_success = time.monotonic()

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            values = dict(self._values)
            if self._last_success is not None:
                values["elapsed_seconds_since_last_successful_commit"] = time.monotonic() - self._last_success
        return MetricsSnapshot(**values)
