"""The iceberg_sink side of the compaction benchmark: ``sink.compact`` in a fresh process.

Started by ``benchmarks/compaction.py`` with this project's interpreter, as the Iceberg Java side
(``compaction_java_driver.py``) is started with the Java venv's, so neither compactor runs in a
process that did anything before (issue 20's method: each system in a fresh process, nothing before
its timed window the other does not also do)::

    .venv/bin/python -m benchmarks.compaction_sink_driver SPEC.json

``SPEC.json`` (written by compaction.py) names the embedded catalog's folder, the tables to compact
(registered there by compaction.py on the metadata.json of the uncompacted table, so every copy reads
the very same manifests and data files: the counterpart of the Java side's Hadoop-catalog copies),
and the Spark settings. The driver starts its SparkSession (``startup_seconds``, as the Java driver
reports its own), then for each table, in order, times what a user runs: the sink's import (paid
by the first table only, as the Java side's first ``CALL`` pays its class loading), the builder and
``sink.compact(spark, config=CompactionConfig())``, and records the result, the CPU seconds of the
driver's process tree (its JVM and Python workers) in that window and the new metadata location so compaction.py can read the table back. The result is written as JSON to the spec's
``result`` path; progress goes to stderr.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_monitor import tree_cpu_seconds
from benchmarks.driver_main import driver_main
from benchmarks.java_spark import local_builder


def log(message: str) -> None:
    print(f"[sink compact {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def start_spark(cores: int, driver_memory: str, work_dir: Path) -> Any:
    """The benchmark's SparkSession (compaction.py's part A uses the same): ``local[cores]``, its
    Python workers on this interpreter (the compaction tasks), ``cores * 2`` shuffle partitions."""
    # Python workers (the mapInArrow writers and the compaction tasks) must run this interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_LOCAL_DIRS"] = str(work_dir / "spark-local")
    spec = {"cores": cores, "driver_memory": driver_memory, "shuffle_partitions": cores * 2}
    spark = local_builder(spec, work_dir, "compaction-benchmark-iceberg-sink").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def compact(spark: Any, lake: str, table: str) -> dict[str, Any]:
    cpu = tree_cpu_seconds()
    started = time.perf_counter()
    from iceberg_sink import CompactionConfig, IcebergSink

    sink = IcebergSink.builder().embedded(lake).table(table).build()
    result = sink.compact(spark, config=CompactionConfig())
    seconds = time.perf_counter() - started
    cpu_after = tree_cpu_seconds()
    log(f"{table}: {seconds:.2f}s, {result}")
    import attrs  # after the window (the sink imports it too: only a first import would cost here)

    return {
        "table": table,
        "seconds": seconds,
        "cpu_seconds": cpu_after - cpu if cpu is not None and cpu_after is not None else None,
        "result": attrs.asdict(result),
        "metadata_location": sink.load_table().metadata_location,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import pyspark

    with tempfile.TemporaryDirectory(prefix="compaction-sink-") as work:
        started = time.perf_counter()
        spark = start_spark(spec["cores"], spec["driver_memory"], Path(work))
        result: dict[str, Any] = {
            "spark_version": spark.version,
            "pyspark_version": pyspark.__version__,
            "startup_seconds": time.perf_counter() - started,
            "runs": [],
        }
        try:
            for table in spec["tables"]:
                result["runs"].append(compact(spark, spec["lake"], table))
        finally:
            spark.stop()
    return result


def main(argv: list[str]) -> int:
    return driver_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
