"""Bad input is refused with a clear error before any commit, and the table is left unchanged.

Each case runs twice: as a bounded ``sink.write(df)`` and as a stream through ``sink.start(...)``
(schema errors surface in ``start()`` itself, row errors fail the query). After each, the table's
metadata file (and so its snapshots, refs and schema) is the one it had before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, IcebergSinkError, InvalidInputError, SchemaMismatchError

TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "amount", DecimalType(10, 2)),
    NestedField(4, "ts", TimestamptzType()),
    NestedField(5, "local_ts", TimestampType()),
    NestedField(6, "score", DoubleType()),
    NestedField(7, "s", StructType(NestedField(8, "c", LongType(), required=True))),
)


def good(df: DataFrame) -> DataFrame:
    """A DataFrame that fits TABLE, built on ``df``'s non-null ``id`` column."""
    return df.select(
        F.col("id"),
        F.concat(F.lit("n-"), F.col("id").cast("string")).alias("name"),
        (F.col("id").cast("decimal(8,2)") / F.lit(4)).cast("decimal(10,2)").alias("amount"),
        F.timestamp_seconds(F.col("id") * F.lit(3600)).alias("ts"),
        F.timestamp_seconds(F.col("id") * F.lit(3600)).cast("timestamp_ntz").alias("local_ts"),
        (F.col("id") / F.lit(3)).alias("score"),
    )


def replace(column: str, expr: str) -> Callable[[DataFrame], DataFrame]:
    return lambda df: good(df).withColumn(column, F.expr(expr))


# (id, build the bad DataFrame from a base with a non-null long `id`, error type, message pattern)
APPEND_CASES: list[tuple[str, Callable[[DataFrame], DataFrame], type[Exception], str]] = [
    (
        "wrong-type",
        replace("name", "id"),
        SchemaMismatchError,
        r"name: table type string cannot take DataFrame type long",
    ),
    (
        "missing-required",
        lambda df: good(df).drop("id"),
        SchemaMismatchError,
        r"id: column is required in the table but missing from the DataFrame",
    ),
    (
        "nullable-into-required",
        replace("id", "case when id > 0 then id end"),
        SchemaMismatchError,
        r"id: column is required \(not null\) in the table but nullable in the DataFrame",
    ),
    (
        "null-nested-into-required",
        lambda df: good(df).withColumn("s", F.struct(F.when(F.col("id") > 0, F.col("id")).alias("c"))),
        SchemaMismatchError,
        r"s\.c: column is required \(not null\) in the table but nullable",
    ),
    (
        "extra-column",
        lambda df: good(df).withColumn("extra", F.col("id")),
        SchemaMismatchError,
        r"extra: column is not in the table; this sink does not change the table's schema",
    ),
    (
        "decimal-overflow",
        replace("amount", "cast(id as decimal(12,2))"),
        SchemaMismatchError,
        r"amount: table type decimal\(10, 2\) cannot take DataFrame type decimal\(12, 2\)",
    ),
    (
        "decimal-scale",
        replace("amount", "cast(id as decimal(10,3))"),
        SchemaMismatchError,
        r"amount: table type decimal\(10, 2\) cannot take DataFrame type decimal\(10, 3\)",
    ),
    (
        "timestamp-with-zone-into-without",
        replace("local_ts", "timestamp_seconds(id)"),
        SchemaMismatchError,
        r"local_ts: table type timestamp cannot take DataFrame type timestamptz \(cast the column to TimestampNTZType",
    ),
    (
        "timestamp-without-zone-into-with",
        replace("ts", "cast(timestamp_seconds(id) as timestamp_ntz)"),
        SchemaMismatchError,
        r"ts: table type timestamptz cannot take DataFrame type timestamp \(cast the column to TimestampType",
    ),
    (
        "names-differ-in-case",
        lambda df: good(df).withColumnRenamed("name", "Name"),
        SchemaMismatchError,
        r"Name: column is not in the table \(the table has 'name': names are case sensitive\)",
    ),
    (
        "untyped-null",
        replace("name", "null"),
        SchemaMismatchError,
        r"name: column has Spark type void \(an untyped null\), which Iceberg cannot store; "
        r"cast it to the table's type string",
    ),
    (
        "invalid-utf8",  # Spark strings may hold any bytes; DuckDB cannot read a table holding them
        replace("name", "case when id = 1 then cast(unhex('C328') as string) else 'ok' end"),
        InvalidInputError,
        r"table db\.t was not written: column 'name' holds a string that is not valid UTF-8 \(.*Invalid UTF8",
    ),
    (
        "zero-columns",
        lambda df: df.select(),
        SchemaMismatchError,
        r"the DataFrame has no columns; expected columns of table db\.t: id, name, amount",
    ),
    (
        "empty-with-bad-schema",
        lambda df: good(df).where(F.col("id") < 0).withColumn("name", F.col("id")),
        SchemaMismatchError,
        r"name: table type string cannot take DataFrame type long",
    ),
]


