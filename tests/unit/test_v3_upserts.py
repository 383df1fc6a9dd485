"""Upserts/CDC on format v3 tables: each checkpoint is one snapshot whose deletes are deletion
vectors resolved through the key index, never an equality delete nor a position delete file (real
task writers, aggregator, committer and SQLite catalog; PyIceberg 0.12 reads the result, no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink import UnsupportedTableError
from iceberg_sink._iceberg import producer, row_delta
from iceberg_sink._iceberg.deletion_vectors import read_deletion_vector, serialize
from iceberg_sink._iceberg.files import to_meta
from iceberg_sink._iceberg.lineage import read_entries, read_manifests
from iceberg_sink._iceberg.position_deletes import write_position_deletes
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink._iceberg.v3_metadata import v3_metadata_writes
from iceberg_sink.committer import vectors
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import IcebergCommitter
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.table.catalog import create_table
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from tests.helpers import LosingCatalog, write_batches, writer_spec

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()))
NO_WAIT = RetryPolicy(num_retries=3, min_wait_ms=0, max_wait_ms=0)

# (id, v, op) per checkpoint: inserts, updates of earlier rows, deletes, a key updated twice in one
# batch (an in-batch position delete), a key inserted then deleted in one batch.
CHECKPOINTS: list[list[tuple[int, str | None, str]]] = [
    [(1, "a", "I"), (2, "b", "I"), (3, "c", "I"), (4, "d", "I")],
    [(2, "b2", "U"), (3, None, "D"), (5, "e", "I"), (5, "e2", "U")],
    [(1, "a2", "U"), (2, "b3", "U"), (6, "f", "I"), (6, None, "D"), (4, "d2", "U"), (4, "d3", "U")],
    [(2, "b4", "U"), (7, "g", "I"), (1, None, "D")],
]


def model(checkpoints: list[list[tuple[int, str | None, str]]]) -> dict[int, str | None]:
    rows: dict[int, str | None] = {}
    for batch in checkpoints:
        for key, value, op in batch:
            if op == "D":
                rows.pop(key, None)
            else:
                rows[key] = value
    return rows


@pytest.fixture
def catalog(tmp_path: Path) -> LosingCatalog:
    (tmp_path / "wh").mkdir()
    cat = LosingCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    create_table(cat, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})
    return cat


def reduced(rows: list[tuple[int, str | None, str]]) -> list[tuple[int, str | None, str]]:
    """The last change of each key, as topology/changes.py reduces a checkpoint in Spark before the
    writers see it (the integration test runs that reduction itself)."""
    return list({r[0]: r for r in rows}.values())


def committable(
    table: Table,
    checkpoint: int,
    rows: list[tuple[int, str | None, str]],
    job: str = "job",
) -> Committable:
    rows = reduced(rows)
    batch = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "v": pa.array([r[1] for r in rows], pa.string()),
            "op": [r[2] for r in rows],
        }
    )
    spec = writer_spec(table, job_id=job, checkpoint_id=checkpoint, op_column="op", equality_field_ids=(1,))
    result = write_batches(spec, batch)
    made = CommitAggregator("db.t", "main", job).aggregate(table, table.io, checkpoint, [result])
    assert made is not None
    return made


def committer(cat: SqlCatalog, job: str = "job", index_bytes: int = 1 << 20) -> IcebergCommitter:
    return IcebergCommitter(
        lambda: cat.load_table("db.t"), "main", job, NO_WAIT, sleep=lambda s: None, key_index_max_bytes=index_bytes
    )


def rows_in(table: Table) -> dict[int, Any]:
    scanned = table.scan().to_arrow()
    keys = scanned["id"].to_pylist()
    assert len(keys) == len(set(keys)), f"a key is live twice: {sorted(keys)}"
    return dict(zip(keys, scanned["v"].to_pylist(), strict=True))


def live_deletes(table: Table) -> list[DataFileMeta]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        to_meta(e.data_file)
        for m in read_manifests(table.io, snapshot, 3)
        if m.content == ManifestContent.DELETES
        for e in read_entries(table.io, m)
    ]


def check_only_dvs(table: Table) -> None:
    """Main holds no equality delete and no position delete file, and at most one DV per data file."""
    deletes = live_deletes(table)
    assert all(d.is_dv for d in deletes), deletes
    targets = [d.referenced_data_file for d in deletes]
    assert len(targets) == len(set(targets))
    for d in deletes:
        assert d.content_offset is not None and d.content_size_in_bytes is not None
        positions = read_deletion_vector(table.io, d.path, d.content_offset, d.content_size_in_bytes, d.record_count)
        assert len(positions) == d.record_count


@pytest.mark.parametrize("index_bytes", [1 << 20, 0], ids=["indexed", "read-every-time"])
def test_cdc_on_v3_commits_one_snapshot_of_dvs_per_checkpoint(catalog: LosingCatalog, index_bytes: int) -> None:
    """With the keys in the index, or with none kept (every candidate file's keys read again)."""
    c = committer(catalog, index_bytes=index_bytes)
    for n, batch in enumerate(CHECKPOINTS):
        outcome = c.commit(committable(catalog.load_table("db.t"), n, batch))
        assert outcome.snapshot is not None
        table = catalog.load_table("db.t")
        assert rows_in(table) == model(CHECKPOINTS[: n + 1])
        check_only_dvs(table)
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == len(CHECKPOINTS)
    # Checkpoint 1 deleted keys 2 and 3 of checkpoint 0's file; checkpoint 2 updates keys 1 and 4
    # of that file: its DV is replaced by one holding all four positions, in the same snapshot.
    summaries = [s.summary for s in table.snapshots()]
    assert summaries[2] is not None
    assert (summaries[2]["added-delete-files"], summaries[2]["removed-delete-files"]) == ("2", "1")  # type: ignore[index]
    # Counted as Iceberg Java counts DVs: no position delete file, a DV's size its blob's.
    assert (summaries[2]["added-dvs"], summaries[2]["removed-dvs"]) == ("2", "1")  # type: ignore[index]
    assert "added-position-delete-files" not in summaries[2].additional_properties
    assert "removed-position-delete-files" not in summaries[2].additional_properties
    vectors_now = live_deletes(table)
    current = table.current_snapshot()
    assert current is not None and current.summary is not None
    assert int(current.summary["total-position-deletes"]) == sum(d.record_count for d in vectors_now)
    assert all(s is not None and s["total-equality-deletes"] == "0" for s in summaries)  # type: ignore[index]
    # The writers' equality delete files were resolved into DVs, never committed, and are removed.
    written = {p.as_uri() for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    assert written == {p for p in table.inspect.files()["file_path"].to_pylist() if p.endswith(".parquet")}


def test_the_old_dv_of_a_data_file_is_merged_and_replaced_in_the_same_commit(catalog: LosingCatalog) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(i, "x", "I") for i in range(1, 6)]))
    c.commit(committable(catalog.load_table("db.t"), 1, [(1, None, "D")]))
    first = live_deletes(catalog.load_table("db.t"))
    assert [d.record_count for d in first] == [1]
    c.commit(committable(catalog.load_table("db.t"), 2, [(3, None, "D")]))
    table = catalog.load_table("db.t")
    second = live_deletes(table)
    assert [d.record_count for d in second] == [2]
    assert second[0].referenced_data_file == first[0].referenced_data_file and second[0].path != first[0].path
    assert sorted(rows_in(table)) == [2, 4, 5]


