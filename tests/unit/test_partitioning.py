"""Partition terms as strings → Iceberg partition specs."""

from __future__ import annotations

import re
from urllib.parse import quote_plus, unquote_plus

import pytest
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from iceberg_sink import InvalidSinkConfigError
from iceberg_sink._iceberg.files import MAX_SEGMENT_BYTES, PartitionPath, short_segment
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


@pytest.mark.parametrize(
    "value",
    ["x" * 300, "é" * 200, "/" * 120, "a%" * 90, "short", "", "..", "a/b", "line\nbreak"],
)
def test_partition_folders_are_short_escaped_and_inside_the_data_folder(value: str) -> None:
    spec = build_spec(parse_terms(["name", "bucket(4, user_id)"]), SCHEMA)
    path = PartitionPath(spec, SCHEMA, (value, 3)).to_path()
    segments = path.split("/")
    assert len(segments) == 2 and segments[1] == "user_id_bucket=3"
    assert segments[0].startswith("name=") and segments[0].isascii()
    assert all(0 < len(s.encode()) <= MAX_SEGMENT_BYTES for s in segments)
    assert ".." not in segments and "." not in segments
    if len(quote_plus(value, safe="")) + len("name=") <= MAX_SEGMENT_BYTES:
        assert unquote_plus(segments[0].removeprefix("name=")) == value  # short values stay readable
    else:
        prefix, digest = segments[0].rsplit("-", 1)
        assert re.fullmatch(r"[0-9a-f]{32}", digest)
        assert not re.search(r"%.?$", prefix)  # never cut inside a %XX escape


def test_shortened_folder_names_are_deterministic_and_distinct() -> None:
    spec = build_spec(parse_terms(["name"]), SCHEMA)
    long = "x" * 300
    values = [long, long[:-1] + "y", long + "x", "é" * 200, "é" * 199 + "e"]
    paths = [PartitionPath(spec, SCHEMA, (v,)).to_path() for v in values]
    assert len(set(paths)) == len(values)
    assert paths == [PartitionPath(spec, SCHEMA, (v,)).to_path() for v in values]
    assert short_segment("name=" + "x" * 300).startswith("name=xxx")
