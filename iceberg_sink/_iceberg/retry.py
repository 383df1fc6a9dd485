"""The one retry loop for every commit the sink makes (checkpoints, compaction, manifest rewrites).

Each attempt starts from the table as the catalog has it now and prepares its snapshot again (the
branch head, the sequence number and what is still valid may all have changed). Lost races are
retried with backoff (Iceberg's ``commit.retry.*`` properties). When the catalog does not say whether
a commit landed, the files are kept and the next attempt first looks for that snapshot: found, the
commit is done (and reported as done, so post-commit steps still run); not found, it prepares again.

A catalog that cannot be reached (connection refused or lost, server unavailable: see
:func:`catalog_unreachable`) is retried within the same budget. A commit request that failed that way
may have been applied by the catalog before the connection dropped, so it counts as an attempt whose
outcome is unknown, never as a failed one. When the budget runs out the loop raises
``CatalogUnavailableError``; conflicts and refused requests keep their own errors.

An attempt whose table lost files to snapshot expiry meanwhile (its head was replaced, then expired)
is prepared again on the table as it is now.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import attrs
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ServiceUnavailableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink import _faults
from iceberg_sink._iceberg.files import delete_quietly
from iceberg_sink._iceberg.producer import PreparedCommit, commit_prepared
from iceberg_sink.errors import CatalogUnavailableError, CommitRetriesExhaustedError, CommitStateUnknownError

logger = logging.getLogger(__name__)


def catalog_unreachable(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) says the catalog could not be reached.

    Connection refused, reset or timed out (sockets, HTTP clients), a SQL driver's lost or refused
    connection (SQLAlchemy ``OperationalError``/``InterfaceError``/``DisconnectionError``, pool
    timeouts; SQLite's "database is locked" is one too), and HTTP 503. Not: a commit conflict, a
    request the catalog refused (bad input, missing table), or any other error.
    """
    import requests
    import sqlalchemy.exc

    unreachable = (
        ConnectionError,  # the builtin: refused, reset, aborted, broken pipe
        TimeoutError,
        ServiceUnavailableError,
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        sqlalchemy.exc.OperationalError,
        sqlalchemy.exc.InterfaceError,
        sqlalchemy.exc.DisconnectionError,
        sqlalchemy.exc.TimeoutError,
    )
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (CommitFailedException, CommitStateUnknownException)):
            return False
        if isinstance(current, unreachable):
            return True
        current = current.__cause__
    return False


@attrs.frozen
class RetryPolicy:
    """Backoff for optimistic-concurrency conflicts (Iceberg's commit.retry.* properties)."""

    num_retries: int = 4
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    def wait_ms(self, attempt: int) -> float:
        base = min(self.max_wait_ms, self.min_wait_ms * (2 ** max(0, attempt - 1)))
        return float(base) * (0.5 + random.random() / 2)


@attrs.frozen
class CommitAttempts:
    """How a retried commit ended.

    Attributes:
        table: the table after the last attempt (as committed, or as last loaded).
        snapshot: the committed snapshot; None when ``prepare`` said there was nothing to commit.
        attempts: commit attempts sent to the catalog.
        state_was_unknown: an attempt's outcome was unknown (its snapshot may be the one returned).
    """

    table: Table
    snapshot: Snapshot | None
    attempts: int
    state_was_unknown: bool = False


Prepare = Callable[[Table], PreparedCommit | None]


