"""Stage 5 of a micro-batch's road (road.py): one Spark job writes every table of the batch.

One table: its writer tasks (writer/spark.py), or Spark's own Parquet writer for appends it provably
writes the same (writer/jvm.py). A routed batch: each task writes the tables of its rows
(writer/multi.py). With a dead-letter table each task also splits refused rows off to the
dead-letter table's writer (dead_letter.py). A failed write is reported by kind (a refused row, a
full disk, a lost executor), naming the checkpoint and the table or route.
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame

from iceberg_sink import _faults, options
from iceberg_sink._iceberg.files import delete_quietly
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.job.plan import BatchPlan, CheckpointPlan
from iceberg_sink.writer import arrow_batches, jvm
from iceberg_sink.writer.multi import UNPLANNED_COLUMN, UNPLANNED_TABLE
from iceberg_sink.writer.result import Written
from iceberg_sink.writer.spark import write_dataframe, write_error, write_reducing_dataframe, write_routed_dataframe
from iceberg_sink.writer.split import write_split


def write(df: DataFrame, batch: BatchPlan) -> Written:
    """Write ``df`` (distributed) for every table of ``batch`` that needs it, in one Spark job."""
    checkpoint_id = batch.checkpoint_id
    _faults.hit(_faults.BEFORE_WRITE, checkpoint_id)
    started = time.monotonic()
    try:
        # Spark's per-row check of an Arrow batch's bytes, skipped when this job's last write says
        # its rows cannot reach the bound (writer/arrow_batches.py).
        with arrow_batches.bounded_by_rows(df.sparkSession, batch.job_id):
            written = _write(df, batch, batch.to_write())
    except Exception as e:
        raise failure(e, checkpoint_id, batch.describe, routed=batch.route_column is not None) from e
    arrow_batches.observe(batch.job_id, (r.arrow_row_bytes for r in written.results()))
    _faults.hit(_faults.AFTER_WRITE, checkpoint_id)
    written.write_ms = (time.monotonic() - started) * 1000  # one Spark job for every table
    return written


def _write(df: DataFrame, batch: BatchPlan, to_write: dict[str, CheckpointPlan]) -> Written:
    specs = {t: p.spec for t, p in to_write.items() if p.spec is not None}
    first = next(iter(to_write.values()), batch.dead_plan)
    assert first is not None
    max_open_files = first.resolved.get(options.WRITER_MAX_OPEN_FILES)
    buffer_bytes = first.resolved.get(options.WRITER_BUFFER_BYTES)
    if batch.dead is not None:
        assert batch.dead_plan is not None
        if batch.route_column is not None:
            only = frozenset(to_write) if len(to_write) != len(batch.plans) else None
            task = batch.dead.task(batch.dead_plan, batch.job_id, route_column=batch.route_column, tables=only)
        else:
            task = batch.dead.task(batch.dead_plan, batch.job_id, source_table=next(iter(batch.jobs)))
        return write_split(df, specs, task, max_open_files=max_open_files, buffer_bytes=buffer_bytes)
    if batch.route_column is not None:
        peaks: list[int] = []
        tables = write_routed_dataframe(
            df, specs, batch.route_column, max_open_files, buffer_bytes, peak_open_files=peaks
        )
        return Written(tables=tables, peaks=peaks)
    ((table, plan),) = to_write.items()
    assert plan.spec is not None
    if batch.reduced_in_writers:
        reduced, crossed = write_reducing_dataframe(df, plan.spec)
        return Written(tables={table: reduced}, keys_crossed=crossed)
    results = jvm.write_appends(df, plan.spec, plan.mode) if batch.jvm_appends(df) else None
    if results is None:
        results = write_dataframe(df, plan.spec)
    return Written(tables={table: results})


def discard(written: Written, batch: BatchPlan) -> None:
    """Delete the files of ``written``, a write whose results are not the batch's (best effort: a file
    left is an orphan no snapshot names, for the remove-orphans maintenance)."""
    for table, results in written.tables.items():
        files = [f for r in results for f in (*r.data_files, *r.delete_files, *r.conditional_delete_files)]
        delete_quietly(batch.plans[table].table.io, [f.path for f in files])


def failure(error: Exception, checkpoint_id: int, describe: str, routed: bool = False) -> Exception:
    """The error to raise for a failed write of ``checkpoint_id`` (``error`` itself if not a known
    kind); ``describe``: the table (``table db.t``) or the route; ``routed``: the route's own
    refusals (a row naming a table or column the write did not plan) are named as such."""
    if routed:
        text = str(error)
        for marker in (UNPLANNED_TABLE, UNPLANNED_COLUMN, "the route function returned"):
            if marker in text:
                detail = text[text.index(marker) :].splitlines()[0].strip()
                return InvalidInputError(f"checkpoint {checkpoint_id} of {describe} was not written: {detail}")
    return write_error(error, checkpoint_id, describe)
