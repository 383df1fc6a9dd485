"""The one place refused rows are decided: fail the batch, or write them to a dead-letter table.

A check that can refuse a single row marks it with ``reject_where`` (sources/rejects.py): Debezium
conversion, a null key or an unknown operation code (topology/changes.py), a routing rule, a
``map_batches`` function. :func:`enforce` runs once per batch, right before the rows reach the
writers, on every path (single-table and routed):

* without ``.dead_letter(...)``: the first refused row fails the batch's Spark job (fail-fast,
  reported as InvalidInputError before anything is committed);
* with ``.dead_letter("ns.errors")``: the refusal column is kept, and each writer task splits the
  rows it receives: good rows go to the table's writer, refused rows (and rows whose value does not
  fit the table, found by the task) to a second writer of the dead-letter table, in the same Spark
  job. No extra Spark job runs when no row is refused.

Exactly once. The dead-letter table is one more table of the checkpoint, driven by its own
:class:`~iceberg_sink.job.pipeline.SinkJob` (state under ``<checkpoint>/iceberg_sink/dead_letter``,
or a routed sink's ``iceberg_sink/tables/<errors table>``), sharing the sink's job id. Its
committable is persisted with the others before any table is committed, and each table's commit is
idempotent (its snapshots name the job id and checkpoint id). After a crash, a replay of checkpoint N:

* commits whatever committable of N is stored (the good table's, the dead-letter table's, both);
* skips a table that already holds N;
* writes again only the tables that neither hold N nor have it stored. A table whose committable was
  stored is never written again: the good rows are dropped in the task when only the dead-letter
  rows are missing, and the refused rows when only the good ones are.

So a kill before, between or after the two commits ends with each good row in its table and each
refused row in the dead-letter table exactly once.

The dead-letter table (created when missing, format version 2, partitioned by ``day(dead_lettered_at)``):

=================  ==============  ==================================================================
column             type            what
=================  ==============  ==================================================================
reason             string          why the row was refused
error_class        string          which check refused it (``NullKeyError``, ``DebeziumEventError``...)
source_table       string          the table the row was meant for (a routed sink: the row's table)
event              string          the Kafka coordinates, else the value's first 200 characters
raw                string          the value as received (Debezium: the event; else the row as JSON)
kafka_topic        string          Kafka topic, when the batch has Kafka's columns
kafka_partition    int             Kafka partition
kafka_offset       long            Kafka offset
job_id             string          the sink's job id (the checkpoint location's)
checkpoint_id      long            the checkpoint (micro-batch) that refused it
dead_lettered_at   timestamptz     when the checkpoint began writing, on the driver
=================  ==============  ==================================================================
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink import _faults, _task_faults
from iceberg_sink._sql import named
from iceberg_sink.config import CreateOptions, SinkConfig
from iceberg_sink.observe.metrics import SinkMetrics
from iceberg_sink.sources.rejects import REJECT_COLUMN, fail_on_reject
from iceberg_sink.sources.toast import UNAVAILABLE_COLUMN
from iceberg_sink.table.partitioning import parse_terms
from iceberg_sink.writer.conform import repaired_utf8
from iceberg_sink.writer.multi import MultiTableTaskWriter
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_writer import TaskWriter

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from iceberg_sink.committer.committer import CommitOutcome
    from iceberg_sink.committer.store import CheckpointStore
    from iceberg_sink.job.pipeline import CheckpointPlan, SinkJob

logger = logging.getLogger("iceberg_sink")

#: The columns of a dead-letter table (see the module docstring), as the writers receive them.
DEAD_LETTER_STRUCT = T.StructType(
    [
        T.StructField("reason", T.StringType(), True),
        T.StructField("error_class", T.StringType(), True),
        T.StructField("source_table", T.StringType(), True),
        T.StructField("event", T.StringType(), True),
        T.StructField("raw", T.StringType(), True),
        T.StructField("kafka_topic", T.StringType(), True),
        T.StructField("kafka_partition", T.IntegerType(), True),
        T.StructField("kafka_offset", T.LongType(), True),
        T.StructField("job_id", T.StringType(), True),
        T.StructField("checkpoint_id", T.LongType(), True),
        T.StructField("dead_lettered_at", T.TimestampType(), True),
    ]
)
#: How a dead-letter table is partitioned when the sink creates it.
DEAD_LETTER_PARTITION_BY = ("day(dead_lettered_at)",)
#: Where a single-table sink keeps the dead-letter table's state under its checkpoint location.
DEAD_LETTER_STATE = "iceberg_sink/dead_letter"

#: error_class of a row holding null in a column its table requires.
REQUIRED_NULL_CLASS = "RequiredColumnNullError"


def without_reject(struct: T.StructType) -> T.StructType:
    """``struct`` without the refusal column and the unavailable-columns marker (sources/toast.py):
    neither is ever stored in a table."""
    if REJECT_COLUMN not in struct.fieldNames() and UNAVAILABLE_COLUMN not in struct.fieldNames():
        return struct
    return T.StructType([f for f in struct.fields if f.name not in (REJECT_COLUMN, UNAVAILABLE_COLUMN)])


def enforce(df: DataFrame, dead_letter: bool) -> DataFrame:
    """The one enforcement point, right before the writers: fail-fast without a dead-letter table
    (the refusal column is dropped), else the refusal column stays for the writer tasks to split on."""
    if not dead_letter:
        return fail_on_reject(df)
    return df


def required_columns(table: Table) -> tuple[str, ...]:
    """The top-level columns ``table`` requires: with a dead-letter table a DataFrame column that may
    be null can feed one (each null is refused per row by :func:`refuse_required_nulls`)."""
    return tuple(f.name for f in table.schema().fields if f.required)


def refuse_required_nulls(
    df: DataFrame, tables: Mapping[str, Schema], op_column: str | None, route_column: str | None = None
) -> DataFrame:
    """Mark the rows holding null in a top-level column their table requires (a delete needs its
    key only, a truncate nothing; a null key is the change rules' refusal). With a dead-letter table such a row is
    refused alone instead of failing its whole batch in the writer (writer/conform.py). Checked in
    Spark before changes are reduced, so an older change of the key in the batch still applies.
    ``tables``: each table's schema by name; ``route_column``: a routed sink's table column."""
    from iceberg_sink.sources.rejects import reject_where
    from iceberg_sink.topology.changes import DELETE_CODES, TRUNCATE_CODES

    groups: dict[tuple[str, ...], list[str]] = {}
    for name, schema in sorted(tables.items()):
        keys = set(schema.identifier_field_ids)
        required = tuple(
            f.name for f in schema.fields if f.required and f.field_id not in keys and f.name in df.columns
        )
        if required:
            groups.setdefault(required, []).append(name)
    if not groups:
        return df
    table = F.col(route_column) if route_column is not None else F.lit(next(iter(tables)))
    reason: Column | None = None
    for required, names in groups.items():
        for column in required:
            found = named(column).isNull()
            if route_column is not None:
                found = found & F.col(route_column).isin(*names)
            text = F.concat(F.lit(f"column {column!r} is required (not null) in table "), table, F.lit(" but is null"))
            here = F.when(found, text)
            reason = here if reason is None else F.coalesce(reason, here)
    assert reason is not None
    if op_column is not None and op_column in df.columns:
        op = named(op_column).cast("string")
        reason = F.when(~F.coalesce(op.isin(*DELETE_CODES, *TRUNCATE_CODES), F.lit(False)), reason)
    raw = F.to_json(
        F.struct(*[named(c) for c in df.columns if c not in (REJECT_COLUMN, route_column)]),
        {"ignoreNullFields": "false"},
    )
    return reject_where(df, reason, REQUIRED_NULL_CLASS, raw)


def check_target(dead_letter: str, target: str) -> str | None:
    """Why ``dead_letter`` cannot be the dead-letter table of a sink writing ``target`` (None: it can)."""
    if not isinstance(dead_letter, str) or "." not in dead_letter.strip(".") or not dead_letter.strip():
        return f"dead_letter: expected a table name 'namespace.name', received {dead_letter!r}"
    if target and _same(dead_letter, target):
        return (
            f"dead_letter: the dead-letter table must not be the sink's table; received {dead_letter!r} for a sink "
            f"writing {target!r} (give another table, such as '{target.rsplit('.', 1)[0]}.errors')"
        )
    return None


def _same(a: str, b: str) -> bool:
    return a.strip().strip(".").lower() == b.strip().strip(".").lower()


def dead_letter_config(config: SinkConfig) -> SinkConfig:
    """The configuration the dead-letter table is written with: append-only, created when missing."""
    assert config.dead_letter is not None
    return attrs.evolve(
        config,
        table=config.dead_letter,
        create=CreateOptions(parse_terms(DEAD_LETTER_PARTITION_BY), {}, 2),
        distribution_mode="none",
        changes=None,
        pre_commit_hooks=(),
        post_commit_hooks=(),
        compaction=None,
        conversion=None,
        map_batches=(),
        route=None,
        dead_letter=None,
    )


# -- the writer task ----------------------------------------------------------------------------


@attrs.frozen
class DeadLetterTask:
    """What a writer task needs to write refused rows (picklable)."""

    spec: WriterSpec | None  # None: the dead-letter table has this checkpoint already; refused rows are dropped
    job_id: str
    checkpoint_id: int
    at_micros: int
    #: single-table sink: the table a refused row was meant for when its mark names none.
    source_table: str | None = None
    #: routed sink: the column naming each row's table.
    route_column: str | None = None
    #: routed sink: only rows of these tables go to the good writers (others were stored already).
    tables: frozenset[str] | None = None


def _refused_rows(rows: pa.Table, task: DeadLetterTask) -> pa.Table:
    """The dead-letter rows of refused ``rows`` (their refusal column set)."""
    mark = rows.column(REJECT_COLUMN).combine_chunks()
    n = rows.num_rows

    def field(name: str) -> pa.Array:
        value = pc.struct_field(mark, name)
        # The refused event as received may hold any bytes (a garbage Kafka message): written as text
        # it must be valid UTF-8, or the writers refuse the batch (writer/conform.check_utf8).
        return repaired_utf8(value) if pa.types.is_string(value.type) else value

    source = field("source_table")
    if task.route_column is not None and task.route_column in rows.column_names:
        source = pc.coalesce(source, rows.column(task.route_column).combine_chunks().cast(pa.string()))
    if task.source_table is not None:
        source = pc.coalesce(source, pa.scalar(task.source_table, pa.string()))
    return pa.table(
        {
            "reason": field("reason"),
            "error_class": field("error_class"),
            "source_table": repaired_utf8(source),
            "event": field("event"),
            "raw": field("raw"),
            "kafka_topic": field("topic"),
            "kafka_partition": field("partition"),
            "kafka_offset": field("offset"),
            "job_id": pa.array([task.job_id] * n, pa.string()),
            "checkpoint_id": pa.array([task.checkpoint_id] * n, pa.int64()),
            "dead_lettered_at": pa.array([task.at_micros] * n, pa.timestamp("us", tz="UTC")),
        }
    )


class SplitTaskWriter:
    """One writer task's writers: the good rows' (one table, or a routed sink's many) and the
    dead-letter table's. A row whose refusal column is set goes to the dead-letter writer."""

    def __init__(
        self,
        good: TaskWriter | MultiTableTaskWriter | None,
        good_specs: Mapping[str, WriterSpec],
        task: DeadLetterTask,
        task_id: int,
        attempt_id: int,
    ) -> None:
        self._good = good
        self._good_specs = good_specs
        self._task = task
        self._dead = TaskWriter(task.spec, task_id, attempt_id) if task.spec is not None else None
        self.counts: Counter[str] = Counter()

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        rows = pa.Table.from_batches([batch])
        if REJECT_COLUMN in rows.column_names:
            refused = rows.column(REJECT_COLUMN).is_valid()
            if rows.column(REJECT_COLUMN).null_count == rows.num_rows:
                good, bad = rows.drop_columns([REJECT_COLUMN]), None
            else:
                bad = rows.filter(refused)
                good = rows.filter(pc.invert(refused)).drop_columns([REJECT_COLUMN])
        else:
            good, bad = rows, None
        if self._task.tables is not None and self._task.route_column is not None and good.num_rows:
            # Tables whose rows of this checkpoint are stored already: not written again.
            keep = pc.is_in(good.column(self._task.route_column), pa.array(sorted(self._task.tables), pa.string()))
            good = good.filter(pc.fill_null(keep, False))
        if good.num_rows and self._good is not None:
            self._good.write(good)
        if bad is not None and bad.num_rows and self._dead is not None:
            letters = _refused_rows(bad, self._task)
            self._dead.write(letters)
            sources = letters.column("source_table").to_pylist()
            self.counts.update(str(t) if t is not None else "unknown" for t in sources)

    def complete(self) -> tuple[dict[str, WriteResult], WriteResult | None]:
        if isinstance(self._good, MultiTableTaskWriter):
            good = self._good.complete()
        elif self._good is not None:
            result = self._good.complete()
            name = next(iter(self._good_specs))
            good = {name: result} if result.data_files or result.delete_files or result.conditional_delete_files else {}
        else:
            good = {}
        dead = self._dead.complete() if self._dead is not None else None
        return good, dead if dead is not None and dead.data_files else None

    def abort(self) -> None:
        if self._good is not None:
            self._good.abort()
        if self._dead is not None:
            self._dead.abort()

    @property
    def peak_open_files(self) -> int:
        return self._good.peak_open_files if isinstance(self._good, MultiTableTaskWriter) else 0


_RESULT_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("peak_open_files", pa.int32(), nullable=False),
        pa.field("counts", pa.string(), nullable=False),
    ]
)
_DEAD = "\x00dead-letter"  # the result row of the dead-letter table (no table name has a NUL)


