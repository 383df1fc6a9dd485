"""Collated strings (Spark 4) are compared as the table compares them: byte by byte.

A key column ``string collate UTF8_LCASE`` made ``'A'`` and ``'a'`` one key in the change reduction:
of two rows in one batch only the later was written, without a word, while the same two keys in
two batches stayed two rows (iceberg_sink/table/collation.py). Tables are read back by Iceberg Java
and DuckDB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, InvalidInputError
from iceberg_sink.table.collation import binary, collated
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.string()), ("n", pa.int64()), ("s", pa.struct([("t", pa.string())]))])


def frame(spark: SparkSession, rows: list[tuple[Any, ...]], collation: str = "UTF8_LCASE") -> DataFrame:
    """Rows (k, v, n) with ``k`` and a nested string in ``collation``."""
    df = spark.createDataFrame(rows, "k string, v string, n long")
    return df.select(
        F.expr(f"collate(k, '{collation}')").alias("k"),
        "v",
        "n",
        F.struct(F.expr(f"collate(upper(v), '{collation}')").alias("t")).alias("s"),
    )


def expected(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    table = pa.Table.from_pylist([{"k": k, "v": v, "n": n, "s": {"t": v.upper()}} for k, v, n in rows], schema=SCHEMA)
    return normalize(table, ["k"])


def read_back(java: JavaIcebergReader, sink: IcebergSink) -> list[dict[str, Any]]:
    location = sink.load_table().metadata_location
    got = normalize(java.read(location), ["k"])
    assert normalize(duckdb_read(location), ["k"]) == got
    return got


def test_keys_differing_only_by_a_collation_are_distinct_keys_in_every_batch(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    first = [("A", "upper", 1), ("a", "lower", 2), ("ß", "sharp", 3), ("SS", "ss", 4), ("b ", "trailing", 5)]
    assert collated(frame(spark, first).schema["k"].dataType)
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing()
        .upsert(key=["k"], order_by="n")
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    sink.write(frame(spark, first), checkpoint_location=ckpt)
    assert read_back(java_reader, sink) == expected(first)
    # A later batch: 'a' is updated, 'A' stays; 'b' (no trailing space) is a new key beside 'b '.
    second = [("a", "lower again", 6), ("b", "no space", 7)]
    sink.write(frame(spark, second, "UTF8_LCASE_RTRIM"), checkpoint_location=ckpt)
    want = [r for r in first if r[0] != "a"] + second
    assert read_back(java_reader, sink) == expected(want)
    # The table's strings carry no collation: its schema is Iceberg's plain string.
    assert str(sink.load_table().schema().find_field("k").field_type) == "string"


def test_op_codes_and_routed_names_are_compared_byte_by_byte(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """'INSERT' is no op code (``insert`` is), and 'DB.T' is not the allowed 'db.t', whatever the
    columns' collation says. (These passed before binary_strings too: their checks cast to string,
    which drops the collation; kept so that no later change compares them by it.)"""
    cdc = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.c")
        .create_if_missing()
        .cdc(op_column="op", key=["k"], order_by="n")
        .build()
    )
    rows = spark.createDataFrame(
        [("a", "x", 1, "insert"), ("b", "y", 2, "INSERT")], "k string, v string, n long, op string"
    )
    lcase = rows.select("k", "v", "n", F.expr("collate(op, 'UTF8_LCASE')").alias("op"))
    with pytest.raises(InvalidInputError, match="INSERT"):
        cdc.write(lcase, checkpoint_location=str(tmp_path / "ck-cdc"))
    assert not cdc.load_table().snapshots()

    routed = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .route(table_column="tbl", allow=["db.t"])
        .create_if_missing()
        .build()
    )
    batch = spark.createDataFrame([("DB.T", 1)], "tbl string, id long").select(
        F.expr("collate(tbl, 'UTF8_LCASE')").alias("tbl"), "id"
    )
    with pytest.raises(InvalidInputError, match=r"DB\.T"):
        routed.write(batch, checkpoint_location=str(tmp_path / "ck-routed"))


def test_binary_keeps_names_nullability_and_other_types() -> None:
    from pyspark.sql import types as T

    nested = T.StructType(
        [
            T.StructField("a", T.StringType("UNICODE_CI"), False),
            T.StructField("m", T.MapType(T.StringType("UTF8_LCASE"), T.ArrayType(T.StringType("UTF8_LCASE"), False))),
            T.StructField("n", T.LongType()),
        ]
    )
    plain = binary(nested)
    assert not collated(plain) and collated(nested)
    assert plain == T.StructType(
        [
            T.StructField("a", T.StringType(), False),
            T.StructField("m", T.MapType(T.StringType(), T.ArrayType(T.StringType(), False))),
            T.StructField("n", T.LongType()),
        ]
    )
