"""The local SparkSession settings every benchmark driver shares, and the Spark 3.5 + Iceberg Java
session the Java drivers use (run in the Java venv)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %p %c{1}: %m%n%ex
"""


def local_builder(spec: dict[str, Any], work_dir: Path, app_name: str) -> Any:
    """A SparkSession builder for a loopback-only ``local[cores]`` session, UI off, UTC, with the
    spec's ``driver_memory`` and ``shuffle_partitions``; the caller adds its own settings."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(f"local[{spec['cores']}]")
        .appName(app_name)
        .config("spark.driver.memory", spec["driver_memory"])
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(spec["shuffle_partitions"]))
        .config("spark.default.parallelism", str(spec["cores"]))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work_dir / "spark-warehouse"))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )


def start_java_spark(spec: dict[str, Any], work_dir: Path, app_name: str, catalog: str) -> Any:
    """A loopback-only local SparkSession with the Iceberg runtime jar and a Hadoop catalog ``catalog``.

    ``spec`` carries ``jar``, ``warehouse``, ``cores``, ``driver_memory`` and ``shuffle_partitions``.
    Spark's and Iceberg's logs go to stderr at error level, so stdout stays the driver's.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_LOCAL_DIRS"] = str(work_dir / "spark-local")
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2, encoding="utf-8")
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -Dderby.system.home={work_dir}"
    spark = (
        local_builder(spec, work_dir, app_name)
        .config("spark.jars", spec["jar"])
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(f"spark.sql.catalog.{catalog}", "org.apache.iceberg.spark.SparkCatalog")
        .config(f"spark.sql.catalog.{catalog}.type", "hadoop")
        .config(f"spark.sql.catalog.{catalog}.warehouse", spec["warehouse"])
        .config("spark.driver.extraJavaOptions", java_opts)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
