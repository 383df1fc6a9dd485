"""The ``foreachBatch`` + ``MERGE INTO`` side of the CDC benchmark, and its Iceberg Java reader: Spark 3.5.

Runs in the Java venv (PySpark 3.5 + ``iceberg-spark-runtime-3.5_2.12-1.9.2.jar``; see
``tests/interop/java_env.py``), started by ``benchmarks/cdc.py``, once per MERGE system and once
more as the reader of every table::

    <venv-java>/bin/python -m benchmarks.merge_into_driver SPEC.json

``SPEC.json`` (written by cdc.py) names the jar, a warehouse directory, the Parquet files of the
initial load and of each batch, the ids to sample, and ``read_tables`` (name -> metadata.json of a
table another process wrote). With ``spec["merge"]`` the driver:

1. creates ``bench.db.cdc`` in a Hadoop catalog: format ``spec["format_version"]`` (2 by default;
   3 makes Iceberg Java write deletion vectors), merge-on-read for MERGE, UPDATE and DELETE, so
   matched rows are removed with position deletes (v2) or DVs (v3) instead of rewriting data files;
2. bulk-loads the initial files (``INSERT INTO ... SELECT``), timed;
3. for each batch, as a ``foreachBatch`` function would: registers the batch as a temp view and runs
   ``MERGE INTO t USING changes s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED
   THEN INSERT *``, timing each batch from reading its file to the end of the commit, and the CPU
   seconds of this process tree (JVM included) per batch;
4. returns the table's metadata location and its snapshot id after each batch.

For every table of ``read_tables`` (iceberg_sink's, Flink's, the MERGE tables) it then reads the
table back from its metadata.json (row count, distinct ids, sum of ``version``, exact per-column
checksums over every row, sample rows): Iceberg Java is the reader of record for every system, and
times ``scans`` full aggregate scans of each (``count(*)``, ``count(DISTINCT id)``,
``sum(version)``), alternating between the tables (the order rotated every round): the read cost of each table's deletes. With
``scan_points`` (the sink's metadata files after some batches) and ``scan_reference`` (a MERGE
table's metadata file and per-batch snapshot ids) it times both tables as of those batches.

Before the load and before each batch it waits for other processes to go quiet, as ``spec["quiet"]``
says (``benchmarks/cpu_monitor.py``). The result is written as JSON to the ``result`` path of the
spec; progress goes to stderr. Apart from ``benchmarks.cpu_monitor``, ``benchmarks.java_spark`` and
the standard library (no iceberg_sink imports) it needs nothing of the project, so it runs with any
PySpark 3.5 interpreter (from the project root, so that ``benchmarks`` is importable).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cpu_monitor import quiet_gate, tree_cpu_seconds
from benchmarks.driver_main import driver_main
from benchmarks.java_spark import start_java_spark

TABLE = "bench.db.cdc"
DDL_COLUMNS = "id bigint NOT NULL, name string, version bigint, amount double, ts timestamp"
INPUT_DDL = "id bigint, name string, version bigint, amount double, ts timestamp"


def table_properties(format_version: int) -> dict[str, str]:
    """The MERGE table's properties: merge-on-read for every row-level command, at ``format_version``."""
    return {
        "format-version": str(format_version),
        "write.merge.mode": "merge-on-read",
        "write.update.mode": "merge-on-read",
        "write.delete.mode": "merge-on-read",
    }


MERGE_SQL = (
    f"MERGE INTO {TABLE} t USING changes s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
)


