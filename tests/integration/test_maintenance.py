"""Expire snapshots, remove orphans, rewrite manifests, and the CLI — on tables the sink wrote."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidSinkConfigError
from iceberg_sink.committer.committer import find_max_committed_checkpoint
from iceberg_sink.topology import maintenance
from tests.integration.sources import EVENT_SCHEMA_DDL, write_source_files
from tests.interop.readers import JavaIcebergReader, normalize

ROOT = Path(__file__).resolve().parents[2]


def far_future() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(days=1)


def test_expiry_keeps_exactly_once_bookkeeping(spark: SparkSession, tmp_path: Path) -> None:
    write_source_files(tmp_path / "src", files=3, rows_per_file=20)
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.e").create_if_missing().build()
    stream = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "src"))
    sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True}).awaitTermination()
    job_id = sink.load_table().snapshots()[0].summary["iceberg-sink.job-id"]  # type: ignore[index]
    # Another writer commits afterwards, so the job's last snapshot is no longer the head.
    other = IcebergSink.builder().embedded(tmp_path / "lake").table("db.e").build()
    other.write(spark.read.schema(EVENT_SCHEMA_DDL).parquet(str(tmp_path / "src")).limit(5))
    other.write(spark.read.schema(EVENT_SCHEMA_DDL).parquet(str(tmp_path / "src")).limit(5))

    result = maintenance.expire_snapshots(sink.load_table, far_future(), retain_last=1)
    table = sink.load_table()
    remaining = [s.snapshot_id for s in table.snapshots()]
    assert len(result.expired_snapshot_ids) == 3 and len(remaining) == 2
    assert find_max_committed_checkpoint(table, "main", job_id, "iceberg-sink") == 2
    assert result.deleted_files  # manifest lists of expired snapshots
    assert all(not Path(p.removeprefix("file://")).exists() for p in result.deleted_files)
    # A restart of the stream still knows its batches are committed: nothing is doubled.
    sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True}).awaitTermination()
    assert sink.load_table().scan().to_arrow().num_rows == 70


def test_orphans_are_removed_only_when_old_and_unreferenced(spark: SparkSession, tmp_path: Path) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.o").create_if_missing().build()
    sink.write(spark.range(0, 10))
    table = sink.load_table()
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    old_orphan, young_orphan = data_dir / "00000-crashed-task.parquet", data_dir / "00001-running-task.parquet"
    old_orphan.write_bytes(b"x")
    young_orphan.write_bytes(b"y")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old_orphan, (two_days_ago, two_days_ago))
    # A pending committable's staged manifest and its files must survive, however old.
    from iceberg_sink import _faults

    def crash(point: str, cp: int) -> None:
        if point == _faults.AFTER_MANIFESTS:
            raise RuntimeError("driver lost")

    _faults.install(crash)
    try:
        with pytest.raises(RuntimeError):
            sink.write(spark.range(100, 110), checkpoint_location=str(tmp_path / "ckpt"))
    finally:
        _faults.clear()
    for path in data_dir.rglob("*"):
        if path != young_orphan:
            os.utime(path, (two_days_ago, two_days_ago))
    for path in (data_dir.parent / "metadata").iterdir():
        os.utime(path, (two_days_ago, two_days_ago))

    with pytest.raises(InvalidSinkConfigError, match="expected at least 1:00:00"):
        maintenance.remove_orphan_files(sink.load_table, dt.timedelta(minutes=5))
    dry = maintenance.remove_orphan_files(sink.load_table, dt.timedelta(days=1), dry_run=True)
    assert [Path(p).name for p in dry.orphan_files] == [old_orphan.name]
    assert old_orphan.exists()
    maintenance.remove_orphan_files(sink.load_table, dt.timedelta(days=1))
    assert not old_orphan.exists() and young_orphan.exists()
    # The pending checkpoint is still committable after the cleanup.
    sink.write(spark.range(100, 110), checkpoint_location=str(tmp_path / "ckpt"), checkpoint_id=0)
    assert sorted(sink.load_table().scan().to_arrow()["id"].to_pylist()) == [*range(10), *range(100, 110)]


def test_rewrite_manifests_keeps_the_rows(spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    sink = (
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.m").create_if_missing().upsert(key=["id"]).build()
    )
    for i in range(6):
        sink.write(spark.createDataFrame([(k, f"v{i}") for k in range(i, i + 4)], "id long, v string"))
    before = sink.load_table()
    expected = normalize(java_reader.read(before.metadata_location), ["id"])
    # One data manifest per write, one delete manifest per write but the first (its keys were all new).
    assert len(before.current_snapshot().manifests(before.io)) == 11  # type: ignore[union-attr]
    snapshot_id = maintenance.rewrite_manifests(sink.load_table)
    table = sink.load_table()
    assert snapshot_id is not None and len(table.current_snapshot().manifests(table.io)) == 2  # type: ignore[union-attr]
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected
    assert maintenance.rewrite_manifests(sink.load_table) is None
    # The stream's next upsert still replaces rows written before the rewrite (sequence numbers kept).
    sink.write(spark.createDataFrame([(0, "new")], "id long, v string"))
    rows = normalize(java_reader.read(sink.load_table().metadata_location), ["id"])
    assert rows[0] == {"id": 0, "v": "new"} and len(rows) == len(expected)


def test_cli_compacts_with_progress(spark: SparkSession, tmp_path: Path) -> None:
    sink = (
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.cli").create_if_missing(partition_by=["p"]).build()
    )
    for i in range(3):
        sink.write(spark.createDataFrame([(i * 10 + j, j % 2) for j in range(10)], "id long, p long"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "iceberg_sink.cli",
            "compact",
            "--embedded",
            str(tmp_path / "lake"),
            "--table",
            "db.cli",
            "--partition",
            "p=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rewrite  [##############################] 1/1 groups" in run.stdout
    assert "compacted db.cli: 3 data files" in run.stdout
    files = sink.load_table().inspect.files().to_pylist()
    assert sorted(f["partition"]["p"] for f in files) == [0, 0, 0, 1]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "iceberg_sink.cli",
            "remove-orphans",
            "--embedded",
            str(tmp_path / "lake"),
            "--table",
            "db.nope",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "table db.nope does not exist" in bad.stderr
