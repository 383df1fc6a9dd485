"""CDC benchmark: per-batch upsert latency of iceberg_sink vs ``foreachBatch`` + ``MERGE INTO``.

    .venv/bin/python -m benchmarks.cdc [--rows 1000000] [--batches 10] [--batch-size 10000]
                                       [--out benchmarks/results/cdc.json]

One invocation runs both systems on this machine, one after the other, on identical data
(``benchmarks/cdc_data.py``: Parquet files generated once from ``--seed``):

- **iceberg_sink** (this process, PySpark 4.x, ``local[2]``, embedded SQLite catalog in a temporary
  directory): the table is created by an ``.upsert(key=["id"])`` sink, the initial rows are appended
  with a second, append-mode sink on the same table, then each batch is
  ``sink.write(batch_df, checkpoint_location=..., checkpoint_id=i)``, the code path of the
  streaming ``foreachBatch``: one snapshot per batch, one equality delete per changed key.
- **MERGE INTO** (``benchmarks/merge_into_driver.py`` in the Java venv: PySpark 3.5 + Apache Iceberg
  Java 1.9.2, ``local[2]``, Hadoop catalog in a temporary warehouse): a format v2 table with
  merge-on-read for merge, update and delete; each batch is registered as a temp view and merged
  with ``MERGE INTO ... WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *``.

Each batch is timed from reading its Parquet file to the end of the commit (wall seconds). The
summary statistics skip the first ``--warmup`` batches (JIT, class loading, Python workers). After
the last batch, both tables are read back with Iceberg Java (PyIceberg cannot apply equality
deletes) and compared with the generator's expected state: row count, distinct ids, the sum of
``version`` and a few hundred sampled rows. The JSON result goes to stdout and to ``--out``;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.cdc_data import SPARK_DDL, Dataset, compare, generate

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TABLE = "bench.cdc"
SYSTEMS = ("iceberg_sink", "merge_into")
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


def summarize(seconds: list[float], warmup: int) -> dict[str, Any]:
    """Median, p90 (linear interpolation), mean, min and max of the batches after the warm-up ones."""
    steady = seconds[warmup:] if len(seconds) > warmup else seconds
    if not steady:
        return {"batches": 0}
    ordered = sorted(steady)
    rank = 0.9 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    p90 = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return {
        "batches": len(steady),
        "skipped_warmup_batches": len(seconds) - len(steady),
        "median": statistics.median(steady),
        "p90": p90,
        "mean": statistics.fmean(steady),
        "min": ordered[0],
        "max": ordered[-1],
    }


# -- iceberg_sink side ------------------------------------------------------------------------


class PhaseTimer:
    """Times the sink's stages per batch by wrapping three of its callables at run time.

    Informational only (it does not change what the sink does): Spark write jobs
    (``pipeline.write_dataframe``: the change reduction, shuffle and writer tasks), the
    ``CommitAggregator`` (staging manifests) and the ``IcebergCommitter`` (the catalog commit). A
    stage whose callable is not found (renamed upstream) is simply not reported.
    """

    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self._restore: list[Callable[[], None]] = []

    def _wrap(self, owner: Any, attribute: str, phase: str) -> None:
        original = getattr(owner, attribute, None)
        if original is None:
            return
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timer.current[phase] = timer.current.get(phase, 0.0) + time.perf_counter() - started

        setattr(owner, attribute, timed)
        self._restore.append(lambda: setattr(owner, attribute, original))

    @contextmanager
    def installed(self) -> Iterator[PhaseTimer]:
        from iceberg_sink import pipeline
        from iceberg_sink.committer.aggregator import CommitAggregator
        from iceberg_sink.committer.committer import IcebergCommitter

        self._wrap(pipeline, "write_dataframe", "spark_write")
        self._wrap(CommitAggregator, "aggregate", "aggregate")
        self._wrap(IcebergCommitter, "commit", "commit")
        try:
            yield self
        finally:
            for restore in reversed(self._restore):
                restore()
            self._restore.clear()

    def take(self) -> dict[str, float]:
        phases, self.current = self.current, {}
        return phases


def start_spark(args: argparse.Namespace, work_dir: Path) -> Any:
    from pyspark.sql import SparkSession

    # Python workers (mapInArrow writers) must run this interpreter, the one with iceberg_sink.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_LOCAL_DIRS"] = str(work_dir / "spark-local")
    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("cdc-benchmark-iceberg-sink")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        .config("spark.default.parallelism", str(args.cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work_dir / "spark-warehouse"))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def table_files(summary: dict[str, str]) -> dict[str, int]:
    keys = (
        "total-records",
        "total-data-files",
        "total-delete-files",
        "total-equality-deletes",
        "total-position-deletes",
    )
    return {k: int(summary[k]) for k in keys if k in summary}


def run_iceberg_sink(args: argparse.Namespace, data: Dataset, work_dir: Path) -> dict[str, Any]:
    import pyiceberg
    import pyspark
    from pyspark.sql import functions as F

    from iceberg_sink import IcebergSink

    spark = start_spark(args, work_dir)
    try:
        lake = work_dir / "lake"
        upsert_sink = IcebergSink.builder().embedded(lake).table(TABLE).create_if_missing().upsert(key=["id"]).build()
        # An empty write creates the table (id becomes its required identifier field) and commits nothing.
        upsert_sink.write(spark.createDataFrame([], SPARK_DDL))
        append_sink = IcebergSink.builder().embedded(lake).table(TABLE).build()

        started = time.perf_counter()
        initial = spark.read.schema(SPARK_DDL).parquet(*[str(p) for p in data.initial_files])
        # The table's id is required: drop nulls (there are none) and use an expression Spark knows is not null.
        initial = initial.where(F.col("id").isNotNull()).withColumn("id", F.coalesce("id", F.lit(0).cast("bigint")))
        append_sink.write(initial)
        load_seconds = time.perf_counter() - started
        log(f"iceberg_sink: loaded the initial rows in {load_seconds:.1f}s")

        checkpoint = str(work_dir / "checkpoint")
        seconds: list[float] = []
        phases: list[dict[str, float]] = []
        summaries: list[dict[str, str]] = []
        timer = PhaseTimer()
        with timer.installed():
            for index, path in enumerate(data.batch_files):
                started = time.perf_counter()
                outcome = upsert_sink.write(
                    spark.read.schema(SPARK_DDL).parquet(str(path)), checkpoint_location=checkpoint, checkpoint_id=index
                )
                elapsed = time.perf_counter() - started
                seconds.append(elapsed)
                phase = timer.take()
                phase["other"] = max(0.0, elapsed - sum(phase.values()))
                phases.append(phase)
                snapshot = outcome.snapshot if outcome is not None else None
                summary = dict(snapshot.summary.additional_properties) if snapshot and snapshot.summary else {}
                summaries.append(summary)
                log(
                    f"iceberg_sink: batch {index + 1}/{len(data.batch_files)}: {elapsed:.2f}s "
                    f"({', '.join(f'{k} {v:.2f}s' for k, v in phase.items())}; "
                    f"data files {summary.get('total-data-files')}, delete files {summary.get('total-delete-files')})"
                )
        table = upsert_sink.load_table()
        return {
            "engine": f"Spark {spark.version} + iceberg_sink (PyIceberg {pyiceberg.__version__})",
            "spark_version": spark.version,
            "pyspark_version": pyspark.__version__,
            "pyiceberg_version": pyiceberg.__version__,
            "load_seconds": load_seconds,
            "batch_seconds": seconds,
            "batch_phases": phases,
            "batch_summaries": summaries,
            "table_files_after": table_files(summaries[-1]) if summaries else {},
            "metadata_location": table.metadata_location,
        }
    finally:
        spark.stop()


# -- MERGE INTO side --------------------------------------------------------------------------


def java_env_paths() -> tuple[Path, Path]:
    """The Java venv's python and the Iceberg runtime jar (built on first use, like the tests do)."""
    sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.java_env import ensure_java_env

    env = ensure_java_env()
    return env.python, env.jar


