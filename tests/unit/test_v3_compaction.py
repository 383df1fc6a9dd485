"""Compaction of format v3 tables without Spark: the rewrite task carries every row's ``_row_id`` and
``_last_updated_sequence_number`` into the new files, the replace commit assigns row ids as Iceberg
Java's does, and a table holding deletion vectors is refused. Lineage is read back here as the spec
says a reader computes it (independently of the rewriter's code)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink import UnsupportedTableError
from iceberg_sink._iceberg import producer, rewrites, row_delta
from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.deletion_vectors import DeletionVector, read_deletion_vector, write_deletion_vectors
from iceberg_sink._iceberg.entries import ManifestEntries, live_files
from iceberg_sink._iceberg.lineage import first_row_ids, read_entries, read_manifests, with_lineage_columns
from iceberg_sink._iceberg.live_rows import apply_deletes, delete_cache
from iceberg_sink._iceberg.live_vectors import live_vectors
from iceberg_sink._iceberg.manifests import as_v3_data_file, data_file_first_row_id
from iceberg_sink._iceberg.projection import read_projected
from iceberg_sink.table.catalog import create_table
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.compaction.job import _validate, _writer_spec
from iceberg_sink.topology.compaction.planner import plan
from iceberg_sink.topology.compaction.rewriter import encode_group, rewrite_group, with_row_lineage
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType()))
ROW_ID, UPDATED = 2147483540, 2147483539


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())


def _append(table: Table, ids: list[int], checkpoint: int) -> Table:
    result = write_batches(
        writer_spec(table, checkpoint_id=checkpoint), pa.table({"id": pa.array(ids, pa.int64()), "v": ["x"] * len(ids)})
    )
    changes = row_delta.SnapshotChanges(data_files=result.data_files)
    return producer.commit_prepared(table, row_delta.RowDelta(table, "main", changes, {}).prepare())


def _compact(table: Table) -> Table:
    """What ``compaction.job.compact`` does, with the rewrite task run here instead of in Spark."""
    entries = ManifestEntries()
    the_plan = plan(table, "main", CompactionConfig(), 128 * 1024 * 1024, None, entries)
    assert the_plan is not None
    spec = _writer_spec(table, CompactionConfig(), {})
    read = table.metadata.snapshot_by_id(the_plan.snapshot_id)
    assert read is not None
    row_ids = first_row_ids(table.io, read, {f.manifest_path for g in the_plan.groups for f in g.data_files})
    added = []
    for i, group in enumerate(the_plan.groups):
        added += rewrite_group(spec, encode_group(group, None, the_plan.rules, row_ids), i, 0).data_files
    removed = frozenset(f.meta.path for g in the_plan.groups for f in g.data_files)
    rewrite = rewrites.RewriteFiles(table, "main", added, removed, the_plan.sequence_number, {}, entries)
    return producer.commit_prepared(table, rewrite.prepare())


def _lineage(table: Table) -> list[tuple[int, int | None, int | None]]:
    """(id, _row_id, _last_updated_sequence_number) of every live row, as the spec tells a reader to
    compute them: the file's column where it holds a value, else the file's first row id plus the
    row's position and the file's data sequence number (both null without a first row id)."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    result = []
    for manifest in read_manifests(table.io, snapshot, 3):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in read_entries(table.io, manifest):
            first = data_file_first_row_id(entry.data_file)
            data = pq.read_table(entry.data_file.file_path.removeprefix("file://"))
            by_id = {int(f.metadata[b"PARQUET:field_id"]): f.name for f in data.schema}
            for pos, row in enumerate(data.to_pylist()):
                row_id = row.get(by_id.get(ROW_ID, ""))
                updated = row.get(by_id.get(UPDATED, ""))
                if row_id is None and first is not None:
                    row_id = first + pos
                if updated is None and first is not None:
                    updated = entry.sequence_number
                result.append((row["id"], row_id, updated))
    return sorted(result)