def _split_task(
    load: Callable[[], tuple[Mapping[str, WriterSpec], DeadLetterTask]],
    max_open_files: int,
    buffer_bytes: int,
) -> object:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        task_id = context.partitionId() if context is not None else 0
        attempt_id = context.taskAttemptId() if context is not None else 0
        attempt_number = context.attemptNumber() if context is not None else 0
        specs, task = load()
        good: TaskWriter | MultiTableTaskWriter | None = None
        if task.route_column is not None:
            if specs:
                good = MultiTableTaskWriter(specs, task.route_column, task_id, attempt_id, max_open_files, buffer_bytes)
        elif specs:
            good = TaskWriter(next(iter(specs.values())), task_id=task_id, attempt_id=attempt_id)
        writer = SplitTaskWriter(good, specs, task, task_id, attempt_id)
        try:
            for batch in batches:
                writer.write(batch)
            results, dead = writer.complete()
            _task_faults.hit(_task_faults.TASK_AFTER_WRITE, task_id, attempt_number, task.checkpoint_id)
        except BaseException:
            writer.abort()
            raise
        names = sorted(results)
        payloads = [results[n].encode() for n in names]
        counts = [""] * len(names)
        if dead is not None:
            names.append(_DEAD)
            payloads.append(dead.encode())
            counts.append(json.dumps(dict(writer.counts)))
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(names, pa.string()),
                pa.array(payloads, pa.binary()),
                pa.array([writer.peak_open_files] * len(names), pa.int32()),
                pa.array(counts, pa.string()),
            ],
            schema=_RESULT_SCHEMA,
        )

    return write


