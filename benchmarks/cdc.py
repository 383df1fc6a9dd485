"""CDC benchmark: per-batch upsert latency of iceberg_sink vs ``foreachBatch`` + ``MERGE INTO``.

    .venv/bin/python -m benchmarks.cdc [--rows 1000000] [--batches 30] [--batch-size 10000]
                                       [--convert N] [--scan-every K]
                                       [--out benchmarks/results/cdc.json]

One invocation runs the chosen systems (by default iceberg_sink and MERGE INTO) on this machine, one
after the other, each in a fresh process of its own, on identical data (``benchmarks/cdc_data.py``: Parquet files generated once from ``--seed``):

- **iceberg_sink** (``benchmarks/sink_driver.py`` with this interpreter: PySpark 4.x, ``local[2]``,
  embedded SQLite catalog in a temporary directory): the table is created by an
  ``.upsert(key=["id"])`` sink, the initial rows are appended with a second, append-mode sink on
  the same table, then each batch is ``sink.write(batch_df, checkpoint_location=...,
  checkpoint_id=i)``, the code path of the streaming ``foreachBatch``: one snapshot per batch, one
  equality delete per changed key.
- **MERGE INTO** (``benchmarks/merge_into_driver.py`` in the Java venv: PySpark 3.5 + Apache Iceberg
  Java 1.9.2, ``local[2]``, Hadoop catalog in a temporary warehouse): a format v2 table with
  merge-on-read for merge, update and delete; each batch is registered as a temp view and merged
  with ``MERGE INTO ... WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *``, as a
  ``foreachBatch`` function would.

- **flink** (opt-in, ``--systems ...,flink``; ``benchmarks/flink_driver.py`` in the Flink venv of
  ``benchmarks/flink_env.py``: PyFlink 2.1.3 + ``iceberg-flink-runtime-2.1`` 1.11.0, local
  mini-cluster, parallelism ``--cores``, Hadoop catalog): Apache Flink's own Iceberg sink in upsert
  mode (``PRIMARY KEY (id)``, ``'write.upsert.enabled'='true'``: one equality delete per written
  row); the initial rows are appended (upsert off for that statement), then each batch is one
  bounded ``INSERT INTO`` job, whose sink commits one snapshot at its end.

Each batch is timed from reading its Parquet file to the end of the commit (wall seconds). The
summary statistics skip the first ``--warmup`` batches (JIT, class loading, Python workers). After
the last batch, every table is read back with Iceberg Java (PyIceberg cannot apply equality
deletes) and compared with the generator's expected state: row count, distinct ids, the sum of
``version`` and a few hundred sampled rows; a full aggregate scan of each is timed too.

``--convert N`` runs the sink with the equality-delete conversion every N commits, in the background
beside the batches (topology/conversion). ``--scan-every K`` records the sink's table right after
every K-th batch (and the last) and times, with Iceberg Java after all batches, a full scan of it and
of the MERGE table at its snapshot of the same batch: ``systems.iceberg_sink.scan_points`` holds
both medians and their ratio per point (docs/benchmarks-cdc-read.md).

The machine may be shared with other work: before the load and before each batch the drivers wait
(up to ``--wait-quiet`` seconds) until other processes go quiet, and the CPU time other processes
used during every batch is reported (``benchmarks/cpu_monitor.py``). The JSON result goes to stdout
and to ``--out``; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cdc_data import NEW_KEY_LAYOUTS, Dataset, compare, generate
from benchmarks.cpu_monitor import ForeignCpuMonitor

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("iceberg_sink", "merge_into", "flink")
# What runs without --systems: the two systems of the published figures (flink is opt-in).
DEFAULT_SYSTEMS = ("iceberg_sink", "merge_into")
# Before the load and each batch the drivers wait until other processes used under QUIET_CORES cores
# over the last QUIET_SECONDS (at most --wait-quiet seconds).
QUIET_CORES = 0.2
QUIET_SECONDS = 3.0
# Variables of this venv that must not leak into the Spark 3.5 subprocess.
_SCRUBBED_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SPARK_HOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_CONF_DIR",
)


def log(message: str) -> None:
    print(f"[cdc {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted values, linearly interpolated between the closest ranks."""
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(seconds: list[float], warmup: int, batch_size: int | None = None) -> dict[str, Any]:
    """Median, p90, p99 (linear interpolation), mean, min and max of the batches after the warm-up
    ones; with ``batch_size``, the steady changes per second too (changes applied / seconds spent)."""
    steady = seconds[warmup:] if len(seconds) > warmup else seconds
    if not steady:
        return {"batches": 0}
    ordered = sorted(steady)
    out: dict[str, Any] = {
        "batches": len(steady),
        "skipped_warmup_batches": len(seconds) - len(steady),
        "median": statistics.median(steady),
        "p90": percentile(ordered, 0.9),
        "p99": percentile(ordered, 0.99),
        "mean": statistics.fmean(steady),
        "min": ordered[0],
        "max": ordered[-1],
    }
    if batch_size is not None and sum(steady) > 0:
        out["changes_per_second"] = batch_size * len(steady) / sum(steady)
    return out


