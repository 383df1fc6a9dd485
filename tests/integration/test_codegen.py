"""A small batch's write job runs without Spark's code generation; a large one, or the commit, as set.

job/codegen.py sets ``spark.sql.codegen.wholeStage=false`` and ``spark.sql.codegen.factoryMode=
NO_CODEGEN`` on the batch's session while the sink builds and runs the write job of a batch Spark
estimates at most ``iceberg-sink.write.interpreted-max-rows`` rows. These tests watch it from inside
the job: a ``map_batches`` column reads the setting the writer task was sent (Spark ships a job's SQL
settings to its tasks as local properties), and a post-commit hook reads the session's during the
commit. The tables are read back by Iceberg Java (1.9.2 and the newest) and DuckDB.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink
from iceberg_sink.job import codegen
from iceberg_sink.topology import estimate
from iceberg_sink.topology.hooks import CommitResult
from tests.interop.readers import JavaIcebergReader, assert_readers_agree

FACTORY_MODE = "spark.sql.codegen.factoryMode"
WHOLE_STAGE = "spark.sql.codegen.wholeStage"


def _task_mode(_: Any) -> str | None:
    """The code-generation mode the running task was sent (None: Spark's default)."""
    context = TaskContext.get()
    return context.getLocalProperty(FACTORY_MODE) if context is not None else "no task"


def with_mode(df: DataFrame) -> DataFrame:
    mode = F.udf(_task_mode, "string")
    return df.withColumn("mode", mode(F.col("id")))


def batch(path: Path, b: int, rows: int) -> list[dict[str, Any]]:
    """Changes of batch ``b`` as a Parquet file (a sized source): inserts, then updates and deletes
    of earlier keys, values at the edges of their types."""
    changes = []
    for i in range(rows):
        key = i if b == 0 else (i * 7 + b) % (rows + b)
        op = "I" if b == 0 else ("D" if i % 5 == 0 else "U")
        changes.append(
            {
                "id": key,
                "op": op,
                "lsn": b * 10_000 + i,
                "name": None if i % 11 == 0 else f"ñame-{b}-{i}" + "🧊" * (i % 3),
                "amount": Decimal(f"{(-1) ** i * (10**17 - 1 - i)}.{i % 100:02d}"),
                "at": dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=(b + 1) * 10**15 - i),
                "ratio": [0.0, -0.0, 1e308, -1e-308, 3.5][i % 5],
            }
        )
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("op", pa.string()),
            ("lsn", pa.int64()),
            ("name", pa.string()),
            ("amount", pa.decimal128(20, 2)),
            ("at", pa.timestamp("us", tz="UTC")),
            ("ratio", pa.float64()),
        ]
    )
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(changes, schema), path / f"batch-{b}.parquet")
    return changes


def apply(model: dict[int, dict[str, Any]], changes: list[dict[str, Any]]) -> None:
    for change in sorted(changes, key=lambda c: c["lsn"]):
        if change["op"] == "D":
            model.pop(change["id"], None)
        else:
            model[change["id"]] = {k: v for k, v in change.items() if k != "op"}


def run(
    spark: SparkSession, tmp_path: Path, max_rows: int | None, batches: int = 3, rows: int = 40
) -> tuple[IcebergSink, list[dict[str, Any]], list[dict[str, Any]]]:
    """Upsert ``batches`` sized batches through bounded writes; the sink, its progress records, and
    what each commit's post-commit hook saw of the session."""
    seen: list[dict[str, Any]] = []

    def hook(_: CommitResult) -> None:
        seen.append({key: spark.conf.get(key, None) for key in (FACTORY_MODE, WHOLE_STAGE)})

    builder = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=3)
        .map_batches(with_mode)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .post_commit_hook(hook)
    )
    if max_rows is not None:
        builder = builder.write_option("iceberg-sink.write.interpreted-max-rows", max_rows)
    sink = builder.build()
    progress = []
    for b in range(batches):
        batch(tmp_path / f"in-{b}", b, rows)
        sink.write(spark.read.parquet(str(tmp_path / f"in-{b}")), checkpoint_location=str(tmp_path / "checkpoint"))
        progress.append(sink.last_progress() or {})
    return sink, progress, seen


