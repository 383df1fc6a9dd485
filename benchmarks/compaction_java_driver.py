"""The Iceberg Java side of the compaction benchmark: ``rewrite_data_files`` on Spark 3.5.

Runs in the Java venv (PySpark 3.5 + ``iceberg-spark-runtime-3.5_2.12-1.9.2.jar``; see
``tests/interop/java_env.py``), started by ``benchmarks/compaction.py``::

    <venv-java>/bin/python -m benchmarks.compaction_java_driver SPEC.json

``SPEC.json`` (written by compaction.py) names the jar, a Hadoop-catalog warehouse, a namespace,
the tables to compact (each with the procedure's options) and the Spark settings. compaction.py prepared each
table as ``<warehouse>/<namespace>/<table>/metadata/v1.metadata.json`` (a copy of the metadata.json
of the table iceberg_sink wrote, so the manifests and data files are the very same files) plus
``version-hint.text``. For each table, in order, the driver:

1. times ``CALL hc.system.rewrite_data_files(table => ..., options => map(...))`` (planning, the
   rewrite and the commit; a fresh JVM, so the first table also pays class loading and JIT), with the
   CPU seconds of the driver's process tree (its JVM) meanwhile;
2. records the procedure's output row and the summary of the new current snapshot, and the path of
   the newest ``vN.metadata.json`` so compaction.py can read the result back.

The driver only adds files (new data files next to the old ones, new metadata in its own folder);
it never deletes any, so sharing the data files with the original table is safe. The result is
written as JSON to the ``result`` path of the spec. Progress goes to stderr. This module imports
nothing from the project but this folder's standard-library-only helpers (``cpu_monitor``,
``driver_main``, ``java_spark``), so it runs with any PySpark 3.5 interpreter.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_monitor import tree_cpu_seconds
from benchmarks.driver_main import driver_main
from benchmarks.java_spark import start_java_spark

CATALOG = "hc"


def log(message: str) -> None:
    print(f"[java rewrite {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_spark(spec: dict[str, Any], work_dir: Path) -> Any:
    return start_java_spark(spec, work_dir, "compaction-benchmark-rewrite-data-files", CATALOG)


def iceberg_version(spark: Any) -> str:
    try:
        return str(spark._jvm.org.apache.iceberg.IcebergBuild.version())
    except Exception as e:  # only informational
        return f"unknown ({type(e).__name__})"


def newest_metadata(table_dir: Path) -> str:
    """The ``vN.metadata.json`` with the highest N: the Hadoop catalog's current metadata."""
    versions = []
    for path in (table_dir / "metadata").glob("v*.metadata.json"):
        match = re.fullmatch(r"v(\d+)\.metadata\.json", path.name)
        if match:
            versions.append((int(match.group(1)), path))
    if not versions:
        raise FileNotFoundError(f"no vN.metadata.json under {table_dir / 'metadata'}")
    return str(max(versions)[1])


def options_sql(options: dict[str, str]) -> str:
    return "map(" + ", ".join(f"'{k}', '{v}'" for k, v in options.items()) + ")"


def rewrite(spark: Any, spec: dict[str, Any], table: str, options: dict[str, str]) -> dict[str, Any]:
    identifier = f"{spec['namespace']}.{table}"
    call = f"CALL {CATALOG}.system.rewrite_data_files(table => '{identifier}', options => {options_sql(options)})"
    cpu = tree_cpu_seconds()
    started = time.perf_counter()
    rows = spark.sql(call).collect()
    seconds = time.perf_counter() - started
    cpu_after = tree_cpu_seconds()
    output = {str(k): v for k, v in rows[0].asDict().items()} if rows else {}
    summary_rows = spark.sql(
        f"SELECT summary FROM {CATALOG}.{identifier}.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()
    summary = {str(k): str(v) for k, v in (summary_rows[0]["summary"] or {}).items()} if summary_rows else {}
    table_dir = Path(spec["warehouse"]) / spec["namespace"] / table
    log(f"{identifier}: {seconds:.2f}s, {output}")
    return {
        "table": identifier,
        "call": call,
        "seconds": seconds,
        "cpu_seconds": cpu_after - cpu if cpu is not None and cpu_after is not None else None,
        "output": output,
        "summary": summary,
        "metadata_location": newest_metadata(table_dir),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import pyspark

    with tempfile.TemporaryDirectory(prefix="compaction-java-") as work:
        started = time.perf_counter()
        spark = start_spark(spec, Path(work))
        result: dict[str, Any] = {
            "spark_version": spark.version,
            "pyspark_version": pyspark.__version__,
            "iceberg_version": iceberg_version(spark),
            "java_version": spark._jvm.java.lang.System.getProperty("java.version"),
            "startup_seconds": time.perf_counter() - started,
            "runs": [],
        }
        try:
            for table in spec["tables"]:
                result["runs"].append(rewrite(spark, spec, table["name"], table["options"]))
        finally:
            spark.stop()
    return result


def main(argv: list[str]) -> int:
    return driver_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
