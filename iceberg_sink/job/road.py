"""The road of one micro-batch: every sink, single-table or routed, with or without a dead-letter
table, takes it, stage by stage, each stage one module that takes the batch and gives the next.

    1. read and conform    reading.py       map_batches, collated strings, a routed row's table
    2. plan                pipeline.py      each table created or checked, its older checkpoints
                           routing.py       committed, a replayed or stored checkpoint found (BatchPlan)
    3. refuse              refusal.py       rows already stored dropped; required nulls refused
    4. reduce changes      reduction.py     one row per changed key, TOASTed values filled in
    5. enforce             refusal.py       refused rows fail the batch, or stay for the dead-letter split
    6. distribute          distributing.py  rows to writer tasks (none / hash / range)
    7. write               writing.py       one Spark job: data and delete files, refused rows split off
    8. aggregate           staging.py       each table's committable persisted, before any commit
    9. commit              committing.py    one snapshot per table (job/pending.py: now, or pending)
   10. post-commit         job/pending.py   hooks, compaction, equality-delete conversion, per commit

A single-table sink and a routed one differ only in their arguments: the plan's tables (one, or
those the rows name in the route column) and the dead-letter table (or none). The caller reads the
batch (stage 1) when it hands it over, since a bounded write plans its checkpoint id from the read
batch; stage 2 is the job's own (:meth:`SinkJob.plan` / :meth:`RoutedJob.plan`). A batch whose
checkpoint every table holds or has stored is not written again (stages 3-8 are skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from pyspark.sql import DataFrame

from iceberg_sink.job import codegen, committing, distributing, reduction, refusal, staging, writing
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.job.together import Committed

_T = TypeVar("_T")


def run(df: DataFrame, batch: BatchPlan) -> list[Committed]:
    """Stages 3 to 10 of the road for ``df``, planned as ``batch``: each table's commit outcome or error.

    Each stage's wall time goes to ``batch.progress["phases_ms"]`` (the progress record's
    ``phases_ms``, docs/metrics.md): ``build`` (stages 3-6 build the Spark plan; nothing runs),
    ``write`` (the Spark job), ``stage`` and ``commit`` (post-commit work included). A batch small
    enough was read and is built and written without Spark's code generation and adaptive plans
    (codegen.py, from job/reading.py ``read_again_if_stale``); its committable is staged and
    committed with the session's own settings."""
    progress = batch.progress
    written = None
    if batch.to_write() or batch.dead_to_write:
        progress["interpreted"] = codegen.active()
        built = timed(progress, "build", lambda: _build(df, batch))
        progress["reduced_in_writers"] = batch.reduced_in_writers
        written = timed(progress, "write", lambda: writing.write(built, batch))
        if written.keys_crossed:
            # A key's changes were in two writer tasks (the input is not partitioned by the key): its
            # files go, and this batch and the job's later ones are reduced in Spark.
            writing.discard(written, batch)
            reduction.keys_crossed(batch.job_id)
            progress["keys_crossed"] = True
            rebuilt = timed(progress, "build", lambda: _build(df, batch))
            progress["reduced_in_writers"] = batch.reduced_in_writers
            written = timed(progress, "write", lambda: writing.write(rebuilt, batch))
    with codegen.as_configured():
        if written is not None:
            timed(progress, "stage", lambda: staging.stage(batch, written))
        return timed(progress, "commit", lambda: committing.commit(batch))


def _build(df: DataFrame, batch: BatchPlan) -> DataFrame:
    df = refusal.refuse(df, batch)
    df = reduction.reduce(df, batch)
    df = refusal.enforce(df, dead_letter=batch.dead is not None)
    return distributing.distribute(df, batch)


def timed(progress: dict[str, Any], phase: str, step: Callable[[], _T]) -> _T:
    """``step()``, its wall milliseconds added to ``progress["phases_ms"][phase]``."""
    started = time.monotonic()
    try:
        return step()
    finally:
        phases = progress.setdefault("phases_ms", {})
        phases[phase] = round(phases.get(phase, 0.0) + (time.monotonic() - started) * 1000, 1)
