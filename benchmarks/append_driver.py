"""One system of the append benchmark, in a process of its own (started by ``benchmarks/append.py``).

    <python> -m benchmarks.append_driver SPEC.json

Runs with whatever PySpark the interpreter has: the main venv (Spark 4.x) or the Java venv (Spark
3.5, which also has the Iceberg runtime jar). ``SPEC.json`` says which system:

- ``ceiling``: Spark reads the Parquet file stream and only counts it: the ``noop`` sink, which
  pulls every column of every row through Spark and discards it (its query progress counts the
  rows). No sink can be faster on the same Spark.
- ``iceberg_java``: ``writeStream.format("iceberg")`` into a Hadoop-catalog table created first
  (format v2, Parquet/zstd as Iceberg's defaults), with ``fanout-enabled`` on partitioned tables
  (Iceberg's advice for streaming, since a streaming write cannot ask Spark to cluster rows).
- ``iceberg_sink_jvm``: the same with ``iceberg-sink.writer.jvm-parquet=true`` (Spark's Parquet writer).
- ``iceberg_sink``: ``IcebergSink.start(...)`` with an embedded SQLite catalog (the table is created
  by ``start`` before the stream begins, as Java's is created before its stream).

Every system reads the same folder with ``maxFilesPerTrigger=1`` and ``Trigger.AvailableNow``, so
each file is one micro-batch. The time runs from just before ``writeStream.start()`` to the end of
the last micro-batch (its progress ``timestamp`` plus ``triggerExecution``; the commit of both
Iceberg writers happens inside it). The result JSON goes to ``spec["result"]``; progress to stderr.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.append_data import SPARK_DDL
from benchmarks.cpu_monitor import quiet_gate

TABLE = "bench.events"
PARTITION_BY = ("day(ts)", "bucket(16, user_id)")
JAVA_PARTITION_SQL = "PARTITIONED BY (days(ts), bucket(16, user_id))"
JAVA_CATALOG = "local"


def log(system: str, message: str) -> None:
    print(f"[{system} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_spark(spec: dict[str, Any], work_dir: Path) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_LOCAL_DIRS"] = str(work_dir / "spark-local")
    if spec["system"] == "iceberg_java":
        from benchmarks.java_spark import start_java_spark

        spark = start_java_spark(
            {**spec, "warehouse": str(work_dir / "warehouse")}, work_dir, "append-benchmark", JAVA_CATALOG
        )
    else:
        from benchmarks.java_spark import local_builder

        spark = local_builder(spec, work_dir, f"append-benchmark-{spec['system']}").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    for key, value in (spec.get("spark_conf") or {}).items():
        spark.conf.set(key, value)
    return spark


def _progress(query: Any) -> list[dict[str, Any]]:
    out = []
    for p in query.recentProgress:
        out.append(json.loads(p.json) if hasattr(p, "json") else dict(p))
    return out


def _end_of(progress: dict[str, Any]) -> float:
    started = dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return started + progress["durationMs"].get("triggerExecution", 0) / 1000.0


def _newest_metadata(table_dir: Path) -> str:
    files = sorted((table_dir / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    return str(files[-1])


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import pyspark

    system = spec["system"]
    partitioned = bool(spec["partitioned"])
    work_dir = Path(spec["work_dir"])
    monitor, wait_quiet = quiet_gate(spec)
    spark = start_spark(spec, work_dir)
    checkpoint = str(work_dir / "checkpoint")
    commit_times: list[float] = []
    try:
        stream = spark.readStream.schema(SPARK_DDL).option("maxFilesPerTrigger", 1).parquet(str(spec["source_dir"]))
        metadata_location: str | None = None
        sink: Any = None
        if system == "ceiling":
            writer = stream.writeStream.format("noop").option("checkpointLocation", checkpoint)
            start = lambda: writer.trigger(availableNow=True).start()  # noqa: E731
        elif system == "iceberg_java":
            columns = SPARK_DDL.replace("long", "bigint")
            spark.sql(
                f"CREATE TABLE {JAVA_CATALOG}.{TABLE} ({columns}) USING iceberg "
                f"{JAVA_PARTITION_SQL if partitioned else ''}"
            )
            writer = (
                stream.writeStream.format("iceberg")
                .outputMode("append")
                .option("checkpointLocation", checkpoint)
                .option("fanout-enabled", "true" if partitioned else "false")
            )
            start = lambda: writer.trigger(availableNow=True).toTable(f"{JAVA_CATALOG}.{TABLE}")  # noqa: E731
        elif system in ("iceberg_sink", "iceberg_sink_jvm"):
            from iceberg_sink import IcebergSink

            builder = (
                IcebergSink.builder()
                .embedded(work_dir / "lake")
                .table(TABLE)
                .create_if_missing(partition_by=PARTITION_BY if partitioned else ())
                .post_commit_hook(lambda result: commit_times.append(time.time()))
            )
            options = dict(spec.get("sink_options") or {})
            if system == "iceberg_sink_jvm":  # Spark's own Parquet writer (writer/jvm.py), opt-in
                options["iceberg-sink.writer.jvm-parquet"] = "true"
            for key, value in options.items():
                builder = builder.write_option(key, value)
            sink = builder.build()
            # Create the table now (Java's is created before its stream too).
            sink.write(spark.createDataFrame([], SPARK_DDL))
            start = lambda: sink.start(stream, checkpoint_location=checkpoint, trigger={"availableNow": True})  # noqa: E731
        else:
            raise ValueError(f"unknown system {system!r}")

        waited = wait_quiet()
        wall_start = time.time()
        query = start()
        query.awaitTermination()
        wall_await = time.time()
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        progress = [p for p in _progress(query) if p.get("numInputRows", 0) > 0]
        end = max(_end_of(p) for p in progress) if progress else wall_await
        rows = sum(int(p["numInputRows"]) for p in progress)
        if system == "iceberg_java":
            metadata_location = _newest_metadata(work_dir / "warehouse" / "bench" / "events")
        elif sink is not None:
            metadata_location = sink.load_table().metadata_location
        seconds = end - wall_start
        log(
            system,
            f"{'partitioned' if partitioned else 'unpartitioned'}: {rows} rows in {seconds:.2f}s "
            f"= {rows / seconds:,.0f} rows/s ({len(progress)} batches)",
        )
        return {
            "system": system,
            "partitioned": partitioned,
            "spark_version": spark.version,
            "pyspark_version": pyspark.__version__,
            "rows": rows,
            "seconds": seconds,
            "rows_per_second": rows / seconds if seconds > 0 else None,
            "wall_start": wall_start,
            "wall_end": end,
            "await_seconds": wall_await - wall_start,
            "waited_for_quiet_seconds": waited,
            "batches": [
                {
                    "batch_id": p["batchId"],
                    "rows": p["numInputRows"],
                    "trigger_ms": p["durationMs"].get("triggerExecution"),
                    "add_batch_ms": p["durationMs"].get("addBatch"),
                    "end": _end_of(p),
                }
                for p in progress
            ],
            "commit_times": commit_times,
            "metadata_location": metadata_location,
        }
    finally:
        spark.stop()
        monitor.stop()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = run(spec)
    Path(spec["result"]).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
