"""Streaming and bounded writes on a real local SparkSession, read back by PyIceberg and DuckDB."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, SchemaMismatchError
from tests.integration.sources import EVENT_SCHEMA_DDL, write_source_files
from tests.interop.readers import duckdb_read, normalize, pyiceberg_read


def stream(spark: SparkSession, source: Path, per_trigger: int = 1) -> DataFrame:
    return spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", per_trigger).parquet(str(source))


def builder(catalog_props: dict[str, str], table: str = "db.events") -> Any:
    return IcebergSink.builder().catalog("test", **catalog_props).table(table)


def run_available_now(sink: IcebergSink, df: DataFrame, checkpoint: Path) -> None:
    query = sink.start(df, str(checkpoint), trigger={"availableNow": True})
    query.awaitTermination(600)
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]


def expected_rows(tables: list[pa.Table]) -> list[dict[str, Any]]:
    return normalize(pa.concat_tables(tables), sort_by=["event_id"])


def test_streaming_append_commits_one_snapshot_per_micro_batch(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    tables = write_source_files(tmp_path / "src", files=3, rows_per_file=50)
    sink = builder(catalog_props).create_if_missing(partition_by=["day(ts)"]).build()
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt")
    table = sink.load_table()
    snapshots = table.snapshots()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in snapshots] == ["0", "1", "2"]  # type: ignore[index]
    job_ids = {s.summary["iceberg-sink.job-id"] for s in snapshots}  # type: ignore[index]
    assert len(job_ids) == 1
    assert normalize(pyiceberg_read(table.metadata_location), ["event_id"]) == expected_rows(tables)
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected_rows(tables)

    # Restart from the same checkpoint: nothing new, nothing doubled; then new files continue the job.
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt")
    assert len(sink.load_table().snapshots()) == 3
    tables += write_source_files(tmp_path / "src", files=2, rows_per_file=50, first_file=3)
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt")
    table = sink.load_table()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2", "3", "4"]  # type: ignore[index]
    assert {s.summary["iceberg-sink.job-id"] for s in table.snapshots()} == job_ids  # type: ignore[index]
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected_rows(tables)


def test_new_checkpoint_location_is_a_new_job(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    write_source_files(tmp_path / "src", files=1, rows_per_file=10)
    sink = builder(catalog_props).create_if_missing().build()
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt1")
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt2")
    table = sink.load_table()
    # Same batch id 0 in both, but different jobs: the second is not skipped as a replay.
    assert len({s.summary["iceberg-sink.job-id"] for s in table.snapshots()}) == 2  # type: ignore[index]
    assert table.scan().to_arrow().num_rows == 20


def test_bounded_write_with_every_transform(spark: SparkSession, catalog_props: dict[str, str]) -> None:
    df = spark.range(0, 400).select(
        F.col("id"),
        (F.col("id") % 17).alias("user_id"),
        F.timestamp_seconds(F.lit(1_704_060_000) + F.col("id") * 7_919).alias("ts"),
        F.concat(F.lit("name-"), (F.col("id") % 23).cast("string")).alias("name"),
        (F.col("id") / 8).cast("decimal(10,2)").alias("amount"),
        F.to_date(F.timestamp_seconds(F.lit(1_704_060_000) + F.col("id") * 86_400)).alias("d"),
    )
    sink = (
        builder(catalog_props, "db.bounded")
        .create_if_missing(
            partition_by=["hour(ts)", "bucket(4, user_id)", "truncate(6, name)", "month(d)", "truncate(5, amount)"]
        )
        .build()
    )
    outcome = sink.write(df)
    assert outcome is not None and outcome.snapshot is not None
    table = sink.load_table()
    assert len(table.snapshots()) == 1
    expected = normalize(df.toArrow(), ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected
    # Hash distribution (the default for partitioned tables): one file per partition.
    files = table.inspect.files().to_pylist()
    partitions = [tuple(sorted(f["partition"].items())) for f in files]
    assert len(partitions) == len(set(partitions))


@pytest.mark.parametrize("mode", ["none", "hash", "range"])
def test_distribution_modes_write_the_same_rows(spark: SparkSession, catalog_props: dict[str, str], mode: str) -> None:
    df = spark.range(0, 300).select(F.col("id"), (F.col("id") % 5).alias("k"))
    sink = (
        builder(catalog_props, f"db.dist_{mode}").create_if_missing(partition_by=["k"]).distribution_mode(mode).build()
    )
    sink.write(df.repartition(3))
    table = sink.load_table()
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(300))
    per_partition: dict[int, int] = {}
    for f in table.inspect.files().to_pylist():
        per_partition[f["partition"]["k"]] = per_partition.get(f["partition"]["k"], 0) + 1
    if mode in ("hash", "range"):
        assert set(per_partition.values()) == {1}
    if mode == "range":
        for f in table.inspect.files().to_pylist():
            values = pa.parquet.read_table(f["file_path"].removeprefix("file://"))["id"].to_pylist()  # type: ignore[attr-defined]
            assert values == sorted(values)


def test_empty_batch_creates_no_snapshot(spark: SparkSession, catalog_props: dict[str, str]) -> None:
    sink = builder(catalog_props, "db.empty").create_if_missing().build()
    assert sink.write(spark.range(0, 10).where("id < 0")) is None
    assert sink.load_table().snapshots() == []


def test_schema_mismatch_is_reported_before_anything_is_written(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    sink = builder(catalog_props, "db.strict").create_if_missing().build()
    sink.write(spark.range(0, 5).select(F.col("id"), F.lit("a").alias("v")))
    bad = spark.range(0, 5).select(F.col("id").cast("string").alias("id"), F.lit(1).alias("extra"))
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(bad)
    assert "id: table type long cannot take DataFrame type string" in str(info.value)
    assert "extra: column is not in the table" in str(info.value)
    write_source_files(tmp_path / "src", files=1, rows_per_file=5)
    with pytest.raises(SchemaMismatchError):
        sink.start(stream(spark, tmp_path / "src"), str(tmp_path / "ckpt"))
    table = sink.load_table()
    assert len(table.snapshots()) == 1 and table.scan().to_arrow().num_rows == 5


def test_nullable_column_into_required_column_is_refused_up_front(
    spark: SparkSession, catalog: Any, catalog_props: dict[str, str]
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog.create_namespace("db")
    catalog.create_table(
        "db.req", Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()))
    )
    sink = builder(catalog_props, "db.req").build()
    good = spark.range(0, 3).select(F.col("id"), F.lit("x").alias("v"))
    sink.write(good)
    # Spark marks computed columns nullable: the schema check refuses it before any task runs.
    nullable = spark.range(0, 3).select(F.when(F.col("id") > 0, F.col("id")).alias("id"), F.lit("y").alias("v"))
    with pytest.raises(SchemaMismatchError, match="id: column is required"):
        sink.write(nullable)
    assert sorted(sink.load_table().scan().to_arrow()["id"].to_pylist()) == [0, 1, 2]


def test_two_streams_into_one_table(spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path) -> None:
    a = write_source_files(tmp_path / "a", files=3, rows_per_file=40)
    b = write_source_files(tmp_path / "b", files=3, rows_per_file=40, first_file=100)
    sink = builder(catalog_props, "db.shared").create_if_missing().write_option("commit.retry.min-wait-ms", 10).build()
    errors: list[BaseException] = []

    def run(src: str, ckpt: str) -> None:
        try:
            run_available_now(sink, stream(spark, tmp_path / src), tmp_path / ckpt)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s, c)) for s, c in (("a", "ckpt_a"), ("b", "ckpt_b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    table = sink.load_table()
    jobs: dict[str, list[str]] = {}
    for s in table.snapshots():
        jobs.setdefault(s.summary["iceberg-sink.job-id"], []).append(s.summary["iceberg-sink.checkpoint-id"])  # type: ignore[index]
    assert sorted(jobs.values()) == [["0", "1", "2"], ["0", "1", "2"]]
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected_rows(a + b)


def test_rewound_checkpoint_is_refused_not_silently_skipped(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    write_source_files(tmp_path / "src", files=1, rows_per_file=10)
    sink = builder(catalog_props, "db.rewind").create_if_missing().build()
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt")
    shutil.copytree(tmp_path / "ckpt", tmp_path / "old")
    write_source_files(tmp_path / "src", files=2, rows_per_file=10, first_file=1)
    run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt")
    shutil.copytree(tmp_path / "old", tmp_path / "ckpt")
    write_source_files(tmp_path / "src", files=1, rows_per_file=10, first_file=3)
    with pytest.raises(StreamingQueryException, match="checkpoint location was restored from an older copy"):
        run_available_now(sink, stream(spark, tmp_path / "src"), tmp_path / "ckpt")
    assert sink.load_table().scan().to_arrow().num_rows == 30
