"""Several tables' commits that land in one catalog transaction, or not at all.

A :class:`CommitGroup` has members, one per table of a checkpoint, each committing on its own
thread through its own retry loop (``retry.CommitAttempt``) exactly as a table commits alone:
loading, preparing, looking for an attempt of unknown outcome, backing off. Where a lone attempt
sends its prepared snapshot to the catalog, a member's attempt hands it to the group
(:func:`joined`) and waits. Once every member still in the group has handed one over, the last to
arrive sends them all in one database transaction (``commit.commit_prepared_together``), and each
member gets its own answer:

- its table as committed (every table's snapshot landed);
- a lost race (``CommitFailedException``; one table's head moved): nothing landed, and every member
  loads and prepares again on its table as it is now, then hands over again;
- the database's error (a lost connection, SQLite's "database is locked"): each member's outcome is
  unknown (``CommitStateUnknownException``), as a lone commit's would be, and its next attempt first
  looks for its snapshot; the snapshots landed together or not at all, so every member finds the same.

A member leaves when its commit returns: finished (committed, already in the table, nothing to
commit) or not (an error, or the checkpoint kept pending). A member that leaves unfinished breaks
the group: every later hand-over fails with ``AtomicCommitAbortedError``, so no table commits the
checkpoint without the others. A group whose members all finished committed its tables together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import attrs
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table

from iceberg_sink._iceberg.commit import commit_prepared_together
from iceberg_sink._iceberg.producer import PreparedCommit
from iceberg_sink._iceberg.retry import catalog_unreachable
from iceberg_sink.errors import AtomicCommitAbortedError, one_line

#: How a prepared snapshot is sent: the catalog's own commit, or a hand-over to a group.
Send = Callable[[Table, PreparedCommit], Table]

_joined: ContextVar[tuple[CommitGroup, str] | None] = ContextVar("iceberg_sink_commit_group", default=None)


def joined() -> Send | None:
    """The hand-over of the group this thread's commit is a member of (:meth:`CommitGroup.member`), or None."""
    found = _joined.get()
    if found is None:
        return None
    group, name = found
    return lambda table, prepared: group.send(name, table, prepared)


@attrs.define
class Membership:
    """One member's part: it says :meth:`finished` when its commit returned with its checkpoint in the table."""

    done: bool = False

    def finished(self) -> None:
        self.done = True


class CommitGroup:
    """The commits of several tables that land in one catalog transaction (module docstring).

    Args:
        members: one name per table (each member's commit runs :meth:`member` with its name).
        what: names the group in errors ("checkpoint 7 of job ...").
    """

    def __init__(self, members: Iterable[str], what: str) -> None:
        self.what = what
        self._cond = threading.Condition()
        self._active = set(members)
        self._handed: dict[str, tuple[Table, PreparedCommit]] = {}
        self._answers: dict[str, Table | BaseException] = {}
        self._broken: str | None = None

    @contextmanager
    def member(self, name: str) -> Iterator[Membership]:
        """Run one member's commit inside: its snapshots are handed to the group (:func:`joined`).
        Leaving without :meth:`Membership.finished` (an error, a checkpoint kept pending) breaks the group."""
        token = _joined.set((self, name))
        membership = Membership()
        try:
            yield membership
        except BaseException as e:
            self._leave(name, f"table {name} failed ({one_line(e)})")
            raise
        else:
            self._leave(name, None if membership.done else f"table {name} did not commit it (kept pending)")
        finally:
            _joined.reset(token)

    def send(self, name: str, table: Table, prepared: PreparedCommit) -> Table:
        """Hand ``prepared`` (of ``table``) over and wait for the group's transaction; returns the
        table as committed, or raises as the module docstring says."""
        with self._cond:
            if name not in self._active:
                raise RuntimeError(f"{self.what}: {name} is not a member of the group")
            self._handed[name] = (table, prepared)
            self._maybe_send()
            while name not in self._answers:
                self._cond.wait()
            answer = self._answers.pop(name)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _leave(self, name: str, broken: str | None) -> None:
        with self._cond:
            self._active.discard(name)
            self._handed.pop(name, None)
            if broken is not None and self._broken is None:
                self._broken = broken
            self._maybe_send()

    def _aborted(self) -> AtomicCommitAbortedError:
        return AtomicCommitAbortedError(
            f"{self.what}: not committed, because {self._broken}; the tables of a checkpoint commit together "
            "or not at all, so its committable stays stored until they all can"
        )

    def _maybe_send(self) -> None:
        """Send the handed snapshots when every active member has handed one over (holding the lock)."""
        if not self._handed:
            return
        names = sorted(self._handed)
        if self._broken is not None:
            for name in names:
                self._answers[name] = self._aborted()
        elif set(names) == self._active:
            self._answers.update(self._transaction(names, [self._handed[n] for n in names]))
        else:
            return
        self._handed.clear()
        self._cond.notify_all()

    def _transaction(
        self, names: list[str], commits: list[tuple[Table, PreparedCommit]]
    ) -> dict[str, Table | BaseException]:
        tables = ", ".join(names)
        try:
            committed = commit_prepared_together(commits)
        except CommitFailedException as e:
            return {
                name: CommitFailedException(f"{self.what}: the transaction of tables {tables} lost a race: {e}")
                for name in names
            }
        except Exception as e:
            answers: dict[str, Table | BaseException] = {}
            for n, name in enumerate(names):
                if isinstance(e, CommitStateUnknownException) or catalog_unreachable(e):
                    # Every member's outcome is unknown; each gets an error of its own, raised from the cause.
                    error: BaseException = CommitStateUnknownException(
                        f"{self.what}: the transaction of tables {tables} did not answer: {one_line(e)}"
                    )
                elif n == 0:
                    error = e  # refused: the first member raises the cause itself, the others are aborted
                else:
                    error = AtomicCommitAbortedError(
                        f"{self.what}: not committed, because the transaction of tables {tables} failed ({one_line(e)})"
                    )
                if error is not e:
                    error.__cause__ = e
                answers[name] = error
            return answers
        return dict(zip(names, committed, strict=True))
