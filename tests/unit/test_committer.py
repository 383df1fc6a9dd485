"""The committer against a real SQLite catalog: ordering, idempotence, conflicts, lost responses."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink import CommitRetriesExhaustedError, IcebergSinkError, _faults
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import IcebergCommitter, find_max_committed_checkpoint
from iceberg_sink.topology import maintenance
from tests.helpers import LosingCatalog, write_batches, writer_spec

SCHEMA = Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType()))
NO_WAIT = RetryPolicy(num_retries=3, min_wait_ms=0, max_wait_ms=0)


@pytest.fixture
def sql_catalog(tmp_path: Path) -> LosingCatalog:
    (tmp_path / "wh").mkdir()
    cat = LosingCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("db")
    cat.create_table("db.t", schema=SCHEMA)
    return cat


def committable_for(table: Table, job: str, checkpoint: int, ids: list[int], branch: str = "main") -> Committable:
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})
    result = write_batches(writer_spec(table, job_id=job, checkpoint_id=checkpoint), data)
    committable = CommitAggregator("db.t", branch, job).aggregate(table, table.io, checkpoint, [result])
    assert committable is not None
    return committable


def committer(
    cat: SqlCatalog, job: str, branch: str = "main", load: Callable[[], Table] | None = None
) -> IcebergCommitter:
    return IcebergCommitter(load or (lambda: cat.load_table("db.t")), branch, job, NO_WAIT, sleep=lambda s: None)


def ids_in(table: Table, branch: str = "main") -> list[int]:
    snapshot = table.snapshot_by_name(branch)
    assert snapshot is not None
    return sorted(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()["id"].to_pylist())


def test_each_checkpoint_is_one_snapshot_with_job_and_checkpoint_ids(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    c = committer(sql_catalog, "job1")
    for checkpoint, ids in enumerate([[1, 2], [3], [4, 5, 6]]):
        outcome = c.commit(committable_for(table, "job1", checkpoint, ids))
        assert outcome.snapshot is not None and not outcome.already_committed
    table = sql_catalog.load_table("db.t")
    snapshots = table.snapshots()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in snapshots] == ["0", "1", "2"]  # type: ignore[index]
    assert {s.summary["iceberg-sink.job-id"] for s in snapshots} == {"job1"}  # type: ignore[index]
    assert [s.sequence_number for s in snapshots] == [1, 2, 3]
    assert ids_in(table) == [1, 2, 3, 4, 5, 6]
    assert find_max_committed_checkpoint(table, "main", "job1", "iceberg-sink") == 2
    assert find_max_committed_checkpoint(table, "main", "other", "iceberg-sink") == -1


def test_recommitting_a_checkpoint_is_a_no_op(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    committable = committable_for(table, "job1", 0, [1, 2, 3])
    c = committer(sql_catalog, "job1")
    c.commit(committable)
    again = c.commit(committable)
    assert again.already_committed and again.snapshot is None
    table = sql_catalog.load_table("db.t")
    assert len(table.snapshots()) == 1
    assert ids_in(table) == [1, 2, 3]
    # Staged manifests are cleaned up once committed.
    assert all(not Path(p.removeprefix("file://")).exists() for p in committable.manifests.paths)


def test_lost_commit_response_is_not_applied_twice(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    committable = committable_for(table, "job1", 7, [10, 11])
    sql_catalog.lose_next = 1
    outcome = committer(sql_catalog, "job1").commit(committable)
    assert outcome.attempts == 1
    table = sql_catalog.load_table("db.t")
    assert len(table.snapshots()) == 1
    assert ids_in(table) == [10, 11]


def test_conflict_with_another_writer_is_retried_on_the_new_head(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    committable = committable_for(table, "job1", 0, [1, 2])
    calls = {"n": 0}
    other = sql_catalog.load_table("db.t")

    def load_then_race() -> Table:
        loaded = sql_catalog.load_table("db.t")
        calls["n"] += 1
        if calls["n"] == 1:  # another writer commits right after we read the table
            other.append(pa.table({"id": pa.array([100], pa.int64()), "v": ["other"]}))
        return loaded

    outcome = committer(sql_catalog, "job1", load=load_then_race).commit(committable)
    assert outcome.attempts == 2
    table = sql_catalog.load_table("db.t")
    assert ids_in(table) == [1, 2, 100]
    assert len(table.snapshots()) == 2


def test_exhausted_retries_keep_nothing_half_done(sql_catalog: LosingCatalog, tmp_path: Path) -> None:
    table = sql_catalog.load_table("db.t")
    committable = committable_for(table, "job1", 0, [1])
    other = sql_catalog.load_table("db.t")

    def always_stale() -> Table:
        loaded = sql_catalog.load_table("db.t")
        other.refresh()
        other.append(pa.table({"id": pa.array([100], pa.int64()), "v": ["other"]}))
        return loaded

    with pytest.raises(CommitRetriesExhaustedError, match="stays pending"):
        committer(sql_catalog, "job1", load=always_stale).commit(committable)
    table = sql_catalog.load_table("db.t")
    assert 1 not in ids_in(table)
    # The staged manifests survive for the next attempt; the failed attempts' own files do not.
    assert all(Path(p.removeprefix("file://")).exists() for p in committable.manifests.paths)
    outcome = committer(sql_catalog, "job1").commit(committable)
    assert outcome.snapshot is not None
    assert ids_in(sql_catalog.load_table("db.t")).count(1) == 1


def test_branch_commits_leave_main_alone_and_dedup_on_the_branch(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    committer(sql_catalog, "job1").commit(committable_for(table, "job1", 0, [1]))
    table = sql_catalog.load_table("db.t")
    branch_committer = committer(sql_catalog, "job1", branch="audit")
    # The branch forks from main's head, which already holds checkpoint 0 of job1.
    assert branch_committer.max_committed(table) == 0
    branch_committer.commit(committable_for(table, "job1", 1, [2], branch="audit"))
    table = sql_catalog.load_table("db.t")
    assert ids_in(table, "main") == [1]
    assert ids_in(table, "audit") == [1, 2]
    assert find_max_committed_checkpoint(table, "audit", "job1", "iceberg-sink") == 1
    assert find_max_committed_checkpoint(table, "main", "job1", "iceberg-sink") == 0


def test_two_jobs_do_not_confuse_each_others_checkpoints(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    a, b = committer(sql_catalog, "jobA"), committer(sql_catalog, "jobB")
    a.commit(committable_for(table, "jobA", 5, [1]))
    b.commit(committable_for(table, "jobB", 0, [2]))
    b.commit(committable_for(table, "jobB", 1, [3]))
    table = sql_catalog.load_table("db.t")
    assert a.max_committed(table) == 5 and b.max_committed(table) == 1
    assert ids_in(table) == [1, 2, 3]


def test_a_commit_on_another_branch_meanwhile_is_retried_not_fatal(sql_catalog: LosingCatalog) -> None:
    """Another branch's commit raises the table's last sequence number: the snapshot we prepared on
    the older metadata has a stale one. That is a lost race (retry on fresh metadata), not an error."""
    table = sql_catalog.load_table("db.t")
    committer(sql_catalog, "job1").commit(committable_for(table, "job1", 0, [1]))
    committer(sql_catalog, "jobB", branch="b").commit(committable_for(table, "jobB", 0, [50], branch="b"))
    committable = committable_for(sql_catalog.load_table("db.t"), "job1", 1, [2])
    calls = {"n": 0}

    def load_then_other_branch_commits() -> Table:
        loaded = sql_catalog.load_table("db.t")
        calls["n"] += 1
        if calls["n"] == 1:
            other = committer(sql_catalog, "jobB", branch="b")
            other.commit(committable_for(loaded, "jobB", 1, [51], branch="b"))
        return loaded

    outcome = committer(sql_catalog, "job1", load=load_then_other_branch_commits).commit(committable)
    assert outcome.snapshot is not None and outcome.attempts == 2
    table = sql_catalog.load_table("db.t")
    assert ids_in(table, "main") == [1, 2]
    assert ids_in(table, "b") == [1, 50, 51]
    sequence_numbers = [s.sequence_number for s in table.snapshots()]
    assert len(set(sequence_numbers)) == len(sequence_numbers)


def test_a_commit_found_landed_after_a_lost_response_reports_its_snapshot(sql_catalog: LosingCatalog) -> None:
    """Post-commit hooks, the compaction trigger and metrics run on the outcome's snapshot: a commit
    whose response was lost but which landed must still report it."""
    table = sql_catalog.load_table("db.t")
    committable = committable_for(table, "job1", 3, [7])
    sql_catalog.lose_next = 1
    outcome = committer(sql_catalog, "job1").commit(committable)
    table = sql_catalog.load_table("db.t")
    assert outcome.snapshot is not None and not outcome.already_committed
    assert outcome.snapshot.snapshot_id == table.metadata.current_snapshot_id
    assert outcome.data_files and outcome.data_files[0].record_count == 1


def test_commits_keep_the_branch_retention_settings(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    committer(sql_catalog, "job1").commit(committable_for(table, "job1", 0, [1]))
    table = sql_catalog.load_table("db.t")
    head = table.metadata.current_snapshot_id
    assert head is not None
    day, week = 86_400_000, 7 * 86_400_000
    with table.manage_snapshots() as manage:
        manage.create_branch(head, "audit", max_ref_age_ms=week, max_snapshot_age_ms=day, min_snapshots_to_keep=5)
    committer(sql_catalog, "job1", branch="audit").commit(committable_for(table, "job1", 1, [2], branch="audit"))
    ref = sql_catalog.load_table("db.t").metadata.refs["audit"]
    assert (ref.max_ref_age_ms, ref.max_snapshot_age_ms, ref.min_snapshots_to_keep) == (week, day, 5)
    assert ref.snapshot_id != head


def test_committable_of_a_dropped_and_recreated_table_is_refused(sql_catalog: LosingCatalog) -> None:
    """Staged files of the old table must never be committed into a new table of the same name."""
    old = sql_catalog.load_table("db.t")
    committable = committable_for(old, "job1", 0, [1, 2])
    sql_catalog.drop_table("db.t")
    new = sql_catalog.create_table("db.t", schema=SCHEMA)
    assert new.metadata.table_uuid != old.metadata.table_uuid
    with pytest.raises(IcebergSinkError, match=f"{old.metadata.table_uuid}.*{new.metadata.table_uuid}") as raised:
        committer(sql_catalog, "job1").commit(committable)
    assert isinstance(raised.value, RuntimeError)
    assert sql_catalog.load_table("db.t").snapshots() == []
    # Nothing is cleaned up either: the staged manifests still describe the old table's files.
    assert all(Path(p.removeprefix("file://")).exists() for p in committable.manifests.paths)


def test_the_first_commit_of_a_table_can_go_to_a_branch(sql_catalog: LosingCatalog) -> None:
    """Found by the model check: PyIceberg refuses "branch must not exist" on a table without
    snapshots, so a branch sink's first commit failed on every rerun."""
    table = sql_catalog.load_table("db.t")
    outcome = committer(sql_catalog, "job1", branch="b").commit(committable_for(table, "job1", 0, [1, 2], branch="b"))
    assert outcome.snapshot is not None
    table = sql_catalog.load_table("db.t")
    assert ids_in(table, "b") == [1, 2]
    assert "main" not in table.metadata.refs
    # Main's first commit then starts from nothing, and the branch keeps its rows.
    committer(sql_catalog, "job2").commit(committable_for(table, "job2", 0, [9]))
    table = sql_catalog.load_table("db.t")
    assert ids_in(table, "main") == [9] and ids_in(table, "b") == [1, 2]


