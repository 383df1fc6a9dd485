"""Soak benchmark: a CDC stream with compaction for ``--minutes``; throughput, commit latency, memory
and file counts over time, and the final table checked against a model.

    .venv/bin/python -m benchmarks.soak [--minutes 30] [--rows-per-second 2000] [--keys 100000]
                                        [--trigger-seconds 5] [--sample-seconds 5] [--compact-every 12]
                                        [--convert-every 0] [--expire-every 60] [--retain-last 10]
                                        [--out benchmarks/results/soak.json]

One process, one SparkSession (PySpark 4.x, ``local[2]``, ``--driver-memory``), one embedded catalog
(SQLite + local warehouse) in a temporary directory. Spark's ``rate`` source (``--rows-per-second``,
2 partitions) is turned into CDC changes of ``--keys`` keys: the row with value ``v`` changes key
``id = v % keys``, ``lsn = v``, ``payload = sha1(str(v))``, and its operation comes from the round
``r = v // keys``: ``I`` when ``r % 4 == 0``, ``U`` when it is 1 or 2, ``D`` when it is 3. Every
key is thus inserted, updated twice, deleted, inserted again, ... and the final state after the
values ``0..M`` is known from ``M`` alone: key ``k`` holds the last ``v <= M`` with ``v % keys == k``
unless that change is a delete. The rate source's values are ``0, 1, 2, ...`` in order, and a
micro-batch ending at offset ``s`` (seconds) holds the values below ``s x rows-per-second``; the
offset of each batch is read from Spark's checkpoint (``offsets/<batch id>``).

The stream is written by ``.cdc(op_column="op", key=["id"], order_by="lsn")`` with
``.compaction(every_n_commits=--compact-every, background=True)``,
``.convert_equality_deletes(every_n_commits=--convert-every)`` (off by default: compaction applies
the equality deletes itself, and a conversion committing position deletes into the partition makes
every overlapping compaction drop its groups) and a post-commit hook
that records each commit (the sink's ``last_commit_duration_ms``, the snapshot summary) and expires
snapshots every ``--expire-every`` commits (``maintenance.expire_snapshots``, keeping the last
``--retain-last``), on a processing-time trigger of ``--trigger-seconds``. The table has
``write.metadata.delete-after-commit.enabled=true``.

Every ``--sample-seconds`` a thread records: changes committed, the sink's counters (commits,
compactions, conversions), the resident set (``VmRSS``) of the driver's Python, its JVM (which in
local mode also runs the executors), the PySpark daemon and the Python workers
(``benchmarks/memory.py`` classifies them), the table's live data and delete files, delete rows,
records and snapshots (from the current snapshot's summary and metadata), the files under the table
location, and the CPU other processes used meanwhile (``benchmarks/cpu_monitor.py``: the machine
may be shared). After ``--minutes`` the stream is stopped between two micro-batches, background
jobs are awaited, and the table is read back with DuckDB and Iceberg Java and compared row by row
with the model at the last committed checkpoint; ``ok`` is true only if both agree with it.

The JSON result goes to stdout and to ``--out``; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cdc import machine, source_state
from benchmarks.commits import percentile
from benchmarks.cpu_monitor import ForeignCpuMonitor
from benchmarks.memory import process_roles, status

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
TABLE = "soak.changes"
CHECKPOINT_KEY = "iceberg-sink.checkpoint-id"
MEMORY_CLASSES = ("driver_python", "driver_jvm", "python_daemon", "python_workers_sum", "python_worker_max")
# A sampling interval in which other processes used more than this many cores is marked disturbed.
DISTURBED_CORES = 0.5


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the change function and its model ---------------------------------------------------------------


def op_of(value: int, keys: int) -> str:
    """The operation of the rate row ``value``: rounds of ``keys`` values go I, U, U, D, I, ..."""
    phase = (value // keys) % 4
    return "I" if phase == 0 else "D" if phase == 3 else "U"


def payload_of(value: int) -> str:
    return hashlib.sha1(str(value).encode()).hexdigest()


def expected_state(last_value: int, keys: int) -> dict[int, int]:
    """``id -> lsn`` of the table after the changes of values ``0..last_value`` (none when -1)."""
    out: dict[int, int] = {}
    for key in range(min(keys, last_value + 1)):
        value = key + keys * ((last_value - key) // keys)
        if op_of(value, keys) != "D":
            out[key] = value
    return out


def changes_frame(spark: Any, rows_per_second: int, keys: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .option("numPartitions", partitions)
        .load()
    )
    phase = F.expr(f"(value div {keys}) % 4")
    return source.select(
        (F.col("value") % keys).alias("id"),
        F.col("value").alias("lsn"),
        F.col("timestamp").alias("ts"),
        F.sha1(F.col("value").cast("string")).alias("payload"),
        F.when(phase == 0, "I").when(phase == 3, "D").otherwise("U").alias("op"),
    )


def rate_end_value(checkpoint: Path, batch_id: int, rows_per_second: int) -> int:
    """The first value *after* micro-batch ``batch_id``: its end offset (seconds) x rows per second.

    Spark's offset log ``offsets/<id>`` holds a version line, the batch metadata and one line per
    source; the rate source's offset is the seconds since the query started (no ramp-up)."""
    lines = [line for line in (checkpoint / "offsets" / str(batch_id)).read_text().splitlines() if line.strip()]
    return int(json.loads(lines[-1])) * rows_per_second


