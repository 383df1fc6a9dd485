"""Commit-cost benchmark: does a CDC stream's commit stay as fast at checkpoint 1,000 as at checkpoint 10?

    .venv/bin/python -m benchmarks.commits [--checkpoints 1000] [--changes 100] [--expire-every 50]
                                           [--retain-last 10] [--out benchmarks/results/commits.json]

One process, one SparkSession (PySpark 4.x, ``local[2]``), one embedded catalog (SQLite + local
warehouse) in a temporary directory. Four tables, each written by its own
``.cdc(op_column="op", key=["id"], order_by="lsn")`` sink with its own checkpoint location, one per
configuration:

- ``merge``: manifests merged on commit (``commit.manifest-merge.enabled`` true, Iceberg's default
  ``commit.manifest.min-count-to-merge`` 100 and ``commit.manifest.target-size-bytes`` 8 MB);
- ``no-merge``: ``commit.manifest-merge.enabled=false`` (one more manifest per checkpoint, as before);
- ``merge+expire`` / ``no-merge+expire``: the same, plus ``maintenance.expire_snapshots(older_than=now,
  retain_last=--retain-last)`` every ``--expire-every`` checkpoints.

Every table has ``write.metadata.delete-after-commit.enabled=true`` (the metadata log keeps Iceberg's
default ``write.metadata.previous-versions-max`` of 100). Checkpoint ``i`` of every configuration
is written before checkpoint ``i+1`` of any (interleaved, so machine noise falls on all alike); each
is ``sink.write(df, checkpoint_location=..., checkpoint_id=i)`` with ``--changes`` CDC rows (about 70%
upserts of random keys, 30% deletes), one snapshot per checkpoint.

Measured per checkpoint: the **commit latency**, the sink's own ``last_commit_duration_ms`` metric
(``PendingCommits.commit``, job/pending.py: the committer's idempotence check, manifests, manifest merge, manifest list and
the catalog commit, which parses and writes metadata.json), and the whole ``sink.write`` wall time.
Every ``--sample-every`` checkpoints: metadata.json size, snapshot count, manifests listed by the
current snapshot, and the metadata folder's file count and bytes. Reported: p50/p99 of the commit
latency over an early window (checkpoints 1-20) and a late one (the last 20), their ratios, and the
same over the first and last 100 checkpoints, and the CPU other processes used meanwhile
(``benchmarks/cpu_monitor.py``; in cores, per write). After the run each table is read by DuckDB and
Iceberg Java and compared with the model (rows, sum of versions). JSON goes to stdout and ``--out``;
progress to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_monitor import ForeignCpuMonitor

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TABLE_DDL = "id long, v string, version long, lsn long, op string"
CONFIGS: dict[str, dict[str, Any]] = {
    "merge": {"merge": True, "expire": False},
    "no-merge": {"merge": False, "expire": False},
    "merge+expire": {"merge": True, "expire": True},
    "no-merge+expire": {"merge": False, "expire": True},
}
EARLY = (1, 20)


def log(message: str) -> None:
    print(f"[commits {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def window_stats(latency: dict[int, float], first: int, last: int) -> dict[str, float]:
    values = [ms for cp, ms in latency.items() if first <= cp <= last]
    return {
        "checkpoints": [first, last],  # type: ignore[dict-item]
        "n": len(values),
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "mean_ms": statistics.fmean(values) if values else float("nan"),
    }


def _mean_in(values: dict[int, float], first: int, last: int) -> float:
    picked = [v for c, v in values.items() if first <= c <= last]
    return statistics.fmean(picked) if picked else float("nan")


class Stream:
    """One configuration: a CDC sink on its own table, its model and what was measured."""

    def __init__(self, name: str, config: dict[str, Any], lake: Path, work: Path) -> None:
        from iceberg_sink import IcebergSink

        self.name = name
        self.config = config
        self.table = f"bench.{name.replace('-', '_').replace('+', '_')}"
        properties = {"write.metadata.delete-after-commit.enabled": "true"}
        if not config["merge"]:
            properties["commit.manifest-merge.enabled"] = "false"
        self.sink = (
            IcebergSink.builder()
            .embedded(lake)
            .table(self.table)
            # Format v2 (equality deletes), as docs/benchmarks-commits.md measured it (v3 is the CDC default).
            .create_if_missing(properties=properties, format_version=2)
            .cdc(op_column="op", key=["id"], order_by="lsn")
            .build()
        )
        self.checkpoint_location = str(work / f"ckpt-{name}")
        self.model: dict[int, tuple[str, int]] = {}
        self.commit_ms: dict[int, float] = {}
        self.write_s: dict[int, float] = {}
        self.foreign_cores: dict[int, float] = {}
        self.samples: list[dict[str, Any]] = []
        self.expiries: list[dict[str, Any]] = []


def make_batch(rng: random.Random, stream: Stream, keys: int, changes: int, lsn: int) -> list[tuple[Any, ...]]:
    rows = []
    for key in rng.sample(range(keys), changes):
        lsn += 1
        if key in stream.model and rng.random() < 0.3:
            value, version = stream.model.pop(key)
            rows.append((key, value, version, lsn, "D"))
        else:
            version = stream.model.get(key, ("", 0))[1] + 1
            value = f"v{version}-{rng.randrange(10**6)}"
            stream.model[key] = (value, version)
            rows.append((key, value, version, lsn, "U"))
    return rows


def metadata_location(catalog_db: Path, table: str) -> str:
    namespace, name = table.split(".")
    with sqlite3.connect(catalog_db) as con:
        row = con.execute(
            "select metadata_location from iceberg_tables where table_namespace = ? and table_name = ?",
            (namespace, name),
        ).fetchone()
    return str(row[0])


def sample(stream: Stream, checkpoint: int) -> dict[str, Any]:
    from pyiceberg.manifest import ManifestContent

    table = stream.sink.load_table()
    location = Path(table.metadata_location.removeprefix("file://"))
    snapshot = table.current_snapshot()
    listed = snapshot.manifests(table.io) if snapshot is not None else []
    folder = location.parent
    files = [p for p in folder.iterdir() if p.is_file()]
    return {
        "checkpoint": checkpoint,
        "metadata_json_bytes": location.stat().st_size,
        "snapshots": len(table.metadata.snapshots),
        "metadata_log_entries": len(table.metadata.metadata_log),
        "data_manifests": sum(1 for m in listed if m.content == ManifestContent.DATA),
        "delete_manifests": sum(1 for m in listed if m.content == ManifestContent.DELETES),
        "metadata_json_files": sum(1 for p in files if p.name.endswith(".metadata.json")),
        "metadata_folder_files": len(files),
        "metadata_folder_bytes": sum(p.stat().st_size for p in files),
    }


def verify(streams: list[Stream], java: bool) -> dict[str, Any]:
    """Read every table back (DuckDB, Iceberg Java) and compare with its model."""
    sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.readers import JavaIcebergReader, duckdb_read

    reader = JavaIcebergReader() if java else None
    out: dict[str, Any] = {}
    try:
        for stream in streams:
            location = stream.sink.load_table().metadata_location
            expected = sorted((k, v, ver) for k, (v, ver) in stream.model.items())
            result: dict[str, Any] = {"expected_rows": len(expected)}
            reads = {"duckdb": duckdb_read(location)}
            if reader is not None:
                reads["iceberg_java"] = reader.read(location)
            for who, read in reads.items():
                got = sorted(
                    zip(read["id"].to_pylist(), read["v"].to_pylist(), read["version"].to_pylist(), strict=True)
                )
                result[who] = {"rows": len(got), "matches_model": got == expected}
            out[stream.name] = result
    finally:
        if reader is not None:
            reader.close()
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import pyiceberg
    import pyspark
    from pyspark.sql import SparkSession

    from iceberg_sink.topology import maintenance

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("commits-benchmark")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.cores))
        .config("spark.default.parallelism", str(args.cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(work / "spark-local"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lake = work / "lake"
    names = [n for n in CONFIGS if n in args.configs]
    streams = [Stream(name, CONFIGS[name], lake, work) for name in names]
    rng = random.Random(args.seed)
    # Other processes' CPU use during each write: the machine may be shared (cpu_monitor.py).
    monitor = ForeignCpuMonitor().start()
    started = time.perf_counter()
    try:
        lsn = 0
        for checkpoint in range(args.checkpoints):
            for stream in streams:
                rows = make_batch(rng, stream, args.keys, args.changes, lsn)
                lsn += len(rows)
                df = spark.createDataFrame(rows, TABLE_DDL)
                commits_before = stream.sink.metrics().commits
                t0, wall = time.perf_counter(), time.time()
                stream.sink.write(df, checkpoint_location=stream.checkpoint_location, checkpoint_id=checkpoint)
                stream.write_s[checkpoint] = time.perf_counter() - t0
                foreign = monitor.between(wall, time.time())
                if foreign is not None:
                    stream.foreign_cores[checkpoint] = foreign / stream.write_s[checkpoint]
                metrics = stream.sink.metrics()
                if metrics.commits != commits_before + 1:
                    raise RuntimeError(f"{stream.name}: checkpoint {checkpoint} made no snapshot")
                stream.commit_ms[checkpoint] = metrics.last_commit_duration_ms
                if stream.config["expire"] and checkpoint % args.expire_every == args.expire_every - 1:
                    t0 = time.perf_counter()
                    expired = maintenance.expire_snapshots(
                        stream.sink.load_table, dt.datetime.now(dt.UTC), retain_last=args.retain_last
                    )
                    stream.expiries.append(
                        {
                            "after_checkpoint": checkpoint,
                            "seconds": time.perf_counter() - t0,
                            "expired_snapshots": len(expired.expired_snapshot_ids),
                            "deleted_files": len(expired.deleted_files),
                        }
                    )
                if checkpoint % args.sample_every == 0 or checkpoint == args.checkpoints - 1:
                    stream.samples.append(sample(stream, checkpoint))
            if checkpoint % 25 == 0 or checkpoint == args.checkpoints - 1:
                log(
                    f"checkpoint {checkpoint}: "
                    + "; ".join(
                        f"{s.name} commit {s.commit_ms[checkpoint]:.0f} ms, write {s.write_s[checkpoint]:.2f} s"
                        for s in streams
                    )
                )
        elapsed = time.perf_counter() - started
    finally:
        monitor.stop()
        spark.stop()
    last = args.checkpoints - 1
    late = (max(EARLY[1] + 1, last - (EARLY[1] - EARLY[0])), last)
    results: dict[str, Any] = {}
    for stream in streams:
        early_w = window_stats(stream.commit_ms, *EARLY)
        late_w = window_stats(stream.commit_ms, *late)
        early_w["foreign_cores_mean"] = _mean_in(stream.foreign_cores, *EARLY)
        late_w["foreign_cores_mean"] = _mean_in(stream.foreign_cores, *late)
        first100 = window_stats(stream.commit_ms, 1, min(100, last))
        last100 = window_stats(stream.commit_ms, max(1, last - 99), last)
        results[stream.name] = {
            "config": stream.config,
            "table": stream.table,
            "commit_latency": {
                "early": early_w,
                "late": late_w,
                "ratio_p50": late_w["p50_ms"] / early_w["p50_ms"],
                "ratio_p99": late_w["p99_ms"] / early_w["p99_ms"],
                "first_100": first100,
                "last_100": last100,
                "ratio_p50_100": last100["p50_ms"] / first100["p50_ms"],
                "ratio_p99_100": last100["p99_ms"] / first100["p99_ms"],
            },
            "write_seconds": {
                "early_p50": percentile([s for c, s in stream.write_s.items() if EARLY[0] <= c <= EARLY[1]], 50),
                "late_p50": percentile([s for c, s in stream.write_s.items() if late[0] <= c <= late[1]], 50),
            },
            "samples": stream.samples,
            "expiries": stream.expiries,
            "commit_ms_per_checkpoint": [round(stream.commit_ms[c], 2) for c in sorted(stream.commit_ms)],
            "foreign_cores_per_checkpoint": [
                round(stream.foreign_cores.get(c, -1.0), 2) for c in sorted(stream.commit_ms)
            ],
        }
    verification = verify(streams, java=not args.no_java)
    for name, check in verification.items():
        results[name]["verification"] = check
    return {
        "benchmark": "commits",
        "command": " ".join(["python -m benchmarks.commits", *sys.argv[1:]]),
        "spark_version": spark.version,
        "pyspark_version": pyspark.__version__,
        "pyiceberg_version": pyiceberg.__version__,
        "python": platform.python_version(),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform()},
        "parameters": {k: v for k, v in vars(args).items() if k not in ("out", "work_dir")},
        "windows": {"early": list(EARLY), "late": list(late)},
        "elapsed_seconds": elapsed,
        "results": results,
        "all_verified": all(
            r["matches_model"] for check in verification.values() for k, r in check.items() if k != "expected_rows"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=100, help="CDC rows per checkpoint")
    parser.add_argument("--keys", type=int, default=20_000, help="key space of the CDC stream")
    parser.add_argument("--expire-every", type=int, default=50)
    parser.add_argument("--retain-last", type=int, default=10)
    parser.add_argument("--sample-every", type=int, default=10)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--no-java", action="store_true", help="verify with DuckDB only")
    parser.add_argument("--work-dir", default=None, help="keep the tables here (default: a removed temporary dir)")
    parser.add_argument("--out", default=str(PROJECT_ROOT / "benchmarks" / "results" / "commits.json"))
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}; expected some of {list(CONFIGS)}")
    if args.checkpoints <= EARLY[1] + 1:
        parser.error(f"--checkpoints: expected more than {EARLY[1] + 1}, received {args.checkpoints}")
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="commits-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args, work)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if result["all_verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
