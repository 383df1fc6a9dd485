"""The tables of one job committed together: each checkpoint in all of them, or in none.

A job (one checkpoint location, one job id) writes several tables when it is routed, or has a
dead-letter table. Each table has its own committables and its own idempotent commit
(job/pending.py). :class:`Together` commits a checkpoint's tables:

- **atomically** (``atomic``: ``.atomic_commits("auto")``, the default, or ``"required"``, on a SQL
  catalog or a REST catalog serving ``transactions/commit``): every table's commit runs on a thread
  of its own through its usual retry loop, and their snapshots land in one database transaction or
  one REST request (``_iceberg/together.py``): a reader sees the checkpoint in every table or none. A table whose commit fails, or that keeps
  the checkpoint pending, keeps it from every table (the others' commits end in
  ``AtomicCommitAbortedError``, which a stream rides out as pending);
- **one table at a time** otherwise (``"off"``, or a catalog that cannot: Glue, Hive, a REST
  catalog without ``transactions/commit``), each
  table's commit on its own, up to ``iceberg-sink.route.commit-threads`` at once; the outcomes say
  ``atomic=False``.

Pending checkpoints (a restart, an outage) are committed checkpoint by checkpoint, oldest first,
each checkpoint's tables together (:meth:`Together.commit_pending`): while a checkpoint of one table
stays pending no table commits a later one, so every state a reader sees is a checkpoint of the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

import attrs
from pyiceberg.catalog import Catalog

from iceberg_sink._iceberg.together import CommitGroup
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.errors import AtomicCommitAbortedError, AtomicCommitsUnavailableError
from iceberg_sink.job.pending import CommitDeferred, PendingCommits
from iceberg_sink.table.catalog import commits_atomically

logger = logging.getLogger("iceberg_sink")

_T = TypeVar("_T")

# (job id, catalog name) of the jobs told that their catalog commits one table at a time.
_said: set[tuple[str, str]] = set()

#: One table's commit: (table, its outcome, the error that stopped it).
Committed = tuple[str, CommitOutcome | None, Exception | None]


class Together:
    """The tables of one job and how their checkpoints commit (module docstring).

    Args:
        job_id: the job (for messages).
        atomic: whether a checkpoint's tables commit in one catalog transaction.
        threads: how many tables commit at once when not atomic.
    """

    def __init__(self, job_id: str, atomic: bool, threads: int = 1) -> None:
        self.job_id = job_id
        self.atomic = atomic
        self._threads = threads
        self._tables: dict[str, PendingCommits] = {}
        # The last pass over pending checkpoints of a micro-batch: (its `before`, why it deferred or None).
        self._passed: tuple[int, BaseException | None] | None = None

    @classmethod
    def of(cls, job_id: str, mode: str, catalog: Catalog, tables: str, threads: int = 1) -> Together:
        """The tables of job ``job_id`` (``tables`` names them for the log) committing as ``mode``
        (``.atomic_commits``) says on ``catalog``: atomically where it can, unless ``"off"``.

        Raises:
            AtomicCommitsUnavailableError: ``"required"``, and the catalog cannot now (``build()``
                checked it; a REST catalog may since have become unreachable or been replaced):
                the job does not start committing one table at a time.
        """
        atomic = mode != "off" and commits_atomically(catalog)
        if mode == "required" and not atomic:
            raise AtomicCommitsUnavailableError(
                f"job {job_id}: atomic_commits('required'), but catalog {catalog.name!r} cannot commit several "
                "tables in one transaction now (not a SQL catalog, or a REST catalog that does not answer "
                "transactions/commit); nothing was committed (docs/transactions.md)"
            )
        if mode != "off" and not atomic and (job_id, catalog.name) not in _said:
            _said.add((job_id, catalog.name))  # once per job (each bounded write() is a job of its own run)
            logger.info(
                "job %s: catalog %r commits one table at a time (it has no multi-table transaction: a SQL "
                "catalog or a REST catalog serving transactions/commit has): the %s commit each checkpoint "
                "one after the other (outcomes say atomic=False)",
                job_id,
                catalog.name,
                tables,
            )
        return cls(job_id, atomic, threads)

    def join(self, table: str, commits: PendingCommits) -> Together | None:
        """Make ``table`` (its commit step ``commits``) one of the job's tables; returns this Together
        for the table's job to commit its pending checkpoints through when atomic, else None."""
        if not self.atomic:
            return None
        self._tables[table] = commits
        return self

    def commit(
        self,
        members: dict[str, Callable[[], CommitOutcome | None]],
        checkpoint_id: int,
        last: tuple[str, Callable[[], CommitOutcome | None]] | None = None,
    ) -> list[Committed]:
        """Run each table's commit of checkpoint ``checkpoint_id`` (``members``: table -> its commit),
        and ``last`` (the dead-letter table's): (table, outcome, error), ``last`` at the end. When not
        atomic the members commit up to ``threads`` at once, then ``last``, and one table's failure
        does not stop the others; when atomic all land together, and one's failure stops them all."""
        if last is not None and self.atomic:
            members = {**members, last[0]: last[1]}
        names = list(members)
        if len(names) <= 1 or not self.atomic:
            done = each_table(names, lambda t: members[t](), self._threads)
            if last is not None and not self.atomic:
                done += each_table([last[0]], lambda _: last[1](), 1)
            if len(done) <= 1:
                return done
            # The tables' commits became visible one by one.
            return [(t, attrs.evolve(o, atomic=False) if o is not None else None, e) for t, o, e in done]
        group = CommitGroup(names, f"checkpoint {checkpoint_id} of job {self.job_id}")

        def member(table: str) -> CommitOutcome | None:
            with group.member(table) as membership:
                outcome = members[table]()
                if outcome is None or not outcome.pending:
                    membership.finished()
                return outcome

        # Every member at once: each waits for the others at its hand-over.
        return each_table(names, member, len(names))

    def commit_pending(
        self, before: int | None = None, tables: Collection[str] | None = None
    ) -> dict[str, list[CommitOutcome]]:
        """Commit the stored committables of ``tables`` (default: all) below ``before``, checkpoint by
        checkpoint, oldest first, each checkpoint's tables together; each table's outcomes.

        Within one micro-batch (the same ``before``) the pass runs once: every table's
        :meth:`SinkJob.begin` asks, and gets its answer again.

        Raises:
            CommitDeferred: a checkpoint could not land now (a stream: the catalog is unreachable,
                other writers won every attempt, or a table keeps it pending); it and every later
                checkpoint stay stored.
        """
        if before is not None and self._passed is not None and self._passed[0] == before:
            if self._passed[1] is not None:
                raise CommitDeferred(self._passed[1])
            return {}
        stored: dict[int, dict[str, Committable]] = {}
        for table in sorted(self._tables if tables is None else tables):
            for committable in self._tables[table].stored():
                if before is None or committable.checkpoint_id < before:
                    stored.setdefault(committable.checkpoint_id, {})[table] = committable
        outcomes: dict[str, list[CommitOutcome]] = {}
        try:
            for checkpoint_id in sorted(stored):
                members = {t: partial(self._tables[t].commit, c) for t, c in stored[checkpoint_id].items()}
                done = self.commit(dict(members), checkpoint_id)
                deferred = [e.error for _, _, e in done if isinstance(e, CommitDeferred)]
                raise_first([(t, e) for t, _, e in done if e is not None and not isinstance(e, CommitDeferred)])
                if deferred:
                    raise CommitDeferred(
                        next((d for d in deferred if not isinstance(d, AtomicCommitAbortedError)), deferred[0])
                    )
                for table, outcome, _ in done:
                    if outcome is not None:
                        outcomes.setdefault(table, []).append(outcome)
        except CommitDeferred as e:
            self._passed = (before, e.error) if before is not None else None
            raise
        finally:
            for table in {t for per in stored.values() for t in per}:
                self._tables[table].count_pending()
        self._passed = (before, None) if before is not None else None
        return outcomes


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
    """Log every table's failure; raise the first, a table's own failure before the tables an atomic
    commit stopped because of it (AtomicCommitAbortedError; the others' tables were still tried)."""
    if not failures:
        return
    failures = sorted(failures, key=lambda f: isinstance(f[1], AtomicCommitAbortedError))
    for table, error in failures:
        logger.error("table %s: %s: %s", table, type(error).__name__, error)
    if len(failures) > 1:
        others = ", ".join(t for t, _ in failures[1:])
        failures[0][1].add_note(f"iceberg_sink: the commits of tables {others} failed too (see the log)")
    raise failures[0][1]
