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

- **iceberg_sink_v3** and **merge_into_v3** (opt-in, issue 22): the same two drivers on format v3
  tables. The sink's upsert then commits deletion vectors (DVs) in each checkpoint instead of
  equality deletes (docs/format-v3.md); ``merge_into_v3`` creates its table with
  ``'format-version'='3'`` and merge-on-read, so Iceberg Java 1.9.2's MERGE writes DVs instead of
  position delete files.

- **flink** (opt-in, ``--systems ...,flink``; ``benchmarks/flink_driver.py`` in the Flink venv of
  ``benchmarks/flink_env.py``: PyFlink 2.1.3 + ``iceberg-flink-runtime-2.1`` 1.11.0, local
  mini-cluster, parallelism ``--cores``, Hadoop catalog): Apache Flink's own Iceberg sink in upsert
  mode (``PRIMARY KEY (id)``, ``'write.upsert.enabled'='true'``: one equality delete per written
  row); the initial rows are appended (upsert off for that statement), then each batch is one
  bounded ``INSERT INTO`` job, whose sink commits one snapshot at its end.
- **flink_stream** (opt-in): the same sink as one long-running streaming job over every batch in
  order, committing at each checkpoint (``--flink-checkpoint-ms``, default 500): Flink as deployed
  for CDC. Its "batches" in the result are its commits (seconds since the previous commit, the
  commit's changes in ``batch_changes``), so its figures are per commit, not per input batch.
- **iceberg_sink_kafka** and **flink_kafka** (opt-in; ``_v3``: format v3 tables): both systems as
  one streaming query / job over the same Kafka topic, produced once before either runs
  (``benchmarks/cdc_kafka.py``: the broker, the messages, ``--kafka-max-offsets-per-trigger``).
- **iceberg_sink_stream** (opt-in): the v2 sink as one streaming query, like ``flink_stream``:
  ``sink.start`` over the batch files (``maxFilesPerTrigger`` = ``--sink-files-per-trigger``,
  default 1), each micro-batch starting as soon as the last one ended, timed from the start call; its
  entries are its micro-batches' commits, as seen by polling the sink's progress records. With more
  than one file per micro-batch the sink orders each key's changes by ``version`` (the batch number):
  Spark reads a micro-batch's files in order of size, not of name, so arrival order across them is
  not the stream's order (docs/cdc.md, "Ordering: ties and nulls").

Each system runs in a fresh process of its own, in the order ``--systems`` names them, and does the
same before its timed work: start Spark, create the empty table (untimed), then the load and the
batches. Each batch is timed from reading its Parquet file to the end of the commit (wall seconds),
and the CPU seconds of the driver's process tree are read around it. The results hold end to end
(load and every batch) and steady state (the batches after the first ``--warmup``: JIT, class
loading, Python workers) apart (``benchmarks/cdc_systems.py``). After every system has run, one
more fresh process (Spark 3.5 + Iceberg Java 1.9.2) reads every table back from its metadata.json
and compares it with the generator's expected state: row count, distinct ids, the sum of
``version``, exact per-column checksums over all rows and a few hundred sampled rows; then it times
full aggregate scans of each, alternating between the tables, the order rotated every round (a fixed order favours the later table).

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
import contextlib
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import cdc_kafka
from benchmarks.cdc_data import CHECKSUM_SQL, NEW_KEY_LAYOUTS, generate
from benchmarks.cdc_results import engine_of, report, system_extras, system_result, unread_result
from benchmarks.cdc_systems import (
    DEFAULT_SYSTEMS,
    SYSTEMS,
    parse_systems,
    percentile,
    summarize,
    v3_goals,
    write_figures,
)
from benchmarks.cpu_monitor import ForeignCpuMonitor

__all__ = ["java_env_paths", "machine", "main", "percentile", "source_state", "summarize"]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
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


# -- the two drivers --------------------------------------------------------------------------


def flink_env(kafka: bool = False) -> Any:
    """The Flink venv's python and jars (benchmarks/flink_env.py; the venv is built on first use);
    with ``kafka``, Flink's Kafka connector's too."""
    from benchmarks.flink_env import ensure_flink_env

    return ensure_flink_env(kafka=kafka)


def java_env_paths() -> tuple[Path, Path]:
    """The Java venv's python and the Iceberg runtime jar (the venv is built on first use, as in the tests)."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.java_env import ensure_java_env

    env = ensure_java_env()
    return env.python, env.jar


def run_driver(
    python: Path | str, module: str, spec: dict[str, Any], work_dir: Path, scrub: bool, name: str | None = None
) -> dict[str, Any]:
    """Run ``python -m module SPEC.json`` from the project root; return the JSON it wrote to
    ``spec["result"]`` (spec and result files named after ``name``, by default the module)."""
    name = name or module.rsplit(".", 1)[-1]
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


class _KeyValue(argparse.Action):
    """``--write-option`` or ``--sink-spark-conf KEY=VALUE``, repeatable, collected into one dict."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        key, sep, text = str(value).partition("=")
        if not sep or not key:
            parser.error(f"{option}: expected KEY=VALUE, received {value!r}")
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), key: text})


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
        "--scans",
        type=int,
        default=3,
        help="timed full scans of each final table with Iceberg Java (default 3); 0: no read-back at all, "
        "neither scans nor the checks (a run of millions of changes leaves hundreds of equality-delete files "
        "that Iceberg Java takes far longer to read than the run took to write): the result says so "
        '("checks": not run, "ok": null)',
    )
    parser.add_argument(
        "--convert",
        type=int,
        default=0,
        help="run the sink with .convert_equality_deletes(every_n_commits=N) in the background (default 0: off)",
    )
    parser.add_argument(
        "--write-option",
        action=_KeyValue,
        default={},
        metavar="KEY=VALUE",
        help="a write option of the sinks (.write_option(KEY, VALUE)), repeatable, e.g. "
        "iceberg-sink.conversion.key-index-persist=false",
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
        help=f"comma-separated subset of {', '.join(SYSTEMS)}, run in that order (default {','.join(DEFAULT_SYSTEMS)})",
    )
    parser.add_argument("--note", default="", help="free text recorded in the JSON (e.g. what else ran on the machine)")
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
    parser.add_argument(
        "--flink-checkpoint-ms",
        type=int,
        default=500,
        help="flink_stream: Flink's checkpoint interval, so its commit interval (default 500)",
    )
    parser.add_argument(
        "--sink-files-per-trigger",
        type=int,
        default=1,
        help="iceberg_sink_stream: input batches per micro-batch (maxFilesPerTrigger, default 1)",
    )
    parser.add_argument(
        "--sink-spark-conf",
        action=_KeyValue,
        default={},
        metavar="KEY=VALUE",
        help="a Spark setting for the sink's session (repeatable), e.g. "
        "spark.sql.streaming.checkpointFileManagerClass=...",
    )
    cdc_kafka.add_arguments(parser)
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (tables, data) afterwards")
    args = parser.parse_args(argv)
    try:
        args.systems = parse_systems(args.systems)
    except ValueError as e:
        parser.error(f"--systems: {e}")
    if args.warmup < 0 or args.batches < 1 or args.scans < 0:
        parser.error("--batches must be at least 1, --scans and --warmup at least 0")
    if args.convert < 0 or args.scan_every < 0:
        parser.error(f"--convert and --scan-every: expected >= 0, received {args.convert} and {args.scan_every}")
    if args.sink_files_per_trigger < 1:
        parser.error(f"--sink-files-per-trigger: expected >= 1, received {args.sink_files_per_trigger}")
    cdc_kafka.check_arguments(parser, args)
    return args