def run_java_driver(
    args: argparse.Namespace, data: Dataset, work_dir: Path, sample_ids: list[int], sink_metadata: str | None
) -> dict[str, Any]:
    python, jar = java_env_paths()
    spec = {
        "jar": str(jar),
        "warehouse": str(work_dir / "merge-warehouse"),
        "initial_files": [str(p) for p in data.initial_files],
        "merge": "merge_into" in args.systems,
        "batch_files": [str(p) for p in data.batch_files],
        "sample_ids": sample_ids,
        "sink_metadata": sink_metadata,
        "cores": args.cores,
        "driver_memory": args.driver_memory,
        "shuffle_partitions": args.shuffle_partitions,
        "result": str(work_dir / "merge-result.json"),
    }
    spec_path = work_dir / "merge-spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    subprocess.run(
        [str(python), "-m", "benchmarks.merge_into_driver", str(spec_path)],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=sys.stderr,
        check=True,
    )
    result: dict[str, Any] = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    result["python"] = str(python)
    result["jar"] = jar.name
    return result


# -- orchestration ----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    memory_gib: float | None = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": memory_gib,
        "java": java[0] if java else "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cdc", description="CDC upsert latency: iceberg_sink vs foreachBatch + MERGE INTO"
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the initial load (default 1000000)")
    parser.add_argument("--batches", type=int, default=10, help="change batches applied (default 10)")
    parser.add_argument("--batch-size", type=int, default=10_000, help="changes per batch (default 10000)")
    parser.add_argument("--update-fraction", type=float, default=0.5, help="updates among the changes (default 0.5)")
    parser.add_argument("--seed", type=int, default=20240601, help="seed of the generated data")
    parser.add_argument("--warmup", type=int, default=2, help="first batches left out of the statistics (default 2)")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "benchmarks" / "results" / "cdc.json")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    parser.add_argument("--cores", type=int, default=2, help="local[N] of both Spark sessions (default 2)")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory of both sessions (default 4g)")
    parser.add_argument("--shuffle-partitions", type=int, default=4, help="spark.sql.shuffle.partitions (default 4)")
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (tables, data) afterwards")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown or not args.systems:
        parser.error(f"--systems: expected a subset of {', '.join(SYSTEMS)}, received {unknown or 'nothing'}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_started = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="iceberg-sink-cdc-bench-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    log(f"scratch directory {work_dir}")
    try:
        data = generate(work_dir / "data", args.rows, args.batches, args.batch_size, args.seed, args.update_fraction)
        log(
            f"generated {args.rows} initial rows and {args.batches} batches of {args.batch_size} "
            f"in {data.generate_seconds:.1f}s"
        )
        sample_ids = data.expected.sample_ids(args.seed)
        systems: dict[str, dict[str, Any]] = {}
        timings: dict[str, float] = {"generate": data.generate_seconds}

        sink_metadata: str | None = None
        if "iceberg_sink" in args.systems:
            started = time.perf_counter()
            systems["iceberg_sink"] = run_iceberg_sink(args, data, work_dir)
            timings["iceberg_sink"] = time.perf_counter() - started
            sink_metadata = systems["iceberg_sink"]["metadata_location"]

        started = time.perf_counter()
        java = run_java_driver(args, data, work_dir, sample_ids, sink_metadata)
        timings["java_driver"] = time.perf_counter() - started
        java_versions = f"Spark {java['spark_version']} + Apache Iceberg Java {java['iceberg_version']}"
        if "iceberg_sink" in systems:
            sink = systems["iceberg_sink"]
            sink["checks"] = compare(data.expected, java["sink_observed"], sample_ids)
            sink["checks"]["reader"] = f"Iceberg Java ({java_versions})"
            sink["full_scan_seconds"] = java["sink_scan_seconds"]
        if "merge_into" in args.systems:
            checks = compare(data.expected, java["observed"], sample_ids)
            checks["reader"] = f"Spark itself ({java_versions})"
            systems["merge_into"] = {
                "engine": f"{java_versions}, MERGE INTO merge-on-read",
                "spark_version": java["spark_version"],
                "iceberg_version": java["iceberg_version"],
                "jar": java["jar"],
                "table_properties": java["table_properties"],
                "merge_sql": java["merge_sql"],
                "load_seconds": java["load_seconds"],
                "batch_seconds": java["batch_seconds"],
                "batch_summaries": java["batch_summaries"],
                "table_files_after": table_files(java["batch_summaries"][-1]) if java["batch_summaries"] else {},
                "checks": checks,
                "full_scan_seconds": java["scan_seconds"],
            }
        for system in systems.values():
            system["steady_state"] = summarize(system["batch_seconds"], args.warmup)
            system["table_rows_after"] = system["checks"]["rows"]
        result = {
            "benchmark": "cdc-upsert",
            "started_at": started_at,
            "config": {
                "rows": args.rows,
                "batches": args.batches,
                "batch_size": args.batch_size,
                "updates_per_batch": data.updates_per_batch,
                "inserts_per_batch": data.inserts_per_batch,
                "seed": args.seed,
                "warmup": args.warmup,
                "cores": args.cores,
                "driver_memory": args.driver_memory,
                "shuffle_partitions": args.shuffle_partitions,
                "initial_parquet_bytes": data.bytes_initial,
            },
            "machine": {**machine(), "java_runtime_of_spark": java.get("java_version")},
            "rows_before_batch": [data.rows_before_batch(i) for i in range(args.batches)],
            "systems": systems,
            "timings_seconds": {**timings, "total": time.perf_counter() - run_started},
            "ok": all(s["checks"]["ok"] for s in systems.values()),
        }
    finally:
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
        log(
            f"{name}: load {system['load_seconds']:.1f}s, batch median {steady['median']:.2f}s p90 {steady['p90']:.2f}s, "
            f"checks {'ok' if system['checks']['ok'] else 'FAILED'}"
        )
    log(f"total {result['timings_seconds']['total']:.0f}s; wrote {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
