"""A driver that really dies: writes one checkpoint of the model's CDC job and SIGKILLs its own process
group (Python driver, JVM, Python workers) at a fault point, as a lost machine would.

    python -m tests.model.kill_driver REQUEST.json

The request names the catalog, table, checkpoint location and id, the fault point, the Spark DDL and a
pickle of the rows (with their ``op`` column). Used by the long profile of the model check.
"""

from __future__ import annotations

import json
import os
import pickle
import sys


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as fh:
        req = json.load(fh)
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink
    from tests.integration.crash_driver import kill_process_group_at

    kill_process_group_at(req["point"], req["checkpoint"])
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "America/Los_Angeles")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with open(req["rows"], "rb") as rows:
        data = pickle.load(rows)
    sink = (
        IcebergSink.builder()
        .catalog("model", **req["catalog"])
        .table(req["table"])
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    df = spark.createDataFrame(data, req["ddl"]).repartition(2)
    sink.write(df, checkpoint_location=req["location"], checkpoint_id=req["checkpoint"])
    sys.stdout.write("DONE\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
