"""Planning of schema evolution (table/evolution.py): which changes each mode makes, what it refuses."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)
from pyspark.sql import types as T

from iceberg_sink.errors import SchemaMismatchError
from iceberg_sink.table import evolution

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "n", IntegerType(), required=False),
    NestedField(3, "f", FloatType(), required=False),
    NestedField(4, "d", DecimalType(10, 2), required=False),
    NestedField(5, "addr", StructType(NestedField(6, "city", StringType(), required=False)), required=False),
    NestedField(
        7,
        "tags",
        ListType(8, StructType(NestedField(9, "k", StringType(), required=False)), element_required=False),
        required=False,
    ),
)


def struct(*fields: T.StructField) -> T.StructType:
    return T.StructType([T.StructField("id", T.LongType(), False), *fields])


def test_off_plans_nothing() -> None:
    assert evolution.plan("db.t", SCHEMA, struct(T.StructField("x", T.StringType())), evolution.OFF) == []


def test_added_columns_and_nested_fields() -> None:
    s = struct(
        T.StructField("x", T.StringType()),
        T.StructField(
            "addr", T.StructType([T.StructField("city", T.StringType()), T.StructField("zip", T.StringType())])
        ),
        T.StructField("y", T.StructType([T.StructField("a", T.IntegerType())])),
    )
    changes = evolution.plan("db.t", SCHEMA, s, evolution.ADD_COLUMNS)
    assert [(path, kind) for path, kind, _ in changes] == [(("x",), "add"), (("addr", "zip"), "add"), (("y",), "add")]
    added = changes[2][2]
    assert isinstance(added, StructType)
    assert [(f.name, f.field_type, f.required) for f in added.fields] == [("a", IntegerType(), False)]


def test_widening_only_in_add_and_widen() -> None:
    s = struct(
        T.StructField("n", T.LongType()),
        T.StructField("f", T.DoubleType()),
        T.StructField("d", T.DecimalType(12, 2)),
    )
    changes = evolution.plan("db.t", SCHEMA, s, evolution.ADD_AND_WIDEN)
    assert changes == [
        (("n",), "widen", LongType()),
        (("f",), "widen", DoubleType()),
        (("d",), "widen", DecimalType(12, 2)),
    ]
    with pytest.raises(SchemaMismatchError) as info:
        evolution.plan("db.t", SCHEMA, s, evolution.ADD_COLUMNS)
    assert len(info.value.mismatches) == 3
    assert all("use 'add-and-widen'" in m for m in info.value.mismatches)


def test_narrower_types_need_no_change_and_others_are_left_to_the_check() -> None:
    # int into long, float into double: the writer casts. decimal scale and string->int: no promotion,
    # reported by check_compatible (evolve() runs it against the evolved schema before committing).
    s = struct(T.StructField("n", T.ShortType()), T.StructField("d", T.DecimalType(12, 4)))
    assert evolution.plan("db.t", SCHEMA, s, evolution.ADD_AND_WIDEN) == []


def test_refused_new_required_column_and_fields_inside_lists() -> None:
    s = struct(
        T.StructField("req", T.StringType(), nullable=False),
        T.StructField(
            "tags", T.ArrayType(T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.StringType())]))
        ),
    )
    with pytest.raises(SchemaMismatchError) as info:
        evolution.plan("db.t", SCHEMA, s, evolution.ADD_AND_WIDEN)
    text = str(info.value)
    assert "table db.t" in text
    assert "req: new column is required (not null) in the DataFrame" in text
    assert "tags.element: fields ['v'] are not in the table" in text


def test_legal_promotions() -> None:
    assert evolution.wider(IntegerType(), LongType())
    assert evolution.wider(FloatType(), DoubleType())
    assert evolution.wider(DecimalType(9, 2), DecimalType(18, 2))
    assert not evolution.wider(DecimalType(9, 2), DecimalType(18, 3))
    assert not evolution.wider(LongType(), IntegerType())
    assert not evolution.wider(IntegerType(), DoubleType())
    assert not evolution.wider(StringType(), LongType())
