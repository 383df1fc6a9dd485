"""The types of Debezium row images without a schema part (sources/bare_types.py): which type a field
whose values are of several JSON kinds settles on, and the refusal of a value that does not fit it
(issue 42, item 2). Pure Python: the Spark side is tests/integration/test_debezium_bare_types.py."""

from __future__ import annotations

import json
from typing import Any

from pyiceberg import types as ice
from pyiceberg.schema import Schema
from pyspark.sql import types as T

from iceberg_sink.sources.bare_types import (
    DECLARED,
    MAJORITY,
    SETTLED,
    TABLE,
    Misfits,
    _known,
    _Settling,
    table_types,
    writing_table,
)
from iceberg_sink.sources.readers import kind_of, merge_kinds


def kinds(*documents: dict[str, Any]) -> tuple[Any, ...]:
    merged: tuple[Any, ...] = ("struct", ())
    for document in documents:
        merged = merge_kinds(merged, kind_of(document))
    return merged


def test_a_conflict_settles_on_the_majority_counted_else_on_the_first_kind_seen() -> None:
    kind = kinds({"id": "5002"}, {"id": 1}, {"id": 2})
    first = _Settling(None, {}, {})
    assert first.type_of(kind, None, ()) == T.StructType([T.StructField("id", T.StringType())])
    assert first.needed == {("id",)} and first.may_misfit  # counted next, then settled again
    counted = _Settling(None, {}, {(None, ("id",)): {"string": 1, "number": 2}})
    assert counted.type_of(kind, None, ()) == T.StructType([T.StructField("id", T.LongType())])
    assert not counted.needed and counted.why == {"id": MAJORITY}
    tie = _Settling(None, {}, {(None, ("id",)): {"string": 1, "number": 1}})
    assert tie.type_of(kind, None, ()) == T.StructType([T.StructField("id", T.StringType())])


def test_a_known_type_decides_where_json_tells_the_kinds_apart() -> None:
    known = T.StructType(
        [
            T.StructField("qty", T.IntegerType()),
            T.StructField("price", T.LongType()),
            T.StructField("name", T.StringType()),
            T.StructField("at", T.TimestampType()),
            T.StructField("dims", T.StructType([T.StructField("w", T.DoubleType())])),
        ]
    )
    kind = kinds(
        {"qty": 1, "price": 1.5, "name": 5, "at": "2026-01-01T00:00:00Z", "dims": {"w": "wide", "h": 2}},
        {"qty": 3_000_000_000, "name": 6, "at": 7},
    )
    settling = _Settling(None, {"qty": TABLE, "price": TABLE, "name": DECLARED, "dims": TABLE}, {})
    got = settling.type_of(kind, known, ())
    assert got == T.StructType(
        [
            T.StructField("qty", T.LongType()),  # integers stay long: schema evolution may widen the column
            T.StructField("price", T.LongType()),  # a fraction where an integer is expected: refused
            T.StructField("name", T.StringType()),  # numbers where strings are expected: refused
            T.StructField("at", T.StringType()),  # not told apart by kind: the batch's own type (and conflict)
            T.StructField("dims", T.StructType([T.StructField("w", T.DoubleType()), T.StructField("h", T.LongType())])),
        ]
    )
    assert settling.may_misfit and not settling.needed - {("at",)}
    assert settling.why == {"price": TABLE, "name": DECLARED, "dims.w": TABLE, "at": MAJORITY}


def test_a_misfit_names_the_field_what_it_holds_and_the_type_expected() -> None:
    target = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("dims", T.StructType([T.StructField("w", T.DoubleType())])),
            T.StructField("props", T.MapType(T.StringType(), T.BooleanType())),
            T.StructField("at", T.TimestampType()),
        ]
    )
    misfits = Misfits(target, (("id", TABLE), ("tags.element", MAJORITY)))
    assert misfits(json.dumps({"id": 1, "tags": ["a"], "dims": {"w": 2}, "props": {"x": True}, "at": 5})) is None
    assert misfits(json.dumps({"id": None, "tags": None, "dims": {"w": None}})) is None
    assert misfits(json.dumps({"id": "5002"})) == (
        f"""field 'id' holds the JSON string "5002", which does not fit long, {TABLE}"""
    )
    assert misfits(json.dumps({"id": 1.5})) == f"field 'id' holds the JSON number 1.5, which does not fit long, {TABLE}"
    assert (
        misfits(json.dumps({"id": True})) == f"field 'id' holds the JSON boolean true, which does not fit long, {TABLE}"
    )
    assert misfits(json.dumps({"tags": ["a", 1]})) == (
        f"field 'tags.element' holds the JSON number 1, which does not fit string, {MAJORITY}"
    )
    assert misfits(json.dumps({"dims": {"w": "wide"}})) == (
        f"""field 'dims.w' holds the JSON string "wide", which does not fit double, {SETTLED}"""
    )
    assert misfits(json.dumps({"dims": [1]})) == (
        f"field 'dims' holds the JSON array [1], which does not fit an object (struct), {SETTLED}"
    )
    assert misfits(json.dumps({"props": {"x": "yes"}})) == (
        f"""field 'props.value' holds the JSON string "yes", which does not fit boolean, {SETTLED}"""
    )
    shown = "x" * 99  # the first 100 characters of the JSON text
    assert misfits(json.dumps({"id": "x" * 300})) == (
        f"""field 'id' holds the JSON string "{shown}..., which does not fit long, {TABLE}"""
    )
    assert misfits("not json") is None and misfits(None) is None and misfits("[1]") is None


def test_the_table_the_sink_writes_gives_its_checked_columns_while_a_batch_is_read() -> None:
    schema = Schema(
        ice.NestedField(1, "id", ice.LongType(), required=True),
        ice.NestedField(2, "n", ice.IntegerType()),
        ice.NestedField(3, "price", ice.DecimalType(10, 2)),
        ice.NestedField(4, "at", ice.TimestamptzType()),
        ice.NestedField(5, "tags", ice.ListType(6, ice.StringType())),
        ice.NestedField(7, "times", ice.ListType(8, ice.DateType())),
        ice.NestedField(9, "props", ice.MapType(10, ice.StringType(), 11, ice.BooleanType())),
        ice.NestedField(12, "dims", ice.StructType(ice.NestedField(13, "w", ice.FloatType()))),
    )
    assert table_types() is None
    with writing_table(schema):
        got = table_types()
        known, origins = _known(T.StructType([T.StructField("n", T.StringType())]))
    assert table_types() is None
    assert got == T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("n", T.IntegerType()),
            T.StructField("price", T.DecimalType(10, 2)),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("props", T.MapType(T.StringType(), T.BooleanType())),
            T.StructField("dims", T.StructType([T.StructField("w", T.FloatType())])),
        ]
    )
    # A batch's schema parts win over the table for the columns they declare.
    assert known is not None and known["n"].dataType == T.StringType() and origins["n"] == DECLARED
    assert origins["id"] == TABLE
