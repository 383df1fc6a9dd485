"""Spark's per-row byte check of the Arrow batches a write job hands its writer tasks is skipped when
the sink job's last write measured rows narrow enough (writer/arrow_batches.py), and kept for wide
rows: measured in real writer tasks, applied to the write job itself (seen from inside its tasks),
put back after, and the table's rows the same either way."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from iceberg_sink import IcebergSink
from iceberg_sink.writer import arrow_batches
from iceberg_sink.writer.arrow_batches import MAX_BYTES, UNBOUNDED


@F.udf(StringType())
def _bound_in_task() -> str:
    """The byte bound the task that evaluates it runs with (Spark sends a job's SQL settings to its
    tasks as local properties; Spark's default, which is never set, shows as "default")."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty(MAX_BYTES) if context is not None else None
    return value or "default"


def _changes(spark: SparkSession, first: int, rows: int, width: int, version: int) -> Any:
    return (
        spark.range(first, first + rows)
        .select(
            F.col("id"),
            F.lit("x" * width).alias("name"),
            F.lit(version).cast("long").alias("lsn"),
            F.lit("U").alias("op"),
        )
        .withColumn("bound", _bound_in_task())
    )


def _sink(catalog_props: dict[str, str], table: str) -> Any:
    return (
        IcebergSink.builder()
        .catalog("arrow", **catalog_props)
        .table(table)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .create_if_missing()
        .build()
    )


def test_narrow_rows_lift_the_byte_check_of_the_next_write_and_wide_rows_keep_it(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Any
) -> None:
    assert spark.conf.get(MAX_BYTES, None) is None  # Spark's default (64 MiB), as a user leaves it
    narrow = _sink(catalog_props, "db.narrow")
    checkpoint = str(tmp_path / "narrow")
    narrow.write(_changes(spark, 0, 300, 4, 1), checkpoint_location=checkpoint, checkpoint_id=0)
    job = narrow.last_progress()["job_id"]
    measured = arrow_batches._WIDEST[job]
    assert 8 < measured < 200  # a long, a short string, a long, an op and the bound's text
    narrow.write(_changes(spark, 100, 300, 6, 2), checkpoint_location=checkpoint, checkpoint_id=1)
    rows = narrow.load_table().scan().to_arrow().sort_by("id")
    assert rows.num_rows == 400
    bounds = dict(zip(rows["id"].to_pylist(), rows["bound"].to_pylist(), strict=True))
    # Rows of the first write ran with Spark's bound; the second write's, unbounded; then put back.
    assert {bounds[i] for i in range(100)} == {"default"}
    assert {bounds[i] for i in range(100, 400)} == {str(UNBOUNDED)}
    assert rows["name"].to_pylist() == ["x" * 4] * 100 + ["x" * 6] * 300
    assert rows["lsn"].to_pylist() == [1] * 100 + [2] * 300
    assert spark.conf.get(MAX_BYTES, None) is None

    wide = _sink(catalog_props, "db.wide")
    wide_checkpoint = str(tmp_path / "wide")
    wide.write(_changes(spark, 0, 50, 2_000, 1), checkpoint_location=wide_checkpoint, checkpoint_id=0)
    wide_job = wide.last_progress()["job_id"]
    assert arrow_batches._WIDEST[wide_job] > 2_000
    wide.write(_changes(spark, 0, 50, 2_000, 2), checkpoint_location=wide_checkpoint, checkpoint_id=1)
    wide_rows = wide.load_table().scan().to_arrow()
    assert set(wide_rows["bound"].to_pylist()) == {"default"}
    assert pa.compute.max(wide_rows["lsn"]).as_py() == 2 and wide_rows.num_rows == 50
    narrow.close()
    wide.close()
