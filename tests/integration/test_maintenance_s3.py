"""remove-orphans on object storage: SeaweedFS S3 behind a REST catalog (``weed mini``).

Object stores list keys without a scheme (``bucket/key``) while Iceberg metadata references
``s3://bucket/key``, and the store is reached through the table's FileIO settings (endpoint, keys,
path style), not the process environment. Every file is checked independently afterwards: a listing
of the bucket with the test's own Arrow S3 client, and DuckDB and Iceberg Java (its own ``S3FileIO``)
reading the table straight from S3.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import _faults
from iceberg_sink._iceberg import manifests
from iceberg_sink.topology import maintenance
from tests.integration.seaweed import seaweed  # noqa: F401
from tests.integration.test_s3_rest import NAMESPACE, check_s3_table, kv_frame, read_back, sink_builder
from tests.interop.readers import JavaIcebergReader


def bucket_files(props: dict[str, str], location: str) -> set[str]:
    """Every object under ``location`` (``s3://bucket/prefix``), as ``s3://`` URIs, listed by the test itself."""
    fs = pafs.S3FileSystem(
        access_key=props["s3.access-key-id"],
        secret_key=props["s3.secret-access-key"],
        region=props["s3.region"],
        endpoint_override=props["s3.endpoint"],
        force_virtual_addressing=False,
    )
    root = location.removeprefix("s3://").rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return {"s3://" + i.path for i in infos if i.type == pafs.FileType.File}


def crash_after_manifests(point: str, checkpoint_id: int) -> None:
    if point == _faults.AFTER_MANIFESTS:
        raise RuntimeError("driver lost")


def test_remove_orphans_on_s3_deletes_exactly_the_orphan(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    identifier = f"{NAMESPACE}.orphans"
    # v2: equality deletes (a v3 table's Puffin files need a data path outside SeaweedFS's table bucket).
    sink = (
        sink_builder(seaweed, "orphans")
        .create_if_missing(partition_by=["k"], format_version=2)
        .upsert(key=["id", "k"])
        .build()
    )
    sink.write(kv_frame(spark, 0, 40, "a"))
    sink.write(kv_frame(spark, 20, 60, "b"))  # equality deletes on S3 too
    # A pending committable: its staged manifest (iceberg-sink-*.avro in the metadata folder) and its
    # data files are on S3 but no snapshot references them yet.
    _faults.install(crash_after_manifests)
    try:
        with pytest.raises(RuntimeError, match="driver lost"):
            sink.write(kv_frame(spark, 100, 110, "c"), checkpoint_location=str(tmp_path / "ckpt"))
    finally:
        _faults.clear()
    table = read_back(seaweed, identifier)
    location = table.location()
    assert location.startswith("s3://")
    staged = [p for p in bucket_files(seaweed, location) if p.rsplit("/", 1)[-1].startswith("iceberg-sink-")]
    assert staged, "the crash left no staged manifest: the test would not check that they are kept"
    orphan = f"{location}/data/k=3/00000-0-crashed-task.parquet"
    with table.io.new_output(orphan).create(overwrite=True) as out:
        out.write(b"a file a crashed task left behind")
    before = bucket_files(seaweed, location)
    assert orphan in before
    # Every listed file but the young ones is unreferenced by exact spelling in the listing's own terms;
    # the files written moments ago count as old only against a clock two hours ahead.
    assert maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1), dry_run=True).orphan_files == ()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)

    dry = maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1), dry_run=True, now=later)
    assert dry.orphan_files == (orphan,) and not dry.deleted
    assert bucket_files(seaweed, location) == before
    result = maintenance.remove_orphan_files(sink.load_table, dt.timedelta(hours=1), now=later)
    assert result.orphan_files == (orphan,) and result.deleted

    after = bucket_files(seaweed, location)
    assert before - after == {orphan}
    table = read_back(seaweed, identifier)
    missing = {p for p in manifests.reachable_files(table) if p not in after}
    assert not missing, f"referenced files deleted: {sorted(missing)[:5]}"
    expected = kv_frame(spark, 0, 20, "a").union(kv_frame(spark, 20, 60, "b")).toArrow()
    check_s3_table(seaweed, java_reader, table.metadata_location, expected, ["id"])
    # The pending checkpoint still commits: its staged manifest and data files survived.
    sink.write(kv_frame(spark, 100, 110, "c"), checkpoint_location=str(tmp_path / "ckpt"), checkpoint_id=0)
    table = read_back(seaweed, identifier)
    final = kv_frame(spark, 0, 20, "a").union(kv_frame(spark, 20, 60, "b")).union(kv_frame(spark, 100, 110, "c"))
    check_s3_table(seaweed, java_reader, table.metadata_location, final.toArrow(), ["id"])