# -- the two drivers --------------------------------------------------------------------------


def flink_env() -> Any:
    """The Flink venv's python and jars (benchmarks/flink_env.py; the venv is built on first use)."""
    from benchmarks.flink_env import ensure_flink_env

    return ensure_flink_env()


def java_env_paths() -> tuple[Path, Path]:
    """The Java venv's python and the Iceberg runtime jar (the venv is built on first use, as in the tests)."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.java_env import ensure_java_env

    env = ensure_java_env()
    return env.python, env.jar


def run_driver(python: Path | str, module: str, spec: dict[str, Any], work_dir: Path, scrub: bool) -> dict[str, Any]:
    """Run ``python -m module SPEC.json`` from the project root; return the JSON it wrote to ``spec["result"]``."""
    name = module.rsplit(".", 1)[-1]
    spec = {**spec, "result": str(work_dir / f"{name}-result.json")}
    spec_path = work_dir / f"{name}-spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not (scrub and k in _SCRUBBED_ENV)}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(
        [str(python), "-m", module, str(spec_path)],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=sys.stderr,  # our stdout carries only the JSON result
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed with exit code {proc.returncode}; its output is above")
    result: dict[str, Any] = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    return result


def table_files(summary: dict[str, str]) -> dict[str, int]:
    """File and record totals from a snapshot summary."""
    keys = (
        "total-records",
        "total-data-files",
        "total-delete-files",
        "total-equality-deletes",
        "total-position-deletes",
    )
    return {k: int(summary[k]) for k in keys if k in summary}


# -- orchestration ----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    memory_gib: float | None = None
    cpu = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": memory_gib,
        "java": java[0] if java else "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def source_state() -> dict[str, Any]:
    """Which iceberg_sink was measured: the git commit, whether iceberg_sink/ differs from it, and a
    digest of its sources (the package is installed editable, and the work tree may move on)."""

    def git(*cmd: str) -> str:
        proc = subprocess.run(["git", *cmd], cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    digest = hashlib.sha256()
    for path in sorted((PROJECT_ROOT / "iceberg_sink").rglob("*.py")):
        digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return {
        "git_head": git("rev-parse", "HEAD"),
        "git_head_subject": git("log", "-1", "--format=%s"),
        "iceberg_sink_modified_since_head": bool(git("status", "--porcelain", "--", "iceberg_sink")),
        "iceberg_sink_sources_sha256": digest.hexdigest(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cdc", description="CDC upsert latency: iceberg_sink vs foreachBatch + MERGE INTO"
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the initial load (default 1000000)")
    parser.add_argument("--batches", type=int, default=30, help="change batches applied (default 30)")
    parser.add_argument("--batch-size", type=int, default=10_000, help="changes per batch (default 10000)")
    parser.add_argument("--update-fraction", type=float, default=0.5, help="updates among the changes (default 0.5)")
    parser.add_argument(
        "--new-keys",
        choices=NEW_KEY_LAYOUTS,
        default="above",
        help="inserted ids: 'above' the highest id so far (auto-increment; iceberg_sink proves them new) or "
        "'within' the range of existing ids (no proof: an equality delete for every key). Default above",
    )
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the generated data")
    parser.add_argument("--warmup", type=int, default=2, help="first batches left out of the statistics (default 2)")
    parser.add_argument(
        "--scans", type=int, default=3, help="timed full scans of each final table with Iceberg Java (default 3)"
    )
    parser.add_argument(
        "--convert",
        type=int,
        default=0,
        help="run the sink with .convert_equality_deletes(every_n_commits=N) in the background (default 0: off)",
    )
    parser.add_argument(
        "--scan-every",
        type=int,
        default=0,
        help="time full scans of both tables as of every K-th batch and the last (default 0: the final tables only)",
    )
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "benchmarks" / "results" / "cdc.json")
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default {','.join(DEFAULT_SYSTEMS)})",
    )
    parser.add_argument("--cores", type=int, default=2, help="local[N] of both Spark sessions (default 2)")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory of both sessions (default 4g)")
    parser.add_argument("--shuffle-partitions", type=int, default=4, help="spark.sql.shuffle.partitions (default 4)")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=120.0,
        help="before the load and before each batch, wait up to this many seconds until other processes used "
        "under 0.2 cores for 3 s (default 120; 0 disables)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (tables, data) afterwards")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown or not args.systems:
        parser.error(f"--systems: expected a subset of {', '.join(SYSTEMS)}, received {unknown or 'nothing'}")
    if args.warmup < 0 or args.batches < 1 or args.scans < 1:
        parser.error("--batches and --scans must be at least 1, --warmup at least 0")
    if args.convert < 0 or args.scan_every < 0:
        parser.error(f"--convert and --scan-every: expected >= 0, received {args.convert} and {args.scan_every}")
    return args


def system_result(
    raw: dict[str, Any], engine: str, observed: dict[str, Any], reader: str, data: Dataset, sample_ids: list[int]
) -> dict[str, Any]:
    """The common part of one system's result: latencies, checks and table files."""
    checks = compare(data.expected, observed, sample_ids)
    checks["reader"] = reader
    summaries: list[dict[str, str]] = raw["batch_summaries"]
    return {
        "engine": engine,
        "load_seconds": raw["load_seconds"],
        "batch_seconds": raw["batch_seconds"],
        "batch_intervals": raw["batch_intervals"],
        "load_waited_for_quiet_seconds": raw["load_waited_for_quiet_seconds"],
        "batch_waited_for_quiet_seconds": raw["batch_waited_for_quiet_seconds"],
        "batch_summaries": summaries,
        "table_files_after": table_files(summaries[-1]) if summaries else {},
        "table_rows_after": observed["rows"],
        "checks": checks,
    }


