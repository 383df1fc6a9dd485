"""A routed sink's job: one stream, many tables, each with a single-table sink's guarantees.

    DataFrame ─▶ route column ─▶ SinkJob.begin per table (the plan) ─▶ the road (road.py): ONE
        write pass for all tables ─▶ every committable persisted ─▶ SinkJob.commit_planned per table

Each row names its table in the route column (``.route(table_column=...)``, or ``.route(fn)``
applied as an Arrow-optimized Python UDF); names without a namespace get the route's namespace.
Every routed table is driven by its own :class:`~iceberg_sink.job.pipeline.SinkJob`, built from the
sink's configuration with ``table`` set to it, so a routed table goes through exactly the per-table
steps of a single-table sink: creation or checks (``ensure_table``), pending commits, the replay and
rewind checks, writer specs, aggregation, persistence and the idempotent commit.

State under the checkpoint location: ``iceberg_sink/job.json`` holds the job id, shared by every
table (each snapshot's summary names it and the checkpoint id), and each table has its own
:class:`~iceberg_sink.committer.store.CheckpointStore` under ``iceberg_sink/tables/<table>/``
holding its pending committables and the UUID of the table it writes.

Exactly-once per table, for a micro-batch N (the single-table argument of pipeline.py, per table):

1. ``begin`` runs for every table of the batch: it commits the table's stored committables below N,
   and decides whether the table already holds N (a replay after a crash that followed its commit:
   nothing is written again), has a committable of N stored (committed as is), or needs N written.
   Tables with state but no rows in this batch get their committables below N committed too.
2. The rows of the tables that need writing are written in one Spark job (writer/multi.py); every
   table's committable is persisted before any table is committed.
3. Each table is committed on its own: up to ``iceberg-sink.route.commit-threads`` tables at once
   (8; 1 commits them one after another, in name order), then the dead-letter table. A crash while
   tables commit leaves each of them either committed (its snapshot holds N) or stored: the replay of
   N skips the first kind and commits the second's committable. Hooks and maintenance triggers of
   the tables run one at a time. A table whose commit fails (the catalog refuses, the table
   was dropped) does not stop the others' commits; its committable stays stored, and the error is
   raised once every table was tried.
4. A table dropped, or dropped and re-created, by someone else since the job first wrote to it is a
   clear error naming it: its UUID is recorded in its state and compared on every checkpoint (the
   committer also refuses committables written for another UUID).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import attrs
from pyiceberg.catalog import Catalog
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from iceberg_sink import _faults, options
from iceberg_sink._spark_schema import built, columns_of, schema_of
from iceberg_sink._sql import named
from iceberg_sink.committer.committer import CommitOutcome
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.config import RouteConfig, SinkConfig
from iceberg_sink.errors import InvalidInputError, SchemaMismatchError
from iceberg_sink.job import road
from iceberg_sink.job.dead_letter import DeadLetterTable
from iceberg_sink.job.pipeline import CommitDeferred, SinkJob, dead_letter_table
from iceberg_sink.job.plan import BatchPlan, CheckpointPlan, Sizes
from iceberg_sink.job.refusal import enforce, refuse_routed_to
from iceberg_sink.job.source_ledger import SourceLedger
from iceberg_sink.job.together import Committed, Together, each_table, raise_first
from iceberg_sink.job.writing import failure
from iceberg_sink.observe import progress
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.sources.rejects import reject_mark, reject_where
from iceberg_sink.table import catalog as catalogs
from iceberg_sink.table.carried import Path, count_column, leaf_paths
from iceberg_sink.table.keys import check_key_column, key_names
from iceberg_sink.table.names import allowed, known_names, table_name_problem, table_name_refusal
from iceberg_sink.topology.changes import carries_truncates, fits_one_task, is_truncate
from iceberg_sink.vocab.columns import MARK_COLUMNS, REJECT_COLUMN, ROUTE_COLUMN, SOURCE_COLUMN
from iceberg_sink.writer.spark import refused_input

logger = logging.getLogger("iceberg_sink")


def route_marker(route: RouteConfig) -> str:
    """What the job file of a routed sink's checkpoint location names instead of one table."""
    return f"<{route.describe()}>"


def _route_udf(fn: Callable[[Any], Any]) -> Callable[[Column], Column]:
    def call(row: Row) -> str | None:
        value = fn(row)
        if value is None:
            return None
        if not isinstance(value, str):
            raise TypeError(f"the route function returned {value!r} ({type(value).__name__}); expected a table name")
        return value

    return F.udf(call, "string", useArrow=True)  # type: ignore[return-value]