@attrs.define
class SplitResults:
    """What one split write produced: each good table's task results, the dead-letter table's,
    the refused rows per source table, and the most files a task held open."""

    tables: dict[str, list[WriteResult]] = attrs.field(factory=dict)
    dead: list[WriteResult] = attrs.field(factory=list)
    counts: Counter[str] = attrs.field(factory=Counter)
    peaks: list[int] = attrs.field(factory=list)


def write_split(
    df: DataFrame,
    specs: Mapping[str, WriterSpec],
    task: DeadLetterTask,
    max_open_files: int,
    buffer_bytes: int,
) -> SplitResults:
    """Write ``df`` in one Spark job: good rows to ``specs``' tables (one, or a routed sink's
    many), refused rows to the dead-letter table. The specs (FileIO properties included) travel to
    the tasks in one broadcast variable, as for writer/spark.py's writes."""
    context = df.sparkSession.sparkContext
    shipped = context.broadcast((dict(specs), task))
    try:
        fn = _split_task(lambda: shipped.value, max_open_files, buffer_bytes)
        rows = df.mapInArrow(fn, "table string, payload binary, peak_open_files int, counts string").collect()  # type: ignore[arg-type]
    finally:
        shipped.destroy()
    out = SplitResults()
    peaks: dict[tuple[int, int], int] = {}
    for row in rows:
        result = WriteResult.decode(bytes(row["payload"]))
        if row["table"] == _DEAD:
            out.dead.append(result)
            out.counts.update(json.loads(row["counts"]))
        else:
            out.tables.setdefault(str(row["table"]), []).append(result)
        peaks[(result.task_id, result.attempt_id)] = int(row["peak_open_files"])
    out.peaks = list(peaks.values())
    return out


