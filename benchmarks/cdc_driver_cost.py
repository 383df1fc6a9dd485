"""The driver's share of one CDC checkpoint: Py4J calls and wall time per stage of ``sink.write()``.

Issue 22's write target (a 10k-change upsert in <= 0.45 s) is missed by the driver work around the
Spark job and the commit. This script measures that work apart from everything else: one Spark
session, an upsert sink on a small table (``--rows`` initial rows, embedded SQLite catalog), then
``--batches`` bounded ``sink.write()`` calls of ``--batch-size`` changes (half updates of existing
ids, half inserts of new ids, as benchmarks/cdc.py), each a checkpoint of one checkpoint location.

Per batch it reports, for each stage of the write path (wrapped at run time; what the sink does is
unchanged), the wall time and the number of Py4J round trips (``GatewayClient.send_command``
wrapped): a count does not depend on the machine's load, times do. The Py4J calls are also counted
per call site (the innermost ``iceberg_sink`` frame), to show where they come from.

    python -m benchmarks.cdc_driver_cost --batches 12 --out /tmp/driver-cost.json

The figures of docs/benchmarks-cdc.md ("The driver's share of a batch") come from this script.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SPARK_DDL = "id bigint, name string, version bigint, amount double, ts timestamp"


class Counter:
    """Wall time and Py4J calls per stage, and Py4J calls per iceberg_sink call site."""

    def __init__(self) -> None:
        self.py4j = 0
        self.stack: list[str] = []
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.sites: collections.Counter[str] = collections.Counter()
        self._restore: list[Callable[[], None]] = []

    def _site(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if "/iceberg_sink/" in name:
                return f"{name.split('/iceberg_sink/')[-1]}:{frame.f_code.co_name}"
            frame = frame.f_back  # type: ignore[assignment]
        return "(outside iceberg_sink)"

    def wrap(self, owner: Any, attribute: str, stage: str) -> None:
        original = getattr(owner, attribute)
        counter = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            outer = counter.stack[-1] if counter.stack else None
            counter.stack.append(stage)
            calls, started = counter.py4j, time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                counter.stack.pop()
                seconds, n = time.perf_counter() - started, counter.py4j - calls
                counter.seconds[stage] += seconds
                counter.calls[stage] += n
                if outer is not None:  # stages are exclusive: an inner stage's share leaves the outer one
                    counter.seconds[outer] -= seconds
                    counter.calls[outer] -= n

        setattr(owner, attribute, timed)
        self._restore.append(lambda: setattr(owner, attribute, original))

    @contextmanager
    def installed(self) -> Iterator[Counter]:
        from py4j.java_gateway import GatewayClient

        from iceberg_sink import sink as sink_module
        from iceberg_sink.committer.aggregator import CommitAggregator
        from iceberg_sink.committer.committer import IcebergCommitter
        from iceberg_sink.committer.store import CheckpointStore
        from iceberg_sink.job import dead_letter, pipeline
        from iceberg_sink.job.binding import TableBinding

        send = GatewayClient.send_command
        counter = self

        def counted(client: Any, *args: Any, **kwargs: Any) -> Any:
            counter.py4j += 1
            counter.sites[counter._site()] += 1
            return send(client, *args, **kwargs)

        GatewayClient.send_command = counted  # type: ignore[method-assign]
        self._restore.append(lambda: setattr(GatewayClient, "send_command", send))
        self.wrap(sink_module.IcebergSink, "write", "write (rest)")
        self.wrap(TableBinding, "ensure", "table check (ensure)")
        self.wrap(pipeline.SinkJob, "commit_pending", "commit pending")
        self.wrap(pipeline.SinkJob, "writer_spec", "writer spec")
        self.wrap(pipeline, "reduce_changes", "reduction plan")
        self.wrap(pipeline.toast, "resolve", "toast plan")
        self.wrap(dead_letter, "enforce", "reject plan")
        self.wrap(pipeline, "distribute", "distribution plan")
        self.wrap(pipeline, "write_dataframe", "spark job")
        self.wrap(CommitAggregator, "aggregate", "aggregate (manifests)")
        self.wrap(CheckpointStore, "put", "persist committable")
        self.wrap(IcebergCommitter, "commit", "commit")
        try:
            yield self
        finally:
            for restore in reversed(self._restore):
                restore()
            self._restore.clear()

    def take(self) -> dict[str, Any]:
        out = {
            "py4j_calls": self.py4j,
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
            "calls": dict(self.calls),
            "sites": dict(self.sites.most_common()),
        }
        self.py4j = 0
        self.seconds.clear()
        self.calls.clear()
        self.sites.clear()
        return out


def _rows(ids: np.ndarray, version: int, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"name-{i}" for i in ids], pa.string()),
            "version": pa.array(np.full(len(ids), version), pa.int64()),
            "amount": pa.array(np.round(rng.random(len(ids)) * 10_000, 2), pa.float64()),
            "ts": pa.array((1_700_000_000_000_000 + rng.integers(0, 10**12, len(ids))).astype("datetime64[us]")),
        }
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from iceberg_sink import IcebergSink

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cdc-driver-cost-"))
    rng = np.random.default_rng(7)
    pq.write_table(_rows(np.arange(args.rows), 0, rng), work / "initial.parquet")
    files = []
    for b in range(1, args.batches + 1):
        half = args.batch_size // 2
        updated = rng.choice(args.rows, size=half, replace=False)
        inserted = np.arange(args.rows + (b - 1) * half, args.rows + b * half)
        path = work / f"batch-{b:04d}.parquet"
        pq.write_table(_rows(np.concatenate([updated, inserted]), b, rng), path)
        files.append(str(path))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    table = "bench.cdc"
    # Format v2 (equality deletes), as docs/benchmarks-cdc.md measured it: v3 is the CDC default since issue 42.
    sink = (
        IcebergSink.builder()
        .embedded(work / "lake")
        .table(table)
        .create_if_missing(format_version=2)
        .upsert(key=["id"])
        .build()
    )
    sink.write(spark.createDataFrame([], SPARK_DDL))
    initial = spark.read.schema(SPARK_DDL).parquet(str(work / "initial.parquet"))
    initial = initial.where(F.col("id").isNotNull()).withColumn("id", F.coalesce("id", F.lit(0).cast("bigint")))
    IcebergSink.builder().embedded(work / "lake").table(table).build().write(initial)

    checkpoint = str(work / "checkpoint")
    batches: list[dict[str, Any]] = []
    counter = Counter()
    with counter.installed():
        for index, path in enumerate(files):
            started = time.perf_counter()
            batch = spark.read.schema(SPARK_DDL).parquet(path)
            sink.write(batch, checkpoint_location=checkpoint, checkpoint_id=index)
            record = counter.take()
            record["total_seconds"] = round(time.perf_counter() - started, 4)
            batches.append(record)
            print(
                f"batch {index}: {record['total_seconds']:.3f}s, {record['py4j_calls']} Py4J calls",
                file=sys.stderr,
            )
    spark.stop()
    steady = batches[args.warmup :]
    stages = sorted({s for b in steady for s in b["seconds"]})
    summary = {
        "py4j_calls_median": statistics.median(b["py4j_calls"] for b in steady),
        "total_seconds_median": round(statistics.median(b["total_seconds"] for b in steady), 4),
        "stages": {
            s: {
                "seconds_median": round(statistics.median(b["seconds"].get(s, 0.0) for b in steady), 4),
                "py4j_calls_median": statistics.median(b["calls"].get(s, 0) for b in steady),
            }
            for s in stages
        },
        "sites_last_batch": steady[-1]["sites"] if steady else {},
    }
    return {"args": vars(args), "summary": summary, "batches": batches}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=2, help="batches left out of the medians")
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result["summary"], indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
