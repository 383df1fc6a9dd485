"""Create (once) a class data sharing archive of local Spark's JVM and print the JVM options that use it.

The test suite starts many short-lived Spark JVMs: one session per test worker, and the drivers the
crash tests kill and restart. Most of such a JVM's start-up is loading and verifying Spark's classes
(about 15,000); a dynamic CDS archive (JDK 13+, ``-XX:ArchiveClassesAtExit``) maps them ready-made
instead. On this project's 2-core machines it halves a session's start and its first job under load.

The archive is made by a small Spark workload in this venv (session, DataFrame, window, Arrow UDF,
Parquet write and read) and kept in ``.venv/cds/``, named by a hash of the JVM and of the jars it was
made from: a new JDK, PySpark or venv path makes a new one. A JVM whose class path differs (Iceberg
Java readers, Kafka) cannot use it and runs as before; ``-Xlog:cds=off,cds+dynamic=off`` keeps it
from saying so on every start.

    .venv/bin/python scripts/spark_cds.py      # prints the options, e.g. -XX:SharedArchiveFile=...

Prints nothing (and the tests run without an archive) when the JVM cannot make one; says why on stderr.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = "-Xlog:cds=off,cds+dynamic=off"

WORKLOAD = """
import sys, tempfile
import pyarrow as pa
from pyspark.sql import SparkSession, Window, functions as F
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
df = spark.createDataFrame([(i, f"v{i}", i % 3) for i in range(100)], "id long, v string, k int")
ranked = df.withColumn("r", F.row_number().over(Window.partitionBy("k").orderBy(F.col("id").desc())))
def batches(it):
    for b in it:
        yield pa.RecordBatch.from_pydict({"n": [b.num_rows]})
ranked.where("r <= 5").mapInArrow(batches, "n long").collect()
with tempfile.TemporaryDirectory() as d:
    ranked.write.parquet(d + "/p")
    spark.read.parquet(d + "/p").groupBy("k").count().collect()
spark.stop()
"""


def _archive_name(base_options: str) -> str:
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    key = "\n".join([java, str(jars.resolve()), base_options, *listing])
    return f"spark-{pyspark.__version__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def ensure_archive(base_options: str) -> Path | None:
    """The archive for this venv's Spark and this JVM, made now when missing; None when it cannot be."""
    folder = ROOT / ".venv" / "cds"
    archive = folder / _archive_name(base_options)
    if archive.is_file():
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("spark-*.jsa"):
        old.unlink()  # made for another JVM or PySpark: useless now
    partial = archive.with_suffix(".partial")  # the JVM writes it on exit; renamed once complete
    partial.unlink(missing_ok=True)
    env = {
        **os.environ,
        "JAVA_TOOL_OPTIONS": f"{base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}",
        "PYSPARK_PYTHON": sys.executable,
    }
    run = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, capture_output=True, text=True)
    if run.returncode != 0 or not partial.is_file():
        sys.stderr.write(f"spark_cds: no class data sharing archive (exit {run.returncode}):\n{run.stderr[-2000:]}\n")
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, archive)
    return archive


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else ""
    archive = ensure_archive(base)
    if archive is not None:
        print(f"-XX:SharedArchiveFile={archive} {QUIET}")


if __name__ == "__main__":
    main()