def log(message: str) -> None:
    print(f"[merge_into {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_spark(spec: dict[str, Any], work_dir: Path) -> Any:
    return start_java_spark(spec, work_dir, "cdc-benchmark-merge-into", "bench")


def iceberg_version(spark: Any) -> str:
    try:
        return str(spark._jvm.org.apache.iceberg.IcebergBuild.version())
    except Exception as e:  # only informational
        return f"unknown ({type(e).__name__})"


def observe(spark: Any, df: Any, sample_ids: list[int], checksum_sql: dict[str, str] | None = None) -> dict[str, Any]:
    """Row count, distinct ids, sum of ``version`` and the sample rows of ``df``, plus the time of that
    scan; with ``checksum_sql`` (name -> aggregate expression) those sums too, in a second, untimed scan."""
    from pyspark.sql import functions as F

    cpu_before = tree_cpu_seconds()
    started = time.perf_counter()
    agg = df.agg(
        F.count(F.lit(1)).alias("rows"),
        F.countDistinct("id").alias("distinct_ids"),
        F.sum("version").alias("version_sum"),
    ).collect()[0]
    scan_seconds = time.perf_counter() - started
    scan_cpu_seconds = cpu_delta(cpu_before, tree_cpu_seconds())
    sample = (
        df.where(F.col("id").isin(sample_ids))
        .select("id", "name", "version", "amount", F.unix_micros("ts").alias("ts_micros"))
        .collect()
    )
    out: dict[str, Any] = {}
    if checksum_sql:
        sums = df.agg(*(F.expr(sql).alias(name) for name, sql in checksum_sql.items())).collect()[0]
        out["checksums"] = {name: int(sums[name] or 0) for name in checksum_sql}
    return {
        **out,
        "rows": int(agg["rows"]),
        "distinct_ids": int(agg["distinct_ids"]),
        "version_sum": int(agg["version_sum"] or 0),
        "scan_seconds": scan_seconds,
        "scan_cpu_seconds": scan_cpu_seconds,
        "sample": [row.asDict() for row in sample],
    }


def latest_summary(spark: Any) -> dict[str, str]:
    rows = spark.sql(f"SELECT summary FROM {TABLE}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()
    return {str(k): str(v) for k, v in (rows[0]["summary"] or {}).items()} if rows else {}


def latest_snapshot_id(spark: Any) -> int:
    rows = spark.sql(f"SELECT snapshot_id FROM {TABLE}.snapshots ORDER BY committed_at DESC LIMIT 1").collect()
    return int(rows[0]["snapshot_id"])


def metadata_location(spark: Any) -> str:
    """The table's current metadata.json (the newest entry of its metadata log)."""
    rows = spark.sql(f"SELECT file FROM {TABLE}.metadata_log_entries ORDER BY timestamp DESC LIMIT 1").collect()
    return str(rows[0]["file"])


def scan_order(names: list[str], round_index: int) -> list[str]:
    """The tables of one round of timed scans, rotated by the round: each table is scanned in each
    position equally often. A fixed order favours the later tables: scanning byte-identical copies
    of one table in a fixed order, the later copy was 1-3 % faster (docs/benchmarks-cdc.md)."""
    shift = round_index % len(names) if names else 0
    return names[shift:] + names[:shift]


def timed_scans(
    spark: Any, tables: dict[str, Any], rounds: int, wait_quiet: Callable[[], float]
) -> tuple[dict[str, list[float]], dict[str, list[float | None]]]:
    """``rounds`` timed full scans of each table, the order rotated per round (:func:`scan_order`);
    each table's runs in round order, and each scan's CPU-seconds (this process tree: the driver, its
    JVM, timed like the scan) in the same order."""
    runs: dict[str, list[float]] = {name: [] for name in tables}
    cpu_runs: dict[str, list[float | None]] = {name: [] for name in tables}
    for r in range(rounds):
        for name in scan_order(list(tables), r):
            wait_quiet()
            scan = observe(spark, tables[name], [])
            runs[name].append(scan["scan_seconds"])
            cpu_runs[name].append(scan["scan_cpu_seconds"])
    return runs, cpu_runs


def scan_points(spark: Any, spec: dict[str, Any], result: dict[str, Any], wait_quiet: Callable[[], float]) -> None:
    """Full scans of both tables as they were after the same batches (``spec["scan_points"]``): the
    sink's table at the metadata file it recorded then, the MERGE table (``spec["scan_reference"]``:
    its metadata file and per-batch snapshot ids) at its snapshot of that batch. Alternating,
    ``scans`` runs each, after all batches (same warm JVM for every point)."""
    points = spec.get("scan_points") or []
    reference = spec.get("scan_reference") or {}
    snapshot_ids = reference.get("snapshot_ids") or []
    out = []
    for point in points:
        batch = int(point["batch"])
        tables = {"sink": spark.read.format("iceberg").load(point["metadata_location"])}
        if snapshot_ids:
            snapshot = snapshot_ids[batch - 1]
            tables["merge"] = (
                spark.read.format("iceberg").option("snapshot-id", str(snapshot)).load(reference["metadata_location"])
            )
        runs, _ = timed_scans(spark, tables, spec.get("scans", 3), wait_quiet)
        out.append({"batch": batch, "sink_runs": runs["sink"], "merge_runs": runs.get("merge")})
        log(f"scan point after batch {batch}: {runs}")
    result["scan_points"] = out


def merge(spark: Any, spec: dict[str, Any], wait_quiet: Callable[[], float]) -> dict[str, Any]:
    """Create the table, bulk-load it and apply every batch with MERGE INTO."""
    properties = table_properties(int(spec.get("format_version") or 2))
    result: dict[str, Any] = {"table_properties": properties, "merge_sql": MERGE_SQL}
    props = ", ".join(f"'{k}'='{v}'" for k, v in properties.items())
    spark.sql("CREATE NAMESPACE IF NOT EXISTS bench.db")
    spark.sql(f"CREATE TABLE {TABLE} ({DDL_COLUMNS}) USING iceberg TBLPROPERTIES ({props})")

    result["load_waited_for_quiet_seconds"] = wait_quiet()
    cpu_before = tree_cpu_seconds()
    started = time.perf_counter()
    spark.read.schema(INPUT_DDL).parquet(*spec["initial_files"]).createOrReplaceTempView("initial")
    spark.sql(f"INSERT INTO {TABLE} SELECT * FROM initial")
    result["load_seconds"] = time.perf_counter() - started
    result["load_cpu_seconds"] = cpu_delta(cpu_before, tree_cpu_seconds())
    log(f"loaded the initial rows in {result['load_seconds']:.1f}s")

    seconds: list[float] = []
    waited: list[float] = []
    intervals: list[tuple[float, float]] = []
    summaries: list[dict[str, str]] = []
    snapshot_ids: list[int] = []
    cpu: list[float | None] = []
    for index, path in enumerate(spec["batch_files"]):
        waited.append(wait_quiet())
        cpu_before = tree_cpu_seconds()
        wall = time.time()
        started = time.perf_counter()
        spark.read.schema(INPUT_DDL).parquet(path).createOrReplaceTempView("changes")
        spark.sql(MERGE_SQL)
        elapsed = time.perf_counter() - started
        cpu.append(cpu_delta(cpu_before, tree_cpu_seconds()))
        seconds.append(elapsed)
        intervals.append((wall, wall + elapsed))
        summary = latest_summary(spark)
        summaries.append(summary)
        snapshot_ids.append(latest_snapshot_id(spark))
        log(
            f"batch {index + 1}/{len(spec['batch_files'])}: {elapsed:.2f}s "
            f"(data files {summary.get('total-data-files')}, delete files {summary.get('total-delete-files')})"
        )
    result["batch_seconds"] = seconds
    result["batch_waited_for_quiet_seconds"] = waited
    result["batch_intervals"] = intervals
    result["batch_summaries"] = summaries
    result["batch_snapshot_ids"] = snapshot_ids
    result["batch_cpu_seconds"] = cpu
    result["final_summary"] = summaries[-1] if summaries else latest_summary(spark)
    result["metadata_location"] = metadata_location(spark)
    return result


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def read_back(spark: Any, spec: dict[str, Any], result: dict[str, Any], wait_quiet: Callable[[], float]) -> None:
    """Read every table of ``spec["read_tables"]`` back from its metadata.json and time full scans of
    each, alternating, once everything is warm: the read cost of their deletes."""
    tables = {name: spark.read.format("iceberg").load(location) for name, location in spec["read_tables"].items()}
    observed: dict[str, Any] = {}
    for name, df in tables.items():
        observed[name] = observe(spark, df, spec["sample_ids"], spec.get("checksum_sql"))
        log(f"{name} table read back with Iceberg Java: {observed[name]['rows']} rows")
    scans, cpu_runs = timed_scans(spark, tables, spec.get("scans", 3), wait_quiet)
    log(f"full scans (seconds): {scans}")
    result["observed"] = observed
    result["scan_runs"] = scans
    result["scan_cpu_runs"] = cpu_runs


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import pyspark

    monitor, wait_quiet = quiet_gate(spec)
    with tempfile.TemporaryDirectory(prefix="cdc-merge-into-") as work:
        spark = start_spark(spec, Path(work))
        result: dict[str, Any] = {
            "spark_version": spark.version,
            "pyspark_version": pyspark.__version__,
            "iceberg_version": iceberg_version(spark),
            "java_version": spark._jvm.java.lang.System.getProperty("java.version"),
        }
        try:
            if spec.get("merge"):
                result.update(merge(spark, spec, wait_quiet))
            if spec.get("read_tables"):
                read_back(spark, spec, result, wait_quiet)
            if spec.get("scan_points"):
                scan_points(spark, spec, result, wait_quiet)
        finally:
            spark.stop()
            monitor.stop()
    return result


def main(argv: list[str]) -> int:
    return driver_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
