"""The one retry loop for every commit the sink makes (checkpoints, compaction, conversion, manifest
rewrites): :class:`CommitAttempt`.

Each attempt starts from the table as the catalog has it now and prepares its snapshot again (the
branch head, the sequence number and what is still valid may all have changed). Lost races are
retried with backoff (Iceberg's ``commit.retry.*`` properties). When the catalog does not say whether
a commit landed, the files are kept and the next attempt first looks for that snapshot: found, the
commit is done (and reported as done, so post-commit steps still run); not found, it prepares again.

A catalog that cannot be reached (connection refused or lost, server unavailable: see
:func:`catalog_unreachable`) is retried within the same budget. A commit request that failed that way
may have been applied by the catalog before the connection dropped, so it counts as an attempt whose
outcome is unknown, never as a failed one. When the budget runs out the loop raises
``CatalogUnavailableError``; conflicts and refused requests keep their own errors. A SQLite catalog
whose file another process keeps locked (an Iceberg Java ``JdbcCatalog`` session holds its lock while
it runs) fails every attempt with "database is locked": from the third such attempt of a commit the
cause is logged as a warning, and the error the loop ends in names it and what to do.

Once an attempt's outcome is unknown, every later failure of the same commit is unknown too
(``CommitStateUnknownError``), and files written for it are deleted only when a table loaded since
proves that no snapshot lists them (:meth:`CommitAttempt.discard`): every committer deletes its
written files through that one method.

An attempt whose table lost files to snapshot expiry meanwhile (its head was replaced, then expired)
is prepared again on the table as it is now.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable

import attrs
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ServiceUnavailableError
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink import _faults
from iceberg_sink._iceberg.avro_read import fetch_entries
from iceberg_sink._iceberg.files import delete_quietly
from iceberg_sink._iceberg.producer import PreparedCommit, commit_prepared
from iceberg_sink.errors import (
    SQLITE_CATALOG_ADVICE,
    SQLITE_CATALOG_LOCKED,
    CatalogUnavailableError,
    CommitRetriesExhaustedError,
    CommitStateUnknownError,
    one_line,
    sqlite_catalog_locked,
)

logger = logging.getLogger(__name__)

#: Attempts (loads and commits) of one commit that SQLite's "database is locked" failed, after which
#: the cause is logged as a warning of its own: a lock held that long is another process's session.
LOCKED_ATTEMPTS_BEFORE_WARNING = 3


def moved_on(table: Table, load_table: Callable[[], Table]) -> Table | None:
    """After a read of ``table`` (as some step loaded it) failed with FileNotFoundError: the table as
    the catalog has it now when its head moved since (another writer committed and a snapshot expiry
    removed the old head's files, so read that instead), or None when it did not (the file is missing
    from the current table: an error, never skipped). The one rule for every read of a loaded table:
    commits here, the TOAST lookup of stored values (topology/toast.py)."""
    current = load_table()
    return None if current.metadata_location == table.metadata_location else current


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


class CommitAttempt:
    """One commit the sink makes (a checkpoint, a compaction, a conversion, a manifest rewrite),
    through all its attempts: the retry loop, and the one rule for deleting what was written for it.

    Once an attempt's outcome is unknown (the catalog did not answer, or lost the connection after
    the request was sent), the snapshot it sent may be in the table, and so may every file written
    for the commit (new data files, position deletes, manifests) :

    - every later failure of the commit is unknown too: :meth:`run` then ends in
      ``CommitStateUnknownError`` (chained from the cause: the catalog still unreachable, the
      retries exhausted, a refused request), never in an error that reads as "nothing committed";
    - :meth:`discard` deletes files written for the commit only when no attempt's outcome is
      unknown, or when a table loaded after those attempts proves none of the files is in it
      (:func:`absent_from`). A table that cannot be loaded proves nothing: the files stay (an
      orphan at worst, which remove-orphans deletes; never a snapshot naming deleted files).

    Args:
        what: names the commit in errors and logs ("checkpoint 7 of job ...").
        load_table: loads the table from the catalog.
        policy: backoff and limits.
        sleep: how to wait between attempts (tests pass a fake clock).
        on_give_up: what happens to the work when the retries run out, appended to the error.
        checkpoint_id: the checkpoint this commit holds, if any (passed to the fault points
            :data:`~iceberg_sink._faults.BEFORE_COMMIT_SEND` and :data:`~iceberg_sink._faults.COMMIT_SENT`).
        on_conflict: called once for every attempt that lost a race with another writer.
        send: sends a prepared snapshot (default: to the table's catalog, ``commit_prepared``; a
            member of an atomic commit hands it to its group, ``_iceberg/together.py``).
    """

    def __init__(
        self,
        what: str,
        load_table: Callable[[], Table],
        policy: RetryPolicy,
        sleep: Callable[[float], None] = time.sleep,
        on_give_up: str = "",
        checkpoint_id: int | None = None,
        on_conflict: Callable[[], None] | None = None,
        send: Callable[[Table, PreparedCommit], Table] | None = None,
    ) -> None:
        self.what = what
        self._send = send or commit_prepared
        self._load_table = load_table
        self._policy = policy
        self._sleep = sleep
        self._on_give_up = on_give_up
        self._checkpoint_id = checkpoint_id
        self._on_conflict = on_conflict
        self._unknown: list[PreparedCommit] = []
        self._locked = 0  # attempts that failed on a SQLite catalog file another process held locked

    @property
    def outcome_unknown(self) -> bool:
        """Whether an attempt's outcome is unknown (its snapshot may be in the table)."""
        return bool(self._unknown)

    def discard(self, io: FileIO, paths: Iterable[str], table: Table | None = None) -> bool:
        """Delete ``paths`` (files written for this commit) unless the table may hold them.

        With no attempt of unknown outcome they are deleted. Otherwise ``table`` (a table loaded
        after those attempts), or the table loaded now, must prove that none of them is in it;
        without that proof (the table does not load, or a snapshot lists one of them) they are
        kept. Returns whether they were deleted.
        """
        paths = list(paths)
        if not paths:
            return True
        if self._unknown:
            try:
                current = table if table is not None else self._load_table()
            except Exception as e:
                logger.warning(
                    "%s: keeping %s files written for it: an attempt's outcome is unknown and the table cannot "
                    "be read to tell (%s); remove-orphans deletes them if the commit did not land",
                    self.what,
                    len(paths),
                    one_line(e),
                )
                return False
            if not absent_from(current, self._unknown, paths):
                logger.warning(
                    "%s: keeping %s files written for it: the table may hold them (an attempt whose outcome "
                    "was unknown landed)",
                    self.what,
                    len(paths),
                )
                return False
        delete_quietly(io, paths)
        return True

    def unknown_error(self, error: BaseException) -> CommitStateUnknownError:
        """What a failure after an attempt of unknown outcome is: unknown too."""
        if isinstance(error, CommitStateUnknownError):
            return error
        return CommitStateUnknownError(
            f"{self.what}: an earlier attempt's outcome is unknown (it may have landed), then the commit failed "
            f"({one_line(error)}){self._locked_cause(error)}; files written for it are kept, and a table read "
            f"once the catalog answers says whether it landed{self._on_give_up}"
        )

    def _count_locked(self, error: BaseException) -> None:
        """Count an attempt that SQLite's "database is locked" failed; the third one logs the cause."""
        if not sqlite_catalog_locked(error):
            return
        self._locked += 1
        if self._locked == LOCKED_ATTEMPTS_BEFORE_WARNING:
            logger.warning(
                "%s: %s attempts failed because %s; %s",
                self.what,
                self._locked,
                SQLITE_CATALOG_LOCKED,
                SQLITE_CATALOG_ADVICE,
            )

    def _locked_cause(self, error: BaseException) -> str:
        """The cause and the advice, for an error that SQLite's "database is locked" ends in (else "")."""
        if not sqlite_catalog_locked(error):
            return ""
        return f"; {SQLITE_CATALOG_LOCKED}. {SQLITE_CATALOG_ADVICE}"

    def run(self, prepare: Prepare, table: Table | None = None) -> CommitAttempts:
        """Prepare and commit until it lands, ``prepare`` returns None, or the policy gives up.

        Args:
            prepare: builds the snapshot on the given table; None means nothing is left to commit
                (for example the checkpoint is already in the table). Its errors pass unchanged.
            table: a table just loaded, used for the first attempt (else the table is loaded).

        Raises:
            CommitRetriesExhaustedError: every attempt lost a race; nothing was committed.
            CatalogUnavailableError: the catalog stayed unreachable (:func:`catalog_unreachable`)
                and no attempt's outcome is unknown: nothing was committed.
            CommitStateUnknownError: an attempt's outcome is unknown and the commit then failed,
                however it failed; its files are kept.
        """
        try:
            return self._run(prepare, table)
        except _PrepareError as e:
            raise e.error from e.error.__cause__
        except CommitStateUnknownError:
            raise
        except Exception as e:
            if self._unknown:
                raise self.unknown_error(e) from e
            raise

    def _prepare(self, prepare: Prepare, table: Table) -> PreparedCommit | None:
        try:
            return prepare(table)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise _PrepareError(e) from e

    def _run(self, prepare: Prepare, table: Table | None) -> CommitAttempts:
        what, policy, load_table, on_give_up = self.what, self._policy, self._load_table, self._on_give_up
        deadline = time.monotonic() + policy.total_timeout_ms / 1000
        attempt = 0
        unknown = self._unknown
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
                    self._count_locked(e)
                    if loads > policy.num_retries or time.monotonic() > deadline:
                        raise CatalogUnavailableError(
                            f"{what}: the catalog is unreachable ({one_line(e)}){self._locked_cause(e)}{on_give_up}"
                        ) from e
                    logger.warning("%s: the catalog is unreachable (load %s): %s", what, loads, one_line(e))
                    self._sleep(policy.wait_ms(loads) / 1000)
                    continue
            for earlier in unknown:
                landed = table.metadata.snapshot_by_id(earlier.snapshot.snapshot_id)
                if landed is not None:
                    logger.info("%s: the attempt whose outcome was unknown had landed", what)
                    return CommitAttempts(table, landed, attempt, state_was_unknown=True)
            if self._checkpoint_id is not None:
                _faults.hit(_faults.BEFORE_COMMIT_PREPARE, self._checkpoint_id)
            try:
                prepared = self._prepare(prepare, table)
            except FileNotFoundError:
                # A file of the table as loaded is gone: snapshot expiry removed the old head's manifests
                # after another writer moved the head. The table as the catalog has it now does not need
                # them; prepare again on it. A file missing from the current table is an error.
                current = moved_on(table, load_table)
                if current is None or stale_reloads >= policy.num_retries:
                    raise
                stale_reloads += 1
                logger.info("%s: a file of the table as loaded was removed meanwhile; preparing on the table now", what)
                table = current
                continue
            if prepared is None:
                return CommitAttempts(table, None, attempt, state_was_unknown=bool(unknown))
            attempt += 1
            exhausted = attempt > policy.num_retries or time.monotonic() > deadline
            if self._checkpoint_id is not None:
                _faults.hit(_faults.BEFORE_COMMIT_SEND, self._checkpoint_id)
            try:
                # Sent with the metadata it was prepared on (prepare may have moved on to a newer table).
                committed = self._send(prepared.table, prepared)
                if self._checkpoint_id is None:
                    _faults.hit(_faults.MAINTENANCE_COMMIT_SENT, -1)
            except CommitFailedException as e:
                # This attempt certainly did not land: its own manifests go (never the files it
                # shares with other attempts, which discard() decides on).
                delete_quietly(table.io, prepared.written_files)
                if self._on_conflict is not None:
                    self._on_conflict()
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
                self._count_locked(e)
                if exhausted:
                    raise CommitStateUnknownError(
                        f"{what}: the catalog did not say whether the commit landed ({one_line(e)})"
                        f"{self._locked_cause(e)}{on_give_up}"
                    ) from e
                logger.warning("%s: commit state unknown (attempt %s): %s", what, attempt, one_line(e))
            else:
                if self._checkpoint_id is not None:
                    # The catalog holds the snapshot; a driver dying here never learns that it does.
                    _faults.hit(_faults.COMMIT_SENT, self._checkpoint_id)
                snapshot = committed.metadata.snapshot_by_id(prepared.snapshot.snapshot_id)
                return CommitAttempts(committed, snapshot, attempt, state_was_unknown=bool(unknown))
            self._sleep(policy.wait_ms(attempt) / 1000)