def test_another_writers_dv_on_the_same_file_is_merged_on_retry(catalog: LosingCatalog) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(i, "x", "I") for i in range(1, 6)]))
    stored = committable(catalog.load_table("db.t"), 1, [(2, "y", "U")])
    # Another writer deletes row 4 (position 3) with a DV of its own before our commit.
    other = catalog.load_table("db.t")
    data_path = next(iter(other.inspect.files()["file_path"].to_pylist()))
    written = vectors.write_deletion_vectors(other.io, other.location() + "/data/other-dv.puffin", {data_path: [[3]]})
    dv = written[0]
    meta = DataFileMeta(
        content=FileContent.POSITION_DELETES,
        path=dv.path,
        spec_id=0,
        partition=(),
        record_count=dv.cardinality,
        file_size_in_bytes=dv.file_size_in_bytes,
        file_format="PUFFIN",
        referenced_data_file=dv.referenced_data_file,
        content_offset=dv.content_offset,
        content_size_in_bytes=dv.content_size_in_bytes,
    )
    producer.commit_prepared(
        other,
        row_delta.RowDelta(
            other, "main", row_delta.SnapshotChanges(delete_files=(meta,)), {"writer": "other"}
        ).prepare(),
    )
    # Our committer loads the table before the other commit landed: its first attempt conflicts.
    stale = other
    outcome = c.commit(stored, table=stale)
    assert outcome.snapshot is not None and outcome.attempts == 2
    table = catalog.load_table("db.t")
    assert rows_in(table) == {1: "x", 2: "y", 3: "x", 5: "x"}  # both deletes hold
    check_only_dvs(table)
    assert sorted(d.record_count for d in live_deletes(table)) == [2]
    # The first attempt's Puffin file (resolved on the stale head) was deleted with its manifests.
    puffins = {p.as_uri() for p in Path(table.location().removeprefix("file://")).rglob("*.puffin")}
    listed = {d.path for d in live_deletes(table)} | {meta.path}
    assert puffins == listed


