"""What the model check's simulated driver deaths share (harness.py, v3_steps.py): the points of a
checkpoint a driver may die at, and the exception an installed fault handler raises there."""

from __future__ import annotations

from iceberg_sink import _faults

FAULT_POINTS = (
    _faults.BATCH_START,
    _faults.AFTER_WRITE,
    _faults.AFTER_STAGE,
    _faults.AFTER_MANIFESTS,
    _faults.COMMIT_SENT,
    _faults.AFTER_COMMIT,
)

INDEX_FAULT_POINTS = (_faults.INDEX_RUNS_WRITTEN, _faults.INDEX_MANIFEST_WRITTEN)
"""Inside the partitioned key index's save (checkpoint id -1): v3 commits and v2 conversions."""


class Crash(RuntimeError):
    """Raised from an installed fault handler: the simulated driver death."""