def _unchanged(sink: IcebergSink) -> tuple[str, list[int]]:
    table = sink.load_table()
    return table.metadata_location, [s.snapshot_id for s in table.snapshots()]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-input")


@pytest.fixture(scope="module")
def append_sink(spark: SparkSession, lake: Path) -> IcebergSink:
    sink = IcebergSink.builder().embedded(lake / "lake").table("db.t").create_if_missing().build()
    catalog = sink.config.catalog.load()
    catalog.create_namespace("db")
    catalog.create_table("db.t", TABLE)
    sink.write(good(spark.range(0, 3)))
    assert len(sink.load_table().snapshots()) == 1
    return sink


def _ids_stream(spark: SparkSession, directory: Path) -> DataFrame:
    """A file stream of ids 0..2 whose ``id`` is non-null, like ``spark.range``'s."""
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([0, 1, 2], pa.int64())}), directory / "part-0.parquet")
    raw = spark.readStream.schema("id long").parquet(str(directory))
    return raw.select(F.coalesce(F.col("id"), F.lit(0)).alias("id"))


def _refused_by_stream(sink: IcebergSink, df: DataFrame, checkpoint: Path, error: type[Exception]) -> str:
    """Start the stream; return the error text, raised by start() or by the query."""
    try:
        query = sink.start(df, str(checkpoint), trigger={"availableNow": True})
    except IcebergSinkError as e:
        assert isinstance(e, error)
        return str(e)
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(300)
    return str(info.value)


@pytest.mark.parametrize(("case", "make", "error", "message"), APPEND_CASES, ids=[c[0] for c in APPEND_CASES])
def test_bad_append_input_is_refused_and_the_table_unchanged(
    spark: SparkSession,
    append_sink: IcebergSink,
    tmp_path: Path,
    case: str,
    make: Callable[[DataFrame], DataFrame],
    error: type[Exception],
    message: str,
) -> None:
    before = _unchanged(append_sink)
    with pytest.raises(error, match=message) as info:
        append_sink.write(make(spark.range(0, 3)))
    assert "db.t" in str(info.value)  # names the table
    assert _unchanged(append_sink) == before
    text = _refused_by_stream(append_sink, make(_ids_stream(spark, tmp_path / "src")), tmp_path / "ckpt", error)
    assert _matches(message, text), text
    assert _unchanged(append_sink) == before


def _matches(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


# -- upsert / CDC ----------------------------------------------------------------------------------

CHANGES_DDL = "id long, v string, op string"


@pytest.fixture(scope="module")
def cdc_sink(spark: SparkSession, lake: Path) -> IcebergSink:
    sink = (
        IcebergSink.builder()
        .embedded(lake / "cdc")
        .table("db.c")
        .create_if_missing()
        .cdc(op_column="op", key=["id"])
        .build()
    )
    sink.write(spark.createDataFrame([(1, "a", "I"), (2, "b", "I")], CHANGES_DDL))
    return sink


CDC_CASES: list[tuple[str, list[tuple[Any, ...]], type[Exception], str]] = [
    (
        "unknown-op-code",
        [(1, "x", "U"), (3, "y", "X")],
        InvalidInputError,
        r"checkpoint \d+ of table db\.c was not written: unknown operation code 'X' in column 'op'; "
        r"expected one of I, insert.*row key: id=3",
    ),
    ("null-op-code", [(3, "y", None)], InvalidInputError, r"unknown operation code 'null' in column 'op'"),
    (
        "null-key",
        [(1, "x", "U"), (None, "y", "I")],
        InvalidInputError,
        r"table db\.c was not written: a key column is null \(id must all be set\)",
    ),
]


@pytest.mark.parametrize(("case", "rows", "error", "message"), CDC_CASES, ids=[c[0] for c in CDC_CASES])
def test_bad_change_rows_are_refused_and_the_table_unchanged(
    spark: SparkSession,
    cdc_sink: IcebergSink,
    tmp_path: Path,
    case: str,
    rows: list[tuple[Any, ...]],
    error: type[Exception],
    message: str,
) -> None:
    before = _unchanged(cdc_sink)
    with pytest.raises(error, match=message):
        cdc_sink.write(spark.createDataFrame(rows, CHANGES_DDL))
    assert _unchanged(cdc_sink) == before
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(
        pa.Table.from_pylist(
            [dict(zip(("id", "v", "op"), r, strict=True)) for r in rows],
            pa.schema([("id", pa.int64()), ("v", pa.string()), ("op", pa.string())]),
        ),
        src / "part-0.parquet",
    )
    text = _refused_by_stream(
        cdc_sink, spark.readStream.schema(CHANGES_DDL).parquet(str(src)), tmp_path / "ckpt", error
    )
    assert _matches(message, text), text
    assert _unchanged(cdc_sink) == before


def test_missing_op_column_and_key_are_refused(spark: SparkSession, cdc_sink: IcebergSink, tmp_path: Path) -> None:
    before = _unchanged(cdc_sink)
    df = spark.createDataFrame([(1, "a", "I")], CHANGES_DDL)
    with pytest.raises(
        SchemaMismatchError, match=r"op: the operation column given to .cdc\(op_column=...\) is missing"
    ):
        cdc_sink.write(df.drop("op"))
    with pytest.raises(SchemaMismatchError, match=r"id: column is required in the table but missing"):
        cdc_sink.write(df.drop("id"))
    assert _unchanged(cdc_sink) == before


# -- creating a table from a bad DataFrame ---------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda df: df.select(), r"the DataFrame has no columns; a table needs at least one"),
        (
            lambda df: df.select(F.col("id"), F.col("id").alias("ID")),
            r"columns 'id' and 'ID' differ only in case",
        ),
        (
            lambda df: df.select(F.col("id"), F.struct(F.col("id").alias("a"), F.col("id").alias("A")).alias("s")),
            r"columns 's\.a' and 's\.A' differ only in case",
        ),
        (lambda df: df.select(F.col("id"), F.lit(None).alias("x")), r"x: column has Spark type void"),
    ],
    ids=["zero-columns", "case-only", "nested-case-only", "untyped-null"],
)
def test_a_table_is_not_created_from_a_bad_dataframe(
    spark: SparkSession, tmp_path: Path, make: Callable[[DataFrame], DataFrame], message: str
) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.new").create_if_missing().build()
    spark.conf.set("spark.sql.caseSensitive", "true")  # lets Spark build the case-only DataFrames at all
    try:
        df = make(spark.range(0, 3))
        with pytest.raises(SchemaMismatchError, match=message):
            sink.write(df)
    finally:
        spark.conf.unset("spark.sql.caseSensitive")
    with pytest.raises(IcebergSinkError, match="does not exist yet"):
        sink.load_table()


