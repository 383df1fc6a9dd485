"""Runs :class:`TaskWriter` inside Spark tasks through ``mapInArrow`` and collects the results.

FileIO properties (which may hold storage credentials) travel to tasks in a broadcast variable,
not inside the pickled task function: PySpark hands that function to the JVM through py4j, whose
DEBUG log prints every command, byte arrays included (base64-encoded).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import attrs
import pyarrow as pa
import pyspark
from py4j.java_gateway import JavaClass
from pyspark import SparkContext
from pyspark.rdd import PythonEvalType
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql.pandas.functions import pandas_udf

from iceberg_sink import _task_faults
from iceberg_sink._spark_schema import columns_of
from iceberg_sink._sql import quoted
from iceberg_sink.errors import IcebergSinkError, InvalidInputError, WriteFailedError
from iceberg_sink.vocab.columns import ERROR_MARKER
from iceberg_sink.writer.arrow_batches import Widths
from iceberg_sink.writer.key_runs import KeyRuns, crossed
from iceberg_sink.writer.multi import MultiTableTaskWriter
from iceberg_sink.writer.read_ahead import read_ahead
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_start import task_start
from iceberg_sink.writer.task_writer import TaskWriter

# The last line of a Python traceback: "OSError: [Errno 28] ...", "pkg.module.SomeError: ...".
_PYTHON_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b.*$")
_STAGE_FAILURE = "Job aborted due to stage failure:"

_RESULT_SCHEMA = pa.schema([pa.field("payload", pa.binary(), nullable=False)])
#: A task that reduced its batch's changes (writer/key_runs.py) also returns the hashes of its keys.
_REDUCED_RESULT_SCHEMA = pa.schema(
    [pa.field("payload", pa.binary(), nullable=False), pa.field("keys", pa.binary(), nullable=False)]
)


@contextmanager
def shipped(context: SparkContext, spec: WriterSpec) -> Iterator[Callable[[], WriterSpec]]:
    """A picklable function returning ``spec`` inside a task, its FileIO properties broadcast.

    The broadcast is destroyed on exit, so use the function only in jobs run within the block. A
    spec without FileIO properties (a local warehouse) ships as it is: a broadcast and its
    destruction cost two Py4J calls and 5-7 ms a micro-batch for nothing to carry.
    """
    if not spec.io_properties:
        yield lambda: spec
        return
    io_properties = context.broadcast(dict(spec.io_properties))
    bare = attrs.evolve(spec, io_properties={})

    def load() -> WriterSpec:
        return attrs.evolve(bare, io_properties=io_properties.value)

    try:
        yield load
    finally:
        io_properties.destroy()


def _write_task(load_spec: Callable[[], WriterSpec], reduce: bool = False) -> object:
    """The task function of a write; ``reduce``: the task reduces its rows' changes first
    (writer/key_runs.py) and returns the hashes of its keys beside its result."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_id, attempt_id, attempt_number = task_start()
        spec = load_spec()
        writer = TaskWriter(spec, task_id=task_id, attempt_id=attempt_id)
        widths = Widths()
        runs = KeyRuns() if reduce else None
        try:
            measured = widths.measured(batches)
            for batch in read_ahead(runs.reduced(measured) if runs is not None else measured):
                writer.write(batch)
            result = attrs.evolve(writer.complete(), arrow_row_bytes=widths.row_bytes)
            _task_faults.hit(_task_faults.TASK_AFTER_WRITE, task_id, attempt_number, spec.checkpoint_id)
        except BaseException:
            writer.abort()
            raise
        payload = pa.array([result.encode()], pa.binary())
        if runs is None:
            yield pa.RecordBatch.from_arrays([payload], schema=_RESULT_SCHEMA)
        else:
            keys = pa.array([runs.hashes()], pa.binary())
            yield pa.RecordBatch.from_arrays([payload, keys], schema=_REDUCED_RESULT_SCHEMA)

    return write


#: Joins the quoted column names :func:`map_in_arrow` sends the JVM in one string (no name holds it there).
_NAMES_SEPARATOR = "\x00"
#: Whether ``Dataset.mapInArrow`` takes the function as a Column (Spark 4; 3.5 takes its expression).
_FUNCTION_AS_COLUMN = int(pyspark.__version__.split(".")[0]) >= 4


