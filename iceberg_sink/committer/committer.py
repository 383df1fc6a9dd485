"""IcebergCommitter: turns each checkpoint's committable into exactly one Iceberg snapshot.

Commits happen in checkpoint order, one snapshot per checkpoint (equality deletes of checkpoint N+1
must get a higher sequence number than the rows of checkpoint N). Each snapshot's summary names the
job id and checkpoint id. Before every attempt, including retries, the committer walks the target
branch's ancestry to the newest snapshot of its job: a checkpoint at or below that id is already in
the table (for example a commit whose response was lost) and is not applied again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import attrs
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg import manifests, producer
from iceberg_sink._iceberg.files import branch_head
from iceberg_sink._iceberg.retry import RetryPolicy, commit_with_retry
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.summary_keys import DEFAULT_PREFIX, JobKeys
from iceberg_sink.errors import CommitRetriesExhaustedError
from iceberg_sink.table.key_bounds import data_added_since
from iceberg_sink.writer.result import DataFileMeta

logger = logging.getLogger(__name__)


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
        # The sink's own keys win over a hook's; they include the prefix marker snapshot expiry needs.
        properties = {
            **(extra_properties or {}),
            **JobKeys(self._prefix).properties(self._job_id, committable.checkpoint_id),
        }
        changes: producer.SnapshotChanges | None = None
        late_added = False

        def prepare(current: Table) -> producer.PreparedCommit | None:
            nonlocal changes, late_added
            # Checked on every attempt: an earlier attempt, or an earlier run, may have landed.
            if self.max_committed(current) >= committable.checkpoint_id:
                return None
            if changes is None:
                # Read only once the checkpoint is known to be uncommitted: after a commit the
                # staged manifests are deleted.
                changes = producer.SnapshotChanges(
                    data_files=tuple(self._read(current.io, committable.manifests.data_manifest)),
                    delete_files=tuple(self._read(current.io, committable.manifests.delete_manifest)),
                )
            if committable.skipped_deletes and committable.proof_snapshot_id is not None and not late_added:
                head = branch_head(current, self._branch)
                if data_added_since(current, head, committable.proof_snapshot_id):
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
            return producer.RowDelta(current, self._branch, changes, properties).prepare()

        result = commit_with_retry(
            f"checkpoint {committable.checkpoint_id} of job {self._job_id}",
            self._load_table,
            prepare,
            self._retry,
            table=table,
            sleep=self._sleep,
            on_give_up="; it stays pending and the next run checks the table and commits it if needed",
        )
        io = result.table.io
        self._cleanup_staged(io, committable)
        if result.snapshot is None:
            return CommitOutcome(
                committable.checkpoint_id, None, already_committed=result.attempts == 0, attempts=result.attempts
            )
        if result.state_was_unknown:
            logger.info("checkpoint %s committed after an unknown-state attempt", committable.checkpoint_id)
        return CommitOutcome(
            committable.checkpoint_id,
            result.snapshot,
            already_committed=False,
            attempts=result.attempts,
            data_files=changes.data_files if changes is not None else (),
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
