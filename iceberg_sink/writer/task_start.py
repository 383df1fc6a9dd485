"""How every task the sink ships to a Python worker starts: who it is, and the worker's heap settled.

PySpark's daemon calls ``gc.collect()`` after every task a reused Python worker finishes
(``pyspark/daemon.py``, ``spark.python.worker.reuse`` is on by default): a full collection, which
visits every object the garbage collector tracks. A worker that imported the writer (PyIceberg,
PyArrow, pydantic models) holds about 120,000 of them, and one collection took 180 ms of CPU on this
project's 2-core machine, after every task: in a streaming query of 10,000-change micro-batches, 79 %
of the Python workers' busy samples (py-spy), where writing took 14-16 ms. Freezing them raised the
stream's changes per second by 18-21 % and cut its CPU per change by a fifth (docs/benchmarks-cdc.md,
issue 41).

:func:`task_start`, called first in every task function the sink ships to a Python worker (the
writers, compaction's rewrites, the key index's reads, the bucket function of hash distribution, the
source checks' partition functions), moves every object alive at that moment into the permanent
generation (``gc.freeze()``), which collections skip: a collection after the task then visits only
what the task made. Functions Spark calls once per row (a route function, the bare-type check) do
not call it: a call per row would cost more than it saves once a worker is settled. It freezes at
the start of the first two tasks of a worker process only: the first freezes the imports done to
unpickle the task, the second also those the first task made on its way (PyIceberg and PyArrow
import lazily), after the daemon's collection has cleared the first task's garbage. Later tasks run
as before.

What it costs: an object frozen while alive is still freed when its last reference goes (reference
counting is unaffected); only reference cycles among frozen objects are never collected. Those are
the modules' own (never garbage) and at most the inputs of the two tasks frozen once per process,
a bounded one-time amount. Outside a Spark task (a driver calling a task function directly, as tests
do) it does nothing.
"""

from __future__ import annotations

import gc
from typing import NamedTuple

from pyspark import TaskContext

#: The first this many tasks of a worker process freeze what is alive when they start.
SETTLING_TASKS = 2

_settled_tasks: set[int] = set()


class TaskStart(NamedTuple):
    """The running task as Spark numbers it (zeros outside a Spark task); unpacks in this order."""

    partition: int
    attempt_id: int
    attempt_number: int


def task_start() -> TaskStart:
    """The running task, after :func:`settle` saw it; call it first in every task function."""
    context = TaskContext.get()
    if context is None:
        return TaskStart(0, 0, 0)
    settle(context.taskAttemptId())
    return TaskStart(context.partitionId(), context.taskAttemptId(), context.attemptNumber())


def settle(task_attempt_id: int) -> bool:
    """Freeze the worker's long-lived objects if ``task_attempt_id`` (Spark's, of the task that
    starts) is one of the first :data:`SETTLING_TASKS` tasks this process runs; True when it froze."""
    if len(_settled_tasks) >= SETTLING_TASKS or task_attempt_id in _settled_tasks:
        return False
    _settled_tasks.add(task_attempt_id)
    gc.freeze()
    return True