def _new_files_columns(table: Table) -> list[list[str]]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        pq.read_schema(e.data_file.file_path.removeprefix("file://")).names
        for m in read_manifests(table.io, snapshot, 3)
        for e in read_entries(table.io, m)
        if e.snapshot_id == snapshot.snapshot_id
    ]


def test_compaction_keeps_every_rows_lineage_and_commits_javas_row_id_ranges(catalog: SqlCatalog) -> None:
    table = create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})
    for checkpoint, ids in enumerate([[1, 2, 3], [4, 5], [6]]):
        table = _append(table, ids, checkpoint)
    before = _lineage(table)
    assert before == [(1, 0, 1), (2, 1, 1), (3, 2, 1), (4, 3, 2), (5, 4, 2), (6, 5, 3)]
    assert table.metadata.next_row_id == 6
    table = _compact(table)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert _lineage(table) == before  # every row keeps its id and its sequence number
    assert _new_files_columns(table) == [["id", "v", "_row_id", "_last_updated_sequence_number"]]
    # Java's ranges: the new files' manifest gets the next free id and room for its 6 added rows;
    # the three rewritten manifests (only deleted entries) get empty ranges.
    assert (snapshot.first_row_id, snapshot.added_rows, table.metadata.next_row_id) == (6, 6, 12)
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5, 6]  # PyIceberg reads it

    # A second compaction reads the written columns back and keeps them (not the new file's ids).
    table = _append(table, [7, 8], 5)
    before = _lineage(table)
    assert before[-2:] == [(7, 12, 5), (8, 13, 5)]
    table = _compact(table)
    assert _lineage(table) == before
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert (snapshot.first_row_id, snapshot.added_rows, table.metadata.next_row_id) == (14, 8, 22)


def test_compaction_leaves_the_ids_of_files_it_does_not_rewrite_alone(catalog: SqlCatalog) -> None:
    """Carried-over manifests keep their first row ids; a rewritten manifest writes the inherited ids
    of the entries it keeps out. Were either lost, those rows would get new ids."""
    table = create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})
    table = _append(table, list(range(100, 400)), 0)  # left alone: the rewrite below replaces the others
    table = _append(table, [1, 2], 1)
    table = _append(table, [3], 2)
    before = _lineage(table)
    entries = ManifestEntries()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    live = [f for m in snapshot.manifests(table.io) for f in entries.live_files(table.io, m)]
    small = [f for f in live if f.meta.record_count < 300]
    assert len(small) == 2
    spec = _writer_spec(table, CompactionConfig(), {})
    row_ids = first_row_ids(table.io, snapshot, {f.manifest_path for f in small})
    rows = [
        with_row_lineage(
            read_projected(table.io, f.meta.path, spec.schema, mapping=None),
            row_ids[f.meta.path],
            f.data_sequence_number,
        )
        for f in small
    ]
    new = write_batches(spec, pa.concat_tables(rows)).data_files
    removed = frozenset(f.meta.path for f in small)
    rewrite = rewrites.RewriteFiles(table, "main", new, removed, snapshot.sequence_number or 0, {}, entries)
    table = producer.commit_prepared(table, rewrite.prepare())
    assert _lineage(table) == before
    # The big file's manifest was carried over with its first row id.
    assert [r for r in _lineage(table) if r[0] == 100] == [(100, 0, 1)]


def test_the_lineage_columns_are_reserved_names() -> None:
    schema = with_lineage_columns(SCHEMA)
    assert [(f.field_id, f.name, f.required) for f in schema.fields[2:]] == [
        (ROW_ID, "_row_id", False),
        (UPDATED, "_last_updated_sequence_number", False),
    ]
    with pytest.raises(UnsupportedTableError, match=r"has column\(s\) \['_row_id'\]; expected none"):
        with_lineage_columns(Schema(NestedField(1, "_row_id", LongType())))


