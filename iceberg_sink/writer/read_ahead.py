"""Reads a writer task's input on a thread of its own while the task encodes Parquet.

A writer task receives its rows from the JVM as Arrow batches over a socket, and the JVM converts
the next rows only as fast as the task reads them. While the task's thread encodes a buffered
chunk into Parquet (``RollingParquetWriter.flush``, which releases the GIL), nothing read the
socket, so the JVM stopped converting: a task alternated between "the JVM converts" and "Python
encodes" and used one core where it could use two. :func:`read_ahead` keeps reading up to
``depth`` batches ahead, so the conversion of the next rows overlaps the encoding of the last ones.
Memory grows by at most ``depth`` batches (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows
each, 10,000 by default: about 1 MB for a row of 100 bytes).

The order of the batches is kept, an error raised while reading is raised in the task's thread at
the point it would have been raised without the thread, and the reading thread stops when the task
stops consuming (an error in the writer, or a generator closed early).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar, cast

T = TypeVar("T")

#: Batches read ahead of the writer.
READ_AHEAD_BATCHES = 8

_END = object()
_POLL_SECONDS = 0.1


def read_ahead(items: Iterator[T], depth: int = READ_AHEAD_BATCHES) -> Iterator[T]:
    """``items`` in order, read by a daemon thread up to ``depth`` items ahead of the consumer."""
    if depth < 1:
        raise ValueError(f"read_ahead depth: expected at least 1; received {depth}")
    buffered: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    stopped = threading.Event()

    def put(item: object, error: BaseException | None = None) -> bool:
        while not stopped.is_set():
            try:
                buffered.put((item, error), timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as e:  # raised in the consumer's thread, where it belongs
            put(_END, e)
            return
        put(_END)

    thread = threading.Thread(target=pump, name="iceberg_sink-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = buffered.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield cast(T, item)  # everything but _END came from items
    finally:
        stopped.set()
