"""IcebergCommitter: turns each checkpoint's committable into exactly one Iceberg snapshot.

Commits happen in checkpoint order, one snapshot per checkpoint (equality deletes of checkpoint N+1
must get a higher sequence number than the rows of checkpoint N). Each snapshot's summary names the
job id and checkpoint id. Before every attempt, including retries, the committer walks the target
branch's ancestry to the newest snapshot of its job: a checkpoint at or below that id is already in
the table (for example a commit whose response was lost) and is not applied again.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping

import attrs
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg import manifests, producer
from iceberg_sink._iceberg.files import branch_head
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.summary_keys import DEFAULT_PREFIX, JobKeys
from iceberg_sink.errors import CommitRetriesExhaustedError, CommitStateUnknownError
from iceberg_sink.table.key_bounds import data_added_since
from iceberg_sink.writer.result import DataFileMeta

logger = logging.getLogger(__name__)


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
class CommitOutcome:
    """What happened to one checkpoint.

    Attributes:
        checkpoint_id: the checkpoint.
        snapshot: the snapshot that holds it (None when it was already committed earlier).
        already_committed: True when the table already held the checkpoint.
        attempts: commit attempts made.
    """

    checkpoint_id: int
    snapshot: Snapshot | None
    already_committed: bool
    attempts: int
    data_files: tuple[DataFileMeta, ...] = attrs.field(default=(), repr=False)


def find_max_committed_checkpoint(table: Table, branch: str, job_id: str, prefix: str) -> int:
    """The highest checkpoint id of ``job_id`` in the ancestry of ``branch``; -1 when none.

    Walks from the branch head (main's head for a branch not created yet) through parent ids and
    stops at the first snapshot written by this job: checkpoints commit in order, so it holds the max.
    """
    metadata = table.metadata
    snapshot = branch_head(table, branch)
    keys = JobKeys(prefix)
    while snapshot is not None:
        summary = snapshot.summary
        checkpoint = keys.checkpoint_of(summary.additional_properties, job_id) if summary is not None else None
        if checkpoint is not None:
            return checkpoint
        parent = (
            metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
        )
        if parent is None:
            # The root, or a chain cut by expired snapshots (Java leaves a dangling parent id, PyIceberg
            # clears it). Expiry (topology/maintenance.py) keeps each resumable job's newest snapshot, so
            # the newest of this job's remaining snapshots holds the maximum.
            ids = [
                checkpoint
                for s in metadata.snapshots
                if s.summary is not None
                and (checkpoint := keys.checkpoint_of(s.summary.additional_properties, job_id)) is not None
            ]
            return max(ids, default=-1)
        snapshot = parent
    return -1


class IcebergCommitter:
    """Commits committables of one job to one table branch, idempotently."""

    def __init__(
        self,
        load_table: Callable[[], Table],
        branch: str,
        job_id: str,
        retry: RetryPolicy,
        property_prefix: str = DEFAULT_PREFIX,
        sleep: Callable[[float], None] = time.sleep,
        late_deletes: Callable[[int, tuple[DataFileMeta, ...]], tuple[DataFileMeta, ...]] | None = None,
    ) -> None:
        self._late_deletes = late_deletes
        self._load_table = load_table
        self._branch = branch
        self._job_id = job_id
        self._retry = retry
        self._prefix = property_prefix
        self._sleep = sleep

    def max_committed(self, table: Table) -> int:
        return find_max_committed_checkpoint(table, self._branch, self._job_id, self._prefix)

    def commit(
        self,
        committable: Committable,
        extra_properties: Mapping[str, str] | None = None,
        table: Table | None = None,
    ) -> CommitOutcome:
        """Commit one checkpoint as one snapshot, unless the table already holds it.

        Args:
            committable: the checkpoint's committable.
            extra_properties: snapshot properties added by pre-commit hooks.
            table: the table as just loaded, to use for the first attempt (default: load it).
        """
        if committable.job_id != self._job_id:
            raise ValueError(f"committable of job {committable.job_id} given to the committer of job {self._job_id}")
        # A table the caller just loaded saves a catalog round trip; if it is stale the commit fails
        # its compare-and-swap and the retry reloads.
        table = table if table is not None else self._load_table()
        io = table.io
        changes: producer.SnapshotChanges | None = None
        # The sink's own keys win over a hook's; they include the prefix marker snapshot expiry needs.
        properties = {
            **(extra_properties or {}),
            **JobKeys(self._prefix).properties(self._job_id, committable.checkpoint_id),
        }
        deadline = time.monotonic() + self._retry.total_timeout_ms / 1000
        attempt = 0
        state_unknown = False
        late_added = False
        while True:
            if attempt > 0:
                table = self._load_table()
            # Re-checked on every attempt: a previous attempt whose response was lost may have landed.
            if self.max_committed(table) >= committable.checkpoint_id:
                self._cleanup_staged(io, committable)
                return CommitOutcome(committable.checkpoint_id, None, already_committed=attempt == 0, attempts=attempt)
            attempt += 1
            if changes is None:
                # Read only once the checkpoint is known to be uncommitted: after a commit the
                # staged manifests are deleted.
                changes = producer.SnapshotChanges(
                    data_files=tuple(self._read(io, committable.manifests.data_manifest)),
                    delete_files=tuple(self._read(io, committable.manifests.delete_manifest)),
                )
            if committable.skipped_deletes and committable.proof_snapshot_id is not None and not late_added:
                head = branch_head(table, self._branch)
                if data_added_since(table, head, committable.proof_snapshot_id):
                    # Rows were added since the writers proved their keys new: the proof no longer
                    # holds, so the skipped equality deletes are written now, from our data files.
                    if self._late_deletes is None:
                        raise CommitRetriesExhaustedError(
                            f"checkpoint {committable.checkpoint_id} skipped equality deletes but the table changed "
                            "since, and this committer cannot write them"
                        )
                    extra = self._late_deletes(committable.checkpoint_id, changes.data_files)
                    changes = attrs.evolve(changes, delete_files=changes.delete_files + extra)
                    late_added = True
                    logger.info(
                        "checkpoint %s: table changed since its new-key proof; wrote %s equality delete files",
                        committable.checkpoint_id,
                        len(extra),
                    )
            prepared = producer.prepare_commit(table, io, self._branch, changes, properties)
            try:
                committed = producer.commit_prepared(table, prepared)
            except CommitFailedException as e:
                self._delete(io, prepared.written_files)
                if attempt > self._retry.num_retries or time.monotonic() > deadline:
                    raise CommitRetriesExhaustedError(
                        f"checkpoint {committable.checkpoint_id} of job {self._job_id}: {attempt} commit attempts "
                        f"lost to concurrent writers ({e}); it stays pending and is retried by the next run"
                    ) from e
                logger.info(
                    "commit conflict for checkpoint %s (attempt %s): %s",
                    committable.checkpoint_id,
                    attempt,
                    e,
                )
                self._sleep(self._retry.wait_ms(attempt) / 1000)
                continue
            except CommitStateUnknownException as e:
                # Keep the files: the snapshot may reference them. The next attempt checks history.
                state_unknown = True
                if attempt > self._retry.num_retries or time.monotonic() > deadline:
                    raise CommitStateUnknownError(
                        f"checkpoint {committable.checkpoint_id} of job {self._job_id}: the catalog did not say "
                        f"whether the commit landed ({e}); the next run checks and commits it if needed"
                    ) from e
                logger.warning("commit state unknown for checkpoint %s: %s", committable.checkpoint_id, e)
                self._sleep(self._retry.wait_ms(attempt) / 1000)
                continue
            if state_unknown:
                logger.info("checkpoint %s committed after an unknown-state attempt", committable.checkpoint_id)
            self._cleanup_staged(io, committable)
            snapshot = committed.metadata.snapshot_by_id(prepared.snapshot.snapshot_id)
            return CommitOutcome(
                committable.checkpoint_id,
                snapshot,
                already_committed=False,
                attempts=attempt,
                data_files=changes.data_files,
            )

    @staticmethod
    def _read(io: FileIO, staged: manifests.StagedManifest | None) -> list[DataFileMeta]:
        return manifests.read_staged_manifest(io, staged) if staged is not None else []

    @staticmethod
    def _delete(io: FileIO, paths: tuple[str, ...]) -> None:
        for path in paths:
            try:
                io.delete(path)
            except Exception:
                logger.warning("could not delete uncommitted file %s", path)

    def _cleanup_staged(self, io: FileIO, committable: Committable) -> None:
        self._delete(io, committable.manifests.paths)
