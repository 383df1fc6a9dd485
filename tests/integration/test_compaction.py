"""Compaction beside a live stream: small files merged, deletes applied and removed, no row resurrected.

Every table is read back by Apache Iceberg Java and DuckDB and compared with a model.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import CompactionConfig, IcebergSink
from iceberg_sink.topology.compaction import compact
from tests.integration.test_cdc import CHANGE_DDL, apply, expected, frame, random_changes
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop


def data_files_per_partition(table: Table) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    for f in table.inspect.files().to_pylist():
        if f["content"] == 0:
            key = tuple(sorted((f["partition"] or {}).items()))
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_small_append_files_are_merged(spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.a").create_if_missing(partition_by=["p"]).build()
    written = []
    for i in range(6):
        rows = [(i * 100 + j, j % 2) for j in range(50)]
        written += rows
        sink.write(spark.createDataFrame(rows, "id long, p long"))
    before = sink.load_table()
    assert set(data_files_per_partition(before).values()) == {6}
    progress: list[tuple[str, int, int]] = []
    result = sink.compact(spark, progress=lambda *a: progress.append(a))
    table = sink.load_table()
    assert result.rewritten_data_files == 12 and result.added_data_files == 2
    assert set(data_files_per_partition(table).values()) == {1}
    assert progress[0][0] == "plan" and progress[-1] == ("commit", 2, 2)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert snapshot.summary["total-records"] == "300" and snapshot.summary["total-data-files"] == "2"
    model = normalize(pa.Table.from_pylist([{"id": i, "p": p} for i, p in written]), ["id"])
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == model
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == model
    # Nothing more to do: a second run plans nothing and commits nothing.
    assert sink.compact(spark).snapshot_id is None


def cdc_sink(tmp_path: Path, **compaction: Any) -> Any:
    builder = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        .create_if_missing(partition_by=["region"], format_version=2)  # equality deletes to compact away
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
    )
    return builder.compaction(**compaction) if compaction else builder


def test_compaction_applies_and_removes_equality_deletes(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    rng = random.Random(5)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path).build()
    lsn = 0
    for _ in range(5):
        changes = random_changes(rng, model, lsn, 40, keys=30)
        lsn = max(c["lsn"] for c in changes)
        sink.write(frame(spark, changes))
        apply(model, changes)
    assert int(sink.load_table().current_snapshot().summary["total-delete-files"]) > 0  # type: ignore[union-attr,index]
    result = sink.compact(spark)
    table = sink.load_table()
    assert result.removed_delete_files > 0
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary["total-delete-files"] == "0" and summary["total-equality-deletes"] == "0"  # type: ignore[index]
    assert set(data_files_per_partition(table).values()) == {1}
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected(model)
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected(model)
    # With no equality deletes left, PyIceberg can read the table too.
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == expected(model)


def racing(load: Callable[[], Table], before_commit: Callable[[], None]) -> Callable[[], Table]:
    """A table loader that lets another writer commit between the plan and the compaction's commit."""
    calls = {"n": 0}

    def loader() -> Table:
        calls["n"] += 1
        if calls["n"] == 2:
            before_commit()
        return load()

    return loader


def test_deletes_committed_during_compaction_are_not_resurrected(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    rng = random.Random(9)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path).build()
    lsn = 0
    for _ in range(3):
        changes = random_changes(rng, model, lsn, 30, keys=20)
        lsn = max(c["lsn"] for c in changes)
        sink.write(frame(spark, changes))
        apply(model, changes)
    # While the compaction rewrites the files holding these rows, the stream deletes and updates them.
    victims = sorted(model)[:8]
    meanwhile = [
        {**model[k], "lsn": lsn + i + 1, "op": "D" if i % 2 else "U", "v": "during"} for i, k in enumerate(victims)
    ]

    def stream_commits() -> None:
        sink.write(frame(spark, meanwhile))
        apply(model, meanwhile)

    result = compact(spark, racing(sink.load_table, stream_commits), CompactionConfig())
    assert result.committed_groups > 0 and result.dropped_groups == 0
    table = sink.load_table()
    snapshots = table.snapshots()
    assert snapshots[-1].summary.operation.value == "replace"  # type: ignore[union-attr]
    assert snapshots[-2].summary["iceberg-sink.checkpoint-id"] is not None  # type: ignore[index]
    rows = normalize(java_reader.read(table.metadata_location), ["id"])
    assert rows == expected(model)
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected(model)
    # The stream's equality deletes (newer than the rewrite) stay, since they still apply.
    assert int(table.current_snapshot().summary["total-equality-deletes"]) > 0  # type: ignore[union-attr,index]


