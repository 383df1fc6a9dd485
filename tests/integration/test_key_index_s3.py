"""The partitioned key index on object storage: SeaweedFS S3 behind a REST catalog (``weed mini``).

Its runs are read as many small ranged GETs at once (keyindex/fetch.py), opened and read through
the table's S3 FileIO on Spark's executors (properties in a broadcast). A v3 CDC table here keeps
its data, DVs, manifests and key index in an ordinary bucket (``write.data.path``,
``write.metadata.path``: SeaweedFS's table bucket takes only Iceberg's own file types); Iceberg Java
(its own S3FileIO) and DuckDB read every checked step straight from S3.

Session 33 saw DuckDB read this table wrong whenever earlier tests had moved Spark's task numbers
(they name the data files, whose order is the order of the DVs in a Puffin file): DuckDB 1.5.5's
cache misreads a small DV packed after a large one. The sink now writes a Puffin file per DV
(tests/integration/test_v3_dv_layout.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.position_deletes import FILE_PATH_ID
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.keyindex.persisted import index_location
from iceberg_sink.keyindex.runner import SparkRunner
from tests.integration.seaweed import create_bucket, seaweed  # noqa: F401
from tests.integration.test_cdc import apply, expected, frame
from tests.integration.test_key_index_restart import changes
from tests.integration.test_maintenance_s3 import bucket_files
from tests.integration.test_s3_rest import check_s3_table
from tests.interop.readers import JavaIcebergReader

pytestmark = pytest.mark.interop

NAMESPACE = "kis3"
BUCKET = "kis3data"


@pytest.fixture(scope="module")
def bucket(seaweed: dict[str, str]) -> str:  # noqa: F811
    return create_bucket(seaweed, BUCKET)


def s3_cdc_builder(seaweed: dict[str, str], bucket: str, name: str, format_version: int) -> Any:  # noqa: F811
    """A CDC sink's builder for table ``name`` whose data, metadata and key index are in ``bucket``
    (SeaweedFS's table bucket takes only Iceberg's own file types)."""
    return (
        IcebergSink.builder()
        .catalog("rest", **seaweed)
        .table(f"{NAMESPACE}.{name}")
        .create_if_missing(
            properties={
                "write.data.path": f"s3://{bucket}/{name}/data",
                "write.metadata.path": f"s3://{bucket}/{name}/metadata",
            },
            format_version=format_version,
        )
        .cdc(op_column="op", key=["id"], order_by="lsn")
    )


class Checkpoints:
    """Bounded ``write()``s of change batches under one checkpoint location, applied to a model."""

    def __init__(self, spark: SparkSession, location: Path) -> None:
        self.spark, self.location = spark, str(location)
        self.model: dict[int, dict[str, Any]] = {}
        self.checkpoint = 0

    def write(self, sink: IcebergSink, ids: range, op: str) -> Any:
        batch = changes(ids, self.checkpoint * 10_000, op)
        outcome = sink.write(frame(self.spark, batch), checkpoint_location=self.location, checkpoint_id=self.checkpoint)
        apply(self.model, batch)
        self.checkpoint += 1
        return outcome


def test_v3_deletes_resolve_through_the_partitioned_index_on_s3(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    bucket: str,
    java_readers: tuple[JavaIcebergReader, ...],
    tmp_path: Path,
) -> None:
    def build() -> Any:
        return (
            s3_cdc_builder(seaweed, bucket, "users", 3)
            .write_option("iceberg-sink.key-index.mode", "partitioned")
            .write_option("iceberg-sink.key-index.partitions", 4)
            .write_option("iceberg-sink.key-index.driver-max-bytes", 0)  # every step a Spark job
            .build()
        )

    checkpoints = Checkpoints(spark, tmp_path / "ckpt")
    write, model = checkpoints.write, checkpoints.model

    sink = build()
    write(sink, range(0, 3000), "I")
    write(sink, range(0, 3000, 2), "U")  # reaches the first files: indexed, looked up on S3
    write(sink, range(0, 3000, 7), "D")
    index: KeyIndex = sink._committer_index
    assert isinstance(index.runner, SparkRunner) and index.runner.jobs > 0 and index.runner.local.tasks == 0
    folder = index_location(sink.load_table()) + "/partitioned/"
    assert folder.startswith(f"s3://{bucket}/")
    stored = {f for f in bucket_files(seaweed, f"s3://{bucket}/users/metadata") if f.startswith(folder)}
    assert any(f.endswith(".run") for f in stored) and any(f.endswith("/current") for f in stored)
    sink.close()

    restarted = build()  # a new driver: the index's manifest from S3, nothing indexed again
    outcome = write(restarted, range(1, 3000, 3), "U")
    assert outcome.key_index_data_files_read == 0
    table = restarted.load_table()
    check_s3_table(seaweed, java_readers, table.metadata_location, expected(model), ["id"])
    restarted.close()


def test_a_store_that_refuses_the_index_fails_the_first_checkpoint_clearly(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    bucket: str,
    tmp_path: Path,
) -> None:
    """SeaweedFS's table bucket (like S3 Tables) takes only Iceberg's own file types: the index's
    runs would be refused deep inside a commit. The first checkpoint fails before its commit, with
    an error naming the option and the fix; nothing of it is committed, no secret is in the message."""
    sink = (
        IcebergSink.builder()
        .catalog("rest", **seaweed)
        .table(f"{NAMESPACE}.refused")
        .create_if_missing(properties={"write.data.path": f"s3://{bucket}/refused/data"}, format_version=3)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .write_option("iceberg-sink.key-index.mode", "partitioned")
        .build()
    )
    with pytest.raises(InvalidSinkConfigError) as raised:
        sink.write(frame(spark, changes(range(10), 0, "I")), checkpoint_location=str(tmp_path / "c"), checkpoint_id=0)
    message = str(raised.value)
    assert "write.metadata.path" in message and "iceberg-sink.key-index.mode=driver" in message
    assert seaweed["s3.secret-access-key"] not in message
    assert sink.load_table().current_snapshot() is None
    sink.close()


def test_v2_conversion_on_s3_merges_each_data_files_position_deletes_across_a_restart(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    bucket: str,
    java_readers: tuple[JavaIcebergReader, ...],
    tmp_path: Path,
) -> None:
    """Format v2, the conversion after every commit, everything on S3: each data file keeps one
    file-scoped position delete file, merged at every conversion. A restarted driver reads the old
    ones from S3 (several at once, keyindex/fetch.py) and the new ones are written the same way;
    Iceberg Java and DuckDB read the model straight from S3."""

    def build() -> Any:
        return (
            s3_cdc_builder(seaweed, bucket, "orders", 2)
            .convert_equality_deletes(every_n_commits=1, background=False)
            .build()
        )

    checkpoints = Checkpoints(spark, tmp_path / "ckpt")
    write, model = checkpoints.write, checkpoints.model

    def position_deletes(sink: IcebergSink) -> dict[str, str]:
        """Each live position delete file's path -> the one data file it names."""
        files = sink.load_table().inspect.files().to_pylist()
        named: dict[str, str] = {}
        for f in files:
            if f["content"] == 1:
                lower, upper = dict(f["lower_bounds"]), dict(f["upper_bounds"])
                assert lower[FILE_PATH_ID] == upper[FILE_PATH_ID], f["file_path"]  # file-scoped
                named[f["file_path"]] = lower[FILE_PATH_ID].decode()
            assert f["content"] != 2, "an equality delete file was left unconverted"
        assert len(set(named.values())) == len(named), "a data file has two position delete files"
        return named

    sink = build()
    for n in range(3):
        write(sink, range(n * 1000, (n + 1) * 1000), "I")  # three data files
    write(sink, range(0, 3000, 2), "U")
    first = position_deletes(sink)
    assert len(first) >= 3 and all(p.startswith(f"s3://{bucket}/") for p in first)
    sink.close()

    restarted = build()  # old positions from S3, merged with the new ones
    write(restarted, range(1, 3000, 3), "D")
    second = position_deletes(restarted)
    assert set(second.values()) >= set(first.values()) and not set(second) & set(first)
    table = restarted.load_table()
    check_s3_table(seaweed, java_readers, table.metadata_location, expected(model), ["id"])
    restarted.close()
