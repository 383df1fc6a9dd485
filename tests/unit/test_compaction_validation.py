"""Compaction's commit-time validation: a delete committed after the plan conflicts with a group only
if it can apply to one of the group's rewritten files (Iceberg Java's
``validateNoNewDeletesForDataFiles``), decided by the one rule in ``_iceberg/deletes.py``."""

from __future__ import annotations

from typing import Any

import pytest

from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink._iceberg.position_deletes import FILE_PATH_ID
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.compaction.job import CompactionResult, _validate
from iceberg_sink.topology.compaction.planner import CompactionPlan, RewriteGroup
from iceberg_sink.topology.compaction.trigger import CompactionTrigger
from iceberg_sink.vocab.files import DataFileMeta, FileContent

PLAN_SEQ = 5


def live(
    path: str,
    seq: int = 3,
    content: FileContent = FileContent.DATA,
    spec_id: int = 1,
    partition: tuple[object, ...] = ("eu",),
    names: str | None = None,
) -> LiveFile:
    bounds = ((FILE_PATH_ID, names.encode()),) if names is not None else ()
    meta = DataFileMeta(
        content=content,
        path=path,
        spec_id=spec_id,
        partition=partition,
        record_count=1,
        file_size_in_bytes=10,
        lower_bounds=bounds,
        upper_bounds=bounds,
    )
    return LiveFile(meta, seq, "m.avro")


def position(
    path: str, names: str | None, seq: int = PLAN_SEQ + 1, partition: tuple[object, ...] = ("eu",)
) -> LiveFile:
    return live(path, seq, FileContent.POSITION_DELETES, partition=partition, names=names)


def equality(path: str, spec_id: int = 1, partition: tuple[object, ...] = ("eu",)) -> LiveFile:
    return live(path, PLAN_SEQ + 1, FileContent.EQUALITY_DELETES, spec_id=spec_id, partition=partition)


# Two groups of the same partition (spec 1, region eu) and a third file of it that no group rewrites.
A1, A2, B1, OTHER = live("a1"), live("a2"), live("b1"), live("other")
PLAN = CompactionPlan(
    snapshot_id=1,
    sequence_number=PLAN_SEQ,
    groups=(RewriteGroup((1, ("eu",)), (A1, A2), ()), RewriteGroup((1, ("eu",)), (B1,), ())),
    rules=DeleteRules([0]),
)


def kept(*deletes: LiveFile, output_spec_id: int = 1, data: tuple[LiveFile, ...] = (A1, A2, B1, OTHER)) -> list[int]:
    return _validate((list(data), list(deletes)), PLAN, {0, 1}, output_spec_id)


def test_a_new_file_scoped_position_delete_of_another_file_conflicts_with_no_group() -> None:
    # What the equality-delete conversion commits: a delete naming one data file, same partition.
    assert kept(position("p", names="other")) == [0, 1]


def test_a_new_file_scoped_position_delete_of_a_rewritten_file_drops_only_its_group() -> None:
    assert kept(position("p", names="a2")) == [1]
    assert kept(position("p", names="b1")) == [0]
    assert kept(position("p", names="a1"), position("q", names="b1")) == []


def test_a_new_partition_scoped_position_delete_conflicts_with_every_group_of_its_partition() -> None:
    # Without equal file_path bounds it may name any file of the partition.
    assert kept(position("p", names=None)) == []
    # ... but never a file of another partition (position deletes are never global).
    assert kept(position("p", names=None, partition=("us",))) == [0, 1]


def test_position_deletes_the_plan_saw_never_conflict() -> None:
    assert kept(position("p", names="a1", seq=PLAN_SEQ), position("q", names=None, seq=PLAN_SEQ - 1)) == [0, 1]


def test_new_equality_deletes_apply_to_the_new_files_and_do_not_conflict() -> None:
    # The new files keep the plan's sequence number: a newer equality delete still applies to them.
    assert kept(equality("e"), equality("g", spec_id=0, partition=())) == [0, 1]


def test_a_new_scoped_equality_delete_conflicts_when_the_new_files_change_spec() -> None:
    # Rewritten into spec 2, the files leave partition (1, eu): its scoped delete would miss them.
    assert kept(equality("e"), output_spec_id=2) == []
    # A global one applies to every spec; one of another partition applies to no rewritten file.
    assert kept(equality("g", spec_id=0, partition=()), equality("u", partition=("us",)), output_spec_id=2) == [0, 1]


def test_a_group_whose_input_is_gone_is_dropped() -> None:
    assert kept(data=(A1, B1, OTHER)) == [1]


def trigger(metrics: SinkMetrics) -> CompactionTrigger:
    def unused() -> Any:
        raise AssertionError("not called by on_success")

    return CompactionTrigger(CompactionConfig(every_n_commits=1), "db.t", "main", unused, 1, metrics, unused)


def test_a_compaction_that_rewrote_nothing_is_counted_as_noop_not_succeeded() -> None:
    metrics = SinkMetrics()
    job = trigger(metrics)
    job.on_success(CompactionResult(planned_groups=2, dropped_groups=3, replans=1))
    job.on_success(
        CompactionResult(snapshot_id=7, planned_groups=2, committed_groups=1, dropped_groups=1, rewritten_data_files=4)
    )
    job.on_success(CompactionResult())  # nothing to plan: not a race, nothing to count as noop
    m = metrics.snapshot()
    assert (m.compactions_succeeded, m.compactions_noop) == (2, 1)
    assert (m.compaction_dropped_groups, m.compaction_replans, m.compaction_rewritten_files) == (4, 1, 4)


def test_results_of_a_plan_made_again_add_up() -> None:
    first = CompactionResult(planned_groups=2, committed_groups=1, dropped_groups=1, snapshot_id=5, added_data_files=1)
    both = first.then(CompactionResult(planned_groups=1, dropped_groups=1))
    assert (both.snapshot_id, both.planned_groups, both.committed_groups, both.dropped_groups) == (5, 3, 1, 2)
    assert both.replans == 1 and both.added_data_files == 1 and not both.noop
    assert CompactionResult(planned_groups=1, dropped_groups=1).then(CompactionResult()).noop


def test_max_replans_is_validated() -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"max_replans\): expected an integer at least 0 .*received -1"):
        CompactionConfig(max_replans=-1)
    with pytest.raises(InvalidSinkConfigError, match="received True"):
        CompactionConfig(max_replans=True)
