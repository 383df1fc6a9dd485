"""Manifests merged on commit (``commit.manifest.min-count-to-merge``, as Iceberg Java's merge-append):
the snapshot lists few manifests, every entry keeps its snapshot id and sequence numbers, and Iceberg
Java and DuckDB read the same rows (CDC equality deletes across merged delete manifests, two partition
specs, format version 1). Checkpoints are committed by the real committer; files are written by the
real task writer, without Spark."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink._iceberg import manifests, producer, rewrites, row_delta
from iceberg_sink._iceberg.entries import live_files
from iceberg_sink._iceberg.merge import pack_end
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committer import IcebergCommitter
from tests.helpers import write_batches, writer_spec
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType()),
    NestedField(3, "v", StringType()),
    identifier_field_ids=[1],
)
MIN_COUNT = 3
NO_WAIT = RetryPolicy(num_retries=3, min_wait_ms=0, max_wait_ms=0)

# path -> (snapshot id, data sequence number, file sequence number)
Identity = dict[str, tuple[int, int, int]]


def make_table(tmp_path: Path, version: int, spec: PartitionSpec | None = None, **props: str) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("db")
    properties = {"format-version": str(version), "commit.manifest.min-count-to-merge": str(MIN_COUNT), **props}
    cat.create_table("db.t", schema=SCHEMA, partition_spec=spec or PartitionSpec(), properties=properties)
    return cat


def entries(table: Table) -> Identity:
    """The live entries of the current snapshot, as our own manifest reading sees them."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    result: Identity = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            assert entry.snapshot_id is not None
            path = entry.data_file.file_path
            assert path not in result, f"{path} listed twice"
            result[path] = (entry.snapshot_id, int(entry.sequence_number or 0), int(entry.file_sequence_number or 0))
    return result


def commit_checkpoint(cat: SqlCatalog, checkpoint: int, batch: pa.Table, cdc: bool) -> Table:
    table = cat.load_table("db.t")
    spec = writer_spec(
        table, checkpoint_id=checkpoint, **({"op_column": "op", "equality_field_ids": (1,)} if cdc else {})
    )
    result = write_batches(spec, batch)
    committable = CommitAggregator("db.t", "main", "job").aggregate(table, table.io, checkpoint, [result])
    assert committable is not None
    IcebergCommitter(lambda: cat.load_table("db.t"), "main", "job", NO_WAIT, sleep=lambda s: None).commit(committable)
    return cat.load_table("db.t")


