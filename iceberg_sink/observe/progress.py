"""One progress record per micro-batch: what it wrote and committed, as a dict and one JSON line.

The record is kept by the sink (``IcebergSink.progress()``) and logged by the ``iceberg_sink.progress``
logger at INFO (docs/metrics.md); a routed sink gives one per table of the micro-batch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from iceberg_sink.errors import one_line
from iceberg_sink.sources.envelope import read_again

logger = logging.getLogger("iceberg_sink.progress")
"""One JSON line per micro-batch."""

# Stage 1 of a batch's road (job/reading.py ``read_batch``) runs before the job starts the batch's
# record: when it began and how long it took wait here, in the reading thread's context, for the
# record to take them.
_READ: ContextVar[tuple[float, float] | None] = ContextVar("iceberg_sink_read", default=None)


def read_took(started: float) -> None:
    """The batch just read began at ``started`` (``time.monotonic()``) and ends now."""
    _READ.set((started, time.monotonic()))


def take_read() -> tuple[float, dict[str, float]]:
    """When the batch about to be processed began (its read's start; else now), and the ``phases_ms``
    its record starts with (``{"read": ms}``; else none): of the last :func:`read_took` in this
    context, taken once."""
    read = _READ.get()
    _READ.set(None)
    if read is None:
        return time.monotonic(), {}
    started, ended = read
    return started, {"read": round((ended - started) * 1000, 1)}


def status_of(outcome: Any, error: BaseException | None) -> str:
    """failed, empty (no rows), pending (outage), committing (its commit runs on the commit lane,
    job/lane.py: a later record's ``committed_pending`` names it once it landed), committed, or
    skipped (already in the table, or only deletes of keys that do not exist)."""
    if error is not None:
        return "failed"
    if outcome is None:
        return "empty"
    if outcome.pending:
        return "pending"
    if outcome.in_flight:
        return "committing"
    return "committed" if outcome.snapshot is not None else "skipped"


def road(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of :func:`record` a batch's road (job/road.py) wrote in ``batch``, its progress
    record: each stage's milliseconds, and how the batch was written."""
    return {
        "phases_ms": batch.get("phases_ms"),
        "interpreted": batch.get("interpreted"),
        "reduced_in_writers": batch.get("reduced_in_writers"),
        "keys_crossed": batch.get("keys_crossed", False),
    }


def record(
    *,
    table: str,
    branch: str,
    job_id: str,
    checkpoint_id: int,
    outcome: Any,
    error: BaseException | None,
    duration_ms: float,
    summary: Any,
    write_ms: float | None,
    committed: list[dict[str, Any]],
    dead_letter_records: int = 0,
    phases_ms: dict[str, float] | None = None,
    interpreted: bool | None = None,
    reduced_in_writers: bool | None = None,
    keys_crossed: bool = False,
) -> dict[str, Any]:
    """The progress record of micro-batch ``checkpoint_id``; ``committed``: the commits it made
    (its own and pending ones of earlier checkpoints), ``summary``: its CommitSummary or None;
    ``phases_ms``: the wall milliseconds of each stage the batch went through (job/road.py);
    ``interpreted``: whether its write job ran without Spark's code generation (job/codegen.py;
    None: nothing was written); ``reduced_in_writers``: whether its changes were reduced in its writer
    tasks (job/reduction.py; None: nothing was written); ``keys_crossed``: a write reduced in its
    writer tasks found a key's changes in two of them and was written again, reduced in Spark."""
    own = next((c for c in committed if c["checkpoint_id"] == checkpoint_id), None)
    return {
        "table": table,
        "branch": branch,
        "job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "status": status_of(outcome, error),
        "snapshot_id": own["snapshot_id"] if own else None,
        "rows": summary.records if summary else 0,
        "data_files": summary.data_files if summary else 0,
        "delete_files": summary.delete_files if summary else 0,
        "bytes": summary.bytes if summary else 0,
        "equality_deletes": summary.equality_deletes if summary else 0,
        "position_deletes": summary.position_deletes if summary else 0,
        "write_ms": write_ms,
        "commit_ms": own["commit_ms"] if own else None,
        "checkpoint_ms": round(duration_ms, 1),
        "committed_pending": [c["checkpoint_id"] for c in committed if c["checkpoint_id"] != checkpoint_id],
        "dead_letter_records": dead_letter_records,
        "phases_ms": dict(phases_ms or {}),
        "interpreted": interpreted,
        "reduced_in_writers": reduced_in_writers,
        "keys_crossed": keys_crossed,
        "error": one_line(error) if error is not None else None,
    }


def report(metrics: Any, **fields: Any) -> None:
    """Build the record (:func:`record`'s arguments), keep it in ``metrics`` and log it. Reporting
    never changes what happened to the checkpoint: a failure here is logged, not raised. An attempt
    that failed on STALE_COUNTS or READ_BY_SPARK reports nothing: the batch is read again at once, and that attempt
    reports it (job/reading.py ``read_again_if_stale``)."""
    if read_again(fields.get("error")) is not None:
        return
    try:
        progress = record(**fields)
        metrics.record_progress(progress)
        logger.info("%s", json.dumps(progress, sort_keys=True))
    except Exception:
        logging.getLogger("iceberg_sink").exception(
            "progress record of checkpoint %s could not be written", fields.get("checkpoint_id")
        )
