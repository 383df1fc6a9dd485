"""Expire snapshots, remove orphans, rewrite manifests, and the CLI — on tables the sink wrote."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidSinkConfigError, MaintenanceRefusedError
from iceberg_sink._iceberg import manifests
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
            "--progress",  # stdout is not a terminal here: progress only when asked
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
    # Exit code 3: not found (docs/cli.md); one line, no stack trace.
    assert bad.returncode == 3 and bad.stderr.endswith(
        f"table db.nope does not exist in the embedded catalog at {tmp_path / 'lake'}\n"
    )
    assert "Traceback" not in bad.stderr


def test_expiry_keeps_the_newest_snapshot_of_a_job_with_a_custom_prefix(spark: SparkSession, tmp_path: Path) -> None:
    prefix = "acme.ingest"
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.p")
        .create_if_missing()
        .write_option("iceberg-sink.snapshot-property-prefix", prefix)
        .build()
    )
    checkpoints = str(tmp_path / "ckpt")
    for cp in range(3):
        sink.write(spark.range(cp * 10, cp * 10 + 10), checkpoint_location=checkpoints, checkpoint_id=cp)
    newest = sink.load_table().current_snapshot()
    assert newest is not None and newest.summary is not None
    job_id = newest.summary[f"{prefix}.job-id"]
    assert "iceberg-sink.job-id" not in newest.summary.additional_properties
    # Other writers commit afterwards, so the job's last snapshot is neither the head nor within retain_last.
    other = IcebergSink.builder().embedded(tmp_path / "lake").table("db.p").build()
    other.write(spark.range(100, 105))
    other.write(spark.range(105, 110))

    maintenance.expire_snapshots(sink.load_table, far_future(), retain_last=1)
    # A replay of the job's last checkpoint (its driver died before recording the commit) is skipped.
    outcome = sink.write(spark.range(20, 30), checkpoint_location=checkpoints, checkpoint_id=2)
    assert outcome is not None and outcome.already_committed and outcome.snapshot is None
    table = sink.load_table()
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [*range(30), *range(100, 110)]
    kept = [s for s in table.snapshots() if s.summary is not None and s.summary.get(f"{prefix}.job-id") == job_id]
    assert [s.snapshot_id for s in kept] == [newest.snapshot_id]
    assert find_max_committed_checkpoint(table, "main", job_id, prefix) == 2


def live_entries(table: Table, snapshot_id: int) -> set[tuple[str, int, int, int]]:
    """(path, content, data sequence number, file sequence number) of a snapshot's live files."""
    entries = table.inspect.entries(snapshot_id=snapshot_id).to_pylist()
    return {
        (e["data_file"]["file_path"], e["data_file"]["content"], e["sequence_number"], e["file_sequence_number"])
        for e in entries
        if e["status"] != 2
    }


