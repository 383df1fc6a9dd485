"""When to convert equality deletes after commits, and where the conversion runs.

The trigger reads the committed snapshot's summary (commit count since the last conversion, live
equality-delete rows, live delete files): checking it costs nothing. At most one conversion runs
per table and branch at a time in this process; a trigger that fires while one runs waits for the
next commit. In the background (the default) the conversion runs on a driver thread and the
stream's commits go on: they never wait for it, and the conversion's commit validates against
whatever they committed meanwhile (topology/conversion/job.py). Failures are logged and counted in
the sink's metrics; they never fail the stream.
"""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.table import Table

from iceberg_sink.keyindex.index import DEFAULT_MAX_BYTES, KeyIndex
from iceberg_sink.keyindex.partitioned import DEFAULT_PARTITION_MAX_ENTRIES
from iceberg_sink.keyindex.runner import Runner
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.topology.background import BackgroundJob
from iceberg_sink.topology.conversion.config import ConversionConfig
from iceberg_sink.topology.conversion.job import ConversionResult, convert_equality_deletes
from iceberg_sink.topology.hooks import CommitResult


def _summary_int(result: CommitResult, key: str) -> int:
    try:
        return int(result.snapshot_summary.get(key, "0"))
    except ValueError:
        return 0


class ConversionTrigger(BackgroundJob):
    """Post-commit step: starts an equality-delete conversion when a threshold is met."""

    def __init__(
        self,
        config: ConversionConfig,
        table_key: str,
        branch: str,
        load_table: Callable[[], Table],
        metrics: SinkMetrics,
        key_index_max_bytes: int = DEFAULT_MAX_BYTES,
        key_index_persist: bool = False,
        key_index_partitions: int = 0,
        key_index_runner: Runner | None = None,
        key_index_partition_max_entries: int = DEFAULT_PARTITION_MAX_ENTRIES,
    ) -> None:
        super().__init__(table_key, config.background)
        self._config = config
        self._branch = branch
        self._load_table = load_table
        self._metrics = metrics
        self._commits = 0
        self._loaded = 0  # key index entries loaded from table storage, as last counted
        self.last_result: ConversionResult | None = None
        # Data files never change: their keys are looked up in memory by the next conversions (and
        # in table storage by the next driver, when persisting).
        self.index = KeyIndex(
            key_index_max_bytes,
            key_index_persist,
            partitions=key_index_partitions,
            runner=key_index_runner,
            partition_max_entries=key_index_partition_max_entries,
        )

    def should_run(self, result: CommitResult) -> bool:
        c = self._config
        return (
            (c.every_n_commits is not None and self._commits >= c.every_n_commits)
            or (
                c.equality_delete_records is not None
                and _summary_int(result, "total-equality-deletes") > c.equality_delete_records
            )
            or (c.delete_files is not None and _summary_int(result, "total-delete-files") > c.delete_files)
        )

    def observe(self, result: CommitResult) -> None:
        """Record one commit; start a conversion if a trigger fires."""
        self._commits += 1
        if _summary_int(result, "total-equality-deletes") == 0:
            return  # nothing to convert (a table without deletes never triggers)
        if self.should_run(result):
            self.run()

    kind = "equality-delete conversion"

    def on_start(self) -> None:
        self._metrics.add(conversions_triggered=1)
        self._commits = 0

    def execute(self) -> ConversionResult:
        return convert_equality_deletes(
            self._load_table, self._branch, max_replans=self._config.max_replans, index=self.index
        )

    def on_failure(self, error: Exception) -> None:
        self._metrics.add(conversions_failed=1)
        self._metrics.set(last_conversion_error=f"{type(error).__name__}: {error}")

    def on_success(self, result: ConversionResult) -> None:
        self._metrics.add(
            conversions_succeeded=1,
            conversion_removed_equality_delete_files=result.removed_equality_delete_files,
            conversion_added_position_delete_files=result.added_position_delete_files,
            conversion_added_dvs=result.added_dvs,
            conversion_data_files_read=result.data_files_read,
            conversion_duration_ms=result.duration_ms,
        )
        loaded = self.index.persisted.loaded
        self._metrics.add(key_index_entries_loaded=loaded - self._loaded)
        self._loaded = loaded
        self._metrics.set(last_conversion_duration_ms=result.duration_ms, conversion_key_index_bytes=self.index.nbytes)