def test_every_lost_race_is_reported_to_on_conflict(sql_catalog: LosingCatalog) -> None:
    table = sql_catalog.load_table("db.t")
    other = sql_catalog.load_table("db.t")
    races = {"left": 2}

    def load_then_race() -> Table:
        loaded = sql_catalog.load_table("db.t")
        if races["left"]:  # another writer commits right after we read the table, twice
            races["left"] -= 1
            other.refresh()
            other.append(pa.table({"id": pa.array([100 + races["left"]], pa.int64()), "v": ["other"]}))
        return loaded

    conflicts: list[int] = []
    c = IcebergCommitter(
        load_then_race, "main", "job1", NO_WAIT, sleep=lambda s: None, on_conflict=lambda: conflicts.append(1)
    )
    outcome = c.commit(committable_for(table, "job1", 0, [1, 2]), table=load_then_race())
    assert outcome.attempts == 3
    assert len(conflicts) == 2
    assert ids_in(sql_catalog.load_table("db.t")) == [1, 2, 100, 101]


def test_commit_send_fault_points_bracket_the_catalog_call(sql_catalog: LosingCatalog) -> None:
    """BEFORE_COMMIT_PREPARE and BEFORE_COMMIT_SEND: nothing in the catalog yet; COMMIT_SENT: the catalog holds
    the snapshot."""
    table = sql_catalog.load_table("db.t")
    seen: list[tuple[str, int, int]] = []

    def record(point: str, checkpoint_id: int) -> None:
        seen.append((point, checkpoint_id, len(sql_catalog.load_table("db.t").snapshots())))

    _faults.install(record)
    try:
        committer(sql_catalog, "job1").commit(committable_for(table, "job1", 4, [1]))
    finally:
        _faults.clear()
    assert seen == [
        (_faults.BEFORE_COMMIT_PREPARE, 4, 0),
        (_faults.BEFORE_COMMIT_SEND, 4, 0),
        (_faults.COMMIT_SENT, 4, 1),
    ]


