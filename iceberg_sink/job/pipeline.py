"""One table's sink job: it plans each micro-batch of its table (stage 2 of the road, road.py),
through its binding (binding.py) and its pending commits (pending.py), and runs the road.

Exactly-once argument, for a checkpoint (micro-batch) N of a job (one checkpoint location):

1. Committables still stored for checkpoints below N are committed first, in order; each commit is
   idempotent (the committer checks the branch history for the job's newest checkpoint).
2. If the table already holds N (Spark replays the last batch after a crash that followed our
   commit), nothing is written again. A table ahead of the stream by more than that means the
   checkpoint location was rewound: that is refused, never silently skipped.
3. If a committable for N was persisted before a crash, it is committed as is; the batch is not
   written again.
4. Otherwise the batch is written, aggregated, persisted, then committed. Files of a crashed attempt
   that never reached a persisted committable are orphans no snapshot references.

Schema evolution (``iceberg-sink.schema-evolution``, table/evolution.py) commits the schema change a
batch needs when the batch is checked against the table, before step 1 and before any file is
written with it; idempotent, so a replayed batch finds it done (older committables still commit:
columns are only added or widened, which the committer checks).

Catalog outages and lost races (streams only; job/pending.py ``defers``): the batch is written, its
committable persisted and kept pending; step 1 of a later batch commits it, in order. More than
``iceberg-sink.commit.max-pending-checkpoints`` pending fail the stream (they stay stored).
A job with a dead-letter table commits both in one catalog transaction where it can (job/together.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iceberg_sink import _faults, options
from iceberg_sink._iceberg.files import branch_head
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink._spark_schema import schema_of
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import CommitOutcome, IcebergCommitter
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.config import SinkConfig
from iceberg_sink.errors import CheckpointRewoundError, InvalidSinkConfigError
from iceberg_sink.job import road
from iceberg_sink.job.binding import NoRowsNoTable, TableBinding
from iceberg_sink.job.dead_letter import DeadLetterTable, dead_letter_config
from iceberg_sink.job.key_index import key_index_arguments
from iceberg_sink.job.lane import overlaps
from iceberg_sink.job.pending import CommitDeferred, PendingCommits
from iceberg_sink.job.plan import BatchPlan, CheckpointPlan, Sizes
from iceberg_sink.job.refusal import without_reject
from iceberg_sink.job.together import Together, raise_first
from iceberg_sink.observe import progress
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.table import catalog as catalogs
from iceberg_sink.table.key_bounds import KeyBounds, KeyBoundsCache
from iceberg_sink.topology.changes import no_rows
from iceberg_sink.topology.compaction.trigger import CompactionTrigger
from iceberg_sink.topology.conversion.trigger import ConversionTrigger
from iceberg_sink.topology.hooks import HookRunner
from iceberg_sink.vocab.summary_keys import EPHEMERAL_JOB_KEY
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spark import refused_input
from iceberg_sink.writer.spec import WriterSpec

__all__ = ["CheckpointPlan", "CommitDeferred", "SinkJob", "dead_letter_table"]

logger = logging.getLogger("iceberg_sink")


class SinkJob:
    """The driver-side state of one job: one table, one checkpoint location, one job id.

    It composes the job's collaborators and runs its checkpoints through them: the table binding
    (job/binding.py: create or check the table, schema evolution, the key, a routed table's own
    columns, writer specs), the writers (writer/), the CommitAggregator and the pending-commit keeper
    (job/pending.py: commit, or keep pending through a catalog outage or lost races, in order).
    """

    def __init__(
        self,
        config: SinkConfig,
        store: CheckpointStore,
        catalog: Catalog | None = None,
        metrics: SinkMetrics | None = None,
        ephemeral: bool = False,
        compaction: CompactionTrigger | None = None,
        conversion: ConversionTrigger | None = None,
        streaming: bool = False,
        job_id: str | None = None,
        pin_table_uuid: bool = False,
        serial: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.metrics = metrics or SinkMetrics()
        catalog = self.catalog = catalog or config.catalog.load()
        self._store = store
        self.job_id = store.job_id(config.table, job_id)
        existing = catalogs.load_table(catalog, config.table)
        resolved = options.resolve(config.options, existing.properties if existing is not None else {})
        retry = RetryPolicy(
            num_retries=resolved.get(options.COMMIT_NUM_RETRIES),
            min_wait_ms=resolved.get(options.COMMIT_MIN_WAIT_MS),
            max_wait_ms=resolved.get(options.COMMIT_MAX_WAIT_MS),
            total_timeout_ms=resolved.get(options.COMMIT_TOTAL_TIMEOUT_MS),
        )
        self.binding = TableBinding(
            config, catalog, store, retry, resolved.get(options.SCHEMA_EVOLUTION), pin_table_uuid, loaded=existing
        )
        self.committer = IcebergCommitter(
            load_table=self.binding.refresh,
            branch=config.branch,
            job_id=self.job_id,
            retry=retry,
            property_prefix=resolved.get(options.SNAPSHOT_PROPERTY_PREFIX),
            on_conflict=lambda: self.metrics.add(commit_conflict_retries=1),
            **key_index_arguments(resolved, lambda: self._spark),
        )
        self.key_bounds = KeyBoundsCache()  # the sink gives its jobs one to share (each write() is a job)
        self.aggregator = CommitAggregator(config.table, config.branch, self.job_id)
        self.hooks = HookRunner(
            config.pre_commit_hooks,
            config.post_commit_hooks,
            fail_on_post_error=resolved.get(options.POST_COMMIT_FAIL_ON_ERROR),
            metrics=self.metrics,
        )
        self._spark: SparkSession | None = None
        self._dead_letter: DeadLetterTable | None = None
        self.together: Together | None = None  # the tables it commits atomically with (job/together.py)
        self.backlog: Callable[[], bool] | None = None  # streams: more records waiting? (job/lane.py)
        self.batch_record: dict[str, Any] = {}  # what the micro-batch being processed did, for its record
        # The trigger outlives a job: a sink's bounded writes (jobs of their own) count towards its thresholds.
        table_key = f"{config.catalog.name}:{config.table}:{config.branch}"
        if compaction is None and config.compaction is not None:
            compaction = CompactionTrigger(
                config.compaction,
                table_key=table_key,
                branch=config.branch,
                load_table=self.binding.refresh,
                small_file_bytes=config.compaction.min_size(resolved.get(options.TARGET_FILE_SIZE_BYTES)),
                metrics=self.metrics,
                spark=self._active_spark,
            )
        if conversion is None and config.conversion is not None:
            conversion = ConversionTrigger(
                config.conversion,
                table_key=table_key,
                branch=config.branch,
                load_table=self.binding.refresh,
                metrics=self.metrics,
                **key_index_arguments(resolved, lambda: self._spark),
            )
        self.compaction, self.conversion = compaction, conversion
        # An ephemeral job (no checkpoint location to resume from) needs no snapshots kept by expiry.
        self.commits = PendingCommits(
            table_name=config.table,
            branch=config.branch,
            job_id=self.job_id,
            committer=self.committer,
            store=store,
            hooks=self.hooks,
            metrics=self.metrics,
            job_properties={EPHEMERAL_JOB_KEY: "true"} if ephemeral else {},
            streaming=streaming,
            carries_transactions=config.carries_transactions,
            max_pending=resolved.get(options.MAX_PENDING_CHECKPOINTS),
            has_table=lambda: self.binding.table is not None,
            compaction=compaction,
            conversion=conversion,
            serial=serial,
        )

    @property
    def dead_letter(self) -> DeadLetterTable | None:
        """The table refused rows go to (.dead_letter), set by the sink for its job (job/dead_letter.py)."""
        return self._dead_letter

    @dead_letter.setter
    def dead_letter(self, table: DeadLetterTable | None) -> None:
        self._dead_letter = table
        # A null in a required column is then refused per row (dead-lettered) instead of by the schema check.
        self.binding.required_nulls_per_row = table is not None

    @property
    def _config(self) -> SinkConfig:
        """The job's configuration, with the key of the micro-batch being written."""
        return self.binding.config

    def ensure_table(self, struct: StructType, batch: DataFrame | None = None) -> Table:
        """Create or check the table for input ``struct`` (see :meth:`TableBinding.ensure`); ``batch``:
        the micro-batch itself, which is asked whether it holds no row to write if it does not fit."""
        if batch is not None:
            self.use_batch(batch)
        return self.binding.ensure(struct)

    def use_batch(self, batch: DataFrame) -> None:
        """The micro-batch about to be checked and written: a batch without rows (truncates only, or
        nothing: it may lack the row columns) passes the check of its columns (TableBinding.no_rows)."""
        if self._config.changes is not None:
            self.binding.no_rows = no_rows(batch, self._config.changes)

    @property
    def key(self) -> tuple[str, ...]:
        """The key the current micro-batch is written with (empty for appends)."""
        return self.binding.key

    def has_pending(self, before: int | None = None) -> bool:
        """Whether a committable (below ``before``) is stored."""
        return self.commits.has_pending(before)

    def commit_pending(self, before: int | None = None) -> list[CommitOutcome]:
        """Commit stored committables (below ``before``), oldest first, one snapshot each (with ``together``'s)."""
        if self.together is not None:
            return self.together.commit_pending(before).get(self._config.table, [])
        return self.commits.commit_pending(before)

    def next_checkpoint_id(self) -> int:
        """One past the newest checkpoint the table (when it exists) holds or this job has stored."""
        try:
            held = self.committer.max_committed(self.binding.refresh())
        except InvalidSinkConfigError:  # the table does not exist (not created yet, or dropped)
            held = -1
        return max([held, *(c.checkpoint_id for c in self._store.pending())]) + 1

    def process(self, df: DataFrame, checkpoint_id: int) -> CommitOutcome | None:
        """Write and commit one checkpoint; see the module docstring for the recovery rules.

        Each call ends with one progress record: kept by the sink (``IcebergSink.progress()``) and
        logged as one JSON line by the ``iceberg_sink.progress`` logger at INFO (docs/metrics.md).
        """
        started, read = progress.take_read()  # the batch's read, just before, is part of its checkpoint_ms
        outcome, error = None, None
        self.start_record(read)
        try:
            outcome = self._process(df, checkpoint_id)
            return outcome
        except BaseException as e:
            # One rule for every Spark action of the batch (the writers' job, a TOAST lookup's keys, a
            # truncate check): a row refused inside Spark is reported as InvalidInputError.
            error = refused_input(e, checkpoint_id, f"table {self._config.table}") or e
            if error is not e:
                raise error from e
            raise
        finally:
            duration_ms = (time.monotonic() - started) * 1000
            self.metrics.set(last_checkpoint_duration_ms=duration_ms)
            progress.report(
                self.metrics,
                table=self._config.table,
                branch=self._config.branch,
                job_id=self.job_id,
                checkpoint_id=checkpoint_id,
                outcome=outcome,
                error=error,
                duration_ms=duration_ms,
                summary=self.batch_record.get("summary"),
                write_ms=self.batch_record.get("write_ms"),
                committed=self.commits.committed,
                **progress.road(self.batch_record),
                dead_letter_records=self.batch_record.get("dead_letter_records", 0),
            )

    def start_record(self, phases_ms: dict[str, float] | None = None) -> None:
        """Begin this batch's progress record, its phases from ``phases_ms`` (routed: job/routing.py)."""
        self.batch_record = {"phases_ms": dict(phases_ms)} if phases_ms else {}
        self.commits.start_batch()

    def _active_spark(self) -> SparkSession:
        spark = self._spark or SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("compaction needs a SparkSession; none is active")
        return spark

    def _process(self, df: DataFrame, checkpoint_id: int) -> CommitOutcome | None:
        _faults.hit(_faults.BATCH_START, checkpoint_id)
        self._spark = df.sparkSession
        batch = road.timed(self.batch_record, "plan", lambda: self.plan(df, checkpoint_id))
        if batch is None:
            return None  # no rows, no table: nothing to create or commit
        done = road.run(df, batch)
        raise_first([(table, error) for table, _, error in done if error is not None])
        return next((outcome for table, outcome, _ in done if table == self._config.table), None)

    def plan(self, df: DataFrame, checkpoint_id: int) -> BatchPlan | None:
        """Stage 2 of the road (road.py): the plan of this job's table and of its dead-letter table
        for checkpoint ``checkpoint_id`` of ``df``; None when ``df`` has no row to write and the table
        does not exist."""
        self.use_batch(df)
        dead = self.dead_letter
        try:
            plan: CheckpointPlan | None = self.begin(without_reject(schema_of(df)), checkpoint_id)
        except NoRowsNoTable:  # no table yet, and refused rows only (for the dead-letter table) or none
            plan = None
        if plan is None and dead is None:
            return None
        dead_plan = dead.begin(checkpoint_id) if dead is not None else None
        # Without a dead-letter table the table's own properties count (as for every write option).
        resolved = plan.resolved if plan is not None and dead is None else options.resolve(self._config.options, {})
        table = self._config.table
        return BatchPlan(
            checkpoint_id=checkpoint_id,
            job_id=self.job_id,
            jobs={table: self},
            plans={table: plan} if plan is not None else {},
            changes=self._config.changes,
            describe=f"table {table}",
            dead=dead,
            dead_plan=dead_plan,
            sizes=Sizes.of(resolved),
            progress=self.batch_record,
            together=self.together,
        )

    # The phases of one checkpoint, also driven one table at a time by a routed sink (routing.py):
    # begin() for every table, one write for all, stage() for every table, then commit_planned().

    def begin(
        self,
        struct: StructType,
        checkpoint_id: int,
        carried: Collection[str | tuple[str, ...]] | None = None,
        named_keys: Collection[tuple[str, ...]] = (),
    ) -> CheckpointPlan:
        """Prepare checkpoint ``checkpoint_id`` of input ``struct``: the table is created or checked,
        older committables are committed, and the plan says whether the checkpoint is already
        committed (``done``), was stored before a crash (``stored``), or must be written.
        ``carried``, ``named_keys``: for a routed table, as for :meth:`TableBinding.ensure`."""
        # Set while the catalog is unreachable, or an earlier checkpoint's commit is pending after lost
        # races: the batch is written with the table metadata this job loaded last (refreshed when it
        # could be) and its commit is deferred. That metadata can only be older than the table's, so
        # the checks below stay sound: a checkpoint it holds is held, and checkpoints after the
        # last one it holds have their committables stored until committed.
        deferred: BaseException | None = None
        try:
            table = self.binding.ensure(struct, carried, named_keys)
        except Exception as e:
            if not self.commits.is_outage(e):
                raise
            assert self.binding.table is not None
            deferred, table = e, self.binding.table
            self.binding.use_key(table, named_keys)
            table = self.binding.check_input(table, self.binding.own_columns(struct, table, carried))
        if self.binding.key_changed:
            self.binding.key_changed = False  # the bounds cache is per key: it starts over itself
        if self.binding.schema_changed:
            self.binding.schema_changed = False
            _faults.hit(_faults.AFTER_SCHEMA_CHANGE, checkpoint_id)
        if deferred is None and not self.commits.lane_running():  # else its commit step takes it
            committed_pending = []
            try:
                committed_pending = self.commit_pending(before=checkpoint_id)
            except CommitDeferred as e:
                deferred = e.error
            if committed_pending and deferred is None:
                try:
                    table = self.binding.refresh()
                except Exception as e:
                    if not self.commits.is_outage(e):
                        raise
                    deferred = e
        plan = CheckpointPlan(checkpoint_id=checkpoint_id, table=table, deferred=deferred)
        committed = self.committer.max_committed(table)
        if checkpoint_id < committed:
            raise CheckpointRewoundError(
                f"stream is at checkpoint {checkpoint_id} but table {self._config.table} already holds checkpoint "
                f"{committed} of job {self.job_id}: the checkpoint location was restored from an older copy. "
                "Restore its latest state, or use a new checkpoint location (a new job) to write again."
            )
        plan.stored = self._store.get(checkpoint_id)
        if plan.stored is not None:
            self.batch_record["summary"] = plan.stored.summary
        if checkpoint_id == committed and plan.stored is None:
            logger.info("checkpoint %s already committed; replayed batch skipped", checkpoint_id)
            plan.done = CommitOutcome(checkpoint_id, None, already_committed=True, attempts=0)
        if plan.done is not None or plan.stored is not None:
            return plan
        plan.resolved = options.resolve(self._config.options, table.properties)
        if self._config.changes is not None and plan.resolved.get(options.SKIP_DELETES_FOR_NEW_KEYS):
            head = branch_head(table, self._config.branch)
            plan.proof = self.key_bounds.bounds(table, head, self.binding.equality_ids(table))
        plan.spec = self.writer_spec(table, checkpoint_id, plan.proof)
        plan.mode = self.binding.distribution_mode(table, plan.resolved)
        plan.sort_columns = [table.schema().find_column_name(f.source_id) or "" for f in table.sort_order().fields]
        return plan

    def stage(self, plan: CheckpointPlan, results: list[WriteResult]) -> Committable | None:
        """Aggregate the written files of ``plan`` into a committable and persist it (None: no rows)."""
        checkpoint_id = plan.checkpoint_id
        committable = self.aggregator.aggregate(
            plan.table,
            plan.table.io,
            checkpoint_id,
            results,
            proof_snapshot_id=plan.proof.snapshot_id if plan.proof else None,
        )
        if committable is None:
            logger.info("checkpoint %s of table %s wrote no rows; no snapshot", checkpoint_id, self._config.table)
            return None
        self.batch_record["summary"] = committable.summary
        _faults.hit(_faults.AFTER_STAGE, checkpoint_id)
        self._store.put(committable)
        _faults.hit(_faults.AFTER_MANIFESTS, checkpoint_id)
        plan.stored = committable
        return committable

    def commit_planned(self, plan: CheckpointPlan, committable: Committable | None = None) -> CommitOutcome | None:
        """Commit the checkpoint of ``plan`` (or keep it pending: job/pending.py ``defers``)."""
        if plan.done is not None:
            return plan.done
        committable = committable or plan.stored
        if committable is None:
            return None
        overlap = overlaps(self.backlog, plan.table.format_version, plan.resolved)  # a one-table stream: job/lane.py
        return self.commits.commit_or_defer(committable, plan.table, plan.deferred, overlap)

    def flushed(self, results: list[WriteResult], duration_ms: float) -> None:
        """Writer metrics of one checkpoint, from its tasks' results (observe/metrics.py)."""
        self.batch_record["write_ms"] = self.metrics.written(results, duration_ms)

    def writer_spec(self, table: Table, checkpoint_id: int, proof: KeyBounds | None = None) -> WriterSpec:
        return self.binding.writer_spec(table, self.job_id, checkpoint_id, proof)


def dead_letter_table(
    config: SinkConfig,
    store: CheckpointStore,
    job_id: str,
    metrics: SinkMetrics,
    catalog: Catalog | None = None,
    ephemeral: bool = False,
    streaming: bool = False,
) -> DeadLetterTable:
    """The dead-letter table of a sink's job (``config``: the sink's), driven by a SinkJob of its own
    sharing the sink's job id; ``metrics``: the sink's, which count its refused rows."""
    job = SinkJob(
        dead_letter_config(config),
        store,
        catalog=catalog,
        metrics=SinkMetrics(),  # its writes and commits are not the good table's
        ephemeral=ephemeral,
        streaming=streaming,
        job_id=job_id,
    )
    return DeadLetterTable(job, metrics)
