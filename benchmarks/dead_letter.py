"""What the dead-letter path (``.dead_letter("ns.errors")``) costs when no row is refused.

    .venv/bin/python -m benchmarks.dead_letter [--batches 6 --batch-rows 200000 --rounds 3]

The same stream is written with and without ``.dead_letter``, each run in a fresh process (its own
JVM), in interleaved rounds (round 2 runs the variants in reverse order, and so on), in two modes:

* ``append``: an append sink, partitioned by ``bucket(8, user_id)``;
* ``upsert``: an ``.upsert(key=["id"])`` sink (the change reduction runs), unpartitioned.

Every variant applies the same ``map_batches`` check (``reject_where`` on ``amount < 0``, which no
row meets), so the two variants of a mode differ only by the dead-letter table. Each batch is one
``sink.write(df, checkpoint_location, checkpoint_id=i)`` (the code path of a stream's
``foreachBatch``), timed from reading its Parquet file to the end of its commit, with the number of
Spark jobs it ran (a job group per batch, ``statusTracker().getJobIdsForGroup``). The first batch
(JVM and Python workers warming up, tables created) is reported but left out of the medians.

Checks (exit status 1 if one fails): each table holds exactly the stream's rows (count and the sum
of ``id``), the dead-letter table exists and holds no row, and both variants ran the same number of
Spark jobs per batch (no extra job for the dead-letter path).

Prints one JSON document to stdout (also written to ``benchmarks/results/dead-letter.json``):
per run the per-batch seconds and Spark jobs, and the CPU seconds other processes used meanwhile
(``foreign_cpu_seconds``: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.cpu_monitor import ForeignCpuMonitor

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "dead-letter.json"
DDL = "id long, user_id long, ts timestamp, name string, amount double"


def log(message: str) -> None:
    print(f"[dead-letter {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def generate(folder: Path, batches: int, rows: int, seed: int) -> tuple[int, int]:
    """Write the stream's Parquet files; return (rows, sum of id)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    total = id_sum = 0
    for b in range(batches):
        ids = np.arange(b * rows, (b + 1) * rows, dtype=np.int64)
        table = pa.table(
            {
                "id": ids,
                "user_id": rng.integers(0, 50_000, rows),
                "ts": pa.array(1_700_000_000_000_000 + ids * 1_000, pa.timestamp("us", tz="UTC")),
                "name": pa.array([f"user-{i % 997}" for i in ids.tolist()], pa.string()),
                "amount": rng.random(rows) * 100,
            }
        )
        pq.write_table(table, folder / f"part-{b:05d}.parquet")
        total += rows
        id_sum += int(ids.sum())
    return total, id_sum