def test_a_commit_prepared_on_a_snapshot_expired_meanwhile_is_prepared_again(sql_catalog: LosingCatalog) -> None:
    """The driver loaded the table, another writer moved the head, and snapshot expiry removed the old
    head with its manifest list: the commit is prepared again on the table as it is now."""
    other = sql_catalog.load_table("db.t")
    other.append(pa.table({"id": pa.array([100], pa.int64()), "v": ["other"]}))
    stale = sql_catalog.load_table("db.t")
    committable = committable_for(stale, "job1", 0, [1, 2])
    other.refresh()
    other.append(pa.table({"id": pa.array([101], pa.int64()), "v": ["other"]}))
    expired = maintenance.expire_snapshots(
        lambda: sql_catalog.load_table("db.t"), dt.datetime.now(dt.UTC) + dt.timedelta(days=1), retain_last=1
    )
    assert stale.metadata.current_snapshot_id in expired.expired_snapshot_ids
    assert stale.current_snapshot().manifest_list.removeprefix("file://") in {  # type: ignore[union-attr]
        p.removeprefix("file://") for p in expired.deleted_files
    }
    outcome = committer(sql_catalog, "job1").commit(committable, table=stale)
    assert outcome.snapshot is not None
    assert ids_in(sql_catalog.load_table("db.t")) == [1, 2, 100, 101]


