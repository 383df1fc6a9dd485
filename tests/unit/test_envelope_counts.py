"""A Debezium reader's last statistics (sources/envelope.py): which ones a batch may be planned on,
and how the sink recognises a batch that must be read again."""

from __future__ import annotations

import pytest

from iceberg_sink.errors import WriteFailedError
from iceberg_sink.sources.envelope import READ_BY_SPARK, STALE_COUNTS, Counts, LastCounts, read_again, reading_batch


def test_plain_statistics_are_planned_on_only_inside_the_sinks_reading() -> None:
    last = LastCounts()
    last.remember(Counts(["s1", "s2"], unordered=0, ordered=5), need_schemas=True)
    assert last.plan_on() is None  # a direct call of read_envelope counts
    with reading_batch(plan=True):
        counts = last.plan_on()
        assert counts is not None and counts.schemas == ["s1", "s2"]
    with reading_batch(plan=False):  # the batch read again: counted
        assert last.plan_on() is None
    assert last.plan_on() is None
    with reading_batch(plan=True):
        assert last.plan_on() is counts  # kept across batches that did not fail


def test_a_batch_that_fails_leaves_its_readers_to_count_the_next() -> None:
    """Planned on the statistics of a batch that was not written (a column the table refused), the
    next batch would fail too: it is counted instead."""
    read, other = LastCounts(), LastCounts()
    for last in (read, other):
        last.remember(Counts(["s1"], unordered=0, ordered=1), need_schemas=True)
    with pytest.raises(RuntimeError), reading_batch(plan=False):
        read.plan_on()  # a reader of the failing batch
        raise RuntimeError("table db.t has no column note")
    with reading_batch(plan=True):
        assert read.plan_on() is None
        assert other.plan_on() is not None  # it did not read the failed batch


def test_statistics_that_are_not_plain_are_forgotten_and_an_empty_batch_keeps_the_last() -> None:
    last = LastCounts()
    plain = Counts(["s1"], unordered=0, ordered=3)
    with reading_batch(plan=True):
        for odd in (
            Counts(["s1"], unordered=1, ordered=3),  # an event without an order value: warned of
            Counts(["s1"], unordered=0, ordered=3, placeholders=1),  # a TOASTed value: marked
            Counts(["s1", None], unordered=0, ordered=3),  # an event without a schema part: settled
        ):
            last.remember(plain, need_schemas=True)
            assert last.plan_on() is plain
            last.remember(odd, need_schemas=True)
            assert last.plan_on() is None
        last.remember(plain, need_schemas=True)
        last.remember(Counts([], unordered=0, ordered=0), need_schemas=True)  # no events at all
        assert last.plan_on() is plain
        # Without schema parts to count (a row schema given), plain counts are kept as they are.
        last.remember(Counts([], unordered=0, ordered=2), need_schemas=False)
        kept = last.plan_on()
        assert kept is not None and kept.ordered == 2


def test_a_stale_batch_is_recognised_through_the_errors_it_was_raised_from() -> None:
    spark_error = RuntimeError(f"Job aborted due to stage failure: ... [USER_RAISED_EXCEPTION] {STALE_COUNTS} SQLSTATE")
    try:
        try:
            raise spark_error
        except RuntimeError as e:
            raise WriteFailedError("checkpoint 3 of table db.t was not written: a writer task failed") from e
    except WriteFailedError as wrapped:
        assert read_again(wrapped) == f"{STALE_COUNTS} SQLSTATE"
    assert read_again(spark_error) == f"{STALE_COUNTS} SQLSTATE"
    left = RuntimeError(f"PythonException: Traceback ...\nRuntimeError: {READ_BY_SPARK} (a float: 'x')\n  at ...")
    assert read_again(left) == f"{READ_BY_SPARK} (a float: 'x')"
    assert read_again(RuntimeError("Job aborted due to stage failure: disk full")) is None
    assert read_again(None) is None
    looped = RuntimeError("a")
    looped.__cause__ = RuntimeError("b")
    looped.__cause__.__cause__ = looped  # a cycle ends the walk
    assert read_again(looped) is None
