"""Named points inside Spark writer tasks where tests inject faults (fail, kill the worker, stall).

Production code only calls :func:`hit`; without the environment variable it does nothing. Tasks
run in other processes (Python workers, possibly on other machines), so faults cannot be installed
as handlers like :mod:`iceberg_sink._faults`: a test passes them to every Python worker as JSON in
``ICEBERG_SINK_TASK_FAULTS`` (``spark.executorEnv.ICEBERG_SINK_TASK_FAULTS``), a list of objects::

    {"point": "task-after-write", "action": "fail" | "exit" | "sleep",
     "partition": 0, "attempt": 0, "checkpoint": 3, "seconds": 10}

``partition`` (Spark partition id), ``attempt`` (Spark's attempt number of the task, 0 for the
first) and ``checkpoint`` select where it applies; a missing one matches any. ``fail`` raises,
``exit`` ends the Python worker process at once (as a lost executor would), ``sleep`` stalls the
task for ``seconds`` (a straggler, for speculative execution).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "ICEBERG_SINK_TASK_FAULTS"

# Every file of the task's writer is complete; its result has not reached Spark yet.
TASK_AFTER_WRITE = "task-after-write"


class InjectedTaskFault(RuntimeError):
    """Raised by a ``fail`` fault."""


def _matches(fault: dict[str, Any], point: str, partition: int, attempt: int, checkpoint: int) -> bool:
    return (
        fault.get("point") == point
        and fault.get("partition", partition) == partition
        and fault.get("attempt", attempt) == attempt
        and fault.get("checkpoint", checkpoint) == checkpoint
    )


def hit(point: str, partition: int, attempt: int, checkpoint: int) -> None:
    """Apply the faults configured for this point of this task attempt, if any."""
    configured = os.environ.get(ENV)
    if not configured:
        return
    for fault in json.loads(configured):
        if not _matches(fault, point, partition, attempt, checkpoint):
            continue
        action = fault.get("action")
        if action == "fail":
            raise InjectedTaskFault(f"injected fault at {point}: partition {partition}, attempt {attempt}")
        if action == "exit":
            os._exit(17)
        if action == "sleep":
            time.sleep(float(fault.get("seconds", 10)))