def test_expiry_keeps_files_another_branch_still_references(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    main = IcebergSink.builder().embedded(lake).table("db.b").create_if_missing().build()
    for i in range(3):
        main.write(spark.range(i * 10, i * 10 + 10).repartition(1))
    audit = IcebergSink.builder().embedded(lake).table("db.b").branch("audit").build()
    audit.write(spark.range(50, 55).repartition(1))  # forks audit from main's head
    compacted = main.compact(spark)  # main no longer references the three small files; audit does
    assert compacted.rewritten_data_files == 3, compacted
    main.write(spark.range(60, 65).repartition(1))
    table = main.load_table()
    audit_head = table.metadata.refs["audit"].snapshot_id
    audit_files = {p for p, *_ in live_entries(table, audit_head)}

    result = maintenance.expire_snapshots(main.load_table, far_future(), retain_last=1)
    table = main.load_table()
    assert {s.snapshot_id for s in table.snapshots()} == {audit_head, table.metadata.refs["main"].snapshot_id}
    assert len(result.expired_snapshot_ids) == 4  # three writes, the compaction, none of them a head
    assert result.deleted_files, "nothing was deleted: the check below would prove nothing"
    assert not audit_files & set(result.deleted_files)
    missing = [p for p in manifests.reachable_files(table) if not Path(p.removeprefix("file://")).exists()]
    assert not missing, missing
    assert sorted(table.scan(snapshot_id=audit_head).to_arrow()["id"].to_pylist()) == [*range(30), *range(50, 55)]
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [*range(30), *range(60, 65)]


def test_rewrite_manifests_on_a_branch(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    # v2: the branch's equality deletes need the rewritten manifests' sequence numbers.
    main = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.rb")
        .create_if_missing(format_version=2)
        .upsert(key=["id"])
        .build()
    )
    main.write(spark.createDataFrame([(k, "main") for k in range(4)], "id long, v string"))
    dev = IcebergSink.builder().embedded(lake).table("db.rb").branch("dev").upsert(key=["id"]).build()
    for i in range(4):
        dev.write(spark.createDataFrame([(k, f"dev{i}") for k in range(i, i + 3)], "id long, v string"))
    before = main.load_table()
    main_head, dev_head = before.metadata.refs["main"].snapshot_id, before.metadata.refs["dev"].snapshot_id
    dev_manifests = len(before.snapshot_by_id(dev_head).manifests(before.io))  # type: ignore[union-attr]
    assert dev_manifests >= 6
    expected = live_entries(before, dev_head)

    snapshot_id = maintenance.rewrite_manifests(main.load_table, branch="dev")
    table = main.load_table()
    assert snapshot_id is not None and table.metadata.refs["dev"].snapshot_id == snapshot_id
    assert table.metadata.refs["main"].snapshot_id == main_head
    new = table.snapshot_by_id(snapshot_id)
    assert new is not None and new.parent_snapshot_id == dev_head
    assert len(new.manifests(table.io)) == 2
    # Same live files with the same sequence numbers: the branch's equality deletes apply as before.
    assert live_entries(table, snapshot_id) == expected
    assert maintenance.rewrite_manifests(main.load_table, branch="dev") is None


def test_an_unreadable_staged_manifest_stops_orphan_removal(spark: SparkSession, tmp_path: Path) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.u").create_if_missing().build()
    sink.write(spark.range(0, 10))
    root = Path(sink.load_table().location().removeprefix("file://"))
    # A staged manifest nobody can read: the data files its checkpoint wrote are unknown, so none of
    # the unreferenced files may be deleted (this one could be one of them).
    unknown = root / "data" / "00000-9-staged-by-a-pending-checkpoint.parquet"
    unknown.write_bytes(b"rows of a pending checkpoint")
    (root / "metadata" / "iceberg-sink-job-000007-abc-data.avro").write_bytes(b"not avro")
    two_days_ago = time.time() - 2 * 86400
    for path in [*root.rglob("*")]:
        os.utime(path, (two_days_ago, two_days_ago))
    files = sorted(p for p in root.rglob("*") if p.is_file())

    with pytest.raises(MaintenanceRefusedError, match=r"cannot read the staged manifest .*iceberg-sink-job-000007"):
        maintenance.remove_orphan_files(sink.load_table, dt.timedelta(days=1))
    assert sorted(p for p in root.rglob("*") if p.is_file()) == files


def test_remove_orphans_matches_partition_paths_with_escaped_characters(spark: SparkSession, tmp_path: Path) -> None:
    sink = (
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.esc").create_if_missing(partition_by=["p"]).build()
    )
    values = ["a b", "50%", "q?r#s", "c/d", "é=1&x+y"]
    sink.write(spark.createDataFrame([(i, v) for i, v in enumerate(values)], "id long, p string"))
    sink.write(spark.createDataFrame([(i + 10, v) for i, v in enumerate(values)], "id long, p string"))
    root = Path(sink.load_table().location().removeprefix("file://"))
    orphan = root / "data" / "p=a+b" / "00000-crashed-task.parquet"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"x")
    files = {p for p in root.rglob("*") if p.is_file()}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)  # every file counts as old
    with pytest.raises(InvalidSinkConfigError, match="expected a timezone-aware datetime"):
        maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1), now=later.replace(tzinfo=None))

    result = maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1), now=later)
    assert [Path(p).name for p in result.orphan_files] == [orphan.name]
    assert {p for p in root.rglob("*") if p.is_file()} == files - {orphan}
    rows = sink.load_table().scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["p"]) for r in rows) == sorted(
        [(i, v) for i, v in enumerate(values)] + [(i + 10, v) for i, v in enumerate(values)]
    )