def route_column(df: DataFrame, route: RouteConfig, known: Iterable[str] = ()) -> DataFrame:
    """``df`` with :data:`ROUTE_COLUMN` holding each row's table name, namespace added where missing;
    the input's table column (if routed by one) is dropped: it is not written to the tables.

    A row whose name breaks the table-name rule or is outside what the route may write (its
    namespace, or ``allow``: table/names.py) is refused (sources/rejects.py), naming its table;
    ``known``: names already accepted for this route (:meth:`RoutedJob.known_tables`), checked by a
    set lookup instead of the rule. ``df`` is returned as is when it already has the column
    (job/reading.read_batch added it)."""
    columns = columns_of(df)  # asked once
    if ROUTE_COLUMN in columns:
        return df
    if route.table_column is not None and route.table_column not in columns:
        raise SchemaMismatchError(
            route_marker(route),
            [f"{route.table_column}: the column given to .route(table_column=...) is missing from the DataFrame"],
        )
    accepted = tuple(sorted(known))
    # The same Columns serve every batch of the same columns and known tables (about 0.2 s of Py4J
    # calls per micro-batch of a routed Debezium stream when built each time).
    name, mark = built(
        df.sparkSession, ("route", route, tuple(columns), accepted), lambda: _route_columns(route, columns, accepted)
    )
    routed = df.withColumn(ROUTE_COLUMN, name).withColumn(REJECT_COLUMN, mark)
    return routed.drop(route.table_column) if route.table_column is not None else routed


def _route_columns(route: RouteConfig, columns: list[str], known: tuple[str, ...]) -> tuple[Column, Column]:
    """:func:`route_column`'s two Columns: each row's table name, and its refusal mark (the rows
    whose name breaks the rule, or names a table outside what the route may write)."""
    if route.table_column is not None:
        name = named(route.table_column).cast("string")
    else:
        assert route.fn is not None
        name = _route_udf(route.fn)(F.struct(*[named(c) for c in columns if c != REJECT_COLUMN]))
    if route.namespace is not None:
        name = F.when(name.contains("."), name).otherwise(F.concat(F.lit(route.namespace + "."), name))
    column = F.col(ROUTE_COLUMN)
    # The event as received: a Kafka record's value, else the row as JSON (for a dead-letter table).
    inputs = [named(c) for c in columns if c != REJECT_COLUMN]
    raw = F.col("value") if "value" in columns else F.to_json(F.struct(*inputs))
    refusal = table_name_refusal(column, route.namespace, route.allow, known)
    return name, reject_mark([*columns, ROUTE_COLUMN], refusal, InvalidInputError.__name__, raw, source_table=column)


def check_table_names(names: list[str | None], route: RouteConfig) -> list[str]:
    """The routed table names of one batch, or a clear error for a name no table can have (rows
    naming one were refused by :func:`route_column` already: this is the driver's second look)."""
    problems = []
    if None in names:
        problems.append("some rows name no table (null)")
    for name in names:
        if name is None:
            continue
        problem = table_name_problem(name)
        if problem is None and not allowed(name, route.namespace, route.allow):
            problem = f"table {name!r} is outside what the route may write"
        if problem is not None:
            problems.append(problem)
    if problems:
        raise InvalidInputError(f"rows routed by {route.describe()}: " + "; ".join(problems[:10]))
    return sorted(n for n in names if n is not None)


@attrs.frozen
class Carried:
    """What a routed batch's rows say of its tables (:func:`carried_columns`)."""

    columns: dict[str | None, frozenset[tuple[str, ...]]]  # paths of the columns non-null in some row
    keys: dict[str, set[tuple[str, ...]]]  # the distinct keys the rows name
    rowless: set[str]  # tables whose rows are all truncates


@attrs.frozen
class _Group:
    table: str | None
    source: str | None
    paths: frozenset[tuple[str, ...]]
    keys: frozenset[tuple[str, ...]]
    changes: int


