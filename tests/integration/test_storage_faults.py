"""Storage faults: a full or read-only disk under the writer tasks, and a checkpoint location whose
staged manifest or committable is missing or corrupt when the job restarts.

The disk is real: a 2 MiB tmpfs mounted (as root, as the tests and CI run) as the table's data
location (``write.data.path``), so writers get ENOSPC / EROFS from the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, UncommittableCheckpointError, WriteFailedError, _faults
from iceberg_sink._iceberg.manifests import reachable_files
from tests.integration.sources import EVENT_SCHEMA_DDL, event_batch, write_source_files
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True, capture_output=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def events(spark: SparkSession, start: int, n: int, partitions: int = 2) -> object:
    return spark.createDataFrame(event_batch(start, n).to_pylist(), EVENT_SCHEMA_DDL).repartition(partitions)


def noisy_events(spark: SparkSession, n: int) -> object:
    """Rows that do not compress: n rows of ~1 KiB random text."""
    rows = [(i, i % 7, None, os.urandom(512).hex(), float(i)) for i in range(n)]
    return spark.createDataFrame(rows, EVENT_SCHEMA_DDL).repartition(2)


def sink_on(tmp_path: Path, data_dir: Path) -> IcebergSink:
    return (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.events")
        .create_if_missing(properties={"write.data.path": data_dir.as_uri()})
        .build()
    )


def files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


def test_full_disk_fails_the_write_and_commits_nothing(
    spark: SparkSession, java_reader: JavaIcebergReader, small_disk: Path, tmp_path: Path
) -> None:
    sink = sink_on(tmp_path, small_disk)
    sink.write(events(spark, 0, 50))
    before = sink.load_table()
    kept = set(files_under(small_disk))

    with pytest.raises(WriteFailedError) as failed:
        sink.write(noisy_events(spark, 6000))  # ~6 MiB of incompressible text on a 2 MiB disk
    message = str(failed.value)
    assert "No space left on device" in message, message
    assert "Nothing of it was committed" in message, message
    assert "Traceback" not in message and "at org.apache" not in message, message

    table = sink.load_table()
    assert table.metadata.current_snapshot_id == before.metadata.current_snapshot_id
    assert len(table.snapshots()) == 1
    # A failed task deletes its files; a task Spark cancelled meanwhile may leave some: orphans.
    referenced = {p.removeprefix("file://") for p in reachable_files(table)}
    assert not {str(p) for p in set(files_under(small_disk)) - kept} & referenced
    expected = normalize(event_batch(0, 50), ["event_id"])
    assert normalize(java_reader.read(table.metadata_location), ["event_id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected

    # Room again: the next write goes through.
    sink.write(events(spark, 50, 30))
    table = sink.load_table()
    expected = normalize(pa.concat_tables([event_batch(0, 50), event_batch(50, 30)]), ["event_id"])
    assert normalize(java_reader.read(table.metadata_location), ["event_id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected


def test_read_only_disk_stops_the_stream_and_a_restart_writes_the_checkpoint(
    spark: SparkSession, java_reader: JavaIcebergReader, small_disk: Path, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    tables = write_source_files(source, files=2, rows_per_file=30)
    sink = sink_on(tmp_path, small_disk)
    stream = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    checkpoint = str(tmp_path / "ckpt")
    sink.start(stream, checkpoint, trigger={"availableNow": True}).awaitTermination()
    committed = sink.load_table().metadata.current_snapshot_id

    write_source_files(source, files=1, rows_per_file=30, first_file=2)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True, capture_output=True)
    try:
        query = sink.start(stream, checkpoint, trigger={"availableNow": True})
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True, capture_output=True)
    message = str(failed.value)
    assert "WriteFailedError: checkpoint 2 of table db.events was not written" in message, message
    assert "Read-only file system" in message, message
    assert sink.load_table().metadata.current_snapshot_id == committed

    # The disk is writable again: the restarted stream writes checkpoint 2, once.
    sink.start(stream, checkpoint, trigger={"availableNow": True}).awaitTermination()
    table = sink.load_table()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]
    expected = normalize(pa.concat_tables([*tables, event_batch(60, 30)]), ["event_id"])
    assert normalize(java_reader.read(table.metadata_location), ["event_id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected


def staged_checkpoint(spark: SparkSession, tmp_path: Path) -> tuple[IcebergSink, Path]:
    """Checkpoint 0 committed, checkpoint 1 staged and its committable stored, then the driver 'died'."""
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.events").create_if_missing().build()
    checkpoint = tmp_path / "ckpt"
    sink.write(events(spark, 0, 40), checkpoint_location=str(checkpoint), checkpoint_id=0)

    def crash(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_MANIFESTS:
            raise RuntimeError("driver lost")

    _faults.install(crash)
    try:
        with pytest.raises(RuntimeError, match="driver lost"):
            sink.write(events(spark, 40, 40), checkpoint_location=str(checkpoint), checkpoint_id=1)
    finally:
        _faults.clear()
    return sink, checkpoint


def committable_file(checkpoint: Path, checkpoint_id: int) -> Path:
    return checkpoint / "iceberg_sink" / "committables" / f"{checkpoint_id:020d}.json"


def check_only_checkpoint_0(java_reader: JavaIcebergReader, sink: IcebergSink) -> None:
    table = sink.load_table()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0"]  # type: ignore[index]
    expected = normalize(event_batch(0, 40), ["event_id"])
    assert normalize(java_reader.read(table.metadata_location), ["event_id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_damaged_staged_manifest_is_a_clear_error_on_restart(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, damage: str
) -> None:
    sink, checkpoint = staged_checkpoint(spark, tmp_path)
    stored = json.loads(committable_file(checkpoint, 1).read_bytes())
    manifest = Path(stored["data_manifest"]["path"].removeprefix("file://"))
    if damage == "missing":
        manifest.unlink()
    else:
        manifest.write_bytes(manifest.read_bytes()[: manifest.stat().st_size // 2])

    for restart in (
        lambda: sink.write(events(spark, 40, 40), checkpoint_location=str(checkpoint), checkpoint_id=1),
        lambda: sink.write(events(spark, 80, 40), checkpoint_location=str(checkpoint)),  # commits pending first
    ):
        with pytest.raises(UncommittableCheckpointError) as failed:
            restart()
        message = str(failed.value)
        assert str(manifest) in message, message
        assert ("is missing" if damage == "missing" else "cannot be read") in message, message
        assert "committables/00000000000000000001.json" in message, message
        assert "write the batch again" in message, message
    # Nothing skipped: the committable stays until someone decides, the table is unchanged.
    assert committable_file(checkpoint, 1).exists()
    check_only_checkpoint_0(java_reader, sink)


@pytest.mark.parametrize("damage", ["corrupt", "empty"])
def test_damaged_committable_is_a_clear_error_on_restart(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, damage: str
) -> None:
    sink, checkpoint = staged_checkpoint(spark, tmp_path)
    path = committable_file(checkpoint, 1)
    path.write_bytes(path.read_bytes()[:40] if damage == "corrupt" else b"")

    for restart in (
        lambda: sink.write(events(spark, 40, 40), checkpoint_location=str(checkpoint), checkpoint_id=1),
        lambda: sink.write(events(spark, 80, 40), checkpoint_location=str(checkpoint)),
    ):
        with pytest.raises(UncommittableCheckpointError) as failed:
            restart()
        message = str(failed.value)
        assert str(path) in message, message
        assert "iceberg-sink.checkpoint-id" in message, message
    assert path.exists()
    check_only_checkpoint_0(java_reader, sink)