def record_new(table: Table, before: Identity, expected: Identity) -> None:
    """Files the current snapshot added carry its id and sequence number; the others are unchanged."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    seq = snapshot.sequence_number or 0
    now = entries(table)
    for path in now.keys() - before.keys():
        expected[path] = (snapshot.snapshot_id, seq, seq)
    for path in before.keys() - now.keys():
        del expected[path]


def manifest_counts(table: Table) -> tuple[int, int]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    listed = snapshot.manifests(table.io)
    return (
        sum(1 for m in listed if m.content == ManifestContent.DATA),
        sum(1 for m in listed if m.content == ManifestContent.DELETES),
    )


def unreferenced_metadata_files(table: Table) -> list[str]:
    """Manifests and manifest lists in the metadata folder that no snapshot references."""
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    referenced = {p.removeprefix("file://") for p in manifests.reachable_files(table)}
    return sorted(str(p) for p in metadata_dir.glob("*.avro") if str(p) not in referenced)


def upsert_batch(rng: random.Random, model: dict[int, tuple[str, str]], checkpoint: int) -> pa.Table:
    """Upserts and deletes of random keys; ``model`` follows what the table must hold."""
    ids, regions, values, ops = [], [], [], []
    for key in rng.sample(range(40), 6):
        if key in model and rng.random() < 0.3:
            op, row = "D", model.pop(key)
            region, value = row
        else:
            # A key stays in its partition: equality deletes reach rows of their own partition only.
            op, region, value = "U", ("eu", "us")[key % 2], f"c{checkpoint}-{key}"
            model[key] = (region, value)
        ids.append(key)
        regions.append(region)
        values.append(value)
        ops.append(op)
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "region": regions, "v": values, "op": ops},
    )


def expected_rows(model: dict[int, tuple[str, str]]) -> list[dict[str, object]]:
    rows = [{"id": k, "region": r, "v": v} for k, (r, v) in model.items()]
    return normalize(pa.Table.from_pylist(rows, schema=SCHEMA.as_arrow()), ["id"])


def check_readers(metadata_location: str, model: dict[int, tuple[str, str]], java_reader: JavaIcebergReader) -> None:
    expected = expected_rows(model)
    assert normalize(java_reader.read(metadata_location), ["id"]) == expected
    assert normalize(duckdb_read(metadata_location), ["id"]) == expected


def test_pack_end_fills_bins_from_the_end_and_keeps_the_order() -> None:
    files = [
        producer.ManifestFile.from_args(
            manifest_path=f"m{i}", manifest_length=size, partition_spec_id=0, added_snapshot_id=1
        )
        for i, size in enumerate([5, 5, 5, 9, 2, 3])
    ]
    bins = [[m.manifest_path for m in b] for b in pack_end(files, 10)]
    # From the end: [2, 3] fit (5), 9 does not join them, [5, 5] fill a bin, the first 5 is left alone.
    assert bins == [["m0"], ["m1", "m2"], ["m3"], ["m4", "m5"]]
    assert [[m.manifest_path for m in b] for b in pack_end(files[:1], 1)] == [["m0"]]


def test_cdc_checkpoints_merge_manifests_and_keep_every_entry_identity(
    tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    cat = make_table(tmp_path, 2)
    rng = random.Random(8)
    model: dict[int, tuple[str, str]] = {}
    expected: Identity = {}
    history: list[tuple[str, dict[int, tuple[str, str]]]] = []
    table = cat.load_table("db.t")
    for checkpoint in range(12):
        before = entries(table) if table.current_snapshot() else {}
        table = commit_checkpoint(cat, checkpoint, upsert_batch(rng, model, checkpoint), cdc=True)
        record_new(table, before, expected)
        assert entries(table) == expected, f"checkpoint {checkpoint}"
        data, deletes = manifest_counts(table)
        # Never more than min-count-to-merge of each content: a commit that would reach it merges.
        assert data < MIN_COUNT and deletes < MIN_COUNT, f"checkpoint {checkpoint}: {data} + {deletes} manifests"
        history.append((table.metadata_location, dict(model)))
    summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    assert any("manifests-replaced" in s.additional_properties for s in summaries)
    # Merged-away manifests of older snapshots stay (those snapshots list them); only the ones a
    # commit wrote and merged at once are gone, so nothing in the metadata folder is unreferenced.
    assert unreferenced_metadata_files(table) == []
    check_readers(table.metadata_location, model, java_reader)
    # An older snapshot (listing manifests a later merge replaced) still reads as it was.
    old_location, old_model = history[4]
    check_readers(old_location, old_model, java_reader)


def test_merging_off_lists_one_more_manifest_per_checkpoint(tmp_path: Path) -> None:
    cat = make_table(tmp_path, 2, **{"commit.manifest-merge.enabled": "false"})
    rng = random.Random(1)
    model: dict[int, tuple[str, str]] = {}
    for checkpoint in range(5):
        table = commit_checkpoint(cat, checkpoint, upsert_batch(rng, model, checkpoint), cdc=True)
    assert manifest_counts(table)[0] == 5


def test_two_partition_specs_are_merged_apart_and_read_the_same(tmp_path: Path, java_reader: JavaIcebergReader) -> None:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    cat = make_table(tmp_path, 2, spec)
    rng = random.Random(2)
    model: dict[int, tuple[str, str]] = {}
    expected: Identity = {}
    table = cat.load_table("db.t")
    for checkpoint in range(16):
        if checkpoint == 7:
            with table.update_spec() as update:
                update.add_field("id", BucketTransform(4), "id_bucket")
            table = cat.load_table("db.t")
        before = entries(table) if table.current_snapshot() else {}
        table = commit_checkpoint(cat, checkpoint, upsert_batch(rng, model, checkpoint), cdc=True)
        record_new(table, before, expected)
        assert entries(table) == expected, f"checkpoint {checkpoint}"
        snapshot = table.current_snapshot()
        assert snapshot is not None
        for manifest in snapshot.manifests(table.io):
            specs = {e.data_file.spec_id for e in manifest.fetch_manifest_entry(table.io)}
            assert specs == {manifest.partition_spec_id}
    listed = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    assert len({m.partition_spec_id for m in listed if m.content == ManifestContent.DATA}) == 2
    assert len(listed) < 16
    check_readers(table.metadata_location, model, java_reader)


def test_v1_table_merges_appends_and_rewrites(tmp_path: Path, java_reader: JavaIcebergReader) -> None:
    cat = make_table(tmp_path, 1)
    model: dict[int, tuple[str, str]] = {}
    expected: Identity = {}
    table = cat.load_table("db.t")
    for checkpoint in range(7):
        ids = [checkpoint * 10 + i for i in range(3)]
        batch = pa.table(
            {"id": pa.array(ids, pa.int64()), "region": ["eu"] * 3, "v": [f"v{i}" for i in ids]},
            schema=SCHEMA.as_arrow(),
        )
        model.update({i: ("eu", f"v{i}") for i in ids})
        before = entries(table) if table.current_snapshot() else {}
        table = commit_checkpoint(cat, checkpoint, batch, cdc=False)
        record_new(table, before, expected)
        assert entries(table) == expected
        assert manifest_counts(table)[0] < MIN_COUNT
    # Compaction's rewrite merges too: two data files out, one in, the rest keep their identity.
    data, _ = live_files(table, table.current_snapshot())
    removed = sorted(data, key=lambda f: f.meta.path)[:2]
    removed_paths = frozenset(f.meta.path for f in removed)
    kept_rows = [r for f in removed for r in _rows_of(table, f.meta.path)]
    new = write_batches(writer_spec(table, checkpoint_id=99), pa.Table.from_pylist(kept_rows, schema=SCHEMA.as_arrow()))
    before = entries(table)
    table = producer.commit_prepared(
        table, rewrites.RewriteFiles(table, "main", new.data_files, removed_paths, 0, {}).prepare()
    )
    record_new(table, before, expected)
    assert entries(table) == expected
    assert unreferenced_metadata_files(table) == []
    check_readers(table.metadata_location, model, java_reader)


def _rows_of(table: Table, path: str) -> list[dict[str, object]]:
    return pq.read_table(path.removeprefix("file://")).select(["id", "region", "v"]).to_pylist()


def test_a_rewrite_that_merges_keeps_its_deleted_entries_and_data_sequence_number(tmp_path: Path) -> None:
    cat = make_table(tmp_path, 2)
    table = cat.load_table("db.t")
    for checkpoint in range(MIN_COUNT + 1):
        ids = [checkpoint * 10 + i for i in range(2)]
        batch = pa.table(
            {"id": pa.array(ids, pa.int64()), "region": ["eu"] * 2, "v": ["x", "y"]}, schema=SCHEMA.as_arrow()
        )
        table = commit_checkpoint(cat, checkpoint, batch, cdc=False)
    data, _ = live_files(table, table.current_snapshot())
    removed = data[:2]
    rows = [r for f in removed for r in _rows_of(table, f.meta.path)]
    new = write_batches(writer_spec(table, checkpoint_id=99), pa.Table.from_pylist(rows, schema=SCHEMA.as_arrow()))
    read_seq = table.current_snapshot().sequence_number  # type: ignore[union-attr]
    # Many manifests: set the count to 2 so the rewrite's own bin merges.
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": "2"})
    table = cat.load_table("db.t")
    table = producer.commit_prepared(
        table,
        rewrites.RewriteFiles(
            table, "main", new.data_files, frozenset(f.meta.path for f in removed), read_seq - 1, {}
        ).prepare(),
    )
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    listed = snapshot.manifests(table.io)
    assert len(listed) == 1
    all_entries = listed[0].fetch_manifest_entry(table.io, discard_deleted=False)
    deleted = [e for e in all_entries if e.status == ManifestEntryStatus.DELETED]
    added = [e for e in all_entries if e.status == ManifestEntryStatus.ADDED]
    assert sorted(e.data_file.file_path for e in deleted) == sorted(f.meta.path for f in removed)
    assert all(e.snapshot_id == snapshot.snapshot_id for e in deleted + added)
    assert [e.sequence_number for e in added] == [read_seq - 1] * len(added)
    assert all(e.file_sequence_number == snapshot.sequence_number for e in added)
    assert snapshot.summary["deleted-data-files"] == "2" and snapshot.summary["manifests-replaced"]


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_malformed_merge_property_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    cat = make_table(tmp_path, 2)
    table = cat.load_table("db.t")
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": value})
    table = cat.load_table("db.t")
    with pytest.raises(ValueError, match=r"commit\.manifest\.min-count-to-merge"):
        row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(), {})


def avro_blocks(table: Table, path: str) -> int:
    """Data blocks of an Avro file: each ends with the file's sync marker, as the header does."""
    with AvroFile[object](table.io.new_input(path)) as avro:
        sync = avro.header.sync
    return Path(path.removeprefix("file://")).read_bytes().count(sync) - 1