def driver(spec_path: str) -> int:
    """One variant in this fresh process; writes its result JSON to ``spec["result"]``."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from iceberg_sink import IcebergSink
    from iceberg_sink.sources.rejects import reject_where

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def negative(batch: Any) -> Any:
        return reject_where(batch, F.when(F.col("amount") < 0, F.lit("negative amount")), "Negative", F.col("name"))

    work = Path(spec["work"])
    builder = IcebergSink.builder().embedded(work / "lake").table("bench.t").map_batches(negative)
    if spec["mode"] == "upsert":
        # Format v2, as docs/benchmarks-dead-letter.md measured it (v3 is the upsert default).
        builder = builder.upsert(key=["id"]).create_if_missing(format_version=2)
    else:
        builder = builder.create_if_missing(partition_by=["bucket(8, user_id)"])
    if spec["dead_letter"]:
        builder = builder.dead_letter("bench.errors")
    sink = builder.build()
    files = sorted(Path(spec["source"]).glob("*.parquet"))
    batches = []
    for i, path in enumerate(files):
        group = f"batch-{i}"
        spark.sparkContext.setJobGroup(group, group)
        started = time.monotonic()
        sink.write(spark.read.schema(DDL).parquet(str(path)), checkpoint_location=str(work / "ck"), checkpoint_id=i)
        seconds = time.monotonic() - started
        jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
        batches.append({"seconds": round(seconds, 3), "spark_jobs": jobs})
    table = sink.load_table().scan().to_arrow()
    result: dict[str, Any] = {
        "batches": batches,
        "rows": table.num_rows,
        "id_sum": int(pa.compute.sum(table.column("id")).as_py() or 0),
    }
    if spec["dead_letter"]:
        result["dead_letter_rows"] = sink.load_table("bench.errors").scan().to_arrow().num_rows
        result["dead_letter_records_metric"] = sink.metrics().dead_letter_records
    Path(spec["result"]).write_text(json.dumps(result))
    spark.stop()
    return 0


def run_one(work: Path, source: Path, mode: str, dead_letter: bool, monitor: ForeignCpuMonitor) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-{'dl' if dead_letter else 'plain'}-", dir=work))
    spec = {
        "work": str(run_dir),
        "source": str(source),
        "mode": mode,
        "dead_letter": dead_letter,
        "result": str(run_dir / "result.json"),
    }
    (run_dir / "spec.json").write_text(json.dumps(spec))
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.dead_letter", "--driver", str(run_dir / "spec.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} dead_letter={dead_letter} failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(Path(spec["result"]).read_text())
    result["foreign_cpu_seconds"] = monitor.between(started, ended)
    result["wall_seconds"] = round(ended - started, 1)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--batch-rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="append,upsert")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--work-dir")
    args = parser.parse_args(argv)
    if args.driver:
        return driver(args.driver)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-dead-letter-"))
    source = work / "source"
    rows, id_sum = generate(source, args.batches, args.batch_rows, args.seed)
    monitor = ForeignCpuMonitor(interval=1.0).start()
    modes = args.modes.split(",")
    runs: dict[str, list[dict[str, Any]]] = {f"{m}/{v}": [] for m in modes for v in ("plain", "dead_letter")}
    for r in range(args.rounds):
        order = [(m, dl) for m in modes for dl in (False, True)]
        if r % 2:
            order.reverse()
        for mode, dl in order:
            log(f"round {r + 1}: {mode} {'with' if dl else 'without'} .dead_letter")
            runs[f"{mode}/{'dead_letter' if dl else 'plain'}"].append(run_one(work, source, mode, dl, monitor))
    monitor.stop()
    checks: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for mode in modes:
        for variant in ("plain", "dead_letter"):
            key = f"{mode}/{variant}"
            steady = [b["seconds"] for run in runs[key] for b in run["batches"][1:]]
            summary[key] = {
                "median_batch_seconds": round(statistics.median(steady), 3),
                "rows_per_second": round(args.batch_rows / statistics.median(steady)),
                "spark_jobs_per_batch": sorted({b["spark_jobs"] for run in runs[key] for b in run["batches"][1:]}),
                "foreign_cpu_seconds": [run["foreign_cpu_seconds"] for run in runs[key]],
            }
            for run in runs[key]:
                checks.append(
                    {"check": f"{key}: rows and id sum", "ok": (run["rows"], run["id_sum"]) == (rows, id_sum)}
                )
                if variant == "dead_letter":
                    ok = run["dead_letter_rows"] == 0 and run["dead_letter_records_metric"] == 0
                    checks.append({"check": f"{key}: dead-letter table empty", "ok": ok})
        plain, dead = summary[f"{mode}/plain"], summary[f"{mode}/dead_letter"]
        dead["vs_plain"] = round(dead["median_batch_seconds"] / plain["median_batch_seconds"], 3)
        same_jobs = plain["spark_jobs_per_batch"] == dead["spark_jobs_per_batch"]
        checks.append({"check": f"{mode}: same Spark jobs per batch with and without .dead_letter", "ok": same_jobs})
    doc = {
        "benchmark": "dead-letter",
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "batches": args.batches,
        "batch_rows": args.batch_rows,
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "summary": summary,
        "checks": checks,
        "runs": runs,
    }
    text = json.dumps(doc, indent=1)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text + "\n")
    print(text)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