def read_back(
    args: argparse.Namespace,
    raws: dict[str, dict[str, Any]],
    java_python: Path,
    common: dict[str, Any],
    jar: Path,
    work_dir: Path,
    sample_ids: list[int],
    sink_raw: dict[str, Any] | None,
    merge_raw: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """Every table read back by one fresh Iceberg Java process (checks and timed scans); None with
    ``--scans 0`` (nothing read: the result records the checks as not run)."""
    if args.scans == 0:
        return None
    return run_driver(
        java_python,
        "benchmarks.merge_into_driver",
        {
            **common,
            "jar": str(jar),
            "warehouse": str(work_dir / "reader-warehouse"),
            "merge": False,
            "sample_ids": sample_ids,
            "checksum_sql": CHECKSUM_SQL,
            "scans": args.scans,
            "read_tables": {name: raw["metadata_location"] for name, raw in raws.items()},
            "scan_points": sink_raw["scan_points"] if sink_raw else [],
            "scan_reference": (
                {
                    "metadata_location": merge_raw["metadata_location"],
                    "snapshot_ids": merge_raw["batch_snapshot_ids"],
                }
                if merge_raw
                else None
            ),
        },
        work_dir,
        True,
        "reader",
    )


def run_writers(
    args: argparse.Namespace,
    work_dir: Path,
    common: dict[str, Any],
    java_python: Path,
    jar: Path,
    kafka: Callable[[Path], contextlib.AbstractContextManager[dict[str, Any]]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Run each system's writer in a fresh process of its own, in the order of ``--systems``;
    ``kafka``: for the _kafka systems, the change topic's ``spec`` entry (cdc_kafka.ChangeTopic) in a
    context that lasts the system's run (given its scratch directory), entered before its clock starts."""
    raws: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}
    for name in args.systems:
        system = SYSTEMS[name]
        system_work = work_dir / name
        system_work.mkdir()
        on_kafka = system.source == "kafka"
        if on_kafka and kafka is None:
            raise RuntimeError(f"{name} reads the change topic, which was not produced")
        with kafka(system_work) if on_kafka and kafka is not None else contextlib.nullcontext(None) as topic:
            started = time.perf_counter()
            log(f"{name}: starting its driver")
            raws[name] = run_system(args, name, system_work, work_dir, common, java_python, jar, topic)
            timings[name] = time.perf_counter() - started
    return raws, timings


def run_system(
    args: argparse.Namespace,
    name: str,
    system_work: Path,
    work_dir: Path,
    common: dict[str, Any],
    java_python: Path,
    jar: Path,
    kafka: dict[str, Any] | None,
) -> dict[str, Any]:
    """One system's writer in a fresh process of its own; ``kafka``: the change topic's ``spec`` entry."""
    system = SYSTEMS[name]
    on_kafka = system.source == "kafka"
    if system.driver == "sink":
        spec = {
            **common,
            "work_dir": str(system_work),
            "format_version": system.format_version,
            # The conversion writes position delete files, which v3 refuses; scan points compare v2 tables.
            "convert_every": args.convert if system.format_version == 2 else 0,
            "scan_every": args.scan_every if name == "iceberg_sink" else 0,
            "write_options": args.write_option,
            "mode": "kafka" if on_kafka else "stream" if name == "iceberg_sink_stream" else "batches",
            "files_per_trigger": args.sink_files_per_trigger,
            # Spark orders the files of one micro-batch by size, not by name: the changes of a key
            # then need an order (the batch number, unique per key and batch) across files; a Kafka
            # micro-batch holds several changes of a key too.
            "order_by": "version"
            if on_kafka or (name == "iceberg_sink_stream" and args.sink_files_per_trigger > 1)
            else None,
            "spark_conf": args.sink_spark_conf,
            **(
                {
                    "kafka": {**(kafka or {}), "source_options": cdc_kafka.source_options(args)},
                    "spark_jars": cdc_kafka.spark_kafka_jars(),
                }
                if on_kafka
                else {}
            ),
        }
        return run_driver(sys.executable, "benchmarks.sink_driver", spec, work_dir, False, name)
    if system.driver == "merge":
        spec = {
            **common,
            "jar": str(jar),
            "warehouse": str(system_work / "warehouse"),
            "merge": True,
            "format_version": system.format_version,
        }
        return run_driver(java_python, "benchmarks.merge_into_driver", spec, work_dir, True, name)
    env = flink_env(kafka=on_kafka)
    spec = {
        **common,
        "work_dir": str(system_work),
        "jars": [str(j) for j in env.jars],
        "parallelism": args.cores,
        "mode": "kafka" if on_kafka else "stream" if name == "flink_stream" else "batches",
        "checkpoint_interval_ms": args.flink_checkpoint_ms,
        "format_version": system.format_version,
        **({"kafka": kafka} if on_kafka else {}),
    }
    return run_driver(env.python, "benchmarks.flink_driver", spec, work_dir, True, name)


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
        # The _kafka systems' broker and topic: a fresh one before each such system (or, with
        # --kafka-shared-broker, one before the first), produced untimed for each.
        topics: list[cdc_kafka.ChangeTopic] = []
        kafka_seconds = 0.0
        written = None
        if any(SYSTEMS[name].source == "kafka" for name in args.systems):
            written = cdc_kafka.write_messages(work_dir, data.batch_files)

        @contextlib.contextmanager
        def change_topic(directory: Path) -> Iterator[dict[str, Any]]:
            """A fresh broker for one system's run, or the shared one every run gets."""
            nonlocal kafka_seconds
            assert written is not None
            if args.kafka_shared_broker and topics:
                yield topics[0].spec(args.kafka_max_offsets_per_trigger)
                return
            started = time.perf_counter()
            with cdc_kafka.change_topic(directory, written, args.kafka_partitions) as topic:
                kafka_seconds += time.perf_counter() - started
                topics.append(topic)
                yield topic.spec(args.kafka_max_offsets_per_trigger)

        with contextlib.ExitStack() as shared:
            if args.kafka_shared_broker and written is not None:
                shared.enter_context(change_topic(work_dir))  # before the first system, for all
            raws, timings = run_writers(
                args, work_dir, common, java_python, jar, change_topic if written is not None else None
            )
        timings["generate"] = data.generate_seconds
        topic = topics[0] if topics else None
        if topic is not None:
            timings["kafka_broker_and_topic"] = kafka_seconds + (written.write_seconds if written else 0.0)

        # One fresh Iceberg Java process reads every table back and times the scans (none with --scans 0).
        started = time.perf_counter()
        sink_raw, merge_raw = raws.get("iceberg_sink"), raws.get("merge_into")
        reader = read_back(
            args,
            raws,
            java_python,
            common,
            jar,
            work_dir,
            sample_ids,
            sink_raw,
            merge_raw,
        )
        timings["reader"] = time.perf_counter() - started
        reader_name = (
            f"Iceberg Java (Spark {reader['spark_version']} + Apache Iceberg Java {reader['iceberg_version']})"
            if reader
            else "none (--scans 0)"
        )

        systems: dict[str, dict[str, Any]] = {}
        for name, raw in raws.items():
            systems[name] = {
                **(
                    system_result(raw, engine_of(name, raw), reader["observed"][name], reader_name, data, sample_ids)
                    if reader
                    else unread_result(raw, engine_of(name, raw))
                ),
                **system_extras(name, raw, reader or {}, jar),
                "full_scan_seconds": statistics.median(reader["scan_runs"][name]) if reader else None,
                "full_scan_runs": reader["scan_runs"][name] if reader else [],
                "full_scan_cpu_runs": (reader.get("scan_cpu_runs") or {}).get(name) if reader else None,
                **write_figures(raw, args.warmup, args.batch_size, args.rows),
                # A driver whose engine runs outside its process tree (Flink's JVM) measures it itself.
                "batch_foreign_cpu_seconds": raw.get("batch_foreign_cpu_seconds")
                or [monitor.between(a, b) for a, b in raw["batch_intervals"]],
            }
        monitor.stop()
        foreign_total = monitor.between(wall_started, time.time())
        result: dict[str, Any] = {
            "benchmark": "cdc-upsert",
            "started_at": started_at,
            "note": args.note,
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
                "write_options": args.write_option,
                "sink_spark_conf": args.sink_spark_conf,
                "sink_files_per_trigger": args.sink_files_per_trigger,
                "flink_checkpoint_ms": args.flink_checkpoint_ms,
                "kafka": topic.config(args.kafka_max_offsets_per_trigger) if topic else None,
                "scan_every": args.scan_every,
                "systems": args.systems,
                "wait_quiet": args.wait_quiet,
                "initial_parquet_bytes": data.bytes_initial,
            },
            "machine": {**machine(), "java_runtime_of_spark_3_5": reader.get("java_version") if reader else None},
            "iceberg_sink_source": source,
            "rows_before_batch": [data.rows_before_batch(i) for i in range(args.batches)],
            "systems": systems,
            "v3_goals": v3_goals(systems),
            "foreign_cpu": {
                "note": "CPU seconds used by processes outside this benchmark while it ran (cpu_monitor.py)",
                "total_seconds": foreign_total,
                "seconds_of_run": time.time() - wall_started,
                "quiet_gate": common["quiet"],
            },
            "timings_seconds": {**timings, "total": time.perf_counter() - run_started},
            "ok": all(s["checks"]["ok"] for s in systems.values()) if reader else None,
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
    report(result, args.out)
    return 0 if result["ok"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