def test_empty_dataframes_commit_nothing(spark: SparkSession, append_sink: IcebergSink, tmp_path: Path) -> None:
    before = _unchanged(append_sink)
    assert append_sink.write(good(spark.range(0, 0))) is None
    query = append_sink.start(
        good(_ids_stream(spark, tmp_path / "src").where(F.col("id") < 0)),
        str(tmp_path / "ckpt"),
        {"availableNow": True},
    )
    query.awaitTermination(300)
    assert query.exception() is None
    assert _unchanged(append_sink) == before


def test_missing_optional_partition_source_column_is_null(spark: SparkSession, tmp_path: Path) -> None:
    # Valid input: a missing optional column is null, also when a partition field reads it (the
    # distribution once failed with Spark's UNRESOLVED_COLUMN).
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.p")
        .create_if_missing(partition_by=["name", "bucket(2, id)"])
        .distribution_mode("range")
        .build()
    )
    sink.write(spark.range(0, 2).select(F.col("id"), F.when(F.col("id") >= 0, F.lit("a")).alias("name")))
    sink.write(spark.range(2, 4))
    rows = sorted(sink.load_table().scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 0, "name": "a"}, {"id": 1, "name": "a"}, {"id": 2, "name": None}, {"id": 3, "name": None}]


@pytest.mark.parametrize("metrics", ["full", "none"])
def test_invalid_utf8_at_any_depth_is_refused_even_without_column_metrics(
    spark: SparkSession, tmp_path: Path, metrics: str
) -> None:
    """Before, a batch with such a string failed only by accident, decoding the column's bounds
    (UnicodeDecodeError in a writer task, reported as a failed disk would be); with column metrics off
    (``write.metadata.metrics.default=none``) it was committed, and DuckDB could no longer read the
    table. Nested strings (list elements, map keys and values, struct fields) count too."""
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.n").create_if_missing().build()
    catalog = sink.config.catalog.load()
    catalog.create_namespace("db")
    sink.write(
        spark.createDataFrame(
            [(0, ["a"], {"k": "v"}, ("x",))], "id long, tags array<string>, m map<string,string>, s struct<t: string>"
        )
    )
    catalog.load_table("db.n").transaction().set_properties(
        {"write.metadata.metrics.default": metrics}
    ).commit_transaction()
    bad = "cast(unhex('C328') as string)"
    for column, expr in [
        ("tags", f"array('ok', {bad})"),
        ("m", f"map({bad}, 'v')"),
        ("m", f"map('k', {bad})"),
        ("s", f"named_struct('t', {bad})"),
    ]:
        df = spark.sql("select 1L as id, array('a') as tags, map('k', 'v') as m, named_struct('t', 'x') as s")
        df = df.withColumn(column, F.expr(expr))
        before = _unchanged(sink)
        with pytest.raises(InvalidInputError, match=rf"column '{column}' holds a string that is not valid UTF-8"):
            sink.write(df)
        assert _unchanged(sink) == before
