"""The writer task's read-ahead thread: order, errors where they belong, a bounded lead, and a
thread that stops when its consumer does (iceberg_sink/writer/read_ahead.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from iceberg_sink.writer.read_ahead import read_ahead


def test_items_arrive_in_order() -> None:
    assert list(read_ahead(iter(range(1000)), depth=3)) == list(range(1000))
    assert list(read_ahead(iter([]))) == []


def test_an_error_while_reading_is_raised_to_the_consumer_after_the_items_before_it() -> None:
    def source() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("socket closed by the JVM")

    seen = []
    with pytest.raises(OSError, match="socket closed by the JVM"):
        for item in read_ahead(source()):
            seen.append(item)
    assert seen == [1, 2]


def test_reading_runs_ahead_of_a_busy_consumer_by_at_most_the_depth() -> None:
    read: list[int] = []

    def source() -> Iterator[int]:
        for i in range(100):
            read.append(i)
            yield i

    items = read_ahead(source(), depth=4)
    assert next(items) == 0
    # The consumer is "encoding": the thread keeps reading meanwhile, up to the depth.
    deadline = time.monotonic() + 5
    while len(read) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # item 0 consumed, 4 queued, one more read and waiting for room
    assert len(read) == 6, read
    assert list(items) == list(range(1, 100))


def test_the_thread_stops_when_the_consumer_stops() -> None:
    produced = threading.Event()

    def endless() -> Iterator[int]:
        i = 0
        while True:
            produced.set()
            yield i
            i += 1

    before = {t.ident for t in threading.enumerate()}
    items = read_ahead(endless(), depth=2)
    assert next(items) == 0
    items.close()  # a writer error ends the task's loop the same way
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t.ident not in before and t.name == "iceberg_sink-read-ahead"]
        if not extra:
            break
        time.sleep(0.05)
    assert not extra, extra


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="expected at least 1; received 0"):
        list(read_ahead(iter([1]), depth=0))
