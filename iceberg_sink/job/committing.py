"""Stage 7 of a micro-batch's road (road.py): commit each table's checkpoint, one snapshot each.

Each table commits on its own (its committable, its snapshot, its recovery: job/pending.py commits
it or keeps it pending through a catalog outage), a routed batch's tables up to
``iceberg-sink.route.commit-threads`` at once, then the dead-letter table, which holds the refused
rows of them all. One table's failure does not stop the others' commits: every table is tried, then
the first failure is raised (:func:`raise_first`). The post-commit topology (hooks, compaction,
equality-delete conversion) runs after each commit, from job/pending.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.job.plan import BatchPlan

logger = logging.getLogger("iceberg_sink")

_T = TypeVar("_T")

#: One table's commit: (table, its outcome, the error that stopped it).
Committed = tuple[str, CommitOutcome | None, Exception | None]


def commit(batch: BatchPlan) -> list[Committed]:
    """Commit (or keep pending) the checkpoint of every table of ``batch``, the dead-letter table last."""
    done = each_table(list(batch.plans), lambda t: batch.jobs[t].commit_planned(batch.plans[t]), batch.commit_threads)
    if batch.dead is not None and batch.dead_plan is not None:
        dead, plan = batch.dead, batch.dead_plan
        done += each_table([dead.name], lambda _: dead.job.commit_planned(plan), 1)
    return done


def each_table(
    tables: list[str], commit: Callable[[str], _T], threads: int
) -> list[tuple[str, _T | None, Exception | None]]:
    """``commit`` of each table, on up to ``threads`` threads: (table, result, error) in ``tables`` order.

    Each table's commit is independent (its own committable, snapshot and recovery), so a checkpoint
    of many tables waits for the slowest few, not for their sum: on an object store or a REST
    catalog a table's commit is mostly round trips. One table's failure does not stop the others. A
    BaseException that is not an Exception (the process is being stopped) is raised once every
    started commit has returned.
    """
    if threads <= 1 or len(tables) <= 1:
        done: list[tuple[str, _T | None, Exception | None]] = []
        for table in tables:
            try:
                done.append((table, commit(table), None))
            except Exception as e:
                done.append((table, None, e))
        return done
    with ThreadPoolExecutor(max_workers=min(threads, len(tables)), thread_name_prefix="iceberg-sink-commit") as pool:
        futures = [(table, pool.submit(commit, table)) for table in tables]
    done = []
    for table, future in futures:
        error = future.exception()
        if error is None:
            done.append((table, future.result(), None))
        elif isinstance(error, Exception):
            done.append((table, None, error))
        else:
            raise error
    return done


def raise_first(failures: list[tuple[str, Exception]]) -> None:
    """Log every table's failure; raise the first (the others' tables were still tried)."""
    if not failures:
        return
    for table, error in failures:
        logger.error("table %s: %s: %s", table, type(error).__name__, error)
    if len(failures) > 1:
        others = ", ".join(t for t, _ in failures[1:])
        failures[0][1].add_note(f"iceberg_sink: the commits of tables {others} failed too (see the log)")
    raise failures[0][1]
