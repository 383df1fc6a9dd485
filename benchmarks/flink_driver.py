"""The Flink side of the CDC benchmark: Apache Flink's own Iceberg sink in upsert mode (PyFlink).

Runs in the Flink venv (``apache-flink`` from PyPI, see ``benchmarks/flink_env.py``), started by
``benchmarks/cdc.py``::

    <venv-flink>/bin/python -m benchmarks.flink_driver SPEC.json

``SPEC.json`` (written by cdc.py) names the jars (``iceberg-flink-runtime`` and the Hadoop client
jars the Iceberg Hadoop catalog needs), a scratch directory, the Parquet files of the initial load
and of each batch, and the parallelism. The driver, with Flink's Table API in a local mini-cluster
(batch execution mode, ``parallelism.default`` from the spec):

1. creates ``ice.db.cdc`` in an Iceberg Hadoop catalog (warehouse under the scratch directory):
   format v2, ``PRIMARY KEY (id) NOT ENFORCED`` and ``'write.upsert.enabled'='true'``, Flink's
   upsert mode: every written row is preceded by an equality delete on its key;
2. loads the initial rows with one ``INSERT INTO`` job whose sink has ``upsert-enabled`` switched
   off by a hint (a plain append, as the iceberg_sink side appends its initial rows with an
   append-mode sink; an upsert load would add one equality delete per initial row), timed;
3. applies each batch as one bounded job ``INSERT INTO ice.db.cdc SELECT ... FROM <the batch>``:
   the Iceberg committer commits once, at the end of the job's input, so each batch is one Iceberg
   snapshot (as one checkpoint of a streaming job would be); each batch is timed from the job's
   submission to the end of the job, its commit included, and the new snapshot is read back from
   the table's metadata to check that exactly one was committed. Flink's own net runtime of each
   job (``batch_job_net_runtime_seconds``: running to finished, without planning and submission)
   is recorded beside it, to tell the per-job start-up from the work.

With ``"mode": "stream"`` in the spec (the ``flink_stream`` system of ``benchmarks/cdc.py``), step 3
is one long-running streaming job instead, the way Flink is deployed for CDC: every batch, in order,
through one job whose Iceberg committer commits a snapshot per completed checkpoint
(``checkpoint_interval_ms``), see :func:`run_stream`. With ``"mode": "kafka"`` (``flink_kafka``) that
job reads the change topic of ``benchmarks/cdc_kafka.py`` instead of a CSV file (``run_kafka``,
``benchmarks/flink_kafka.py``). ``spec["format_version"]`` (2 by default) is the table's format.

Input format: this PyFlink ships no Parquet format (``flink-sql-parquet`` is not on the Maven
repository this project reaches), so before anything is timed the driver rewrites each Parquet file
as CSV with PyArrow (``ts`` as ``yyyy-MM-dd HH:mm:ss.SSSSSS`` in UTC) and the jobs read those with
Flink's filesystem connector and its CSV format; ``ts`` is cast to ``TIMESTAMP_LTZ(6)`` (Iceberg
``timestamptz``, the type the other two systems' tables have) with the session time zone UTC.

The result (per-batch seconds and wall-clock intervals, snapshot summaries, the table's metadata
location, which Iceberg Java reads back in the reader process, ``merge_into_driver.py``) is written as JSON to the
``result`` path of the spec. Progress goes to stderr. Apart from ``benchmarks.cpu_monitor`` it needs
nothing of the project (it runs from the project root so that ``benchmarks`` is importable).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cdc_systems import entry_changes
from benchmarks.cpu_monitor import quiet_gate, tree_cpu_seconds
from benchmarks.driver_main import driver_main

CATALOG = "ice"
TABLE = f"{CATALOG}.db.cdc"
TABLE_PROPERTIES = {"format-version": "2", "write.upsert.enabled": "true"}
TABLE_COLUMNS = (
    "id BIGINT NOT NULL, name STRING, version BIGINT, amount DOUBLE, ts TIMESTAMP_LTZ(6), PRIMARY KEY (id) NOT ENFORCED"
)
SOURCE_COLUMNS = "id BIGINT, name STRING, version BIGINT, amount DOUBLE, ts TIMESTAMP(6)"
SELECT_COLUMNS = "id, name, version, amount, CAST(ts AS TIMESTAMP_LTZ(6))"
# The initial load appends: the sink's upsert mode is switched off for that one statement.
LOAD_HINT = "/*+ OPTIONS('upsert-enabled'='false') */"


def log(message: str) -> None:
    print(f"[flink {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parquet_to_csv(source: Path, target: Path) -> int:
    """Rewrite one input file as header-less CSV for Flink's CSV format; return its rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    table = pq.read_table(source)
    ts = table.column("ts")
    # Arrow's %S prints the seconds with their microseconds for a microsecond timestamp.
    text = pc.strftime(ts, format="%Y-%m-%d %H:%M:%S")
    table = table.set_column(table.schema.get_field_index("ts"), pa.field("ts", pa.string()), text)
    pcsv.write_csv(table, target, write_options=pcsv.WriteOptions(include_header=False, quoting_style="needed"))
    return table.num_rows


