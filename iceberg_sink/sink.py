"""The public sink: ``start`` a streaming query or ``write`` a bounded DataFrame."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from iceberg_sink import options
from iceberg_sink._session import classic_frame, classic_session
from iceberg_sink._spark_schema import schema_of
from iceberg_sink.builder import IcebergSinkBuilder
from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.committer.routed import RoutedOutcome
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.config import SinkConfig
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.job import checkpoint_files, idle, parallelism, reading
from iceberg_sink.job.binding import NoRowsNoTable
from iceberg_sink.job.dead_letter import DEAD_LETTER_STATE
from iceberg_sink.job.pipeline import SinkJob, dead_letter_table
from iceberg_sink.job.refusal import without_reject
from iceberg_sink.job.routing import RoutedJob
from iceberg_sink.job.together import Together
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.observe.metrics import MetricsSnapshot, SinkMetrics
from iceberg_sink.observe.prometheus import MetricsServer
from iceberg_sink.sources import backlog, kafka_offsets, kafka_source
from iceberg_sink.sources.transactions import CarryStore
from iceberg_sink.table import catalog as catalogs
from iceberg_sink.table.key_bounds import KeyBoundsCache
from iceberg_sink.table.versions import upgrade_format_version
from iceberg_sink.topology import estimate
from iceberg_sink.topology.changes import check_order_by
from iceberg_sink.topology.compaction import CompactionConfig, CompactionResult, compact
from iceberg_sink.topology.compaction.job import Progress
from iceberg_sink.topology.compaction.trigger import CompactionTrigger
from iceberg_sink.topology.conversion import ConversionResult, convert_equality_deletes
from iceberg_sink.topology.conversion.trigger import ConversionTrigger
from iceberg_sink.writer.workers import REQUIRED_MODULES, check_python_workers, start_python_workers

logger = logging.getLogger(__name__)

_TRIGGER_KEYS = ("processingTime", "once", "availableNow", "continuous")
# What a stream's write task imports in its Python workers (started by start(): writer/workers.py):
# the writer's modules and the Debezium row reader's.
_TASK_MODULES = (*REQUIRED_MODULES, "iceberg_sink.writer.spark", "iceberg_sink.sources.arrow_rows")


class IcebergSink:
    """Writes Spark DataFrames into one Iceberg table (or, routed, many) with exactly-once commits.

    Create it with :meth:`builder`. The same sink can start several streams, each with its own
    checkpoint location (each location is its own job id), and write bounded DataFrames.
    """

    def __init__(self, config: SinkConfig) -> None:
        self._config = config
        self._metrics = SinkMetrics()
        self._compaction: CompactionTrigger | None = None
        self._conversion: ConversionTrigger | None = None
        self._prometheus: MetricsServer | None = None
        if config.prometheus is not None:
            self._prometheus = MetricsServer(config.prometheus, self._metrics.snapshot, config.table or "routed")
        self._last_routed: dict[str, CommitOutcome | None] = {}
        # The key indexes of this sink's jobs, whose background writes close() waits for.
        self._key_indexes: weakref.WeakSet[KeyIndex] = weakref.WeakSet()
        # The v3 committers' key index, kept from job to job: each bounded write() is a job of its
        # own, and without it every write() would load or read every indexed file's keys again.
        self._committer_index: KeyIndex | None = None
        # Key bounds per data manifest, for proving ids new: kept across this sink's jobs.
        self._key_bounds = KeyBoundsCache()

    def metrics(self) -> MetricsSnapshot:
        """Counters of every job of this sink: writers, commits, hooks, compactions and conversions.

        ``sink.metrics().flink()`` gives them under the names of Flink's Iceberg sink (docs/metrics.md).
        """
        return self._metrics.snapshot()

    def progress(self) -> list[dict[str, Any]]:
        """Progress records of the newest micro-batches (up to 100), oldest first.

        One per micro-batch, with the same fields as the JSON line the ``iceberg_sink.progress``
        logger writes (docs/metrics.md): read it from a ``StreamingQueryListener``'s
        ``onQueryProgress``, whose ``event.progress.batchId`` is the record's ``checkpoint_id``.
        """
        return self._metrics.progress()

    def last_progress(self) -> dict[str, Any] | None:
        """The progress record of the newest micro-batch, or None before the first."""
        records = self._metrics.progress()
        return records[-1] if records else None

    @property
    def prometheus_port(self) -> int | None:
        """The port the Prometheus endpoint listens on (None without ``.prometheus()``)."""
        return self._prometheus.port if self._prometheus is not None else None

    @property
    def prometheus_url(self) -> str | None:
        """``http://host:port/metrics`` of the Prometheus endpoint (None without ``.prometheus()``)."""
        return self._prometheus.url if self._prometheus is not None else None

    def close(self) -> None:
        """Stop the Prometheus endpoint, if any, and wait for the key index entries being written to
        table storage (keyindex/persisted.py). Running queries are not affected."""
        if self._prometheus is not None:
            self._prometheus.close()
        for index in list(self._key_indexes):
            index.flush()

    @classmethod
    def builder(cls) -> IcebergSinkBuilder[IcebergSink]:
        """Start configuring a sink."""
        return IcebergSinkBuilder(cls)

    @property
    def config(self) -> SinkConfig:
        return self._config

    def load_table(self, table: str | None = None) -> Table:
        """The target table as the catalog has it now (a routed sink's: name it with ``table``)."""
        name = table or self._config.table
        if not name:
            raise InvalidSinkConfigError("load_table(): this sink routes rows to many tables; pass table='ns.name'")
        loaded = catalogs.load_table(self._config.catalog.load(), name)
        if loaded is None:
            raise InvalidSinkConfigError(f"table {name} does not exist yet")
        return loaded

    def _single_table(self, what: str) -> None:
        if self._config.route is not None:
            raise InvalidSinkConfigError(
                f"{what}: this sink routes rows to many tables; run it per table with a single-table sink "
                "(IcebergSink.builder().table(...)) or the iceberg-sink command line"
            )

    def upgrade_format_version(self, format_version: int = 3) -> Table:
        """Upgrade the sink's table to ``format_version`` (3, from 2) in one metadata-only commit, as
        Iceberg Java's ``upgradeFormatVersion`` does; returns the upgraded table (unchanged when it
        already has that version). Existing rows get row ids from the next commit on; delete files
        stay and are still applied (see docs/format-v3.md). Safe beside running streams: a commit
        prepared before the upgrade is prepared again on the v3 table.

        Raises:
            InvalidSinkConfigError: not 3 (nothing is committed).
            UnsupportedTableError: the table is format v1 (upgrade it to 2 first).
        """
        self._single_table("upgrade_format_version()")
        return upgrade_format_version(self.load_table, format_version)

    def compact(
        self,
        spark: SparkSession | None = None,
        config: CompactionConfig | None = None,
        partition_filter: Callable[[int, tuple[Any, ...]], bool] | None = None,
        progress: Progress | None = None,
    ) -> CompactionResult:
        """Compact the sink's table and branch once, now (the standalone compaction job).

        Args:
            spark: the SparkSession to rewrite with (default: the active one).
            config: planning thresholds (defaults: the builder's compaction settings, else CompactionConfig()).
            partition_filter: ``(spec_id, partition values) -> bool`` to compact only some partitions.
            progress: called with (phase, done, total).
        """
        self._single_table("compact()")
        session = spark if spark is not None else SparkSession.getActiveSession()
        if session is None:
            raise InvalidSinkConfigError("compact() needs a SparkSession; pass spark= or start one")
        return compact(
            classic_session(session, "compact(spark)"),
            self.load_table,
            config or self._config.compaction or CompactionConfig(),
            branch=self._config.branch,
            partition_filter=partition_filter,
            progress=progress,
            write_options=self._config.options,
        )

    def _job(self, checkpoint_location: str, ephemeral: bool, streaming: bool = False) -> SinkJob:
        job = SinkJob(
            self._config,
            CheckpointStore(checkpoint_location),
            metrics=self._metrics.for_table(self._config.table),
            ephemeral=ephemeral,
            streaming=streaming,
            compaction=self._compaction,
            conversion=self._conversion,
        )
        job.key_bounds = self._key_bounds
        job.committer.take_key_index(self._committer_index)
        self._committer_index = job.committer.key_index
        self._compaction = job.compaction
        self._conversion = job.conversion
        self._key_indexes.add(job.committer.key_index)
        if job.conversion is not None:
            self._key_indexes.add(job.conversion.index)
        if self._config.dead_letter is not None:
            job.dead_letter = dead = dead_letter_table(
                self._config,
                CheckpointStore(checkpoint_location, DEAD_LETTER_STATE),
                job.job_id,
                self._metrics,
                catalog=job.catalog,
                ephemeral=ephemeral,
                streaming=streaming,
            )
            # The table and its dead-letter table commit each checkpoint together (job/together.py).
            together = Together.of(job.job_id, self._config.atomic_commits, job.catalog, "table and dead-letter table")
            job.together = together.join(self._config.table, job.commits)
            dead.job.together = together.join(dead.name, dead.job.commits)
        return job

    def convert_equality_deletes(self) -> ConversionResult:
        """Convert the equality deletes of the sink's table and branch into position deletes once,
        now (the standalone job; see topology/conversion). Safe beside running streams."""
        self._single_table("convert_equality_deletes()")
        return convert_equality_deletes(
            self.load_table,
            branch=self._config.branch,
            max_replans=self._config.conversion.max_replans if self._config.conversion is not None else 3,
        )

    def await_conversions(self, timeout: float | None = None) -> None:
        """Wait for a background equality-delete conversion started after this sink's commits."""
        if self._conversion is not None:
            self._conversion.wait(timeout)

    def await_compactions(self, timeout: float | None = None) -> None:
        """Wait for a background compaction started after this sink's commits to finish."""
        if self._compaction is not None:
            self._compaction.wait(timeout)

    def start(
        self,
        streaming_df: DataFrame,
        checkpoint_location: str,
        trigger: Mapping[str, Any] | None = None,
        query_name: str | None = None,
    ) -> StreamingQuery:
        """Start a streaming query that commits each micro-batch as one snapshot.

        Args:
            streaming_df: a streaming DataFrame (``spark.readStream...``).
            checkpoint_location: Spark's checkpoint location; the sink keeps its job id and pending
                committables under ``<checkpoint_location>/iceberg_sink``.
            trigger: Spark trigger, e.g. ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``.
            query_name: optional name of the query.

        While the catalog is unreachable the query keeps writing: each micro-batch's files are
        written with the table metadata last loaded and its commit stays pending under the
        checkpoint location, to be committed in order once the catalog answers again, up to
        ``iceberg-sink.commit.max-pending-checkpoints`` (see docs/architecture.md, catalog outages).

        Returns:
            The running :class:`pyspark.sql.streaming.StreamingQuery`.

        Raises:
            WorkerEnvironmentError: Spark's Python workers lack a module the writers need (checked
                once per SparkContext: writer/workers.py).
        """
        streaming_df = classic_frame(streaming_df, "start(streaming_df)")
        if not streaming_df.isStreaming:
            raise InvalidSinkConfigError(
                "start() expects a streaming DataFrame (spark.readStream...); received a bounded one: use write()"
            )
        if not checkpoint_location:
            raise InvalidSinkConfigError("start() needs a checkpoint_location; received an empty value")
        trigger = dict(trigger or {})
        unknown = sorted(set(trigger) - set(_TRIGGER_KEYS))
        if unknown or len(trigger) > 1:
            raise InvalidSinkConfigError(
                f"trigger: expected at most one of {', '.join(_TRIGGER_KEYS)}; received {trigger!r}"
            )
        check_python_workers(streaming_df.sparkSession)
        lacking = kafka_source.lacking_sources(streaming_df)
        if lacking:
            logger.warning(kafka_source.options_hint(lacking))
        if (self._config.reads_debezium or self._config.route is not None) and options.resolve(
            self._config.options, {}
        ).get(options.START_PYTHON_WORKERS):
            # The first micro-batch runs Spark jobs before its write (the Debezium statistics, a
            # routed batch's tables): time for the workers to start beside them (writer/workers.py).
            start_python_workers(streaming_df.sparkSession, _TASK_MODULES)
        if self._config.changes is not None and not self._config.map_batches:
            # The stream's rows are the batches' rows: a missing or unsortable order_by is named now,
            # not by the first micro-batch (with map_batches, per batch).
            check_order_by(schema_of(streaming_df), self._config.changes)
        # A stopped query's idle retry may still be committing this job's pending checkpoints: it
        # finishes before this query starts, and the two share one lock (job/idle.py).
        idle.end_stopped(checkpoint_location)
        if self._config.route is not None:
            routed = RoutedJob(self._config, checkpoint_location, metrics=self._metrics, streaming=True)
            if not self._config.map_batches:
                routed.input_struct(schema_of(streaming_df))  # the route's table column must be there

            routed_lock = idle.batch_lock(checkpoint_location)

            def process_routed(batch: DataFrame, batch_id: int) -> None:
                with routed_lock:
                    here = (checkpoint_location, batch_id, False)
                    reading.read_again_if_stale(
                        self._config,
                        batch,
                        lambda: routed.process(
                            reading.read_batch(self._config, batch, routed.known_tables(), checkpoint=here), batch_id
                        ),
                    )

            query = self._start(streaming_df, process_routed, self._config, checkpoint_location, trigger, query_name)
            self._retry_while_idle(
                query,
                routed_lock,
                routed.has_pending,
                routed.commit_pending,
                self._config.route.describe(),
                checkpoint_location,
            )
            return query
        job = self._job(checkpoint_location, ephemeral=False, streaming=True)
        config = self._config
        if not config.map_batches:
            # Create or check the table before the first batch so schema errors surface now (with
            # map_batches the written schema is known per batch only).
            job.ensure_table(schema_of(streaming_df))
        batch_lock = idle.batch_lock(checkpoint_location)

        def process_batch(batch: DataFrame, batch_id: int) -> None:
            with batch_lock:
                here = (checkpoint_location, batch_id, False)
                reading.read_again_if_stale(
                    config,
                    batch,
                    lambda: job.process(
                        reading.read_batch(config, batch, table=reading.last_loaded(job), checkpoint=here), batch_id
                    ),
                )

        query = self._start(streaming_df, process_batch, self._config, checkpoint_location, trigger, query_name)
        dead = job.dead_letter

        def has_pending() -> bool:
            return job.has_pending() or (dead is not None and dead.has_pending())

        def commit_pending() -> None:
            job.commit_pending()
            if dead is not None:
                dead.commit_pending()

        idle_retry = self._retry_while_idle(
            query,
            batch_lock,
            has_pending,
            commit_pending,
            f"table {config.table}",
            checkpoint_location,
            job.commits.drain,
        )
        if idle_retry and dead is None and job.together is None and not {"once", "availableNow"} & set(trigger):
            # A commit may run beside the next micro-batch (job/lane.py) when a next one follows at
            # once; the idle retry drains it when the query stops.
            job.backlog = lambda: backlog.source_backlog(query)
        return query

    def _retry_while_idle(
        self,
        query: StreamingQuery,
        batch_lock: threading.Lock,
        has_pending: Callable[[], bool],
        commit_pending: Callable[[], object],
        what: str,
        checkpoint_location: str,
        finish: Callable[[], object] | None = None,
    ) -> bool:
        """Commit checkpoints a catalog outage left pending while the stream is idle, and take the
        commit lane's last result when the query stops (``finish``; iceberg_sink/job/idle.py).
        Whether the thread runs (``iceberg-sink.commit.pending-retry-interval-ms`` is not 0)."""
        interval_ms = options.resolve(self._config.options, {}).get(options.PENDING_RETRY_INTERVAL_MS)
        if interval_ms > 0:
            idle.retry_while_idle(
                query, batch_lock, has_pending, commit_pending, interval_ms / 1000, what, checkpoint_location, finish
            )
        return bool(interval_ms > 0)

    @staticmethod
    def _start(
        streaming_df: DataFrame,
        process_batch: Callable[[DataFrame, int], None],
        config: SinkConfig,
        checkpoint_location: str,
        trigger: Mapping[str, Any],
        query_name: str | None,
    ) -> StreamingQuery:
        configured = options.resolve(config.options, {}).get(options.SHUFFLE_PARTITIONS)
        kafka_records = KafkaBatchRecords(CheckpointStore(checkpoint_location, create=False))

        def micro_batch(batch: DataFrame, batch_id: int) -> None:
            # A Kafka micro-batch's records counted from Spark's offset log (topology/estimate.py): Spark
            # has no size estimate of it. Then every shuffle of the micro-batch at the sink's
            # parallelism, not the stream's 200 (job/parallelism.py).
            with estimate.counted(kafka_records(batch_id)), parallelism.micro_batch(batch, configured):
                process_batch(batch, batch_id)

        writer = streaming_df.writeStream.foreachBatch(micro_batch).option("checkpointLocation", checkpoint_location)
        if trigger:
            writer = writer.trigger(**trigger)
        if query_name:
            writer = writer.queryName(query_name)
        with checkpoint_files.starting(streaming_df.sparkSession, checkpoint_location):
            return writer.start()

    def write(
        self, df: DataFrame, checkpoint_location: str | None = None, checkpoint_id: int | None = None
    ) -> CommitOutcome | None:
        """Write a bounded DataFrame as one checkpoint (one snapshot), through the streaming code path.

        Args:
            df: a bounded DataFrame.
            checkpoint_location: where the job id and the committable are kept; a temporary
                directory when omitted (the write is then a job of its own).
            checkpoint_id: with a checkpoint location, makes the write idempotent: a rerun with the
                same id after a crash commits what was staged or skips what is committed. Default:
                one past the job's last checkpoint.

        Returns:
            The commit outcome, or None when ``df`` was empty. A routed sink (``.route(...)``)
            returns a :class:`RoutedOutcome`: a CommitOutcome of the checkpoint as a whole that is
            also a mapping of each table it touched to that table's outcome.

        Raises:
            WorkerEnvironmentError: Spark's Python workers lack a module the writers need.
            WriteFailedError: a writer task failed on every attempt; nothing was committed.
        """
        df = classic_frame(df, "write(df)")
        if df.isStreaming:
            raise InvalidSinkConfigError("write() expects a bounded DataFrame; received a streaming one: use start()")
        check_python_workers(df.sparkSession)
        temporary = checkpoint_location is None
        location = checkpoint_location or tempfile.mkdtemp(prefix="iceberg-sink-")
        try:
            if self._config.route is not None:
                return self._write_routed(df, location, temporary, checkpoint_id)
            job = self._job(location, ephemeral=temporary)

            def next_id() -> int:
                job.commit_pending()
                next_checkpoint = job.next_checkpoint_id()
                if job.dead_letter is not None:
                    # The dead-letter table may hold a checkpoint whose rows were all refused.
                    job.dead_letter.commit_pending()
                    next_checkpoint = max(next_checkpoint, job.dead_letter.next_checkpoint_id())
                return next_checkpoint

            planned_id, here = self._read_at(location, temporary, checkpoint_id, next_id)

            def attempt() -> tuple[CommitOutcome | None, bool]:
                read = reading.read_batch(self._config, df, table=reading.last_loaded(job), checkpoint=here)
                try:
                    job.ensure_table(without_reject(schema_of(read)), batch=read)
                except NoRowsNoTable:
                    if job.dead_letter is None:
                        return None, False  # nothing to create the table for, nothing to commit
                    # Refused rows only, and no table yet: a checkpoint of the dead-letter table alone.
                return job.process(read, planned_id if planned_id is not None else next_id()), True

            outcome, written = reading.read_again_if_stale(self._config, df, attempt)
            if written:
                # The job ends here: its newly indexed keys are in storage before the next job needs them.
                job.committer.key_index.flush()
            return outcome
        finally:
            if temporary:
                shutil.rmtree(location, ignore_errors=True)

    def _read_at(
        self, location: str, temporary: bool, checkpoint_id: int | None, next_id: Callable[[], int]
    ) -> tuple[int | None, tuple[str, int, bool] | None]:
        """A bounded write's checkpoint as its batch is read (``reading.read_batch``'s ``checkpoint``):
        a sink carrying source transactions must know it before reading (its held ones are carried under
        it), one past the newest carry too (a write that held every event committed nothing); the others
        choose it after reading, as before (None)."""
        if checkpoint_id is None and self._config.carries_transactions:
            checkpoint_id = CarryStore(location).next_id(next_id())
        return checkpoint_id, (location, checkpoint_id, temporary) if checkpoint_id is not None else None

    def _write_routed(
        self, df: DataFrame, location: str, temporary: bool, checkpoint_id: int | None
    ) -> RoutedOutcome | None:
        routed = RoutedJob(self._config, location, metrics=self._metrics, ephemeral=temporary)

        def next_id() -> int:
            routed.commit_pending()
            return routed.next_checkpoint_id()

        planned_id, here = self._read_at(location, temporary, checkpoint_id, next_id)

        def attempt() -> tuple[int, dict[str, CommitOutcome | None]]:
            read = reading.read_batch(self._config, df, routed.known_tables(), checkpoint=here)
            routed.input_struct(schema_of(read))
            chosen = planned_id if planned_id is not None else next_id()
            return chosen, routed.process(read, chosen)

        checkpoint_id, outcomes = reading.read_again_if_stale(self._config, df, attempt)
        self._last_routed = outcomes
        # None as for an empty DataFrame when no table was touched (no rows).
        return RoutedOutcome.of(checkpoint_id, outcomes) if outcomes else None

    def last_write_outcomes(self) -> dict[str, CommitOutcome | None]:
        """A routed sink's last write(): the commit outcome of each table it touched (what the
        :class:`RoutedOutcome` that write() returned maps)."""
        return dict(self._last_routed)


