"""One way for post-commit jobs (compaction, equality-delete conversion) to run after a commit.

A job runs inline or on a driver thread (``background``). A failure is logged and counted by the
job's ``on_failure``; it never fails the stream.

**One maintenance lock per table.** At most one post-commit job of a table runs at a time in this
process, whatever its kind, as Flink's table maintenance runs its tasks under one lock per table: a
compaction and an equality-delete conversion that overlap on one table make the compaction drop its
groups (the conversion's new position deletes may name its input files; docs/benchmarks-soak.md),
so one waits for the other. A trigger that fires while the table's lock is held is kept for the next
commit (the trigger's counters are not reset). So that two kinds of job firing on every commit do not
starve one another, a kind turned away while *another* kind ran goes first at the next commit: the
other kind's trigger yields its turn once.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections import defaultdict
from typing import Any

from iceberg_sink import _faults

logger = logging.getLogger(__name__)

_LOCKS: dict[str, threading.Lock] = defaultdict(threading.Lock)
_HOLDER: dict[str, str] = {}  # table -> kind of the job holding its lock
_WAITING: dict[str, str] = {}  # table -> kind turned away while another kind held the lock
_REGISTRY_LOCK = threading.Lock()


def _acquire(kind: str, table_key: str) -> threading.Lock | None:
    """The table's maintenance lock, acquired for ``kind``; None when the job must wait its turn."""
    with _REGISTRY_LOCK:
        waiting = _WAITING.get(table_key)
        if waiting is not None and waiting != kind:
            del _WAITING[table_key]  # yield once: the waiting kind goes first
            logger.info("%s of %s yields its turn to a waiting %s", kind, table_key, waiting)
            return None
        lock = _LOCKS[table_key]
        if not lock.acquire(blocking=False):
            holder = _HOLDER.get(table_key)
            if holder is not None and holder != kind:
                _WAITING[table_key] = kind
            logger.info("%s of %s waits: %s is running; trigger kept for the next commit", kind, table_key, holder)
            return None
        _HOLDER[table_key] = kind
        if _WAITING.get(table_key) == kind:
            del _WAITING[table_key]
        return lock


def _release(table_key: str, lock: threading.Lock) -> None:
    with _REGISTRY_LOCK:
        _HOLDER.pop(table_key, None)
        lock.release()


class BackgroundJob(abc.ABC):
    """A post-commit job of one ``kind`` (``"compaction"``, ...) on one table."""

    kind: str

    def __init__(self, table_key: str, background: bool) -> None:
        self._table_key = table_key
        self._background = background
        self.last_result: Any = None
        self.last_error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @abc.abstractmethod
    def execute(self) -> Any:
        """Run the job once; returns its result."""

    @abc.abstractmethod
    def on_start(self) -> None:
        """Called when a run starts (count it, reset the trigger's counters)."""

    @abc.abstractmethod
    def on_success(self, result: Any) -> None:
        """Called with the result of a run that succeeded."""

    @abc.abstractmethod
    def on_failure(self, error: Exception) -> None:
        """Called with the error of a run that failed (after it is logged)."""

    def run(self) -> None:
        lock = _acquire(self.kind, self._table_key)
        if lock is None:
            return
        self.on_start()
        if self._background:
            self._thread = threading.Thread(
                target=self._run_locked, args=(lock,), name=f"iceberg-sink-{self.kind.replace(' ', '-')}", daemon=True
            )
            self._thread.start()
        else:
            self._run_locked(lock)

    def _run_locked(self, lock: threading.Lock) -> None:
        try:
            _faults.hit(_faults.MAINTENANCE_START, -1)
            result = self.execute()
        except Exception as e:
            self.last_error = e
            logger.exception("%s of %s failed; the stream goes on", self.kind, self._table_key)
            self.on_failure(e)
        else:
            self.last_result = result
            self.on_success(result)
            logger.info("%s of %s: %s", self.kind, self._table_key, result)
        finally:
            _release(self._table_key, lock)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a background run to finish (tests, shutdown)."""
        if self._thread is not None:
            self._thread.join(timeout)