class Metadata:
    """The Hadoop catalog table's current metadata.json (version-hint.text names it)."""

    def __init__(self, table_dir: Path) -> None:
        self.dir = table_dir / "metadata"

    def location(self) -> Path:
        version = int((self.dir / "version-hint.text").read_text(encoding="utf-8").strip())
        return self.dir / f"v{version}.metadata.json"

    def load(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.location().read_text(encoding="utf-8"))
        return data

    def version(self, number: int) -> dict[str, Any]:
        """The metadata of version ``number`` (the Hadoop catalog keeps every version's file)."""
        data: dict[str, Any] = json.loads((self.dir / f"v{number}.metadata.json").read_text(encoding="utf-8"))
        return data

    @staticmethod
    def snapshots(data: dict[str, Any]) -> list[dict[str, Any]]:
        return list(data.get("snapshots") or [])


def start_flink(spec: dict[str, Any]) -> Any:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    # The jars go on the class path of the JVM PyFlink starts (its gateway runs the local
    # mini-cluster too): the catalog is created in that JVM's own class loader, before any job,
    # so ``pipeline.jars`` (the jobs' user-code class loader) is too late for the Hadoop classes.
    os.environ["HADOOP_CLASSPATH"] = os.pathsep.join(str(Path(j).resolve()) for j in spec["jars"])
    settings = EnvironmentSettings.in_batch_mode()
    t_env = TableEnvironment.create(settings)
    config = t_env.get_config()
    config.set("parallelism.default", str(spec.get("parallelism", 2)))
    config.set("table.local-time-zone", "UTC")
    config.set("table.dynamic-table-options.enabled", "true")
    for key, value in (spec.get("flink_conf") or {}).items():
        config.set(str(key), str(value))
    return t_env


def job_net_runtime(job: Any) -> float | None:
    """The finished job's net runtime in seconds, as Flink reports it (running to finished, without
    the planning and submission before it); None if it cannot be had. Informational only."""
    try:
        client = job.get_job_client()
        return float(client.get_job_execution_result().result().get_net_runtime()) / 1000.0
    except Exception as e:  # only informational
        log(f"no net runtime for the job ({type(e).__name__}: {e})")
        return None


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def _tree_pids() -> set[int]:
    """This process and its descendants, now (Linux /proc; empty elsewhere)."""
    from benchmarks.cpu_monitor import _descendants, _read_processes

    return _descendants(os.getpid(), _read_processes()) if Path("/proc/self/stat").exists() else set()


def table_properties(spec: dict[str, Any]) -> dict[str, str]:
    """The table's properties: Flink's upsert mode, at the spec's format version (2 by default)."""
    return {**TABLE_PROPERTIES, "format-version": str(spec.get("format_version") or 2)}


