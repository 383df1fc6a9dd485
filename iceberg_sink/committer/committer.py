"""IcebergCommitter: turns each checkpoint's committable into exactly one Iceberg snapshot.

A checkpoint holding a truncate (``Committable.truncated``) is one snapshot too: it removes every
data and delete file live on the branch head of the attempt that lands, and adds the checkpoint's.

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
from pyiceberg.exceptions import CommitFailedException, ResolveError
from pyiceberg.io import FileIO
from pyiceberg.schema import index_by_id, promote
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg import manifests, producer, row_delta, specs, together
from iceberg_sink._iceberg.files import branch_head, delete_quietly
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION
from iceberg_sink._iceberg.retry import CommitAttempt, RetryPolicy
from iceberg_sink.committer import vectors
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.store import committable_name
from iceberg_sink.errors import CommitRetriesExhaustedError, UncommittableCheckpointError
from iceberg_sink.keyindex.index import DEFAULT_MAX_BYTES, KeyIndex
from iceberg_sink.keyindex.partitioned import DEFAULT_PARTITION_MAX_ENTRIES
from iceberg_sink.keyindex.runner import Runner
from iceberg_sink.table.key_bounds import data_added_since
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from iceberg_sink.vocab.summary_keys import DEFAULT_PREFIX, JobKeys

logger = logging.getLogger(__name__)


@attrs.frozen
class CommitOutcome:
    """What happened to one checkpoint.

    Attributes:
        checkpoint_id: the checkpoint.
        snapshot: the snapshot that holds it (None when it was already committed earlier).
        already_committed: True when the table already held the checkpoint.
        attempts: commit attempts made.
        pending: True when the catalog was unreachable: the checkpoint's files are written and its
            committable is kept under the checkpoint location, to be committed by a later
            micro-batch (or a restart) once the catalog is back.
        data_files / delete_files: the files the snapshot added (for metrics and compaction).
        key_index_data_files_read / key_index_entries_loaded: v3 deletes resolved to DVs, over all
            attempts: data files whose key columns were read, and key index entries loaded from
            table storage instead (committer/vectors.py).
        atomic: whether the checkpoint's tables became visible together: True for a checkpoint of
            one table, and for the tables of a job that commits them in one catalog transaction
            (job/together.py); False when its tables (a routed sink's, a dead-letter table) were
            committed one at a time (``.atomic_commits("off")``, or a catalog that cannot).
        cleanup: for a checkpoint that needed no snapshot, deletes its staged files; call it after
            removing its committable (a replay before that reads them again).
        in_flight: True when the checkpoint's commit was handed to the stream's commit lane
            (job/lane.py): its committable is stored, and the next micro-batch (or the idle retry)
            takes the commit's result before committing anything else.
    """

    checkpoint_id: int
    snapshot: Snapshot | None
    already_committed: bool
    attempts: int
    data_files: tuple[DataFileMeta, ...] = attrs.field(default=(), repr=False)
    pending: bool = False
    delete_files: tuple[DataFileMeta, ...] = attrs.field(default=(), repr=False)
    cleanup: Callable[[], None] | None = attrs.field(default=None, repr=False, eq=False)
    key_index_data_files_read: int = 0
    key_index_entries_loaded: int = 0
    atomic: bool = True
    in_flight: bool = False


@attrs.frozen
class _PreparedV3:
    prepared: producer.PreparedCommit
    delete_files: tuple[DataFileMeta, ...]

    @property
    def snapshot(self) -> Snapshot:
        return self.prepared.snapshot


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
        on_conflict: Callable[[], None] | None = None,
        key_index_max_bytes: int = DEFAULT_MAX_BYTES,
        key_index_persist: bool = False,
        key_index_partitions: int = 0,
        key_index_runner: Runner | None = None,
        key_index_partition_max_entries: int = DEFAULT_PARTITION_MAX_ENTRIES,
    ) -> None:
        self._load_table = load_table
        self._on_conflict = on_conflict
        self._branch = branch
        self._job_id = job_id
        self._retry = retry
        self._prefix = property_prefix
        self._sleep = sleep
        # v3 upserts: data files' keys between checkpoints, in memory (and table storage for the next
        # driver), or with partitions in the partitioned index in table storage (keyindex/).
        self._key_index = KeyIndex(
            key_index_max_bytes,
            key_index_persist,
            key_index_partitions,
            key_index_runner,
            key_index_partition_max_entries,
        )

    def take_key_index(self, index: KeyIndex | None) -> None:
        """Use ``index``, an earlier job's of the same sink and table (each bounded ``write()`` is a
        job of its own), when it is laid out as this committer's (KeyIndex.layout)."""
        if index is not None and index.layout == self._key_index.layout:
            self._key_index = index

    @property
    def key_index(self) -> KeyIndex:
        """The key index v3 deletes are resolved through (committer/vectors.py)."""
        return self._key_index

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
        changes: row_delta.SnapshotChanges | None = None
        read_before, loaded_before = self._key_index.data_files_read, self._key_index.persisted.loaded
        conditional: tuple[DataFileMeta, ...] = ()
        # The delete files each prepared snapshot commits, to know afterwards whether the
        # conditional ones were needed by the snapshot that landed.
        deletes_by_snapshot: dict[int, tuple[DataFileMeta, ...]] = {}
        nothing_to_commit = False

        def prepare(current: Table) -> producer.PreparedCommit | None:
            nonlocal changes, conditional, nothing_to_commit
            self._check_same_table(current, committable)
            # Checked on every attempt: an earlier attempt, or an earlier run, may have landed.
            if self.max_committed(current) >= committable.checkpoint_id:
                return None
            self._check_written_schema(current, committable)
            if changes is None:
                # Read only once the checkpoint is known to be uncommitted: after a commit the
                # staged manifests are deleted.
                try:
                    changes = row_delta.SnapshotChanges(
                        data_files=tuple(self._read(current.io, committable, committable.manifests.data_manifest)),
                        delete_files=tuple(self._read(current.io, committable, committable.manifests.delete_manifest)),
                        truncate=committable.truncated,
                    )
                    conditional = tuple(
                        self._read(current.io, committable, committable.manifests.conditional_delete_manifest)
                    )
                except UncommittableCheckpointError:
                    # Another committer of this job (a stopped query's idle retry, a restarted
                    # query) may have committed it, and removed its staged files, since ``current``
                    # was loaded: the table as it is now says so before anything is refused.
                    if self.max_committed(self._load_table()) >= committable.checkpoint_id:
                        return None
                    raise
            missing_specs = sorted(
                {f.spec_id for f in (*changes.data_files, *changes.delete_files, *conditional)}
                - set(current.metadata.specs())
            )
            if missing_specs:
                raise UncommittableCheckpointError(
                    f"checkpoint {committable.checkpoint_id} of job {self._job_id} holds files of partition specs "
                    f"{missing_specs}, which table {committable.table} no longer has; nothing of it was committed. "
                    "Remove its committable from the checkpoint location and write the batch again."
                )
            if current.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION:
                # Deletes become deletion vectors, resolved on this attempt's head (committer/vectors.py).
                v3 = self._prepare_v3(current, committable, changes, conditional, properties)
                if v3 is None:
                    # Nothing to commit: decided again on the table as it is now (_loaded_again).
                    fresh = self._loaded_again(committable)
                    if fresh is None:
                        return None
                    if fresh.metadata_location != current.metadata_location:
                        current = fresh
                        v3 = self._prepare_v3(current, committable, changes, conditional, properties)
                if v3 is None:
                    nothing_to_commit = True
                    return None
                deletes_by_snapshot[v3.snapshot.snapshot_id] = v3.delete_files
                return v3.prepared
            if committable.truncated:
                # The snapshot removes every file live on ``current``'s head (row_delta.RowDelta), read
                # again by every attempt: a file another writer committed before ours lands is removed
                # too, as a TRUNCATE does. Its equality deletes then reach no older row: conditional
                # ones are never needed and the spec of the deletes does not matter.
                delete_files = changes.delete_files
            else:
                # Decided again on every attempt, against the exact head this attempt commits on (the
                # commit's compare-and-swap on the branch head makes the decision hold).
                current, delete_files = self._deletes_for_head(current, committable, changes.delete_files, conditional)
            if not changes.data_files and not delete_files and not committable.truncated:
                # Only deletes of keys that provably do not exist: nothing to commit (_loaded_again).
                fresh = self._loaded_again(committable)
                if fresh is None:
                    return None
                if fresh.metadata_location != current.metadata_location:
                    current, delete_files = self._deletes_for_head(
                        fresh, committable, changes.delete_files, conditional
                    )
                if not delete_files:
                    nothing_to_commit = True
                    return None
            prepared = row_delta.RowDelta(
                current, self._branch, attrs.evolve(changes, delete_files=delete_files), properties
            ).prepare()
            deletes_by_snapshot[prepared.snapshot.snapshot_id] = delete_files
            return prepared

        attempt = CommitAttempt(
            f"checkpoint {committable.checkpoint_id} of job {self._job_id}",
            self._load_table,
            self._retry,
            sleep=self._sleep,
            on_give_up="; it stays pending and the next run checks the table and commits it if needed",
            checkpoint_id=committable.checkpoint_id,
            on_conflict=self._on_conflict,
            # A table of an atomic checkpoint commit hands its snapshot to its group (job/together.py).
            send=together.joined(),
        )
        result = attempt.run(prepare, table)
        io = result.table.io
        conditional_paths = tuple(f.path for f in conditional)
        if result.snapshot is None and nothing_to_commit:
            # No snapshot records this checkpoint, so a replay (a crash before the caller removes the
            # committable) decides again from its staged files: they are deleted only once the
            # committable is gone, by ``cleanup`` (after an attempt of unknown outcome, only if the
            # table proves no snapshot lists them).
            paths = (*committable.manifests.paths, *conditional_paths)

            def cleanup() -> None:
                attempt.discard(io, paths, result.table)

            return CommitOutcome(
                committable.checkpoint_id,
                None,
                already_committed=False,
                attempts=result.attempts,
                cleanup=cleanup,
            )
        self._cleanup_staged(io, committable)
        if result.snapshot is None:
            return CommitOutcome(
                committable.checkpoint_id, None, already_committed=result.attempts == 0, attempts=result.attempts
            )
        landed_deletes = deletes_by_snapshot.get(result.snapshot.snapshot_id)
        committed_deletes = (
            frozenset(f.path for f in landed_deletes) if landed_deletes is not None else frozenset(conditional_paths)
        )
        if not committed_deletes & set(conditional_paths):
            # The proof held: the conditional deletes were not needed and no snapshot has them.
            delete_quietly(io, conditional_paths)
        if changes is not None and landed_deletes is not None and all(f.is_dv for f in landed_deletes):
            # v3: the writers' delete files were resolved into the DVs that landed; none is in the table.
            delete_quietly(io, [f.path for f in changes.delete_files if not f.is_dv])
        if result.state_was_unknown:
            logger.info("checkpoint %s committed after an unknown-state attempt", committable.checkpoint_id)
        return CommitOutcome(
            committable.checkpoint_id,
            result.snapshot,
            already_committed=False,
            attempts=result.attempts,
            data_files=changes.data_files if changes is not None else (),
            delete_files=landed_deletes or (),
            key_index_data_files_read=self._key_index.data_files_read - read_before,
            key_index_entries_loaded=self._key_index.persisted.loaded - loaded_before,
        )

    def _prepare_v3(
        self,
        table: Table,
        committable: Committable,
        changes: row_delta.SnapshotChanges,
        conditional: tuple[DataFileMeta, ...],
        properties: Mapping[str, str],
    ) -> _PreparedV3 | None:
        """The snapshot of a v3 checkpoint: its data files and its deletes as DVs resolved on the
        head of ``table`` (the attempt's compare-and-swap names that head). None: nothing to commit
        (no data file, and no delete that removes a live row)."""
        head = branch_head(table, self._branch)
        positional = [f for f in changes.delete_files if f.content == FileContent.POSITION_DELETES]
        with self._key_index.lock:  # shared by the jobs of one sink, which may commit at once
            if committable.truncated:
                # Every file live on the head is removed: the equality deletes reach nothing that stays.
                resolved = vectors.resolve(table, None, changes.data_files, (), positional, self._key_index)
            else:
                equality = tuple(f for f in changes.delete_files if f.content == FileContent.EQUALITY_DELETES)
                equality += self._conditional_deletes_needed(table, head, committable, conditional)
                resolved = vectors.resolve(table, head, changes.data_files, equality, positional, self._key_index)
        if not changes.data_files and not resolved.vectors and not committable.truncated:
            return None
        try:
            prepared = row_delta.RowDelta(
                table,
                self._branch,
                row_delta.SnapshotChanges(changes.data_files, resolved.vectors, truncate=committable.truncated),
                properties,
                replaced=resolved.replaced | resolved.retired,
            ).prepare()
        except BaseException:
            delete_quietly(table.io, resolved.written)
            raise
        if resolved.written:  # deleted with the manifests if the attempt does not land
            prepared = attrs.evolve(prepared, written_files=(*prepared.written_files, *resolved.written))
        return _PreparedV3(prepared, resolved.vectors)

    def _loaded_again(self, committable: Committable) -> Table | None:
        """The table loaded now, for an attempt that found nothing to commit: no compare-and-swap
        checks a commit that is never sent, so the decision is made again on it (rows another writer
        committed since the attempt's table was loaded may hold keys the checkpoint deletes); None
        when the table holds the checkpoint already."""
        table = self._load_table()
        self._check_same_table(table, committable)
        return None if self.max_committed(table) >= committable.checkpoint_id else table

    def _check_same_table(self, table: Table, committable: Committable) -> None:
        """Refuse to commit a checkpoint into another table than the one its files were written for."""
        if committable.table_uuid is not None and str(table.metadata.table_uuid) != committable.table_uuid:
            raise UncommittableCheckpointError(
                f"checkpoint {committable.checkpoint_id} of job {self._job_id} was written for table "
                f"{committable.table} with UUID {committable.table_uuid}, but that table now has UUID "
                f"{table.metadata.table_uuid}: it was dropped and re-created. Its staged files belong to the old "
                "table and are not committed into the new one. To write to the new table, start from a new "
                "checkpoint location (or remove the committable of this checkpoint from the current one)."
            )

    def _check_written_schema(self, table: Table, committable: Committable) -> None:
        """Refuse files written with a schema whose columns the table no longer holds as written.

        A checkpoint kept pending through a catalog outage (or one racing a schema change) was
        written with the schema of its time. Columns added since read as null for its rows, and
        widened types read fine (Iceberg's promotion rules); but a column dropped (or replaced under
        the same name by a new field id) would silently lose the values written for it, and a type
        changed otherwise cannot be read. Those are refused; so are files of a partition spec the
        table no longer has.
        """
        metadata = table.metadata
        if committable.schema_id is None or committable.schema_id == metadata.current_schema_id:
            return
        what = f"checkpoint {committable.checkpoint_id} of job {self._job_id}"
        fix = (
            " Nothing of it was committed. Restore the column, or remove its committable from the checkpoint "
            "location and write the batch again."
        )
        written = next((s for s in metadata.schemas if s.schema_id == committable.schema_id), None)
        if written is None:
            raise UncommittableCheckpointError(
                f"{what} was written with schema {committable.schema_id}, which table {committable.table} no "
                f"longer has (its schemas: {sorted(s.schema_id for s in metadata.schemas)})." + fix
            )
        current = table.schema()
        now = index_by_id(current)
        problems = []
        for field_id, field in sorted(index_by_id(written).items()):
            name = written.find_column_name(field_id)
            if field_id not in now:
                problems.append(f"column {name!r} (field id {field_id}) was dropped")
                continue
            new = now[field_id]
            if field.field_type.is_primitive and field.field_type != new.field_type:
                try:
                    promote(field.field_type, new.field_type)
                except ResolveError:
                    problems.append(f"column {name!r} changed type from {field.field_type} to {new.field_type}")
        if problems:
            raise UncommittableCheckpointError(
                f"{what} was written with schema {committable.schema_id} of table {committable.table}, but the "
                f"table's schema has changed since ({current.schema_id}): {'; '.join(problems)}. Committing it "
                "would lose the values written for these columns." + fix
            )

    def _deletes_for_head(
        self,
        table: Table,
        committable: Committable,
        deletes: tuple[DataFileMeta, ...],
        conditional: tuple[DataFileMeta, ...],
    ) -> tuple[Table, tuple[DataFileMeta, ...]]:
        """The delete files to commit on the branch head of ``table``, and the table to commit on.

        1. The new-key proof: conditional deletes (keys proven new when the checkpoint began) are
           added unless no snapshot since the proof added data files.
        2. Partition specs: deletes written under a partitioned spec reach only data files of that
           spec. If the head has live data files of any other spec, the deletes are committed as
           global deletes (the unpartitioned spec, added to the table's metadata if missing). Their
           files hold key columns only and no partition value, so the same files are re-labelled:
           nothing is read or rewritten.

        Raises:
            UncommittableCheckpointError: a committable from an older version whose skipped deletes
                were never written, and whose proof no longer holds.
        """
        for _ in range(self._retry.num_retries + 1):
            head = branch_head(table, self._branch)
            chosen = deletes + self._conditional_deletes_needed(table, head, committable, conditional)
            delete_specs = {f.spec_id for f in chosen}
            metadata = table.metadata
            if not any(metadata.specs()[s].fields for s in delete_specs):
                return table, chosen
            if not specs.live_data_spec_ids(table, head) - delete_specs:
                return table, chosen
            global_spec = specs.unpartitioned_spec_id(table)
            if global_spec is not None:
                logger.info(
                    "checkpoint %s: the table has live data files in partition specs other than %s; committing %s "
                    "equality delete files as global deletes (spec %s)",
                    committable.checkpoint_id,
                    sorted(delete_specs),
                    len(chosen),
                    global_spec,
                )
                return table, tuple(
                    attrs.evolve(f, spec_id=global_spec, partition=()) if metadata.specs()[f.spec_id].fields else f
                    for f in chosen
                )
            # A metadata-only commit (the new spec is not the default); the head may have moved
            # meanwhile, so everything is decided again on the table it returns.
            try:
                table = specs.with_unpartitioned_spec(table)
            except CommitFailedException as e:
                logger.info("adding an unpartitioned spec lost a race (%s); reloading", e)
                table = self._load_table()
        raise CommitRetriesExhaustedError(
            f"checkpoint {committable.checkpoint_id} of job {self._job_id}: could not add an unpartitioned partition "
            f"spec to the table after {self._retry.num_retries + 1} attempts (concurrent spec changes); it stays "
            "pending and is retried by the next run"
        )

    def _conditional_deletes_needed(
        self, table: Table, head: Snapshot | None, committable: Committable, conditional: tuple[DataFileMeta, ...]
    ) -> tuple[DataFileMeta, ...]:
        """The conditional deletes when the new-key proof no longer holds on ``head``, else none."""
        if not committable.skipped_deletes and not conditional:
            return ()
        proof = committable.proof_snapshot_id
        if proof is not None and not data_added_since(table, head, proof):
            return ()
        if committable.manifests.conditional_delete_manifest is None:
            raise UncommittableCheckpointError(
                f"checkpoint {committable.checkpoint_id} of job {self._job_id} was staged by an older iceberg_sink "
                f"that skipped {committable.skipped_deletes} equality deletes of keys proven new, and rows were "
                "added to the table since, so committing it could leave stale or deleted rows alive. Commit it "
                "with the iceberg_sink version that wrote it, or remove its committable and write the batch again."
            )
        logger.info(
            "checkpoint %s: rows were added since its new-key proof; committing %s conditional delete files",
            committable.checkpoint_id,
            len(conditional),
        )
        return conditional

    def _read(
        self, io: FileIO, committable: Committable, staged: manifests.StagedManifest | None
    ) -> list[DataFileMeta]:
        """The files a staged manifest lists; a missing or unreadable one is never skipped (its files
        would be silently lost): it stops the commit with what to do."""
        if staged is None:
            return []
        try:
            return manifests.read_staged_manifest(io, staged)
        except FileNotFoundError as e:
            problem = f"is missing ({e})"
        except OSError:
            raise  # storage unreachable: the next attempt or run may read it
        except Exception as e:
            problem = f"cannot be read: it is damaged ({type(e).__name__}: {e})"
        n = committable.checkpoint_id
        raise UncommittableCheckpointError(
            f"checkpoint {n} of job {self._job_id} cannot be committed: its staged manifest {staged.path} "
            f"{problem}. Nothing of checkpoint {n} is in the table. Restore the manifest from a backup if there is "
            f"one; otherwise delete the committable {committable_name(n)} under the checkpoint location and write the "
            f"batch again (Spark re-runs a batch it did not record as finished; for write(), call it again with "
            f"checkpoint_id={n}). Files the manifest listed are then orphans that remove-orphans deletes."
        )

    def _cleanup_staged(self, io: FileIO, committable: Committable) -> None:
        delete_quietly(io, committable.manifests.paths)
