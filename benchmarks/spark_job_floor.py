"""The floor under a micro-batch: what Spark charges for a job before the sink does any work.

    .venv/bin/python -m benchmarks.spark_job_floor [--rows 10000] [--trials 20] [--out result.json]

In one fresh ``local[2]`` session (the benchmarks' settings: UI off, 4 shuffle partitions), each of
these is timed ``--trials`` times after five untimed rounds, the cases taking turns in every round;
medians and p90 reported:

- ``jvm_job``: a one-task job of ``--rows`` rows that never leaves the JVM (``count``), planning and
  scheduling included;
- ``python_job_100_rows`` and ``python_job``: the same rows (100, then ``--rows``) through a
  ``mapInArrow`` function that only counts them, in one task, collected: the shape of the sink's
  write job (writer/spark.py) without its work;
- ``broadcast``: one ``SparkContext.broadcast`` of a small dict and its ``destroy()``, which the
  sink's write does once per micro-batch (the FileIO properties, ``writer/spark.py`` ``shipped``).

A CDC micro-batch of 10,000 changes cannot cost less than Spark's own trigger work plus the Python job
above; docs/benchmarks.md (issue 41) compares them with the sink's phases. Prints JSON.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from benchmarks.cdc_systems import percentile
from benchmarks.key_index_reads import emit


def _count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = 0
    for batch in batches:
        rows += batch.num_rows
    yield pa.RecordBatch.from_pylist([{"rows": rows}])


def timed(cases: dict[str, Callable[[], object]], trials: int, warmup: int = 5) -> dict[str, dict[str, float]]:
    """Each case run ``warmup`` rounds untimed, then ``trials`` timed rounds, the cases taking turns in
    every round (a JVM gets faster over its first jobs: run one case after another, the first would
    pay the warm-up of all)."""
    for _ in range(warmup):
        for run in cases.values():
            run()
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(trials):
        for name, run in cases.items():
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    return {
        name: {
            "ms_p50": round(statistics.median(values) * 1000, 1),
            "ms_p90": round(percentile(sorted(values), 0.9) * 1000, 1),
        }
        for name, values in seconds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session_seconds = time.perf_counter() - started
    spark.sparkContext.setLogLevel("ERROR")
    context = spark.sparkContext

    def frame(rows: int) -> Any:
        return spark.range(rows).selectExpr("id", "cast(id as string) as v").coalesce(1)

    def python_job(rows: int) -> Callable[[], object]:
        return lambda: frame(rows).mapInArrow(_count, "rows long").collect()  # type: ignore[arg-type]

    def broadcast() -> None:
        context.broadcast({"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO", "warehouse": "file:///tmp/w"}).destroy()

    cases = {
        "jvm_job": lambda: frame(args.rows).groupBy().count().collect(),
        "python_job_100_rows": python_job(100),
        "python_job": python_job(args.rows),
        "broadcast": broadcast,
    }
    result = {
        "rows": args.rows,
        "trials": args.trials,
        "spark_session_seconds": round(session_seconds, 2),
        **timed(cases, args.trials),
        "spark_version": spark.version,
    }
    spark.stop()
    emit(result, args.out)


if __name__ == "__main__":
    main()
