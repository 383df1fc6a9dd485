"""A Spark session with Spark's Kafka source, for tests/integration/test_kafka_fetch_wait.py.

    python -m tests.integration.kafka_fetch_wait_driver REQUEST.json

Given the broker, a topic holding events and the source's jars, it prints one JSON line: what
:func:`iceberg_sink.sources.kafka_source.lacking_sources` finds in several streams' plans, and,
for a stream without the options, one with the fetch wait only and one with both, the warnings
``sink.start`` logged and the rows each stream wrote.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(request_path: str) -> int:
    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink
    from iceberg_sink.sources.kafka_source import HINT_START, lacking_sources

    request: dict[str, Any] = json.loads(Path(request_path).read_text())
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.jars", request["jars"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    topic, bootstrap = request["topic"], request["bootstrap"]

    def kafka(**options: str) -> Any:
        reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        for key, value in options.items():
            reader = reader.option(key, value)
        return reader.load()

    plain = kafka(subscribe=topic, startingOffsets="earliest")
    # Spark's reader options are case-insensitive, and so is the check.
    fetch_wait_only = kafka(subscribe=topic, startingOffsets="earliest", **{"KAFKA.Fetch.Max.Wait.MS": "10"})
    both = kafka(
        subscribe=topic,
        startingOffsets="earliest",
        **{"kafka.fetch.max.wait.ms": "10", "Kafka.Max.Poll.Records": "20000"},
    )
    assigned = kafka(assign=json.dumps({topic: [0]}))
    rate = spark.readStream.format("rate").load()
    found = {
        "plain": lacking_sources(plain),
        "fetch_wait_only": lacking_sources(fetch_wait_only),
        "both": lacking_sources(both),
        "union": lacking_sources(both.select("value").union(fetch_wait_only.select("value"))),
        "assigned": lacking_sources(assigned),
        "rate": lacking_sources(rate),
        "projected": lacking_sources(plain.selectExpr("CAST(value AS STRING) AS v").where("v IS NOT NULL")),
    }
    handler = _Warnings()
    logging.getLogger("iceberg_sink").addHandler(handler)
    lake = Path(request["lake"])
    sink = IcebergSink.builder().embedded(lake).table("t.events").create_if_missing().build()
    runs: dict[str, Any] = {}
    for name, stream in (("plain", plain), ("fetch_wait_only", fetch_wait_only), ("both", both)):
        before = len(handler.messages)
        rows = stream.selectExpr("CAST(value AS STRING) AS v", "offset")
        query = sink.start(rows, checkpoint_location=str(lake / f"checkpoint-{name}"), trigger={"availableNow": True})
        query.awaitTermination()
        runs[name] = {
            "warnings": [m for m in handler.messages[before:] if m.startswith(HINT_START)],
            "exception": str(query.exception()) if query.exception() is not None else None,
        }
    runs["rows"] = len(sink.load_table("t.events").scan().to_arrow())
    spark.stop()
    print(json.dumps({"found": found, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