def scan_point_results(recorded: list[dict[str, Any]], scanned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scan point: the sink table's delete files then, both scan medians and their ratio."""
    out = []
    for point, runs in zip(recorded, scanned, strict=True):
        sink = statistics.median(runs["sink_runs"])
        merge = statistics.median(runs["merge_runs"]) if runs.get("merge_runs") else None
        summary = point["summary"]
        out.append(
            {
                "batch": point["batch"],
                "sink_scan_seconds": sink,
                "merge_scan_seconds": merge,
                "ratio": sink / merge if merge else None,
                "sink_scan_runs": runs["sink_runs"],
                "merge_scan_runs": runs.get("merge_runs"),
                "sink_data_files": int(summary.get("total-data-files", 0)),
                "sink_delete_files": int(summary.get("total-delete-files", 0)),
                "sink_equality_deletes": int(summary.get("total-equality-deletes", 0)),
                "sink_position_deletes": int(summary.get("total-position-deletes", 0)),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_started = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    wall_started = time.time()
    source = source_state()
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="iceberg-sink-cdc-bench-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    monitor = ForeignCpuMonitor().start()
    log(f"scratch directory {work_dir}")
    try:
        java_python, jar = java_env_paths()
        data = generate(
            work_dir / "data",
            args.rows,
            args.batches,
            args.batch_size,
            args.seed,
            args.update_fraction,
            args.new_keys,
        )
        log(
            f"generated {args.rows} initial rows and {args.batches} batches of {args.batch_size} "
            f"in {data.generate_seconds:.1f}s"
        )
        sample_ids = data.expected.sample_ids(args.seed)
        common: dict[str, Any] = {
            "initial_files": [str(p) for p in data.initial_files],
            "batch_files": [str(p) for p in data.batch_files],
            "cores": args.cores,
            "driver_memory": args.driver_memory,
            "shuffle_partitions": args.shuffle_partitions,
            "quiet": {"threshold": QUIET_CORES, "seconds": QUIET_SECONDS, "max_wait": args.wait_quiet},
        }
        timings: dict[str, float] = {"generate": data.generate_seconds}

        sink_raw: dict[str, Any] | None = None
        if "iceberg_sink" in args.systems:
            started = time.perf_counter()
            sink_work = work_dir / "iceberg_sink"
            sink_work.mkdir()
            sink_raw = run_driver(
                sys.executable,
                "benchmarks.sink_driver",
                {**common, "work_dir": str(sink_work), "convert_every": args.convert, "scan_every": args.scan_every},
                work_dir,
                False,
            )
            timings["iceberg_sink"] = time.perf_counter() - started

        flink_raw: dict[str, Any] | None = None
        if "flink" in args.systems:
            env = flink_env()
            started = time.perf_counter()
            flink_work = work_dir / "flink"
            flink_work.mkdir()
            flink_raw = run_driver(
                env.python,
                "benchmarks.flink_driver",
                {**common, "work_dir": str(flink_work), "jars": [str(j) for j in env.jars], "parallelism": args.cores},
                work_dir,
                True,
            )
            timings["flink"] = time.perf_counter() - started

        started = time.perf_counter()
        java = run_driver(
            java_python,
            "benchmarks.merge_into_driver",
            {
                **common,
                "jar": str(jar),
                "warehouse": str(work_dir / "merge-warehouse"),
                "merge": "merge_into" in args.systems,
                "sample_ids": sample_ids,
                "scans": args.scans,
                "sink_metadata": sink_raw["metadata_location"] if sink_raw else None,
                "flink_metadata": flink_raw["metadata_location"] if flink_raw else None,
                "scan_points": sink_raw["scan_points"] if sink_raw else [],
            },
            work_dir,
            True,
        )
        timings["java_driver"] = time.perf_counter() - started
        java_versions = f"Spark {java['spark_version']} + Apache Iceberg Java {java['iceberg_version']}"

        systems: dict[str, dict[str, Any]] = {}
        if sink_raw is not None:
            systems["iceberg_sink"] = {
                **system_result(
                    sink_raw,
                    f"Spark {sink_raw['spark_version']} + iceberg_sink (PyIceberg {sink_raw['pyiceberg_version']}), "
                    "upsert with equality deletes",
                    java["sink_observed"],
                    f"Iceberg Java ({java_versions})",
                    data,
                    sample_ids,
                ),
                "spark_version": sink_raw["spark_version"],
                "pyiceberg_version": sink_raw["pyiceberg_version"],
                "batch_phases": sink_raw["batch_phases"],
                "full_scan_seconds": statistics.median(java["sink_scan_runs"]),
                "full_scan_runs": java["sink_scan_runs"],
                "convert_every": sink_raw["convert_every"],
                "conversion_metrics": sink_raw["conversion_metrics"],
                "final_summary": sink_raw["final_summary"],
                "scan_points": scan_point_results(sink_raw["scan_points"], java.get("scan_points") or []),
            }
        if "merge_into" in args.systems:
            systems["merge_into"] = {
                **system_result(
                    java,
                    f"{java_versions}, MERGE INTO merge-on-read",
                    java["observed"],
                    f"Spark itself ({java_versions})",
                    data,
                    sample_ids,
                ),
                "spark_version": java["spark_version"],
                "iceberg_version": java["iceberg_version"],
                "jar": jar.name,
                "table_properties": java["table_properties"],
                "merge_sql": java["merge_sql"],
                "full_scan_seconds": statistics.median(java["scan_runs"]),
                "full_scan_runs": java["scan_runs"],
            }
        if flink_raw is not None:
            systems["flink"] = {
                **system_result(
                    flink_raw,
                    f"Apache Flink {flink_raw['flink_version']} + Iceberg Java {flink_raw['iceberg_version']} "
                    "(iceberg-flink-runtime), upsert mode with equality deletes, one bounded job per batch",
                    java["flink_observed"],
                    f"Iceberg Java ({java_versions})",
                    data,
                    sample_ids,
                ),
                "flink_version": flink_raw["flink_version"],
                "iceberg_version": flink_raw["iceberg_version"],
                "jars": flink_raw["jars"],
                "parallelism": flink_raw["parallelism"],
                "table_properties": flink_raw["table_properties"],
                "java_version": flink_raw["java_version"],
                "input_csv_conversion_seconds": flink_raw["csv_conversion_seconds"],
                "batch_job_net_runtime_seconds": flink_raw["batch_job_net_runtime_seconds"],
                "full_scan_seconds": statistics.median(java["flink_scan_runs"]),
                "full_scan_runs": java["flink_scan_runs"],
                "final_summary": flink_raw["final_summary"],
                "metadata_location": flink_raw["metadata_location"],
            }
        for system in systems.values():
            system["steady_state"] = summarize(system["batch_seconds"], args.warmup, args.batch_size)
            foreign = [monitor.between(start, end) for start, end in system["batch_intervals"]]
            system["batch_foreign_cpu_seconds"] = foreign
        monitor.stop()
        foreign_total = monitor.between(wall_started, time.time())
        result: dict[str, Any] = {
            "benchmark": "cdc-upsert",
            "started_at": started_at,
            "config": {
                "rows": args.rows,
                "batches": args.batches,
                "batch_size": args.batch_size,
                "updates_per_batch": data.updates_per_batch,
                "inserts_per_batch": data.inserts_per_batch,
                "new_keys": data.new_keys,
                "seed": args.seed,
                "warmup": args.warmup,
                "cores": args.cores,
                "driver_memory": args.driver_memory,
                "shuffle_partitions": args.shuffle_partitions,
                "scans": args.scans,
                "convert": args.convert,
                "scan_every": args.scan_every,
                "initial_parquet_bytes": data.bytes_initial,
            },
            "machine": {**machine(), "java_runtime_of_spark_3_5": java.get("java_version")},
            "iceberg_sink_source": source,
            "rows_before_batch": [data.rows_before_batch(i) for i in range(args.batches)],
            "systems": systems,
            "foreign_cpu": {
                "note": "CPU seconds used by processes outside this benchmark while it ran (cpu_monitor.py)",
                "total_seconds": foreign_total,
                "quiet_gate": common["quiet"],
            },
            "timings_seconds": {**timings, "total": time.perf_counter() - run_started},
            "ok": all(s["checks"]["ok"] for s in systems.values()),
        }
    finally:
        monitor.stop()
        if args.keep:
            log(f"kept {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    text = json.dumps(result, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    for name, system in systems.items():
        steady = system["steady_state"]
        foreign_cpu = sum(f or 0.0 for f in system["batch_foreign_cpu_seconds"])
        waited_total = sum(system["batch_waited_for_quiet_seconds"])
        log(
            f"{name}: load {system['load_seconds']:.1f}s, steady batches median {steady['median']:.2f}s "
            f"p90 {steady['p90']:.2f}s p99 {steady['p99']:.2f}s, {steady.get('changes_per_second', 0):.0f} changes/s; "
            f"full scan {system['full_scan_seconds']:.2f}s; checks {'ok' if system['checks']['ok'] else 'FAILED'}; "
            f"other processes used {foreign_cpu:.1f} CPU-s during its batches; waited {waited_total:.0f}s for quiet"
        )
        for point in system.get("scan_points") or []:
            ratio = point["ratio"]
            log(
                f"{name} after batch {point['batch']}: full scan {point['sink_scan_seconds']:.2f}s vs MERGE "
                f"{point['merge_scan_seconds'] or float('nan'):.2f}s (ratio {ratio if ratio is None else round(ratio, 2)}), "
                f"{point['sink_delete_files']} delete files, {point['sink_equality_deletes']} equality deletes"
            )
    log(f"total {result['timings_seconds']['total']:.0f}s; wrote {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