def commit_with_retry(
    what: str,
    load_table: Callable[[], Table],
    prepare: Prepare,
    policy: RetryPolicy,
    table: Table | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_give_up: str = "",
    checkpoint_id: int | None = None,
    on_conflict: Callable[[], None] | None = None,
) -> CommitAttempts:
    """Prepare and commit until it lands, ``prepare`` returns None, or the policy gives up.

    Args:
        what: names the commit in errors and logs ("checkpoint 7 of job ...").
        load_table: loads the table from the catalog (called before every attempt but the first
            when ``table`` is given).
        prepare: builds the snapshot on the given table; None means nothing is left to commit
            (for example the checkpoint is already in the table).
        policy: backoff and limits.
        table: a table just loaded, used for the first attempt.
        sleep: how to wait between attempts (tests pass a fake clock).
        on_give_up: what happens to the work when the retries run out, appended to the error.
        checkpoint_id: the checkpoint this commit holds, if any (passed to the fault points
            :data:`~iceberg_sink._faults.BEFORE_COMMIT_SEND` and :data:`~iceberg_sink._faults.COMMIT_SENT`).
        on_conflict: called once for every attempt that lost a race with another writer.

    Raises:
        CommitRetriesExhaustedError: every attempt lost a race; nothing was committed.
        CommitStateUnknownError: the last attempt's outcome is unknown; its files are kept.
        CatalogUnavailableError: the catalog stayed unreachable (:func:`catalog_unreachable`); when
            an attempt's outcome is unknown its files are kept.
    """
    deadline = time.monotonic() + policy.total_timeout_ms / 1000
    attempt = 0
    unknown: list[PreparedCommit] = []
    loads = 0
    stale_reloads = 0
    while True:
        if table is None or attempt > 0 or loads > 0:
            loads += 1
            try:
                table = load_table()
            except Exception as e:
                if not catalog_unreachable(e):
                    raise
                if loads > policy.num_retries or time.monotonic() > deadline:
                    state = " (an earlier attempt's outcome is unknown)" if unknown else ""
                    raise CatalogUnavailableError(
                        f"{what}: the catalog is unreachable{state} ({_describe(e)}){on_give_up}"
                    ) from e
                logger.warning("%s: the catalog is unreachable (load %s): %s", what, loads, _describe(e))
                sleep(policy.wait_ms(loads) / 1000)
                continue
        for earlier in unknown:
            landed = table.metadata.snapshot_by_id(earlier.snapshot.snapshot_id)
            if landed is not None:
                logger.info("%s: the attempt whose outcome was unknown had landed", what)
                return CommitAttempts(table, landed, attempt, state_was_unknown=True)
        try:
            prepared = prepare(table)
        except FileNotFoundError:
            # A file of the table as loaded is gone: snapshot expiry removed the old head's manifests
            # after another writer moved the head. The table as the catalog has it now does not need
            # them; prepare again on it. A file missing from the current table is an error.
            current = load_table()
            if current.metadata_location == table.metadata_location or stale_reloads >= policy.num_retries:
                raise
            stale_reloads += 1
            logger.info("%s: a file of the table as loaded was removed meanwhile; preparing on the table now", what)
            table = current
            continue
        if prepared is None:
            return CommitAttempts(table, None, attempt, state_was_unknown=bool(unknown))
        attempt += 1
        exhausted = attempt > policy.num_retries or time.monotonic() > deadline
        if checkpoint_id is not None:
            _faults.hit(_faults.BEFORE_COMMIT_SEND, checkpoint_id)
        try:
            # Sent with the metadata it was prepared on (prepare may have moved on to a newer table).
            committed = commit_prepared(prepared.table, prepared)
        except CommitFailedException as e:
            delete_quietly(table.io, prepared.written_files)
            if on_conflict is not None:
                on_conflict()
            if exhausted:
                raise CommitRetriesExhaustedError(
                    f"{what}: {attempt} commit attempts lost to concurrent writers ({e}){on_give_up}"
                ) from e
            logger.info("%s: commit conflict (attempt %s): %s", what, attempt, e)
        except Exception as e:
            # A lost connection may have been lost after the catalog applied the commit: its
            # outcome is unknown. Keep the files (the snapshot may reference them); the next
            # attempt looks for it.
            if not isinstance(e, CommitStateUnknownException) and not catalog_unreachable(e):
                raise
            unknown.append(prepared)
            if exhausted:
                raise CommitStateUnknownError(
                    f"{what}: the catalog did not say whether the commit landed ({_describe(e)}){on_give_up}"
                ) from e
            logger.warning("%s: commit state unknown (attempt %s): %s", what, attempt, _describe(e))
        else:
            if checkpoint_id is not None:
                # The catalog holds the snapshot; a driver dying here never learns that it does.
                _faults.hit(_faults.COMMIT_SENT, checkpoint_id)
            snapshot = committed.metadata.snapshot_by_id(prepared.snapshot.snapshot_id)
            return CommitAttempts(committed, snapshot, attempt, state_was_unknown=bool(unknown))
        sleep(policy.wait_ms(attempt) / 1000)


def _describe(error: BaseException) -> str:
    """One line naming the error (SQL drivers' messages span lines and quote the statement)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
