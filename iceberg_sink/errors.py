"""Errors raised by iceberg_sink.

Every error derives from :class:`IcebergSinkError` and from the nearest builtin, so callers can catch
either. The docstring of each says whether retrying can help.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator


def one_line(error: BaseException) -> str:
    """``error`` as one line for messages and logs: its type and the first line of its text (SQL
    drivers' messages span lines and quote the statement)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class IcebergSinkError(Exception):
    """Root of every error raised by iceberg_sink."""


class InvalidSinkConfigError(IcebergSinkError, ValueError):
    """A builder option is missing, unknown or out of range. Fatal: fix the configuration."""


class SchemaMismatchError(IcebergSinkError, ValueError):
    """The DataFrame does not fit the table. Fatal: nothing was written or committed.

    Attributes:
        mismatches: one human-readable line per problem found.
    """

    def __init__(self, table: str, mismatches: list[str]) -> None:
        self.mismatches = tuple(mismatches)
        lines = "\n".join(f"  - {m}" for m in mismatches)
        super().__init__(
            f"the DataFrame does not match the schema of table {table} "
            f"({len(mismatches)} problem{'s' if len(mismatches) != 1 else ''}):\n{lines}"
        )


class InvalidInputError(IcebergSinkError, ValueError):
    """A row of input cannot be written (for example a null where the table requires a value).

    Fatal for the checkpoint: nothing of it is committed; earlier checkpoints stay committed.
    """


class UnsupportedTableError(IcebergSinkError, ValueError):
    """The table uses a feature this sink cannot write (for example an unsupported format version)."""


class CorruptFileError(IcebergSinkError, ValueError):
    """A file the table references does not hold what its format says (for example a deletion
    vector whose checksum does not match its bytes). Fatal: retrying reads the same bytes; the file
    has to be restored or the snapshot that references it rolled back."""


class CheckpointRewoundError(IcebergSinkError, RuntimeError):
    """The stream restarted from a checkpoint older than what the table already holds.

    Fatal: replaying would either duplicate or silently drop rows. Restore the matching checkpoint
    location, or start a new one (a new checkpoint location is a new job).
    """


class CommitRetriesExhaustedError(IcebergSinkError, RuntimeError):
    """Every commit attempt lost the optimistic-concurrency race. Retryable: the committable is kept
    under the checkpoint location, and the next run or micro-batch commits it."""


class CommitStateUnknownError(IcebergSinkError, RuntimeError):
    """The catalog did not say whether a commit landed. Do not clean anything up: the next attempt
    checks the table's history and either finds the checkpoint committed or commits it."""


class CommitVetoedError(IcebergSinkError, RuntimeError):
    """A pre-commit hook refused the commit. The checkpoint stays pending and nothing is lost."""


class MaintenanceRefusedError(IcebergSinkError, RuntimeError):
    """A maintenance job stopped before deleting anything: it could not tell which files are
    referenced (for example, files listed under the table location match none of the table's
    references, a sign the listing and the metadata spell paths differently). Fatal for this run;
    nothing was deleted. Check the table's location and FileIO properties, then run it again."""


class UncommittableCheckpointError(IcebergSinkError, RuntimeError):
    """A stored checkpoint cannot be committed safely, for example because the table it was written
    for was dropped and re-created since. Fatal for that checkpoint: nothing of it was committed, and
    the message says what to do with it (its files belong to the table it was written for)."""


class CatalogUnavailableError(IcebergSinkError, RuntimeError):
    """The catalog could not be reached (connection refused or lost, server unavailable) for longer
    than the commit retry budget. Nothing was committed by the call that raised it, or its outcome is
    unknown and is resolved by reading the table once the catalog is back. A streaming sink keeps the
    checkpoint pending (see :class:`PendingCheckpointsLimitError`)."""


class AtomicCommitAbortedError(IcebergSinkError, RuntimeError):
    """A table's checkpoint was not committed because another table of the same atomic commit
    (job/together.py: the tables of one checkpoint, committed in one catalog transaction) failed or
    stays pending: the tables of a checkpoint land together or not at all. Nothing of the checkpoint
    was committed to this table; its committable stays stored, and the checkpoint is committed with
    the others once that table's commit can land (a stream keeps it pending meanwhile)."""


class AtomicCommitsUnavailableError(InvalidSinkConfigError):
    """``.atomic_commits("required")`` on a catalog that cannot commit several tables in one
    transaction (SQL catalogs can, and REST catalogs that serve ``transactions/commit``)."""


class PendingCheckpointsLimitError(IcebergSinkError, RuntimeError):
    """More checkpoints are pending than ``iceberg-sink.commit.max-pending-checkpoints`` allows,
    because the catalog stayed unreachable. Nothing is lost: every pending committable is kept under
    the checkpoint location, and a restart with the catalog reachable commits them in order."""


def pending_because(error: BaseException) -> str:
    """Why a stream keeps a checkpoint pending after ``error`` (job/pending.py ``defers``), for
    messages: races lost to other writers on every attempt, a SQLite catalog file another process
    holds locked (:func:`sqlite_catalog_locked`), or an unreachable catalog."""
    if isinstance(error, CommitRetriesExhaustedError):
        return "other writers won every commit attempt"
    if isinstance(error, AtomicCommitAbortedError):
        return "another table of the same checkpoint could not commit it"
    if sqlite_catalog_locked(error):
        return SQLITE_CATALOG_LOCKED
    return "the catalog is unreachable"


#: Why a commit to a SQLite catalog fails with SQLite's "database is locked" (SQLITE_BUSY).
SQLITE_CATALOG_LOCKED = (
    "another process holds the lock of the SQLite catalog file ('database is locked'), for example an "
    "Iceberg Java JdbcCatalog session, which keeps a read statement open and the file locked while it runs"
)
#: What to do about it, appended to the errors and warnings that name it.
SQLITE_CATALOG_ADVICE = (
    "SQLite lets one process write at a time: several writer processes need a PostgreSQL catalog (or a REST "
    "catalog), not SQLite (docs/troubleshooting.md#sqlite-catalog-locked)"
)


def raised_from(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every error it was raised from (``__cause__``, ``__context__``, a SQLAlchemy
    error's ``orig``), each once."""
    seen: set[int] = set()
    stack: list[BaseException] = [error]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend(
            e
            for e in (current.__cause__, current.__context__, getattr(current, "orig", None))
            if isinstance(e, BaseException)
        )


def sqlite_catalog_locked(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from (:func:`raised_from`), is SQLite's "database
    is locked": another connection, most likely another process, holds a lock on the catalog file for
    longer than SQLite's busy timeout."""
    return any(
        isinstance(e, sqlite3.OperationalError) and str(e).startswith("database is locked") for e in raised_from(error)
    )


class WriteFailedError(IcebergSinkError, RuntimeError):
    """A writer task failed on every attempt Spark gave it (for example a full or failing disk, or
    storage that refused the write). Nothing of the checkpoint was committed and the table is
    unchanged. Retryable once the cause is fixed: a restarted stream writes the checkpoint again."""


class WorkerEnvironmentError(IcebergSinkError, RuntimeError):
    """Spark's Python workers cannot run the sink: their interpreter lacks a module it needs (or
    cannot start). Fatal until the workers' environment is fixed; nothing was written."""
