"""Spark's size estimate of a batch, read once by the rules that decide by it: whether a CDC batch is
reduced in one task (topology/changes.py ``fits_one_task``) and how many partitions a streaming
micro-batch's shuffles get (job/parallelism.py)."""

from __future__ import annotations

from pyspark.sql import DataFrame

#: Estimates at or above this are no estimate: a source without statistics (Kafka, sockets) reports
#: ``spark.sql.defaultSizeInBytes``, the largest long, which each projection above it rescales into
#: another huge number (a Kafka batch's ``from_json`` gave 1.4 PB).
UNKNOWN_BYTES = 2**50


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's size estimate of ``df``, or None when it has none.

    The analyzed plan's statistics (the files' sizes for a file source, scaled by each projection's
    row width), not the optimized plan's: optimizing a wide Debezium batch's plan only for this
    estimate took 0.5-1 s per batch at 160 columns (benchmarks/debezium_wide.py), and the write
    optimizes the plan again anyway."""
    try:
        size = int(str(df._jdf.queryExecution().analyzed().stats().sizeInBytes()))
    except Exception:  # an estimate only: the callers fall back to their default
        return None
    return size if 0 <= size < UNKNOWN_BYTES else None
