"""The plan of one table's checkpoint between :meth:`SinkJob.begin` and :meth:`SinkJob.commit_planned`
(job/pipeline.py), also driven one table at a time by a routed sink (job/routing.py)."""

from __future__ import annotations

import attrs
from pyiceberg.table import Table

from iceberg_sink import options
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.table.key_bounds import KeyBounds
from iceberg_sink.topology.distribution import DistributionMode
from iceberg_sink.writer.spec import WriterSpec

__all__ = ["CheckpointPlan"]


@attrs.define
class CheckpointPlan:
    """One table's checkpoint between :meth:`SinkJob.begin` and :meth:`SinkJob.commit_planned`.

    Attributes:
        checkpoint_id: the checkpoint.
        table: the table as loaded for it (maybe stale while ``deferred`` is set).
        deferred: why this checkpoint's commit waits (committer/pending.py ``defers``: the catalog
            is unreachable, or an earlier checkpoint lost every commit race), or None.
        done: set when the table already holds the checkpoint: nothing to write or commit.
        stored: the persisted committable to commit (stored before a crash, or by :meth:`SinkJob.stage`).
        resolved, proof, spec, mode, sort_columns: how to write it (set when it must be written).
    """

    checkpoint_id: int
    table: Table
    deferred: BaseException | None = None
    done: CommitOutcome | None = None
    stored: Committable | None = None
    resolved: options.ResolvedOptions = attrs.field(factory=lambda: options.resolve({}, {}))
    proof: KeyBounds | None = None
    spec: WriterSpec | None = None
    mode: DistributionMode = DistributionMode.NONE
    sort_columns: list[str] = attrs.field(factory=list)