def test_expiry_keeps_a_jobs_newest_snapshot_below_a_cut_in_the_history(sql_catalog: LosingCatalog) -> None:
    """Expiring a snapshot in the middle of the history cuts the parent chain; a later expiry must still
    keep the newest snapshot of a job below the cut, or a replay of its last batch is written twice."""

    def load() -> Table:
        return sql_catalog.load_table("db.t")

    def expire() -> None:
        maintenance.expire_snapshots(load, dt.datetime.now(dt.UTC) + dt.timedelta(days=1), retain_last=1)

    committer(sql_catalog, "jobA").commit(committable_for(load(), "jobA", 0, [1]))
    for checkpoint in (0, 1):
        committer(sql_catalog, "jobB").commit(committable_for(load(), "jobB", checkpoint, [10 + checkpoint]))
    expire()  # B's checkpoint 0 goes: the chain from the head now ends at B's checkpoint 1
    committer(sql_catalog, "jobB").commit(committable_for(load(), "jobB", 2, [12]))
    expire()
    assert find_max_committed_checkpoint(load(), "main", "jobA", "iceberg-sink") == 0
    assert find_max_committed_checkpoint(load(), "main", "jobB", "iceberg-sink") == 2
    # The replayed checkpoint 0 of job A is recognised, not committed again.
    again = committer(sql_catalog, "jobA").commit(committable_for(load(), "jobA", 0, [1]))
    assert again.already_committed
    assert ids_in(load()) == [1, 10, 11, 12]
