"""job/committing.py's each_table: tables' commits on several threads, results in the tables' order,
one table's failure kept beside the others' results, a process stop raised after all returned."""

from __future__ import annotations

import threading

import pytest

from iceberg_sink.job.together import each_table


def test_commits_run_at_once_up_to_the_thread_count() -> None:
    barrier = threading.Barrier(3, timeout=10)  # breaks (and fails the test) unless 3 run at once

    def commit(table: str) -> str:
        barrier.wait()
        return table.upper()

    assert each_table(["c", "a", "b"], commit, threads=3) == [("c", "C", None), ("a", "A", None), ("b", "B", None)]


def test_one_thread_commits_in_the_given_order() -> None:
    seen: list[str] = []
    each_table(["b", "a", "c"], seen.append, threads=1)
    assert seen == ["b", "a", "c"]


@pytest.mark.parametrize("threads", [1, 4])
def test_a_failed_table_does_not_stop_the_others(threads: int) -> None:
    def commit(table: str) -> str:
        if table == "bad":
            raise ValueError("refused")
        return table

    done = each_table(["a", "bad", "c"], commit, threads=threads)
    assert [(t, r) for t, r, _ in done] == [("a", "a"), ("bad", None), ("c", "c")]
    error = done[1][2]
    assert isinstance(error, ValueError) and str(error) == "refused"


def test_a_process_stop_is_raised_once_every_commit_returned() -> None:
    finished: list[str] = []

    def commit(table: str) -> None:
        if table == "stop":
            raise KeyboardInterrupt
        threading.Event().wait(0.2)
        finished.append(table)

    with pytest.raises(KeyboardInterrupt):
        each_table(["stop", "a", "b"], commit, threads=3)
    assert sorted(finished) == ["a", "b"]
