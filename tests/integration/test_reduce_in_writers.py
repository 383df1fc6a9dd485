"""Changes reduced inside the writer tasks, one task per Spark partition of the input, without a
shuffle or a single task (``iceberg-sink.changes.reduce-in-writers``; writer/key_runs.py).

Bounded writes with ``always`` (a stream's Kafka micro-batch takes this road under ``auto``:
test_kafka_source.py and the Debezium pipeline tests). The input has two Spark partitions, each
with its changes in arrival order: keyed (every change of a key in one partition), or not (a key's
changes in both, which the write must notice, discard and write again reduced in Spark). The table
is read back with Iceberg Java and DuckDB against a model of the changes.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.topology.maintenance import remove_orphan_files
from tests.interop.readers import JavaIcebergReader, assert_readers_agree

DDL = "id BIGINT, name STRING, op STRING, lsn BIGINT, v STRING"
OPTION = "iceberg-sink.changes.reduce-in-writers"


def changes(rng: random.Random, batch: int, keys: list[int], count: int) -> list[tuple[Any, ...]]:
    """``count`` changes of ``keys``: inserts, updates and deletes, some without an lsn, some sharing one."""
    rows = []
    for i in range(count):
        key = rng.choice(keys)
        op = rng.choice(["c", "u", "u", "d"])
        lsn = None if rng.random() < 0.1 else rng.randint(0, 6) + batch * 10
        rows.append((key, f"n{key % 3}", op, lsn, f"b{batch}-{i}"))
    return rows


def apply(model: dict[tuple[int, str], dict[str, Any]], rows: list[tuple[Any, ...]]) -> None:
    """The batch's last change of each key (lsn, nulls oldest, then arrival) applied to ``model``."""
    last: dict[tuple[int, str], tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
    for arrival, row in enumerate(rows):
        position = (row[3] is not None, row[3] if row[3] is not None else 0, arrival)
        key = (row[0], row[1])
        if key not in last or position > last[key][0]:
            last[key] = (position, row)
    for key, (_, row) in last.items():
        if row[2] == "d":
            model.pop(key, None)
        else:
            model[key] = {"id": row[0], "name": row[1], "lsn": row[3], "v": row[4]}


def two_partitions(spark: SparkSession, first: list[tuple[Any, ...]], second: list[tuple[Any, ...]]) -> DataFrame:
    """The rows in two Spark partitions: ``first`` then ``second``, each in its order."""
    rdd = spark.sparkContext.parallelize([first, second], 2).flatMap(lambda rows: rows)
    return spark.createDataFrame(rdd, DDL)


def sink_of(tmp_path: Path, version: int, choice: str = "always") -> IcebergSink:
    return (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=version)
        .cdc(op_column="op", key=["id", "name"], order_by="lsn")
        .write_option(OPTION, choice)
        .build()
    )


def orphans(sink: IcebergSink) -> list[str]:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    table = sink.load_table()
    found = remove_orphan_files(lambda: table, older_than=dt.timedelta(hours=1), dry_run=True, now=later)
    return [o for o in found.orphan_files if "/data/" in o]


@pytest.mark.parametrize("version", [2, 3])
def test_keyed_changes_are_reduced_by_one_writer_task_per_partition_and_readers_agree(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...], version: int
) -> None:
    rng = random.Random(version)
    sink = sink_of(tmp_path, version)
    model: dict[tuple[int, str], dict[str, Any]] = {}
    location = str(tmp_path / "checkpoint")
    for batch in range(3):
        evens = changes(rng, batch, list(range(0, 40, 2)), 120)
        odds = changes(rng, batch, list(range(1, 40, 2)), 120)
        sink.write(two_partitions(spark, evens, odds), checkpoint_location=location)
        progress = sink.last_progress() or {}
        assert progress.get("reduced_in_writers") is True, progress
        assert progress.get("keys_crossed") is False, progress
        apply(model, evens + odds)
        table = sink.load_table()
        snapshot = table.current_snapshot()
        assert snapshot is not None
        # One data file from each partition's task: no single task, no shuffle.
        assert snapshot.summary is not None and snapshot.summary["added-data-files"] == "2", snapshot.summary
    assert orphans(sink) == []
    assert_readers_agree(java_readers, sink.load_table().metadata_location, list(model.values()), ["id", "name"])


def test_a_key_in_two_tasks_is_noticed_and_the_batch_written_again_in_spark(
    spark: SparkSession, tmp_path: Path, java_readers: tuple[JavaIcebergReader, ...]
) -> None:
    rng = random.Random(7)
    sink = sink_of(tmp_path, 2)
    location = str(tmp_path / "checkpoint")
    model: dict[tuple[int, str], dict[str, Any]] = {}
    # Keyed first: reduced in the writers.
    first, second = changes(rng, 0, [0, 2, 4], 30), changes(rng, 0, [1, 3, 5], 30)
    sink.write(two_partitions(spark, first, second), checkpoint_location=location)
    apply(model, first + second)
    assert (sink.last_progress() or {}).get("reduced_in_writers") is True
    # Then one key in both partitions: the writers' files are discarded, Spark reduces the batch.
    first, second = changes(rng, 1, [0, 1, 2], 30), changes(rng, 1, [2, 3, 4], 30)
    sink.write(two_partitions(spark, first, second), checkpoint_location=location)
    apply(model, first + second)
    progress = sink.last_progress() or {}
    assert progress.get("keys_crossed") is True and progress.get("reduced_in_writers") is False, progress
    assert orphans(sink) == []  # the discarded write's files are gone
    # The job's later batches are reduced in Spark, keyed or not.
    first, second = changes(rng, 2, [0, 2, 4], 30), changes(rng, 2, [1, 3, 5], 30)
    sink.write(two_partitions(spark, first, second), checkpoint_location=location)
    apply(model, first + second)
    progress = sink.last_progress() or {}
    assert progress.get("reduced_in_writers") is False and progress.get("keys_crossed") is False, progress
    assert_readers_agree(java_readers, sink.load_table().metadata_location, list(model.values()), ["id", "name"])


def test_a_refused_row_fails_the_batch_before_anything_is_committed(spark: SparkSession, tmp_path: Path) -> None:
    sink = sink_of(tmp_path, 3)
    location = str(tmp_path / "checkpoint")
    sink.write(two_partitions(spark, [(1, "a", "c", 1, "x")], [(2, "a", "c", 1, "y")]), checkpoint_location=location)
    before = sink.load_table().current_snapshot()
    bad = two_partitions(spark, [(1, "a", "u", 2, "x2")], [(None, "a", "c", 1, "z"), (2, "a", "u", 2, "y2")])
    with pytest.raises(InvalidInputError, match=r"checkpoint 1 of table db\.t was not written"):
        sink.write(bad, checkpoint_location=location)
    assert sink.load_table().current_snapshot() == before
    rows = sink.load_table().scan().to_arrow().sort_by("id").to_pylist()
    assert [(r["id"], r["v"]) for r in rows] == [(1, "x"), (2, "y")]


@pytest.mark.parametrize("choice", ["auto", "never"])
def test_a_bounded_write_is_reduced_in_spark_unless_always(spark: SparkSession, tmp_path: Path, choice: str) -> None:
    sink = sink_of(tmp_path, 3, choice)
    sink.write(
        two_partitions(spark, [(1, "a", "c", 1, "x")], [(2, "a", "c", 1, "y")]),
        checkpoint_location=str(tmp_path / "checkpoint"),
    )
    assert (sink.last_progress() or {}).get("reduced_in_writers") is False
