"""One sink job: the per-checkpoint flow that drives every stage on the driver.

    DataFrame ─▶ distribution ─▶ writer tasks ─▶ CommitAggregator ─▶ persist committable ─▶ IcebergCommitter

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
written with the new schema. It is idempotent (planned against the table as loaded), so a batch
replayed after a crash finds it done; committables stored with an older schema still commit, since
columns are only added or widened (the committer checks it).

Catalog outages (streams only): when the catalog cannot be reached, or a commit's outcome is unknown,
past the commit retry budget, the batch is still written with the table metadata last loaded by this
job, its committable is persisted, and it stays pending; step 1 of a later batch commits it, in order,
once the catalog answers again. A pending checkpoint whose commit had landed is found in the table by
the committer's history check and not committed twice. More pending checkpoints than
``iceberg-sink.commit.max-pending-checkpoints`` fail the stream (they stay stored for the restart).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from typing import Any

import attrs
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iceberg_sink import _faults, options
from iceberg_sink._iceberg import SUPPORTED_FORMAT_VERSIONS
from iceberg_sink._iceberg.files import branch_head
from iceberg_sink._iceberg.retry import RetryPolicy, catalog_unreachable
from iceberg_sink.committer.aggregator import CommitAggregator
from iceberg_sink.committer.committable import Committable
from iceberg_sink.committer.committer import CommitOutcome, IcebergCommitter
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.committer.summary_keys import EPHEMERAL_JOB_KEY
from iceberg_sink.config import SinkConfig
from iceberg_sink.errors import (
    CatalogUnavailableError,
    CheckpointRewoundError,
    CommitStateUnknownError,
    InvalidInputError,
    InvalidSinkConfigError,
    PendingCheckpointsLimitError,
    SchemaMismatchError,
    UncommittableCheckpointError,
    UnsupportedTableError,
    WriteFailedError,
)
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.sources import kafka_offsets
from iceberg_sink.table import catalog as catalogs
from iceberg_sink.table import evolution
from iceberg_sink.table.carried import project as project_carried
from iceberg_sink.table.key_bounds import KeyBounds, KeyBoundsCache
from iceberg_sink.table.keys import resolve_key
from iceberg_sink.table.partitioning import build_spec, field_name
from iceberg_sink.table.schema import (
    check_changes_table,
    check_compatible,
    check_key_columns,
    partition_problem,
    spark_to_iceberg,
)
from iceberg_sink.topology.changes import ERROR_MARKER, OP_COLUMN, reduce_changes
from iceberg_sink.topology.compaction.trigger import CompactionTrigger
from iceberg_sink.topology.conversion.trigger import ConversionTrigger
from iceberg_sink.topology.distribution import DistributionMode, distribute
from iceberg_sink.topology.hooks import CommitResult, HookRunner
from iceberg_sink.writer import jvm
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spark import task_failure, write_dataframe
from iceberg_sink.writer.spec import WriterSpec

logger = logging.getLogger("iceberg_sink")
progress_logger = logging.getLogger("iceberg_sink.progress")
"""One JSON line per micro-batch (see :meth:`SinkJob.process` and docs/metrics.md)."""


class SinkJob:
    """The driver-side state of one job: one table, one checkpoint location, one job id."""

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
    ) -> None:
        self._config = config
        # Routed tables (routing.py): the table's UUID is recorded in the store on first use and a
        # table dropped or re-created by someone else since is refused instead of written anew.
        self._pin_table_uuid = pin_table_uuid
        # Only a stream keeps checkpoints pending through a catalog outage: a bounded write reports it.
        self._streaming = streaming
        # A job whose checkpoint location is thrown away (a bounded write without one) cannot be
        # resumed: its snapshots need not be kept by snapshot expiry for exactly-once bookkeeping.
        self._job_properties = {EPHEMERAL_JOB_KEY: "true"} if ephemeral else {}
        self.metrics = metrics or SinkMetrics()
        self._catalog = catalog or config.catalog.load()
        self._store = store
        self.job_id = store.job_id(config.table, job_id)
        self._checked_schemas: set[str] = set()
        self._table: Table | None = None
        table = catalogs.load_table(self._catalog, config.table)
        resolved = options.resolve(config.options, table.properties if table is not None else {})
        self._retry = RetryPolicy(
            num_retries=resolved.get(options.COMMIT_NUM_RETRIES),
            min_wait_ms=resolved.get(options.COMMIT_MIN_WAIT_MS),
            max_wait_ms=resolved.get(options.COMMIT_MAX_WAIT_MS),
            total_timeout_ms=resolved.get(options.COMMIT_TOTAL_TIMEOUT_MS),
        )
        self.committer = IcebergCommitter(
            load_table=self.refresh,
            branch=config.branch,
            job_id=self.job_id,
            retry=self._retry,
            property_prefix=resolved.get(options.SNAPSHOT_PROPERTY_PREFIX),
            on_conflict=lambda: self.metrics.add(commit_conflict_retries=1),
        )
        self._max_pending = resolved.get(options.MAX_PENDING_CHECKPOINTS)
        self._evolution: str = resolved.get(options.SCHEMA_EVOLUTION)
        self._schema_changed = False  # by this job's evolution, since the last AFTER_SCHEMA_CHANGE point
        self._key_bounds: KeyBoundsCache | None = None
        # The builder's key; a routed table's key may come from its rows or identifier fields instead.
        self._default_key = config.changes.key if config.changes is not None else ()
        self.aggregator = CommitAggregator(config.table, config.branch, self.job_id)
        self.hooks = HookRunner(
            config.pre_commit_hooks,
            config.post_commit_hooks,
            fail_on_post_error=resolved.get(options.POST_COMMIT_FAIL_ON_ERROR),
            metrics=self.metrics,
        )
        self._spark: SparkSession | None = None
        # What the micro-batch being processed did, for its progress record.
        self._batch: dict[str, Any] = {}
        # The trigger outlives a job: a sink's bounded writes are jobs of their own but count
        # towards the same compaction thresholds.
        self.compaction: CompactionTrigger | None = compaction
        if self.compaction is None and config.compaction is not None:
            self.compaction = CompactionTrigger(
                config.compaction,
                table_key=f"{config.catalog.name}:{config.table}:{config.branch}",
                branch=config.branch,
                load_table=self.refresh,
                small_file_bytes=config.compaction.min_size(resolved.get(options.TARGET_FILE_SIZE_BYTES)),
                metrics=self.metrics,
                spark=self._active_spark,
            )
        self.conversion: ConversionTrigger | None = conversion
        if self.conversion is None and config.conversion is not None:
            self.conversion = ConversionTrigger(
                config.conversion,
                table_key=f"{config.catalog.name}:{config.table}:{config.branch}",
                branch=config.branch,
                load_table=self.refresh,
                metrics=self.metrics,
                key_index_max_bytes=resolved.get(options.CONVERSION_KEY_INDEX_MAX_BYTES),
            )

    # -- table -----------------------------------------------------------------------------

    def refresh(self) -> Table:
        table = catalogs.load_table(self._catalog, self._config.table)
        if table is None:
            raise InvalidSinkConfigError(f"table {self._config.table} does not exist (was it dropped?)")
        self._table = table
        return table

    def ensure_table(
        self,
        struct: StructType,
        carried: Collection[str | tuple[str, ...]] | None = None,
        named_keys: Collection[tuple[str, ...]] = (),
    ) -> Table:
        """Create or check the table for input ``struct``, evolving its schema if configured.

        ``carried`` (routed tables): the columns and nested field paths of ``struct`` holding a value
        in at least one of the table's rows; only those, the table's own and the sink's
        key/op/order/partition columns are the table's input (see :meth:`own_columns`).
        ``named_keys`` (routed tables): the keys its rows name in the sink's key column (see
        :meth:`use_key`)."""
        table = catalogs.load_table(self._catalog, self._config.table)
        self.use_key(table, named_keys)
        struct = self.own_columns(struct, table, carried)
        if table is None and self._pin_table_uuid and self._store.table_uuid() is not None:
            raise UncommittableCheckpointError(self._store.replaced_message(self._config.table, "no longer exists"))
        if table is None:
            create = self._config.create
            if create is None:
                raise InvalidSinkConfigError(
                    f"table {self._config.table} does not exist; create it or call .create_if_missing() on the builder"
                )
            schema = self._create_schema(struct)
            if self._config.changes is not None:  # before creating: a key named by the rows is checked here
                partition_problem(
                    self._config.table,
                    [(field_name(t), str(t.transform), t.column) for t in create.partition_by],
                    self._config.changes.key,
                )
            spec = build_spec(create.partition_by, schema)
            props = {"format-version": str(create.format_version), **dict(create.properties)}
            props.setdefault(options.PARQUET_COMPRESSION.key, options.PARQUET_COMPRESSION.default)
            table = catalogs.create_table(self._catalog, self._config.table, schema, spec, props)
            logger.info("created table %s (partitioned by %s)", self._config.table, spec)
        if table.metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise UnsupportedTableError(
                f"table {self._config.table} has format version {table.metadata.format_version}; "
                f"this sink writes format versions {SUPPORTED_FORMAT_VERSIONS}"
            )
        if self._pin_table_uuid:
            self._store.pin_table_uuid(self._config.table, str(table.metadata.table_uuid))
        table = self._check_input(table, struct)
        self._table = table
        return table

    # -- the key of an upsert/CDC table (table/keys.py) ------------------------------------------

    @property
    def key(self) -> tuple[str, ...]:
        """The key the current micro-batch is written with (empty for appends)."""
        return self._config.changes.key if self._config.changes is not None else ()

    def use_key(self, table: Table | None, named_keys: Collection[tuple[str, ...]] = ()) -> None:
        """Settle the key this micro-batch is written with: the key the rows name (routed tables),
        else the table's identifier fields (routed tables, or no key given), else the builder's."""
        changes = self._config.changes
        if changes is None:
            return
        key = resolve_key(
            self._config.table,
            table,
            named_keys,
            self._default_key,
            key_column=changes.key_column,
            op_column=changes.op_column,
            prefer_table=self._pin_table_uuid or not self._default_key,
        )
        if key != changes.key:
            self._config = attrs.evolve(self._config, changes=attrs.evolve(changes, key=key))
            self._key_bounds = None  # bounds of the old key's columns
            self._checked_schemas.clear()  # the key's columns are checked with the schema

    # -- routed tables: the input columns of one table (routing.py) ----------------------------

    def own_columns(
        self, struct: StructType, table: Table | None, carried: Collection[str | tuple[str, ...]] | None
    ) -> StructType:
        """The columns of ``struct`` that are this table's input: all of them (``carried`` None), or
        for a routed table those on ``carried`` paths (non-null in at least one of its rows of the
        batch, down into structs: table/carried.py), those the table has, and the key, op, order and
        partition source columns. So a column or nested field of another routed table, null in every
        row of this one, is neither created nor added by schema evolution here (it is added once a
        row of this table carries a value).

        Without schema evolution a table is created with all of ``struct``: it could never get a
        column later, so a column its first rows happen to leave null (deletes) must be there."""
        if carried is None or (table is None and self._evolution == evolution.OFF):
            return struct
        named: list[str] = []
        changes = self._config.changes
        if changes is not None:
            named += [c for c in (*changes.key, changes.op_column, changes.order_by) if c is not None]
        if self._config.create is not None:
            named += [term.column for term in self._config.create.partition_by]
        required = [p for c in named for p in ((c,), tuple(c.split(".")))]
        return project_carried(struct, carried, table.schema().fields if table is not None else (), required)

    # -- end of routed tables

    def _check_input(self, table: Table, struct: StructType) -> Table:
        """Check ``struct`` against ``table``; returns the table, with its schema evolved if needed."""
        changes = self._config.changes
        if changes is not None:
            check_changes_table(self._config.table, table, changes.key)
        key = struct.json()
        if key not in self._checked_schemas:
            runtime_checked = changes.key if changes is not None else ()
            # -- schema evolution (table/evolution.py): committed before this batch's files are written.
            if self._evolution != evolution.OFF:
                before = table.schema().schema_id
                table = evolution.evolve(
                    self._config.table,
                    table,
                    self._table_columns(struct),
                    self._evolution,
                    load_table=self.refresh,
                    retry=self._retry,
                    runtime_checked=runtime_checked,
                )
                self._schema_changed = self._schema_changed or table.schema().schema_id != before
            # -- end of schema evolution
            check_compatible(self._config.table, table.schema(), self._table_columns(struct), runtime_checked)
            self._checked_schemas.add(key)
        return table

    def _table_columns(self, struct: StructType) -> StructType:
        """The part of the input stored in the table (the op column of CDC input is not)."""
        changes = self._config.changes
        if changes is None or changes.op_column is None:
            return struct
        names = [f.name for f in struct.fields]
        if changes.op_column not in names:
            raise SchemaMismatchError(
                self._config.table,
                [
                    f"{changes.op_column}: the operation column given to .cdc(op_column=...) is missing from the DataFrame"
                ],
            )
        return StructType([f for f in struct.fields if f.name != changes.op_column])

    def _create_schema(self, struct: StructType) -> Schema:
        changes = self._config.changes
        if changes is None:
            return spark_to_iceberg(struct, table_name=self._config.table)
        table_struct = self._table_columns(struct)
        schema = spark_to_iceberg(table_struct, required=changes.key, table_name=self._config.table)
        missing = [k for k in changes.key if k not in schema.column_names]
        if missing:
            raise SchemaMismatchError(
                self._config.table, [f"{k}: key column is missing from the DataFrame" for k in missing]
            )
        # Before the table is created: a key Iceberg forbids (float, under an optional struct) is refused.
        check_key_columns(self._config.table, schema, changes.key)
        # Key columns become the table's identifier fields (required), whatever Spark says of nulls.
        ids = [schema.find_field(k).field_id for k in changes.key]
        try:
            return Schema(*schema.fields, identifier_field_ids=ids)
        except ValueError as e:  # PyIceberg's own identifier-field rules (e.g. a nullable nested key)
            raise InvalidSinkConfigError(
                f"upsert/CDC key {list(changes.key)} of table {self._config.table}: {e}"
            ) from e

    # -- checkpoints -----------------------------------------------------------------------

    def _commit(self, committable: Committable, table: Table | None = None) -> CommitOutcome:
        started = time.monotonic()
        properties = dict(self._job_properties)
        if self._streaming:  # how far each Kafka partition is (sources/kafka_offsets.py)
            properties.update(kafka_offsets.summary_properties(self._store.spark_offset_log(committable.checkpoint_id)))
        if self._config.pre_commit_hooks:
            properties.update(self.hooks.before_commit(committable.summary))
        try:
            outcome = self.committer.commit(committable, extra_properties=properties, table=table)
        except Exception as e:
            if self._outage(e):
                raise CatalogOutage(e) from e
            raise
        _faults.hit(_faults.AFTER_COMMIT, committable.checkpoint_id)
        self._store.delete(committable.checkpoint_id)
        if outcome.cleanup is not None:
            outcome.cleanup()
        if outcome.snapshot is None:
            self.metrics.add(skipped_commits=1)
        else:
            summary = committable.summary
            commit_ms = (time.monotonic() - started) * 1000
            data_bytes = sum(f.file_size_in_bytes for f in outcome.data_files)
            delete_bytes = sum(f.file_size_in_bytes for f in outcome.delete_files)
            self.metrics.add(
                commits=1,
                committed_data_files=summary.data_files,
                committed_delete_files=len(outcome.delete_files),
                committed_records=summary.records,
                committed_bytes=data_bytes + delete_bytes,
                committed_data_files_record_count=summary.records,
                committed_data_files_byte_count=data_bytes,
                committed_delete_files_record_count=sum(f.record_count for f in outcome.delete_files),
                committed_delete_files_byte_count=delete_bytes,
            )
            self.metrics.set(last_commit_duration_ms=commit_ms)
            self.metrics.committed()
            self._batch.setdefault("committed", []).append(
                {
                    "checkpoint_id": committable.checkpoint_id,
                    "snapshot_id": outcome.snapshot.snapshot_id,
                    "commit_ms": round(commit_ms, 1),
                    "attempts": outcome.attempts,
                }
            )
            snapshot = outcome.snapshot
            result = CommitResult(
                table=self._config.table,
                branch=self._config.branch,
                job_id=self.job_id,
                checkpoint_id=committable.checkpoint_id,
                snapshot_id=snapshot.snapshot_id,
                sequence_number=snapshot.sequence_number or 0,
                operation=snapshot.summary.operation.value if snapshot.summary else "",
                snapshot_summary=dict(snapshot.summary.additional_properties) if snapshot.summary else {},
                checkpoint=summary,
            )
            self.hooks.after_commit(result)
            if self.compaction is not None:
                self.compaction.observe(result, outcome.data_files)
            if self.conversion is not None:
                self.conversion.observe(result)
        if outcome.snapshot is not None:
            logger.info(
                "checkpoint %s committed as snapshot %s: %s data files, %s records",
                committable.checkpoint_id,
                outcome.snapshot.snapshot_id,
                committable.summary.data_files,
                committable.summary.records,
            )
        else:
            # Already in the table, or it only deleted keys that provably do not exist.
            logger.info("checkpoint %s needed no new snapshot; skipped", committable.checkpoint_id)
        return outcome

    def pending_ids(self) -> list[int]:
        """The checkpoint ids of this job's stored committables, oldest first."""
        return self._store.pending_ids()

    def has_pending(self, before: int | None = None) -> bool:
        """Whether a committable (below ``before``) is stored."""
        return any(before is None or c < before for c in self._store.pending_ids())

    def commit_pending(self, before: int | None = None) -> list[CommitOutcome]:
        """Commit stored committables (below ``before``), oldest first, one snapshot each."""
        outcomes = []
        for committable in self._store.pending():
            if before is not None and committable.checkpoint_id >= before:
                continue
            outcomes.append(self._commit(committable))
        self.metrics.set(pending_checkpoints=len(self._store.pending_ids()))
        return outcomes

    # -- catalog outages -------------------------------------------------------------------

    def _outage(self, error: BaseException) -> bool:
        """Whether ``error`` is a catalog outage a stream rides out by keeping checkpoints pending."""
        if not self._streaming or self._table is None:
            return False
        return isinstance(error, (CatalogUnavailableError, CommitStateUnknownError)) or catalog_unreachable(error)

    def _defer(self, checkpoint_id: int, error: BaseException) -> CommitOutcome:
        """Keep checkpoint ``checkpoint_id`` (already stored) pending; fail past the limit."""
        pending = self._store.pending_ids()
        self.metrics.add(deferred_commits=1)
        self.metrics.set(pending_checkpoints=len(pending))
        if len(pending) > self._max_pending:
            raise PendingCheckpointsLimitError(
                f"{len(pending)} checkpoints of table {self._config.table} are pending (oldest: checkpoint "
                f"{pending[0]}, newest: {pending[-1]}) because the catalog is unreachable, more than the limit "
                f"of {self._max_pending} set by {options.MAX_PENDING_CHECKPOINTS.key}; the stream stops. "
                f"Nothing is lost: their committables are kept under {self._store.root} and are committed "
                f"in order, one snapshot each, when the stream restarts with the catalog reachable. "
                f"Last catalog error: {_one_line(error)}"
            ) from error
        logger.warning(
            "catalog unreachable: checkpoint %s of table %s stays pending (%s pending, oldest %s; limit %s): %s",
            checkpoint_id,
            self._config.table,
            len(pending),
            pending[0],
            self._max_pending,
            _one_line(error),
        )
        return CommitOutcome(checkpoint_id, None, already_committed=False, attempts=0, pending=True)

    def _commit_or_defer(self, committable: Committable, table: Table, error: BaseException | None) -> CommitOutcome:
        """Commit ``committable`` now, or keep it pending when the catalog is (or becomes) unreachable."""
        if error is not None:
            return self._defer(committable.checkpoint_id, error)
        try:
            return self._commit(committable, table)
        except CatalogOutage as e:
            return self._defer(committable.checkpoint_id, e.error)

    def next_checkpoint_id(self) -> int:
        table = self.refresh()
        pending = [c.checkpoint_id for c in self._store.pending()]
        return max([self.committer.max_committed(table), *pending]) + 1

    def process(self, df: DataFrame, checkpoint_id: int) -> CommitOutcome | None:
        """Write and commit one checkpoint; see the module docstring for the recovery rules.

        Each call ends with one progress record: kept by the sink (``IcebergSink.progress()``) and
        logged as one JSON line by the ``iceberg_sink.progress`` logger at INFO (docs/metrics.md).
        """
        started = time.monotonic()
        self._batch = {}
        outcome: CommitOutcome | None = None
        error: BaseException | None = None
        try:
            outcome = self._process(df, checkpoint_id)
            return outcome
        except BaseException as e:
            error = e
            raise
        finally:
            duration_ms = (time.monotonic() - started) * 1000
            self.metrics.set(last_checkpoint_duration_ms=duration_ms)
            try:
                self._report(checkpoint_id, outcome, error, duration_ms)
            except Exception:  # reporting never changes what happened to the checkpoint
                logger.exception("progress record of checkpoint %s could not be written", checkpoint_id)

    def _report(
        self, checkpoint_id: int, outcome: CommitOutcome | None, error: BaseException | None, duration_ms: float
    ) -> None:
        """Record and log the progress of micro-batch ``checkpoint_id``."""
        if error is not None:
            status = "failed"
        elif outcome is None:
            status = "empty"
        elif outcome.pending:
            status = "pending"
        elif outcome.snapshot is not None:
            status = "committed"
        else:
            status = "skipped"  # already in the table, or only deletes of keys that do not exist
        batch = self._batch
        commits = batch.get("committed", [])
        own = next((c for c in commits if c["checkpoint_id"] == checkpoint_id), None)
        summary = batch.get("summary")
        progress: dict[str, Any] = {
            "table": self._config.table,
            "branch": self._config.branch,
            "job_id": self.job_id,
            "checkpoint_id": checkpoint_id,
            "status": status,
            "snapshot_id": own["snapshot_id"] if own else None,
            "rows": summary.records if summary else 0,
            "data_files": summary.data_files if summary else 0,
            "delete_files": summary.delete_files if summary else 0,
            "bytes": summary.bytes if summary else 0,
            "equality_deletes": summary.equality_deletes if summary else 0,
            "position_deletes": summary.position_deletes if summary else 0,
            "write_ms": batch.get("write_ms"),
            "commit_ms": own["commit_ms"] if own else None,
            "checkpoint_ms": round(duration_ms, 1),
            "committed_pending": [c["checkpoint_id"] for c in commits if c["checkpoint_id"] != checkpoint_id],
            "error": _one_line(error) if error is not None else None,
        }
        self.metrics.record_progress(progress)
        progress_logger.info("%s", json.dumps(progress, sort_keys=True))

    def _active_spark(self) -> SparkSession:
        spark = self._spark or SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("compaction needs a SparkSession; none is active")
        return spark

    def _process(self, df: DataFrame, checkpoint_id: int) -> CommitOutcome | None:
        _faults.hit(_faults.BATCH_START, checkpoint_id)
        self._spark = df.sparkSession
        plan = self.begin(df.schema, checkpoint_id)
        if plan.done is not None or plan.stored is not None:
            return self.commit_planned(plan)
        spec = plan.spec
        assert spec is not None
        if self._config.changes is not None:
            df = reduce_changes(df, self._config.changes)
        _faults.hit(_faults.BEFORE_WRITE, checkpoint_id)
        write_started = time.monotonic()
        try:
            results = None
            if self._config.changes is None and plan.resolved.get(options.JVM_PARQUET_WRITER):
                results = jvm.write_appends(df, spec, plan.mode)  # None: not provably equivalent here
            if results is None:
                table = plan.table
                sort = [c for c in plan.sort_columns if c]
                results = write_dataframe(
                    distribute(df, plan.mode, table.spec(), table.schema(), sort_columns=sort), spec
                )
        except Exception as e:
            raise self.write_error(e, checkpoint_id) from e
        _faults.hit(_faults.AFTER_WRITE, checkpoint_id)
        self.flushed(results, (time.monotonic() - write_started) * 1000)
        committable = self.stage(plan, results)
        if committable is None:
            return None
        return self.commit_planned(plan, committable)

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
        ``carried``, ``named_keys``: for a routed table, as for :meth:`ensure_table`."""
        # Set while the catalog is unreachable: the batch is written with the table metadata this job
        # loaded last and its commit is deferred. That metadata can only be older than the table's, so
        # the checks below stay sound: a checkpoint it holds is held, and checkpoints after the
        # last one it holds have their committables stored until committed.
        outage: BaseException | None = None
        try:
            table = self.ensure_table(struct, carried, named_keys)
        except Exception as e:
            if not self._outage(e):
                raise
            assert self._table is not None
            outage, table = e, self._table
            self.use_key(table, named_keys)
            table = self._check_input(table, self.own_columns(struct, table, carried))
        if self._schema_changed:
            self._schema_changed = False
            _faults.hit(_faults.AFTER_SCHEMA_CHANGE, checkpoint_id)
        if outage is None:
            committed_pending = []
            try:
                committed_pending = self.commit_pending(before=checkpoint_id)
            except CatalogOutage as e:
                outage = e.error
            if committed_pending and outage is None:
                try:
                    table = self.refresh()
                except Exception as e:
                    if not self._outage(e):
                        raise
                    outage = e
        plan = CheckpointPlan(checkpoint_id=checkpoint_id, table=table, outage=outage)
        committed = self.committer.max_committed(table)
        if checkpoint_id < committed:
            raise CheckpointRewoundError(
                f"stream is at checkpoint {checkpoint_id} but table {self._config.table} already holds checkpoint "
                f"{committed} of job {self.job_id}: the checkpoint location was restored from an older copy. "
                "Restore its latest state, or use a new checkpoint location (a new job) to write again."
            )
        plan.stored = self._store.get(checkpoint_id)
        if plan.stored is not None:
            self._batch["summary"] = plan.stored.summary
        if checkpoint_id == committed and plan.stored is None:
            logger.info("checkpoint %s already committed; replayed batch skipped", checkpoint_id)
            plan.done = CommitOutcome(checkpoint_id, None, already_committed=True, attempts=0)
        if plan.done is not None or plan.stored is not None:
            return plan
        plan.resolved = options.resolve(self._config.options, table.properties)
        if self._config.changes is not None and plan.resolved.get(options.SKIP_DELETES_FOR_NEW_KEYS):
            if self._key_bounds is None:
                self._key_bounds = KeyBoundsCache(self._equality_ids(table))
            plan.proof = self._key_bounds.bounds(table, branch_head(table, self._config.branch))
        plan.spec = self.writer_spec(table, checkpoint_id, plan.proof)
        plan.mode = self._distribution_mode(table, plan.resolved)
        plan.sort_columns = [table.schema().find_column_name(f.source_id) or "" for f in table.sort_order().fields]
        return plan

    def write_error(self, error: Exception, checkpoint_id: int) -> Exception:
        """The error to raise for a failed write of ``checkpoint_id`` (``error`` itself if not a known kind)."""
        return write_error(error, checkpoint_id, f"table {self._config.table}")

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
        self._batch["summary"] = committable.summary
        _faults.hit(_faults.AFTER_STAGE, checkpoint_id)
        self._store.put(committable)
        _faults.hit(_faults.AFTER_MANIFESTS, checkpoint_id)
        plan.stored = committable
        return committable

    def commit_planned(self, plan: CheckpointPlan, committable: Committable | None = None) -> CommitOutcome | None:
        """Commit the checkpoint of ``plan`` (or keep it pending through a catalog outage)."""
        if plan.done is not None:
            return plan.done
        committable = committable or plan.stored
        if committable is None:
            return None
        return self._commit_or_defer(committable, plan.table, plan.outage)

    def flushed(self, results: list[WriteResult], duration_ms: float) -> None:
        """Writer metrics of one checkpoint, from its tasks' results (the writers keep no state)."""
        data = [f for r in results for f in r.data_files]
        deletes = [f for r in results for f in (*r.delete_files, *r.conditional_delete_files)]
        self.metrics.add(
            flushed_data_files=len(data),
            flushed_delete_files=len(deletes),
            flushed_records=sum(f.record_count for f in data),
        )
        self.metrics.set(last_flush_duration_ms=duration_ms)
        self.metrics.flushed((f.file_size_in_bytes for f in data), (f.file_size_in_bytes for f in deletes))
        self._batch["write_ms"] = round(duration_ms, 1)

    def _distribution_mode(self, table: Table, resolved: options.ResolvedOptions) -> DistributionMode:
        if self._config.distribution_mode:
            return DistributionMode(self._config.distribution_mode)
        configured = resolved.get(options.DISTRIBUTION_MODE)
        if configured:
            return DistributionMode(configured)
        # For upserts/CDC the reduction already shuffled rows by key; clustering by partition on top
        # keeps one file per partition and writer.
        return DistributionMode.HASH if table.spec().fields else DistributionMode.NONE

    def writer_spec(self, table: Table, checkpoint_id: int, proof: KeyBounds | None = None) -> WriterSpec:
        resolved = options.resolve(self._config.options, table.properties)
        props: dict[str, Any] = {**table.properties, **resolved.writer_properties()}
        return WriterSpec(
            table_name=self._config.table,
            location=table.location(),
            schema_json=table.schema().model_dump_json(),
            spec_json=table.spec().model_dump_json(),
            io_properties=catalogs.file_io_properties(table.io.properties),
            writer_properties=props,
            job_id=self.job_id,
            checkpoint_id=checkpoint_id,
            target_file_size=resolved.get(options.TARGET_FILE_SIZE_BYTES),
            buffer_bytes=resolved.get(options.WRITER_BUFFER_BYTES),
            max_open_files=resolved.get(options.WRITER_MAX_OPEN_FILES),
            row_group_limit=resolved.get(options.PARQUET_ROW_GROUP_LIMIT),
            compression=resolved.get(options.PARQUET_COMPRESSION),
            compression_level=resolved.get(options.PARQUET_COMPRESSION_LEVEL),
            equality_field_ids=self._equality_ids(table),
            op_column=OP_COLUMN if self._config.changes is not None else None,
            new_key_proof=proof,
        )

    def _equality_ids(self, table: Table) -> tuple[int, ...]:
        if self._config.changes is None:
            return ()
        return tuple(table.schema().find_field(k).field_id for k in self._config.changes.key)


