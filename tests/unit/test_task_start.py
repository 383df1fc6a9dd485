"""How a task the sink ships starts: its numbers, and the Python worker's heap frozen in its first tasks."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from iceberg_sink.writer import task_start as start


@pytest.fixture
def fresh() -> Iterator[None]:
    """This process as a worker that has run no task yet; whatever it freezes is unfrozen after."""
    before = set(start._settled_tasks)
    start._settled_tasks.clear()
    frozen = gc.get_freeze_count()
    try:
        yield
    finally:
        if gc.get_freeze_count() > frozen:
            gc.unfreeze()
        start._settled_tasks.clear()
        start._settled_tasks.update(before)


def test_outside_a_spark_task_nothing_is_frozen(fresh: None) -> None:
    frozen = gc.get_freeze_count()
    assert start.task_start() == start.TaskStart(0, 0, 0)
    assert gc.get_freeze_count() == frozen
    assert not start._settled_tasks


def test_the_first_two_tasks_of_a_worker_freeze_and_later_ones_do_not(fresh: None) -> None:
    assert start.settle(17)
    assert gc.get_freeze_count() > 0
    assert not start.settle(17)  # the same task again (a pandas UDF sees each of its batches)
    garbage = [[] for _ in range(1000)]
    for item in garbage:
        item.append(item)  # cycles alive when the second task starts are frozen with it
    assert start.settle(18)
    frozen = gc.get_freeze_count()
    later = [[] for _ in range(1000)]  # alive when the third task starts
    assert not start.settle(19)
    # The third task freezes nothing: its objects stay collectable. (Not an equality: a frozen object
    # another thread of this process frees leaves the permanent generation and lowers the count.)
    assert gc.get_freeze_count() < frozen + len(later)
    cycle: list[object] = []
    cycle.append(cycle)
    assert gc.is_tracked(cycle)
