"""Writer tasks that see more partitions than ``iceberg-sink.writer.max-open-files``.

The least recently used file is closed and the partition's later rows go to a new file, so a
partition ends up in several files of one checkpoint. Apache Iceberg Java and DuckDB must read
exactly the input back (appends) or the model (CDC with repeated keys, whose equality deletes must
not depend on how the task's files were cut).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from tests.integration.test_cdc import apply, expected, frame, random_changes
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    """Arrow batches of 50 rows, so every task routes many batches over its partitions."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "50")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def test_append_over_more_partitions_than_open_files(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, small_arrow_batches: None
) -> None:
    rows = [(i, f"p{i % 60:02d}", i * 0.5) for i in range(3000)]
    df = spark.createDataFrame(rows, "id long, part string, x double").repartition(2)
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.wide")
        .create_if_missing(partition_by=["part"])
        # Rows stay in their (unclustered) Spark partitions: each task sees all 60 partitions.
        .distribution_mode("none")
        .write_option("iceberg-sink.writer.max-open-files", 4)
        # Flush every slice at once, so that each partition's file is open from its first row.
        .write_option("iceberg-sink.writer.buffer-bytes", 1)
        .build()
    )
    sink.write(df)
    table = sink.load_table()
    files = list(table.inspect.files().to_pylist())
    # Two tasks, 60 partitions each, 4 open at a time, rows interleaved: partitions are reopened.
    assert len(files) > 2 * 60
    assert sum(f["record_count"] for f in files) == 3000
    want = normalize(pa.Table.from_pylist([{"id": i, "part": p, "x": x} for i, p, x in rows]), ["id"])
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want
    assert java_reader.read(table.metadata_location, where="part = 'p07'").num_rows == 50


def test_cdc_with_repeated_keys_across_evicted_files(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, small_arrow_batches: None
) -> None:
    rng = random.Random(23)
    model: dict[int, dict[str, Any]] = {}
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        .create_if_missing(partition_by=["region", "bucket(16, id)"], format_version=2)  # equality deletes
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
        .write_option("iceberg-sink.writer.max-open-files", 2)
        .write_option("iceberg-sink.writer.buffer-bytes", 1)
        .build()
    )
    lsn = 0
    for checkpoint in range(5):
        changes = random_changes(rng, model, lsn, rng.randrange(150, 300), keys=200)
        lsn = max(c["lsn"] for c in changes)
        rng.shuffle(changes)
        sink.write(frame(spark, changes), checkpoint_location=str(tmp_path / "ckpt"), checkpoint_id=checkpoint)
        apply(model, changes)
        table = sink.load_table()
        assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected(model), checkpoint
        assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected(model), checkpoint
    summary = sink.load_table().current_snapshot().summary  # type: ignore[union-attr]
    # 48 partitions through 2 open files per task: the checkpoints were cut into many files.
    assert summary is not None and int(summary["total-data-files"]) > 48
