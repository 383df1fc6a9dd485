"""Column bounds of multi-row-group files, as Iceberg Java and DuckDB use them to prune files.

One file holds two row groups; the first has a string and a binary value longer than Arrow's
statistics size limit, so its Parquet row-group statistics carry no min/max. The file's Iceberg
bounds must still cover both row groups: a filtered read for a value of either row group returns
its rows, and the upsert's new-key proof does not take an existing key for a new one.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from iceberg_sink import IcebergSink
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop
UTC = dt.UTC
LONG = "a" * 5000
LONG_BIN = b"\x00" + b"\xff" * 4999

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("i", T.IntegerType()),
        T.StructField("f", T.FloatType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("dec", T.DecimalType(10, 2)),
        T.StructField("dt", T.DateType()),
        T.StructField("ts", T.TimestampType()),
        T.StructField("tsn", T.TimestampNTZType()),
        T.StructField("s", T.StringType()),
        T.StructField("b", T.BinaryType()),
        T.StructField("flag", T.BooleanType()),
        T.StructField(
            "st",
            T.StructType(
                [
                    T.StructField("x", T.StringType()),
                    T.StructField("y", T.DoubleType()),
                    T.StructField("z", T.IntegerType()),
                ]
            ),
        ),
    ]
)
# Row groups of two rows: ids 0-1, then 2-3 (ids 4-5 with nulls only, a third row group).
ROWS = [
    (0, -(2**31), math.nan, 0.0, Decimal("-99999999.99"), dt.date(1969, 12, 31),
     dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59),
     LONG, LONG_BIN, False, (LONG, math.nan, -5)),
    (1, None, -1.5, -0.0, None, None, None, None, "b", b"\x01", None, None),
    (2, 7, 2.5, 1e300, Decimal("0.01"), dt.date(2024, 2, 29),
     dt.datetime(2024, 2, 29, 1, 2, 3, 456789, tzinfo=UTC), dt.datetime(2024, 2, 29, 1, 2, 3, 456789),
     "m", b"\x50", True, ("m", 0.0, None)),
    (3, 8, None, 2.0, Decimal("12.34"), dt.date(2024, 3, 1),
     dt.datetime(2024, 3, 1, tzinfo=UTC), dt.datetime(2024, 3, 1),
     "n", b"\x60", True, ("n", 3.0, 9)),
    (4, None, None, math.nan, None, None, None, None, None, None, None, None),
    (5, None, None, None, None, None, None, None, None, None, None, (None, None, None)),
]  # fmt: skip

# (Spark SQL predicate for Java, DuckDB predicate, ids it selects)
FILTERS: list[tuple[str, str, list[int]]] = [
    ("s = 'b'", "s = 'b'", [1]),
    (f"s = '{LONG}'", f"s = '{LONG}'", [0]),
    ("s = 'm'", "s = 'm'", [2]),
    ("s < 'b'", "s < 'b'", [0]),
    ("b = X'01'", "b = '\\x01'::BLOB", [1]),
    ("b = X'50'", "b = '\\x50'::BLOB", [2]),
    ("b < X'01'", "b < '\\x01'::BLOB", [0]),
    ("st.x = 'm'", "st.x = 'm'", [2]),
    ("st.x < 'b'", "st.x < 'b'", [0]),
    ("st.y = 3.0", "st.y = 3.0", [3]),
    ("st.y = 0.0", "st.y = 0.0", [2]),
    ("st.z = -5", "st.z = -5", [0]),
    ("st.z = 9", "st.z = 9", [3]),
    ("i = -2147483648", "i = -2147483648", [0]),
    ("i = 8", "i = 8", [3]),
    ("f = -1.5", "f = -1.5", [1]),
    ("f = 2.5", "f = 2.5", [2]),
    # Both zeros share a row group; for Spark (and DuckDB) -0.0 = 0.0, so both rows come back.
    ("d = CAST('-0.0' AS DOUBLE)", "d = '-0.0'::DOUBLE", [0, 1]),
    ("isnan(d)", "isnan(d)", [4]),
    ("d = 1e300", "d = 1e300", [2]),
    ("dec = -99999999.99", "dec = -99999999.99", [0]),
    ("dec = 12.34", "dec = 12.34", [3]),
    ("dt = DATE'1969-12-31'", "dt = DATE '1969-12-31'", [0]),
    ("dt = DATE'2024-03-01'", "dt = DATE '2024-03-01'", [3]),
    (
        "ts = TIMESTAMP'1969-12-31 23:59:59+00:00'",
        "ts = TIMESTAMPTZ '1969-12-31 23:59:59+00'",
        [0],
    ),
    (
        "ts = TIMESTAMP'2024-02-29 01:02:03.456789+00:00'",
        "ts = TIMESTAMPTZ '2024-02-29 01:02:03.456789+00'",
        [2],
    ),
    ("tsn = TIMESTAMP_NTZ'1969-12-31 23:59:59'", "tsn = TIMESTAMP '1969-12-31 23:59:59'", [0]),
    ("tsn = TIMESTAMP_NTZ'2024-03-01 00:00:00'", "tsn = TIMESTAMP '2024-03-01 00:00:00'", [3]),
    ("flag = false", "flag = false", [0]),
    ("id = 1", "id = 1", [1]),
    ("s is null", "s is null", [4, 5]),
]


@pytest.fixture(scope="module")
def one_file(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The metadata location of a table whose only data file has three row groups."""
    tmp = tmp_path_factory.mktemp("bounds")
    sink = (
        IcebergSink.builder()
        .embedded(tmp / "lake")
        .table("db.bounds")
        .create_if_missing()
        .write_option("write.parquet.row-group-limit", 2)
        .build()
    )
    sink.write(spark.createDataFrame(ROWS, SCHEMA).coalesce(1))
    table = sink.load_table()
    files = table.inspect.files()
    assert files.num_rows == 1
    path = files.column("file_path")[0].as_py().removeprefix("file://")
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 3
    # The premise: Arrow wrote no min/max for the long values' row group.
    s_column = [metadata.schema.column(i).path for i in range(metadata.num_columns)].index("s")
    assert not metadata.row_group(0).column(s_column).statistics.has_min_max
    yield table.metadata_location


