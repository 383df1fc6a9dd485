"""A streaming driver for crash tests: run as a subprocess, optionally SIGKILLed at a fault point.

    python -m tests.integration.crash_driver CATALOG_URI WAREHOUSE SOURCE CHECKPOINT [POINT CHECKPOINT_ID]

It kills its whole process group (Python driver, JVM and Python workers), as a lost machine would.
"""

from __future__ import annotations

import os
import signal
import sys


def kill_process_group_at(kill_point: str, kill_at: int) -> None:
    """SIGKILL this whole process group when the sink reaches ``kill_point`` of checkpoint ``kill_at``."""
    from iceberg_sink import _faults

    def kill(point: str, checkpoint_id: int) -> None:
        if point == kill_point and checkpoint_id == kill_at:
            sys.stdout.write(f"KILLING at {point} {checkpoint_id}\n")
            sys.stdout.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    _faults.install(kill)


def main(argv: list[str]) -> int:
    uri, warehouse, source, checkpoint = argv[:4]
    kill_point, kill_at = (argv[4], int(argv[5])) if len(argv) > 5 else (None, -1)
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink
    from tests.integration.sources import EVENT_SCHEMA_DDL

    if kill_point:
        kill_process_group_at(kill_point, kill_at)

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sink = (
        IcebergSink.builder()
        .catalog("crash", type="sql", uri=uri, warehouse=warehouse)
        .table("db.crash")
        .create_if_missing(partition_by=["bucket(3, user_id)"])
        .build()
    )
    df = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(source)
    query = sink.start(df, checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    sys.stdout.write("DONE\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