# -- the driver ---------------------------------------------------------------------------------


class DeadLetterTable:
    """The dead-letter table of one job (one checkpoint location), driven by its own SinkJob."""

    def __init__(self, job: SinkJob, metrics: SinkMetrics) -> None:
        self.job = job
        self.name = job._config.table
        self._metrics = metrics

    @classmethod
    def for_job(
        cls,
        config: SinkConfig,
        store: CheckpointStore,
        job_id: str,
        metrics: SinkMetrics,
        catalog: Catalog | None = None,
        ephemeral: bool = False,
        streaming: bool = False,
    ) -> DeadLetterTable:
        from iceberg_sink.job.pipeline import SinkJob

        job = SinkJob(
            dead_letter_config(config),
            store,
            catalog=catalog,
            metrics=SinkMetrics(),  # its writes and commits are not the good table's
            ephemeral=ephemeral,
            streaming=streaming,
            job_id=job_id,
        )
        return cls(job, metrics)

    def begin(self, checkpoint_id: int) -> CheckpointPlan:
        return self.job.begin(DEAD_LETTER_STRUCT, checkpoint_id)

    def task(
        self,
        plan: CheckpointPlan,
        job_id: str,
        source_table: str | None = None,
        route_column: str | None = None,
        tables: frozenset[str] | None = None,
    ) -> DeadLetterTask:
        return DeadLetterTask(
            spec=plan.spec if needs_write(plan) else None,
            job_id=job_id,
            checkpoint_id=plan.checkpoint_id,
            at_micros=int(time.time() * 1_000_000),
            source_table=source_table,
            route_column=route_column,
            tables=tables,
        )

    def staged(self, plan: CheckpointPlan, out: SplitResults, write_ms: float, progress: dict[str, Any]) -> None:
        """Persist the dead-letter rows of ``plan``'s checkpoint (before any table is committed) and count them."""
        self.job.flushed(out.dead, write_ms)
        committable = self.job.stage(plan, out.dead)
        records = committable.summary.records if committable is not None else 0
        progress["dead_letter_records"] = records
        if records:
            self._metrics.dead_lettered(out.counts)
            logger.warning(
                "checkpoint %s: %s rows refused and written to the dead-letter table %s (%s)",
                plan.checkpoint_id,
                records,
                self.name,
                ", ".join(f"{t}: {n}" for t, n in sorted(out.counts.items())),
            )

    # The single-table job's bookkeeping includes the dead-letter table's (sink.py asks through these).

    def has_pending(self) -> bool:
        return self.job.has_pending()

    def commit_pending(self) -> None:
        self.job.commit_pending()

    def next_checkpoint_id(self) -> int:
        self.job.ensure_table(DEAD_LETTER_STRUCT)  # created when missing
        return self.job.next_checkpoint_id()