# -- what is sampled ---------------------------------------------------------------------------------


def memory_sample(root: int) -> dict[str, int]:
    """Current ``VmRSS`` in bytes per process class (workers: their sum, the largest, how many)."""
    by_role: dict[str, list[int]] = {}
    for pid, role in process_roles(root).items():
        rss = status(pid).get("VmRSS")
        if rss is not None:
            by_role.setdefault(role, []).append(rss)
    workers = by_role.get("python_worker", [])
    return {
        "driver_python": sum(by_role.get("driver_python", [])),
        "driver_jvm": sum(by_role.get("driver_jvm", [])),
        "python_daemon": sum(by_role.get("python_daemon", [])),
        "python_workers_sum": sum(workers),
        "python_worker_max": max(workers, default=0),
        "python_workers": len(workers),
    }


def table_sample(load_table: Callable[[], Any], table_dir: Path) -> dict[str, Any]:
    """Live files, delete rows and snapshots from table metadata, and the files under the table location."""
    table = load_table()
    snapshot = table.current_snapshot()
    summary = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}

    def number(key: str) -> int:
        return int(summary.get(key, 0))

    data_files = [Path(r) / n for r, _, names in os.walk(table_dir / "data") for n in names]
    metadata_files = sum(len(names) for _, _, names in os.walk(table_dir / "metadata"))
    data_bytes = 0
    for path in data_files:
        with contextlib.suppress(OSError):  # deleted by an expiry or a compaction meanwhile
            data_bytes += path.stat().st_size
    location = Path(str(table.metadata_location).removeprefix("file://"))
    return {
        "snapshots": len(table.metadata.snapshots),
        "operation": snapshot.summary.operation.value if snapshot is not None and snapshot.summary else None,
        "data_files": number("total-data-files"),
        "delete_files": number("total-delete-files"),
        "equality_deletes": number("total-equality-deletes"),
        "position_deletes": number("total-position-deletes"),
        "records": number("total-records"),
        "metadata_json_bytes": location.stat().st_size,
        "files_under_data": len(data_files),
        "bytes_under_data": data_bytes,
        "files_under_metadata": metadata_files,
    }


