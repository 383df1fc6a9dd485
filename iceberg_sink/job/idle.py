"""Idle streams: commit checkpoints a catalog outage left pending without waiting for new data.

A stream keeps a micro-batch's committable pending while the catalog is unreachable and commits it,
in order, at the start of the next micro-batch (pipeline.py). A stream whose source then goes quiet
would keep its last checkpoints invisible until data arrives again; so while a query runs, one
daemon thread tries every ``iceberg-sink.commit.pending-retry-interval-ms`` (default 30 s; 0: never)
to commit them, between micro-batches only: it shares a lock with the query's batch function and
skips its turn while a micro-batch runs. It commits exactly as the next micro-batch would
(``commit_pending``: oldest first, one snapshot each, idempotently), so the two cannot disagree. A
catalog still unreachable leaves them pending; any other error is logged and left for the next
micro-batch, which raises it as the stream's error. The thread ends with the query.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("iceberg_sink")


def retry_while_idle(
    query: Any,
    batch_lock: threading.Lock,
    has_pending: Callable[[], bool],
    commit_pending: Callable[[], object],
    interval_s: float,
    what: str,
) -> threading.Thread:
    """Start the thread that commits pending checkpoints of ``query``'s sink between micro-batches."""
    from iceberg_sink.job.pipeline import CatalogOutage

    stopped = threading.Event()

    def active() -> bool:
        try:
            return bool(query.isActive)
        except Exception:  # the SparkSession is gone
            return False

    def loop() -> None:
        while not stopped.wait(interval_s):
            if not active():
                return
            if not batch_lock.acquire(blocking=False):
                continue  # a micro-batch runs: it commits what is pending itself
            try:
                if has_pending():
                    logger.info("%s: committing pending checkpoints while the stream is idle", what)
                    commit_pending()
            except CatalogOutage as e:
                logger.info("%s: pending checkpoints stay pending, the catalog is still unreachable: %s", what, e)
            except Exception:
                logger.exception("%s: pending checkpoints could not be committed; the next micro-batch retries", what)
            finally:
                batch_lock.release()

    thread = threading.Thread(target=loop, name="iceberg-sink-pending-retry", daemon=True)
    thread.start()
    return thread
