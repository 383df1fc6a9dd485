"""Metadata files stay bounded: every commit the sink makes (checkpoints, compaction's rewrite, manifest
rewrites, snapshot expiry, a spec added for global deletes) keeps the metadata log to
``write.metadata.previous-versions-max`` and, with ``write.metadata.delete-after-commit.enabled``,
deletes the metadata files dropped from the log; the table still reads with Iceberg Java and DuckDB."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink._iceberg import producer, rewrites, specs
from iceberg_sink._iceberg.entries import live_files
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committer import IcebergCommitter
from iceberg_sink.topology import maintenance
from tests.helpers import write_batches, writer_spec
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()), identifier_field_ids=[1]
)
MAX = 3
NO_WAIT = RetryPolicy(num_retries=3, min_wait_ms=0, max_wait_ms=0)


def make_catalog(tmp_path: Path, delete_after_commit: bool) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("db")
    properties = {
        "format-version": "2",
        "write.metadata.previous-versions-max": str(MAX),
        "write.metadata.delete-after-commit.enabled": str(delete_after_commit).lower(),
        "commit.manifest.min-count-to-merge": "3",
    }
    # Partitioned, so that adding the unpartitioned spec (for global deletes) is a commit too.
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(2), "id_bucket"))
    cat.create_table("db.t", schema=SCHEMA, partition_spec=spec, properties=properties)
    return cat


def metadata_json_files(table: Table) -> set[str]:
    folder = Path(table.location().removeprefix("file://")) / "metadata"
    return {str(p) for p in folder.glob("*.metadata.json")}


def logged(table: Table) -> set[str]:
    return {e.metadata_file.removeprefix("file://") for e in table.metadata.metadata_log} | {
        table.metadata_location.removeprefix("file://")
    }


def upsert(cat: SqlCatalog, checkpoint: int, ids: list[int], model: dict[int, str]) -> Table:
    table = cat.load_table("db.t")
    values = [f"c{checkpoint}-{i}" for i in ids]
    model.update(zip(ids, values, strict=True))
    batch = pa.table({"id": pa.array(ids, pa.int64()), "v": values, "op": ["U"] * len(ids)})
    result = write_batches(writer_spec(table, checkpoint_id=checkpoint, op_column="op", equality_field_ids=(1,)), batch)
    committable = CommitAggregator("db.t", "main", "job").aggregate(table, table.io, checkpoint, [result])
    assert committable is not None
    IcebergCommitter(lambda: cat.load_table("db.t"), "main", "job", NO_WAIT, sleep=lambda s: None).commit(committable)
    return cat.load_table("db.t")


def every_commit_kind(cat: SqlCatalog, model: dict[int, str], check: object) -> Table:
    """Checkpoints, a compaction rewrite, a spec added, a manifest rewrite and snapshot expiry;
    ``check(table)`` after each."""
    assert callable(check)
    table = cat.load_table("db.t")
    for checkpoint in range(6):
        table = upsert(cat, checkpoint, [checkpoint, checkpoint + 1, 100 + checkpoint], model)
        check(table)
    # Compaction's commit: every live file rewritten into new data files holding the live rows, at
    # the sequence number the rewrite read (no delete is committed meanwhile).
    data, deletes = live_files(table, table.current_snapshot())
    rows = pa.Table.from_pylist([{"id": k, "v": v} for k, v in model.items()], schema=SCHEMA.as_arrow())
    new = write_batches(writer_spec(table, checkpoint_id=50), rows)
    removed = frozenset(f.meta.path for f in data + deletes)
    read_seq = table.current_snapshot().sequence_number  # type: ignore[union-attr]
    table = producer.commit_prepared(
        table, rewrites.RewriteFiles(table, "main", new.data_files, removed, read_seq, {}).prepare()
    )
    check(table)
    table = specs.with_unpartitioned_spec(table)
    check(table)
    maintenance.rewrite_manifests(lambda: cat.load_table("db.t"), entries_per_manifest=2)
    table = cat.load_table("db.t")
    check(table)
    maintenance.expire_snapshots(lambda: cat.load_table("db.t"), dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    table = cat.load_table("db.t")
    check(table)
    table = upsert(cat, 6, [1, 2], model)
    check(table)
    return table


def test_delete_after_commit_keeps_only_the_logged_metadata_files(
    tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    cat = make_catalog(tmp_path, delete_after_commit=True)
    model: dict[int, str] = {}

    def check(table: Table) -> None:
        assert len(table.metadata.metadata_log) <= MAX
        # The files dropped from the log are gone from storage; the logged ones are all there.
        assert metadata_json_files(table) == logged(table)

    table = every_commit_kind(cat, model, check)
    expected = normalize(pa.Table.from_pylist([{"id": k, "v": v} for k, v in model.items()]), ["id"])
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected


def test_without_delete_after_commit_the_log_is_trimmed_and_files_stay(tmp_path: Path) -> None:
    cat = make_catalog(tmp_path, delete_after_commit=False)
    versions: list[int] = []

    def check(table: Table) -> None:
        assert len(table.metadata.metadata_log) <= MAX
        versions.append(len(metadata_json_files(table)))

    every_commit_kind(cat, {}, check)
    # One metadata file per commit, none deleted.
    assert versions == sorted(versions) and versions[-1] > MAX + 1