def test_rows_of_a_file_without_a_first_row_id_keep_null_lineage() -> None:
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "_row_id": pa.array([None, 7, None], pa.int64()),
            "_last_updated_sequence_number": pa.array([None, 2, None], pa.int64()),
        }
    )
    assert with_row_lineage(rows, None, 4).equals(rows)
    filled = with_row_lineage(rows, 10, 4)
    assert filled["_row_id"].to_pylist() == [10, 7, 12]
    assert filled["_last_updated_sequence_number"].to_pylist() == [4, 2, 4]


def test_a_compaction_that_lost_a_race_with_an_append_is_prepared_again_and_keeps_both_lineages(
    catalog: SqlCatalog,
) -> None:
    table = create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})
    for checkpoint, ids in enumerate([[1, 2], [3, 4, 5]]):
        table = _append(table, ids, checkpoint)
    entries = ManifestEntries()
    the_plan = plan(table, "main", CompactionConfig(), 128 * 1024 * 1024, None, entries)
    assert the_plan is not None
    spec = _writer_spec(table, CompactionConfig(), {})
    read = table.current_snapshot()
    assert read is not None
    row_ids = first_row_ids(table.io, read, {f.manifest_path for f in the_plan.groups[0].data_files})
    added = rewrite_group(spec, encode_group(the_plan.groups[0], None, the_plan.rules, row_ids), 0, 0).data_files
    removed = frozenset(f.meta.path for f in the_plan.groups[0].data_files)

    def rewrite(on: Table) -> producer.PreparedCommit:
        return rewrites.RewriteFiles(on, "main", added, removed, the_plan.sequence_number, {}, entries).prepare()

    stale = rewrite(table)
    appended = _append(table, [6, 7], 2)  # another writer wins the race
    before = _lineage(appended)
    with pytest.raises(CommitFailedException):
        producer.commit_prepared(table, stale)
    table = producer.commit_prepared(appended, rewrite(appended))
    assert _lineage(table) == before
    snapshot = table.current_snapshot()
    assert snapshot is not None
    # The retry starts at the next-row-id the append left (7) and its new manifest holds 5 rows.
    assert (snapshot.first_row_id, snapshot.added_rows) == (7, 5)


class _AddVectors(producer.SnapshotProducer):
    """Commits deletion vectors as Iceberg Java does (the sink's own DV commits live elsewhere)."""

    def __init__(self, table: Table, vectors: tuple[DeletionVector, ...]) -> None:
        super().__init__(table, "main", {})
        self._vectors = vectors

    def operation(self) -> Operation:
        return Operation.DELETE

    def manifests(self) -> list[ManifestFile]:
        writer = self._writer(ManifestContent.DELETES, 0)
        with writer:
            for dv in self._vectors:
                data_file = as_v3_data_file(
                    DataFile.from_args(
                        content=DataFileContent.POSITION_DELETES,
                        file_path=dv.path,
                        file_format=FileFormat.PUFFIN,
                        partition=Record(),
                        record_count=dv.cardinality,
                        file_size_in_bytes=dv.file_size_in_bytes,
                    )
                )
                data_file[17], data_file[18], data_file[19] = (
                    dv.referenced_data_file,
                    dv.content_offset,
                    dv.content_size_in_bytes,
                )
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=self.snapshot_id,
                        sequence_number=None,
                        file_sequence_number=None,
                        data_file=data_file,
                    )
                )
        return [writer.to_manifest_file(), *self.parent_manifests()]


