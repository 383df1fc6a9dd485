"""The commit lane (job/lane.py): one checkpoint at a time, its result or error taken by whoever
drains it, and the decision of which checkpoints go on it."""

from __future__ import annotations

import threading

import pytest

from iceberg_sink import options
from iceberg_sink.job.lane import CommitLane, overlaps


def test_a_handed_commit_runs_on_the_lane_thread_and_its_result_is_drained_once() -> None:
    lane: CommitLane[str] = CommitLane("table t")
    release = threading.Event()

    def commit() -> str:
        release.wait(10)
        return threading.current_thread().name

    assert lane.drain() is None and not lane.holds() and not lane.running()
    lane.hand(3, commit)
    assert lane.holds() and lane.running() and lane.checkpoint_id == 3
    with pytest.raises(RuntimeError, match="checkpoint 3 is still on the commit lane"):
        lane.hand(4, commit)
    release.set()
    drained = lane.drain()
    assert drained is not None
    checkpoint_id, future = drained
    assert checkpoint_id == 3 and future.result().startswith("iceberg-sink-commit")
    assert lane.drain() is None and not lane.holds()


def test_a_failed_commit_is_drained_with_its_error_and_the_lane_takes_the_next() -> None:
    lane: CommitLane[int] = CommitLane("table t")

    def fails() -> int:
        raise ValueError("refused by the catalog")

    lane.hand(7, fails)
    drained = lane.drain()
    assert drained is not None and drained[0] == 7
    assert isinstance(drained[1].exception(), ValueError)
    assert not lane.holds()
    lane.hand(8, lambda: 8)
    assert lane.drain() is not None


def test_a_finished_commit_is_held_until_drained() -> None:
    lane: CommitLane[int] = CommitLane("table t")
    lane.hand(1, lambda: 1)
    drained_by = threading.Event()
    threading.Thread(target=lambda: (lane.drain(), drained_by.set())).start()
    assert drained_by.wait(10)
    assert not lane.holds()


@pytest.mark.parametrize(
    ("version", "setting", "waiting", "given", "expected"),
    [
        (3, "auto", True, True, True),
        (3, "auto", False, True, False),  # nothing waiting: the micro-batch commits before it returns
        (3, "never", True, True, False),
        (2, "auto", True, True, False),  # a v2 commit is short; its conditional deletes would be files
        (3, "auto", True, False, False),  # a trigger of once / availableNow, or no idle retry
    ],
)
def test_which_checkpoints_go_on_the_lane(
    version: int, setting: str, waiting: bool, given: bool, expected: bool
) -> None:
    resolved = options.resolve({options.COMMIT_OVERLAP.key: setting}, {})
    asked: list[bool] = []

    def backlog() -> bool:
        asked.append(True)
        return waiting

    assert overlaps(backlog if given else None, version, resolved) is expected
    # The source is asked last, only when everything else allows the lane (two Py4J calls).
    assert asked == ([True] if given and version >= 3 and setting == "auto" else [])