class Recorder:
    """The post-commit hook: one record per commit, and periodic snapshot expiry."""

    def __init__(self, args: argparse.Namespace, checkpoint: Path, started: float) -> None:
        self.args = args
        self.checkpoint = checkpoint
        self.started = started
        self.sink: Any = None
        self.commits: list[dict[str, Any]] = []
        self.expiries: list[dict[str, Any]] = []
        self.changes_committed = 0
        self.last_checkpoint_id: int | None = None
        self.lock = threading.Lock()

    def __call__(self, result: Any) -> None:
        from iceberg_sink.topology import maintenance

        now = time.time()
        metrics = self.sink.metrics()
        summary = result.snapshot_summary
        end_value = rate_end_value(self.checkpoint, result.checkpoint_id, self.args.rows_per_second)
        record = {
            "t": round(now - self.started, 3),
            "wall": now,
            "checkpoint_id": result.checkpoint_id,
            "snapshot_id": result.snapshot_id,
            "operation": result.operation,
            "commit_ms": round(metrics.last_commit_duration_ms, 2),
            "end_value": end_value,
            "data_files_added": result.checkpoint.data_files,
            "delete_files_added": result.checkpoint.delete_files,
            "records_added": result.checkpoint.records,
            "equality_deletes_added": result.checkpoint.equality_deletes,
            "total_data_files": int(summary.get("total-data-files", 0)),
            "total_delete_files": int(summary.get("total-delete-files", 0)),
        }
        with self.lock:
            self.commits.append(record)
            self.changes_committed = end_value
            self.last_checkpoint_id = result.checkpoint_id
        every = self.args.expire_every
        if every and len(self.commits) % every == 0:
            t0 = time.perf_counter()
            try:
                expired = maintenance.expire_snapshots(
                    self.sink.load_table, dt.datetime.now(dt.UTC), retain_last=self.args.retain_last
                )
                entry: dict[str, Any] = {
                    "snapshots": len(expired.expired_snapshot_ids),
                    "deleted_files": len(expired.deleted_files),
                }
            except Exception as e:  # recorded, the stream goes on (as the hook policy would)
                entry = {"error": f"{type(e).__name__}: {e}"}
            entry.update(t=round(time.time() - self.started, 3), seconds=round(time.perf_counter() - t0, 3))
            with self.lock:
                self.expiries.append(entry)


class Sampler:
    """A thread taking one sample every ``interval`` seconds (and once more on demand)."""

    def __init__(self, interval: float, take: Callable[[], dict[str, Any]]) -> None:
        self.interval = interval
        self.take = take
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def sample(self) -> None:
        try:
            self.samples.append(self.take())
        except Exception as e:  # a failed sample (e.g. a metadata file replaced meanwhile) is noted
            self.errors.append(f"{time.strftime('%H:%M:%S')} {type(e).__name__}: {e}")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# -- summaries ---------------------------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, value)`` points, per hour."""
    if len(points) < 3:
        return None
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 3600


def memory_summary(samples: list[dict[str, Any]], first_commit: float, warmup_seconds: float) -> dict[str, Any]:
    """Per process class, MiB: the first sample after the first commit (JVM and workers started), the
    last one, the max, and the slope after the warm-up and over the second half."""
    out: dict[str, Any] = {}
    for name in MEMORY_CLASSES:
        series = [(s["t"], s["rss_bytes"][name] / MIB) for s in samples if "rss_bytes" in s and s["t"] >= first_commit]
        if not series:
            continue
        steady = [(t, v) for t, v in series if t >= warmup_seconds]
        half = [(t, v) for t, v in series if t >= series[-1][0] / 2]
        out[name] = {
            "start_mib": round(series[0][1], 1),
            "after_warmup_mib": round(steady[0][1], 1) if steady else None,
            "end_mib": round(series[-1][1], 1),
            "max_mib": round(max(v for _, v in series), 1),
            "slope_mib_per_hour_after_warmup": _round(slope_per_hour(steady)),
            "slope_mib_per_hour_second_half": _round(slope_per_hour(half)),
        }
    return out


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def file_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "data_files",
        "delete_files",
        "equality_deletes",
        "position_deletes",
        "records",
        "snapshots",
        "metadata_json_bytes",
        "files_under_data",
        "files_under_metadata",
    )
    tables = [s["table"] for s in samples if "table" in s]
    if not tables:
        return {}
    return {
        k: {
            "start": tables[0][k],
            "end": tables[-1][k],
            "max": max(t[k] for t in tables),
            "mean": round(statistics.fmean(t[k] for t in tables), 1),
        }
        for k in keys
    }