def source_table(t_env: Any, name: str, path: Path) -> str:
    t_env.execute_sql(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    t_env.execute_sql(
        f"CREATE TEMPORARY TABLE {name} ({SOURCE_COLUMNS}) WITH ("
        f"'connector'='filesystem', 'path'='{path.resolve().as_uri()}', 'format'='csv')"
    )
    return name


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import pyflink

    monitor, wait_quiet = quiet_gate(spec)
    if spec.get("kafka"):  # the change topic's broker is the benchmark's, not another process
        monitor.adopt(int(spec["kafka"]["broker_pid"]))
    work = Path(spec["work_dir"]).resolve()
    warehouse = work / "warehouse"
    csv_dir = work / "csv"
    csv_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "flink_version": getattr(pyflink, "__version__", "unknown"),
        "jars": [Path(j).name for j in spec["jars"]],
        "table_properties": table_properties(spec),
        "parallelism": spec.get("parallelism", 2),
    }
    try:
        started = time.perf_counter()
        initial_csv = csv_dir / "initial"
        initial_csv.mkdir()
        for i, path in enumerate(spec["initial_files"]):
            parquet_to_csv(Path(path), initial_csv / f"part-{i:05d}.csv")
        batch_csvs = []
        # The kafka mode reads the batches from the change topic: only the initial rows are CSV.
        for i, path in enumerate([] if spec.get("mode") == "kafka" else spec["batch_files"]):
            target = csv_dir / f"batch-{i + 1:05d}.csv"
            parquet_to_csv(Path(path), target)
            batch_csvs.append(target)
        result["csv_conversion_seconds"] = time.perf_counter() - started
        log(f"rewrote the input as CSV in {result['csv_conversion_seconds']:.1f}s (not timed)")

        t_env = start_flink(spec)
        from pyflink.java_gateway import get_gateway

        jvm = get_gateway().jvm
        result["java_version"] = str(jvm.java.lang.System.getProperty("java.version"))
        # Flink's JVM (its gateway and the mini-cluster that runs every job) is not a descendant of
        # this process: PyFlink's launcher between them exits. Its CPU is counted by its pid.
        jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        monitor.adopt(jvm_pid)
        result["jvm_pid_in_tree"] = jvm_pid in _tree_pids()

        def cpu() -> float | None:
            return tree_cpu_seconds(also=(jvm_pid,))

        t_env.execute_sql(
            f"CREATE CATALOG {CATALOG} WITH ('type'='iceberg', 'catalog-type'='hadoop', "
            f"'warehouse'='{warehouse.as_uri()}', 'property-version'='1')"
        )
        t_env.execute_sql(f"CREATE DATABASE IF NOT EXISTS {CATALOG}.db")
        props = ", ".join(f"'{k}'='{v}'" for k, v in table_properties(spec).items())
        t_env.execute_sql(f"CREATE TABLE {TABLE} ({TABLE_COLUMNS}) WITH ({props})")
        metadata = Metadata(warehouse / "db" / "cdc")
        result["iceberg_version"] = str(jvm.org.apache.iceberg.IcebergBuild.version())

        result["load_waited_for_quiet_seconds"] = wait_quiet()
        cpu_before = cpu()
        started = time.perf_counter()
        source_table(t_env, "initial_rows", initial_csv)
        t_env.execute_sql(f"INSERT INTO {TABLE} {LOAD_HINT} SELECT {SELECT_COLUMNS} FROM initial_rows").wait()
        result["load_seconds"] = time.perf_counter() - started
        result["load_cpu_seconds"] = cpu_delta(cpu_before, cpu())
        snapshots = Metadata.snapshots(metadata.load())
        log(f"loaded the initial rows in {result['load_seconds']:.1f}s ({len(snapshots)} snapshot(s))")

        if spec.get("mode") == "stream":
            result.update(run_stream(spec, batch_csvs, csv_dir, warehouse, metadata, monitor, wait_quiet, cpu))
            return result
        if spec.get("mode") == "kafka":
            result.update(run_kafka(spec, warehouse, metadata, monitor, wait_quiet, cpu))
            return result

        seconds: list[float] = []
        waited: list[float] = []
        intervals: list[tuple[float, float]] = []
        summaries: list[dict[str, str]] = []
        snapshot_ids: list[int] = []
        net_runtime: list[float | None] = []
        batch_cpu: list[float | None] = []
        for index, path in enumerate(batch_csvs):
            before = len(snapshots)
            name = source_table(t_env, "changes", path)
            waited.append(wait_quiet())
            cpu_before = cpu()
            wall = time.time()
            started = time.perf_counter()
            job = t_env.execute_sql(f"INSERT INTO {TABLE} SELECT {SELECT_COLUMNS} FROM {name}")
            job.wait()
            elapsed = time.perf_counter() - started
            batch_cpu.append(cpu_delta(cpu_before, cpu()))
            seconds.append(elapsed)
            net_runtime.append(job_net_runtime(job))
            intervals.append((wall, wall + elapsed))
            snapshots = Metadata.snapshots(metadata.load())
            if len(snapshots) != before + 1:
                raise RuntimeError(
                    f"batch {index + 1}: expected one new snapshot, the table has {len(snapshots) - before}"
                )
            summary = {str(k): str(v) for k, v in (snapshots[-1].get("summary") or {}).items()}
            summaries.append(summary)
            snapshot_ids.append(int(snapshots[-1]["snapshot-id"]))
            log(
                f"batch {index + 1}/{len(batch_csvs)}: {elapsed:.2f}s (data files {summary.get('total-data-files')}, "
                f"delete files {summary.get('total-delete-files')}, equality deletes "
                f"{summary.get('total-equality-deletes')})"
            )
        result["batch_seconds"] = seconds
        result["batch_waited_for_quiet_seconds"] = waited
        result["batch_intervals"] = intervals
        result["batch_summaries"] = summaries
        result["batch_snapshot_ids"] = snapshot_ids
        result["batch_job_net_runtime_seconds"] = net_runtime
        result["batch_cpu_seconds"] = batch_cpu
        # Measured here, where the monitor counts Flink's JVM as ours (cdc.py's own monitor cannot).
        result["batch_foreign_cpu_seconds"] = [monitor.between(a, b) for a, b in intervals]
        result["final_summary"] = summaries[-1] if summaries else {}
        result["metadata_location"] = str(metadata.location())
    finally:
        monitor.stop()
    return result


