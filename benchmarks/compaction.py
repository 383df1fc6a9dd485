"""Compaction benchmark: read cost of CDC tables with and without compaction, and compaction throughput.

    .venv/bin/python -m benchmarks.compaction [--checkpoints 100] [--keys 20000] [--changes-per-checkpoint 1000]
                                              [--out benchmarks/results/compaction.json]

One invocation, on this machine, in this order:

**Part A: 100 CDC checkpoints, with and without compaction.** A seeded stream of upserts (each
checkpoint: ``--update-fraction`` updates of distinct existing keys, the rest inserts of new keys) is
generated once as Parquet files (one per checkpoint, plus an initial load of ``--keys`` rows). Two
tables, partitioned by ``bucket(4, id)``, are fed the same files through ``.upsert(key=["id"])``
sinks with ``distribution_mode("hash")``: ``bench.plain`` without compaction and ``bench.compacted``
with ``.compaction(every_n_commits=10)`` (inline, between checkpoints). The initial rows are appended
first by an append-mode sink (one snapshot, no equality deletes). Each checkpoint is
``sink.write(batch_df, checkpoint_location=..., checkpoint_id=i)`` (the code path of the streaming
``foreachBatch``), alternating between the two tables, timed from reading the batch's file to the
end of the commit (and, for ``bench.compacted``, of the inline compaction it triggered).
The inline compaction is set with ``.compaction(every_n_commits=10)`` on the ``bench.compacted``
sink, but in iceberg_sink as of this writing that trigger never fires through ``sink.write()``: each
``write()`` builds a new ``SinkJob`` and with it a new ``CompactionTrigger`` whose commit counter
starts at zero (only a streaming query, one job for all its batches, counts across checkpoints).
So after every ``--compact-every``-th checkpoint for which the sink did not compact by itself during
the last ``--compact-every`` checkpoints, the benchmark calls ``sink.compact(spark)``: the same
``compact()`` with the same settings the trigger would use, inline between two checkpoints, timed as
part of that checkpoint's write. Each compaction is recorded with ``"by": "trigger"`` or
``"by": "benchmark"``.
Afterwards, for each table: the counters of the current snapshot's summary (data files, delete
files, equality deletes), and the time of a full scan, ``count(*)`` and a full materialisation into
Arrow in this process, with DuckDB (``iceberg_scan``, one connection) and with Iceberg Java
(``JavaIcebergReader`` from tests/interop: Spark 3.5, ``local[2]``, in a long-lived subprocess),
one untimed warm-up then the median of ``--read-runs`` runs. Both tables are checked against the
generator's model (rows, distinct ids, sums of ``id`` and ``version``) with both readers, and
against each other with a checksum of every column computed by Iceberg Java.

**Part B: compaction throughput on the same files.** The metadata.json of ``bench.plain`` (the
uncompacted table) is registered once per compaction run under a new name: in the SQLite catalog
(``bench.ours_1``, ...) for iceberg_sink, and copied into a Hadoop-catalog warehouse
(``<ns>/<table>/metadata/v1.metadata.json`` + ``version-hint.text``) for Iceberg Java. Every copy
reads the very same manifests and data files; each compactor only adds files, so sharing is safe.
Then, one after the other, each compactor in a fresh process of its own that did nothing before
(issue 20's method; until 2026-11-27 the sink compacted in this process, warm from part A):

- iceberg_sink: ``benchmarks/compaction_sink_driver.py`` (PySpark 4.x, ``local[2]``): the sink's
  import (first run only), its builder and ``sink.compact(spark, config=CompactionConfig())``;
- Iceberg Java: ``CALL hc.system.rewrite_data_files(table => ..., options => map(...))`` in
  ``benchmarks/compaction_java_driver.py`` (PySpark 3.5.7 + Iceberg 1.9.2, ``local[2]``, one JVM for
  all of its runs).

Each driver reports its SparkSession's start (``startup_seconds``), then does one cold run first (the
first compaction in a fresh process: the sink's imports, Java's class loading and JIT; reported apart as
``warmup``), then ``--compaction-runs`` measured runs (the steady state), each on a fresh copy. This
process's SparkSession and the Java reader's JVM stay resident, idle, while either driver runs. The Java options make it do the same job as iceberg_sink: rewrite every data file
that has a delete applying to it or is small, applying the deletes (``delete-file-threshold=1``,
``min-input-files=2``, the table's default target file size), and drop the delete files that no
longer apply (``remove-dangling-deletes=true``, which costs Java an extra Spark job over the
``entries`` metadata table and a second commit). Each like-for-like Java run is followed by one with
``remove-dangling-deletes=false`` (reported apart as ``keep_dangling``: the delete files stay in
the table's metadata, applying to nothing). Reported per run: input files and bytes, output files
and bytes, rows, seconds, MB/s (input data + delete bytes per second); each compacted table is read
back with Iceberg Java (and DuckDB) and must have the checksum of the uncompacted one.

The JSON result goes to stdout and to ``--out``; progress goes to stderr. ``plot_compaction.py``
draws ``docs/benchmarks/compaction.png`` from it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.compaction_sink_driver import start_spark

PROJECT_ROOT = Path(__file__).resolve().parents[1]
JAVA_DRIVER = Path(__file__).resolve().with_name("compaction_java_driver.py")
SINK_DRIVER = Path(__file__).resolve().with_name("compaction_sink_driver.py")
NAMESPACE = "bench"
PARTITION_BY = ["bucket(4, id)"]
KEY = ["id"]
SPARK_DDL = "id bigint, version bigint, name string, amount double, ts timestamp"
ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("version", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
# Every column, hashed by Spark (xxhash64) and summed exactly: equal content <=> equal checksum (whp).
CHECKSUM_SQL = (
    "SELECT count(*) AS n, count(DISTINCT id) AS ids, sum(id) AS id_sum, sum(version) AS version_sum, "
    "cast(sum(cast(xxhash64(id, version, name, amount, ts) AS decimal(38, 0))) AS string) AS checksum FROM t"
)
JAVA_OPTIONS = {
    "delete-file-threshold": "1",
    "min-input-files": "2",
    "remove-dangling-deletes": "true",
}
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
_BASE_TS = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def log(message: str) -> None:
    print(f"[compaction {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- the CDC stream --------------------------------------------------------------------------------


class Model:
    """The expected table: id -> (version, name, amount, ts)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, str, float, dt.datetime]] = {}

    def apply(self, batch: pa.Table) -> None:
        for row in batch.to_pylist():
            self.rows[row["id"]] = (row["version"], row["name"], row["amount"], row["ts"])

    def expected(self) -> dict[str, int]:
        return {
            "n": len(self.rows),
            "ids": len(self.rows),
            "id_sum": sum(self.rows),
            "version_sum": sum(v[0] for v in self.rows.values()),
        }


