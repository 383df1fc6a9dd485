"""Parse partition transforms written as strings: ``"col"``, ``"day(ts)"``, ``"bucket(16, id)"``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import IcebergType

from iceberg_sink.errors import InvalidSinkConfigError

_TERM = re.compile(
    r"^\s*(?:(?P<fn>[a-zA-Z_]+)\s*\(\s*(?:(?P<width>\d+)\s*,\s*)?(?P<arg>[^()]+?)\s*\)|(?P<col>[^()\s,]+))\s*$"
)
_SIMPLE = {
    "identity": IdentityTransform,
    "year": YearTransform,
    "years": YearTransform,
    "month": MonthTransform,
    "months": MonthTransform,
    "day": DayTransform,
    "days": DayTransform,
    "date": DayTransform,
    "hour": HourTransform,
    "hours": HourTransform,
}
_SUFFIX = {
    YearTransform: "year",
    MonthTransform: "month",
    DayTransform: "day",
    HourTransform: "hour",
    BucketTransform: "bucket",
    TruncateTransform: "trunc",
}
ALLOWED = "a column name, or identity(c), year(c), month(c), day(c), hour(c), bucket(N, c), truncate(W, c)"


@attrs.frozen
class PartitionTerm:
    """One parsed partition term."""

    column: str
    transform: Transform[Any, Any]
    text: str


def parse_term(text: str) -> PartitionTerm:
    m = _TERM.match(text) if isinstance(text, str) else None
    if m is None:
        raise InvalidSinkConfigError(f"partition_by: expected {ALLOWED}; received {text!r}")
    if m.group("col"):
        return PartitionTerm(m.group("col"), IdentityTransform(), text)
    fn, width, arg = m.group("fn").lower(), m.group("width"), m.group("arg")
    if fn in ("bucket", "truncate"):
        if width is None or int(width) <= 0:
            raise InvalidSinkConfigError(
                f"partition_by: {fn} needs a positive width first, like {fn}(16, {arg}); received {text!r}"
            )
        transform: Transform[Any, Any] = (
            BucketTransform(int(width)) if fn == "bucket" else TruncateTransform(int(width))
        )
        return PartitionTerm(arg, transform, text)
    if fn in _SIMPLE and width is None:
        return PartitionTerm(arg, _SIMPLE[fn](), text)
    raise InvalidSinkConfigError(f"partition_by: expected {ALLOWED}; received {text!r}")


def parse_terms(terms: Sequence[str]) -> tuple[PartitionTerm, ...]:
    problems, parsed = [], []
    for t in terms:
        try:
            parsed.append(parse_term(t))
        except InvalidSinkConfigError as e:
            problems.append(str(e))
    if problems:
        raise InvalidSinkConfigError("; ".join(problems))
    return tuple(parsed)


def field_name(term: PartitionTerm) -> str:
    suffix = _SUFFIX.get(type(term.transform))
    return term.column if suffix is None else f"{term.column}_{suffix}"


def build_spec(terms: Sequence[PartitionTerm], schema: Schema) -> PartitionSpec:
    """A partition spec over ``schema``; raises listing each term whose column or type does not fit."""
    fields, problems = [], []
    for i, term in enumerate(terms):
        try:
            source = schema.find_field(term.column)
        except ValueError:
            problems.append(
                f"partition_by {term.text!r}: column {term.column!r} is not in the schema ({', '.join(schema.column_names)})"
            )
            continue
        source_type: IcebergType = source.field_type
        if not term.transform.can_transform(source_type):
            problems.append(f"partition_by {term.text!r}: {term.transform} cannot apply to column type {source_type}")
            continue
        fields.append(
            PartitionField(
                source_id=source.field_id, field_id=1000 + i, transform=term.transform, name=field_name(term)
            )
        )
    if problems:
        raise InvalidSinkConfigError("; ".join(problems))
    return PartitionSpec(*fields)