def test_another_writers_append_in_between_is_deleted_as_an_equality_delete_would(catalog: LosingCatalog) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(1, "x", "I"), (2, "x", "I")]))
    stored = committable(catalog.load_table("db.t"), 1, [(3, "ours", "U"), (1, None, "D")])
    stale = catalog.load_table("db.t")
    other = committer(catalog, "other")
    other.commit(committable(catalog.load_table("db.t"), 0, [(3, "theirs", "I")], job="other"))
    outcome = c.commit(stored, table=stale)
    assert outcome.snapshot is not None and outcome.attempts == 2
    table = catalog.load_table("db.t")
    assert rows_in(table) == {2: "x", 3: "ours"}
    check_only_dvs(table)


def test_a_lost_response_and_a_replay_commit_the_checkpoint_once(catalog: LosingCatalog) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, CHECKPOINTS[0]))
    stored = committable(catalog.load_table("db.t"), 1, CHECKPOINTS[1])
    catalog.lose_next = 1  # the commit lands, its answer is lost
    first = c.commit(Committable.decode(stored.encode()))
    assert first.snapshot is not None or first.already_committed
    # A restarted committer (empty key index) replays the stored committable: nothing happens.
    again = committer(catalog).commit(Committable.decode(stored.encode()))
    assert again.already_committed and again.snapshot is None
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == 2
    assert rows_in(table) == model(CHECKPOINTS[:2])
    # A checkpoint stored but never committed (a kill before the commit) is committed by a new committer.
    stored = committable(table, 2, CHECKPOINTS[2])
    committer(catalog).commit(Committable.decode(stored.encode()))
    table = catalog.load_table("db.t")
    assert rows_in(table) == model(CHECKPOINTS[:3])
    check_only_dvs(table)


def test_position_deletes_of_the_checkpoints_own_rows_become_its_dvs(catalog: LosingCatalog) -> None:
    """Writers of this project reduce each key to one change per checkpoint, so they write no
    position delete; one in a committable (Flink-style writers) is committed as a DV all the same."""
    table = catalog.load_table("db.t")
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    result = write_batches(writer_spec(table), rows)
    position = write_position_deletes(table.io, table.location() + "/data/own-pos.parquet", result.data_files[0], [[1]])
    result = attrs.evolve(result, delete_files=(position,))
    stored = CommitAggregator("db.t", "main", "job").aggregate(table, table.io, 0, [result])
    assert stored is not None
    assert committer(catalog).commit(stored).snapshot is not None
    table = catalog.load_table("db.t")
    assert sorted(rows_in(table)) == [1, 3]
    check_only_dvs(table)
    assert not Path(position.path.removeprefix("file:")).exists()  # resolved, never committed


