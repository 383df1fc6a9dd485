"""``iceberg-sink run CONFIG.yaml``: a streaming pipeline described by a YAML file.

The whole file is validated before Spark starts; every problem is reported at once, each naming its
key path (``sink.compaction.every_n_commits``), what was expected and what was received, with a
close-match suggestion for unknown keys. Relative paths (``source.path``, ``sink.embedded``,
``checkpoint_location``) are relative to the config file's folder; ``${NAME}`` in any string is
replaced by the environment variable NAME (keep credentials out of the file). See docs/cli.md.

    source ─(spark.readStream: files / rate / kafka)─▶ IcebergSink.start ─▶ stop (availableNow,
                                                                             timeout, max_batches)
"""

from __future__ import annotations

import difflib
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from iceberg_sink.committer.store import is_uri
from iceberg_sink.errors import InvalidSinkConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from iceberg_sink.builder import IcebergSinkBuilder
    from iceberg_sink.sink import IcebergSink

Check = Callable[[Any, str, list[str]], Any]
"""Validates one value at a key path: appends problems, returns the (normalised) value."""


class PipelineFailedError(Exception):
    """The streaming query stopped with an error (its first line is the message)."""


class ConfigError(InvalidSinkConfigError):
    """The config file is invalid: one problem per line, each naming its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def _received(value: Any) -> str:
    kinds = {
        dict: "a mapping",
        list: "a list",
        bool: "a boolean",
        str: "a string",
        int: "an integer",
        float: "a number",
    }
    kind = kinds.get(type(value), "nothing (null)" if value is None else None)
    if kind is None:
        kind = f"a {type(value).__name__}"
    text = repr(value)
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}" if value is not None else kind


def _problem(path: str, expected: str, value: Any) -> str:
    return f"{path}: expected {expected}, received {_received(value)}"


def typed(expected: str, ok: Callable[[Any], bool]) -> Check:
    def check(value: Any, path: str, problems: list[str]) -> Any:
        if not ok(value):
            problems.append(_problem(path, expected, value))
        return value

    return check


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


STRING = typed("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
BOOL = typed("true or false", lambda v: isinstance(v, bool))
POSITIVE_INT = typed("a positive integer", lambda v: _is_int(v) and v > 0)
NON_NEGATIVE_INT = typed("an integer >= 0", lambda v: _is_int(v) and v >= 0)
POSITIVE_NUMBER = typed("a positive number", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0)
SCALAR = typed("a string, number or boolean", lambda v: isinstance(v, str | int | float | bool))


def one_of(*choices: str) -> Check:
    return typed("one of " + ", ".join(repr(c) for c in choices), lambda v: v in choices)


def string_list(value: Any, path: str, problems: list[str]) -> Any:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(_problem(path, "a list of strings", value))
    return value


def string_or_list(value: Any, path: str, problems: list[str]) -> Any:
    """A non-empty string, kept as is, or a non-empty list of them (``debezium.order_by``: one payload
    path or several, and ``order_type``: one type for all or one per path)."""
    if isinstance(value, str) and value.strip():
        return value
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        problems.append(_problem(path, "a non-empty string or a non-empty list of them", value))
    return value


def scalar_map(value: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, dict):
        problems.append(_problem(path, "a mapping of names to strings, numbers or booleans", value))
        return value
    for key, item in value.items():
        SCALAR(item, f"{path}.{key}", problems)
    return {str(k): v for k, v in value.items()}


def mapping(fields: Mapping[str, Check], required: tuple[str, ...] = (), what: str = "a mapping") -> Check:
    """A mapping with these keys only; unknown keys get a close-match suggestion."""

    def check(value: Any, path: str, problems: list[str]) -> Any:
        if not isinstance(value, dict):
            problems.append(_problem(path or "(top level)", f"{what} with keys {', '.join(fields)}", value))
            return value
        result = {}
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of {', '.join(fields)}"
                problems.append(f"{sub}: unknown key{hint}")
                continue
            result[key] = fields[key](item, sub, problems)
        for key in required:
            if key not in value:
                problems.append(f"{path + '.' if path else ''}{key}: required, missing")
        return result

    return check


def bool_or(inner: Check) -> Check:
    """``true`` (defaults), ``false`` (off) or a mapping."""

    def check(value: Any, path: str, problems: list[str]) -> Any:
        if isinstance(value, bool):
            return {} if value else None
        if value is None:
            return {}
        return inner(value, path, problems)

    return check


_COMPACTION = mapping(
    {
        "every_n_commits": POSITIVE_INT,
        "small_files_per_partition": POSITIVE_INT,
        "small_files_bytes": POSITIVE_INT,
        "every_seconds": POSITIVE_NUMBER,
        "delete_files": POSITIVE_INT,
        "delete_records": POSITIVE_INT,
        "background": BOOL,
        "target_file_size_bytes": POSITIVE_INT,
        "min_file_size_bytes": POSITIVE_INT,
        "max_group_bytes": POSITIVE_INT,
        "min_input_files": POSITIVE_INT,
        "delete_file_threshold": POSITIVE_INT,
        "max_replans": NON_NEGATIVE_INT,
    }
)
_CONVERSION = mapping(
    {
        "every_n_commits": POSITIVE_INT,
        "equality_delete_records": POSITIVE_INT,
        "delete_files": POSITIVE_INT,
        "background": BOOL,
        "max_replans": NON_NEGATIVE_INT,
    }
)
_SINK = mapping(
    {
        "table": STRING,
        "embedded": STRING,
        "catalog": mapping({"name": STRING, "properties": scalar_map}, required=("name",)),
        "create_if_missing": bool_or(
            mapping(
                {
                    "partition_by": string_list,
                    "properties": scalar_map,
                    "format_version": typed("1, 2 or 3", lambda v: v in (1, 2, 3) and not isinstance(v, bool)),
                }
            )
        ),
        "distribution_mode": one_of("none", "hash", "range"),
        "branch": STRING,
        "write_options": scalar_map,
        "max_pending_checkpoints": POSITIVE_INT,
        "upsert": mapping({"key": string_list, "key_column": STRING, "order_by": STRING}),
        "cdc": mapping(
            {"op_column": STRING, "key": string_list, "order_by": STRING, "key_column": STRING}, required=("op_column",)
        ),
        "compaction": _COMPACTION,
        "convert_equality_deletes": bool_or(_CONVERSION),
        "route": mapping(
            {"table_column": STRING, "namespace": STRING, "allow": string_list}, required=("table_column",)
        ),
        "schema_evolution": one_of("off", "add-columns", "add-and-widen"),
        "dead_letter": STRING,
        "debezium": bool_or(
            mapping(
                {
                    "value_column": STRING,
                    "op_column": STRING,
                    "order_by": string_or_list,
                    "order_column": STRING,
                    "order_type": string_or_list,
                    "table_column": STRING,
                    "table_fields": string_list,
                    "keep": string_list,
                    "key_from": STRING,
                    "key_column": STRING,
                    "truncate": one_of("apply", "skip", "fail"),
                    "unavailable_value": STRING,
                }
            )
        ),
    },
)
_FILES = {
    "type": one_of("files"),
    "path": STRING,
    "format": one_of("parquet", "json", "csv"),
    "schema": STRING,
    "options": scalar_map,
    "max_files_per_trigger": POSITIVE_INT,
}
_RATE = {
    "type": one_of("rate"),
    "rows_per_second": POSITIVE_INT,
    "num_partitions": POSITIVE_INT,
    "columns": scalar_map,
}
_KAFKA = {
    "type": one_of("kafka"),
    "bootstrap_servers": STRING,
    "topic": STRING,
    "topic_pattern": STRING,
    "starting_offsets": STRING,
    "value_format": one_of("json", "raw"),
    "schema": STRING,
    "options": scalar_map,
}
_SOURCES = {"files": _FILES, "rate": _RATE, "kafka": _KAFKA}


def _source(value: Any, path: str, problems: list[str]) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _SOURCES:
        if isinstance(value, dict):
            problems.append(_problem(f"{path}.type", "one of 'files', 'rate', 'kafka'", kind))
        else:
            problems.append(_problem(path, "a mapping with a type (files, rate or kafka)", value))
        return value
    required = {"files": ("path", "format"), "rate": (), "kafka": ("bootstrap_servers",)}[kind]
    checked: dict[str, Any] = mapping(_SOURCES[kind], required=required)(value, path, problems)
    if kind == "kafka" and isinstance(checked, dict) and ("topic" in checked) == ("topic_pattern" in checked):
        problems.append(
            f"{path}: expected one of topic (a topic name) or topic_pattern (a Java regular expression of topic "
            "names), received " + ("both" if "topic" in checked else "neither")
        )
    if kind == "kafka" and checked.get("value_format") == "json" and "schema" not in checked:
        problems.append(f"{path}.schema: required with value_format json (a DDL string such as 'id long, v string')")
    return checked


def _trigger(value: Any, path: str, problems: list[str]) -> Any:
    fields = {"processingTime": STRING, "availableNow": BOOL, "once": BOOL}
    checked = mapping(fields)(value, path, problems)
    if isinstance(checked, dict) and len(checked) > 1:
        problems.append(_problem(path, "one of processingTime, availableNow, once", value))
    return checked


_TOP = mapping(
    {
        "source": _source,
        "sink": _SINK,
        "checkpoint_location": STRING,
        "trigger": _trigger,
        "stop": mapping({"timeout_seconds": POSITIVE_NUMBER, "max_batches": POSITIVE_INT}),
        "query_name": STRING,
        "spark": mapping({"master": STRING, "app_name": STRING, "conf": scalar_map}),
    },
    required=("source", "sink", "checkpoint_location"),
    what="a mapping (the pipeline)",
)

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: Any, path: str, problems: list[str]) -> Any:
    """``${NAME}`` in strings replaced by environment variables; unset ones are problems."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{path}.{k}" if path else str(k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if isinstance(value, str):

        def env(match: re.Match[str]) -> str:
            name = match[1]
            if name not in os.environ:
                problems.append(f"{path}: environment variable {name} is not set (used as ${{{name}}})")
                return ""
            return os.environ[name]

        return _ENV.sub(env, value)
    return value


@attrs.frozen
class RunConfig:
    """A validated pipeline config. ``data`` holds the checked mapping with paths made absolute."""

    data: dict[str, Any]
    source_file: str

    @property
    def source(self) -> dict[str, Any]:
        return dict(self.data["source"])

    @property
    def sink(self) -> dict[str, Any]:
        return dict(self.data["sink"])

    @property
    def checkpoint_location(self) -> str:
        return str(self.data["checkpoint_location"])

    @property
    def trigger(self) -> dict[str, Any]:
        return dict(self.data.get("trigger") or {})

    @property
    def stop(self) -> dict[str, Any]:
        return dict(self.data.get("stop") or {})


def _absolute(value: str, base: Path) -> str:
    # A location with a scheme (file:/ck, Spark's spelling of a local folder) is read as Spark reads it.
    if is_uri(value) or os.path.isabs(value):
        return value
    return str((base / value).resolve())


def parse(text: str, source_file: str) -> RunConfig:
    """Parse and validate a config; raises :class:`ConfigError` listing every problem."""
    import yaml

    from iceberg_sink.cli import safeyaml

    try:
        raw = safeyaml.load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source_file, [f"not valid YAML{where}: {problem}"]) from None
    problems: list[str] = []
    expanded = _expand(raw, "", problems)
    data = _TOP(expanded, "", problems)
    if not problems:
        sink = data["sink"]
        if "embedded" in sink and "catalog" in sink:
            problems.append("sink: expected one of embedded or catalog, received both")
        if "upsert" in sink and "cdc" in sink:
            problems.append("sink: expected one of upsert or cdc, received both")
        if ("table" in sink) == ("route" in sink):
            problems.append(
                "sink: expected one of table (one table) or route (many tables), received "
                + ("both" if "table" in sink else "neither")
            )
    if problems:
        raise ConfigError(source_file, problems)
    base = Path(source_file).absolute().parent
    data["checkpoint_location"] = _absolute(data["checkpoint_location"], base)
    if "embedded" in data["sink"]:
        data["sink"]["embedded"] = _absolute(data["sink"]["embedded"], base)
    if data["source"]["type"] == "files":
        data["source"]["path"] = _absolute(data["source"]["path"], base)
    return RunConfig(data, source_file)


def load(path: str) -> RunConfig:
    """Read and validate a config file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidSinkConfigError(f"config file {path} cannot be read: {e}") from None
    return parse(text, path)


def build_sink(config: RunConfig) -> IcebergSink:
    """The sink the config's ``sink`` section describes (the builder validates the values)."""
    return sink_builder(config).build()


def validate_sink(config: RunConfig) -> None:
    """The builder's own checks of the ``sink`` section that need no catalog and no Spark
    (``run --validate-only``): unknown or bad write options, a table without namespace, a key
    missing a partition source, ... raise :class:`InvalidSinkConfigError` as ``build()`` would."""
    sink_builder(config).validate()


def sink_builder(config: RunConfig) -> IcebergSinkBuilder:
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
