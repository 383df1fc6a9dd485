"""Appends written by Spark's own Parquet writer (writer/jvm.py), read back by Iceberg Java and DuckDB.

The partition values Spark computes must be exactly Iceberg's (a wrong bucket or day puts rows in a
partition readers prune away), the footer metrics must never exclude a matching row (filtered Java
reads), and whatever the JVM path cannot prove equivalent must fall back to the Arrow writer.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import DateType, IntegerType, LongType, NestedField, TimestamptzType
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg import files
from iceberg_sink.table.partitioning import build_spec, parse_terms
from iceberg_sink.writer import jvm
from tests.integration.test_interop import FILTERS, typed_rows
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop
UTC = dt.UTC
JVM_FOLDER = "/data/iceberg-sink-"


def _data_paths(sink: IcebergSink) -> list[str]:
    table = sink.load_table()
    return [task.file.file_path for task in table.scan().plan_files()]


# -- partition values ------------------------------------------------------------------------------

_LONGS = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**63), 34, 1_234_567_890_123]
_DATES = [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(2017, 11, 16), dt.date(1, 1, 1), dt.date(9999, 12, 31)]
_TIMES = [
    dt.datetime(1970, 1, 1, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    dt.datetime(2017, 11, 16, 22, 31, 8, tzinfo=UTC),
    dt.datetime(2024, 2, 29, 0, 0, 0, 1, tzinfo=UTC),
    dt.datetime(2262, 4, 11, 23, 47, 16, 854_775, tzinfo=UTC),
    dt.datetime(1677, 9, 21, 0, 12, 43, 145_225, tzinfo=UTC),
]


def test_partition_values_equal_iceberg_transforms(spark: SparkSession) -> None:
    longs = _LONGS + [(i * 2_654_435_761) % 2**64 - 2**63 for i in range(300)]
    ints = [v for v in longs if -(2**31) <= v < 2**31] + [7, -7, 123_456]
    n = max(len(longs), len(ints), len(_DATES), len(_TIMES)) + 1

    def pad(values: list[Any]) -> list[Any]:
        return values + [None] * (n - len(values))  # nulls too: their partition value is null

    data = pa.table(
        {
            "l": pa.array(pad(longs), pa.int64()),
            "i": pa.array(pad(ints), pa.int32()),
            "d": pa.array(pad(_DATES), pa.date32()),
            "t": pa.array(pad(_TIMES), pa.timestamp("us", tz="UTC")),
            # truncate(W) of a value within W of the type's minimum overflows (Java wraps around,
            # PyIceberg leaves the type's range, Spark in ANSI mode fails the write): not compared.
            "ls": pa.array(pad([v for v in longs if v > -(2**63) + 100]), pa.int64()),
            "is": pa.array(pad([v for v in ints if v > -(2**31) + 100]), pa.int32()),
        }
    )
    schema = Schema(
        NestedField(1, "l", LongType()),
        NestedField(2, "i", IntegerType()),
        NestedField(3, "d", DateType()),
        NestedField(4, "t", TimestamptzType()),
        NestedField(5, "ls", LongType()),
        NestedField(6, "is", IntegerType()),
    )
    terms = [
        ("bucket(16, l)", "l", BucketTransform(16)),
        ("bucket(7, i)", "i", BucketTransform(7)),
        ("bucket(1000, d)", "d", BucketTransform(1000)),
        ("bucket(3, t)", "t", BucketTransform(3)),
        ("truncate(10, ls)", "ls", TruncateTransform(10)),
        ("truncate(3, is)", "is", TruncateTransform(3)),
        ("identity(i)", "i", IdentityTransform()),
        ("identity(d)", "d", IdentityTransform()),
        ("day(t)", "t", DayTransform()),
        ("hour(t)", "t", HourTransform()),
        ("month(t)", "t", MonthTransform()),
        ("year(t)", "t", YearTransform()),
        ("month(d)", "d", MonthTransform()),
        ("year(d)", "d", YearTransform()),
    ]
    spec = build_spec(parse_terms([t for t, _, _ in terms]), schema)
    writer_spec = _spec_for(schema, spec)
    df = spark.createDataFrame(
        [tuple(r.values()) for r in data.to_pylist()], "l long, i int, d date, t timestamp, ls long, `is` int"
    )
    out, names = jvm.partition_columns(df, writer_spec)
    got_rows = out.select("l", *names).collect()
    got = {c: [r[c] for r in got_rows] for c in ["l", *names]}
    transformed = [
        transform.pyarrow_transform(schema.find_field(column).field_type)(
            data.column(column).combine_chunks()
        ).to_pylist()
        for _, column, transform in terms
    ]
    expected = [files.partition_values(spec, schema, row) for row in zip(*transformed, strict=True)]
    source_rows = data.to_pylist()
    assert len(got_rows) == len(source_rows)
    # Spark keeps the row order of a local DataFrame through projections; the source columns are
    # compared too, so a reordering fails loudly instead of comparing the wrong rows.
    assert got["l"] == [r["l"] for r in source_rows]
    for k, (text, _, _) in enumerate(terms):
        observed = got[names[k]]
        wanted = [row[k] for row in expected]
        mismatches = [(i, w, o) for i, (w, o) in enumerate(zip(wanted, observed, strict=True)) if w != o]
        assert not mismatches, f"{text}: (row, iceberg, spark) {mismatches[:5]}"


def _spec_for(schema: Schema, spec: Any) -> Any:
    from iceberg_sink.writer.spec import WriterSpec

    return WriterSpec(
        table_name="t",
        location="file:///nowhere",
        schema_json=schema.model_dump_json(),
        spec_json=spec.model_dump_json(),
        io_properties={},
        writer_properties={},
        job_id="job",
        checkpoint_id=0,
        target_file_size=1 << 30,
        buffer_bytes=1 << 24,
        row_group_limit=1 << 20,
        compression="zstd",
        compression_level=-1,
    )


# -- typed tables read back ------------------------------------------------------------------------


def _wide_rows(start: int, n: int) -> pa.Table:
    """typed_rows plus a long non-ASCII text column and all-null and mostly-null columns."""
    base = typed_rows(start, n)
    ids = range(start, start + n)
    text = [None if i % 11 == 0 else ("Zürich·東京·🚀" * (1 + i % 5)) + f"-{i}" + ("x" * (i % 40)) for i in ids]
    return (
        base.append_column("text", pa.array(text, pa.string()))
        .append_column("nothing", pa.nulls(n, pa.int64()))
        .append_column("big", pa.array([Decimal(i) * Decimal("123456789.000001") for i in ids], pa.decimal128(20, 6)))
    )


@pytest.fixture(scope="module")
def jvm_written(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[IcebergSink, pa.Table]:
    """A bounded write and two streamed micro-batches, partitioned by day, bucket and truncate."""
    tmp = tmp_path_factory.mktemp("jvm")
    bounded, streamed = _wide_rows(0, 300), [_wide_rows(300, 90), _wide_rows(390, 90)]
    pq.write_table(bounded, tmp / "bounded.parquet")
    (tmp / "src").mkdir()
    for i, t in enumerate(streamed):
        pq.write_table(t, tmp / "src" / f"part-{i}.parquet")
    sink = (
        IcebergSink.builder()
        .embedded(tmp / "data")
        .table("db.typed")
        .create_if_missing(partition_by=["day(ts)", "bucket(3, id)", "truncate(100, small)"])
        .write_option("write.parquet.row-group-limit", 50)  # several row groups per file
        .write_option("iceberg-sink.writer.jvm-parquet", True)
        .build()
    )
    sink.write(spark.read.parquet(str(tmp / "bounded.parquet")))
    schema = spark.read.parquet(str(tmp / "bounded.parquet")).schema
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(tmp / "src"))
    query = sink.start(df, str(tmp / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    return sink, pa.concat_tables([bounded, *streamed])


def test_typed_table_is_written_by_spark(jvm_written: tuple[IcebergSink, pa.Table]) -> None:
    sink, _ = jvm_written
    paths = _data_paths(sink)
    assert len(paths) > 20
    assert all(JVM_FOLDER in p for p in paths), paths[:3]


def test_every_reader_returns_the_input(
    jvm_written: tuple[IcebergSink, pa.Table], java_reader: JavaIcebergReader
) -> None:
    sink, expected_table = jvm_written
    location = sink.load_table().metadata_location
    expected = normalize(expected_table, ["id"])
    assert normalize(java_reader.read(location), ["id"]) == expected
    assert normalize(duckdb_read(location), ["id"]) == expected


_MORE_FILTERS: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
    (
        "text like 'Zürich·東京·🚀Zürich%'",
        lambda r: r["text"] is not None and r["text"].startswith("Zürich·東京·🚀Zürich"),
    ),
    ("text is null", lambda r: r["text"] is None),
    ("big > 40000000000.0", lambda r: r["big"] > Decimal("40000000000")),
    ("nothing is null and id < 5", lambda r: r["id"] < 5),
]


@pytest.mark.parametrize(("predicate", "keep"), FILTERS + _MORE_FILTERS, ids=[f[0] for f in FILTERS + _MORE_FILTERS])
def test_filtered_java_reads_equal_filtering_the_input(
    jvm_written: tuple[IcebergSink, pa.Table],
    java_reader: JavaIcebergReader,
    predicate: str,
    keep: Callable[[dict[str, Any]], bool],
) -> None:
    sink, expected_table = jvm_written
    expected_rows = [r for r in expected_table.to_pylist() if keep(r)]
    assert expected_rows, f"filter {predicate} selects nothing: the test would prove nothing"
    expected = normalize(pa.Table.from_pylist(expected_rows, schema=expected_table.schema), ["id"])
    got = java_reader.read(sink.load_table().metadata_location, where=predicate)
    assert normalize(got, ["id"]) == expected


def test_java_sees_one_append_per_checkpoint(
    jvm_written: tuple[IcebergSink, pa.Table], java_reader: JavaIcebergReader
) -> None:
    sink, _ = jvm_written
    snapshots = java_reader.snapshots(sink.load_table().metadata_location).to_pylist()
    summaries = [json.loads(s["summary"]) if isinstance(s["summary"], str) else dict(s["summary"]) for s in snapshots]
    assert [s["operation"] for s in snapshots] == ["append"] * 3
    assert [int(s["added-records"]) for s in summaries] == [300, 90, 90]


# -- fallbacks, evolution, failures ----------------------------------------------------------------


def test_nested_structs_fall_back_to_the_arrow_writer(spark: SparkSession, tmp_path: Path) -> None:
    rows = pa.table(
        {
            "id": pa.array(range(50), pa.int64()),
            "who": pa.array(
                [None if i % 7 == 0 else {"name": f"n{i}", "age": i % 90} for i in range(50)],
                pa.struct([("name", pa.string()), ("age", pa.int32())]),
            ),
        }
    )
    pq.write_table(rows, tmp_path / "in.parquet")
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.nested")
        .create_if_missing()
        .write_option("iceberg-sink.writer.jvm-parquet", True)
        .build()
    )
    sink.write(spark.read.parquet(str(tmp_path / "in.parquet")))
    assert not any(JVM_FOLDER in p for p in _data_paths(sink))
    location = sink.load_table().metadata_location
    assert normalize(duckdb_read(location), ["id"]) == normalize(rows, ["id"])


def test_a_column_taking_its_write_default_falls_back_to_the_arrow_writer() -> None:
    """Format v3 default values are filled in one place, the Arrow writers' conform step: Spark's
    Parquet writer would write the missing column as nulls, so it is not used for such a write."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyspark.sql import types as T

    from iceberg_sink.vocab.distribution import DistributionMode

    schema = Schema(
        NestedField(1, "id", LongType()), NestedField(2, "c", IntegerType(), initial_default=7, write_default=9)
    )
    spec = _spec_for(schema, UNPARTITIONED_PARTITION_SPEC)
    only_id = T.StructType([T.StructField("id", T.LongType())])
    both = T.StructType([*only_id.fields, T.StructField("c", T.IntegerType())])
    reason = jvm.unsupported(spec, only_id, DistributionMode.NONE)
    assert reason == "column c is not in the input and takes its write-default"
    assert jvm.unsupported(spec, both, DistributionMode.NONE) is None