def test_a_truncate_on_v3_removes_every_live_file_and_dv_in_its_snapshot(catalog: LosingCatalog) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, CHECKPOINTS[0]))
    c.commit(committable(catalog.load_table("db.t"), 1, CHECKPOINTS[1]))
    table = catalog.load_table("db.t")
    assert live_deletes(table)
    # The checkpoint after a truncate: the rows ordered after it, and the truncate marker.
    rows = pa.table({"id": pa.array([2, 9], pa.int64()), "v": ["new", "z"], "op": ["U", "I"]})
    result = write_batches(writer_spec(table, checkpoint_id=2, op_column="op", equality_field_ids=(1,)), rows)
    stored = CommitAggregator("db.t", "main", "job").aggregate(
        table, table.io, 2, [attrs.evolve(result, truncated=True)]
    )
    assert stored is not None and stored.truncated
    assert c.commit(stored).snapshot is not None
    table = catalog.load_table("db.t")
    assert rows_in(table) == {2: "new", 9: "z"}
    assert not live_deletes(table)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["total-delete-files"] == "0" and snapshot.summary["total-data-files"] == "1"
    # The removed DV entries keep their blob location (read as v3 and written back as deleted).
    removed = [
        to_meta(e.data_file)
        for m in read_manifests(table.io, snapshot, 3)
        if m.content == ManifestContent.DELETES
        for e in read_entries(table.io, m, discard_deleted=False)
    ]
    assert removed and all(d.referenced_data_file is not None and d.content_offset is not None for d in removed)


def test_equality_and_position_delete_files_are_refused_on_v3(catalog: LosingCatalog) -> None:
    table = catalog.load_table("db.t")
    made = write_batches(
        writer_spec(table, op_column="op", equality_field_ids=(1,)),
        pa.table({"id": pa.array([1], pa.int64()), "v": ["a"], "op": ["U"]}),
    )
    assert {f.content for f in made.delete_files} == {FileContent.EQUALITY_DELETES}
    position = write_position_deletes(table.io, table.location() + "/data/p.parquet", made.data_files[0], [[0]])
    for f in (*made.delete_files, position):
        with pytest.raises(UnsupportedTableError, match=r"equality or position delete files"):
            row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(made.data_files, (f,)), {})
    assert not catalog.load_table("db.t").snapshots()


def test_the_key_index_spares_reading_a_data_file_again_and_forgets_files_no_longer_live(
    catalog: LosingCatalog,
) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(i, "x", "I") for i in range(1, 6)]))
    table = catalog.load_table("db.t")
    deletes = write_batches(
        writer_spec(table, checkpoint_id=1, op_column="op", equality_field_ids=(1,)),
        pa.table({"id": pa.array([2], pa.int64()), "v": pa.array([None], pa.string()), "op": ["D"]}),
    ).delete_files
    index = KeyIndex()
    first = vectors.resolve(table, table.current_snapshot(), (), deletes, (), index)
    again = vectors.resolve(table, table.current_snapshot(), (), deletes, (), index)
    assert (first.data_files_read, again.data_files_read, index.files) == (1, 0, 1)
    assert [v.record_count for v in again.vectors] == [1]
    unbounded = vectors.resolve(table, table.current_snapshot(), (), deletes, (), KeyIndex(max_bytes=0))
    assert unbounded.data_files_read == 1 and [v.record_count for v in unbounded.vectors] == [1]
    vectors.resolve(table, None, (), (), (), index)  # a head without the file: its keys are dropped
    assert index.files == 0 and index.nbytes == 0


