"""The writer tasks of a micro-batch with a dead-letter table: each task splits the rows it
receives, good rows to the table's writer (one table, or a routed sink's many: multi.py), refused
rows (their refusal column set, vocab/columns.py ``REJECT_COLUMN``) to the dead-letter table's
writer, in the same Spark job (job/dead_letter.py is the table; job/refusal.py decides refusals).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

import attrs
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from iceberg_sink import _task_faults
from iceberg_sink.vocab.columns import REJECT_COLUMN
from iceberg_sink.writer.arrow_batches import Widths
from iceberg_sink.writer.conform import repaired_utf8
from iceberg_sink.writer.multi import MultiTableTaskWriter
from iceberg_sink.writer.result import WriteResult, Written
from iceberg_sink.writer.spark import map_in_arrow
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_start import task_start
from iceberg_sink.writer.task_writer import TaskWriter


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
        task_id, attempt_id, attempt_number = task_start()
        specs, task = load()
        good: TaskWriter | MultiTableTaskWriter | None = None
        if task.route_column is not None:
            if specs:
                good = MultiTableTaskWriter(specs, task.route_column, task_id, attempt_id, max_open_files, buffer_bytes)
        elif specs:
            good = TaskWriter(next(iter(specs.values())), task_id=task_id, attempt_id=attempt_id)
        writer = SplitTaskWriter(good, specs, task, task_id, attempt_id)
        widths = Widths()
        try:
            for batch in widths.measured(batches):
                writer.write(batch)
            results, dead = writer.complete()
            results = {t: attrs.evolve(r, arrow_row_bytes=widths.row_bytes) for t, r in results.items()}
            dead = attrs.evolve(dead, arrow_row_bytes=widths.row_bytes) if dead is not None else None
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


def write_split(
    df: DataFrame,
    specs: Mapping[str, WriterSpec],
    task: DeadLetterTask,
    max_open_files: int,
    buffer_bytes: int,
) -> Written:
    """Write ``df`` in one Spark job: good rows to ``specs``' tables (one, or a routed sink's
    many), refused rows to the dead-letter table. The specs (FileIO properties included) travel to
    the tasks in one broadcast variable, as for writer/spark.py's writes."""
    context = df.sparkSession.sparkContext
    shipped = context.broadcast((dict(specs), task))
    try:
        fn = _split_task(lambda: shipped.value, max_open_files, buffer_bytes)
        rows = map_in_arrow(df, fn, "table string, payload binary, peak_open_files int, counts string").collect()
    finally:
        shipped.destroy()
    out = Written()
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