@pytest.mark.parametrize(("java_where", "duckdb_where", "ids"), FILTERS, ids=[f[0][:40] for f in FILTERS])
def test_filtered_reads_find_rows_of_every_row_group(
    one_file: str, java_reader: JavaIcebergReader, java_where: str, duckdb_where: str, ids: list[int]
) -> None:
    assert sorted(java_reader.read(one_file, where=java_where).column("id").to_pylist()) == ids
    assert sorted(duckdb_read(one_file, where=duckdb_where).column("id").to_pylist()) == ids


def test_unfiltered_reads_return_every_row(one_file: str, java_reader: JavaIcebergReader) -> None:
    assert sorted(java_reader.read(one_file).column("id").to_pylist()) == list(range(6))
    assert sorted(duckdb_read(one_file).column("id").to_pylist()) == list(range(6))


def test_upsert_of_a_key_in_a_row_group_without_statistics_replaces_it(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """A key whose row group has no Parquet min/max is not 'provably new': its update deletes the old row."""
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")  # one writer task: every key in one file
    try:
        sink = (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.kv")
            .create_if_missing()
            .upsert(key=["k"])
            .write_option("write.parquet.row-group-limit", 1)
            .build()
        )
        ddl = "k string, v long"
        sink.write(spark.createDataFrame([(LONG, 0), ("b", 0), ("m", 0), ("n", 0)], ddl))
        assert sink.load_table().inspect.files().num_rows == 1
        sink.write(spark.createDataFrame([(LONG, 1)], ddl))
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    location = sink.load_table().metadata_location
    expected = [{"k": k, "v": 1 if k == LONG else 0} for k in (LONG, "b", "m", "n")]
    assert normalize(java_reader.read(location), ["k"]) == normalize_rows(expected)
    assert normalize(duckdb_read(location), ["k"]) == normalize_rows(expected)


def normalize_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return sorted(rows, key=lambda r: str(r["k"]))


# One file per row; truncate(2) cuts each value, so the upper bound is rounded up at the boundaries
# of Java's UnicodeUtil.truncateStringMax and BinaryUtil.truncateBinaryMax.
TRUNCATION_ROWS = [
    (0, "\ud7ff\ud7ffx", b"\xfe\xff\x00"),  # upper bounds "\ud7ff\ue000" (skips surrogates) and b"\xff"
    (1, "a\U0010ffffx", b"\x01\xff\xff\x7a"),  # U+10FFFF / 0xFF carry: upper bounds "b" and b"\x02"
    (2, "\U0010ffff\U0010ffffx", b"\xff\xff\x01"),  # nothing can be rounded up: no upper bound
    (3, "\ue000", b"\x00"),
]


@pytest.fixture(scope="module")
def truncated(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The metadata location of a truncate(2) table with one file per row of TRUNCATION_ROWS."""
    tmp = tmp_path_factory.mktemp("truncation")
    sink = (
        IcebergSink.builder()
        .embedded(tmp / "lake")
        .table("db.trunc")
        .create_if_missing(properties={"write.metadata.metrics.default": "truncate(2)"})
        .build()
    )
    for r in TRUNCATION_ROWS:
        sink.write(spark.createDataFrame([r], "id long, s string, b binary"))
    table = sink.load_table()
    assert table.inspect.files().num_rows == len(TRUNCATION_ROWS)
    return table.metadata_location


@pytest.mark.parametrize("row", TRUNCATION_ROWS, ids=[str(r[0]) for r in TRUNCATION_ROWS])
def test_truncated_upper_bounds_at_unicode_and_byte_boundaries(
    truncated: str, java_reader: JavaIcebergReader, row: tuple[int, str, bytes]
) -> None:
    row_id, s, b = row
    for where in (f"s = '{s}'", f"s >= '{s}' and s <= '{s}'"):
        assert java_reader.read(truncated, where=where).column("id").to_pylist() == [row_id], where
        assert duckdb_read(truncated, where=where).column("id").to_pylist() == [row_id], where
    assert java_reader.read(truncated, where=f"b = X'{b.hex()}'").column("id").to_pylist() == [row_id]
    blob = "".join(f"\\x{byte:02X}" for byte in b)
    assert duckdb_read(truncated, where=f"b = '{blob}'::BLOB").column("id").to_pylist() == [row_id]
