"""Partition terms as strings → Iceberg partition specs."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from iceberg_sink import InvalidSinkConfigError
from iceberg_sink.table.partitioning import build_spec, parse_term, parse_terms

SCHEMA = Schema(
    NestedField(1, "user_id", LongType()),
    NestedField(2, "ts", TimestamptzType()),
    NestedField(3, "name", StringType()),
)


@pytest.mark.parametrize(
    ("text", "column", "transform"),
    [
        ("user_id", "user_id", IdentityTransform()),
        ("identity(name)", "name", IdentityTransform()),
        ("day(ts)", "ts", DayTransform()),
        ("days(ts)", "ts", DayTransform()),
        ("bucket(16, user_id)", "user_id", BucketTransform(16)),
        (" truncate( 3 ,name ) ", "name", TruncateTransform(3)),
    ],
)
def test_terms_parse(text: str, column: str, transform: object) -> None:
    term = parse_term(text)
    assert term.column == column
    assert term.transform == transform


@pytest.mark.parametrize("text", ["bucket(user_id)", "bucket(0, user_id)", "frobnicate(ts)", "day(1, ts)", "a b", ""])
def test_bad_terms_name_what_is_allowed(text: str) -> None:
    with pytest.raises(InvalidSinkConfigError, match="partition_by"):
        parse_term(text)


def test_spec_names_follow_iceberg_conventions() -> None:
    spec = build_spec(parse_terms(["day(ts)", "bucket(16, user_id)", "truncate(2, name)", "name"]), SCHEMA)
    assert [f.name for f in spec.fields] == ["ts_day", "user_id_bucket", "name_trunc", "name"]
    assert [f.source_id for f in spec.fields] == [2, 1, 3, 3]


def test_spec_errors_list_each_bad_term() -> None:
    with pytest.raises(InvalidSinkConfigError) as info:
        build_spec(parse_terms(["day(name)", "bucket(4, nope)"]), SCHEMA)
    assert "day cannot apply to column type string" in str(info.value)
    assert "column 'nope' is not in the schema" in str(info.value)