def run_stream(
    spec: dict[str, Any],
    batch_csvs: list[Path],
    csv_dir: Path,
    warehouse: Path,
    metadata: Metadata,
    monitor: Any,
    wait_quiet: Any,
    cpu: Any,
) -> dict[str, Any]:
    """Every batch through one long-running streaming job, committed by Flink's checkpoints.

    The batches are concatenated, in order, into one CSV file (before the timed window): Flink's CSV
    format does not split a file, so one source reader reads it front to back and the upsert sink,
    keyed by ``id``, sees each key's changes in stream order. The job runs in streaming mode with
    ``execution.checkpointing.interval`` from the spec; Flink's Iceberg committer commits one snapshot
    per completed checkpoint, and one more for the rest at the end of the input. The driver polls the
    table's ``version-hint.text`` (every 10 ms) while the job runs: each new snapshot ends one
    "checkpoint" entry (its seconds since the previous one, or since the job's submission; its
    changes: the ``added-records`` of the snapshots its metadata versions added, exactly, read from
    each version's metadata.json after the job; the CPU of Flink's JVM and this process in between).
    """
    stream_csv = csv_dir / "stream"
    stream_csv.mkdir()
    with (stream_csv / "changes.csv").open("wb") as out:
        for path in batch_csvs:
            out.write(path.read_bytes())

    def environment() -> Any:
        t_env = stream_env(spec, warehouse)
        source_table(t_env, "stream_changes", stream_csv)
        return t_env

    query = f"SELECT {SELECT_COLUMNS} FROM stream_changes"
    return stream_job(environment, query, spec, metadata, monitor, wait_quiet, cpu)


