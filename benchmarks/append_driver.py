"""One system of the append benchmark, in a process of its own (started by ``benchmarks/append.py``).

    <python> -m benchmarks.append_driver SPEC.json

Runs with whatever PySpark the interpreter has: the main venv (Spark 4.x) or the Java venv (Spark
3.5, which also has the Iceberg runtime jar). ``SPEC.json`` says which system:

- ``ceiling``: Spark reads the Parquet file stream and only counts it: the ``noop`` sink, which
  pulls every column of every row through Spark and discards it (its query progress counts the
  rows). No sink can be faster on the same Spark.
- ``iceberg_java``: ``CREATE TABLE`` (format v2, Parquet/zstd, Iceberg's defaults) in a Hadoop
  catalog, then ``writeStream.format("iceberg")``, with ``fanout-enabled`` on partitioned tables
  (Iceberg's advice for streaming, since a streaming write cannot ask Spark to cluster rows). On
  Spark 3.5 with Iceberg 1.9.2 (the Java venv) or Spark 4.1 with the newest Iceberg (the newest venv).
- ``iceberg_sink``: ``import iceberg_sink``, the builder with an embedded SQLite catalog and
  ``create_if_missing``, then ``IcebergSink.start(...)`` (which creates the table).
- ``iceberg_sink_jvm``: the same with ``iceberg-sink.writer.jvm-parquet=true`` (Spark's Parquet writer).

Every system reads the same folder with ``maxFilesPerTrigger=1`` and ``Trigger.AvailableNow``, so
each file is one micro-batch. The timed window is symmetric: it starts once the SparkSession and the
stream's DataFrame exist and holds everything else each system's user runs (table creation, the
sink's import and builder, the start call), up to the end of the last micro-batch (its progress
``timestamp`` plus ``triggerExecution``; the commit of both Iceberg writers happens inside it).
Nothing is written or warmed up before it. Reported: end to end (the whole window), steady state
(from the end of batch 1 to the end of batch N), start-up (the end of batch 1 minus a median steady
batch), and CPU-seconds of the whole process tree (driver, JVM, Python workers) for both, read from
``/proc`` at the window's start, at each batch's progress event and at the end. The result JSON goes
to ``spec["result"]``; progress to stderr.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.append_data import SPARK_DDL
from benchmarks.cpu_monitor import quiet_gate, tree_cpu_seconds
from benchmarks.driver_main import driver_main

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


class _BatchClock:
    """A StreamingQueryListener that reads the process tree's CPU seconds as each batch's progress arrives."""

    def __init__(self) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        clock = self

        class Listener(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                clock.cpu[int(event.progress.batchId)] = tree_cpu_seconds()

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        self.cpu: dict[int, float | None] = {}
        self.listener = Listener()


def _start_sink(spec: dict[str, Any], stream: Any, checkpoint: str, commit_times: list[float]) -> tuple[Any, Any]:
    """Everything a user of the sink runs: the import, the builder, start() (it creates the table)."""
    from iceberg_sink import IcebergSink

    builder = (
        IcebergSink.builder()
        .embedded(Path(spec["work_dir"]) / "lake")
        .table(TABLE)
        .create_if_missing(partition_by=PARTITION_BY if spec["partitioned"] else ())
        .post_commit_hook(lambda result: commit_times.append(time.time()))
    )
    options = dict(spec.get("sink_options") or {})
    if spec["system"] == "iceberg_sink_jvm":  # Spark's own Parquet writer (writer/jvm.py), opt-in
        options["iceberg-sink.writer.jvm-parquet"] = "true"
    for key, value in options.items():
        builder = builder.write_option(key, value)
    sink = builder.build()
    return sink, sink.start(stream, checkpoint_location=checkpoint, trigger={"availableNow": True})


def _start_java(spark: Any, spec: dict[str, Any], stream: Any, checkpoint: str) -> Any:
    """Everything a user of Spark's Iceberg writer runs: CREATE TABLE, then writeStream."""
    columns = SPARK_DDL.replace("long", "bigint")
    partitioned = spec["partitioned"]
    spark.sql(
        f"CREATE TABLE {JAVA_CATALOG}.{TABLE} ({columns}) USING iceberg {JAVA_PARTITION_SQL if partitioned else ''}"
    )
    writer = (
        stream.writeStream.format("iceberg")
        .outputMode("append")
        .option("checkpointLocation", checkpoint)
        .option("fanout-enabled", "true" if partitioned else "false")
    )
    return writer.trigger(availableNow=True).toTable(f"{JAVA_CATALOG}.{TABLE}")


