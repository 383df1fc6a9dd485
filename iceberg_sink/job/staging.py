"""Stage 6 of a micro-batch's road (road.py): aggregate each table's written files into its
committable and persist it (committer/aggregator.py, committer/store.py), every table's before any
table is committed, so a crash between two tables' commits leaves the other's stored, not lost.
"""

from __future__ import annotations

from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.writer.result import Written


def stage(batch: BatchPlan, written: Written) -> None:
    """Persist the committable of every table ``batch`` wrote (the dead-letter table's last)."""
    to_write = batch.to_write()
    if batch.metrics is not None:
        batch.metrics.set(writer_peak_open_files=max(written.peaks, default=0))
    for table in to_write:
        batch.jobs[table].flushed(written.tables.get(table, []), written.write_ms)
    for table in sorted(to_write):
        batch.jobs[table].stage(to_write[table], written.tables.get(table, []))
    if batch.dead is not None and batch.dead_plan is not None and batch.dead_to_write:
        batch.dead.staged(batch.dead_plan, written, batch.progress)
