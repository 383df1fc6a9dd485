"""Bounds pruning of the stored-row lookup (table/lookup.py, _iceberg/deletes.bounds_may_hold)."""

from __future__ import annotations

import datetime as dt

from pyiceberg.schema import Schema
from pyiceberg.types import DateType, LongType, NestedField, StringType

from iceberg_sink._iceberg.deletes import bounds_may_hold
from iceberg_sink.vocab.files import DataFileMeta, FileContent

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "day", DateType(), required=False),
)


def meta(lower: dict[int, bytes], upper: dict[int, bytes]) -> DataFileMeta:
    return DataFileMeta(
        content=FileContent.DATA,
        path="f.parquet",
        spec_id=0,
        partition=(),
        record_count=10,
        file_size_in_bytes=100,
        lower_bounds=tuple(lower.items()),
        upper_bounds=tuple(upper.items()),
    )


def long(v: int) -> bytes:
    return v.to_bytes(8, "little", signed=True)


def test_a_file_is_read_only_when_a_key_lies_within_its_bounds() -> None:
    f = meta({1: long(10), 2: b"b"}, {1: long(20), 2: b"d"})
    assert bounds_may_hold(f, SCHEMA, [(15,)], (1,))
    assert bounds_may_hold(f, SCHEMA, [(3,), (20,)], (1,))  # one key inside is enough
    assert not bounds_may_hold(f, SCHEMA, [(3,), (21,), (-5,)], (1,))
    assert not bounds_may_hold(f, SCHEMA, [], (1,))
    # Several key fields: every field of one key must be inside.
    assert bounds_may_hold(f, SCHEMA, [(15, "c")], (1, 2))
    assert not bounds_may_hold(f, SCHEMA, [(15, "z"), (30, "c")], (1, 2))


def test_what_cannot_be_compared_never_prunes() -> None:
    f = meta({1: long(10)}, {1: long(20)})
    assert bounds_may_hold(f, SCHEMA, [("x",)], (2,))  # no bounds for the field
    assert bounds_may_hold(f, SCHEMA, [(None,)], (1,))  # a null key: bounds say nothing about nulls
    assert bounds_may_hold(f, SCHEMA, [("not a number",)], (1,))  # a value the encoder does not take


def test_dates_compare_as_days() -> None:
    days = meta({3: (5).to_bytes(4, "little")}, {3: (6).to_bytes(4, "little")})
    assert bounds_may_hold(days, SCHEMA, [(dt.date(1970, 1, 7),)], (3,))
    assert not bounds_may_hold(days, SCHEMA, [(dt.date(2030, 1, 1),)], (3,))