@pytest.mark.parametrize("version", [1, 2])
def test_manifests_hold_many_entries_per_avro_block_and_read_everywhere(
    tmp_path: Path, java_reader: JavaIcebergReader, version: int
) -> None:
    cat = make_table(tmp_path, version, **{"commit.manifest.min-count-to-merge": "2"})
    table = cat.load_table("db.t")
    files = []
    for i in range(250):
        batch = pa.table({"id": pa.array([i], pa.int64()), "region": ["eu"], "v": [f"v{i}"]}, schema=SCHEMA.as_arrow())
        files.extend(write_batches(writer_spec(table, checkpoint_id=0), batch).data_files)
    table = producer.commit_prepared(
        table, row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(data_files=tuple(files)), {}).prepare()
    )
    one = pa.table({"id": pa.array([999], pa.int64()), "region": ["eu"], "v": ["x"]}, schema=SCHEMA.as_arrow())
    more = write_batches(writer_spec(table, checkpoint_id=1), one).data_files
    # The second commit merges both manifests into one of 251 entries (EXISTING and ADDED).
    table = producer.commit_prepared(
        table, row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(data_files=more), {}).prepare()
    )
    [manifest] = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    assert manifest.existing_files_count == 250 and manifest.added_files_count == 1
    assert avro_blocks(table, manifest.manifest_path) == 3
    model = {i: ("eu", f"v{i}") for i in range(250)} | {999: ("eu", "x")}
    check_readers(table.metadata_location, model, java_reader)
