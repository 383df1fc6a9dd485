"""Settings the sink holds on a Spark session (a small batch's, job/codegen.py; an unbounded Arrow
batch's, writer/arrow_batches.py) come back as the session had them when two writes on it overlap
from two threads, whichever finishes first (_session_settings.py). Each holder used to put back what
it found, so one that began while the other held them left the sink's settings set for good."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from pyspark.sql import SparkSession

from iceberg_sink._session_settings import session_identity, take
from iceberg_sink.job import codegen
from iceberg_sink.writer import arrow_batches
from iceberg_sink.writer.arrow_batches import MAX_BYTES, UNBOUNDED
from tests.helpers import package_lookups

AQE = "spark.sql.adaptive.enabled"


def _overlap(
    first: Callable[[], AbstractContextManager[bool]], second: Callable[[], AbstractContextManager[bool]]
) -> list[bool]:
    """``first`` entered on one thread, then ``second`` on another; the first leaves, then the second."""
    entered, first_left, entered_second = threading.Event(), threading.Event(), threading.Event()
    held: list[bool] = []

    def one() -> None:
        with first() as on:
            held.append(on)
            entered.set()
            entered_second.wait(30)
        first_left.set()

    def two() -> None:
        entered.wait(30)
        with second() as on:
            held.append(on)
            entered_second.set()
            first_left.wait(30)

    threads = [threading.Thread(target=one), threading.Thread(target=two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return held


def test_holders_of_one_session_put_its_own_values_back_when_the_last_lets_go(spark: SparkSession) -> None:
    spark.conf.set(AQE, "true")  # the user's own value
    try:
        a = take(spark, {AQE: "false", MAX_BYTES: str(UNBOUNDED)})
        b = take(spark, {AQE: "false"})
        a.release()  # the first holder leaves while the second still holds AQE
        assert spark.conf.get(AQE) == "false"
        assert spark.conf.get(MAX_BYTES, None) is None  # only the first held it: Spark's default again
        b.release()
        assert spark.conf.get(AQE) == "true"
    finally:
        spark.conf.unset(AQE)


def test_two_small_batches_overlapping_on_one_session_leave_its_settings_as_they_were(spark: SparkSession) -> None:
    small = spark.range(10)
    assert all(spark.conf.get(key, None) is None for key in codegen.SMALL_BATCH)
    held = _overlap(lambda: codegen.sized(small, 10_000), lambda: codegen.sized(small, 10_000))
    assert held == [True, True]
    assert {key: spark.conf.get(key, None) for key in codegen.SMALL_BATCH} == dict.fromkeys(codegen.SMALL_BATCH)


def test_two_unbounded_writes_overlapping_on_one_session_leave_its_byte_bound_as_it_was(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrow_batches, "_WIDEST", {})  # this test's jobs only, gone after it
    arrow_batches.observe("job-a", [100])
    arrow_batches.observe("job-b", [100])
    held = _overlap(
        lambda: arrow_batches.bounded_by_rows(spark, "job-a"), lambda: arrow_batches.bounded_by_rows(spark, "job-b")
    )
    assert held == [True, True]
    assert spark.conf.get(MAX_BYTES, None) is None


def test_a_sessions_identity_is_asked_without_a_package_chain(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``jvm.java.lang.System`` resolves each dotted prefix through a failed class lookup that walks
    every jar of the class path; a small batch asks for its session's identity every micro-batch."""
    asked = package_lookups(monkeypatch)
    identity = session_identity(spark)
    assert identity == session_identity(spark) and identity != session_identity(spark.newSession())
    assert asked == []
