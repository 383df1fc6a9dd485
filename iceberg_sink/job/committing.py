"""Stage 7 of a micro-batch's road (road.py): commit each table's checkpoint, one snapshot each.

Each table has its own committable, snapshot and recovery (job/pending.py commits it or keeps it
pending through a catalog outage). A job whose tables commit atomically (job/together.py: a SQL
catalog, by default) commits them all, the dead-letter table included, in one catalog transaction.
Otherwise each table commits on its own, a routed batch's tables up to
``iceberg-sink.route.commit-threads`` at once, then the dead-letter table, which holds the refused
rows of them all; one table's failure does not stop the others' commits: every table is tried, then
the first failure is raised (``together.raise_first``). The post-commit topology (hooks, compaction,
equality-delete conversion) runs after each commit, from job/pending.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.job.together import Committed, Together

__all__ = ["Committed", "commit"]


def commit(batch: BatchPlan) -> list[Committed]:
    """Commit (or keep pending) the checkpoint of every table of ``batch``: together, in one catalog
    transaction, when the batch's job commits its tables atomically (job/together.py), else each on
    its own, up to ``batch.commit_threads`` at once, then the dead-letter table."""
    members: dict[str, Callable[[], CommitOutcome | None]] = {
        t: partial(batch.jobs[t].commit_planned, p) for t, p in batch.plans.items()
    }
    dead, dead_plan = batch.dead, batch.dead_plan
    last = (
        (dead.name, partial(dead.job.commit_planned, dead_plan)) if dead is not None and dead_plan is not None else None
    )
    together = batch.together or Together(batch.job_id, atomic=False, threads=batch.commit_threads)
    return together.commit(members, batch.checkpoint_id, last)
