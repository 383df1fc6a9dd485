"""DataFrame schema against table schema: conversions, promotions and the listed mismatches."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as T

from iceberg_sink import SchemaMismatchError
from iceberg_sink.table.schema import check_compatible, spark_to_iceberg

TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "score", DoubleType()),
    NestedField(3, "amount", DecimalType(12, 2)),
    NestedField(4, "ts", TimestamptzType()),
    NestedField(5, "local_ts", TimestampType()),
    NestedField(6, "address", StructType(NestedField(7, "city", StringType()), NestedField(8, "zip", IntegerType()))),
    NestedField(9, "note", StringType()),
)


def test_conversion_maps_spark_types() -> None:
    struct = T.StructType(
        [
            T.StructField("a", T.ShortType()),
            T.StructField("b", T.TimestampType(), nullable=False),
            T.StructField("c", T.TimestampNTZType()),
            T.StructField("d", T.ArrayType(T.StringType(), containsNull=False)),
            T.StructField("e", T.MapType(T.StringType(), T.LongType())),
        ]
    )
    schema = spark_to_iceberg(struct, required=["a"])
    assert str(schema.find_field("a").field_type) == "int" and schema.find_field("a").required
    assert schema.find_field("b").field_type == TimestamptzType() and schema.find_field("b").required
    assert schema.find_field("c").field_type == TimestampType()
    assert str(schema.find_field("d").field_type) == "list<string>"
    assert str(schema.find_field("e").field_type) == "map<string, long>"


def test_promotions_and_missing_optional_columns_are_accepted() -> None:
    struct = T.StructType(
        [
            T.StructField("id", T.IntegerType(), nullable=False),
            T.StructField("score", T.FloatType()),
            T.StructField("amount", T.DecimalType(10, 2)),
            T.StructField("address", T.StructType([T.StructField("city", T.StringType())])),
        ]
    )
    check_compatible("db.t", TABLE, struct)


def test_every_mismatch_is_listed() -> None:
    struct = T.StructType(
        [
            T.StructField("id", T.LongType(), nullable=True),
            T.StructField("score", T.StringType()),
            T.StructField("amount", T.DecimalType(14, 2)),
            T.StructField("local_ts", T.TimestampType()),
            T.StructField("Note", T.StringType()),
            T.StructField("extra", T.StringType()),
            T.StructField("address", T.StructType([T.StructField("zip", T.LongType())])),
        ]
    )
    with pytest.raises(SchemaMismatchError) as info:
        check_compatible("db.t", TABLE, struct)
    mismatches = info.value.mismatches
    text = str(info.value)
    assert "id: column is required (not null) in the table but nullable" in text
    assert "score: table type double cannot take DataFrame type string" in text
    assert "amount: table type decimal(12, 2) cannot take DataFrame type decimal(14, 2)" in text
    assert (
        "local_ts: table type timestamp cannot take DataFrame type timestamptz (cast the column to TimestampNTZType"
        in text
    )
    assert "Note: column is not in the table (the table has 'note': names are case sensitive)" in text
    assert "extra: column is not in the table" in text
    assert "address.zip: table type int cannot take DataFrame type long" in text
    assert len(mismatches) == 7
    assert isinstance(info.value, ValueError)


def test_required_column_missing_from_dataframe() -> None:
    with pytest.raises(SchemaMismatchError, match="id: column is required in the table but missing"):
        check_compatible("db.t", TABLE, T.StructType([T.StructField("note", T.StringType())]))


def test_a_missing_required_column_with_a_write_default_is_accepted_and_one_without_is_refused() -> None:
    """Format v3 default values: the writer fills a missing field's write-default (writer/conform.py),
    so only a required field without one must be supplied, at the top level and inside structs."""
    table = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "r", StringType(), required=True, initial_default="d", write_default="d"),
        NestedField(
            3,
            "s",
            StructType(
                NestedField(4, "x", IntegerType(), required=True, initial_default=0, write_default=0),
                NestedField(5, "y", IntegerType(), required=True),
            ),
        ),
    )
    present = [T.StructField("id", T.LongType(), nullable=False)]
    check_compatible("db.t", table, T.StructType(present))  # r and the whole struct s missing: fine
    inner = T.StructType([T.StructField("y", T.IntegerType(), nullable=False)])
    check_compatible("db.t", table, T.StructType([*present, T.StructField("s", inner)]))  # s.x has a default
    with pytest.raises(
        SchemaMismatchError, match=r"s\.y: column is required in the table but missing .*no write-default"
    ):
        inner = T.StructType([T.StructField("x", T.IntegerType(), nullable=False)])
        check_compatible("db.t", table, T.StructType([*present, T.StructField("s", inner)]))


def test_a_table_is_not_made_of_columns_readers_cannot_tell_apart_or_store() -> None:
    struct = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("ID", T.LongType()),
            T.StructField("s", T.StructType([T.StructField("a", T.LongType()), T.StructField("A", T.LongType())])),
            T.StructField("x", T.NullType()),
        ]
    )
    with pytest.raises(SchemaMismatchError) as info:
        spark_to_iceberg(struct, table_name="db.new")
    assert info.value.mismatches == (
        "columns 'id' and 'ID' differ only in case; readers that ignore case (Spark by default, DuckDB) cannot "
        "tell them apart: rename one",
        "columns 's.a' and 's.A' differ only in case; readers that ignore case (Spark by default, DuckDB) cannot "
        "tell them apart: rename one",
        "x: column has Spark type void (an untyped null), which Iceberg cannot store; cast it to a type Iceberg stores",
    )
    with pytest.raises(SchemaMismatchError, match="the DataFrame has no columns; a table needs at least one"):
        spark_to_iceberg(T.StructType([]))


def test_zero_columns_and_untyped_nulls_against_a_table() -> None:
    with pytest.raises(
        SchemaMismatchError, match=r"the DataFrame has no columns; expected columns of table db.t: id, score"
    ):
        check_compatible("db.t", TABLE, T.StructType([]))
    struct = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("note", T.NullType())])
    with pytest.raises(
        SchemaMismatchError, match=r"note: column has Spark type void .*; cast it to the table's type string"
    ):
        check_compatible("db.t", TABLE, struct)


def test_a_variant_column_is_refused_as_what_the_sink_does_not_write_yet() -> None:
    """Iceberg format v3 stores variants, so "Iceberg cannot store" would be wrong; the sink's writers do
    not write them, so the message says that and what to do."""
    struct = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.VariantType())])
    with pytest.raises(SchemaMismatchError) as info:
        spark_to_iceberg(struct, table_name="db.new")
    assert info.value.mismatches == (
        "v: column has Spark type variant, which iceberg_sink does not write yet; store its JSON text instead "
        "(to_json(column))",
    )
    table = Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType()))
    with pytest.raises(
        SchemaMismatchError, match=r"v: column has Spark type variant, .*cast it to the table's type string"
    ):
        check_compatible("db.t", table, struct)
