"""A small batch is read, planned and written without Spark's code generation and adaptive
execution; a large one, or the commit and its post-commit work, as set.

job/codegen.py sets ``spark.sql.codegen.wholeStage=false``, ``spark.sql.codegen.factoryMode=
NO_CODEGEN``, ``spark.sql.adaptive.enabled=false`` and ``spark.sql.constraintPropagation.enabled=
false`` on the batch's session from its read until its
write job ends, for a batch Spark estimates at most ``iceberg-sink.write.interpreted-max-rows`` rows.
These tests watch it from inside: a ``map_batches`` function reads the session's settings as the
sink reads the batch, a column of it reads the settings the writer task was sent (Spark ships a job's
SQL settings to its tasks as local properties), a post-commit hook reads the session's during the
commit, and a routed stream's Spark jobs are counted. The tables are read back by Iceberg Java (1.9.2
and the newest) and DuckDB.
"""

from __future__ import annotations

import datetime as dt
import json
import os
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
from iceberg_sink.builder import IcebergSinkBuilder
from iceberg_sink.job import codegen
from iceberg_sink.topology import estimate
from iceberg_sink.topology.hooks import CommitResult
from tests.helpers import query_stages
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, assert_readers_agree_many

FACTORY_MODE = "spark.sql.codegen.factoryMode"
WHOLE_STAGE = "spark.sql.codegen.wholeStage"
ADAPTIVE = "spark.sql.adaptive.enabled"
CONSTRAINTS = "spark.sql.constraintPropagation.enabled"


def _task_setting(key: str) -> str | None:
    """The setting ``key`` the running task was sent (None: Spark's default)."""
    context = TaskContext.get()
    return context.getLocalProperty(key) if context is not None else "no task"


def _task_mode(_: Any) -> str | None:
    return _task_setting(FACTORY_MODE)


def _task_adaptive(_: Any) -> str | None:
    return _task_setting(ADAPTIVE)


def with_mode(df: DataFrame, read: list[tuple[str | None, ...]] | None = None) -> DataFrame:
    """``df`` with the writer task's code-generation mode and adaptive setting as columns; the
    session's (those two and constraint propagation), as the sink reads the batch, appended to ``read``."""
    if read is not None:
        read.append(tuple(df.sparkSession.conf.get(key, None) for key in (FACTORY_MODE, ADAPTIVE, CONSTRAINTS)))
    mode, adaptive = F.udf(_task_mode, "string"), F.udf(_task_adaptive, "string")
    return df.withColumn("mode", mode(F.col("id"))).withColumn("adaptive", adaptive(F.col("id")))


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
    spark: SparkSession,
    tmp_path: Path,
    max_rows: int | None,
    batches: int = 3,
    rows: int = 40,
    read: list[tuple[str | None, ...]] | None = None,
) -> tuple[IcebergSink, list[dict[str, Any]], list[dict[str, Any]]]:
    """Upsert ``batches`` sized batches through bounded writes; the sink, its progress records, and
    what each commit's post-commit hook saw of the session (``read``: what the session held as
    each batch was read)."""
    seen: list[dict[str, Any]] = []

    def hook(_: CommitResult) -> None:
        seen.append({key: spark.conf.get(key, None) for key in (FACTORY_MODE, WHOLE_STAGE, ADAPTIVE, CONSTRAINTS)})

    builder = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=3)
        .map_batches(lambda df: with_mode(df, read))
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
    whole_stage, adaptive = spark.conf.get(WHOLE_STAGE, None), spark.conf.get(ADAPTIVE, None)
    assert spark.conf.get(FACTORY_MODE, None) is None and spark.conf.get(CONSTRAINTS, None) is None
    read: list[tuple[str | None, ...]] = []
    sink, progress, seen = run(spark, tmp_path, None, read=read)
    assert [p.get("interpreted") for p in progress] == [True, True, True]
    # The batch was read with the small batch's settings, and its writer tasks ran with them.
    assert set(read) == {("NO_CODEGEN", "false", "false")}, read
    written = sink.load_table().scan(selected_fields=("mode", "adaptive")).to_arrow().to_pylist()
    assert {(r["mode"], r["adaptive"]) for r in written} == {("NO_CODEGEN", "false")}, written
    # The commit (and its post-commit work) and the session after the write: as the user set them.
    assert seen == [{FACTORY_MODE: None, WHOLE_STAGE: whole_stage, ADAPTIVE: adaptive, CONSTRAINTS: None}] * 3
    assert spark.conf.get(FACTORY_MODE, None) is None and spark.conf.get(WHOLE_STAGE, None) == whole_stage
    assert spark.conf.get(ADAPTIVE, None) == adaptive and spark.conf.get(CONSTRAINTS, None) is None
    expected = [{**row, "mode": "NO_CODEGEN", "adaptive": "false"} for row in model_of(tmp_path)]
    assert_readers_agree(java_readers, sink.load_table().metadata_location, expected, ["id"])


