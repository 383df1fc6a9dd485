"""The Spark side of the transaction-consistency test: one stream from Kafka into routed Iceberg tables.

    python -m tests.e2e.transactions_driver REQUEST.json

Run as a subprocess (its own process group) so tests/e2e/test_transactions_e2e.py can SIGKILL it.
The request names the bootstrap servers, the topic pattern (it covers the connector's transaction
topic ``<topic.prefix>.transaction`` too), the catalog properties, the checkpoint location,
``spark.jars`` (Spark's Kafka source), the trigger, ``max_offsets_per_trigger`` (Spark's
``maxOffsetsPerTrigger``; None: unbounded) and ``transactions``: the value of
``.debezium(transactions=...)``, or None to leave the argument out (the default, ``"ignore"``)::

    spark.readStream.format("kafka").option("subscribePattern", ...).option("maxOffsetsPerTrigger", ...)
      -> .debezium(value_column="value", key_from="key"[, transactions=...])
      -> .route(table_column="source_table", namespace=...)
      -> .cdc(op_column="op", order_by="lsn", key_column="key_columns")

on the catalog given (a SQLite file: a checkpoint's tables swap their pointers in one transaction).
It prints ``STREAMING`` once the query runs and ``COMMITTED <table> <checkpoint> <unix time>`` after
each table's commit, and runs until killed or until the query fails (the error is printed, exit
code 1).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tests.e2e.pipeline_driver import KAFKA_OPTIONS, say, spark_conf

NAMESPACE = "shop"


def debezium_args(request: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``.debezium(...)``: ``transactions=`` only when the request names a mode."""
    args: dict[str, Any] = {"value_column": "value", "key_from": "key"}
    if request.get("transactions") is not None:
        args["transactions"] = request["transactions"]
    return args


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink

    try:
        sink = (
            IcebergSink.builder()
            .catalog("e2e", **request["catalog"])
            .route(table_column="source_table", namespace=NAMESPACE)
            .debezium(**debezium_args(request))
            .cdc(op_column="op", order_by="lsn", key_column="key_columns")
            .create_if_missing()
            .post_commit_hook(lambda result: say(f"COMMITTED {result.table} {result.checkpoint_id} {time.time():.3f}"))
            .build()
        )
    except Exception as e:  # an unknown option (the feature not built yet) fails fast, before Spark starts
        say(f"FAILED {type(e).__name__}: {e}")
        return 1

    builder = SparkSession.builder.master("local[2]").appName("e2e-transactions").config("spark.ui.enabled", "false")
    for key, value in spark_conf(request).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    options = dict(KAFKA_OPTIONS)
    if request.get("max_offsets_per_trigger"):
        options["maxOffsetsPerTrigger"] = str(request["max_offsets_per_trigger"])
    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", request["bootstrap"])
        .option("subscribePattern", request["pattern"])
        .options(**options)
        .load()
    )
    query = sink.start(df, request["checkpoint"], trigger={"processingTime": request.get("trigger", "1 second")})
    say("STREAMING")
    try:
        query.awaitTermination()
    except Exception as e:
        say(f"FAILED {type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
