"""How long building the change reduction's plan takes on a warm driver, per micro-batch (nothing runs).

``python -m benchmarks.reduction_build [--columns 10 160] [--warm 300] [--timed 100] [--out F]`` starts
one ``local[2]`` SparkSession and, per width and per path (``writers``: sorted for the writer tasks to
reduce, the Kafka stream's path; ``window``: reduced in Spark by a window), builds the reduction and
the fail-fast check (``reduce_changes`` then ``fail_on_reject``, stages 3-5 of job/road.py's build) of
a CDC batch with an op column, an order column and Kafka's columns, ``--warm`` times and then
``--timed`` times, timing each build. It prints JSON: the median and the tenth percentile in ms.

The input is a DataFrame of a few steps over ``spark.range`` (as a stream's batch comes out of its
reader); its width is the table's columns. To compare code versions, run this file by path with
``PYTHONPATH`` set to another checkout (a worktree): it uses what that checkout's
``reduce_changes`` offers (``raw_kept`` from session 57 on).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any


def measure(columns: int, path: str, warm: int, timed: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from iceberg_sink.config import ChangeConfig
    from iceberg_sink.sources.rejects import fail_on_reject
    from iceberg_sink.topology.changes import reduce_changes

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    base = spark.range(100).select(
        F.col("id").alias("k"),
        *[F.col("id").cast("string").alias(f"c{i}") for i in range(columns)],
        F.lit("u").alias("op"),
        F.col("id").alias("lsn"),
        F.lit("t").alias("topic"),
        F.lit(0).alias("partition"),
        F.col("id").alias("offset"),
    )
    df = base.withColumn("x", F.lit(1)).drop("x").select("*")
    config = ChangeConfig(key=("k",), op_column="op", order_by="lsn")
    options: dict[str, Any] = {"in_writers": path == "writers"}
    if "raw_kept" in inspect.signature(reduce_changes).parameters:
        options["raw_kept"] = False  # no dead-letter table, as fail_on_reject after it says

    def build() -> None:
        fail_on_reject(reduce_changes(df, config, **options))

    for _ in range(warm):
        build()
    times = []
    for _ in range(timed):
        started = time.perf_counter()
        build()
        times.append((time.perf_counter() - started) * 1000)
    return {
        "columns": columns,
        "path": path,
        "median_ms": round(statistics.median(times), 2),
        "p10_ms": round(statistics.quantiles(times, n=10)[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--columns", type=int, nargs="+", default=[10, 160])
    parser.add_argument("--paths", nargs="+", default=["writers", "window"], choices=["writers", "window"])
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--timed", type=int, default=100)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    import iceberg_sink

    checkout = Path(iceberg_sink.__file__).resolve().parent.parent
    revision = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = [measure(c, p, args.warm, args.timed) for c in args.columns for p in args.paths]
    result = {"benchmark": "reduction_build", "started": started, "code": revision, "results": rows}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