def test_a_batch_over_the_bound_keeps_sparks_settings(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...]
) -> None:
    spark.conf.set(WHOLE_STAGE, "true")  # set by the user: still set after the write
    spark.conf.set(ADAPTIVE, "true")
    read: list[tuple[str | None, ...]] = []
    try:
        sink, progress, seen = run(spark, tmp_path, 5, read=read)  # 40 rows a batch: over 5
        assert spark.conf.get(WHOLE_STAGE) == "true" and spark.conf.get(ADAPTIVE) == "true"
    finally:
        spark.conf.unset(WHOLE_STAGE)
        spark.conf.unset(ADAPTIVE)
    assert [p.get("interpreted") for p in progress] == [False, False, False]
    assert set(read) == {(None, "true", None)}, read
    written = sink.load_table().scan(selected_fields=("mode", "adaptive")).to_arrow().to_pylist()
    assert {(r["mode"], r["adaptive"]) for r in written} == {(None, "true")}, written
    assert seen == [{FACTORY_MODE: None, WHOLE_STAGE: "true", ADAPTIVE: "true", CONSTRAINTS: None}] * 3
    expected = [{**row, "mode": None, "adaptive": "true"} for row in model_of(tmp_path)]
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


def test_post_commit_work_inside_a_small_batch_runs_with_the_sessions_settings(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What a small batch's road commits (its own checkpoint, or older ones its plan commits) runs
    inside :func:`codegen.as_configured`: the session's own settings, then the small batch's again."""
    batch(tmp_path, 0, 10)
    df = spark.read.parquet(str(tmp_path))
    spark.conf.set(ADAPTIVE, "true")
    try:
        with codegen.sized(df, 10**6) as small:
            assert small and codegen.active()
            assert (spark.conf.get(FACTORY_MODE), spark.conf.get(ADAPTIVE)) == ("NO_CODEGEN", "false")
            with codegen.sized(df, 10**6) as nested:  # a nested block changes nothing
                assert not nested and spark.conf.get(ADAPTIVE) == "false"
            with codegen.as_configured():
                assert not codegen.active()
                assert (spark.conf.get(FACTORY_MODE, None), spark.conf.get(ADAPTIVE)) == (None, "true")
            assert codegen.active() and spark.conf.get(ADAPTIVE) == "false"
        assert not codegen.active()
        assert (spark.conf.get(FACTORY_MODE, None), spark.conf.get(ADAPTIVE)) == (None, "true")
    finally:
        spark.conf.unset(ADAPTIVE)


def _routed_files(source: Path, batches: int) -> dict[str, dict[int, dict[str, Any]]]:
    """``batches`` JSON files of rows for two tables (a sized source); the model of each table."""
    source.mkdir(parents=True)
    model: dict[str, dict[int, dict[str, Any]]] = {"a": {}, "b": {}}
    for b in range(batches):
        lines = []
        for i in range(10):
            table, key = ("a" if i % 2 else "b"), (b * 3 + i) % 12
            row = {"tbl": table, "id": key, "v": f"v{b}-ñ{i}", "lsn": b * 100 + i}
            model[table][key] = {k: v for k, v in row.items() if k != "tbl"}  # the route column is not kept
            lines.append(json.dumps(row))
        path = source / f"part-{b:03d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source reads them in this order
    return model


def _routed_sink(tmp_path: Path) -> IcebergSinkBuilder:
    """The routed upsert sink of :func:`_routed_files`' rows: tables ``r.a`` and ``r.b``."""
    return (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .route(table_column="tbl", namespace="r")
        .upsert(["id"], order_by="lsn")
        .create_if_missing(format_version=2)
    )


def _routed_stream(spark: SparkSession, tmp_path: Path, builder: IcebergSinkBuilder) -> tuple[IcebergSink, Any]:
    """The sink ``builder`` builds, run over :func:`_routed_files`' files one per micro-batch, to the end."""
    sink = builder.build()
    stream = spark.readStream.schema("tbl string, id long, v string, lsn long").option("maxFilesPerTrigger", 1)
    query = sink.start(stream.json(str(tmp_path / "source")), str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    return sink, query


@pytest.mark.parametrize("max_rows", [10_000, 0])
def test_a_small_routed_batch_runs_one_job_per_step_not_one_per_stage(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...], max_rows: int
) -> None:
    """A routed micro-batch counts its tables' columns (an aggregation over its cache) and writes
    (a shuffle to the writers): with adaptive execution on, each of their stages was a job of its own
    (five per batch); a small batch runs two."""
    batches = 4
    model = _routed_files(tmp_path / "source", batches)
    builder = _routed_sink(tmp_path).write_option("iceberg-sink.write.interpreted-max-rows", max_rows)
    spark.conf.set(ADAPTIVE, "true")  # Spark's default, as a user's session has it
    try:
        sink, query = _routed_stream(spark, tmp_path, builder)
        assert spark.conf.get(ADAPTIVE) == "true"
    finally:
        spark.conf.unset(ADAPTIVE)
    jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId)))
    if max_rows:
        assert jobs == 2 * batches, jobs
    else:
        assert jobs > 2 * batches, jobs
    expected = {sink.load_table(f"r.{t}").metadata_location: list(rows.values()) for t, rows in model.items()}
    assert_readers_agree_many(java_readers, expected, ["id"])


