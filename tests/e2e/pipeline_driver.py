"""The Spark side of the end-to-end pipeline: one stream from Kafka into routed Iceberg tables.

    python -m tests.e2e.pipeline_driver REQUEST.json

Run as a subprocess (its own process group) so the test can SIGKILL it as a lost machine would be.
The request names the bootstrap servers, the topic pattern, the catalog properties, the checkpoint
location and ``spark.jars`` (Spark's Kafka source). The stream is configured through the Python API
exactly as :data:`PIPELINE_YAML` configures it for ``iceberg-sink run`` (the test drains the stream
with that command, on the same checkpoint location, so both configurations are exercised)::

    spark.readStream.format("kafka").option("subscribePattern", ...)
      -> .debezium(key_from="key", truncate="apply") -> .route(table_column="source_table", namespace=...)
      -> .cdc(op_column="op", order_by="lsn", key_column="key_columns") -> add-columns evolution

It prints ``STREAMING`` once the query runs and ``COMMITTED <table> <checkpoint>`` after each commit,
and runs until killed or until the query fails (the error is printed, exit code 1).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

NAMESPACE = "shop"
KAFKA_OPTIONS = {
    "startingOffsets": "earliest",
    # The broker is restarted during the test: keep asking for offsets while it is away.
    "fetchOffset.numRetries": "60",
    "fetchOffset.retryIntervalMs": "2000",
    "kafkaConsumer.pollTimeoutMs": "120000",
}


def pipeline_yaml(request: dict[str, Any]) -> dict[str, Any]:
    """The same pipeline as :func:`start`, as an ``iceberg-sink run`` config."""
    return {
        "source": {
            "type": "kafka",
            "bootstrap_servers": request["bootstrap"],
            "topic_pattern": request["pattern"],
            "value_format": "raw",
            "options": {k: v for k, v in KAFKA_OPTIONS.items() if k != "startingOffsets"},
        },
        "sink": {
            "catalog": {"name": "e2e", "properties": request["catalog"]},
            "route": {"table_column": "source_table", "namespace": NAMESPACE},
            "debezium": {"value_column": "value", "key_from": "key", "truncate": "apply"},
            "cdc": {"op_column": "op", "order_by": "lsn", "key_column": "key_columns"},
            "schema_evolution": "add-columns",
            "create_if_missing": True,
        },
        "checkpoint_location": request["checkpoint"],
        "spark": {"master": "local[2]", "conf": spark_conf(request)},
    }


def spark_conf(request: dict[str, Any]) -> dict[str, str]:
    return {
        "spark.jars": request["jars"],
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "America/Los_Angeles",
    }


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink

    builder = SparkSession.builder.master("local[2]").appName("e2e-pipeline").config("spark.ui.enabled", "false")
    for key, value in spark_conf(request).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    sink = (
        IcebergSink.builder()
        .catalog("e2e", **request["catalog"])
        .route(table_column="source_table", namespace=NAMESPACE)
        .debezium(value_column="value", key_from="key", truncate="apply")
        .cdc(op_column="op", order_by="lsn", key_column="key_columns")
        .schema_evolution("add-columns")
        .create_if_missing()
        .post_commit_hook(lambda result: say(f"COMMITTED {result.table} {result.checkpoint_id}"))
        .build()
    )
    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", request["bootstrap"])
        .option("subscribePattern", request["pattern"])
        .options(**KAFKA_OPTIONS)
        .load()
    )
    query = sink.start(df, request["checkpoint"], trigger={"processingTime": request.get("trigger", "2 seconds")})
    say("STREAMING")
    try:
        query.awaitTermination()
    except Exception as e:
        say(f"FAILED {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