def model_of(tmp_path: Path, batches: int = 3, rows: int = 40) -> list[dict[str, Any]]:
    model: dict[int, dict[str, Any]] = {}
    for b in range(batches):
        apply(model, batch(tmp_path / "model" / f"in-{b}", b, rows))
    return list(model.values())


def test_a_small_batch_is_written_without_generated_code_and_readers_agree(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...]
) -> None:
    whole_stage = spark.conf.get(WHOLE_STAGE, None)
    assert spark.conf.get(FACTORY_MODE, None) is None
    sink, progress, seen = run(spark, tmp_path, None)
    assert [p.get("interpreted") for p in progress] == [True, True, True]
    modes = {r["mode"] for r in sink.load_table().scan(selected_fields=("mode",)).to_arrow().to_pylist()}
    assert modes == {"NO_CODEGEN"}, modes  # the writer tasks ran without generated code
    # The commit (and its post-commit work) and the session after the write: as the user set them.
    assert seen == [{FACTORY_MODE: None, WHOLE_STAGE: whole_stage}] * 3
    assert spark.conf.get(FACTORY_MODE, None) is None and spark.conf.get(WHOLE_STAGE, None) == whole_stage
    expected = [{**row, "mode": "NO_CODEGEN"} for row in model_of(tmp_path)]
    assert_readers_agree(java_readers, sink.load_table().metadata_location, expected, ["id"])


def test_a_batch_over_the_bound_keeps_sparks_settings(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...]
) -> None:
    spark.conf.set(WHOLE_STAGE, "true")  # set by the user: still set after the write
    try:
        sink, progress, seen = run(spark, tmp_path, 5)  # 40 rows a batch: over 5
        assert spark.conf.get(WHOLE_STAGE) == "true"
    finally:
        spark.conf.unset(WHOLE_STAGE)
    assert [p.get("interpreted") for p in progress] == [False, False, False]
    modes = {r["mode"] for r in sink.load_table().scan(selected_fields=("mode",)).to_arrow().to_pylist()}
    assert modes == {None}, modes
    assert seen == [{FACTORY_MODE: None, WHOLE_STAGE: "true"}] * 3
    expected = [{**row, "mode": None} for row in model_of(tmp_path)]
    assert_readers_agree(java_readers, sink.load_table().metadata_location, expected, ["id"])


def test_an_unsized_batch_and_the_option_at_zero_keep_sparks_settings(spark: SparkSession, tmp_path: Path) -> None:
    small = spark.createDataFrame([(1, "a")], "id long, v string")  # Python rows: Spark cannot size them
    assert estimate.estimated_rows(small) is None and not codegen.interpreted(small, 10**9)
    batch(tmp_path, 0, 10)
    sized = spark.read.parquet(str(tmp_path))
    rows = estimate.estimated_rows(sized)
    assert rows is not None and rows >= 10  # a file's bytes over a row's default size: never fewer
    assert codegen.interpreted(sized, rows) and not codegen.interpreted(sized, rows - 1)
    assert not codegen.interpreted(sized, 0)


def test_the_settings_are_put_back_when_the_write_fails(spark: SparkSession, tmp_path: Path) -> None:
    whole_stage = spark.conf.get(WHOLE_STAGE, None)
    spark.conf.set(FACTORY_MODE, "FALLBACK")
    try:

        def explode(df: DataFrame) -> DataFrame:
            fail = F.udf(lambda i: 1 // (i - i), "long")  # fails in the writer task
            return df.withColumn("boom", fail(F.col("id")))

        sink = (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.t")
            .create_if_missing(format_version=2)
            .map_batches(explode)
            .build()
        )
        batch(tmp_path / "in", 0, 10)
        with pytest.raises(Exception, match="ZeroDivisionError"):
            sink.write(spark.read.parquet(str(tmp_path / "in")).drop("op"))
        assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
        assert spark.conf.get(WHOLE_STAGE, None) == whole_stage
    finally:
        spark.conf.unset(FACTORY_MODE)