@attrs.frozen
class Groups:
    """One grouped aggregation of a routed batch, per table and (rows carrying one) Debezium source."""

    groups: tuple[_Group, ...]

    def sources(self) -> dict[str, set[str]]:
        """Each table's sources."""
        found: dict[str, set[str]] = {}
        for g in self.groups:
            if g.table is not None and g.source is not None:
                found.setdefault(g.table, set()).add(g.source)
        return found

    def carried(self, leave_out: Collection[tuple[str, str]] = ()) -> Carried:
        """The groups' tables, their rows of the (table, source) pairs ``leave_out`` (refused) left out."""
        columns: dict[str | None, set[tuple[str, ...]]] = {}
        keys: dict[str, set[tuple[str, ...]]] = {}
        changes: dict[str, int] = {}
        for g in self.groups:
            if g.table is not None and g.source is not None and (g.table, g.source) in leave_out:
                continue
            columns.setdefault(g.table, set()).update(g.paths)
            if g.table is not None:
                keys.setdefault(g.table, set()).update(g.keys)
                changes[g.table] = changes.get(g.table, 0) + g.changes
        return Carried(
            columns={t: frozenset(p) for t, p in columns.items()},
            keys=keys,
            rowless={t for t, n in changes.items() if not n},
        )


@attrs.frozen(eq=False)  # Columns compare as Columns: never compared
class CarriedCounts:
    """The aggregates of :func:`carried_columns`: Columns that name columns only, so the same serve
    every batch of the same schema (built once: :meth:`RoutedJob.plan`)."""

    paths: tuple[Path, ...]
    counts: tuple[Column, ...]
    keys: bool  # whether ``counts`` collect the keys rows name (as "keys")


def carried_counts(struct: StructType, key_expr: Column | None = None, truncate: Column | None = None) -> CarriedCounts:
    """:func:`carried_columns`'s aggregates: the leaves of ``struct`` counted, the keys ``key_expr``
    names collected (the key column as an array of names, table/keys.py), and the rows that are not
    truncates counted (``truncate``: true for a truncate, topology/changes.py)."""
    paths = tuple(leaf_paths(struct))
    counts = [F.count(F.lit(1)).alias("rows"), *[count_column(p).alias(f"c{i}") for i, p in enumerate(paths)]]
    if key_expr is not None:
        counts.append(F.collect_set(key_expr).alias("keys"))
    counts.append(F.sum((~truncate if truncate is not None else F.lit(True)).cast("long")).alias("changes"))
    return CarriedCounts(paths=paths, counts=tuple(counts), keys=key_expr is not None)


def carried_columns(routed: DataFrame, counted: CarriedCounts) -> Groups:
    """The batch's tables, each with the paths of the struct's columns and nested fields (through
    structs, list elements and map values) non-null in at least one of its rows (table/carried.py),
    the distinct keys its rows name, whether its rows are all truncates, per table and, when rows
    carry their Debezium source (SOURCE_COLUMN), per source: one grouped aggregation (one small
    Spark job) of ``counted`` (:func:`carried_counts`), whatever the number of tables."""
    paths = counted.paths
    by_source = SOURCE_COLUMN in columns_of(routed)
    grouping = [ROUTE_COLUMN, *([SOURCE_COLUMN] if by_source else [])]
    rows = routed.groupBy(*grouping).agg(*counted.counts).collect()
    return Groups(
        tuple(
            _Group(
                table=r[0],
                source=r[1] if by_source else None,
                paths=frozenset(p for i, p in enumerate(paths) if r[f"c{i}"]),
                keys=frozenset(tuple(k) for k in r["keys"]) if counted.keys and r[0] is not None else frozenset(),
                changes=r["changes"] or 0,
            )
            for r in rows
        )
    )