def test_group_whose_files_were_already_rewritten_is_dropped(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.c").create_if_missing(partition_by=["p"]).build()
    for i in range(4):
        sink.write(spark.createDataFrame([(i * 10 + j, j % 2) for j in range(10)], "id long, p long"))
    other: dict[str, Any] = {}

    def other_compaction() -> None:
        other["result"] = sink.compact(spark)

    result = compact(spark, racing(sink.load_table, other_compaction), CompactionConfig())
    assert other["result"].committed_groups == 2
    assert result.snapshot_id is None and result.dropped_groups == 2
    table = sink.load_table()
    assert [s.summary.operation.value for s in table.snapshots()].count("replace") == 1  # type: ignore[union-attr]
    assert sorted(java_reader.read(table.metadata_location).column("id").to_pylist()) == list(range(40))
    # The dropped groups' new files were deleted: on disk are the live files and the inputs the
    # other compaction replaced (kept until their snapshots expire), nothing else.
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    on_disk = {str(p) for p in data_dir.rglob("*.parquet")}
    live = {f["file_path"].removeprefix("file://") for f in table.inspect.files().to_pylist()}
    assert len(live) == 2 and len(on_disk - live) == 8


@pytest.mark.parametrize("background", [False, True])
def test_stream_with_upserts_and_compaction_stays_bounded_and_correct(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, background: bool
) -> None:
    import os

    import pyarrow.parquet as pq

    rng = random.Random(21)
    model: dict[int, dict[str, Any]] = {}
    source = tmp_path / "changes"
    source.mkdir()
    schema = pa.schema(
        [(n, pa.int64() if t == "long" else pa.string()) for n, t in (c.split() for c in CHANGE_DDL.split(", "))]
    )
    lsn = 0
    models = []
    for i in range(12):
        changes = random_changes(rng, model, lsn, 25, keys=30)
        lsn = max(c["lsn"] for c in changes)
        apply(model, changes)
        models.append(expected(model))
        pq.write_table(pa.Table.from_pylist(changes, schema=schema), source / f"part-{i:03d}.parquet")
        os.utime(source / f"part-{i:03d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
    # After every commit, remember the table's metadata file: each must read as the model of its
    # checkpoint, whatever compactions ran before it (inline or in the background).
    states: list[tuple[int, str]] = []
    holder: dict[str, Any] = {}
    builder = cdc_sink(tmp_path, every_n_commits=3, background=background)
    builder.post_commit_hook(lambda r: states.append((r.checkpoint_id, holder["sink"].load_table().metadata_location)))
    sink = builder.build()
    holder["sink"] = sink
    stream = spark.readStream.schema(CHANGE_DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    sink.await_compactions(300)
    metrics = sink.metrics()
    assert metrics.compactions_failed == 0
    assert metrics.compactions_succeeded >= (2 if background else 4)
    table = sink.load_table()
    checkpoints = [
        s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots() if s.summary.operation.value != "replace"
    ]  # type: ignore[union-attr,index]
    assert checkpoints == [str(i) for i in range(12)]
    # Without compaction each region would hold 12 data files by now.
    assert max(data_files_per_partition(table).values()) <= 4
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected(model)
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected(model)
    assert [c for c, _ in states] == list(range(12))
    for checkpoint, location in states:
        assert normalize(java_reader.read(location), ["id"]) == models[checkpoint], f"checkpoint {checkpoint}"
        assert normalize(duckdb_read(location), ["id"]) == models[checkpoint], f"checkpoint {checkpoint}"


def test_bounded_writes_share_one_trigger_and_drop_dead_manifests(spark: SparkSession, tmp_path: Path) -> None:
    """Each write() is a job of its own, but all count towards the sink's compaction trigger; and
    manifests left with only deleted entries by a compaction are not carried into later snapshots."""
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.w")
        .create_if_missing(partition_by=["p"])
        .compaction(every_n_commits=3)
        .build()
    )
    for i in range(7):
        sink.write(spark.createDataFrame([(i * 10 + j, j % 2) for j in range(10)], "id long, p long"))
    assert sink.metrics().compactions_succeeded == 2
    table = sink.load_table()
    assert max(data_files_per_partition(table).values()) <= 2
    manifests = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    assert all((m.added_files_count or 0) + (m.existing_files_count or 0) > 0 for m in manifests)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(70))
