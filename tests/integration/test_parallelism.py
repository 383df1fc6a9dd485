"""A stream's micro-batches shuffle at the sink's parallelism, not at ``spark.sql.shuffle.partitions``.

A shuffle that adaptive execution does not size (it is off, or the shuffle is inside a cached plan,
such as a routed batch's) has as many tasks as ``spark.sql.shuffle.partitions`` says, 200 unless set:
these tests set 200 on the session and count the tasks of every stage the query ran (Spark's status
tracker, by the query's job group).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.job import parallelism
from tests.helpers import query_stages
from tests.integration.test_routing_schema import Topic

DDL = "id BIGINT, v STRING, lsn BIGINT"
BATCHES = 3


ADAPTIVE = "spark.sql.adaptive.enabled"


@pytest.fixture
def spark200(spark: SparkSession) -> Iterator[SparkSession]:
    """The test session with Spark's default of 200 shuffle partitions, as a user's session has it,
    and adaptive execution off (as a user may set it; Spark's default is on)."""
    before = {k: spark.conf.get(k) for k in (parallelism.SHUFFLE_PARTITIONS, ADAPTIVE)}
    spark.conf.set(parallelism.SHUFFLE_PARTITIONS, "200")
    spark.conf.set(ADAPTIVE, "false")
    try:
        yield spark
    finally:
        for key, value in before.items():
            spark.conf.set(key, str(value))


def write_batches(source: Path) -> dict[int, str]:
    source.mkdir(parents=True)
    model: dict[int, str] = {}
    for b in range(BATCHES):
        ids = [b * 50 + i for i in range(100)]
        values = [f"v{b}-{i}" for i in ids]
        model.update(zip(ids, values, strict=True))
        table = pa.table({"id": pa.array(ids, pa.int64()), "v": values, "lsn": pa.array([b * 1000 + i for i in ids])})
        path = source / f"part-{b:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source reads them in this order
    return model


def stage_tasks(spark: SparkSession, run_id: str) -> list[int]:
    """The task count of every stage of every job the query (run ``run_id``) ran."""
    return [tasks for job in query_stages(spark, run_id) for tasks in job]


def run(spark: SparkSession, tmp_path: Path, **write_options: Any) -> tuple[IcebergSink, list[int], Path]:
    model = write_batches(tmp_path / "source")
    builder = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=3)
        .upsert(["id"])
    )
    # Without the one-task path (a batch this small is otherwise reduced in one task): a real shuffle.
    builder = builder.write_option("iceberg-sink.changes.single-task-max-bytes", 0)
    for key, value in write_options.items():
        builder = builder.write_option(key, value)
    sink = builder.build()
    stream = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "source"))
    checkpoint = tmp_path / "checkpoint"
    query = sink.start(stream, str(checkpoint), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    rows = sink.load_table().scan().to_arrow().to_pylist()
    got = {r["id"]: r["v"] for r in rows}
    assert got == model and len(rows) == len(model), (sorted(k for k in model if got.get(k) != model[k]), len(rows))
    return sink, stage_tasks(spark, str(query.runId)), checkpoint


def offset_log_partitions(checkpoint: Path) -> set[str]:
    """``spark.sql.shuffle.partitions`` as Spark's offset log recorded it for each micro-batch."""
    found = set()
    for entry in (checkpoint / "offsets").iterdir():
        if entry.name.isdigit():
            metadata = json.loads(entry.read_text().splitlines()[1])
            found.add(metadata["conf"][parallelism.SHUFFLE_PARTITIONS])
    return found


def test_a_stream_shuffles_at_the_cores_not_at_spark_sql_shuffle_partitions(
    spark200: SparkSession, tmp_path: Path
) -> None:
    sink, tasks, checkpoint = run(spark200, tmp_path)
    cores = spark200.sparkContext.defaultParallelism
    assert tasks and max(tasks) <= cores, tasks
    assert [p["status"] for p in sink.progress()] == ["committed"] * BATCHES
    # The stream's own setting is put back after each micro-batch: the offset log keeps the user's.
    assert offset_log_partitions(checkpoint) == {"200"}


def test_the_shuffle_partitions_option_sets_them(spark200: SparkSession, tmp_path: Path) -> None:
    _, tasks, checkpoint = run(spark200, tmp_path, **{"iceberg-sink.write.shuffle-partitions": 3})
    assert 3 in tasks and max(tasks) == 3, tasks
    assert offset_log_partitions(checkpoint) == {"200"}


@pytest.mark.parametrize("interpreted_max_rows", [10_000, 0])
def test_a_routed_debezium_stream_shuffles_at_the_cores_with_adaptive_execution_on(
    spark200: SparkSession, tmp_path: Path, interpreted_max_rows: int
) -> None:
    """The Kafka guide's shape (docs/postgres-debezium-kafka.md): a routed batch is cached, and a cached
    plan's shuffles (the Debezium checks') are not sized by adaptive execution: every job over the
    cache read 200 partitions, and the guide's first one-event micro-batch took 39 s here. (A small
    batch runs with adaptive execution off, job/codegen.py; with the bound at 0 it runs as set.)"""
    spark200.conf.set(ADAPTIVE, "true")
    topic = Topic()
    for b in range(2):
        topic.batch()
        for i in range(3):
            topic.change("customers", "c" if b == 0 else "u", {"id": i, "name": f"c{i}-{b}"}, None)
            topic.change("orders", "c" if b == 0 else "u", {"id": 10 + i, "customer_id": i, "amount": 1.5 * b}, None)
    topic.write(tmp_path / "topic")
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .route(table_column="source_table", namespace="shop")
        .debezium(value_column="value", table_fields=("table",))
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .create_if_missing(format_version=3)
        .write_option("iceberg-sink.write.interpreted-max-rows", interpreted_max_rows)
        .build()
    )
    stream = spark200.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
    query = sink.start(stream.json(str(tmp_path / "topic")), str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    tasks = stage_tasks(spark200, str(query.runId))
    assert tasks and max(tasks) <= spark200.sparkContext.defaultParallelism, tasks
    for name, model in topic.models.items():
        rows = sink.load_table(f"shop.{name}").scan().to_arrow().to_pylist()
        assert {r["id"]: {k: r[k] for k in model[r["id"]]} for r in rows} == model, name
    assert offset_log_partitions(tmp_path / "ck") == {"200"}


def test_a_bounded_write_leaves_the_users_session_alone(spark200: SparkSession, tmp_path: Path) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing().upsert(["id"]).build()
    sink.write(spark200.createDataFrame([(1, "a", 1)], DDL))
    assert spark200.conf.get(parallelism.SHUFFLE_PARTITIONS) == "200"


@pytest.mark.parametrize(
    ("size", "cores", "most", "expected"),
    [
        (None, 2, 200, 2),  # Kafka: no estimate, the cores
        (None, 64, 200, 64),
        (10_907_853_451 * 128 * 1024 * 1024, 2, 200, 2),  # no statistics, rescaled by a projection: none
        (0, 8, 200, 1),
        (1024, 8, 200, 1),  # a tiny batch: one partition
        (10 * 1024 * 1024, 8, 200, 3),  # 4 MiB each at least
        (1024 * 1024 * 1024, 2, 200, 8),  # 128 MiB each past the cores
        (1024 * 1024 * 1024, 64, 200, 64),
        (1024**4, 2, 200, 200),  # never past the session's setting ...
        (1024**4, 2, 4, 4),
        (1024**4, 16, 4, 16),  # ... unless the cores are more
    ],
)
def test_the_partitions_follow_the_batch_size_and_the_cores(
    size: int | None, cores: int, most: int, expected: int
) -> None:
    assert parallelism.choose(size, cores, most) == expected