class RoutedJob:
    """The driver-side state of one routed job: one checkpoint location, one SinkJob per table."""

    def __init__(
        self,
        config: SinkConfig,
        checkpoint_location: str,
        catalog: Catalog | None = None,
        metrics: SinkMetrics | None = None,
        ephemeral: bool = False,
        streaming: bool = False,
    ) -> None:
        assert config.route is not None
        self._config = config
        self._route = config.route
        self._location = checkpoint_location
        self._root = CheckpointStore(checkpoint_location)
        self.job_id = self._root.job_id(route_marker(config.route))
        self._catalog = catalog or config.catalog.load()
        self.metrics = metrics or SinkMetrics()
        self._ephemeral = ephemeral
        self._streaming = streaming
        self.jobs: dict[str, SinkJob] = {}
        self._known: tuple[int, frozenset[str]] = (-1, frozenset())  # (len(jobs) when computed, names)
        # Tables of a checkpoint commit on several threads; their hooks and maintenance triggers
        # (user code, inline compactions) run one at a time under this lock.
        self._serial = threading.Lock()
        self._threads = options.resolve(config.options, {}).get(options.ROUTE_COMMIT_THREADS)
        # A checkpoint's tables commit in one catalog transaction where the catalog can (job/together.py).
        self.together = Together.of(self.job_id, config.atomic_commits, self._catalog, "routed tables", self._threads)
        # Tables that may have stored committables: every table with state at start, then those a
        # micro-batch left pending or failed to commit. Only these are looked at between batches,
        # so a batch touching few of many tables does not list every table's state (one LIST request
        # per table on an object store); a table of the batch commits its own first (SinkJob.begin).
        self._maybe_pending: set[str] = set()
        # The dead-letter table (.dead_letter) is one more table of each checkpoint (job/dead_letter.py).
        self.dead_letter: DeadLetterTable | None = None
        tables = self._root.table_folders()
        # Each routed table holds one Debezium source (job/source_ledger.py): checked before anything runs.
        self._ledger = SourceLedger(checkpoint_location, config.route) if config.route.debezium_sources else None
        if self._ledger is not None:
            self._ledger.check_start(t for t in tables if t != config.dead_letter)
        for table in tables:
            self.job(table)
            self._maybe_pending.add(table)
        if config.dead_letter is not None:
            self.job(config.dead_letter)

    def job(self, table: str) -> SinkJob:
        """The SinkJob of one routed table (created on first use)."""
        job = self.jobs.get(table)
        if job is None and table == self._config.dead_letter:
            self.dead_letter = dead_letter_table(
                self._config,
                CheckpointStore.for_table(self._location, table),
                self.job_id,
                self.metrics,
                catalog=self._catalog,
                ephemeral=self._ephemeral,
                streaming=self._streaming,
            )
            job = self.jobs[table] = self.dead_letter.job
            self._join(table, job)
        if job is None:
            job = SinkJob(
                attrs.evolve(self._config, table=table, route=None, dead_letter=None),
                CheckpointStore.for_table(self._location, table),
                catalog=self._catalog,
                metrics=self.metrics.for_table(table),  # the sink's counters, and this table's
                ephemeral=self._ephemeral,
                streaming=self._streaming,
                job_id=self.job_id,
                pin_table_uuid=True,
                serial=self._serial,
            )
            self.jobs[table] = job
            self._join(table, job)
        return job

    def _join(self, table: str, job: SinkJob) -> None:
        job.together = self.together.join(table, job.commits)

    def known_tables(self) -> frozenset[str]:
        """The routed tables this job knows (a batch routed rows to them, or they have checkpoint
        state) that the route may write, by the Python twin of the name rule (table/names.py): a
        batch's rows naming one skip the rule's per-row check (``route_column``)."""
        if self._known[0] != len(self.jobs):
            names = (t for t in self.jobs if t != self._config.dead_letter)
            self._known = (len(self.jobs), known_names(names, self._route.namespace, self._route.allow))
        return self._known[1]

    def input_struct(self, struct: StructType) -> StructType:
        """The part of the input each table receives (the route's table column is not written)."""
        if (
            self._route.table_column is not None
            and self._route.table_column not in struct.fieldNames()
            and ROUTE_COLUMN not in struct.fieldNames()  # routed by job/reading.read_batch
        ):
            raise SchemaMismatchError(
                route_marker(self._route),
                [f"{self._route.table_column}: the column given to .route(table_column=...) is missing"],
            )
        changes = self._config.changes
        skip = {
            self._route.table_column,
            ROUTE_COLUMN,
            *MARK_COLUMNS,
            changes.key_column if changes is not None else None,
        }
        return StructType([f for f in struct.fields if f.name not in skip])

    def commit_pending(self, before: int | None = None, skip: frozenset[str] = frozenset()) -> None:
        """Commit the stored committables of every known table (not in ``skip``, unless the tables
        commit atomically: then every table's, checkpoint by checkpoint), oldest first per table."""
        if self.together.atomic:
            tables = [t for t in sorted(self._maybe_pending) if self._still_pending(t, before)]
            try:
                self.together.commit_pending(before, tables)
            except CommitDeferred as e:
                logger.warning("tables %s: pending checkpoints stay pending: %s", ", ".join(tables), e.error)
            finally:
                for table in tables:
                    self._still_pending(table, None)
            return
        tables = [t for t in sorted(self._maybe_pending - skip) if self._still_pending(t, before)]
        failures = []
        for table, _, error in each_table(tables, lambda t: self.jobs[t].commit_pending(before=before), self._threads):
            if isinstance(error, CommitDeferred):
                # The catalog is unreachable or other writers won every attempt: the table's
                # checkpoints stay pending, committed in order by a later micro-batch (as a
                # single-table stream's are).
                logger.warning("table %s: pending checkpoints stay pending: %s", table, error.error)
            elif error is not None:
                failures.append((table, error))
            elif not self.jobs[table].has_pending():
                self._maybe_pending.discard(table)
        raise_first(failures)

    def _still_pending(self, table: str, before: int | None) -> bool:
        """Whether ``table`` has a stored committable (below ``before``); forgets tables with none."""
        job = self.jobs[table]
        if job.has_pending(before):
            return True
        if not job.has_pending():
            self._maybe_pending.discard(table)
        return False

    def has_pending(self) -> bool:
        """Whether some table may have a stored committable (iceberg_sink/job/idle.py asks between batches)."""
        return any(self.jobs[t].has_pending() for t in sorted(self._maybe_pending))

    def next_checkpoint_id(self) -> int:
        """One past the newest checkpoint any table of this job holds or has stored."""
        return max([0, *(job.next_checkpoint_id() for job in self.jobs.values())])

    def process(self, df: DataFrame, checkpoint_id: int) -> dict[str, CommitOutcome | None]:
        """Write and commit one checkpoint to every table its rows are routed to; see the module docstring."""
        _faults.hit(_faults.BATCH_START, checkpoint_id)
        started, read_ms = progress.take_read()  # the batch's read, just before, is part of its checkpoint_ms
        struct = self.input_struct(schema_of(df))
        routed = route_column(df, self._route, self.known_tables())
        if self.dead_letter is not None:
            routed = refuse_routed_to(routed, ROUTE_COLUMN, self.dead_letter.name)
        routed = routed.persist()
        batch: BatchPlan | None = None
        done: list[Committed] = []
        error: BaseException | None = None
        try:
            batch, rows = self.plan(routed, struct, checkpoint_id)
            if read_ms:
                batch.progress["phases_ms"] = {**read_ms, **batch.progress.get("phases_ms", {})}
            done = road.run(rows, batch)
            return self._committed(done)
        except BaseException as e:
            # As for one table (job/pipeline.py): a row refused inside any Spark action of the batch.
            refused = refused_input(e, checkpoint_id, self._route.describe())
            error = refused or e
            if refused is not None:
                raise refused from e
            raise
        finally:
            routed.unpersist()
            if batch is not None:
                self._report(batch, done, error, (time.monotonic() - started) * 1000)

    def plan(self, routed: DataFrame, struct: StructType, checkpoint_id: int) -> tuple[BatchPlan, DataFrame]:
        """Stage 2 of the road (road.py) for the tables ``routed``'s rows name (``struct``: the
        columns they get) and the dead-letter table: each table's plan, and the rows to write."""
        # Per-table keys (table/keys.py): the keys each table's rows name in the key column.
        key_column = self._config.changes.key_column if self._config.changes is not None else None
        schema = schema_of(routed)
        if key_column is not None:
            check_key_column(schema, key_column)  # a missing key column or one of another type is named now
        # Refused rows (sources/rejects.py) plan no table: they fail the batch or go to the dead-letter table.
        good = routed.where(F.col(REJECT_COLUMN).isNull()) if REJECT_COLUMN in columns_of(routed) else routed
        changes = self._config.changes
        truncates = changes is not None and carries_truncates(routed, changes)

        def counts() -> CarriedCounts:
            names_of_key = key_names(schema, key_column) if key_column is not None else None
            truncate = is_truncate(changes) if changes is not None and truncates else None
            return carried_counts(struct, names_of_key, truncate)

        # The same aggregates serve every batch of the same schema: built once (a Py4J call or more
        # per column and nested field).
        op_column = changes.op_column if changes is not None else None
        counted = built(
            routed.sparkSession, ("carried", schema.json(), struct.json(), key_column, truncates, op_column), counts
        )
        sizes = Sizes.of(options.resolve(self._config.options, {}))
        # A small batch is counted in one task: one stage, without the aggregation's shuffle (as its
        # reduction and write run, topology/changes.py).
        counted_rows = good.coalesce(1) if fits_one_task(good, sizes.single_task_max_bytes) else good
        try:
            groups = carried_columns(counted_rows, counted)
            refused = self._ledger.foreign(groups.sources()) if self._ledger is not None else {}
            found = groups.carried(leave_out=refused)
            carried, named, rowless = found.columns, found.keys, found.rowless
            if not carried and self.dead_letter is None and good is not routed:
                enforce(routed, dead_letter=False).count()  # every row was refused: the first fails the batch
        except Exception as e:
            raise failure(e, checkpoint_id, self._route.describe(), routed=True) from e
        if refused:
            routed = self._refuse_sources(routed, refused)
        names = check_table_names(list(carried), self._route)
        # A table the batch only truncates has nothing to write when it does not exist yet.
        absent = {t for t in rowless if t not in self.jobs and catalogs.load_table(self._catalog, t) is None}
        if absent:
            names = [t for t in names if t not in absent]
            routed = routed.where(~F.coalesce(F.col(ROUTE_COLUMN).isin(*sorted(absent)), F.lit(False)))
        if key_column is not None:
            routed = routed.drop(key_column)
        self.commit_pending(before=checkpoint_id, skip=frozenset(names))
        plans: dict[str, CheckpointPlan] = {}
        for table in names:
            job = self.job(table)
            job.start_record()  # this batch's progress record of the table (_report)
            job._spark = routed.sparkSession
            job.binding.no_rows = (lambda: True) if table in rowless else None
            # Each table sees its own columns only (TableBinding.own_columns): creation and schema
            # evolution never take another table's columns; its writer ignores the others (all null).
            plans[table] = job.begin(struct, checkpoint_id, carried=carried[table], named_keys=named.get(table, ()))
        dead = self.dead_letter
        batch = BatchPlan(
            checkpoint_id=checkpoint_id,
            job_id=self.job_id,
            jobs=self.jobs,
            plans=plans,
            changes=changes,
            describe=self._route.describe(),
            route_column=ROUTE_COLUMN,
            dead=dead,
            dead_plan=dead.begin(checkpoint_id) if dead is not None else None,
            distribution_mode=self._config.distribution_mode,
            sizes=sizes,
            commit_threads=self._threads,
            metrics=self.metrics,
            together=self.together,
        )
        return batch, routed

    def _report(self, batch: BatchPlan, done: list[Committed], error: BaseException | None, duration_ms: float) -> None:
        """One progress record per table of the batch, the dead-letter table's included (docs/metrics.md):
        each with its own outcome, summary and commits, and the batch's phases and duration."""
        results = {table: (outcome, failure) for table, outcome, failure in done}
        tables = [*batch.plans, *([batch.dead.name] if batch.dead is not None and batch.dead_plan is not None else [])]
        for table in tables:
            job = self.jobs[table]
            outcome, failure = results.get(table, (None, None))
            progress.report(
                self.metrics,
                table=table,
                branch=self._config.branch,
                job_id=self.job_id,
                checkpoint_id=batch.checkpoint_id,
                outcome=outcome,
                error=failure if table in results else error,
                duration_ms=duration_ms,
                summary=job.batch_record.get("summary"),
                write_ms=job.batch_record.get("write_ms"),
                committed=job.commits.committed,
                **progress.road(batch.progress),
                dead_letter_records=batch.progress.get("dead_letter_records", 0)
                if table == self._config.dead_letter
                else 0,
            )

    def _refuse_sources(self, routed: DataFrame, refused: dict[tuple[str, str], str]) -> DataFrame:
        """Refuse the rows of each (table, source) pair of ``refused`` (job/source_ledger.py): marked
        for the dead-letter table, else the batch fails naming them, before anything is committed."""
        if self.dead_letter is None:
            raise InvalidInputError(
                f"rows routed by {self._route.describe()}: " + "; ".join(list(refused.values())[:10])
            )
        reason = F.lit(None).cast("string")
        for (table, source), why in refused.items():
            hit = (F.col(ROUTE_COLUMN) == F.lit(table)) & (F.col(SOURCE_COLUMN) == F.lit(source))
            reason = F.when(hit, F.lit(why)).otherwise(reason)
        raw = F.to_json(F.struct(*[named(c) for c in columns_of(routed) if c not in (REJECT_COLUMN, ROUTE_COLUMN)]))
        return reject_where(routed, reason, InvalidInputError.__name__, raw, source_table=F.col(ROUTE_COLUMN))

    def _committed(self, done: list[Committed]) -> dict[str, CommitOutcome | None]:
        """Each table's outcome; tables whose commit failed or stays pending are looked at again later."""
        outcomes: dict[str, CommitOutcome | None] = {}
        failures = []
        for table, outcome, error in done:
            if error is not None:
                failures.append((table, error))
                self._maybe_pending.add(table)
                continue
            outcomes[table] = outcome
            if outcome is not None and outcome.pending:
                self._maybe_pending.add(table)
            else:
                self._maybe_pending.discard(table)
        raise_first(failures)
        return outcomes
