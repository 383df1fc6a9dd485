"""One way for post-commit jobs (compaction, equality-delete conversion) to run after a commit.

A job runs inline or on a driver thread (``background``). At most one run of a kind per table runs
at a time in this process: a trigger that fires while one runs is kept for the next commit. A
failure is logged and counted by the job's ``on_failure``; it never fails the stream.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections import defaultdict
from typing import Any

logger = logging.getLogger(__name__)

_RUNNING: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_REGISTRY_LOCK = threading.Lock()


def _lock(kind: str, table_key: str) -> threading.Lock:
    with _REGISTRY_LOCK:
        return _RUNNING[(kind, table_key)]


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
        lock = _lock(self.kind, self._table_key)
        if not lock.acquire(blocking=False):
            logger.info("%s of %s already running; trigger kept for the next commit", self.kind, self._table_key)
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
            lock.release()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a background run to finish (tests, shutdown)."""
        if self._thread is not None:
            self._thread.join(timeout)
