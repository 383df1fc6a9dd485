"""``iceberg-sink run``: a validated :class:`~iceberg_sink.cli.runconfig.RunConfig` made a running
pipeline: the sink its ``sink`` section describes (sink_builder), the streaming DataFrame of its
``source`` (open_source), and the query started and stopped (run).

    source ─(spark.readStream: files / rate / kafka)─▶ IcebergSink.start ─▶ stop (availableNow,
                                                                             timeout, max_batches)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from iceberg_sink.cli.runconfig import ConfigError, RunConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from iceberg_sink.builder import IcebergSinkBuilder
    from iceberg_sink.sink import IcebergSink


class PipelineFailedError(Exception):
    """The streaming query stopped with an error (its first line is the message)."""


def build_sink(config: RunConfig) -> IcebergSink:
    """The sink the config's ``sink`` section describes (the builder validates the values)."""
    return sink_builder(config).build()


def validate_sink(config: RunConfig) -> None:
    """The builder's own checks of the ``sink`` section that need no catalog and no Spark
    (``run --validate-only``): unknown or bad write options, a table without namespace, a key
    missing a partition source, ... raise :class:`InvalidSinkConfigError` as ``build()`` would."""
    sink_builder(config).validate()


def sink_builder(config: RunConfig) -> IcebergSinkBuilder[IcebergSink]:
    """The builder configured from the config's ``sink`` section (nothing checked or created yet)."""
    from iceberg_sink.sink import IcebergSink

    sink = config.sink
    builder = IcebergSink.builder()
    if "route" in sink:
        builder.route(**sink["route"])
    else:
        builder.table(sink["table"])
    if "debezium" in sink and sink["debezium"] is not None:
        builder.debezium(**sink["debezium"])
    if "schema_evolution" in sink:
        builder.schema_evolution(sink["schema_evolution"])
    if "catalog" in sink:
        builder.catalog(sink["catalog"]["name"], **sink["catalog"].get("properties", {}))
    elif "embedded" in sink:
        builder.embedded(sink["embedded"])
    create = sink.get("create_if_missing")
    if create is not None:
        builder.create_if_missing(**create)
    if "distribution_mode" in sink:
        builder.distribution_mode(sink["distribution_mode"])
    if "branch" in sink:
        builder.branch(sink["branch"])
    for key, value in sink.get("write_options", {}).items():
        builder.write_option(key, value)
    if "max_pending_checkpoints" in sink:
        builder.max_pending_checkpoints(sink["max_pending_checkpoints"])
    if "upsert" in sink:
        builder.upsert(**sink["upsert"])
    if "cdc" in sink:
        builder.cdc(**sink["cdc"])
    if "compaction" in sink:
        builder.compaction(**sink["compaction"])
    conversion = sink.get("convert_equality_deletes")
    if conversion is not None:
        builder.convert_equality_deletes(**conversion)
    if sink.get("dead_letter") is not None:
        builder.dead_letter(sink["dead_letter"])
    if sink.get("atomic_commits") is not None:
        builder.atomic_commits(sink["atomic_commits"])
    return builder


DEMO_COLUMNS = {
    "event_id": "value",
    "user_id": "value % 50",
    "ts": "timestamp",
    "page": "element_at(array('/home', '/cart', '/checkout', '/search'), CAST(value % 4 AS INT) + 1)",
    "amount": "round((value % 97) * 1.25, 2)",
}
"""Columns of the rate source when ``source.columns`` is not given: Spark SQL expressions over the
rate source's ``value`` (0, 1, 2, ...) and ``timestamp``."""


def _schema_problem(spark: SparkSession, ddl: str, path: str) -> str | None:
    from pyspark.sql.types import StructType

    try:
        StructType.fromDDL(ddl) if hasattr(StructType, "fromDDL") else spark.createDataFrame([], ddl)
    except Exception as e:
        return f"{path}: expected a DDL schema such as 'id long, name string', received {ddl!r} ({type(e).__name__})"
    return None


