"""Spark's size estimate of a batch, read once by the rules that decide by it: whether a CDC batch is
reduced in one task (topology/changes.py ``fits_one_task``) and how many partitions a streaming
micro-batch's shuffles get (job/parallelism.py).

A source without statistics (Kafka) gives Spark no estimate. A streaming micro-batch whose records
the sink can count (a Kafka batch: its offset ranges, sources/kafka_offsets.py ``records_between``)
is sized by :func:`counted` instead: its records times the width of a row of the DataFrame asked
about (Spark's default size of its columns, as Spark sizes rows it cannot measure). A 10,000-message
Kafka micro-batch was reduced through a shuffle for want of an estimate; its write job took 474 ms
against 229 ms for the same changes from a file (docs/benchmarks-cdc.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyspark.sql import DataFrame

#: The records of the micro-batch being processed, when the sink could count them (None: unknown).
_RECORDS: ContextVar[int | None] = ContextVar("iceberg_sink_batch_records", default=None)


@contextmanager
def counted(records: int | None) -> Iterator[None]:
    """Within the block, a DataFrame Spark cannot size is taken to hold ``records`` rows (None: no
    estimate, as before). Set around one micro-batch (sink.py)."""
    token = _RECORDS.set(records)
    try:
        yield
    finally:
        _RECORDS.reset(token)


def counted_records() -> int | None:
    """The records of the micro-batch being processed, when the sink counted them (a stream's
    micro-batch of Kafka alone); None otherwise."""
    return _RECORDS.get()


#: Estimates at or above this are no estimate: a source without statistics (Kafka, sockets) reports
#: ``spark.sql.defaultSizeInBytes``, the largest long, which each projection above it rescales into
#: another huge number (a Kafka batch's ``from_json`` gave 1.4 PB).
UNKNOWN_BYTES = 2**50


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's size estimate of ``df``; else, within :func:`counted`, the counted records times a row's
    default size; else None.

    The analyzed plan's statistics (the files' sizes for a file source, scaled by each projection's
    row width), not the optimized plan's: optimizing a wide Debezium batch's plan only for this
    estimate took 0.5-1 s per batch at 160 columns (benchmarks/debezium_wide.py), and the write
    optimizes the plan again anyway."""
    try:
        size = int(str(df._jdf.queryExecution().analyzed().stats().sizeInBytes()))
    except Exception:  # an estimate only: the callers fall back to their default
        return None
    if 0 <= size < UNKNOWN_BYTES:
        return size
    records = _RECORDS.get()
    width = _row_width(df) if records is not None else None
    return records * width if records is not None and width is not None else None


def estimated_rows(df: DataFrame) -> int | None:
    """The rows of ``df`` as the sink estimates them: within :func:`counted`, the counted records when
    Spark has no estimate; else Spark's size estimate over a row's default size (a file's bytes over
    it: an overcount for long text lines); else None."""
    size = estimated_bytes(df)
    width = _row_width(df) if size is not None else None
    return size // width if size is not None and width is not None else None


def _row_width(df: DataFrame) -> int | None:
    """The default size of a row of ``df`` (Spark's, as it sizes rows it cannot measure), at least 1."""
    try:
        return max(1, int(str(df._jdf.schema().defaultSize())))
    except Exception:  # an estimate only: unknown
        return None
