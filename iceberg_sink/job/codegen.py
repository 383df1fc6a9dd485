"""Whether a micro-batch's own Spark jobs have Spark generate code and plan adaptively, or evaluate
their expressions as they are in the plan they were given: one rule, chosen per batch from its size,
around everything the sink runs of the batch up to its write (job/reading.py ``read_again_if_stale``),
put back before its committable is staged (road.py) and for post-commit work (job/pending.py).

Spark compiles Java code for each stage of a job (whole-stage code generation, on the driver) and,
inside each task, for each projection, filter and ordering the stage's operators evaluate. For the
small micro-batches of a CDC stream that is most of the job: a steady batch of 20 Debezium events of
a 160-column table spent 0.45-0.8 s of its ~1.1 s writing, and a Flight Recorder profile put a fifth of
the JVM's time in generating per-task projections alone (docs/benchmarks-debezium-wide.md). Spark's
interpreted evaluation, the path it falls back to whenever generated code does not compile, gives the
same values and starts at once; per row it is slower. Measured on this project's benchmark
(benchmarks/debezium_wide.py, one process per setting): a steady batch of 20 events 25-45 % faster
at 4 and 160 columns, 2,000 events of 160 columns 27 % faster, 20,000 of 4 columns 8 % faster; 10,000
events of 40 columns 5 % slower and 60,000 of 4 columns 12 % slower. The gain is where the code is
generated and compiled anew: a stream's first micro-batches, a restarted driver, bounded writes.

Adaptive execution (``spark.sql.adaptive.enabled``, on by default in batch jobs, which a
``foreachBatch`` micro-batch's are) runs each stage of a job with a shuffle as a job of its own and
plans the next stage again when it ends, to coalesce partitions and split skewed ones. A small
batch's shuffles are already at the sink's parallelism (job/parallelism.py) and have nothing to
coalesce; what remains is the extra jobs: a routed Debezium batch of 40 events ran five Spark jobs
(its cache, its tables' columns counted in two, its write in two), two with it off.

Spark's optimizer also derives the constraints every operator's rows satisfy (``isnotnull(x)``, ``x =
y``...), to infer filters and drop ones that always hold. On the plan of a wide micro-batch that is
quadratic work: each of its projections restates 160 columns and the refusal marks, and a profile of
the 160-column Kafka stream put half of the optimizer's time in ``PruneFilters`` asking for them. The
filters they would infer matter for joins and file scans, which a small batch's plan of a few
thousand rows does not gain from; in one process, alternating batch by batch, the write job's
planning took 227 ms with them off against 270 ms with them on (median of 30 batches each).

So a batch Spark's estimate puts at most ``iceberg-sink.write.interpreted-max-rows`` rows (10,000 by
default; 0: never) is read, planned and written with ``spark.sql.codegen.wholeStage=false``,
``spark.sql.codegen.factoryMode=NO_CODEGEN``, ``spark.sql.adaptive.enabled=false`` and
``spark.sql.constraintPropagation.enabled=false`` (:data:`SMALL_BATCH`): its Debezium statistics, a routed batch's column counts, and its write job. A
larger one, or one nothing can size, keeps Spark's settings. Its rows are Spark's size estimate over a
row's default size (topology/estimate.py: a Kafka micro-batch's records counted from Spark's offset
log, exactly; a file's bytes over a row's default width, an overcount for long JSON lines, which errs
toward Spark's settings). The Kafka guide's first micro-batch, on a cold JVM, runs its statistics and
column-count jobs this way too: 7.2-8.2 s against 8.5-9.0 with only the write sized, three jobs
instead of seven (docs/benchmarks-debezium-wide.md, session 44).

The settings are set on the session the batch came with (a stream's own clone, or a bounded write's
session) and put back as they were before the batch's committable is staged (:func:`as_configured`):
commits, post-commit hooks and compaction run as configured, including the post-commit work of older
checkpoints committed while the batch is planned. (A query the user runs on a bounded write's session
from another thread meanwhile is evaluated the same way: the same values, only its speed differs.)
Two writes on one session from two threads hold the settings together (_session_settings.py): the
last one to finish puts the session's own values back, whichever began first (each used to put back
what it found, so one that began while the other held them left them set for good).
``factoryMode`` is one of Spark's internal settings (since 2.4); the path it selects is the one
Spark's own fallback takes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyspark.sql import DataFrame, SparkSession

from iceberg_sink._session_settings import Held, session_identity, take
from iceberg_sink.topology.estimate import estimated_rows

logger = logging.getLogger("iceberg_sink")

#: The settings of a small batch: Spark's own keys, and what they hold for it.
SMALL_BATCH = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.constraintPropagation.enabled": "false",
}


def interpreted(df: DataFrame, max_rows: int) -> bool:
    """Whether batch ``df`` is small enough (at most ``max_rows`` rows estimated, ``max_rows`` > 0)
    for Spark to evaluate its jobs without generating code."""
    if max_rows <= 0:
        return False
    rows = estimated_rows(df)
    return rows is not None and rows <= max_rows


class _Sized:
    """The small-batch settings of one batch's session, held while applied (_session_settings.py:
    the session's own values come back when its last holder lets go)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.identity = session_identity(spark)
        self.held: Held | None = None

    @property
    def applied(self) -> bool:
        return self.held is not None

    def apply(self) -> None:
        self.held = take(self.spark, SMALL_BATCH, self.identity)

    def put_back(self) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None


_SIZED: ContextVar[_Sized | None] = ContextVar("iceberg_sink_small_batch", default=None)


@contextmanager
def sized(df: DataFrame, max_rows: int) -> Iterator[bool]:
    """Within the block, Spark evaluates the jobs of ``df``'s session with :data:`SMALL_BATCH` when
    :func:`interpreted` says so (yields whether it does); the session's settings are put back after.
    Inside a block already sized, a nested one changes nothing."""
    if _SIZED.get() is not None or not interpreted(df, max_rows):
        yield False
        return
    scope = _Sized(df.sparkSession)
    logger.debug("micro-batch evaluated without generated code or adaptive plans (at most %s rows estimated)", max_rows)
    scope.apply()
    token = _SIZED.set(scope)
    try:
        yield True
    finally:
        _SIZED.reset(token)
        if scope.applied:
            scope.put_back()


def active() -> bool:
    """Whether the jobs run now are a small batch's (inside :func:`sized`, not :func:`as_configured`)."""
    scope = _SIZED.get()
    return scope is not None and scope.applied


@contextmanager
def as_configured() -> Iterator[None]:
    """Within the block, the batch's session holds its own settings again (a small batch's commit and
    post-commit work); the small-batch ones come back after, for what the batch still runs."""
    scope = _SIZED.get()
    if scope is None or not scope.applied:
        yield
        return
    scope.put_back()
    try:
        yield
    finally:
        scope.apply()