def batch_records(progress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per micro-batch from Spark's progress reports."""
    out = []
    for p in progress:
        durations = p.get("durationMs") or {}
        out.append(
            {
                "batch_id": p.get("batchId"),
                "timestamp": p.get("timestamp"),
                "input_rows": p.get("numInputRows"),
                "trigger_ms": durations.get("triggerExecution"),
                "add_batch_ms": durations.get("addBatch"),
            }
        )
    return out


# -- read back ---------------------------------------------------------------------------------------


def last_sink_checkpoint(table: Any) -> int | None:
    """The checkpoint id of the newest sink snapshot on main (compactions, conversions and expiries
    commit snapshots of their own without one)."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if CHECKPOINT_KEY in summary:
            return int(summary[CHECKPOINT_KEY])
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    return None


def compare(read: Any, expected: dict[int, int]) -> dict[str, Any]:
    """A reader's rows against the model: every key's lsn, and every payload against its lsn."""
    ids = read["id"].to_pylist()
    lsns = read["lsn"].to_pylist()
    payloads = read["payload"].to_pylist()
    got: dict[int, int] = {}
    duplicates = 0
    for key, lsn in zip(ids, lsns, strict=True):
        if key in got:
            duplicates += 1
        got[key] = lsn
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    bad_payloads = sum(1 for lsn, p in zip(lsns, payloads, strict=True) if p != payload_of(lsn))
    return {
        "rows": len(ids),
        "duplicate_keys": duplicates,
        "missing_keys": len(missing),
        "extra_keys": len(extra),
        "wrong_lsn": len(wrong),
        "bad_payloads": bad_payloads,
        "examples": {"missing": missing[:5], "extra": extra[:5], "wrong": wrong[:5]},
        "matches_model": not (duplicates or missing or extra or wrong or bad_payloads),
    }


def verify(metadata_location: str, expected: dict[int, int], java: bool) -> dict[str, Any]:
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.readers import JavaIcebergReader, duckdb_read

    out: dict[str, Any] = {"duckdb": compare(duckdb_read(metadata_location), expected)}
    if java:
        with JavaIcebergReader() as reader:
            out["iceberg_java"] = compare(reader.read(metadata_location), expected)
    return out


# -- the run -----------------------------------------------------------------------------------------


def build_sink(args: argparse.Namespace, lake: Path, recorder: Recorder) -> Any:
    from iceberg_sink import IcebergSink

    builder = (
        IcebergSink.builder()
        .embedded(lake)
        .table(TABLE)
        # Format v2 (equality deletes), as docs/benchmarks-soak.md measured it (v3 is the CDC default).
        .create_if_missing(properties={"write.metadata.delete-after-commit.enabled": "true"}, format_version=2)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .post_commit_hook(recorder)
    )
    if args.compact_every:
        builder = builder.compaction(every_n_commits=args.compact_every, background=True)
    if args.convert_every:
        builder = builder.convert_equality_deletes(every_n_commits=args.convert_every)
    return builder.build()


def stop_between_batches(query: Any, timeout: float) -> float:
    """Stop the query when no micro-batch is running (so the last one finishes); returns seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout and query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()
    return time.monotonic() - started


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import pyiceberg
    import pyspark
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    monitor = ForeignCpuMonitor().start()
    root = os.getpid()
    spark = (
        SparkSession.builder.master(f"local[{args.cores}]")
        .appName("iceberg_sink-soak")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(args.cores))
        .config("spark.default.parallelism", str(args.cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(work / "spark-local"))
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lake = work / "lake"
    checkpoint = work / "checkpoint"
    started = time.time()
    recorder = Recorder(args, checkpoint, started)
    sink = build_sink(args, lake, recorder)
    recorder.sink = sink
    table_dir: list[Path] = []
    last: dict[str, float] = {"wall": started, "changes": 0.0}

    def take() -> dict[str, Any]:
        wall = time.time()
        metrics = sink.metrics()
        with recorder.lock:
            changes = recorder.changes_committed
        sample: dict[str, Any] = {"t": round(wall - started, 3), "changes_committed": changes}
        interval = wall - last["wall"]
        foreign = monitor.between(last["wall"], wall)
        if interval > 0:
            sample["changes_per_second"] = round((changes - last["changes"]) / interval, 1)
            sample["foreign_cores"] = round(foreign / interval, 3) if foreign is not None else None
        last.update(wall=wall, changes=float(changes))
        sample["rss_bytes"] = memory_sample(root)
        sample["sink"] = {
            "commits": metrics.commits,
            "skipped_commits": metrics.skipped_commits,
            "compactions_triggered": metrics.compactions_triggered,
            "compactions_succeeded": metrics.compactions_succeeded,
            "compactions_failed": metrics.compactions_failed,
            "compactions_noop": metrics.compactions_noop,
            "conversions_succeeded": metrics.conversions_succeeded,
            "conversions_failed": metrics.conversions_failed,
            "post_commit_hook_failures": metrics.post_commit_hook_failures,
        }
        if metrics.commits:
            if not table_dir:
                location = str(sink.load_table().location()).removeprefix("file://")
                table_dir.append(Path(location))
            sample["table"] = table_sample(sink.load_table, table_dir[0])
        return sample

    sampler = Sampler(args.sample_seconds, take)
    query: Any = None
    error: str | None = None
    stopped_after = 0.0
    try:
        df = changes_frame(spark, args.rows_per_second, args.keys, args.source_partitions)
        query = sink.start(
            df, str(checkpoint), trigger={"processingTime": f"{args.trigger_seconds} seconds"}, query_name="soak"
        )
        sampler.start()
        deadline = started + args.minutes * 60
        next_log = started + 60
        while time.time() < deadline:
            if not query.isActive:
                exc = query.exception()
                error = f"the stream stopped: {exc}" if exc is not None else "the stream stopped"
                break
            time.sleep(min(1.0, max(0.0, deadline - time.time())))
            if time.time() >= next_log:
                next_log += 60
                s = sampler.samples[-1] if sampler.samples else {}
                tbl = s.get("table", {})
                rss = s.get("rss_bytes", {})
                log(
                    f"{(time.time() - started) / 60:.0f} min: {recorder.changes_committed:,} changes in "
                    f"{len(recorder.commits)} commits; data files {tbl.get('data_files')}, delete files "
                    f"{tbl.get('delete_files')}, snapshots {tbl.get('snapshots')}; RSS MiB driver "
                    f"{rss.get('driver_python', 0) / MIB:.0f}, JVM {rss.get('driver_jvm', 0) / MIB:.0f}, "
                    f"workers {rss.get('python_workers_sum', 0) / MIB:.0f}; foreign cores {s.get('foreign_cores')}"
                )
        stop_requested = time.time()
        stopped_after = stop_between_batches(query, timeout=120)
        ended = time.time()
        # A batch interrupted by stop() may still be committing on the driver; background jobs finish.
        settle = time.monotonic()
        while time.monotonic() - settle < 30:
            commits = sink.metrics().commits
            time.sleep(3)
            if sink.metrics().commits == commits:
                break
        sink.await_compactions(timeout=600)
        sink.await_conversions(timeout=600)
        sampler.sample()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        log(f"run failed: {error}")
        stop_requested = ended = time.time()
        if query is not None and query.isActive:
            query.stop()
    finally:
        sampler.stop()
        monitor.stop()
    progress = [json.loads(p.json) for p in query.recentProgress] if query is not None else []
    metrics = sink.metrics()
    table = sink.load_table()
    metadata_location = str(table.metadata_location)
    checkpoint_id = last_sink_checkpoint(table)
    spark_version = spark.version
    spark.stop()

    last_value = -1 if checkpoint_id is None else rate_end_value(checkpoint, checkpoint_id, args.rows_per_second) - 1
    expected = expected_state(last_value, args.keys)
    checks: dict[str, Any] = {
        "last_committed_checkpoint": checkpoint_id,
        "last_recorded_checkpoint": recorder.last_checkpoint_id,
        "changes": last_value + 1,
        "model_rows": len(expected),
        "model_lsn_sum": sum(expected.values()),
    }
    log(f"reading back {metadata_location}: {len(expected):,} rows expected after {last_value + 1:,} changes")
    checks.update(verify(metadata_location, expected, java=not args.no_java))
    checks["ok"] = (
        error is None
        and checkpoint_id is not None
        and checkpoint_id == recorder.last_checkpoint_id
        and all(checks[r]["matches_model"] for r in ("duckdb", "iceberg_java") if r in checks)
        and (args.no_java or "iceberg_java" in checks)
    )

    samples = sampler.samples
    commits = recorder.commits
    # The rate source counts from its first (empty) micro-batch: the row with value v is generated
    # at rate_start + v / rows-per-second. Freshness: how old a commit's newest change is when it lands.
    rate_start = (
        dt.datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp() if progress else started
    )
    for c in commits:
        c["freshness_s"] = round(c["wall"] - (rate_start + c["end_value"] / args.rows_per_second), 3)
    generated_at_stop = int(max(0.0, stop_requested - rate_start) * args.rows_per_second)
    commit_times = [c["t"] for c in commits]
    run_seconds = ended - started
    warmup = min(args.warmup_seconds, run_seconds / 5)
    foreign = [s["foreign_cores"] for s in samples if s.get("foreign_cores") is not None]
    batches = batch_records(progress)
    steady_commits = [c for c in commits if c["t"] >= warmup]
    throughput_window = (
        (steady_commits[-1]["end_value"] - steady_commits[0]["end_value"])
        / (steady_commits[-1]["t"] - steady_commits[0]["t"])
        if len(steady_commits) > 1 and steady_commits[-1]["t"] > steady_commits[0]["t"]
        else None
    )
    summary = {
        "run_seconds": round(run_seconds, 1),
        "warmup_seconds": round(warmup, 1),
        "throughput": {
            "changes_committed": last_value + 1,
            "target_rows_per_second": args.rows_per_second,
            "changes_per_second_overall": round((last_value + 1) / commit_times[-1], 1) if commit_times else None,
            "changes_per_second_after_warmup": _round(throughput_window),
            "rows_generated_by_stop": generated_at_stop,
            "lag_changes_at_stop": generated_at_stop - (last_value + 1),
            "commits": len(commits),
            "batches": len(batches),
            "empty_batches": sum(1 for b in batches if not b["input_rows"]),
        },
        "commit_latency_ms": stats([c["commit_ms"] for c in commits]),
        "commit_latency_ms_after_warmup": stats([c["commit_ms"] for c in steady_commits]),
        "freshness_seconds": stats([c["freshness_s"] for c in commits]),
        "batch_trigger_ms": stats([float(b["trigger_ms"]) for b in batches if b["input_rows"] and b["trigger_ms"]]),
        "batch_input_rows": stats([float(b["input_rows"]) for b in batches if b["input_rows"]]),
        "memory": memory_summary(samples, commit_times[0] if commit_times else 0.0, warmup),
        "files": file_summary(samples),
        "maintenance": {
            "compactions_triggered": metrics.compactions_triggered,
            "compactions_succeeded": metrics.compactions_succeeded,
            "compactions_failed": metrics.compactions_failed,
            "compactions_noop": metrics.compactions_noop,
            "compaction_dropped_groups": metrics.compaction_dropped_groups,
            "compaction_replans": metrics.compaction_replans,
            "compaction_rewritten_files": metrics.compaction_rewritten_files,
            "compaction_added_files": metrics.compaction_added_files,
            "compaction_removed_delete_files": metrics.compaction_removed_delete_files,
            "conversions_triggered": metrics.conversions_triggered,
            "conversions_succeeded": metrics.conversions_succeeded,
            "conversions_failed": metrics.conversions_failed,
            "conversion_removed_equality_delete_files": metrics.conversion_removed_equality_delete_files,
            "conversion_added_position_delete_files": metrics.conversion_added_position_delete_files,
            "last_conversion_error": metrics.last_conversion_error,
            "expiries": len(recorder.expiries),
            "expired_snapshots": sum(e.get("snapshots", 0) for e in recorder.expiries),
            "expiry_deleted_files": sum(e.get("deleted_files", 0) for e in recorder.expiries),
            "expiry_errors": sum(1 for e in recorder.expiries if "error" in e),
            "post_commit_hook_failures": metrics.post_commit_hook_failures,
        },
        "foreign_cpu": {
            "note": "cores used by processes outside this benchmark per sampling interval (cpu_monitor.py)",
            "mean_cores": _round(statistics.fmean(foreign), 3) if foreign else None,
            "max_cores": max(foreign, default=None),
            "disturbed_threshold_cores": DISTURBED_CORES,
            "disturbed_intervals": sum(1 for f in foreign if f > DISTURBED_CORES),
            "intervals": len(foreign),
        },
    }
    return {
        "benchmark": "soak",
        "command": " ".join(["python -m benchmarks.soak", *sys.argv[1:]]),
        "started_at": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "spark_version": spark_version,
        "pyspark_version": pyspark.__version__,
        "pyiceberg_version": pyiceberg.__version__,
        "machine": machine(),
        "iceberg_sink_source": source_state(),
        "parameters": {k: v for k, v in vars(args).items() if k not in ("out", "work_dir")},
        "error": error,
        "stop_waited_seconds": round(stopped_after, 2),
        "summary": summary,
        "checks": checks,
        "ok": bool(checks["ok"]),
        "samples": samples,
        "sample_errors": sampler.errors,
        "commits": commits,
        "batches": batches,
        "expiries": recorder.expiries,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the stream runs (default 30)")
    parser.add_argument("--rows-per-second", type=int, default=2000, help="rate source rows per second (2000)")
    parser.add_argument("--keys", type=int, default=100_000, help="key space of the changes (100000)")
    parser.add_argument("--source-partitions", type=int, default=2, help="rate source partitions (2)")
    parser.add_argument("--trigger-seconds", type=float, default=5.0, help="processing-time trigger (5)")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="sampling interval (5)")
    parser.add_argument("--compact-every", type=int, default=12, help="compaction every N commits; 0: off (12)")
    parser.add_argument(
        "--convert-every", type=int, default=0, help="equality-delete conversion every N commits; 0: off (0)"
    )
    parser.add_argument("--expire-every", type=int, default=60, help="expire snapshots every N commits; 0: off (60)")
    parser.add_argument("--retain-last", type=int, default=10, help="snapshots kept by each expiry (10)")
    parser.add_argument(
        "--warmup-seconds", type=float, default=120.0, help="left out of slopes and steady rates (120, at most 1/5)"
    )
    parser.add_argument("--cores", type=int, default=2, help="local[N] (2)")
    parser.add_argument("--driver-memory", default="1g", help="spark.driver.memory (1g)")
    parser.add_argument("--no-java", action="store_true", help="verify with DuckDB only")
    parser.add_argument("--work-dir", default=None, help="keep the table here (default: a removed temporary dir)")
    parser.add_argument("--out", default=str(PROJECT_ROOT / "benchmarks" / "results" / "soak.json"))
    args = parser.parse_args(argv)
    for name in ("rows_per_second", "keys", "source_partitions", "cores", "retain_last"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, received {getattr(args, name)}")
    for name in ("compact_every", "convert_every", "expire_every"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')}: expected 0 (off) or more, received {getattr(args, name)}")
    if args.minutes <= 0 or args.trigger_seconds <= 0 or args.sample_seconds <= 0:
        parser.error("--minutes, --trigger-seconds and --sample-seconds: expected positive numbers")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="iceberg-sink-soak-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log(f"work directory {work}; {args.minutes} min at {args.rows_per_second} rows/s over {args.keys} keys")
    try:
        result = run(args, work)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    s = result["summary"]
    lat = s["commit_latency_ms"]
    log(
        f"{s['throughput']['changes_committed']:,} changes in {s['throughput']['commits']} commits "
        f"({s['throughput']['changes_per_second_overall']} /s); commit ms p50 {lat.get('p50', 0):.0f} "
        f"p99 {lat.get('p99', 0):.0f} max {lat.get('max', 0):.0f}; checks {'ok' if result['ok'] else 'FAILED'}; "
        f"wrote {args.out}"
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
