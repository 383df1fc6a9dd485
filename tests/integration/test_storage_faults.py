"""Storage faults: a full or read-only disk under the writer tasks, and a checkpoint location whose
staged manifest or committable is missing or corrupt when the job restarts.

The disk is real: a 2 MiB tmpfs mounted (as root, as the tests and CI run) as the table's data
location (``write.data.path``), so writers get ENOSPC / EROFS from the kernel.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink import WriteFailedError
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