def map_in_arrow(df: DataFrame, task: object, schema: str) -> DataFrame:
    """``df.mapInArrow(task, schema)``, its columns named to the JVM in two Py4J calls.

    PySpark's ``mapInArrow`` calls its function with each column of ``df`` as an argument, asking the
    JVM for each one (``df[name]``) and adding each to a Java list: two Py4J calls a column, 330 of a
    160-column micro-batch's ~650 (~28 ms). Spark runs the function on the rows of ``df``'s output
    whatever its arguments (``MapInBatchExec`` reads ``child.schema``); the arguments only tell the
    plan which columns the function reads. Here the function takes one argument, the struct of all
    of them (``functions.struct`` of the quoted names, split on the JVM from one string), so it still
    reads every column; a name holding the separator, or Spark 3.5 (whose ``mapInArrow`` takes
    another signature), takes PySpark's own way."""
    names = columns_of(df)
    if not _FUNCTION_AS_COLUMN or not names or any(_NAMES_SEPARATOR in name for name in names):
        return df.mapInArrow(task, schema)  # type: ignore[arg-type]
    # Classes named in full (py4j's JavaClass): ``jvm.org.apache...`` resolves each dotted prefix by
    # a failed class lookup that walks every jar of the class path (13 for ``org.apache.spark.sql``,
    # 1.4 ms a chain measured here), on the stream's thread, every micro-batch.
    client = df.sparkSession.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    quoted_names = [quoted(name) for name in names]
    rest = JavaClass("org.apache.commons.lang3.StringUtils", client).splitPreserveAllTokens(
        _NAMES_SEPARATOR.join(quoted_names[1:]), _NAMES_SEPARATOR
    )
    every_column = Column(JavaClass("org.apache.spark.sql.functions", client).struct(quoted_names[0], rest))
    function = pandas_udf(task, returnType=schema, functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)  # type: ignore[call-overload]
    return DataFrame(df._jdf.mapInArrow(function(every_column)._jc, False, None), df.sparkSession)


def _run_write(df: DataFrame, spec: WriterSpec, reduce: bool = False) -> list[Row]:
    """Run the write job of ``df`` (:func:`_write_task`'s tasks) and collect each partition's row."""
    schema = "payload binary, keys binary" if reduce else "payload binary"
    with shipped(df.sparkSession.sparkContext, spec) as load_spec:
        return map_in_arrow(df, _write_task(load_spec, reduce=reduce), schema).collect()


def write_dataframe(df: DataFrame, spec: WriterSpec) -> list[WriteResult]:
    """Write ``df`` with one stateless writer per Spark partition; return each task's result.

    Exactly one attempt's result per partition reaches the driver, however many attempts ran
    (retries, speculative copies): ``collect`` takes the first successful attempt of each partition
    and Spark drops the results of later ones. A failed attempt deletes its files (best effort); a
    lost or killed one may leave files no result names, orphans for the remove-orphans maintenance.
    """
    results = [WriteResult.decode(bytes(row["payload"])) for row in _run_write(df, spec)]
    return [r for r in results if not r.is_empty]


def write_reducing_dataframe(df: DataFrame, spec: WriterSpec) -> tuple[list[WriteResult], bool]:
    """:func:`write_dataframe` for a batch its writer tasks reduce (writer/key_runs.py): each task's
    result, and whether a key's changes were maybe in two tasks (then the results are not the
    batch's: the caller discards their files and writes the batch again, reduced in Spark)."""
    rows = _run_write(df, spec, reduce=True)
    results = [WriteResult.decode(bytes(row["payload"])) for row in rows]
    return [r for r in results if not r.is_empty], crossed(bytes(row["keys"]) for row in rows)


