"""A Debezium stream with schema evolution, as a subprocess that crash tests SIGKILL at a fault point.

    python -m tests.integration.evolve_driver REQUEST.json

The request (JSON) holds ``catalog`` (properties), ``table``, ``source`` (JSON-lines files of
``key``/``value`` rows, one per micro-batch), ``checkpoint`` and optionally ``kill`` =
``[POINT, CHECKPOINT]`` (see crash_driver.kill_process_group_at). Prints ``DONE`` when the whole
source is processed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.integration.crash_driver import kill_process_group_at, say


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink

    if request.get("kill"):
        point, checkpoint = request["kill"]
        kill_process_group_at(point, int(checkpoint))
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sink = (
        IcebergSink.builder()
        .catalog("evolve", **request["catalog"])
        .table(request["table"])
        .create_if_missing(partition_by=["bucket(4, id)"])
        .debezium(value_column="value")
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .schema_evolution("add-and-widen")
        .post_commit_hook(lambda result: say(f"COMMITTED {result.checkpoint_id}"))
        .build()
    )
    stream = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1).json(request["source"])
    say("STREAMING")
    sink.start(stream, request["checkpoint"], trigger={"availableNow": True}).awaitTermination()
    say("DONE")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
