"""The Kafka guide's stream, its first micro-batch: what a new user waits for (issue 41, target 4).

docs/postgres-debezium-kafka.md's ``shop_stream.py`` as written there: a ``local[2]`` session with
Spark's defaults (``spark.sql.shuffle.partitions`` 200, adaptive execution on), its driver JVM started
with ``driver_java_options()`` (``--driver-jvm``, benchmarks/driver_options.py), and Spark's Kafka source
on ``spark.jars``; one query reading every ``shop.public.*`` topic (``subscribePattern``,
``startingOffsets`` earliest) into a routed Debezium CDC sink (``.route(...)``, ``.debezium(value_column=
"value", key_from="key")``, ``.cdc(...)``, ``.schema_evolution("add-columns")``,
``.create_if_missing()``) over an embedded catalog, started with ``trigger={"availableNow": True}``
(the guide's 10 s ``processingTime`` runs the same first micro-batch).

The topics hold what Debezium's PostgreSQL connector writes with ``schemas.enable`` (a key and a value
each with its schema part): ``--events`` snapshot reads (``op`` r) of ``public.customers`` (id, name,
a ``NUMERIC(10,2)`` credit as Connect's Decimal, a ``DATE`` born) and as many of ``public.orders``, sent
before anything is timed by the broker of ``scripts/pipeline_components.py`` (its jars from Maven
Central), each topic in ``--partitions`` partitions (1). Each run is this process, fresh; ``--option
KEY=VALUE`` sets a ``write_option`` of the sink, ``--source-option KEY=VALUE`` an option of the Kafka
source (the guide's ``kafka.fetch.max.wait.ms`` 10 and ``kafka.max.poll.records`` 20000:
``--source-option kafka.fetch.max.wait.ms=500`` measures Kafka's default, sources/kafka_source.py).

It reports the session's start, the first micro-batch (Spark's ``triggerExecution``, the sink's
``addBatch``), the process tree's CPU over it (the broker's left out), the Spark jobs, stages and tasks
of the query, and the CPU other processes used meanwhile (``foreign_cpu_s``: the machine was shared
when it is large). ``end_to_end_s`` runs from before the session's start to the first micro-batch's end.

With ``--per-batch N`` the topics' events are read ``N`` at a time (Spark's ``maxOffsetsPerTrigger``,
over both topics): the first micro-batch as above, then the median of the second half of the
micro-batches after it (``steady_micro_batch_s_p50``, Spark's ``triggerExecution``), the sink's phases
there and the Spark jobs per micro-batch. With ``--tail N`` the query keeps running after its first
micro-batch and ``N`` events are sent one at a time, each read by a micro-batch of its own at the
topics' end, as in a live pipeline: the steady figures are then those micro-batches' medians.

    python -m benchmarks.kafka_guide --out benchmarks/results/kafka-guide.json
    python -m benchmarks.kafka_guide --option iceberg-sink.write.start-python-workers=false
    python -m benchmarks.kafka_guide --events 600 --per-batch 40
    python -m benchmarks.kafka_guide --tail 20 --source-option kafka.fetch.max.wait.ms=500

Results: docs/benchmarks.md (issue 41, "No inherited 200").
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import driver_options

_CUSTOMER = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "credit",
    },
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "born"},
]
_ORDER = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "int32", "optional": True, "field": "customer_id"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "amount",
    },
]
_SOURCE = {
    "type": "struct",
    "optional": False,
    "field": "source",
    "fields": [
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "lsn"},
    ],
}


def _decimal(cents: int) -> str:
    return base64.b64encode(cents.to_bytes(4, "big", signed=True)).decode()


def messages(table: str, events: int, first_lsn: int, first_id: int = 1) -> list[str]:
    """``events`` snapshot reads of ``public.<table>`` (ids from ``first_id``, log positions after
    ``first_lsn``), as ``key<TAB>value`` lines."""
    fields = _CUSTOMER if table == "customers" else _ORDER
    row = {"type": "struct", "optional": True, "fields": fields}
    value_schema = {
        "type": "struct",
        "optional": False,
        "name": f"shop.public.{table}.Envelope",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            _SOURCE,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }
    key_schema = {"type": "struct", "optional": False, "name": f"shop.public.{table}.Key", "fields": fields[:1]}
    lines = []
    for n in range(1, events + 1):
        i = first_id + n - 1
        if table == "customers":
            after: dict[str, Any] = {"id": i, "name": f"customer {i}", "credit": _decimal(i * 125), "born": 7000 + i}
        else:
            after = {"id": i, "customer_id": i, "amount": _decimal(i * 999)}
        source = {"connector": "postgresql", "db": "shop", "schema": "public", "table": table, "lsn": first_lsn + n}
        value = {
            "schema": value_schema,
            "payload": {"before": None, "after": after, "source": source, "op": "r", "ts_ms": 1_700_000_000_000},
        }
        key = {"schema": key_schema, "payload": {"id": i}}
        lines.append(f"{json.dumps(key)}\t{json.dumps(value)}")
    return lines


def run(
    events: int,
    write_options: dict[str, str],
    per_batch: int | None = None,
    source_options: dict[str, str] | None = None,
    partitions: int = 1,
    tail: int = 0,
    driver_jvm: str = "sink",
) -> dict[str, Any]:
    """One run in this process: the broker started and the topics filled first, then the guide's
    session, sink and query; the first micro-batch timed, and with ``per_batch`` (Spark's
    ``maxOffsetsPerTrigger``: messages per micro-batch over both topics) the ones after it. With
    ``tail`` the query keeps running (a 100 ms ``processingTime`` trigger) and ``tail`` events are
    sent after the first micro-batch, one at a time, the tables in turns, each read by a micro-batch
    of its own: the stream at the end of its topics, as a live pipeline runs."""
    from benchmarks import cdc_kafka
    from benchmarks.cpu_monitor import ForeignCpuMonitor, tree_cpu_seconds

    lake = Path(tempfile.mkdtemp(prefix="kafka-guide-"))
    broker = cdc_kafka.components().KafkaBroker(lake / "kafka")
    broker.start()
    try:
        broker_pid = int(broker.process.pid())
        for number, table in enumerate(("customers", "orders")):
            lines = messages(table, events, number * 1_000_000)
            cdc_kafka.filled_topic(broker, f"shop.public.{table}", lines, lake / f"{table}.txt", partitions)
        jars = cdc_kafka.spark_kafka_jars()
        monitor = ForeignCpuMonitor(interval=0.5).start()
        monitor.adopt(broker_pid)
        tree = tree_cpu_seconds(without=broker_pid)
        started = time.time()
        from pyspark.sql import SparkSession

        from iceberg_sink import IcebergSink
        from iceberg_sink.sources.kafka_source import RECOMMENDED

        java_options = driver_options.java_options(driver_jvm, lake)

        builder = SparkSession.builder.master("local[2]").config("spark.jars", ",".join(jars))
        if java_options:
            builder = builder.config("spark.driver.extraJavaOptions", java_options)  # the guide's line
        spark = builder.getOrCreate()
        spark_start = time.time() - started
        stream = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribePattern", "shop[.]public[.].*")
            .option("startingOffsets", "earliest")
            .options(**RECOMMENDED)  # the guide's two consumer options, as it writes them
        )
        if per_batch is not None:
            stream = stream.option("maxOffsetsPerTrigger", per_batch)
        for key, value in (source_options or {}).items():
            stream = stream.option(key, value)
        stream = stream.load()
        builder = (
            IcebergSink.builder()
            .embedded(lake / "lake")
            .route(table_column="source_table", namespace="shop")
            .debezium(value_column="value", key_from="key")
            .cdc(op_column="op", order_by="lsn", key_column="key_columns")
            .schema_evolution("add-columns")
            .create_if_missing()
        )
        for key, value in write_options.items():
            builder = builder.write_option(key, value)
        sink = builder.build()
        begin = time.time()
        trigger = {"processingTime": "100 milliseconds"} if tail else {"availableNow": True}
        query = sink.start(stream, checkpoint_location=str(lake / "checkpoints"), trigger=trigger)
        if tail:
            _send_tail(spark, query, broker.bootstrap, events, tail)
            query.stop()
        else:
            query.awaitTermination()
        end = time.time()
        after = tree_cpu_seconds(without=broker_pid)
        if query.exception() is not None:
            raise RuntimeError(f"the stream failed: {query.exception()}")
        progress = [p for p in query.recentProgress if int(p.numInputRows) > 0]
        if per_batch is None and len(progress) != 1 + tail:
            raise RuntimeError(f"expected {1 + tail} micro-batches with events: {[p.json for p in progress]}")
        first, durations = progress[0], dict(progress[0].durationMs)
        tracker = spark.sparkContext.statusTracker()
        stages, jobs = [], tracker.getJobIdsForGroup(str(query.runId))
        for job in jobs:
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else []:
                stage_info = tracker.getStageInfo(stage)
                if stage_info is not None:
                    stages.append(stage_info.numTasks)
        tables = {name: len(sink.load_table(f"shop.{name}").scan().to_arrow()) for name in ("customers", "orders")}
        monitor.stop()
        spark.stop()
    finally:
        broker.stop()
    expected = {"customers": events + (tail + 1) // 2, "orders": events + tail // 2}
    if tables != expected:
        raise RuntimeError(f"expected {expected} rows: {tables}")
    cpu = after - tree if after is not None and tree is not None else None
    records = [r for r in sink.progress() if r.get("status") == "committed"]
    # Micro-batches after the first: the second half of them is the steady state (Spark's JIT
    # compiler is still busy over the first ones). The sink's records name their micro-batch by its
    # batch id (checkpoint_id); it keeps the newest 100.
    later = progress[1:]
    # A tail's micro-batches each read one event: all of them are its steady state.
    settled = later if tail else later[len(later) // 2 :]
    steady = [dict(p.durationMs) for p in settled]
    steady_ids = {int(p.batchId) for p in settled}
    phases: dict[str, list[float]] = {}
    for r in records:
        if r.get("table") == "shop.orders" and r.get("checkpoint_id") in steady_ids:
            for name, ms in (r.get("phases_ms") or {}).items():
                phases.setdefault(name, []).append(ms)
    return {
        "events_per_table": events,
        "write_options": write_options,
        "source_options": source_options or {},
        "partitions_per_topic": partitions,
        "driver_jvm": driver_jvm,
        "class_sharing": driver_options.class_sharing(java_options),
        "spark_start_s": round(spark_start, 3),
        "first_micro_batch_s": round(durations.get("triggerExecution", 0) / 1000, 3),
        "add_batch_s": round(durations.get("addBatch", 0) / 1000, 3),
        "end_to_end_s": round(begin - started + durations.get("triggerExecution", 0) / 1000, 3),
        "stream_s": round(end - begin, 3),
        "input_rows": int(first.numInputRows),
        "jobs": len(jobs),
        "tasks_per_stage": stages,
        "phases_ms": {
            str(r.get("table")): r.get("phases_ms") for r in records if r.get("checkpoint_id") == int(first.batchId)
        },
        "micro_batches": len(progress),
        "micro_batch_s": [round(dict(p.durationMs).get("triggerExecution", 0) / 1000, 3) for p in progress],
        "steady_micro_batch_s_p50": round(statistics.median(d["triggerExecution"] for d in steady) / 1000, 3)
        if steady
        else None,
        "steady_add_batch_s_p50": round(statistics.median(d["addBatch"] for d in steady) / 1000, 3) if steady else None,
        "steady_phases_ms_p50": {name: round(statistics.median(v), 1) for name, v in phases.items()},
        "steady_jobs_per_micro_batch": round(len(jobs) / len(progress), 2),
        "process_tree_cpu_s": round(cpu, 3) if cpu is not None else None,
        "foreign_cpu_s": monitor.between(begin, end),
    }


def _send_tail(spark: Any, query: Any, bootstrap: str, events: int, rounds: int) -> None:
    """``rounds`` more events, one at a time (the tables in turns, new ids and later log positions),
    each sent once the micro-batch of the one before has ended, by a Kafka producer in the session's
    JVM (Spark's Kafka jars hold the client): no process of its own starting beside the micro-batch."""
    jvm = spark.sparkContext._jvm
    props = jvm.java.util.Properties()
    serializer = "org.apache.kafka.common.serialization.StringSerializer"
    settings = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "key.serializer": serializer,
        "value.serializer": serializer,
    }
    for key, value in settings.items():
        props.setProperty(key, value)

    def batches() -> int:
        return sum(1 for p in query.recentProgress if int(p.numInputRows) > 0)

    def wait_for(count: int) -> None:
        deadline = time.time() + 120
        while batches() < count:
            if query.exception() is not None or time.time() > deadline:
                raise RuntimeError(f"the stream did not run micro-batch {count}: {query.exception()}")
            time.sleep(0.05)

    wait_for(1)
    producer = jvm.org.apache.kafka.clients.producer.KafkaProducer(props)
    try:
        for k in range(rounds):
            number = k % 2
            table = ("customers", "orders")[number]
            line = messages(table, 1, number * 1_000_000 + events + k, first_id=events + 1 + k // 2)[0]
            key, value = line.split("\t", 1)
            record = jvm.org.apache.kafka.clients.producer.ProducerRecord(f"shop.public.{table}", key, value)
            producer.send(record).get()
            wait_for(2 + k)
    finally:
        producer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1, help="snapshot events per table (default 1)")
    parser.add_argument(
        "--per-batch",
        type=int,
        help="messages per micro-batch over both topics (maxOffsetsPerTrigger); default: all in one",
    )
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a sink write_option")
    parser.add_argument(
        "--source-option", action="append", default=[], metavar="KEY=VALUE", help="an option of the Kafka source"
    )
    parser.add_argument(
        "--tail",
        type=int,
        default=0,
        help="events sent one at a time after the first micro-batch, each read at the topics' end (default 0)",
    )
    parser.add_argument("--partitions", type=int, default=1, help="partitions of each topic (default 1)")
    driver_options.add_argument(parser)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    write_options = dict(o.split("=", 1) for o in args.option)
    result = {
        "benchmark": "kafka_guide",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **run(
            args.events,
            write_options,
            args.per_batch,
            dict(o.split("=", 1) for o in args.source_option),
            args.partitions,
            args.tail,
            args.driver_jvm,
        ),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
