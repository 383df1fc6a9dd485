"""How Spark cuts the rows a write job hands its writer tasks into Arrow batches.

Spark sends a writer task (``mapInArrow``) its rows in Arrow batches of at most
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by default) and, unless
``spark.sql.execution.arrow.maxBytesPerBatch`` is ``Int.MaxValue``, at most that many bytes (64 MiB
by default). The byte bound is checked after every row: Spark measures the batch built so far
(``ArrowWriter.sizeInBytes``, every column's buffers, through the struct Spark wraps a row in). A Java
Flight Recorder profile of a steady 40,000-change Kafka micro-batch put 8 % of the write task's samples
there (docs/benchmarks-cdc.md, session 51), for batches that never came near 64 MiB: 10,000 rows of
100 bytes are 1 MB.

So a write job runs with the byte bound lifted when the rows the last write of the same sink job
handed its tasks were narrow enough for the row bound alone to keep a batch within an eighth of the
byte bound: ``widest row * maxRecordsPerBatch * 8 <= maxBytesPerBatch`` (rows of at most 838 bytes
with Spark's defaults; the rows of a wide Debezium table keep the check). The headroom is for a
batch whose rows are wider than the last write's (a routed stream's other tables, a document
column): they must be eight times as wide before a batch passes the byte bound. Each task measures the rows it
received (:class:`Widths`: the widest batch's bytes per row, Arrow's own buffer sizes, what Spark's
check measures) and returns it in its WriteResult; :func:`bounded_by_rows` applies the rule around
the write and :func:`observe` keeps what the tasks saw. A sink job's first write, a job whose tasks
reported nothing (Spark's own Parquet writer for appends, writer/jvm.py), and rows wider than the rule
allows keep Spark's byte bound; a job whose rows widen gets it back from its next write on. The
setting is put back after the write job, when no other write on the session holds it
(_session_settings.py, as the small-batch settings of job/codegen.py).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pyarrow as pa
from pyspark.sql import SparkSession

from iceberg_sink._session_settings import holding

MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
#: Spark's value for "no byte bound" (``Int.MaxValue``): the only value that skips the check.
UNBOUNDED = 2**31 - 1
#: The row bound alone must keep a batch within this share of the byte bound.
HEADROOM = 8

_lock = threading.Lock()
_WIDEST: dict[str, int] = {}  # sink job id -> the widest row its last reporting write's tasks received
#: Jobs remembered at most (the oldest observation goes first): a bounded write without a checkpoint
#: location is a job of its own every time.
MAX_JOBS = 1024

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def parse_bytes(text: str) -> int | None:
    """Spark's byte-size text (``67108864b``, ``64m``, ``1g``) in bytes; None when it is not one."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        return None
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def lifts(row_bytes: int, max_records: int, max_bytes: int) -> bool:
    """Whether rows of at most ``row_bytes`` bytes, ``max_records`` to a batch, keep a batch within
    ``max_bytes / HEADROOM`` (so Spark's per-row check of ``max_bytes`` can be skipped)."""
    if row_bytes <= 0 or max_records <= 0 or max_bytes <= 0 or max_bytes >= UNBOUNDED:
        return False
    return row_bytes * max_records * HEADROOM <= max_bytes


class Widths:
    """The widest Arrow batch, in bytes per row, of the batches a writer task iterates."""

    def __init__(self) -> None:
        self.row_bytes = 0

    def measured(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                self.row_bytes = max(self.row_bytes, -(-batch.nbytes // batch.num_rows))
            yield batch


@contextmanager
def bounded_by_rows(spark: SparkSession, job_id: str) -> Iterator[bool]:
    """Within the block, Spark's byte bound of Arrow batches is lifted when job ``job_id``'s last
    write allows it (module docstring); yields whether Spark skips the check in the block. The
    session's own value is put back when no other write on it holds the setting."""
    with _lock:
        widest = _WIDEST.get(job_id, 0)
    conf = spark.conf
    try:
        max_bytes = parse_bytes(str(conf.get(MAX_BYTES)))
    except Exception:  # a Spark without the setting (3.5) checks no batch's bytes: nothing to lift
        yield False
        return
    try:
        max_records = int(str(conf.get(MAX_RECORDS)))
    except ValueError:
        max_records = 0
    if max_bytes is not None and max_bytes >= UNBOUNDED:
        yield True  # unbounded already: the user's setting, or another write's on this session
        return
    if max_bytes is None or not lifts(widest, max_records, max_bytes):
        yield False
        return
    with holding(spark, {MAX_BYTES: str(UNBOUNDED)}):
        yield True


def observe(job_id: str, row_bytes: Iterable[int]) -> None:
    """Keep the widest row the tasks of job ``job_id``'s write reported (``row_bytes``, 0: none);
    a write whose tasks reported nothing leaves the last observation as it was."""
    widest = max(row_bytes, default=0)
    if widest <= 0:
        return
    with _lock:
        _WIDEST.pop(job_id, None)
        _WIDEST[job_id] = widest
        while len(_WIDEST) > MAX_JOBS:
            del _WIDEST[next(iter(_WIDEST))]
