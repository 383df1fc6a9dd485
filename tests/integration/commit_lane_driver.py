"""A Kafka stream into a format v3 upsert table, its commits run beside the next micro-batch where
they may (job/lane.py), for tests/integration/test_commit_lane.py.

    python -m tests.integration.commit_lane_driver REQUEST.json

Runs the stream until Spark has processed every record of the topic and prints one JSON line: the
table's rows as read right then (before the query stops), the sink's progress records, the
post-commit hooks' calls and each snapshot's checkpoint id. With ``"kill": [point, checkpoint]``
the driver SIGKILLs its own process group at that fault point (iceberg_sink/_faults.py), after
writing the name of the thread that got there to ``"killed_on"``; with ``"stall": [point, seconds]``
each commit on the lane waits that long there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main(request_path: str) -> int:
    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink, _faults

    request: dict[str, Any] = json.loads(Path(request_path).read_text())
    if request.get("kill"):
        point, checkpoint = request["kill"]

        def kill(at: str, checkpoint_id: int) -> None:
            if at == point and checkpoint_id == checkpoint:
                Path(request["killed_on"]).write_text(threading.current_thread().name)
                os.killpg(os.getpgid(0), signal.SIGKILL)

        _faults.install(kill)
    if request.get("stall"):  # the lane's commits made slow: the next micro-batch plans beside them
        point, seconds = request["stall"]

        def stall(at: str, checkpoint_id: int) -> None:
            if at == point and threading.current_thread().name.startswith("iceberg-sink-commit"):
                time.sleep(seconds)

        _faults.install(stall)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", request["jars"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    hooks: list[dict[str, Any]] = []

    def hook(result: Any) -> None:
        hooks.append(
            {
                "checkpoint_id": result.checkpoint_id,
                "snapshot_id": result.snapshot_id,
                "thread": threading.current_thread().name,
            }
        )

    kafka = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", request["bootstrap"])
        .option("subscribe", request["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(request["per_trigger"]))
        .option("kafka.fetch.max.wait.ms", "10")
        .load()
    )
    builder = (
        IcebergSink.builder()
        .embedded(Path(request["lake"]))
        .write_option("iceberg-sink.commit.overlap", request["overlap"])
        .post_commit_hook(hook)
    )
    if request.get("debezium"):  # Debezium envelopes whose updates may hold TOAST placeholders
        builder = (
            builder.table("db.docs")
            .create_if_missing(format_version=3)
            .debezium(value_column="value", table_column=None)
            .cdc(op_column="op", key=["id"], order_by="lsn")
        )
        stream = kafka.selectExpr("CAST(value AS STRING) AS value")
        columns = ["id", "doc", "n"]
    else:
        builder = builder.table("db.kv").create_if_missing(format_version=3).upsert(key=["id"], order_by="seq")
        stream = kafka.selectExpr(
            "CAST(CAST(key AS STRING) AS BIGINT) AS id", "CAST(value AS STRING) AS v", "offset AS seq"
        )
        columns = ["id", "v", "seq"]
    sink = builder.build()
    query = sink.start(stream, checkpoint_location=request["checkpoint"])
    query.processAllAvailable()
    table = sink.load_table()
    rows = sorted(tuple(r[c] for c in columns) for r in table.scan().to_arrow().to_pylist())
    checkpoints = [
        int(next(v for k, v in s.summary.additional_properties.items() if k.endswith(".checkpoint-id")))
        for s in table.snapshots()
        if s.summary is not None and any(k.endswith(".checkpoint-id") for k in s.summary.additional_properties)
    ]
    query.stop()
    print(
        json.dumps(
            {
                "rows": rows,
                "progress": sink.progress(),
                "hooks": hooks,
                "checkpoints": checkpoints,
                "metadata_location": table.metadata_location,
                "overlapped_commits": sink.metrics().overlapped_commits,
            }
        )
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
