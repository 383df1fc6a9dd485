"""Where the partitioned key index's tasks run: in the driver, or on Spark's executors.

    PartitionedIndex ──▶ Runner.run(task, items, weight) ──▶ LocalRunner: in this process
                                                        └─▶ SparkRunner: one Spark task per item, when
                                                            the work is larger than the driver should do

A task is a module-level function ``task(io, item)`` whose item is a picklable value (paths, hashes,
file metadata, a schema): no catalog connection travels. On executors the table's FileIO is
rebuilt from its storage properties, which travel in a broadcast variable, never in the pickled task
(PySpark hands the task to the JVM through py4j, whose DEBUG log prints it: credentials must not be
in it; the writers ship theirs the same way, ``writer/spark.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyiceberg.io import FileIO, load_file_io

from iceberg_sink.table.catalog import file_io_properties
from iceberg_sink.writer.task_start import task_start

if TYPE_CHECKING:
    from pyspark import SparkContext

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_LOCAL_BYTES = 64 * 1024 * 1024
"""Work up to this many bytes (read or written) runs in the driver: a Spark job costs ~0.1 s."""


class Runner(Protocol):
    """Runs index tasks (module docstring)."""

    def run(
        self, task: Callable[[FileIO, T], R], items: Sequence[T], io: FileIO, location: str, weight: int
    ) -> list[R]:
        """``[task(io, item) for item in items]``, wherever it runs; ``weight``: the bytes involved.
        A task's exception reaches the caller as itself, wherever the task ran (the index rebuilds
        itself on a ``CorruptFileError`` or ``FileNotFoundError`` from any task)."""
        ...

    def slots(self, weight: int) -> int:
        """How many tasks work of ``weight`` bytes is best cut into, where it would run."""
        ...


class LocalRunner:
    """Runs every task in this process, one after another."""

    def __init__(self) -> None:
        self.tasks = 0
        """Tasks run, ever."""

    def run(
        self, task: Callable[[FileIO, T], R], items: Sequence[T], io: FileIO, location: str, weight: int
    ) -> list[R]:
        self.tasks += len(items)
        return [task(io, item) for item in items]

    def slots(self, weight: int) -> int:
        return 1  # one after another: one task reads everything at once (fetch.py)


def _on_executor(task: Callable[[FileIO, Any], Any], properties: Any, location: str) -> Callable[[Any], Any]:
    def run(item: Any) -> tuple[bool, Any]:
        task_start()
        try:
            return True, task(load_file_io(dict(properties.value), location), item)
        except Exception as e:  # carried back as itself (Spark would wrap it in a PythonException)
            return False, e

    return run


class SparkRunner:
    """Runs work heavier than ``local_bytes`` as one Spark job (a task per item), lighter work in
    this process (a Spark job's fixed cost would exceed it)."""

    def __init__(self, context: Callable[[], SparkContext | None], local_bytes: int = DEFAULT_LOCAL_BYTES) -> None:
        self.context = context
        """The active SparkContext, or None (then everything runs in this process)."""
        self.local_bytes = local_bytes
        self.local = LocalRunner()
        self.jobs = 0
        """Spark jobs run, ever."""
        self.tasks = 0
        """Spark tasks run, ever."""

    def slots(self, weight: int) -> int:
        context = self.context() if weight > self.local_bytes else None
        return 1 if context is None else max(1, context.defaultParallelism)

    def run(
        self, task: Callable[[FileIO, T], R], items: Sequence[T], io: FileIO, location: str, weight: int
    ) -> list[R]:
        context = self.context() if weight > self.local_bytes and items else None
        if context is None:
            return self.local.run(task, items, io, location, weight)
        properties = context.broadcast(file_io_properties(io.properties))
        description = context.getLocalProperty("spark.job.description")  # the caller's, put back after
        try:
            context.setJobDescription(f"iceberg-sink key index: {task.__name__} ({len(items)} tasks)")
            rdd = context.parallelize(list(items), len(items))
            outcomes: list[tuple[bool, Any]] = rdd.map(_on_executor(task, properties, location)).collect()
        finally:
            context.setLocalProperty("spark.job.description", description)  # type: ignore[arg-type]
            properties.destroy()
        self.jobs += 1
        self.tasks += len(items)
        for ok, value in outcomes:
            if not ok:
                raise value
        return [value for _, value in outcomes]
