"""Runs :class:`TaskWriter` inside Spark tasks through ``mapInArrow`` and collects the results.

FileIO properties (which may hold storage credentials) travel to tasks in a broadcast variable,
not inside the pickled task function: PySpark hands that function to the JVM through py4j, whose
DEBUG log prints every command, byte arrays included (base64-encoded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import attrs
import pyarrow as pa
from pyspark import SparkContext, TaskContext
from pyspark.sql import DataFrame

from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_writer import TaskWriter

_RESULT_SCHEMA = pa.schema([pa.field("payload", pa.binary(), nullable=False)])


@contextmanager
def shipped(context: SparkContext, spec: WriterSpec) -> Iterator[Callable[[], WriterSpec]]:
    """A picklable function returning ``spec`` inside a task, its FileIO properties broadcast.

    The broadcast is destroyed on exit, so use the function only in jobs run within the block.
    """
    io_properties = context.broadcast(dict(spec.io_properties))
    bare = attrs.evolve(spec, io_properties={})

    def load() -> WriterSpec:
        return attrs.evolve(bare, io_properties=io_properties.value)

    try:
        yield load
    finally:
        io_properties.destroy()


def _write_task(load_spec: Callable[[], WriterSpec]) -> object:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        task_id = context.partitionId() if context is not None else 0
        attempt_id = context.taskAttemptId() if context is not None else 0
        writer = TaskWriter(load_spec(), task_id=task_id, attempt_id=attempt_id)
        try:
            for batch in batches:
                writer.write(batch)
            result = writer.complete()
        except BaseException:
            writer.abort()
            raise
        yield pa.RecordBatch.from_arrays([pa.array([result.encode()], pa.binary())], schema=_RESULT_SCHEMA)

    return write


def write_dataframe(df: DataFrame, spec: WriterSpec) -> list[WriteResult]:
    """Write ``df`` with one stateless writer per Spark partition; return each task's result."""
    with shipped(df.sparkSession.sparkContext, spec) as load_spec:
        rows = df.mapInArrow(_write_task(load_spec), "payload binary").collect()  # type: ignore[arg-type]
    results = [WriteResult.decode(bytes(row["payload"])) for row in rows]
    return [r for r in results if r.data_files or r.delete_files or r.conditional_delete_files]