@pytest.mark.parametrize("mode", ["hash", "range"])
@pytest.mark.parametrize("writers", [1, 2])
def test_a_small_batch_for_one_writer_task_skips_the_shuffle(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...], writers: int, mode: str
) -> None:
    """A small routed micro-batch whose shuffle has one partition reaches its one writer task without
    the shuffle (job/distributing.py): its write job is one stage, not two, and writes the same rows."""
    batches = 3
    model = _routed_files(tmp_path / "source", batches)
    builder = _routed_sink(tmp_path).distribution_mode(mode)
    sink, query = _routed_stream(
        spark, tmp_path, builder.write_option("iceberg-sink.write.shuffle-partitions", writers)
    )
    jobs = query_stages(spark, str(query.runId))
    # Per micro-batch: the tables' columns counted (an aggregation: two stages), then the write; a
    # range shuffle first samples its input for the ranges (one more job).
    per_batch = 3 if mode == "range" and writers > 1 else 2
    assert len(jobs) == per_batch * batches, jobs
    writes = jobs[per_batch - 1 :: per_batch]
    if writers == 1:
        assert writes == [[1]] * batches, jobs  # one stage of one task: no shuffle
    else:
        assert all(len(w) >= 2 and w[-1] == 2 for w in writes), jobs  # the shuffle, then two writers
    expected = {sink.load_table(f"r.{t}").metadata_location: list(rows.values()) for t, rows in model.items()}
    assert_readers_agree_many(java_readers, expected, ["id"])