def run_kafka(
    spec: dict[str, Any], warehouse: Path, metadata: Metadata, monitor: Any, wait_quiet: Any, cpu: Any
) -> dict[str, Any]:
    """:func:`run_stream` over the change topic (``spec["kafka"]``, ``benchmarks/cdc_kafka.py``) with
    Flink's Kafka connector, its checkpoints' statistics read from the mini-cluster's REST endpoint
    and the broker's CPU during the job (``broker_cpu_seconds``: the broker is the benchmark's, so
    not counted as other processes' either)."""
    from benchmarks.flink_kafka import SELECT_COLUMNS as KAFKA_COLUMNS
    from benchmarks.flink_kafka import CheckpointWatcher, free_port, kafka_source_table, rest_conf

    kafka = spec["kafka"]
    broker_pid = int(kafka["broker_pid"])
    port = free_port()

    def environment() -> Any:
        t_env = stream_env(spec, warehouse, rest_conf(port))
        kafka_source_table(t_env, "kafka_changes", kafka)
        return t_env

    watcher = CheckpointWatcher(port)
    streamed = stream_job(
        environment,
        f"SELECT {KAFKA_COLUMNS} FROM kafka_changes",
        spec,
        metadata,
        monitor,
        wait_quiet,
        cpu,
        watcher=watcher,
        broker_pid=broker_pid,
    )
    if sum(streamed["batch_changes"]) != int(kafka["messages"]):
        raise RuntimeError(f"the job committed {sum(streamed['batch_changes'])} changes of {kafka['messages']}")
    connector = next((Path(j).name for j in spec["jars"] if Path(j).name.startswith("flink-connector-kafka-")), None)
    return {
        **streamed,
        "mode": "kafka",
        "driver": "flink",
        "kafka": kafka,
        "kafka_connector": connector.removesuffix(".jar") if connector else None,
        "checkpoints": watcher.result(),
    }


def stream_env(spec: dict[str, Any], warehouse: Path, conf: dict[str, str] | None = None) -> Any:
    """A streaming TableEnvironment (checkpoints every ``checkpoint_interval_ms``) with the catalog."""
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    settings = {
        "parallelism.default": str(spec.get("parallelism", 2)),
        "table.local-time-zone": "UTC",
        "execution.checkpointing.interval": f"{int(spec.get('checkpoint_interval_ms', 500))} ms",
        **(conf or {}),
        **{str(k): str(v) for k, v in (spec.get("flink_conf") or {}).items()},
    }
    if conf:  # the mini-cluster's own settings (its REST endpoint), from the environment's creation on
        configuration = Configuration()
        for key, value in conf.items():
            configuration.set_string(key, value)
        environment = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(configuration)
        t_env = TableEnvironment.create(environment.build())
    else:
        t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = t_env.get_config()
    for key, value in settings.items():
        config.set(key, value)
    t_env.execute_sql(
        f"CREATE CATALOG {CATALOG} WITH ('type'='iceberg', 'catalog-type'='hadoop', "
        f"'warehouse'='{warehouse.as_uri()}', 'property-version'='1')"
    )
    return t_env


def submit(
    environment: Callable[[], Any], statement: str, wait_quiet: Any, cpu: Any, broker_pid: int | None
) -> tuple[Any, float, float, float, float | None, float | None, int]:
    """Submit ``statement`` in a new environment; return the job's ``TableResult``, the quiet wait, the
    wall clock, perf counter, CPU and broker CPU at the submission, and the attempts it took.

    PyFlink's Py4J gateway may serve two calls of this thread on two JVM threads (a second connection
    opens when one is busy, e.g. while Python's garbage collector releases Java objects from another
    thread); Calcite keeps its metadata provider per JVM thread, so planning may fail with
    ``NullPointerException: metadataHandlerProvider`` before any job starts (seen once in the smoke
    runs). Such an attempt ran nothing: the statement is submitted again in a new environment, and the
    timed window starts at the attempt that planned (at most 3)."""
    for attempt in range(1, 4):
        t_env = environment()  # not timed
        waited = wait_quiet()
        broker_before = tree_cpu_seconds(broker_pid) if broker_pid is not None else None
        cpu_before = cpu()
        wall = time.time()
        started = time.perf_counter()
        try:
            job = t_env.execute_sql(statement)
        except Exception as e:
            if "metadataHandlerProvider" not in str(e) or attempt == 3:
                raise
            log(f"planning failed on a Py4J thread without Calcite's metadata provider (attempt {attempt}); again")
            continue
        return job, waited, wall, started, cpu_before, broker_before, attempt
    raise AssertionError("unreachable")


