"""A stream's commit lane: checkpoint N's commit runs while the next micro-batch is read and written.

SinkV2's committer commits checkpoint N while its writers write N+1; a micro-batch of Spark is one
call, so the sink gets that shape by handing N's commit to one thread of the job's and returning
from the micro-batch once N's committable is durable (job/pending.py ``hand``). Only the commit
itself runs on the lane: the committer's idempotent snapshot commit and the removal of the
committable. What follows a commit (metrics, the progress entry, post-commit hooks, compaction and
conversion triggers) runs where the lane is drained, on the micro-batch's own thread or the idle
retry's, so hooks still run one at a time, in commit order, with the session's settings.

The lane holds at most one checkpoint. Whoever commits next drains it first (waits for its commit
and takes its result or error): the next micro-batch before its own commit, the idle retry, a
commit of pending checkpoints. Commit order and exactly once are therefore unchanged: a checkpoint
on the lane is also a stored committable, which a restart after a crash commits first, as it
commits any checkpoint left pending (pipeline.py's exactly-once argument).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from iceberg_sink import options

_T = TypeVar("_T")


def overlaps(backlog: Callable[[], bool] | None, format_version: int, resolved: options.ResolvedOptions) -> bool:
    """Whether a one-table stream's checkpoint is committed on the lane (``iceberg-sink.commit.overlap``):
    the stream allows it (``backlog`` given: not once or availableNow, the idle retry on), the table
    is format v3 (``format_version``), and ``backlog()`` says the source had more records waiting when the micro-batch
    was planned, so the next micro-batch follows at once and drains the lane.

    v3 only: its commit resolves the checkpoint's deleted keys to deletion vectors and takes about
    a third of a micro-batch (docs/benchmarks-cdc.md); a v2 commit takes about 12 ms, and a
    checkpoint planned beside a commit makes its new-key proof on a table without that commit, so
    its conditional deletes are committed, which on v2 are equality delete files readers apply."""
    return backlog is not None and format_version >= 3 and resolved.get(options.COMMIT_OVERLAP) == "auto" and backlog()


class CommitLane(Generic[_T]):
    """One thread committing one checkpoint at a time, for one job (module docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[_T] | None = None
        self.checkpoint_id: int | None = None

    def hand(self, checkpoint_id: int, commit: Callable[[], _T]) -> None:
        """Run ``commit`` (checkpoint ``checkpoint_id``'s) on the lane; the lane must be drained."""
        with self._lock:
            if self._future is not None:
                raise RuntimeError(f"{self._name}: checkpoint {self.checkpoint_id} is still on the commit lane")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="iceberg-sink-commit")
            self.checkpoint_id = checkpoint_id
            self._future = self._executor.submit(commit)

    def holds(self) -> bool:
        """Whether a checkpoint was handed and not drained yet (its commit may have ended)."""
        return self._future is not None

    def running(self) -> bool:
        """Whether the lane's commit is still running."""
        future = self._future
        return future is not None and not future.done()

    def drain(self) -> tuple[int, Future[_T]] | None:
        """Wait for the handed commit to end; its checkpoint and finished future (None: the lane
        was empty). The lane is empty afterwards, whatever the commit's result."""
        with self._lock:
            future, checkpoint_id = self._future, self.checkpoint_id
        if future is None or checkpoint_id is None:
            return None
        try:
            future.exception()  # waits; the caller takes the result or the error
        finally:
            with self._lock:
                if self._future is future:
                    self._future, self.checkpoint_id = None, None
        return checkpoint_id, future