def test_compaction_applies_deletion_vectors_and_drops_only_those_of_the_files_it_rewrites(
    catalog: SqlCatalog,
) -> None:
    """Two DVs in one Puffin file: rewriting one data file drops its DV entry alone; the other DV
    (same Puffin path) stays live and still deletes its rows."""
    table = create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})
    for checkpoint, ids in enumerate([[1, 2, 3], [4, 5], [6, 7, 8]]):
        table = _append(table, ids, checkpoint)
    files = {min(r[0] for r in _rows_of(path)): path for path in _live_data(table)}
    puffin = f"{table.location()}/data/dv-shared.puffin"
    vectors = write_deletion_vectors(table.io, puffin, {files[1]: [np.array([1])], files[6]: [np.array([0, 2])]})
    table = producer.commit_prepared(table, _AddVectors(table, vectors).prepare())
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 3, 4, 5, 7]  # PyIceberg applies the DVs
    before = [r for r in _lineage(table) if r[0] in (1, 3, 4, 5, 7)]

    # Rewrite the files of ids 1-3 and 4-5 (as a compaction of that group would), not the one of 6-8.
    entries = ManifestEntries()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    live = [f for m in snapshot.manifests(table.io) for f in entries.live_files(table.io, m)]
    group = [f for f in live if f.meta.path in (files[1], files[4])]
    spec = _writer_spec(table, CompactionConfig(), {})
    row_ids = first_row_ids(table.io, snapshot, {f.manifest_path for f in group})
    refs = live_vectors(table.io, snapshot)
    assert set(refs) == {files[1], files[6]}
    rows = []
    for f in group:
        read = with_row_lineage(
            read_projected(table.io, f.meta.path, spec.schema, mapping=None),
            row_ids[f.meta.path],
            f.data_sequence_number,
        )
        ref = refs.get(f.meta.path)
        vector = (
            None
            if ref is None
            else read_deletion_vector(table.io, ref.path, ref.content_offset, ref.content_size_in_bytes)
        )
        rows.append(
            apply_deletes(read, f, [], delete_cache(table.io, spec.schema, None), spec.schema, DeleteRules([]), vector)
        )
    new = write_batches(spec, pa.concat_tables(rows)).data_files
    removed = frozenset(f.meta.path for f in group)
    rewrite = rewrites.RewriteFiles(table, "main", new, removed, snapshot.sequence_number or 0, {}, entries)
    table = producer.commit_prepared(table, rewrite.prepare())

    after = table.current_snapshot()
    assert after is not None
    assert {d: r.path for d, r in live_vectors(table.io, after).items()} == {files[6]: puffin}
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 3, 4, 5, 7]
    assert [r for r in _lineage(table) if r[0] in (1, 3, 4, 5, 7)] == before
    assert after.summary is not None and after.summary["removed-position-deletes"] == "1"


def _live_data(table: Table) -> list[str]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        e.data_file.file_path
        for m in read_manifests(table.io, snapshot, 3)
        if m.content == ManifestContent.DATA
        for e in read_entries(table.io, m)
    ]


def _rows_of(path: str) -> list[tuple[int, ...]]:
    return [(r["id"],) for r in pq.read_table(path.removeprefix("file://"), columns=["id"]).to_pylist()]


def test_a_deletion_vector_committed_meanwhile_conflicts_only_with_the_group_of_its_data_file(
    catalog: SqlCatalog,
) -> None:
    table = create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})
    for checkpoint, ids in enumerate([[1, 2, 3], [4, 5]]):
        table = _append(table, ids, checkpoint)
    the_plan = plan(table, "main", CompactionConfig(), 128 * 1024 * 1024, None, ManifestEntries())
    assert the_plan is not None and len(the_plan.groups) == 1
    table = _append(table, [6, 7], 2)  # committed after the plan: not in its group
    files = {min(r[0] for r in _rows_of(path)): path for path in _live_data(table)}

    def validate(on: Table) -> list[int]:
        # The head's DVs come with their referenced_data_file (v3 delete manifests keep it), so
        # the one rule, DeleteRules.applies, scopes each to its own data file.
        return _validate(live_files(on, on.current_snapshot(), ManifestEntries()), the_plan, {0}, 0)

    other = write_deletion_vectors(table.io, f"{table.location()}/data/dv-other.puffin", {files[6]: [np.array([0])]})
    table = producer.commit_prepared(table, _AddVectors(table, other).prepare())
    assert validate(table) == [0]  # a DV of a file outside the group is no conflict
    mine = write_deletion_vectors(table.io, f"{table.location()}/data/dv-mine.puffin", {files[4]: [np.array([1])]})
    table = producer.commit_prepared(table, _AddVectors(table, mine).prepare())
    assert validate(table) == []  # one of an input file is