def task_failure(error: BaseException) -> str | None:
    """What made Spark give up on a job, in one line, when ``error`` is a failed Spark job.

    For an error raised in a Python worker, the last line of its traceback (``OSError: [Errno 28] No
    space left on device``); for a task lost otherwise (a worker process or executor died), Spark's
    stage failure line. None when ``error`` is not a failed Spark job.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException, PythonException

    if not isinstance(error, PySparkException | Py4JJavaError):
        return None
    text = str(error)
    if not isinstance(error, PythonException) and _STAGE_FAILURE not in text:
        return None  # raised before any task ran (analysis, planning): not a task failure
    lines = [line.strip() for line in text.splitlines()]
    python_errors = [line for line in lines if _PYTHON_ERROR_LINE.match(line)]
    if python_errors:
        return python_errors[-1]
    for line in lines:
        if _STAGE_FAILURE in line:
            return line[line.index(_STAGE_FAILURE) + len(_STAGE_FAILURE) :].strip()
    return next((line for line in lines if line), type(error).__name__)


_ROUTED_RESULT_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        # The most files the task held open at once, over all its tables (the same on each row).
        pa.field("peak_open_files", pa.int32(), nullable=False),
    ]
)


def _write_routed_task(
    specs: Callable[[], Mapping[str, WriterSpec]], route_column: str, max_open_files: int, buffer_bytes: int
) -> object:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_id, attempt_id, attempt_number = task_start()
        by_table = specs()
        writer = MultiTableTaskWriter(by_table, route_column, task_id, attempt_id, max_open_files, buffer_bytes)
        widths = Widths()
        try:
            for batch in read_ahead(widths.measured(batches)):
                writer.write(batch)
            results = {t: attrs.evolve(r, arrow_row_bytes=widths.row_bytes) for t, r in writer.complete().items()}
            checkpoint = next(iter(by_table.values())).checkpoint_id if by_table else 0
            _task_faults.hit(_task_faults.TASK_AFTER_WRITE, task_id, attempt_number, checkpoint)
        except BaseException:
            writer.abort()
            raise
        names = sorted(results)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(names, pa.string()),
                pa.array([results[n].encode() for n in names], pa.binary()),
                pa.array([writer.peak_open_files] * len(names), pa.int32()),
            ],
            schema=_ROUTED_RESULT_SCHEMA,
        )

    return write


def write_routed_dataframe(
    df: DataFrame,
    specs: Mapping[str, WriterSpec],
    route_column: str,
    max_open_files: int,
    buffer_bytes: int,
    peak_open_files: list[int] | None = None,
) -> dict[str, list[WriteResult]]:
    """Write ``df``, whose ``route_column`` names each row's table, in one Spark job for all tables.

    The table -> WriterSpec map (FileIO properties included) travels to the tasks in one broadcast
    variable. Each task groups rows by table, then by partition (writer/multi.py); each task returns
    one result per table it wrote, with the same exactly-one-attempt rule as :func:`write_dataframe`.
    ``peak_open_files``, if given, gets the most files each task that wrote held open at once.
    """
    context = df.sparkSession.sparkContext
    shipped_specs = context.broadcast(dict(specs))
    try:
        task = _write_routed_task(lambda: shipped_specs.value, route_column, max_open_files, buffer_bytes)
        rows = map_in_arrow(df, task, "table string, payload binary, peak_open_files int").collect()
    finally:
        shipped_specs.destroy()
    results: dict[str, list[WriteResult]] = {}
    peaks: dict[tuple[int, int], int] = {}
    for row in rows:
        result = WriteResult.decode(bytes(row["payload"]))
        results.setdefault(str(row["table"]), []).append(result)
        peaks[(result.task_id, result.attempt_id)] = int(row["peak_open_files"])
    if peak_open_files is not None:
        peak_open_files.extend(peaks.values())
    return results


def refused_input(error: BaseException, checkpoint_id: int, target: str) -> InvalidInputError | None:
    """The InvalidInputError for a row refused inside Spark (an ERROR_MARKER message: a null key, an
    unknown op code, a fail-fast refusal), whichever Spark action of the batch ran into it; None for
    any other error, and for errors of the sink's own (already reported)."""
    if isinstance(error, IcebergSinkError):
        return None
    text = str(error)
    if ERROR_MARKER not in text:
        return None
    detail = text[text.index(ERROR_MARKER) + len(ERROR_MARKER) :].splitlines()[0].strip()
    detail = re.sub(r"\s*SQLSTATE: \w+$", "", detail)  # Spark 4 appends the state to the line
    return InvalidInputError(f"checkpoint {checkpoint_id} of {target} was not written: {detail}")


def write_error(error: Exception, checkpoint_id: int, target: str) -> Exception:
    """The error to raise for a failed write of ``checkpoint_id`` (``error`` itself if not a known kind)."""
    refused = refused_input(error, checkpoint_id, target)
    if refused is not None:
        # A row was refused inside Spark (null key, unknown op code): nothing was committed.
        return refused
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
