"""The rule for Spark's byte bound of the Arrow batches a write job hands its writer tasks
(writer/arrow_batches.py): the byte texts Spark takes, when the row bound alone keeps a batch within
an eighth of the byte bound, what a task measures, and what the driver keeps per sink job."""

from __future__ import annotations

import pyarrow as pa
import pytest

from iceberg_sink.writer import arrow_batches
from iceberg_sink.writer.arrow_batches import UNBOUNDED, Widths, lifts, observe, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("67108864b", 67108864),
        ("64m", 64 * 2**20),
        ("1g", 2**30),
        ("12", 12),
        (" 3 KB ", 3 * 1024),
        ("abc", None),
        ("5x", None),
        ("", None),
    ],
)
def test_spark_byte_texts_are_read_as_spark_writes_them(text: str, expected: int | None) -> None:
    assert parse_bytes(text) == expected


def test_the_row_bound_must_keep_a_batch_within_an_eighth_of_the_byte_bound() -> None:
    cap = 64 * 2**20
    assert lifts(100, 10_000, cap)  # 1 MB batches
    assert lifts(cap // 80_000, 10_000, cap)  # exactly an eighth: 838 bytes a row
    assert not lifts(cap // 80_000 + 1, 10_000, cap)
    assert not lifts(4_000, 10_000, cap)  # 40 MB batches: a wide Debezium table keeps the check
    assert not lifts(0, 10_000, cap)  # nothing measured
    assert not lifts(100, 0, cap)  # no row bound: only the byte bound bounds a batch
    assert not lifts(100, 10_000, UNBOUNDED)  # already unbounded: nothing to lift


def test_a_task_measures_its_widest_batch_per_row_and_passes_every_batch_on() -> None:
    narrow = pa.record_batch({"a": pa.array(range(100), pa.int64())})
    wide = pa.record_batch({"a": pa.array(range(10), pa.int64()), "s": pa.array(["x" * 1000] * 10)})
    empty = pa.record_batch({"a": pa.array([], pa.int64())})
    widths = Widths()
    seen = list(widths.measured([narrow, empty, wide, narrow]))
    assert seen == [narrow, empty, wide, narrow]
    assert widths.row_bytes == -(-wide.nbytes // wide.num_rows) > 1000
    assert Widths().row_bytes == 0


def test_the_driver_keeps_each_jobs_last_reported_width_and_forgets_the_oldest_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(arrow_batches, "_WIDEST", {})
    monkeypatch.setattr(arrow_batches, "MAX_JOBS", 3)
    observe("a", [10, 30, 20])
    assert arrow_batches._WIDEST == {"a": 30}
    observe("a", [0, 0])  # a write whose tasks measured nothing (Spark's own writer) keeps the last
    assert arrow_batches._WIDEST == {"a": 30}
    observe("a", [5])  # rows that narrowed: the last write counts, not the widest ever
    for job in ("b", "c", "d"):
        observe(job, [1])
    assert list(arrow_batches._WIDEST) == ["b", "c", "d"]
