"""Committing a job's persisted committables, or keeping them pending when a commit cannot land now.

    committable (persisted) ─▶ PendingCommits.commit_or_defer ─▶ IcebergCommitter ─▶ snapshot
                                         │ catalog unreachable / outcome unknown /
                                         │ other writers won every attempt (streams)
                                         ▼
                               stays stored; commit_pending() commits it, in order, later

:class:`PendingCommits` owns one job's commit step: the pre-commit hooks, the idempotent commit,
deleting the committable once its checkpoint is in the table, the commit metrics, the post-commit
hooks and the maintenance triggers. A stream rides out a catalog outage, or a burst of other
writers' commits that wins every attempt of one of its commits, by leaving committables stored (up
to ``iceberg-sink.commit.max-pending-checkpoints``); each is committed, oldest first, one snapshot
each, by the next micro-batch or the idle retry (job/idle.py). :meth:`PendingCommits.defers` is the
one rule for which failures a stream rides out. Why checkpoints are pending (errors.pending_because,
e.g. a SQLite catalog file another process holds locked) goes to the warning, the metrics
(``pending_reason``, ``catalog_locked_commits``) and the checkpoint store, where ``iceberg-sink
inspect`` shows it, until a commit leaves none pending. It never calls back into the job: what it committed
is kept in :attr:`PendingCommits.committed` for the job's progress record.

A stream's v3 checkpoint may instead be handed to the job's commit lane (job/lane.py, :meth:`hand`):
its commit runs beside the next micro-batch, and whoever commits next drains the lane first
(:meth:`drain`), where what follows the commit (metrics, progress entry, hooks) runs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from pyiceberg.table import Table

from iceberg_sink import _faults, options
from iceberg_sink._iceberg.retry import catalog_unreachable
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import CommitOutcome, IcebergCommitter
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.errors import (
    SQLITE_CATALOG_ADVICE,
    AtomicCommitAbortedError,
    CatalogUnavailableError,
    CommitRetriesExhaustedError,
    CommitStateUnknownError,
    PendingCheckpointsLimitError,
    one_line,
    pending_because,
    sqlite_catalog_locked,
)
from iceberg_sink.job import codegen
from iceberg_sink.job.lane import CommitLane
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.sources import kafka_offsets, transactions
from iceberg_sink.topology.compaction.trigger import CompactionTrigger
from iceberg_sink.topology.conversion.trigger import ConversionTrigger
from iceberg_sink.topology.hooks import CommitResult, HookRunner

logger = logging.getLogger("iceberg_sink")


class CommitDeferred(Exception):
    """A stream's commit did not land and is kept pending (:meth:`PendingCommits.defers`): the catalog
    is unreachable, the commit's outcome is unknown, or other writers won every attempt.

    Raised only around the committer's commit, so a failure after a commit landed (a post-commit
    hook, a compaction) is never taken for one.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class PendingCommits:
    """One job's commit step: commit a persisted committable now, or keep it pending.

    Args:
        table_name, branch, job_id: what is committed where (for messages and hook results).
        committer: the idempotent committer of the job.
        store: where the job's committables are persisted.
        hooks, metrics: the job's hooks and metrics.
        job_properties: snapshot properties every commit of the job adds.
        streaming: only a stream keeps checkpoints pending (through an outage or lost races).
        max_pending: the most pending checkpoints a stream keeps before it stops.
        has_table: whether the job has loaded its table once (an outage before that is an error).
        compaction, conversion: maintenance triggers told of each commit.
        serial: held around the job's hooks and maintenance triggers, so that a routed checkpoint
            committing its tables on several threads runs them one at a time (job/routing.py).
        carries_transactions: ``.debezium(transactions="consistent")``: a stream's Kafka offsets stop
            at the events its checkpoint held back (sources/transactions.py).
    """

    def __init__(
        self,
        *,
        table_name: str,
        branch: str,
        job_id: str,
        committer: IcebergCommitter,
        store: CheckpointStore,
        hooks: HookRunner,
        metrics: SinkMetrics,
        job_properties: dict[str, str],
        streaming: bool,
        max_pending: int,
        has_table: Callable[[], bool],
        compaction: CompactionTrigger | None = None,
        conversion: ConversionTrigger | None = None,
        serial: AbstractContextManager[Any] | None = None,
        carries_transactions: bool = False,
    ) -> None:
        self._serial = serial or contextlib.nullcontext()
        self._table_name = table_name
        self._branch = branch
        self._job_id = job_id
        self._committer = committer
        self._store = store
        self._hooks = hooks
        self._metrics = metrics
        self._job_properties = job_properties
        self._streaming = streaming
        self._carries_transactions = carries_transactions
        self._max_pending = max_pending
        self._has_table = has_table
        self.compaction = compaction
        self.conversion = conversion
        #: What was committed since :meth:`start_batch` (checkpoint, snapshot, commit time, attempts).
        self.committed: list[dict[str, Any]] = []
        # The job's commit lane (job/lane.py) and the committable on it.
        self._lane: CommitLane[tuple[CommitOutcome, float]] = CommitLane(f"table {table_name}")
        self._handed: Committable | None = None
        # Whether the store holds why checkpoints were pending (None: not read yet; an earlier run
        # may have left it): cleared, with the metric, by the first commit that leaves none pending.
        self._reason_recorded: bool | None = None

    def start_batch(self) -> None:
        self.committed = []

    def commit(self, committable: Committable, table: Table | None = None) -> CommitOutcome:
        """Commit ``committable`` (idempotently) and forget it; raises :class:`CommitDeferred` when a
        stream's commit cannot land now (:meth:`defers`; the committable stays stored)."""
        started = time.monotonic()
        outcome = self._send(committable, self._properties(committable), table)
        return self._land(committable, outcome, (time.monotonic() - started) * 1000)

    def _properties(self, committable: Committable) -> dict[str, str]:
        """The snapshot properties of ``committable``'s commit: the job's, each Kafka partition's
        offset (streams: sources/kafka_offsets.py) and the pre-commit hooks'."""
        properties = dict(self._job_properties)
        if self._streaming:  # how far each Kafka partition is (sources/kafka_offsets.py)
            checkpoint_id = committable.checkpoint_id
            # A job carrying source transactions names no partition past an event it held back.
            held = (
                transactions.held_offsets(self._store.carry_record(checkpoint_id))
                if self._carries_transactions
                else None
            )
            properties.update(kafka_offsets.summary_properties(self._store.spark_offset_log(checkpoint_id), held))
        with self._serial:
            properties.update(self._hooks.before_commit(committable.summary))
        return properties

    def _send(self, committable: Committable, properties: dict[str, str], table: Table | None) -> CommitOutcome:
        """The commit itself (on the commit lane too, job/lane.py): the committer's snapshot, then the
        committable removed. Raises :class:`CommitDeferred` as :meth:`commit` does."""
        try:
            outcome = self._committer.commit(committable, extra_properties=properties, table=table)
        except Exception as e:
            if self.defers(e):
                raise CommitDeferred(e) from e
            raise
        _faults.hit(_faults.AFTER_COMMIT, committable.checkpoint_id)
        self._store.delete(committable.checkpoint_id)
        if self._reason_recorded is None:
            self._reason_recorded = self._store.pending_reason() is not None
        if self._reason_recorded and not self._store.pending_ids():
            self._store.clear_pending_reason()
            self._metrics.set(pending_reason=None)
            self._reason_recorded = False
        if outcome.cleanup is not None:
            outcome.cleanup()
        return outcome

    def _land(self, committable: Committable, outcome: CommitOutcome, commit_ms: float) -> CommitOutcome:
        """What follows a commit, on the caller's thread: metrics, the progress entry, the hooks."""
        if outcome.snapshot is None:
            self._metrics.add(skipped_commits=1)
            # Already in the table, or it only deleted keys that provably do not exist.
            logger.info("checkpoint %s needed no new snapshot; skipped", committable.checkpoint_id)
            return outcome
        self._committed(committable, outcome, commit_ms)
        logger.info(
            "checkpoint %s committed as snapshot %s: %s data files, %s records",
            committable.checkpoint_id,
            outcome.snapshot.snapshot_id,
            committable.summary.data_files,
            committable.summary.records,
        )
        return outcome

    # -- the commit lane (job/lane.py) -------------------------------------------------------

    def hand(self, committable: Committable) -> CommitOutcome:
        """Commit ``committable`` on the job's commit lane and return at once: the lane must be
        drained (:meth:`commit_or_defer` drains it). Its pre-commit hooks run here, now; the rest of
        what follows the commit runs when the lane is drained (:meth:`drain`)."""
        properties = self._properties(committable)

        def send() -> tuple[CommitOutcome, float]:
            started = time.monotonic()
            outcome = self._send(committable, properties, None)
            return outcome, (time.monotonic() - started) * 1000

        self._handed = committable
        self._lane.hand(committable.checkpoint_id, send)
        self._metrics.add(overlapped_commits=1)
        return CommitOutcome(committable.checkpoint_id, None, already_committed=False, attempts=0, in_flight=True)

    def settle(self) -> tuple[bool, BaseException | None]:
        """Drain the commit lane if it holds a checkpoint: whether it held one, and why its commit
        was deferred (None: it landed). Other errors are raised, as :meth:`drain` raises them."""
        if not self._lane.holds():
            return False, None
        try:
            self.drain()
        except CommitDeferred as e:
            return True, e.error
        return True, None

    def lane_running(self) -> bool:
        """Whether a checkpoint's commit is running on the commit lane."""
        return self._lane.running()

    def drain(self) -> CommitOutcome | None:
        """Wait for the commit lane's checkpoint, then do what follows its commit here (metrics, the
        progress entry, hooks); None when the lane was empty.

        Raises:
            CommitDeferred: its commit could not land now (it is recorded pending, as :meth:`defer`
                does); its committable stays stored.
            Exception: its commit's error.
        """
        drained = self._lane.drain()
        if drained is None:
            return None
        checkpoint_id, future = drained
        committable, self._handed = self._handed, None
        assert committable is not None and committable.checkpoint_id == checkpoint_id
        error = future.exception()
        if isinstance(error, CommitDeferred):
            self.defer(checkpoint_id, error.error)
            raise error
        if error is not None:
            raise error
        outcome, commit_ms = future.result()
        return self._land(committable, outcome, commit_ms)

    def _committed(self, committable: Committable, outcome: CommitOutcome, commit_ms: float) -> None:
        """Metrics, the progress entry, post-commit hooks and maintenance triggers of a new snapshot."""
        snapshot = outcome.snapshot
        assert snapshot is not None
        summary = committable.summary
        data_bytes = sum(f.file_size_in_bytes for f in outcome.data_files)
        delete_bytes = sum(f.file_size_in_bytes for f in outcome.delete_files)
        self._metrics.add(
            commits=1,
            committed_data_files=summary.data_files,
            committed_delete_files=len(outcome.delete_files),
            committed_records=summary.records,
            committed_bytes=data_bytes + delete_bytes,
            committed_data_files_record_count=summary.records,
            committed_data_files_byte_count=data_bytes,
            committed_delete_files_record_count=sum(f.record_count for f in outcome.delete_files),
            committed_delete_files_byte_count=delete_bytes,
            key_index_data_files_read=outcome.key_index_data_files_read,
            key_index_entries_loaded=outcome.key_index_entries_loaded,
        )
        self._metrics.set(last_commit_duration_ms=commit_ms)
        self._metrics.committed()
        self.committed.append(
            {
                "checkpoint_id": committable.checkpoint_id,
                "snapshot_id": snapshot.snapshot_id,
                "commit_ms": round(commit_ms, 1),
                "attempts": outcome.attempts,
            }
        )
        result = CommitResult(
            table=self._table_name,
            branch=self._branch,
            job_id=self._job_id,
            checkpoint_id=committable.checkpoint_id,
            snapshot_id=snapshot.snapshot_id,
            sequence_number=snapshot.sequence_number or 0,
            operation=snapshot.summary.operation.value if snapshot.summary else "",
            snapshot_summary=dict(snapshot.summary.additional_properties) if snapshot.summary else {},
            checkpoint=summary,
        )
        # Post-commit work runs Spark jobs of its own (hooks, compaction, conversion): with the session's
        # settings, not a small batch's (codegen.py), whichever batch's planning or road committed it.
        with self._serial, codegen.as_configured():
            self._hooks.after_commit(result)
            if self.compaction is not None:
                self.compaction.observe(result, outcome.data_files)
            if self.conversion is not None:
                self.conversion.observe(result)

    def has_pending(self, before: int | None = None) -> bool:
        """Whether a committable (below ``before``) is stored, or (``before`` None) a checkpoint
        is on the commit lane, committed or not, whose landing is still to be done."""
        if before is None and self._lane.holds():
            return True
        return any(before is None or c < before for c in self._store.pending_ids())

    def stored(self) -> list[Committable]:
        """The job's stored committables, oldest first."""
        return self._store.pending()

    def count_pending(self) -> None:
        """Set the pending-checkpoints metric from the store."""
        self._metrics.set(pending_checkpoints=len(self._store.pending_ids()))

    def commit_pending(self, before: int | None = None) -> list[CommitOutcome]:
        """Commit stored committables (below ``before``), oldest first, one snapshot each, after the
        commit lane's checkpoint (drained first)."""
        outcomes = []
        drained = self.drain()
        if drained is not None:
            outcomes.append(drained)
        for committable in self._store.pending():
            if before is not None and committable.checkpoint_id >= before:
                continue
            outcomes.append(self.commit(committable))
        self.count_pending()
        return outcomes

    # -- commits a stream keeps pending ------------------------------------------------------

    def is_outage(self, error: BaseException) -> bool:
        """Whether ``error`` is a catalog outage a stream rides out by keeping checkpoints pending."""
        if not self._streaming or not self._has_table():
            return False
        return isinstance(error, (CatalogUnavailableError, CommitStateUnknownError)) or catalog_unreachable(error)

    def defers(self, error: BaseException) -> bool:
        """Whether a stream keeps a checkpoint whose commit failed with ``error`` pending: a catalog
        outage, other writers that won every attempt of the commit (CommitRetriesExhaustedError;
        the next micro-batch or the idle retry tries again with a fresh retry budget, as a Flink job
        restarted after a failed commit would), or another table of an atomic commit that could not
        commit the checkpoint (AtomicCommitAbortedError: job/together.py). Anything else (a refused
        request, a changed table, a vetoing hook) fails the stream."""
        if self.is_outage(error):
            return True
        return (
            self._streaming
            and self._has_table()
            and isinstance(error, (CommitRetriesExhaustedError, AtomicCommitAbortedError))
        )

    def defer(self, checkpoint_id: int, error: BaseException) -> CommitOutcome:
        """Keep checkpoint ``checkpoint_id`` (already stored) pending; fail past the limit."""
        pending = self._store.pending_ids()
        why, last = pending_because(error), one_line(error)
        locked = sqlite_catalog_locked(error)
        # The retry loop's errors name a locked SQLite catalog and what to do; others get the advice here.
        advice = f". {SQLITE_CATALOG_ADVICE}" if locked and SQLITE_CATALOG_ADVICE not in last else ""
        self._metrics.add(deferred_commits=1, catalog_locked_commits=int(locked))
        self._metrics.set(pending_checkpoints=len(pending), pending_reason=f"{why}: {last}{advice}")
        self._store.record_pending_reason(checkpoint_id, why, last + advice)
        self._reason_recorded = True
        if len(pending) > self._max_pending:
            raise PendingCheckpointsLimitError(
                f"{len(pending)} checkpoints of table {self._table_name} are pending (oldest: checkpoint "
                f"{pending[0]}, newest: {pending[-1]}) because {why}, more than the limit "
                f"of {self._max_pending} set by {options.MAX_PENDING_CHECKPOINTS.key}; the stream stops. "
                f"Nothing is lost: their committables are kept under {self._store.root} and are committed "
                f"in order, one snapshot each, when the stream restarts and its commits can land. "
                f"Last error: {last}{advice}"
            ) from error
        logger.warning(
            "%s: checkpoint %s of table %s stays pending (%s pending, oldest %s; limit %s): %s%s",
            why,
            checkpoint_id,
            self._table_name,
            len(pending),
            pending[0],
            self._max_pending,
            last,
            advice,
        )
        return CommitOutcome(checkpoint_id, None, already_committed=False, attempts=0, pending=True)

    def commit_or_defer(
        self, committable: Committable, table: Table | None, error: BaseException | None, overlap: bool = False
    ) -> CommitOutcome:
        """Commit ``committable`` now, or keep it pending when it cannot land now (``error``: an
        earlier commit of this batch could not, so this one waits behind it), or (``overlap``) hand
        it to the commit lane (job/lane.py). The lane's checkpoint, and any stored below this one,
        are committed first, in order."""
        before = committable.checkpoint_id
        try:
            if self.drain() is not None:
                table = None  # loaded before that commit landed: the committer loads it again
                if error is None and self.has_pending(before):
                    self.commit_pending(before)
        except CommitDeferred as e:
            error = error or e.error
        if error is not None:
            return self.defer(committable.checkpoint_id, error)
        if overlap:
            return self.hand(committable)
        try:
            return self.commit(committable, table)
        except CommitDeferred as e:
            return self.defer(committable.checkpoint_id, e.error)
