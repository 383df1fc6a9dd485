"""A driver for the cluster and task-fault tests, run as a subprocess (one SparkContext per process):

    python -m tests.integration.cluster_driver PLAN_JSON

The plan names the master (``spark://...`` or ``local[...]``), extra Spark settings and steps, run in
order in the driver's working directory (the test gives it its own, distinct from every executor's):

- ``{"kind": "stream", "table", "source", "checkpoint", "partition_by"}``: a file stream over the
  Parquet files in ``source`` (``maxFilesPerTrigger=1``, ``availableNow``);
- ``{"kind": "append", "table", "batches": [[start, n], ...], "partition_by", "partitions"}``: one
  ``sink.write`` of :func:`event_batch` rows per batch;
- ``{"kind": "cdc", "table", "batches": [[row, ...], ...], "partition_by", "partitions",
  "write_options"}``: one ``sink.write`` per batch of change rows (op column ``op``, key ``id``,
  ordered by ``lsn``); reports the key index's Spark jobs (the partitioned index's);
- ``{"kind": "compact", "table"}``: ``sink.compact(spark)`` with thresholds that rewrite small files.

Paths in the plan may be relative: they are the driver's. Every step writes into the embedded
catalog under ``lake`` (relative, resolved on the driver). The outcome of each step (and its
traceback, or the error's type and message) goes to ``result.json``; a failed step stops the plan
unless it says ``"continue_on_error": true``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

CHANGE_DDL = "id long, region string, v string, n long, lsn long, op string"
CHANGE_COLUMNS = ("id", "region", "v", "n", "lsn", "op")
LAKE = "lake"


def _builder(table: str, partition_by: list[str]) -> Any:
    from iceberg_sink import IcebergSink

    return IcebergSink.builder().embedded(LAKE).table(table).create_if_missing(partition_by=partition_by)


def run_step(spark: Any, step: dict[str, Any]) -> dict[str, Any]:
    from iceberg_sink.topology.compaction import CompactionConfig
    from tests.integration.sources import EVENT_SCHEMA_DDL, event_batch

    kind = step["kind"]
    partition_by = list(step.get("partition_by", []))
    if kind == "stream":
        sink = _builder(step["table"], partition_by).build()
        df = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(step["source"])
        query = sink.start(df, step["checkpoint"], trigger={"availableNow": True})
        query.awaitTermination()
        return {"commits": sink.metrics().commits}
    if kind == "append":
        sink = _builder(step["table"], partition_by).build()
        for start, n in step["batches"]:
            rows = event_batch(start, n).to_pylist()
            df = spark.createDataFrame(rows, EVENT_SCHEMA_DDL).repartition(step.get("partitions", 2))
            sink.write(df)
        return {"commits": sink.metrics().commits}
    if kind == "cdc":
        builder = _builder(step["table"], partition_by).cdc(op_column="op", key=["id"], order_by="lsn")
        for key, value in step.get("write_options", {}).items():
            builder = builder.write_option(key, value)
        sink = builder.build()
        for rows in step["batches"]:
            data = [tuple(r[c] for c in CHANGE_COLUMNS) for r in rows]
            sink.write(spark.createDataFrame(data, CHANGE_DDL).repartition(step.get("partitions", 2)))
        runner = sink._committer_index.runner  # the partitioned key index's (None: the driver index)
        return {"commits": sink.metrics().commits, "key_index_jobs": getattr(runner, "jobs", 0)}
    if kind == "compact":
        sink = _builder(step["table"], partition_by).build()
        result = sink.compact(spark, CompactionConfig(min_input_files=2))
        return {"rewritten": result.rewritten_data_files, "added": result.added_data_files}
    raise ValueError(f"unknown step kind {kind!r}")


def main(argv: list[str]) -> int:
    with open(argv[0]) as fh:
        plan = json.load(fh)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(plan["master"])
        .appName("iceberg_sink-cluster-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "America/Los_Angeles")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
    )
    for key, value in plan.get("conf", {}).items():
        builder = builder.config(key, value)
    started = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DRIVER_LOG_LEVEL", "WARN"))
    result: dict[str, Any] = {"cwd": os.getcwd(), "start_seconds": round(time.monotonic() - started, 1), "steps": []}
    ok = True
    for step in plan["steps"]:
        started = time.monotonic()
        try:
            outcome = {"kind": step["kind"], "ok": True, **run_step(spark, step)}
        except Exception as e:
            outcome = {
                "kind": step["kind"],
                "ok": False,
                "error_type": type(e).__name__,
                "error": str(e),
                "traceback": traceback.format_exc(),
            }
            ok = False
        outcome["seconds"] = round(time.monotonic() - started, 1)
        result["steps"].append(outcome)
        if not outcome["ok"] and not plan.get("continue_on_error"):
            break
    with open("result.json", "w") as fh:
        json.dump(result, fh)
    spark.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