def test_storage_refusing_the_puffin_file_fails_the_commit_naming_it_and_commits_nothing(
    catalog: LosingCatalog, tmp_path: Path
) -> None:
    """Storage that refuses the Puffin file (here: its directory is a regular file; a SeaweedFS table
    bucket answers 403) fails the commit with an error naming the file and the property to set."""
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(1, "a", "I"), (2, "b", "I")]))
    made = committable(catalog.load_table("db.t"), 1, [(1, None, "D")])
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the DVs' directory would be")
    with v3_metadata_writes():
        transaction = catalog.load_table("db.t").transaction()
        transaction.set_properties({"write.data.path": f"{blocked.as_uri()}/data"}).commit_transaction()
    with pytest.raises(OSError) as failure:
        c.commit(made)
    message = str(failure.value)
    assert f"{blocked.as_uri()}/data/" in message and message.count(".puffin") >= 1, message
    assert "write.data.path" in message and "Nothing was committed" in message, message
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == 1 and rows_in(table) == {1: "a", 2: "b"}


def test_a_dv_written_as_a_bare_blob_as_duckdb_up_to_1_5_3_did_is_read_and_merged(catalog: LosingCatalog) -> None:
    """DuckDB up to 1.5.3 wrote a DV's blob alone (no Puffin magic, no footer; ``content_offset`` 0;
    duckdb-iceberg #1095, #1248: DuckDB 1.5.5 cannot read those). The sink locates the blob by its
    manifest entry, as Iceberg Java does, so it reads such a DV and merges it into its own; the
    merged DV is a Puffin file PyIceberg reads again."""
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(i, "x", "I") for i in range(1, 6)]))
    table = catalog.load_table("db.t")
    data_path = next(iter(table.inspect.files()["file_path"].to_pylist()))
    blob = serialize([np.array([0, 3], dtype=np.int64)])
    bare = table.location() + "/data/duckdb-1.5.3-deletes.puffin"
    with table.io.new_output(bare).create() as out:
        out.write(blob)
    meta = DataFileMeta(
        content=FileContent.POSITION_DELETES,
        path=bare,
        spec_id=0,
        partition=(),
        record_count=2,
        file_size_in_bytes=len(blob),
        file_format="PUFFIN",
        referenced_data_file=data_path,
        content_offset=0,
        content_size_in_bytes=len(blob),
    )
    producer.commit_prepared(
        table,
        row_delta.RowDelta(
            table, "main", row_delta.SnapshotChanges(delete_files=(meta,)), {"writer": "duckdb"}
        ).prepare(),
    )
    with pytest.raises(ValueError, match="magic"):  # PyIceberg 0.12 parses the whole file: it refuses it
        rows_in(catalog.load_table("db.t"))
    c.commit(committable(catalog.load_table("db.t"), 1, [(2, "y", "U")]))
    table = catalog.load_table("db.t")
    assert rows_in(table) == {2: "y", 3: "x", 5: "x"}
    check_only_dvs(table)
    [merged] = [d for d in live_deletes(table) if d.referenced_data_file == data_path]
    assert merged.path != bare and merged.content_offset is not None and merged.content_size_in_bytes is not None
    assert read_deletion_vector(
        table.io, merged.path, merged.content_offset, merged.content_size_in_bytes, merged.record_count
    ).tolist() == [0, 1, 3]