def stream_job(
    environment: Callable[[], Any],
    query: str,
    spec: dict[str, Any],
    metadata: Metadata,
    monitor: Any,
    wait_quiet: Any,
    cpu: Any,
    watcher: Any = None,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """``INSERT INTO`` the table ``query``'s rows as one streaming job in the TableEnvironment that
    ``environment()`` makes, timed from its submission to its last commit (see :func:`run_stream`);
    ``watcher`` is polled at each commit seen."""
    interval_ms = int(spec.get("checkpoint_interval_ms", 500))
    before = len(Metadata.snapshots(metadata.load()))
    version_hint = metadata.dir / "version-hint.text"
    hint = version_hint.read_text(encoding="utf-8")

    statement = f"INSERT INTO {TABLE} {query}"
    job, waited, wall, started, cpu_before, broker_before, attempts = submit(
        environment, statement, wait_quiet, cpu, broker_pid
    )
    client = job.get_job_client()
    if watcher is not None:
        watcher.job_id = str(client.get_job_id())
    ends: list[tuple[float, float, float | None]] = [(started, wall, cpu_before)]  # (perf, wall, cpu) per commit
    versions = [int(hint.strip())]  # the metadata version each entry ends at
    finished = False
    while True:
        try:
            now_hint = version_hint.read_text(encoding="utf-8")
        except FileNotFoundError:  # the Hadoop catalog deletes the hint before renaming the new one in
            now_hint = hint
        if now_hint != hint and now_hint.strip().isdigit():
            hint = now_hint
            ends.append((time.perf_counter(), time.time(), cpu()))
            versions.append(int(hint.strip()))
            if watcher is not None:
                watcher.poll()
        if finished:
            break
        try:
            finished = str(client.get_job_status().result()) in ("FINISHED", "FAILED", "CANCELED")
        except Exception:  # the local mini-cluster shuts down once its job ended
            finished = True
        if not finished:
            time.sleep(0.01)
    job_seconds = time.perf_counter() - started
    broker_cpu = cpu_delta(broker_before, tree_cpu_seconds(broker_pid)) if broker_pid is not None else None
    if watcher is not None:
        watcher.poll()  # after the window: the final checkpoint, if the mini-cluster still answers
    try:
        job.wait()  # raises if the job failed
    except Exception as e:
        if "MiniCluster is not yet running or has already been shut down" not in str(e):
            raise
    all_snapshots = Metadata.snapshots(metadata.load())
    snapshots = all_snapshots[before:]
    # Each entry holds the snapshots its metadata versions added (two commits between two polls are
    # one entry): the Hadoop catalog keeps every vN.metadata.json, read here after the timed window.
    counts = [len(Metadata.snapshots(metadata.version(v))) - before for v in versions]
    summaries = [{str(k): str(v) for k, v in (s.get("summary") or {}).items()} for s in snapshots]
    changes = entry_changes([int(s.get("added-records", 0)) for s in summaries], counts)
    seconds = [b[0] - a[0] for a, b in itertools.pairwise(ends)]
    batch_cpu = [None if a[2] is None or b[2] is None else b[2] - a[2] for a, b in itertools.pairwise(ends)]
    intervals = [(a[1], b[1]) for a, b in itertools.pairwise(ends)]
    total_changes = sum(changes)
    log(
        f"stream: {total_changes} changes in {job_seconds:.1f}s, {len(snapshots)} snapshots "
        f"(checkpoint interval {interval_ms} ms)"
    )
    return {
        "mode": "stream",
        "checkpoint_interval_ms": interval_ms,
        "stream_job_seconds": job_seconds,
        "stream_waited_for_quiet_seconds": waited,
        "stream_submission_attempts": attempts,
        "stream_snapshots": len(snapshots),
        "batch_seconds": seconds,
        "batch_changes": changes,
        "batch_waited_for_quiet_seconds": [0.0] * len(seconds),
        "batch_intervals": intervals,
        "batch_summaries": summaries,
        "batch_snapshot_ids": [int(s["snapshot-id"]) for s in snapshots],
        "batch_job_net_runtime_seconds": [job_net_runtime(job)],
        "batch_cpu_seconds": batch_cpu,
        "batch_foreign_cpu_seconds": [monitor.between(a, b) for a, b in intervals],
        **({"broker_cpu_seconds": broker_cpu} if broker_pid is not None else {}),
        "final_summary": summaries[-1] if summaries else {},
        "metadata_location": str(metadata.location()),
    }


def main(argv: list[str]) -> int:
    return driver_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