@attrs.define
class CheckpointPlan:
    """One table's checkpoint between :meth:`SinkJob.begin` and :meth:`SinkJob.commit_planned`.

    Attributes:
        checkpoint_id: the checkpoint.
        table: the table as loaded for it (maybe stale while ``outage`` is set).
        outage: the catalog error a stream rides out, or None.
        done: set when the table already holds the checkpoint: nothing to write or commit.
        stored: the persisted committable to commit (stored before a crash, or by :meth:`SinkJob.stage`).
        resolved, proof, spec, mode, sort_columns: how to write it (set when it must be written).
    """

    checkpoint_id: int
    table: Table
    outage: BaseException | None = None
    done: CommitOutcome | None = None
    stored: Committable | None = None
    resolved: options.ResolvedOptions = attrs.field(factory=lambda: options.resolve({}, {}))
    proof: KeyBounds | None = None
    spec: WriterSpec | None = None
    mode: DistributionMode = DistributionMode.NONE
    sort_columns: list[str] = attrs.field(factory=list)


class CatalogOutage(Exception):
    """A stream's commit did not land (or its outcome is unknown) because the catalog is unreachable.

    Raised only around the committer's commit, so a failure after a commit landed (a post-commit
    hook, a compaction) is never taken for an outage.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def write_error(error: Exception, checkpoint_id: int, target: str) -> Exception:
    """The error to raise for a failed write of ``checkpoint_id`` (``error`` itself if not a known kind)."""
    text = str(error)
    if ERROR_MARKER in text:
        # A row was refused inside Spark (null key, unknown op code): nothing was committed.
        detail = text[text.index(ERROR_MARKER) + len(ERROR_MARKER) :].splitlines()[0].strip()
        return InvalidInputError(f"checkpoint {checkpoint_id} of {target} was not written: {detail}")
    failure = task_failure(error)
    if failure is not None:
        return WriteFailedError(
            f"checkpoint {checkpoint_id} of {target} was not written: a writer task failed "
            f"on every attempt: {failure}. Nothing of it was committed; files the failed attempts wrote are "
            "deleted or left unreferenced (remove-orphans deletes them). Fix the cause (for example disk "
            "space or storage permissions) and run again: a restarted stream writes this checkpoint again. "
            "The task's full traceback is in the chained exception and the executor log."
        )
    return error


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