@pytest.mark.parametrize(
    ("layout", "files"),
    [
        (None, 1),
        ("one-per-commit-spaced", 1),
        ("one-per-vector", 2),
        ("one-per-commit", 1),
        ("ONE-PER-COMMIT", 1),
    ],
)
def test_a_commits_dvs_share_one_puffin_file_unless_the_table_wants_one_per_dv(
    catalog: LosingCatalog, layout: str | None, files: int
) -> None:
    """Why spaced by default: tests/integration/test_v3_dv_layout.py (DuckDB 1.5.5 misreads DVs side
    by side)."""
    if layout is not None:
        with v3_metadata_writes():
            transaction = catalog.load_table("db.t").transaction()
            transaction.set_properties({"iceberg-sink.deletion-vectors.files": layout}).commit_transaction()
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(1, "a", "I"), (2, "b", "I")]))
    c.commit(committable(catalog.load_table("db.t"), 1, [(3, "c", "I"), (4, "d", "I")]))
    c.commit(committable(catalog.load_table("db.t"), 2, [(1, None, "D"), (3, "c2", "U")]))
    table = catalog.load_table("db.t")
    vectors_now = live_deletes(table)
    assert len(vectors_now) == 2 and len({v.path for v in vectors_now}) == files
    check_only_dvs(table)
    assert rows_in(table) == {2: "b", 3: "c2", 4: "d"}
    puffins = {p.as_uri() for p in Path(table.location().removeprefix("file://")).rglob("*.puffin")}
    assert puffins == {v.path for v in vectors_now}  # nothing else written
    first, second = sorted(vectors_now, key=lambda v: v.content_offset or 0)
    assert first.content_offset == 4 and first.content_size_in_bytes is not None
    if files == 1:  # spaced: one zero byte more than the DV before; side by side: none
        gap = first.content_size_in_bytes + 1 if layout in (None, "one-per-commit-spaced") else 0
        assert second.content_offset == 4 + first.content_size_in_bytes + gap


def test_an_unknown_puffin_layout_fails_the_commit_naming_the_property(catalog: LosingCatalog) -> None:
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(1, "a", "I"), (2, "b", "I")]))
    with v3_metadata_writes():
        transaction = catalog.load_table("db.t").transaction()
        transaction.set_properties({"iceberg-sink.deletion-vectors.files": "packed"}).commit_transaction()
    with pytest.raises(InvalidSinkConfigError) as failure:
        c.commit(committable(catalog.load_table("db.t"), 1, [(1, None, "D")]))
    message = str(failure.value)
    assert "iceberg-sink.deletion-vectors.files" in message and "'one-per-vector'" in message, message
    assert "'packed'" in message, message
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == 1 and rows_in(table) == {1: "a", 2: "b"}
    assert not list(Path(table.location().removeprefix("file://")).rglob("*.puffin"))


def test_a_puffin_file_that_fails_among_several_leaves_none_and_commits_nothing(
    catalog: LosingCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second of a commit's Puffin files fails to write (a storage error injected): the error
    names it, the files already written are deleted, nothing is committed, and the replay lands.
    (A file per DV: the layout that writes several files a commit.)"""
    with v3_metadata_writes():
        transaction = catalog.load_table("db.t").transaction()
        transaction.set_properties({"iceberg-sink.deletion-vectors.files": "one-per-vector"}).commit_transaction()
    c = committer(catalog)
    c.commit(committable(catalog.load_table("db.t"), 0, [(1, "a", "I"), (2, "b", "I")]))
    c.commit(committable(catalog.load_table("db.t"), 1, [(3, "c", "I"), (4, "d", "I")]))
    made = committable(catalog.load_table("db.t"), 2, [(1, None, "D"), (3, None, "D")])
    real = vectors.write_deletion_vectors
    calls: list[str] = []

    def failing_second(io: Any, path: str, positions: Any, spaced: bool) -> Any:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(f"injected: storage refused {path}")
        return real(io, path, positions, spaced)

    monkeypatch.setattr(vectors, "write_deletion_vectors", failing_second)
    with pytest.raises(OSError) as failure:
        c.commit(made)
    assert calls[1] in str(failure.value) and "Nothing was committed" in str(failure.value)
    table = catalog.load_table("db.t")
    assert len(table.snapshots()) == 2 and rows_in(table) == {1: "a", 2: "b", 3: "c", 4: "d"}
    root = Path(table.location().removeprefix("file://"))
    assert not list(root.rglob("*.puffin")), "a Puffin file of the failed attempt was left behind"
    monkeypatch.setattr(vectors, "write_deletion_vectors", real)
    assert c.commit(made).snapshot is not None
    table = catalog.load_table("db.t")
    assert rows_in(table) == {2: "b", 4: "d"} and len({v.path for v in live_deletes(table)}) == 2
