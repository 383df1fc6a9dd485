"""Upsert/CDC keys that Iceberg forbids as equality/identifier fields are refused before any commit.

Float and double keys, keys nested under an optional struct, keys inside lists or maps and keys that
are not primitive: on an existing table at ``build()``, and on a table the sink would create from the
DataFrame schema at the first batch, before the table is created.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DoubleType,
    FloatType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
)
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidSinkConfigError

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "d", DoubleType(), required=True),
    NestedField(3, "f", FloatType(), required=True),
    NestedField(4, "opt", StructType(NestedField(5, "k", LongType(), required=True)), required=False),
    NestedField(6, "req", StructType(NestedField(7, "k", LongType(), required=True)), required=True),
    NestedField(8, "tags", ListType(9, LongType(), element_required=True), required=True),
    NestedField(10, "m", MapType(11, StringType(), 12, LongType(), value_required=True), required=True),
    NestedField(
        13,
        "outer",
        StructType(
            NestedField(14, "inner", StructType(NestedField(15, "k", LongType(), required=True)), required=False)
        ),
        required=True,
    ),
)


@pytest.fixture
def existing(catalog: Catalog) -> Catalog:
    catalog.create_namespace("db")
    catalog.create_table("db.t", SCHEMA)
    return catalog


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (["d"], r"key column 'd' has type double; the Iceberg spec forbids float and double"),
        (["id", "f"], r"key column 'f' has type float; the Iceberg spec forbids float and double"),
        (["opt.k"], r"key column 'opt.k' is nested under optional struct 'opt'"),
        (["outer.inner.k"], r"key column 'outer.inner.k' is nested under optional struct 'inner'"),
        (["tags.element"], r"key column 'tags.element' is inside a list or map"),
        (["m.key"], r"key column 'm.key' is inside a list or map"),
        (["req"], r"key column 'req' has type struct<.*>; expected a primitive column"),
    ],
)
def test_existing_table_refuses_keys_iceberg_forbids(
    existing: Catalog, catalog_props: dict[str, str], key: list[str], message: str
) -> None:
    for builder in (
        IcebergSink.builder().catalog("test", **catalog_props).table("db.t").upsert(key=key),
        IcebergSink.builder().catalog("test", **catalog_props).table("db.t").cdc(op_column="op", key=key),
    ):
        with pytest.raises(InvalidSinkConfigError, match=message):
            builder.build()
    table = existing.load_table("db.t")
    assert table.snapshots() == [] and table.schema().identifier_field_ids == []


def test_every_bad_key_column_is_named_at_once(existing: Catalog, catalog_props: dict[str, str]) -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"'d' has type double.*'opt.k' is nested under optional"):
        IcebergSink.builder().catalog("test", **catalog_props).table("db.t").upsert(key=["d", "opt.k"]).build()


def test_valid_keys_are_accepted_and_nested_ones_refused_clearly(
    existing: Catalog, catalog_props: dict[str, str]
) -> None:
    IcebergSink.builder().catalog("test", **catalog_props).table("db.t").upsert(key=["id"]).build()
    # Iceberg allows a key under a required struct, but the writer projects deletes by top-level
    # column: refused at build time rather than failing inside the first write.
    with pytest.raises(InvalidSinkConfigError, match=r"'req.k' is nested in a struct; this sink supports top-level"):
        IcebergSink.builder().catalog("test", **catalog_props).table("db.t").upsert(key=["id", "req.k"]).build()


@pytest.mark.parametrize(
    ("ddl", "key", "message"),
    [
        ("d double, v string", ["d"], r"key column 'd' has type double; the Iceberg spec forbids float and double"),
        ("id long, f float, v string", ["id", "f"], r"key column 'f' has type float"),
        ("st struct<k: long>, v string", ["st.k"], r"key column 'st.k' is nested under optional struct 'st'"),
        (
            "st struct<k: long, x: double>, v string",
            ["st"],
            r"key column 'st' has type struct<.*>; expected a primitive",
        ),
    ],
)
def test_created_table_refuses_keys_iceberg_forbids_before_creating_it(
    spark: SparkSession, tmp_path: Path, ddl: str, key: list[str], message: str
) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.new").create_if_missing().upsert(key=key).build()
    with pytest.raises(InvalidSinkConfigError, match=message):
        sink.write(spark.createDataFrame(_one_row(ddl), ddl))
    with pytest.raises(InvalidSinkConfigError, match="does not exist yet"):
        sink.load_table()  # refused before the table was created


def _one_row(ddl: str) -> list[tuple[object, ...]]:
    return [
        {
            "d double, v string": (1.5, "a"),
            "id long, f float, v string": (1, 1.5, "a"),
            "st struct<k: long>, v string": ((1,), "a"),
            "st struct<k: long, x: double>, v string": ((1, 1.5), "a"),
            "st struct<k: long not null> not null, v string": ((1,), "a"),
        }[ddl]
    ]


def test_float_key_of_a_table_created_after_build_is_refused_at_the_first_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    # build() could not check: the table did not exist yet. Someone else creates it with a double
    # key column before the first batch; write() and start() refuse it before any commit.
    sink = (
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.late").create_if_missing().upsert(key=["d"]).build()
    )
    catalog = sink.config.catalog.load()
    catalog.create_namespace("db")
    catalog.create_table(
        "db.late", Schema(NestedField(1, "d", DoubleType(), required=True), NestedField(2, "v", StringType()))
    )
    df = spark.createDataFrame([(1.5, "a")], "d double, v string")
    with pytest.raises(InvalidSinkConfigError, match=r"key column 'd' has type double; the Iceberg spec forbids"):
        sink.write(df)
    src = tmp_path / "src"
    df.write.parquet(str(src))
    with pytest.raises(InvalidSinkConfigError, match=r"key column 'd' has type double"):
        sink.start(spark.readStream.schema("d double, v string").parquet(str(src)), str(tmp_path / "ckpt"))
    assert catalog.load_table("db.late").snapshots() == []
