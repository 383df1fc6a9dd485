"""Whether a micro-batch's write job has Spark generate code, or evaluates its expressions as they
are: one rule, chosen per batch from its size, around the stages that build and run the write job
(road.py).

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
generated and compiled anew: a stream's first micro-batches, a restarted driver, bounded writes; on a
Kafka stream 30 micro-batches in, where Spark reuses the classes it compiled, the difference was inside
the spread between runs.

So a batch Spark's estimate puts at most ``iceberg-sink.write.interpreted-max-rows`` rows (10,000 by
default; 0: never) is built and written with ``spark.sql.codegen.wholeStage=false`` and
``spark.sql.codegen.factoryMode=NO_CODEGEN``; a larger one, or one nothing can size, keeps Spark's
settings. Its rows are Spark's size estimate over a row's default size (topology/estimate.py: a
Kafka micro-batch's records counted from Spark's offset log, exactly; a file's bytes over a row's
default width, an overcount for long JSON lines, which errs toward Spark's code generation).

The two settings are set on the session the batch came with (a stream's own clone, or a bounded
write's session) for the build and the write job only, and put back as they were before the batch's
committable is staged: commits and post-commit compaction run as configured. (A query the user runs
on a bounded write's session from another thread meanwhile is evaluated the same way: the same
values, only its speed differs.) ``factoryMode`` is one of Spark's internal settings (since 2.4); the
path it selects is the one Spark's own fallback takes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame

from iceberg_sink.topology.estimate import estimated_rows

logger = logging.getLogger("iceberg_sink")

#: The settings of an interpreted batch: Spark's own keys, and what they hold for it.
INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def interpreted(df: DataFrame, max_rows: int) -> bool:
    """Whether batch ``df`` is small enough (at most ``max_rows`` rows estimated, ``max_rows`` > 0)
    for Spark to evaluate its write job without generating code."""
    if max_rows <= 0:
        return False
    rows = estimated_rows(df)
    return rows is not None and rows <= max_rows


@contextmanager
def sized(df: DataFrame, max_rows: int) -> Iterator[bool]:
    """Within the block, Spark evaluates the jobs of ``df``'s session without generating code when
    :func:`interpreted` says so (yields whether it does); the session's settings are put back after."""
    if not interpreted(df, max_rows):
        yield False
        return
    conf = df.sparkSession.conf
    before: dict[str, str | None] = {key: conf.get(key, None) for key in INTERPRETED}
    logger.debug("micro-batch evaluated without generated code (at most %s rows estimated)", max_rows)
    for key, value in INTERPRETED.items():
        conf.set(key, value)
    try:
        yield True
    finally:
        for key, previous in before.items():
            if previous is None:
                conf.unset(key)
            else:
                conf.set(key, previous)
