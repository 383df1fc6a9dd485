"""Idle streams: commit checkpoints left pending without waiting for new data.

A stream keeps a micro-batch's committable pending while the catalog is unreachable (or after other
writers won every attempt of its commit: job/pending.py ``defers``) and commits it,
in order, at the start of the next micro-batch (pipeline.py). A stream whose source then goes quiet
would keep its last checkpoints invisible until data arrives again; so while a query runs, one
daemon thread tries every ``iceberg-sink.commit.pending-retry-interval-ms`` (default 30 s; 0: never)
to commit them, between micro-batches only: it shares a lock with the query's batch function and
skips its turn while a micro-batch runs. It commits exactly as the next micro-batch would
(``commit_pending``: oldest first, one snapshot each, idempotently), so the two cannot disagree. A
catalog still unreachable (or races lost again) leaves them pending; any other error is logged and left for the next
micro-batch, which raises it as the stream's error. The thread ends with the query.

A stopped query's thread may be in the middle of a commit when a new query starts on the same
checkpoint location in the same driver. Two committers of one job must not interleave (one would
read staged files the other just committed and removed), so the lock is one per checkpoint location
in the driver (:func:`batch_lock`), the thread checks that its query is still active once it holds
it, and starting a query joins the thread of the stopped one first (:func:`end_stopped`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from iceberg_sink.committer.store import checkpoint_key
from iceberg_sink.errors import pending_because
from iceberg_sink.job.pending import CommitDeferred

logger = logging.getLogger("iceberg_sink")

# Per driver: the lock and the idle-retry thread of each checkpoint location (see the module docstring).
_registry_lock = threading.Lock()
_locks: dict[str, threading.Lock] = {}
_threads: dict[str, tuple[Any, threading.Event, threading.Thread]] = {}


def batch_lock(checkpoint_location: str) -> threading.Lock:
    """The one lock of a checkpoint location in this driver, held by its queries' micro-batches and
    their idle-retry threads: one job's commits never interleave, whichever query makes them."""
    key = checkpoint_key(checkpoint_location)
    with _registry_lock:
        return _locks.setdefault(key, threading.Lock())


def end_stopped(checkpoint_location: str, timeout_s: float | None = None) -> None:
    """Stop and join the idle-retry thread of a query on ``checkpoint_location`` that is no longer
    active (a commit it is making finishes first). Called before a query starts there."""
    with _registry_lock:
        entry = _threads.get(checkpoint_key(checkpoint_location))
    if entry is None:
        return
    query, stopped, thread = entry
    if _active(query):
        return  # Spark refuses a second active query on one checkpoint location anyway
    stopped.set()
    thread.join(timeout_s)
    with _registry_lock:
        if _threads.get(checkpoint_key(checkpoint_location)) is entry:
            del _threads[checkpoint_key(checkpoint_location)]


def _active(query: Any) -> bool:
    try:
        return bool(query.isActive)
    except Exception:  # the SparkSession is gone
        return False


def retry_while_idle(
    query: Any,
    batch_lock: threading.Lock,
    has_pending: Callable[[], bool],
    commit_pending: Callable[[], object],
    interval_s: float,
    what: str,
    checkpoint_location: str | None = None,
    finish: Callable[[], object] | None = None,
) -> threading.Thread:
    """Start the thread that commits pending checkpoints of ``query``'s sink between micro-batches
    (registered under ``checkpoint_location`` for :func:`end_stopped`); when it ends (the query
    stopped), ``finish()`` takes what the commit lane still holds (job/lane.py)."""
    stopped = threading.Event()

    def loop() -> None:
        try:
            retry()
        finally:
            if finish is not None:
                with batch_lock:
                    try:
                        finish()
                    except Exception:
                        logger.exception("%s: the last commit of the stopped query failed", what)

    def retry() -> None:
        while not stopped.wait(interval_s):
            if not _active(query):
                return
            if not batch_lock.acquire(blocking=False):
                continue  # a micro-batch runs: it commits what is pending itself
            try:
                if stopped.is_set() or not _active(query):
                    return  # stopped while waiting: a new query may own the checkpoint location now
                if has_pending():
                    logger.info("%s: committing pending checkpoints while the stream is idle", what)
                    commit_pending()
            except CommitDeferred as e:
                logger.info("%s: pending checkpoints stay pending (%s): %s", what, pending_because(e.error), e)
            except Exception:
                logger.exception("%s: pending checkpoints could not be committed; the next micro-batch retries", what)
            finally:
                batch_lock.release()

    thread = threading.Thread(target=loop, name="iceberg-sink-pending-retry", daemon=True)
    thread.start()
    if checkpoint_location is not None:
        with _registry_lock:
            _threads[checkpoint_key(checkpoint_location)] = (query, stopped, thread)
    return thread
