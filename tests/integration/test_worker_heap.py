"""A writer task settles the Python worker it runs in (``iceberg_sink/writer/task_start.py``).

PySpark's daemon runs a full garbage collection after every task of a reused worker; without the
sink's first tasks freezing the worker's imports, each one walks every PyIceberg and PyArrow object.
The probe asks the workers of the test session (reused, as Spark's default is) what they froze,
through ``mapInArrow`` as the writer runs: Spark keeps the workers of Arrow functions apart from
those of RDD functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink


def _heap(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import gc
    import os

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "frozen": gc.get_freeze_count()}])


def worker_heaps(spark: SparkSession, tasks: int = 4) -> list[tuple[int, int]]:
    """(process id, objects frozen) of the Python workers ``tasks`` probe tasks ran in."""
    probe = spark.range(tasks).repartition(tasks).mapInArrow(_heap, "pid long, frozen long")  # type: ignore[arg-type]
    return [(row["pid"], row["frozen"]) for row in probe.collect()]


def test_a_writer_task_freezes_its_workers_imports(spark: SparkSession, tmp_path: Path) -> None:
    assert spark.sparkContext.getConf().get("spark.python.worker.reuse", "true") == "true"
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.heap").create_if_missing().build()
    sink.write(spark.createDataFrame([(i, f"v{i}") for i in range(200)], "id long, v string").repartition(2))
    assert sink.load_table().scan().to_arrow().num_rows == 200
    heaps = worker_heaps(spark)
    # The probe's tasks take the idle workers, the writer's among them: whichever ran a sink task
    # froze its imports (tens of thousands of objects), a worker that ran none froze nothing.
    assert max(count for _, count in heaps) > 10_000, heaps
