"""Does Spark's real-time mode take away the floor under a micro-batch? (issue 41)

    .venv/bin/python -m benchmarks.spark_real_time [--messages 600000] [--modes ...] [--out result.json]

Spark 4.1 added a real-time mode (``trigger(realTime=...)``): a batch is a long-running stage whose
tasks read Kafka records as they arrive, the trigger's duration its checkpoint interval. If its
batches followed one another without Spark's per-trigger work in between, it would be SinkV2's shape
inside Spark (writers that keep writing while each checkpoint is committed). This measures what it
does here, with no sink in the way: one Kafka broker (``scripts/pipeline_components.py``), one topic
of ``--partitions`` partitions holding ``--messages`` JSON messages of the CDC race's shape, produced
once before any timed window, and one query per mode, each in a fresh process reading the whole
topic from its earliest offsets (``from_json`` of the five columns), whose tasks only count rows (the Arrow modes into
Spark's ``noop`` sink):

- ``microbatch_arrow``: the sink's shape today, micro-batches of ``maxOffsetsPerTrigger`` (10,000)
  through a ``mapInArrow`` function, one micro-batch after another; ``microbatch_arrow_100k`` the same
  with micro-batches of 100,000 (about what a 1 s real-time batch reads here);
- ``realtime_foreach_5s``: what real-time mode supports for Python: a ``foreach`` writer (rows one at
  a time) at the default shortest batch, 5 s;
- ``realtime_arrow_5s`` and ``realtime_arrow_1s``: the ``mapInArrow`` function under real-time mode,
  which its operator allowlist refuses (``spark.sql.streaming.realTimeMode.allowlistCheck=false``
  lets it run), at 5 s and at 1 s (``spark.sql.streaming.realTimeMode.minBatchDuration=1000``).

Every task writes what it counted and when it started and ended; per mode the result has rows/s end
to end (from the ``start`` call) and over the second half of the rows, batches, the median time a
batch's tasks ran and the median **gap** between one batch's last task ending and the next batch's
first task starting (Spark's work between batches, nobody's rows moving), and CPU-seconds per million
rows (the query's process tree, the broker apart). Prints JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import cdc_kafka
from benchmarks.cpu_monitor import tree_cpu_seconds
from benchmarks.key_index_reads import emit

MODES = ("microbatch_arrow", "microbatch_arrow_100k", "realtime_foreach_5s", "realtime_arrow_5s", "realtime_arrow_1s")
SCHEMA = "id long, name string, version long, amount double, ts timestamp"
RUN_TIMEOUT_S = 900.0


def message_lines(messages: int, keys: int, seed: int) -> Iterator[str]:
    """``key<TAB>value`` lines of the CDC race's message shape, random keys out of ``keys``."""
    rng = random.Random(seed)
    for version in range(messages):
        key = rng.randrange(keys)
        yield (
            f'{key}\t{{"id":{key},"name":"user-{key}-v{version}","version":{version},'
            f'"amount":{rng.randrange(100_000) / 100},"ts":"2024-02-01T10:00:00.123456Z"}}'
        )


def _task_record(out: Path, batch: str | int | None, partition: int, rows: int, started: float) -> None:
    record = {"batch": int(batch or 0), "partition": partition, "rows": rows, "start": started, "end": time.time()}
    name = f"{record['batch']}-{partition}-{os.getpid()}-{time.monotonic_ns()}.json"
    (out / name).write_text(json.dumps(record))


def run_mode(mode: str, bootstrap: str, topic: str, messages: int, out: Path) -> dict[str, Any]:
    """One query of ``mode`` over the whole topic in this (fresh) process; returns its measures."""
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    real_time = mode.startswith("realtime")
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", ",".join(cdc_kafka.spark_kafka_jars()))
    )
    if "arrow" in mode and real_time:
        builder = builder.config("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
    if mode.endswith("_1s"):
        builder = builder.config("spark.sql.streaming.realTimeMode.minBatchDuration", "1000")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out.mkdir(parents=True)

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if not real_time:
        reader = reader.option("maxOffsetsPerTrigger", 100_000 if mode.endswith("_100k") else 10_000)
    rows = reader.load().select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("v")).select("v.*")

    if "arrow" in mode:

        def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            started, counted = time.time(), 0
            for batch in batches:
                counted += batch.num_rows
            context = TaskContext.get()
            assert context is not None
            _task_record(
                out, context.getLocalProperty("streaming.sql.batchId"), context.partitionId(), counted, started
            )
            yield pa.RecordBatch.from_pylist([{"rows": counted}])

        # Spark's no-op sink (nothing crosses to Python after the function; the allowlist check is
        # off for the real-time Arrow modes anyway)
        writer = rows.mapInArrow(count, "rows long").writeStream.format("noop")
    else:

        class Count:
            def open(self, partition_id: int, epoch_id: int) -> bool:
                self.partition, self.batch, self.rows, self.started = partition_id, epoch_id, 0, time.time()
                return True

            def process(self, row: Any) -> None:
                self.rows += 1

            def close(self, error: BaseException | None) -> None:
                _task_record(out, self.batch, self.partition, self.rows, self.started)

        writer = rows.writeStream.foreach(Count())

    writer = writer.option("checkpointLocation", str(out.parent / f"checkpoint-{mode}"))
    if real_time:
        writer = writer.outputMode("update").trigger(realTime="1 second" if mode.endswith("_1s") else "5 seconds")
    cpu_before = tree_cpu_seconds()
    started = time.time()
    query = writer.start()
    records: dict[str, dict[str, Any]] = {}  # by file name: each task's file is read once
    while sum(r["rows"] for r in records.values()) < messages and time.time() - started < RUN_TIMEOUT_S:
        time.sleep(0.5)
        if query.exception() is not None:
            raise RuntimeError(f"{mode}: the query failed: {query.exception()}")
        for p in out.iterdir():
            if p.name not in records:
                records[p.name] = json.loads(p.read_text())
    cpu_after = tree_cpu_seconds()
    query.stop()
    spark.stop()
    counted = sum(r["rows"] for r in records.values())
    if counted < messages:
        raise RuntimeError(f"{mode}: {counted} of {messages} rows within {RUN_TIMEOUT_S:g} s")
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return summarize(list(records.values()), started, messages, cpu)