def needs_write(plan: CheckpointPlan) -> bool:
    return plan.done is None and plan.stored is None


def process_single(job: SinkJob, dead: DeadLetterTable, df: DataFrame, checkpoint_id: int) -> CommitOutcome | None:
    """One checkpoint of a single-table sink with a dead-letter table (see the module docstring)."""
    from iceberg_sink import options
    from iceberg_sink.topology import toast
    from iceberg_sink.topology.changes import reduce_changes
    from iceberg_sink.topology.distribution import distribute

    config = job._config
    plan = job.begin(without_reject(df.schema), checkpoint_id)
    dplan = dead.begin(checkpoint_id)
    if needs_write(plan) or needs_write(dplan):
        op_column = config.changes.op_column if config.changes is not None else None
        df = refuse_required_nulls(df, {config.table: plan.table.schema()}, op_column)
        if config.changes is not None:
            df = reduce_changes(
                df,
                config.changes,
                single_task_max_bytes=options.resolve(config.options, {}).get(options.SINGLE_TASK_MAX_BYTES),
            )
        df = toast.resolve(df, job.stored_tables(plan))
        df = enforce(df, dead_letter=True)
        specs: dict[str, WriterSpec] = {}
        if needs_write(plan):
            assert plan.spec is not None
            specs[config.table] = plan.spec
            sort = [c for c in plan.sort_columns if c]
            df = distribute(df, plan.mode, plan.table.spec(), plan.table.schema(), sort_columns=sort)
        task = dead.task(dplan, job.job_id, source_table=config.table)
        resolved = plan.resolved if needs_write(plan) else dplan.resolved
        _faults.hit(_faults.BEFORE_WRITE, checkpoint_id)
        started = time.monotonic()
        try:
            out = write_split(
                df,
                specs,
                task,
                max_open_files=resolved.get(options.WRITER_MAX_OPEN_FILES),
                buffer_bytes=resolved.get(options.WRITER_BUFFER_BYTES),
            )
        except Exception as e:
            raise job.write_error(e, checkpoint_id) from e
        _faults.hit(_faults.AFTER_WRITE, checkpoint_id)
        write_ms = (time.monotonic() - started) * 1000
        # Both committables are persisted before either table is committed.
        if needs_write(plan):
            results = out.tables.get(config.table, [])
            job.flushed(results, write_ms)
            job.stage(plan, results)
        if needs_write(dplan):
            dead.staged(dplan, out, write_ms, job._batch)
    outcome = job.commit_planned(plan)
    dead.job.commit_planned(dplan)
    return outcome


def refuse_routed_to(df: DataFrame, route_column: str, dead_letter: str) -> DataFrame:
    """A routed sink's rows naming the dead-letter table itself are refused: they go to it as
    refused rows, never appended to it as data."""
    from iceberg_sink.sources.rejects import reject_where

    name = F.col(route_column)
    reason = F.when(
        F.lower(name) == F.lit(dead_letter.lower()),
        F.lit(f"rows may not be routed to the dead-letter table {dead_letter}"),
    )
    raw = F.to_json(
        F.struct(*[named(c) for c in df.columns if c not in (REJECT_COLUMN, route_column)]),
        {"ignoreNullFields": "false"},
    )
    return reject_where(df, reason, "DeadLetterRouteError", raw, source_table=name)
