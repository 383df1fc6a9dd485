"""The partitioned key index (keyindex/partitioned.py) on real Spark: a format v3 CDC stream whose
deletes are resolved through it with every step on the executors, a restarted driver that indexes
nothing again, a lost index rebuilt from the data files, and the v2 equality-delete conversion
through it. Iceberg Java 1.9.2, the newest Iceberg Java and DuckDB read the model each time."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFileContent
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.errors import CorruptFileError
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.keyindex.persisted import index_location
from iceberg_sink.keyindex.runner import SparkRunner
from iceberg_sink.topology import maintenance
from tests.integration.test_cdc import apply, expected, frame
from tests.integration.test_key_index_restart import Checkpoints, changes
from tests.interop.readers import JavaIcebergReader, assert_readers_agree

pytestmark = pytest.mark.interop

# Digest keys (several fields, strings) take the same road after hashing; on Spark they run in the
# model check (routed tables keyed by (g, id) on odd seeds) and in tests/unit (against brute force).
KEYS = {"long key (its own hash)": ["id"]}


def partitioned(builder: Any) -> Any:
    return (
        builder.write_option("iceberg-sink.key-index.mode", "partitioned")
        .write_option("iceberg-sink.key-index.partitions", 4)
        .write_option("iceberg-sink.key-index.driver-max-bytes", 0)  # every step a Spark job
    )


@pytest.mark.parametrize("kind", list(KEYS))
def test_v3_deletes_resolve_through_the_partitioned_index_on_executors_across_restarts(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, kind: str
) -> None:
    def build() -> Any:
        return partitioned(
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.users")
            .create_if_missing(format_version=3)
            .cdc(op_column="op", key=KEYS[kind], order_by="lsn")
        ).build()

    steps = Checkpoints(spark, java_readers, str(tmp_path / "ckpt"))
    write, model = steps.write, steps.model

    sink = build()
    write(sink, range(100), "I")  # files A: keys 0..99
    write(sink, range(50), "U")  # reaches A (indexed); files B: 0..49
    write(sink, range(10), "U")  # reaches A and B (B indexed); files C
    write(sink, range(60, 70), "D", check=True)  # reaches A only
    index: KeyIndex = sink._committer_index
    assert index.partitions == 4 and index.files == 0  # no key held in the driver
    assert isinstance(index.runner, SparkRunner) and index.runner.jobs > 0 and index.runner.local.tasks == 0
    indexed = sink.metrics().key_index_data_files_read
    assert indexed >= 2
    sink.close()

    # Orphan removal keeps what the index's current manifest names and takes the rest.
    folder = Path(index_location(sink.load_table()).removeprefix("file://")) / "partitioned"
    runs_dir = next(folder.rglob("runs"))
    stray = runs_dir / "stray.run"
    stray.write_bytes(b"left by a killed task")
    kept = {p for p in folder.rglob("*") if p.is_file() and p != stray}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)  # every file is past the safety age
    result = maintenance.remove_orphan_files(sink.load_table, older_than=dt.timedelta(hours=1), now=later)
    assert str(stray) in {o.removeprefix("file://") for o in result.orphan_files}
    assert not stray.exists() and all(p.exists() for p in kept)

    restarted = build()  # a new driver: reads the index's manifest, indexes nothing again
    outcome = write(restarted, range(20, 50), "U", check=True)  # reaches A and B only
    assert outcome.key_index_data_files_read == 0
    restarted.close()

    # The index is lost under a driver that still holds it (one instance per table in a process:
    # the next sink's committer gets this one, whose manifest names deleted runs; an executor that
    # has them cached still answers from them, facts about live files; one that has not fails the
    # lookup with FileNotFoundError and the index is rebuilt): right either way.
    held = restarted._committer_index.partitioned
    assert held is not None and any(folder.rglob("*.run"))
    shutil.rmtree(folder)
    rebuilt = build()
    outcome = write(rebuilt, range(0, 100, 3), "D", check=True)
    assert rebuilt._committer_index.partitioned is held
    assert outcome.key_index_data_files_read > 0
    rebuilt.close()
    assert len(model) == 100 - 10 - len(range(0, 100, 3)) + len([i for i in range(60, 70) if i % 3 == 0])


def test_the_v2_conversion_looks_keys_up_in_the_partitioned_index(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    sink = partitioned(
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        .create_if_missing(format_version=2)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .convert_equality_deletes(every_n_commits=1, background=False)
    ).build()
    ckpt = str(tmp_path / "ckpt")
    model: dict[int, dict[str, Any]] = {}
    for checkpoint, (ids, op) in enumerate([(range(100), "I"), (range(50), "U"), (range(10, 30), "D")]):
        batch = changes(ids, checkpoint * 1000, op)
        sink.write(frame(spark, batch), checkpoint_location=ckpt, checkpoint_id=checkpoint)
        apply(model, batch)
    sink.close()
    conversions = [i for i in sink._key_indexes if i is not sink._committer_index]
    assert conversions and all(i.partitioned is not None for i in conversions)
    assert sum(i.partitioned.counters.lookups for i in conversions if i.partitioned is not None) >= 2
    assert sum(i.data_files_read for i in conversions) >= 2 and all(i.files == 0 for i in conversions)
    table = sink.load_table()
    deletes = [f for t in table.scan().plan_files() for f in t.delete_files]
    assert deletes and all(f.content == DataFileContent.POSITION_DELETES for f in deletes), "all converted"
    assert_readers_agree(java_readers, table.metadata_location, expected(model), ["id"])


def test_a_task_error_reaches_the_driver_as_itself(spark: SparkSession) -> None:
    """The index rebuilds itself on a CorruptFileError or FileNotFoundError from any of its tasks:
    on the executors too, where Spark would wrap it in a PythonException."""
    runner = SparkRunner(lambda: spark.sparkContext, local_bytes=0)

    def fail(io: object, item: int) -> int:
        if item == 1:
            raise CorruptFileError(f"task {item} found a corrupt run")
        if item == 2:
            raise FileNotFoundError(f"task {item} found no run")
        return item * 10

    assert runner.run(fail, [0, 3], PyArrowFileIO(), "/tmp", weight=1) == [0, 30]
    for item, kind in [(1, CorruptFileError), (2, FileNotFoundError)]:
        with pytest.raises(kind, match=f"task {item}"):
            runner.run(fail, [0, item], PyArrowFileIO(), "/tmp", weight=1)
    assert runner.jobs == 3 and runner.local.tasks == 0


def test_a_step_runs_in_the_driver_up_to_its_bound_and_on_the_executors_past_it(spark: SparkSession) -> None:
    """``iceberg-sink.key-index.driver-max-bytes``: a step's bytes at most the bound run in the driver,
    past it as one Spark job of a task per item in Python workers; with no Spark context, or no items,
    no job."""
    runner = SparkRunner(lambda: spark.sparkContext, local_bytes=1000)
    driver = os.getpid()

    def where(io: object, item: int) -> tuple[int, int]:
        return item, os.getpid()

    assert runner.slots(1000) == 1 and runner.slots(1001) == spark.sparkContext.defaultParallelism
    assert runner.run(where, [1, 2], PyArrowFileIO(), "/tmp", weight=1000) == [(1, driver), (2, driver)]
    assert (runner.jobs, runner.tasks, runner.local.tasks) == (0, 0, 2)
    out = runner.run(where, [3, 4], PyArrowFileIO(), "/tmp", weight=1001)
    assert [i for i, _ in out] == [3, 4] and all(pid != driver for _, pid in out)
    assert (runner.jobs, runner.tasks, runner.local.tasks) == (1, 2, 2)
    assert runner.run(where, [], PyArrowFileIO(), "/tmp", weight=10**9) == [] and runner.jobs == 1
    alone = SparkRunner(lambda: None, local_bytes=0)
    assert alone.run(where, [5], PyArrowFileIO(), "/tmp", weight=10**9) == [(5, driver)] and alone.jobs == 0


def test_an_int_key_promoted_to_long_keeps_its_index(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """A schema change of the key: ``id`` int promoted to long (the sink widens it for a batch whose
    ``id`` is a long, ``schema_evolution("add-and-widen")``) under a running v3 sink. Entries hash the key's value, which the promotion keeps, so the index is kept:
    the next checkpoint indexes nothing again, and keys past the int range that arrive after it
    resolve like any other."""
    from pyiceberg.types import LongType

    def build(evolution: str = "off") -> Any:
        return partitioned(
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.ints")
            .create_if_missing(format_version=3)
            .cdc(op_column="op", key=["id"], order_by="lsn")
            .schema_evolution(evolution)
        ).build()

    def frame_of(rows: list[dict[str, Any]], id_type: str) -> Any:
        ddl = f"id {id_type}, region string, v string, n long, lsn long, op string"
        return spark.createDataFrame([tuple(r[c] for c in ("id", "region", "v", "n", "lsn", "op")) for r in rows], ddl)

    model: dict[int, dict[str, Any]] = {}
    ckpt = str(tmp_path / "ckpt")
    sink = build()
    for checkpoint, (ids, op) in enumerate([(range(100), "I"), (range(0, 100, 2), "U"), (range(0, 100, 5), "D")]):
        batch = changes(ids, checkpoint * 1000, op)
        sink.write(frame_of(batch, "int"), checkpoint_location=ckpt, checkpoint_id=checkpoint)
        apply(model, batch)
    assert sink.load_table().schema().find_field("id").field_type != LongType()
    indexed = sink.metrics().key_index_data_files_read
    assert indexed > 0
    sink.close()

    promoted = build("add-and-widen")
    big = [2**40 + i for i in range(5)]
    for checkpoint, (ids, op) in enumerate([(range(1, 100, 3), "U"), (big, "I"), (range(0, 100, 7), "D")], start=3):
        batch = changes(ids, checkpoint * 1000, op)
        outcome = promoted.write(frame_of(batch, "long"), checkpoint_location=ckpt, checkpoint_id=checkpoint)
        apply(model, batch)
        if checkpoint == 3:  # every file was indexed before the promotion: nothing is read again
            assert outcome.key_index_data_files_read == 0
    promoted.write(frame_of(changes(big[:2], 6000, "D"), "long"), checkpoint_location=ckpt, checkpoint_id=6)
    apply(model, changes(big[:2], 6000, "D"))
    table = promoted.load_table()
    assert table.schema().find_field("id").field_type == LongType()
    assert_readers_agree(java_readers, table.metadata_location, expected(model), ["id"])
    promoted.close()