def test_renamed_column_is_written_by_field_id(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    first = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", None]})
    pq.write_table(first, tmp_path / "first.parquet")
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.evolved")
        .create_if_missing(["bucket(4, id)"])
        .write_option("iceberg-sink.writer.jvm-parquet", True)
        .build()
    )
    sink.write(spark.read.parquet(str(tmp_path / "first.parquet")))
    table = sink.load_table()
    with table.update_schema() as update:
        update.rename_column("name", "label")
        update.add_column("score", IntegerType())
    second = pa.table(
        {"id": pa.array([4, 5], pa.int64()), "label": ["d", "é"], "score": pa.array([10, None], pa.int32())}
    )
    pq.write_table(second, tmp_path / "second.parquet")
    sink.write(spark.read.parquet(str(tmp_path / "second.parquet")))
    assert all(JVM_FOLDER in p for p in _data_paths(sink))
    expected = [
        {"id": 1, "label": "a", "score": None},
        {"id": 2, "label": "b", "score": None},
        {"id": 3, "label": None, "score": None},
        {"id": 4, "label": "d", "score": 10},
        {"id": 5, "label": "é", "score": None},
    ]
    location = sink.load_table().metadata_location
    assert normalize(java_reader.read(location), ["id"]) == expected
    assert normalize(duckdb_read(location), ["id"]) == expected
    assert normalize(java_reader.read(location, where="label = 'é'"), ["id"]) == [expected[4]]


