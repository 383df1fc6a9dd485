"""JSON payload columns whose documents differ in fields: columns with the union schema of the batch.

:func:`read_json` turns a string column of JSON objects into columns. The schema is inferred per
DataFrame (per micro-batch, when used through the builder's ``.map_batches``), as the union of every
document's fields, so schema evolution (table/evolution.py) sees all the columns the batch needs.

Inference, per JSON value: integral numbers are ``long`` (``decimal(38, 0)`` past the long range),
other numbers ``double``, strings ``string``, booleans ``boolean``, objects ``struct`` (fields in
first-seen order), arrays ``array`` of the union of their elements; null says nothing: a field null
(or an empty array) in every document of the batch is left out of the schema, so a table column of
that name keeps its type and gets a null. Within a batch
a field that is an integer in one document and a fractional number in another is ``double``, as
JSON does not tell them apart. Any other conflict (a number in one document and a string in
another, an object and a scalar, ...) is an :class:`~iceberg_sink.errors.InvalidInputError` naming
the column and the kinds seen; so is a document that is not a JSON object.

:func:`union_types` merges Spark types along Iceberg's legal promotions (int to long, float to
double, decimal precision); :mod:`iceberg_sink.sources.debezium` uses it to merge the schemas envelopes carry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._session import classic_frame
from iceberg_sink._sql import named
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.writer.task_start import task_start

# A JSON value's inferred kind, hashable: ("long",), ("double",), ("decimal",), ("string",),
# ("boolean",), ("null",), ("struct", ((name, kind), ...)), ("array", kind), or ("conflict", ((family,
# kind), ...)): values of several families (family_of), each family's values merged, first seen first.
Kind = tuple[Any, ...]
NULL_KIND: Kind = ("null",)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_NUMBERS = ("long", "double", "decimal")


def family_of(kind: Kind) -> str:
    """The family of a (non-null, non-conflict) kind: ``number``, ``string``, ``boolean``, ``object`` or
    ``array``; values of one family always merge into one kind."""
    tag = kind[0]
    return "number" if tag in _NUMBERS else "object" if tag == "struct" else str(tag)


def kind_of(value: Any) -> Kind:
    """The kind of a JSON value (as ``json.loads`` gives it)."""
    if value is None:
        return NULL_KIND
    if isinstance(value, bool):
        return ("boolean",)
    if isinstance(value, int):
        return ("long",) if _LONG_MIN <= value <= _LONG_MAX else ("decimal",)
    if isinstance(value, float):
        return ("double",)
    if isinstance(value, str):
        return ("string",)
    if isinstance(value, list):
        element: Kind = NULL_KIND
        for item in value:
            element = merge_kinds(element, kind_of(item))
        return ("array", element)
    if isinstance(value, dict):
        return ("struct", tuple((str(k), kind_of(v)) for k, v in value.items()))
    return ("string",)


def _describe(kind: Kind) -> str:
    if kind[0] == "struct":
        return "object"
    if kind[0] == "array":
        return "array"
    return str(kind[0])


def members(kind: Kind) -> tuple[tuple[str, Kind], ...]:
    """The (family, kind) pairs of a kind: one for a plain kind, each family's for a conflict."""
    return kind[1] if kind[0] == "conflict" else ((family_of(kind), kind),)  # type: ignore[no-any-return]


def merge_kinds(a: Kind, b: Kind) -> Kind:
    """The kind of the values of kinds ``a`` (seen first) and ``b``."""
    if a == b or b == NULL_KIND:
        return a
    if a == NULL_KIND:
        return b
    if a[0] == "conflict" or b[0] == "conflict" or family_of(a) != family_of(b):
        merged = dict(members(a))
        for family, kind in members(b):
            merged[family] = merge_kinds(merged[family], kind) if family in merged else kind
        return ("conflict", tuple(merged.items()))
    if a[0] in _NUMBERS and b[0] in _NUMBERS:
        if "double" in (a[0], b[0]):
            return ("double",)
        return ("decimal",)
    if a[0] == "struct" and b[0] == "struct":
        fields: dict[str, Kind] = dict(a[1])
        for name, kind in b[1]:
            fields[name] = merge_kinds(fields.get(name, NULL_KIND), kind)
        return ("struct", tuple(fields.items()))
    if a[0] == "array" and b[0] == "array":
        return ("array", merge_kinds(a[1], b[1]))
    raise AssertionError(f"kinds of one family that do not merge: {a}, {b}")


def _partition_kind(rows: Iterable[Any]) -> Iterator[tuple[Kind, str | None]]:
    """One merged kind per Spark partition, and a sample of a document that is not a JSON object."""
    task_start()
    merged: Kind = ("struct", ())
    bad: str | None = None
    for row in rows:
        text = row[0]
        if text is None:
            continue
        try:
            value = json.loads(text)
        except ValueError as e:
            bad = bad or f"{text[:200]!r} is not JSON ({e})"
            continue
        if not isinstance(value, dict):
            bad = bad or f"{text[:200]!r} is a JSON {type(value).__name__}, not an object"
            continue
        merged = merge_kinds(merged, kind_of(value))
    yield merged, bad


def is_typed(kind: Kind) -> bool:
    """Whether ``kind`` says anything of a type (not null, nor an array or object of nothing but nulls)."""
    if kind == NULL_KIND:
        return False
    if kind[0] == "array":
        return is_typed(kind[1])
    if kind[0] == "struct":
        return any(is_typed(k) for _, k in kind[1])
    return True