class _PrepareError(Exception):
    """Carries an error of the caller's ``prepare`` through :meth:`CommitAttempt.run` unchanged."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def absent_from(table: Table, attempts: Iterable[PreparedCommit], paths: Iterable[str]) -> bool:
    """Whether ``table`` proves that no snapshot lists any of ``paths`` (files written for
    ``attempts``: manifest lists, manifests, data and delete files).

    An attempt that landed may since have been expired (another writer committed on top, then an
    expiry of fresh snapshots removed it) while its files live on in later snapshots, so the proof
    is on the files: no snapshot committed at or after the attempts' sequence number lists any of
    them (a manifest listing them was written by such a snapshot: older ones cannot).
    """
    wanted = set(paths)
    oldest = min((a.snapshot.sequence_number or 0 for a in attempts), default=0)
    seen: set[str] = set()
    for snapshot in table.metadata.snapshots:
        if (snapshot.sequence_number or 0) < oldest:
            continue
        if snapshot.manifest_list in wanted:
            return False
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen or (manifest.sequence_number or 0) < oldest:
                continue
            seen.add(manifest.manifest_path)
            if manifest.manifest_path in wanted:
                return False
            for entry in fetch_entries(table.io, manifest, discard_deleted=False):
                if entry.data_file.file_path in wanted:
                    return False
    return True


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
    """:meth:`CommitAttempt.run` of a commit that deletes nothing itself on failure (see
    :class:`CommitAttempt` for the arguments and errors)."""
    return CommitAttempt(what, load_table, policy, sleep, on_give_up, checkpoint_id, on_conflict).run(prepare, table)