def test_a_failed_write_commits_nothing_and_its_retry_commits_once(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    rows = pa.table({"id": pa.array(range(2000), pa.int64()), "v": [f"v{i}" for i in range(2000)]})
    pq.write_table(rows, tmp_path / "in.parquet", row_group_size=500)
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.retry")
        .create_if_missing(["bucket(8, id)"])
        .write_option("iceberg-sink.writer.jvm-parquet", True)
        .build()
    )
    checkpoint = str(tmp_path / "ckpt")
    df = spark.read.parquet(str(tmp_path / "in.parquet"))
    # A task fails after writing part of its rows: the Spark job fails, the checkpoint is not committed.
    failing = df.withColumn("id", F.when(F.col("id") == 1900, F.raise_error("boom")).otherwise(F.col("id")))
    with pytest.raises(Exception, match="boom"):
        sink.write(failing, checkpoint_location=checkpoint, checkpoint_id=0)
    assert sink.load_table().current_snapshot() is None
    sink.write(df, checkpoint_location=checkpoint, checkpoint_id=0)
    sink.write(df, checkpoint_location=checkpoint, checkpoint_id=0)  # a replay: nothing is written
    location = sink.load_table().metadata_location
    got = duckdb_read(location)
    assert got.num_rows == 2000
    assert sorted(got.column("id").to_pylist()) == list(range(2000))
    assert all(JVM_FOLDER in p for p in _data_paths(sink))


def test_a_string_that_is_not_utf8_is_refused_by_the_jvm_writer_too(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's Parquet writer writes a string's bytes as they are; the JVM path checks each string
    column in the projection, as the Arrow writers do (writer/conform.check_utf8)."""
    from iceberg_sink import InvalidInputError

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.text")
        .create_if_missing()
        .write_option("iceberg-sink.writer.jvm-parquet", True)
        .build()
    )
    good = spark.createDataFrame([(i, f"v{i}") for i in range(20)], "id long, v string")
    sink.write(good)
    assert all(JVM_FOLDER in p for p in _data_paths(sink))  # the JVM path takes this table
    before = sink.load_table().metadata_location
    bad = good.selectExpr("id", "case when id = 7 then cast(unhex('FF') as string) else v end as v")
    with pytest.raises(
        InvalidInputError, match=r"table db\.text was not written: column 'v' holds a string that is not valid UTF-8"
    ):
        sink.write(bad)
    assert sink.load_table().metadata_location == before
    assert sorted(duckdb_read(before).column("id").to_pylist()) == list(range(20))