def summarize(records: list[dict[str, Any]], started: float, messages: int, cpu: float | None) -> dict[str, Any]:
    """Per batch: rows, first start, last end; then the rates, the batches' run times and the gaps."""
    batches: dict[int, dict[str, float]] = {}
    for r in records:
        b = batches.setdefault(r["batch"], {"rows": 0, "start": r["start"], "end": r["end"]})
        b["rows"] += r["rows"]
        b["start"], b["end"] = min(b["start"], r["start"]), max(b["end"], r["end"])
    ordered = [batches[k] for k in sorted(batches)]
    with_rows = [b for b in ordered if b["rows"]]
    last_end = with_rows[-1]["end"]
    total, half_at = 0.0, None
    for b in with_rows:
        total += b["rows"]
        if half_at is None and total >= messages / 2:
            half_at, rows_before = b["end"], total
    assert half_at is not None
    gaps = [nxt["start"] - b["end"] for b, nxt in itertools.pairwise(ordered)]
    runs = [b["end"] - b["start"] for b in with_rows]
    return {
        "rows": int(total),
        "batches": len(ordered),
        "batches_with_rows": len(with_rows),
        "rows_per_s_end_to_end": round(messages / (last_end - started)),
        "rows_per_s_second_half": round((messages - rows_before) / (last_end - half_at))
        if last_end > half_at
        else None,
        "rows_per_batch_p50": round(statistics.median(b["rows"] for b in with_rows)),
        "batch_run_s_p50": round(statistics.median(runs), 3),
        "gap_between_batches_s_p50": round(statistics.median(gaps), 3) if gaps else None,
        "gap_between_batches_s_max": round(max(gaps), 3) if gaps else None,
        "cpu_seconds": None if cpu is None else round(cpu, 2),
        "cpu_seconds_per_million_rows": None if cpu is None else round(cpu / messages * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=600_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--out")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a mode's own process: mode,bootstrap,topic,dir
    args = parser.parse_args()
    if args.run:
        mode, bootstrap, topic, out = args.run.split(",", 3)
        print(json.dumps(run_mode(mode, bootstrap, topic, args.messages, Path(out))))
        return

    import pyspark

    result: dict[str, Any] = {
        "benchmark": "spark_real_time",
        "spark": pyspark.__version__,
        "messages": args.messages,
        "partitions": args.partitions,
        "modes": {},
    }
    pc = cdc_kafka.components()
    with tempfile.TemporaryDirectory(prefix="spark-real-time-") as tmp:
        work = Path(tmp)
        broker = pc.KafkaBroker(work / "kafka")
        broker.start()
        try:
            broker.create_topic("changes", partitions=args.partitions)
            lines = work / "messages.txt"
            lines.write_text("\n".join(message_lines(args.messages, args.keys, args.seed)) + "\n")
            cdc_kafka.produce(broker, "changes", lines)
            end = broker.end_offsets("changes").get("changes", {})
            if sum(end.values()) != args.messages:
                raise RuntimeError(f"expected {args.messages} messages, the topic's end offsets are {end}")
            for mode in args.modes:
                cdc_kafka.log(f"{mode}: a fresh process reads {args.messages} messages")
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.spark_real_time", "--messages", str(args.messages),
                     "--run", f"{mode},{broker.bootstrap},changes,{work / mode}"],
                    capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 300, check=False,
                )  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"{mode} failed ({done.returncode}):\n{done.stderr[-4000:]}")
                result["modes"][mode] = json.loads(done.stdout.strip().splitlines()[-1])
                cdc_kafka.log(f"{mode}: {result['modes'][mode]}")
        finally:
            broker.stop()
    emit(result, args.out)


if __name__ == "__main__":
    main()
