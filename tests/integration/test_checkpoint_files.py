"""A stream on a local checkpoint location writes Spark's offset and commit logs with the file-system
checkpoint manager (iceberg_sink/job/checkpoint_files.py): the query's own logs are asked which class
writes them, the session's setting is left as it was, a session naming a manager keeps it, and a
restarted query resumes from the logs written that way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.job import checkpoint_files
from tests.integration.sources import write_source_files
from tests.integration.test_streaming import expected_rows, stream
from tests.interop.readers import duckdb_read, normalize

FILE_CONTEXT = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"


def log_managers(query: Any) -> tuple[str, str]:
    """The classes writing the running query's offset log and commit log."""
    execution = query._jsq.streamingQuery()
    return (
        execution.offsetLog().fileManager().getClass().getName(),
        execution.commitLog().fileManager().getClass().getName(),
    )


def run(sink: IcebergSink, spark: SparkSession, source: Path, checkpoint: Path) -> tuple[str, str]:
    query = sink.start(stream(spark, source), str(checkpoint))
    try:
        managers = log_managers(query)
        query.processAllAvailable()
    finally:
        query.stop()
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]
    return managers


def test_a_local_checkpoint_is_written_without_file_context(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    assert spark.conf.get(checkpoint_files.MANAGER_KEY, None) is None
    tables = write_source_files(tmp_path / "src", files=2, rows_per_file=20)
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.ckpt_files").create_if_missing().build()
    managers = run(sink, spark, tmp_path / "src", tmp_path / "ckpt")
    assert all(m.endswith(".FileSystemBasedCheckpointFileManager") for m in managers), managers
    assert spark.conf.get(checkpoint_files.MANAGER_KEY, None) is None  # the session's setting put back
    assert sorted(p.name for p in (tmp_path / "ckpt" / "offsets").iterdir() if not p.name.startswith(".")) == [
        "0",
        "1",
    ]
    # A restarted query reads those logs: it resumes after batch 1 and writes only the new file.
    tables += write_source_files(tmp_path / "src", files=1, rows_per_file=20, first_file=2)
    run(sink, spark, tmp_path / "src", tmp_path / "ckpt")
    table = sink.load_table()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected_rows(tables)


def test_a_session_naming_a_manager_keeps_it(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    write_source_files(tmp_path / "src", files=1, rows_per_file=10)
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.ckpt_own").create_if_missing().build()
    spark.conf.set(checkpoint_files.MANAGER_KEY, FILE_CONTEXT)
    try:
        managers = run(sink, spark, tmp_path / "src", tmp_path / "ckpt")
        assert spark.conf.get(checkpoint_files.MANAGER_KEY) == FILE_CONTEXT
    finally:
        spark.conf.unset(checkpoint_files.MANAGER_KEY)
    assert managers == (FILE_CONTEXT, FILE_CONTEXT)


@pytest.mark.parametrize(
    ("location", "default_fs", "local"),
    [
        ("file:///tmp/ckpt", None, True),
        ("/tmp/ckpt", None, True),
        ("relative/ckpt", None, True),
        ("/tmp/ckpt", "hdfs://namenode:8020", False),
        ("file:/tmp/ckpt", "hdfs://namenode:8020", True),
        ("s3a://bucket/ckpt", None, False),
        ("hdfs://namenode/ckpt", None, False),
        ("abfss://c@account.dfs.core.windows.net/ckpt", None, False),
    ],
)
def test_which_locations_are_local(spark: SparkSession, location: str, default_fs: str | None, local: bool) -> None:
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    before = hadoop.get("fs.defaultFS")
    if default_fs is not None:
        hadoop.set("fs.defaultFS", default_fs)
    try:
        assert checkpoint_files.on_local_filesystem(spark, location) is local
        settings = checkpoint_files.query_settings(spark, location)
        assert bool(settings) is local, settings
    finally:
        if before is None:
            hadoop.unset("fs.defaultFS")
        else:
            hadoop.set("fs.defaultFS", before)