def _figures(
    batches: list[dict[str, Any]], wall_start: float, cpu_start: float | None, cpu_end: float | None
) -> dict[str, Any]:
    """End to end (from the start call) and steady state (batches 2..N) figures of one run."""
    rows = sum(int(b["rows"]) for b in batches)
    ends = [b["end"] for b in batches]
    out: dict[str, Any] = {"rows": rows, "batch_count": len(batches)}
    seconds = ends[-1] - wall_start
    out["seconds"] = seconds
    out["rows_per_second"] = rows / seconds if seconds > 0 else None
    cpu = cpu_end - cpu_start if cpu_start is not None and cpu_end is not None else None
    out["cpu_seconds"] = cpu
    out["cpu_seconds_per_million_rows"] = cpu / rows * 1e6 if cpu is not None and rows else None
    out["first_batch_end_seconds"] = ends[0] - wall_start
    if len(batches) >= 2:
        steady_rows = sum(int(b["rows"]) for b in batches[1:])
        steady_seconds = ends[-1] - ends[0]
        steps = [b - a for a, b in itertools.pairwise(ends)]
        steady_batch = statistics.median(steps)
        out["steady_seconds"] = steady_seconds
        out["steady_rows_per_second"] = steady_rows / steady_seconds if steady_seconds > 0 else None
        out["steady_batch_seconds"] = steady_batch
        # The start call and what the first batch costs beyond a steady one.
        out["startup_seconds"] = (ends[0] - wall_start) - steady_batch
        first_cpu, last_cpu = batches[0].get("cpu_at_progress"), batches[-1].get("cpu_at_progress")
        steady_cpu = last_cpu - first_cpu if first_cpu is not None and last_cpu is not None else None
        out["steady_cpu_seconds"] = steady_cpu
        out["steady_cpu_seconds_per_million_rows"] = steady_cpu / steady_rows * 1e6 if steady_cpu is not None else None
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One system, one shape. The timed window starts once the SparkSession and the stream's
    DataFrame exist (every system needs both) and holds everything else the system's user runs:
    table creation, imports of the sink, the builder, the start call and every batch. Nothing is
    run before it for one system that is not run for the other."""
    import pyspark

    system = spec["system"]
    partitioned = bool(spec["partitioned"])
    work_dir = Path(spec["work_dir"])
    monitor, wait_quiet = quiet_gate(spec)
    spark = start_spark(spec, work_dir)
    checkpoint = str(work_dir / "checkpoint")
    commit_times: list[float] = []
    clock = _BatchClock()
    try:
        stream = spark.readStream.schema(SPARK_DDL).option("maxFilesPerTrigger", 1).parquet(str(spec["source_dir"]))
        spark.streams.addListener(clock.listener)
        sink: Any = None
        if system not in ("ceiling", "iceberg_java", "iceberg_sink", "iceberg_sink_jvm"):
            raise ValueError(f"unknown system {system!r}")
        waited = wait_quiet()
        wall_start = time.time()
        cpu_start = tree_cpu_seconds()
        if system == "ceiling":
            writer = stream.writeStream.format("noop").option("checkpointLocation", checkpoint)
            query = writer.trigger(availableNow=True).start()
        elif system == "iceberg_java":
            query = _start_java(spark, spec, stream, checkpoint)
        else:
            sink, query = _start_sink({**spec, "work_dir": str(work_dir)}, stream, checkpoint, commit_times)
        start_call_seconds = time.time() - wall_start
        query.awaitTermination()
        cpu_end = tree_cpu_seconds()
        wall_await = time.time()
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        time.sleep(0.5)  # let the listener bus deliver the last progress event
        progress = [p for p in _progress(query) if p.get("numInputRows", 0) > 0]
        batches = [
            {
                "batch_id": p["batchId"],
                "rows": p["numInputRows"],
                "trigger_ms": p["durationMs"].get("triggerExecution"),
                "add_batch_ms": p["durationMs"].get("addBatch"),
                "end": _end_of(p),
                "cpu_at_progress": clock.cpu.get(int(p["batchId"])),
            }
            for p in progress
        ]
        if not batches:
            raise RuntimeError("the stream ran no batch with rows")
        figures = _figures(batches, wall_start, cpu_start, cpu_end)
        metadata_location: str | None = None
        if system == "iceberg_java":
            metadata_location = _newest_metadata(work_dir / "warehouse" / "bench" / "events")
        elif sink is not None:
            metadata_location = sink.load_table().metadata_location
        log(
            system,
            f"{'partitioned' if partitioned else 'unpartitioned'}: {figures['rows']} rows in {figures['seconds']:.2f}s "
            f"= {figures['rows_per_second']:,.0f} rows/s end to end, "
            f"{(figures.get('steady_rows_per_second') or 0):,.0f} steady, start-up {figures.get('startup_seconds', 0):.2f}s, "
            f"{(figures['cpu_seconds_per_million_rows'] or 0):.1f} CPU-s per M rows ({len(batches)} batches)",
        )
        return {
            "system": system,
            "partitioned": partitioned,
            "spark_version": spark.version,
            "pyspark_version": pyspark.__version__,
            **figures,
            "start_call_seconds": start_call_seconds,
            "wall_start": wall_start,
            "wall_end": batches[-1]["end"],
            "await_seconds": wall_await - wall_start,
            "waited_for_quiet_seconds": waited,
            "batches": batches,
            "commit_times": commit_times,
            "metadata_location": metadata_location,
        }
    finally:
        spark.stop()
        monitor.stop()


def main(argv: list[str]) -> int:
    return driver_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
