"""When to compact after commits, and where the compaction runs (inline or in the background).

The trigger counts commits, small data files per partition and small-file bytes since the last
compaction, and the time since it, and reads the live delete files and rows of the branch from
the committed snapshot's summary. At most one compaction runs per table at a time in this process:
a trigger that fires while one runs waits for the next commit.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping

from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.topology.background import BackgroundJob
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.compaction.job import CompactionResult, compact
from iceberg_sink.topology.hooks import CommitResult
from iceberg_sink.vocab.files import DataFileMeta


def _deletes_of(summary: Mapping[str, str]) -> tuple[int, int]:
    """(live delete files, live delete rows) of a snapshot summary; 0 where it does not say."""

    def number(key: str) -> int:
        try:
            return int(summary.get(key, "0"))
        except ValueError:
            return 0

    return number("total-delete-files"), number("total-equality-deletes") + number("total-position-deletes")


class CompactionTrigger(BackgroundJob):
    """Post-commit step: counts what commits add and starts a compaction when a threshold is met."""

    def __init__(
        self,
        config: CompactionConfig,
        table_key: str,
        branch: str,
        load_table: Callable[[], Table],
        small_file_bytes: int,
        metrics: SinkMetrics,
        spark: Callable[[], SparkSession],
    ) -> None:
        super().__init__(table_key, config.background)
        self._config = config
        self._branch = branch
        self._load_table = load_table
        self._small = small_file_bytes
        self._metrics = metrics
        self._spark = spark
        self._reset()
        self.last_result: CompactionResult | None = None

    def _reset(self) -> None:
        self._commits = 0
        self._small_by_partition: dict[tuple[int, tuple[object, ...]], int] = defaultdict(int)
        self._small_bytes = 0
        self._since = time.monotonic()
        self._deletes = (0, 0)  # live delete files, live delete rows of the last commit

    def observe(self, result: CommitResult, data_files: tuple[DataFileMeta, ...]) -> None:
        """Record one commit; compact if a trigger fires."""
        self._commits += 1
        self._deletes = _deletes_of(result.snapshot_summary)
        for f in data_files:
            if f.file_size_in_bytes < self._small:
                self._small_by_partition[(f.spec_id, f.partition)] += 1
                self._small_bytes += f.file_size_in_bytes
        if self.should_run():
            self.run()

    def should_run(self) -> bool:
        c = self._config
        return (
            (c.every_n_commits is not None and self._commits >= c.every_n_commits)
            or (
                c.small_files_per_partition is not None
                and any(n > c.small_files_per_partition for n in self._small_by_partition.values())
            )
            or (c.small_files_bytes is not None and self._small_bytes > c.small_files_bytes)
            or (c.every_seconds is not None and time.monotonic() - self._since >= c.every_seconds)
            or (c.delete_files is not None and self._deletes[0] > c.delete_files)
            or (c.delete_records is not None and self._deletes[1] > c.delete_records)
        )

    kind = "compaction"

    def on_start(self) -> None:
        self._metrics.add(compactions_triggered=1)
        self._reset()

    def execute(self) -> CompactionResult:
        return compact(self._spark(), self._load_table, self._config, branch=self._branch)

    def on_failure(self, error: Exception) -> None:
        self._metrics.add(compactions_failed=1)

    def on_success(self, result: CompactionResult) -> None:
        # A compaction whose every planned group was dropped on conflict rewrote nothing: it did not
        # succeed (compact() logs it).
        self._metrics.add(
            compactions_noop=int(result.noop),
            compactions_succeeded=int(not result.noop),
            compaction_dropped_groups=result.dropped_groups,
            compaction_replans=result.replans,
            compaction_rewritten_files=result.rewritten_data_files,
            compaction_added_files=result.added_data_files,
            compaction_removed_delete_files=result.removed_delete_files,
            compaction_rewritten_bytes=result.rewritten_bytes,
            compaction_added_bytes=result.added_bytes,
        )
        self._metrics.set(last_compaction_duration_ms=result.duration_ms)