class KafkaBatchRecords:
    """The Kafka records each micro-batch of one query reads at most, from Spark's offset log entries
    of it and of the micro-batch before (the first micro-batch: of where its sources started,
    ``sources/<i>/0``; sources/kafka_offsets.py); None when unknown (a source that is not Kafka, an
    entry that cannot be read).

    One read per micro-batch: the entry of the micro-batch before is the one read for it. A query
    whose entry names no Kafka source (its sources never change) is not read again.
    """

    def __init__(self, spark_logs: CheckpointStore) -> None:
        self._logs = spark_logs
        self._last: tuple[int, bytes | None] | None = None  # the newest entry read
        self._kafka: bool | None = None  # whether the query reads Kafka, once an entry said

    def __call__(self, batch_id: int) -> int | None:
        if self._kafka is False:
            return None
        try:
            current = self._logs.spark_offset_log(batch_id)
            if current is not None and self._kafka is None:
                self._kafka = kafka_offsets.end_offsets(current) is not None
            if not self._kafka:
                previous = None
            elif batch_id == 0:  # the first micro-batch: from where each source started
                previous = kafka_offsets.starting_entry(current, self._logs.spark_initial_offsets)
            elif self._last is not None and self._last[0] == batch_id - 1:
                previous = self._last[1]
            else:
                previous = self._logs.spark_offset_log(batch_id - 1)
        except OSError:  # an estimate only: the batch is then sized as Spark sizes it
            return None
        self._last = (batch_id, current)
        return kafka_offsets.records_between(previous, current)