def open_source(spark: SparkSession, config: RunConfig) -> DataFrame:
    """The streaming DataFrame of the config's source.

    Raises:
        ConfigError: the schema is not DDL, no files to infer a schema from, or Spark's Kafka
            connector is not on the classpath.
    """
    from pyspark.sql import functions as F

    from iceberg_sink.sources import kafka_source

    source = config.source
    kind = source["type"]
    where = config.source_file
    if kind == "files":
        fmt, path = source["format"], source["path"]
        options = {k: str(v) for k, v in source.get("options", {}).items()}
        if "schema" in source:
            problem = _schema_problem(spark, source["schema"], "source.schema")
            if problem:
                raise ConfigError(where, [problem])
            schema: Any = source["schema"]
        else:
            if not os.path.isdir(path) or not any(p.is_file() for p in Path(path).iterdir()):
                raise ConfigError(
                    where,
                    [f"source.schema: not given and {path} holds no files to infer it from; give source.schema"],
                )
            schema = spark.read.format(fmt).options(**options).load(path).schema
        reader = spark.readStream.format(fmt).options(**options).schema(schema)
        if "max_files_per_trigger" in source:
            reader = reader.option("maxFilesPerTrigger", source["max_files_per_trigger"])
        return reader.load(path)
    if kind == "rate":
        reader = spark.readStream.format("rate").option("rowsPerSecond", source.get("rows_per_second", 10))
        if "num_partitions" in source:
            reader = reader.option("numPartitions", source["num_partitions"])
        df = reader.load()
        columns = source.get("columns") or DEMO_COLUMNS
        return df.select(*[F.expr(str(expr)).alias(name) for name, expr in columns.items()])
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", source["bootstrap_servers"])
        .option(
            *(("subscribe", source["topic"]) if "topic" in source else ("subscribePattern", source["topic_pattern"]))
        )
        .option("startingOffsets", source.get("starting_offsets", "earliest"))
        # A micro-batch at the topic's end would wait Kafka's default 500 ms, and a backlog cost an
        # offset round trip every 500 records (sources/kafka_source.py); source.options may set
        # them otherwise (Spark's reader options are case-insensitive).
        .options(**kafka_source.RECOMMENDED)
        .options(**{k: str(v) for k, v in source.get("options", {}).items()})
    )
    try:
        df = reader.load()
    except Exception as e:
        if "kafka" in str(e).lower() and ("DATA_SOURCE_NOT_FOUND" in str(e) or "Failed to find" in str(e)):
            version = spark.version
            scala = "2.13" if not version.startswith("3.") else "2.12"
            raise ConfigError(
                where,
                [
                    "source.type: kafka needs Spark's Kafka connector, which is not on the classpath; add it under "
                    f"spark.conf with spark.jars.packages: org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}"
                ],
            ) from None
        raise
    if source.get("value_format", "raw") == "json":
        problem = _schema_problem(spark, source["schema"], "source.schema")
        if problem:
            raise ConfigError(where, [problem])
        parsed = F.from_json(F.col("value").cast("string"), source["schema"]).alias("data")
        return df.select(parsed).select("data.*")
    return df.selectExpr(
        "CAST(key AS STRING) AS key",
        "CAST(value AS STRING) AS value",
        "topic",
        "partition",
        "offset",
        "timestamp",
    )


def _stop_between_batches(query: StreamingQuery) -> None:
    """Stop once the running micro-batch (if any) is done. Stopping inside one is safe for the table
    (the next run commits or redoes it, once) but makes Spark interrupt the Python batch function."""
    while query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.1)
    query.stop()


@attrs.frozen
class RunResult:
    """What ``run`` did: batches Spark ran, what the sink committed, why it stopped."""

    table: str
    checkpoint_location: str
    batches: int
    commits: int
    committed_records: int
    committed_data_files: int
    committed_delete_files: int
    snapshot_id: int | None
    stopped_by: str
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def run(
    spark: SparkSession,
    config: RunConfig,
    available_now: bool = False,
    timeout_s: float | None = None,
    max_batches: int | None = None,
    on_batch: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Start the pipeline and wait until it stops: the source is drained (availableNow / once), the
    timeout passed, ``max_batches`` batches ran, or the query failed (raised)."""
    started = time.monotonic()
    sink = build_sink(config)
    df = open_source(spark, config)
    trigger = {"availableNow": True} if available_now else config.trigger
    stop = config.stop
    timeout_s = timeout_s if timeout_s is not None else stop.get("timeout_seconds")
    max_batches = max_batches if max_batches is not None else stop.get("max_batches")
    query = sink.start(df, config.checkpoint_location, trigger=trigger, query_name=config.data.get("query_name"))
    seen = -1
    first: int | None = None
    stopped_by = "source drained"
    try:
        while query.awaitTermination(1) is not True and query.isActive:
            progress = query.lastProgress
            if progress is not None and progress["batchId"] != seen:
                seen = progress["batchId"]
                first = seen if first is None else first
                if on_batch is not None:
                    on_batch(dict(progress))
                if max_batches is not None and seen + 1 >= max_batches:
                    stopped_by = f"max_batches ({max_batches})"
                    break
            if timeout_s is not None and time.monotonic() - started >= timeout_s:
                stopped_by = f"timeout ({timeout_s:g} s)"
                break
    finally:
        if query.isActive:
            _stop_between_batches(query)
    failure = query.exception()
    if failure is not None:
        raise PipelineFailedError(f"the streaming query failed: {failure}")
    recent = query.recentProgress
    if recent:
        first = min(first if first is not None else recent[0]["batchId"], recent[0]["batchId"])
        batches = recent[-1]["batchId"] - first + 1
    else:
        batches = 0
    sink.await_compactions()
    sink.await_conversions()
    metrics = sink.metrics()
    route = sink.config.route
    # A routed pipeline writes many tables: no one head snapshot (docs/routing.md).
    head = sink.load_table().current_snapshot() if route is None else None
    return RunResult(
        table=sink.config.table if route is None else route.describe(),
        checkpoint_location=config.checkpoint_location,
        batches=batches,
        commits=metrics.commits,
        committed_records=metrics.committed_records,
        committed_data_files=metrics.committed_data_files,
        committed_delete_files=metrics.committed_delete_files,
        snapshot_id=head.snapshot_id if head is not None else None,
        stopped_by=stopped_by,
        duration_s=round(time.monotonic() - started, 3),
    )