def kind_type(kind: Kind, path: str, problems: list[str]) -> T.DataType:
    """The Spark type of values of ``kind`` (at ``path``); a conflict is appended to ``problems``."""
    tag = kind[0]
    if tag == "struct":
        # A field null in every document says nothing of its type: it stays out of the schema (as
        # Iceberg's Kafka Connect sink does), so the table's column keeps its type (a missing
        # optional column is written as null) instead of a made-up string conflicting with it.
        return T.StructType(
            [
                T.StructField(name, kind_type(k, f"{path}.{name}" if path else name, problems))
                for name, k in kind[1]
                if is_typed(k)
            ]
        )
    if tag == "array":
        return T.ArrayType(kind_type(kind[1], f"{path}.element", problems))
    if tag == "conflict":
        seen = sorted({_describe(k) for _, k in kind[1]})
        problems.append(f"{path}: is {' in some documents, '.join(seen)} in others")
        return T.StringType()
    return {
        "long": T.LongType(),
        "double": T.DoubleType(),
        "decimal": T.DecimalType(38, 0),
        "string": T.StringType(),
        "boolean": T.BooleanType(),
        # An array element null in every document (struct fields null everywhere are left out).
        "null": T.StringType(),
    }[tag]


def infer_json_schema(df: DataFrame, column: str, what: str = "") -> T.StructType:
    """The union schema of the JSON objects in string column ``column`` of ``df``.

    Raises:
        InvalidInputError: a document is not a JSON object, or a field's kinds conflict (naming it).
    """
    parts = (
        classic_frame(df, "infer_json_schema(df)")
        .select(named(column).cast("string"))
        .rdd.mapPartitions(_partition_kind)
        .collect()
    )
    merged: Kind = ("struct", ())
    bad = [b for _, b in parts if b is not None]
    for kind, _ in parts:
        merged = merge_kinds(merged, kind)
    where = what or f"column {column!r}"
    if bad:
        raise InvalidInputError(f"{where}: expected a JSON object in every row; {bad[0]}")
    problems: list[str] = []
    schema = kind_type(merged, "", problems)
    if problems:
        raise InvalidInputError(
            f"{where}: the documents of this batch give a field conflicting types, which no column type holds: "
            + "; ".join(problems)
        )
    assert isinstance(schema, T.StructType)
    return schema


def read_json(df: DataFrame, column: str, keep: Sequence[str] = (), schema: T.StructType | None = None) -> DataFrame:
    """``df``'s JSON object column ``column`` as columns (the batch's union schema), beside ``keep``.

    Rows whose ``column`` is null are dropped.

    Args:
        df: a bounded DataFrame (a micro-batch; use the builder's ``.map_batches`` for streams).
        column: the string column holding one JSON object per row.
        keep: other columns of ``df`` to keep (for example a Kafka offset to order by); a JSON
            field of the same name is an error.
        schema: the schema to parse with; by default inferred from this DataFrame.

    Raises:
        InvalidInputError: see :func:`infer_json_schema`; a kept column also in the documents.
    """
    names = classic_frame(df, "read_json(df)").columns
    missing = [c for c in (column, *keep) if c not in names]
    if missing:
        raise InvalidInputError(f"read_json: expected columns {missing} in the DataFrame; it has {names}")
    rows = df.where(named(column).isNotNull())
    parsed_schema = schema if schema is not None else infer_json_schema(rows, column)
    clash = [c for c in keep if c in parsed_schema.fieldNames()]
    if clash:
        raise InvalidInputError(f"read_json: kept columns {clash} are also fields of the JSON documents")
    parsed = "__iceberg_sink_json"
    out = rows.select(*[named(c) for c in keep], F.from_json(named(column).cast("string"), parsed_schema).alias(parsed))
    return out.select(*[named(c) for c in keep], *[_field(parsed, f.name) for f in parsed_schema.fields])


def _field(struct: str, name: str) -> Column:
    return F.col(struct).getField(name).alias(name)


def union_types(a: T.DataType, b: T.DataType, path: str, problems: list[str]) -> T.DataType:
    """The type holding both ``a`` and ``b`` along Iceberg's promotions; a conflict is appended to
    ``problems`` (naming ``path``) and ``a`` returned."""
    if a == b:
        return a
    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if isinstance(a, integral) and isinstance(b, integral):
        return T.LongType() if T.LongType() in (a, b) else T.IntegerType()
    if isinstance(a, T.FloatType | T.DoubleType) and isinstance(b, T.FloatType | T.DoubleType):
        return T.DoubleType()
    if isinstance(a, T.DecimalType) and isinstance(b, T.DecimalType) and a.scale == b.scale:
        return T.DecimalType(max(a.precision, b.precision), a.scale)
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        fields = {f.name: f for f in a.fields}
        order = [f.name for f in a.fields]
        for f in b.fields:
            if f.name in fields:
                old = fields[f.name]
                merged = union_types(old.dataType, f.dataType, f"{path}.{f.name}" if path else f.name, problems)
                fields[f.name] = T.StructField(f.name, merged, old.nullable or f.nullable)
            else:
                fields[f.name] = T.StructField(f.name, f.dataType, True)
                order.append(f.name)
        names_b = {f.name for f in b.fields}
        for name in order:
            if name not in names_b:
                fields[name] = T.StructField(name, fields[name].dataType, True)
        return T.StructType([fields[n] for n in order])
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        element = union_types(a.elementType, b.elementType, f"{path}.element", problems)
        return T.ArrayType(element, a.containsNull or b.containsNull)
    if isinstance(a, T.MapType) and isinstance(b, T.MapType):
        key = union_types(a.keyType, b.keyType, f"{path}.key", problems)
        value = union_types(a.valueType, b.valueType, f"{path}.value", problems)
        return T.MapType(key, value, a.valueContainsNull or b.valueContainsNull)
    problems.append(f"{path}: is {a.simpleString()} in some events and {b.simpleString()} in others")
    return a