def _rows(rng: random.Random, ids: list[int], version: int) -> pa.Table:
    names = ["".join(rng.choices(string.ascii_lowercase, k=24)) for _ in ids]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "version": pa.array([version] * len(ids), pa.int64()),
            "name": pa.array([f"user-{i}-v{version}-{n}" for i, n in zip(ids, names, strict=True)]),
            "amount": pa.array([round(rng.uniform(0, 10_000), 2) for _ in ids], pa.float64()),
            "ts": pa.array(
                [_BASE_TS + dt.timedelta(minutes=version, seconds=rng.randrange(60)) for _ in ids],
                pa.timestamp("us", tz="UTC"),
            ),
        },
        schema=ARROW_SCHEMA,
    )


def generate(
    directory: Path, checkpoints: int, keys: int, changes: int, update_fraction: float, seed: int
) -> tuple[Path, list[Path], Model]:
    """The initial load and one Parquet file per checkpoint; distinct keys within a checkpoint."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    model = Model()
    existing = list(range(1, keys + 1))
    initial = _rows(rng, existing, 0)
    initial_path = directory / "initial.parquet"
    pq.write_table(initial, initial_path)
    model.apply(initial)
    next_id = keys + 1
    paths = []
    for i in range(checkpoints):
        updates = min(len(existing), round(changes * update_fraction))
        inserts = changes - updates
        ids = rng.sample(existing, updates) + list(range(next_id, next_id + inserts))
        rng.shuffle(ids)
        existing.extend(range(next_id, next_id + inserts))
        next_id += inserts
        batch = _rows(rng, ids, i + 1)
        path = directory / f"checkpoint-{i:04d}.parquet"
        pq.write_table(batch, path)
        model.apply(batch)
        paths.append(path)
    return initial_path, paths, model


# -- Spark and the sinks ---------------------------------------------------------------------------


def read_batch(spark: Any, path: Path) -> Any:
    from pyspark.sql import functions as F

    df = spark.read.schema(SPARK_DDL).parquet(str(path))
    # The key becomes a required identifier field: give Spark an expression it knows is not null.
    return df.withColumn("id", F.coalesce("id", F.lit(0).cast("bigint")))


def summary_of(table: Any) -> dict[str, str]:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return {}
    return {str(k): str(v) for k, v in snapshot.summary.additional_properties.items()}


def file_stats(table: Any) -> dict[str, int]:
    """Live data and delete files of the current snapshot, with their bytes and records (PyIceberg)."""
    stats = {"data_files": 0, "data_bytes": 0, "data_records": 0, "delete_files": 0, "delete_bytes": 0}
    stats["delete_records"] = 0
    for f in table.inspect.files().to_pylist():
        kind = "data" if f["content"] == 0 else "delete"
        stats[f"{kind}_files"] += 1
        stats[f"{kind}_bytes"] += int(f["file_size_in_bytes"])
        stats[f"{kind}_records"] += int(f["record_count"])
    return stats


def counters(summary: dict[str, str]) -> dict[str, int]:
    keys = ("total-data-files", "total-delete-files", "total-equality-deletes", "total-records", "total-files-size")
    return {k: int(summary.get(k, "0")) for k in keys}


def part_a(
    spark: Any, lake: Path, checkpoints_dir: Path, initial: Path, batches: list[Path], every_n: int
) -> dict[str, Any]:
    from iceberg_sink import IcebergSink

    def upsert_sink(name: str, compaction: bool) -> Any:
        builder = (
            IcebergSink.builder()
            .embedded(lake)
            .table(f"{NAMESPACE}.{name}")
            # Format v2: equality deletes, as Iceberg Java's side of the comparison (v3 is the upsert default).
            .create_if_missing(partition_by=PARTITION_BY, format_version=2)
            .distribution_mode("hash")
            .upsert(key=KEY)
        )
        return (builder.compaction(every_n_commits=every_n) if compaction else builder).build()

    tables = {"plain": False, "compacted": True}
    sinks = {name: upsert_sink(name, compaction) for name, compaction in tables.items()}
    out: dict[str, Any] = {
        name: {"compaction": c, "checkpoint_seconds": [], "compactions": [], "files_after_checkpoint": []}
        for name, c in tables.items()
    }
    for name, sink in sinks.items():
        sink.write(spark.createDataFrame([], SPARK_DDL).withColumn("id", _not_null_id()))  # creates the table
        append = IcebergSink.builder().embedded(lake).table(f"{NAMESPACE}.{name}").distribution_mode("hash").build()
        started = time.perf_counter()
        append.write(read_batch(spark, initial))
        out[name]["initial_load_seconds"] = time.perf_counter() - started
        log(f"{name}: initial load in {out[name]['initial_load_seconds']:.1f}s")
    for i, path in enumerate(batches):
        for name, sink in sinks.items():
            before = sink.metrics().compactions_succeeded
            started = time.perf_counter()
            sink.write(read_batch(spark, path), checkpoint_location=str(checkpoints_dir / name), checkpoint_id=i)
            elapsed = time.perf_counter() - started
            out[name]["checkpoint_seconds"].append(elapsed)
            metrics = sink.metrics()
            compactions = out[name]["compactions"]
            if metrics.compactions_succeeded > before:
                compactions.append(
                    {"after_checkpoint": i, "seconds": metrics.last_compaction_duration_ms / 1000, "by": "trigger"}
                )
            elif (
                tables[name]
                and (i + 1) % every_n == 0
                and not any(c["after_checkpoint"] > i - every_n for c in compactions)
            ):
                # The sink's own trigger did not fire (see the module docstring): compact inline here,
                # with the same function and settings the trigger would use, and count it as write time.
                started = time.perf_counter()
                result = sink.compact(spark)
                seconds = time.perf_counter() - started
                out[name]["checkpoint_seconds"][-1] += seconds
                compactions.append(
                    {"after_checkpoint": i, "seconds": seconds, "by": "benchmark", "result": attrs.asdict(result)}
                )
        for name, sink in sinks.items():
            counts = counters(summary_of(sink.load_table()))
            out[name]["files_after_checkpoint"].append([counts["total-data-files"], counts["total-delete-files"]])
        if (i + 1) % 10 == 0 or i + 1 == len(batches):
            log(
                f"checkpoint {i + 1}/{len(batches)}: "
                + ", ".join(f"{n} {out[n]['checkpoint_seconds'][-1]:.2f}s" for n in sinks)
            )
    for name, sink in sinks.items():
        metrics = sink.metrics()
        if metrics.compactions_failed:
            raise RuntimeError(f"{name}: {metrics.compactions_failed} inline compactions failed (see the log above)")
        table = sink.load_table()
        seconds = out[name]["checkpoint_seconds"]
        out[name].update(
            {
                "metadata_location": table.metadata_location,
                "snapshots": len(table.snapshots()),
                "summary": counters(summary_of(table)),
                "files": file_stats(table),
                "write_seconds_total": sum(seconds),
                "checkpoint_seconds_median": statistics.median(seconds),
                "compaction_seconds_total": sum(c["seconds"] for c in out[name]["compactions"]),
                "compactions_succeeded": metrics.compactions_succeeded,
            }
        )
        log(f"{name}: {out[name]['summary']}, writes {out[name]['write_seconds_total']:.1f}s")
    return out


def _not_null_id() -> Any:
    from pyspark.sql import functions as F

    return F.coalesce("id", F.lit(0).cast("bigint"))


# -- reading ---------------------------------------------------------------------------------------


def timed_runs(fn: Callable[[], Any], runs: int) -> dict[str, Any]:
    """One untimed warm-up call, then ``runs`` timed calls: their seconds and median."""
    fn()
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return {"median": statistics.median(seconds), "runs": seconds}


def duckdb_path(metadata_location: str) -> str:
    return metadata_location.removeprefix("file://").replace("'", "''")


def read_times(duck: Any, java: Any, metadata_location: str, runs: int) -> dict[str, Any]:
    scan = f"iceberg_scan('{duckdb_path(metadata_location)}')"
    views = {"t": metadata_location}
    return {
        "duckdb_count": timed_runs(lambda: duck.sql(f"SELECT count(*) FROM {scan}").fetchall(), runs),
        "duckdb_full": timed_runs(lambda: duck.sql(f"SELECT * FROM {scan}").to_arrow_table(), runs),
        "java_count": timed_runs(lambda: java.sql("SELECT count(*) AS n FROM t", views=views), runs),
        "java_full": timed_runs(lambda: java.read(metadata_location), runs),
    }


def java_checksum(java: Any, metadata_location: str) -> dict[str, Any]:
    row = java.sql(CHECKSUM_SQL, views={"t": metadata_location}).to_pylist()[0]
    return {k: (int(v) if k != "checksum" else str(v)) for k, v in row.items()}


def duckdb_check(duck: Any, metadata_location: str) -> dict[str, int]:
    scan = f"iceberg_scan('{duckdb_path(metadata_location)}')"
    n, ids, id_sum, version_sum = duck.sql(
        f"SELECT count(*), count(DISTINCT id), sum(id), sum(version) FROM {scan}"
    ).fetchone()
    return {"n": int(n), "ids": int(ids), "id_sum": int(id_sum), "version_sum": int(version_sum)}


# -- part B ----------------------------------------------------------------------------------------


def hadoop_copy(metadata_location: str, warehouse: Path, table: str) -> Path:
    """``<warehouse>/bench/<table>/metadata/v1.metadata.json`` (+ version hint) for a Java Hadoop catalog."""
    metadata = warehouse / NAMESPACE / table / "metadata"
    metadata.mkdir(parents=True)
    shutil.copyfile(metadata_location.removeprefix("file://"), metadata / "v1.metadata.json")
    (metadata / "version-hint.text").write_text("1", encoding="utf-8")
    return metadata / "v1.metadata.json"


def run_driver(python: str, driver: Path, spec: dict[str, Any], spec_path: Path, work: Path) -> dict[str, Any]:
    """Run one compactor's driver (``driver``, a script of this folder) in a fresh process of
    ``python`` on ``spec``; its result."""
    spec_path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    # The drivers import benchmarks.* (the Java one benchmarks.java_spark, shared with the CDC benchmark).
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    proc = subprocess.run(
        [python, str(driver), str(spec_path)],
        cwd=str(work),
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{driver.name} failed (exit {proc.returncode}); see its output above")
    return dict(json.loads(Path(spec["result"]).read_text(encoding="utf-8")))


def throughput(input_stats: dict[str, int], seconds: float, cpu_seconds: float | None = None) -> dict[str, Any]:
    read_bytes = input_stats["data_bytes"] + input_stats["delete_bytes"]
    read_rows = input_stats["data_records"] + input_stats["delete_records"]
    cpu = cpu_seconds / read_rows * 1e6 if cpu_seconds is not None and read_rows else None
    return {
        "mb_per_s": read_bytes / 1e6 / seconds,
        "input_rows_per_s": read_rows / seconds,
        "cpu_s_per_m_input_rows": cpu,
    }


def part_b(
    lake: Path,
    work: Path,
    plain_metadata: str,
    java_env: Any,
    java: Any,
    duck: Any,
    runs: int,
    cores: int,
    driver_memory: str,
) -> dict[str, Any]:
    from pyiceberg.catalog import Catalog

    from iceberg_sink import CompactionConfig
    from iceberg_sink.table.catalog import CatalogConfig

    catalog: Catalog = CatalogConfig.embedded(lake).load()
    source = StaticTableStats(plain_metadata)
    input_stats = source.files
    reference = java_checksum(java, plain_metadata)
    out: dict[str, Any] = {"input": {**input_stats, "summary": source.summary}, "reference_checksum": reference}

    config = CompactionConfig()
    out["ours_config"] = {
        "delete_file_threshold": config.delete_file_threshold,
        "min_input_files": config.min_input_files,
        "max_group_bytes": config.max_group_bytes,
        "target_file_size_bytes": "table default (write.target-file-size-bytes, 512 MiB)",
    }

    def check(run: dict[str, Any], location: str) -> dict[str, Any]:
        checksum = java_checksum(java, location)
        after = StaticTableStats(location)
        return {
            **run,
            "metadata_location": location,
            "summary": after.summary,
            "output": after.files,
            "checksum": checksum,
            "same_content": checksum == reference,
            "duckdb": duckdb_check(duck, location),
            **throughput(input_stats, run["seconds"], run.get("cpu_seconds")),
        }

    # iceberg_sink: a fresh process (compaction_sink_driver.py) compacts its copies one after the other,
    # each registered here first (the counterpart of the Java side's Hadoop-catalog copies below).
    names = [f"{NAMESPACE}.ours_{run}" for run in ["warmup", *range(1, runs + 1)]]
    for name in names:
        catalog.register_table(name, plain_metadata)
    sink_spec = {
        "lake": str(lake),
        "tables": names,
        "cores": cores,
        "driver_memory": driver_memory,
        "result": str(work / "sink-result.json"),
    }
    log("starting the iceberg_sink compaction driver")
    sink_driver = run_driver(sys.executable, SINK_DRIVER, sink_spec, work / "sink-spec.json", work)
    ours: list[dict[str, Any]] = []
    for name, run in zip(names, sink_driver.pop("runs"), strict=True):
        variant = "warmup" if name.endswith("_warmup") else "default"
        ours.append(check({**run, "variant": variant}, run["metadata_location"]))
        log(f"iceberg_sink {name}: {run['seconds']:.2f}s, same content {ours[-1]['same_content']}")
    out["iceberg_sink_warmup"] = ours[0]
    out["iceberg_sink"] = ours[1:]
    out["iceberg_sink_driver"] = sink_driver

    # Java: one warm-up run (a fresh JVM: class loading, JIT), then the like-for-like runs
    # (remove-dangling-deletes=true) alternating with runs that keep the dangling delete files.
    warehouse = work / "java-warehouse"
    variants = {"remove_dangling": JAVA_OPTIONS, "keep_dangling": {**JAVA_OPTIONS, "remove-dangling-deletes": "false"}}
    tables = [("java_warmup", "warmup", JAVA_OPTIONS)]
    for run in range(1, runs + 1):
        tables += [(f"java_{variant}_{run}", variant, options) for variant, options in variants.items()]
    for name, _, _ in tables:
        hadoop_copy(plain_metadata, warehouse, name)
    spec = {
        "jar": str(java_env.jar),
        "warehouse": str(warehouse),
        "namespace": NAMESPACE,
        "tables": [{"name": name, "options": options} for name, _, options in tables],
        "cores": cores,
        "driver_memory": driver_memory,
        "shuffle_partitions": cores * 2,
        "result": str(work / "java-result.json"),
    }
    log("starting the Iceberg Java rewrite_data_files driver")
    driver = run_driver(str(java_env.python), JAVA_DRIVER, spec, work / "java-spec.json", work)
    java_runs = []
    for (_, variant, _), run in zip(tables, driver.pop("runs"), strict=True):
        java_runs.append(
            check({**run, "variant": variant, "procedure_summary": run["summary"]}, run["metadata_location"])
        )
        log(f"Java {run['table']}: {run['seconds']:.2f}s, same content {java_runs[-1]['same_content']}")
    out["iceberg_java_warmup"] = java_runs[0]
    out["iceberg_java"] = [r for r in java_runs if r["variant"] == "remove_dangling"]
    out["iceberg_java_keep_dangling"] = [r for r in java_runs if r["variant"] == "keep_dangling"]
    out["iceberg_java_driver"] = driver
    out["iceberg_java_options"] = variants
    return out


class StaticTableStats:
    """Files and snapshot summary of a table given by its metadata.json (PyIceberg ``StaticTable``)."""

    def __init__(self, metadata_location: str) -> None:
        from pyiceberg.table import StaticTable

        table = StaticTable.from_metadata(metadata_location)
        self.files = file_stats(table)
        self.summary = counters(summary_of(table))


# -- the run ---------------------------------------------------------------------------------------


def versions(java_env: Any) -> dict[str, Any]:
    import duckdb
    import pyiceberg
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        cpu = ""
    try:
        mem_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration, ValueError):
        mem_kb = 0
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "pyspark": pyspark.__version__,
        "pyiceberg": pyiceberg.__version__,
        "duckdb": duckdb.__version__,
        "java": java[0] if java else "",
        "java_env_jar": Path(java_env.jar).name,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--checkpoints", type=int, default=100)
    parser.add_argument("--keys", type=int, default=20_000, help="rows of the initial load")
    parser.add_argument("--changes-per-checkpoint", type=int, default=1_000)
    parser.add_argument("--update-fraction", type=float, default=0.8, help="share of changes that update a key")
    parser.add_argument("--compact-every", type=int, default=10, help="every_n_commits of the compacted table")
    parser.add_argument("--read-runs", type=int, default=3)
    parser.add_argument("--compaction-runs", type=int, default=3, help="runs of each compactor, each on its own copy")
    parser.add_argument("--seed", type=int, default=20_240_101)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory, removed after")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "benchmarks" / "results" / "compaction.json")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.java_env import ensure_java_env
    from tests.interop.readers import JavaIcebergReader, duckdb_connect

    wall_started = time.perf_counter()
    java_env = ensure_java_env()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="compaction-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "compaction",
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "parameters": {
            "checkpoints": args.checkpoints,
            "keys": args.keys,
            "changes_per_checkpoint": args.changes_per_checkpoint,
            "update_fraction": args.update_fraction,
            "compact_every": args.compact_every,
            "read_runs": args.read_runs,
            "compaction_runs": args.compaction_runs,
            "seed": args.seed,
            "cores": args.cores,
            "driver_memory": args.driver_memory,
            "partition_by": PARTITION_BY,
            "key": KEY,
        },
        "environment": versions(java_env),
        "load_average": {"start": load_average()},
    }
    spark = None
    java = None
    duck = None
    try:
        started = time.perf_counter()
        initial, batches, model = generate(
            work / "input",
            args.checkpoints,
            args.keys,
            args.changes_per_checkpoint,
            args.update_fraction,
            args.seed,
        )
        expected = model.expected()
        result["expected"] = expected
        log(f"generated {len(batches)} checkpoints in {time.perf_counter() - started:.1f}s; expected {expected}")

        spark = start_spark(args.cores, args.driver_memory, work)
        result["environment"]["spark"] = spark.version
        lake = work / "lake"
        started = time.perf_counter()
        a = part_a(spark, lake, work / "checkpoints", initial, batches, args.compact_every)
        a["seconds"] = time.perf_counter() - started
        result["part_a"] = a
        result["load_average"]["after_writes"] = load_average()

        java = JavaIcebergReader(java_env, driver_memory=args.driver_memory, cores=args.cores)
        duck = duckdb_connect()
        duck.execute(f"SET threads = {args.cores}")
        result["environment"]["java_reader_spark"] = java.spark_version
        for name in ("plain", "compacted"):
            location = a[name]["metadata_location"]
            log(f"{name}: timing reads")
            a[name]["read"] = read_times(duck, java, location, args.read_runs)
            a[name]["java_checksum"] = java_checksum(java, location)
            a[name]["duckdb_check"] = duckdb_check(duck, location)
            log(f"{name}: {json.dumps({k: round(v['median'], 3) for k, v in a[name]['read'].items()})}")
        a["content_checks"] = {
            "plain_matches_model_java": {k: a["plain"]["java_checksum"][k] for k in expected} == expected,
            "compacted_matches_model_java": {k: a["compacted"]["java_checksum"][k] for k in expected} == expected,
            "plain_matches_model_duckdb": a["plain"]["duckdb_check"] == expected,
            "compacted_matches_model_duckdb": a["compacted"]["duckdb_check"] == expected,
            "same_checksum": a["plain"]["java_checksum"] == a["compacted"]["java_checksum"],
        }
        log(f"content checks: {a['content_checks']}")
        result["load_average"]["after_reads"] = load_average()

        started = time.perf_counter()
        b = part_b(
            lake,
            work,
            a["plain"]["metadata_location"],
            java_env,
            java,
            duck,
            args.compaction_runs,
            args.cores,
            args.driver_memory,
        )
        b["seconds"] = time.perf_counter() - started
        result["part_b"] = b
        result["load_average"]["end"] = load_average()
    finally:
        if duck is not None:
            duck.close()
        if java is not None:
            java.close()
        if spark is not None:
            spark.stop()
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["wall_seconds"] = time.perf_counter() - wall_started
    text = json.dumps(result, indent=2, default=str)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    checks = list(result["part_a"]["content_checks"].values())
    b = result["part_b"]
    runs = [b["iceberg_sink_warmup"], *b["iceberg_sink"], b["iceberg_java_warmup"], *b["iceberg_java"]]
    checks += [r["same_content"] for r in [*runs, *b["iceberg_java_keep_dangling"]]]
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
