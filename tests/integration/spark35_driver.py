"""Runs the sink end to end on whatever PySpark the interpreter has (meant for the Spark 3.5 venv).

    <java venv>/bin/python -m tests.integration.spark35_driver WORK_DIR [--kafka HOST:PORT --jars A.jar,B.jar]

In ``WORK_DIR`` it creates a SQLite catalog and a warehouse, then:

(a) ``sink.write(df)`` of :func:`bounded_rows` (long/string/double/timestamp/decimal/date columns)
    into ``db.bounded``, partitioned by ``day(ts), bucket(4, user_id)``;
(b) a file stream over :data:`SOURCE_FILES` Parquet files (``maxFilesPerTrigger=1``, trigger
    ``availableNow``) into ``db.streamed``, partitioned by ``day(ts)``;
(c) with ``--kafka``: Spark's Kafka source (``--jars``: ``spark-sql-kafka-0-10_2.12`` of this Spark
    and its dependencies, on ``spark.jars``) over :data:`KAFKA_TOPIC`, whose JSON values the test
    produced (:func:`kafka_records`), parsed and upserted by ``id${x}`` (:data:`KAFKA_KEY`) into ``db.from_kafka`` (trigger
    ``availableNow``); the commit records the Kafka offsets in its snapshot summary;
(d) Debezium envelopes (:func:`debezium_events`: creates, an update and a delete, one envelope whose
    ``payload`` key repeats, and :data:`DEBEZIUM_GARBAGE`, values that are no event) read by
    ``read_envelope(rejects="mark")`` (the refusals' reasons) and the events written by a
    ``.debezium(...).cdc(...)`` sink into ``db.from_debezium``: Spark 3.5 has no Arrow UDFs, so Spark's
    expressions read every row image.

The session time zone is Asia/Kolkata (UTC+5:30), so a transform or cast that uses local time
instead of UTC puts rows in the wrong partition. Each step runs even if another failed; the
result, with each step's traceback, is written to ``WORK_DIR/result.json`` (see :func:`main`).
The exit code is 0 only if every step succeeded (without ``--kafka``, step (c) is not run).

Expected rows come from Python (:func:`bounded_rows`, ``tests.integration.sources.event_batch``),
never from Spark: Spark 3.5 has no ``DataFrame.toArrow()``. This module imports PySpark only in
:func:`main`, so the test (another venv) can import the data generators.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import traceback
from decimal import Decimal
from pathlib import Path
from typing import Any

SESSION_TZ = "Asia/Kolkata"
BOUNDED_TABLE = "db.bounded"
BOUNDED_PARTITION_BY = ("day(ts)", "bucket(4, user_id)")
BOUNDED_ROWS = 240
STREAMED_TABLE = "db.streamed"
STREAMED_PARTITION_BY = ("day(ts)",)
SOURCE_FILES = 4
ROWS_PER_FILE = 30
KAFKA_TABLE = "db.from_kafka"
KAFKA_TOPIC = "spark35-orders"
KAFKA_PARTITIONS = 2
# The key's name holds ${x}, which Spark would substitute in SQL text (reading it as "id"): a decoy
# column "id" holds 0 in every record, so a key read from it would leave one row.
KAFKA_KEY = "id${x}"
KAFKA_VALUE_DDL = "`id${x}` long, id long, item string, qty int"
DEBEZIUM_TABLE = "db.from_debezium"
# Values that are no Debezium event, and the reason each is refused with.
DEBEZIUM_GARBAGE = {'{"payload": {"op": "c"': "value is not JSON", "[1, 2]": "value is not a JSON object"}
CHECKPOINT_KEY = "iceberg-sink.checkpoint-id"
RESULT_FILE = "result.json"
STREAM_TIMEOUT_S = 600

# Spark DDL of the bounded DataFrame, and the same columns as an Arrow schema for the expectation.
BOUNDED_COLUMNS = ("id", "user_id", "name", "score", "ts", "amount", "d")
BOUNDED_SCHEMA_DDL = "id long, user_id long, name string, score double, ts timestamp, amount decimal(12,3), d date"

# Instants next to midnight in UTC and in Asia/Kolkata (18:30 UTC), before the epoch, and with
# microseconds, where a local-time or truncate-toward-zero day transform goes wrong.
_EDGE_TIMESTAMPS = (
    dt.datetime(2024, 3, 9, 18, 29, 59, 999_999, tzinfo=dt.UTC),
    dt.datetime(2024, 3, 9, 18, 30, 0, tzinfo=dt.UTC),
    dt.datetime(2024, 3, 9, 23, 59, 59, 999_999, tzinfo=dt.UTC),
    dt.datetime(2024, 3, 10, 0, 0, 0, tzinfo=dt.UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC),
    dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
)


def bounded_rows(n: int = BOUNDED_ROWS) -> list[dict[str, Any]]:
    """The bounded DataFrame's rows, deterministic, with nulls, NaN, -0.0, non-ASCII text,
    negative decimals and timestamps/dates on both sides of the epoch and of midnight."""
    base = dt.datetime(2024, 3, 8, 12, 0, tzinfo=dt.UTC)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        if i < len(_EDGE_TIMESTAMPS):
            ts: dt.datetime | None = _EDGE_TIMESTAMPS[i]
        elif i % 41 == 0:
            ts = None
        else:
            ts = base + dt.timedelta(minutes=37 * i, microseconds=i)
        score: float | None
        if i % 17 == 0:
            score = float("nan")
        elif i % 19 == 0:
            score = None
        elif i % 23 == 0:
            score = -0.0
        else:
            score = i * 1.25 - 100
        rows.append(
            {
                "id": i,
                "user_id": None if i % 29 == 0 else (i * 7) % 53 - 5,
                "name": None if i % 11 == 0 else ("naïve-ü-" if i % 5 == 0 else "user-") + str(i % 13),
                "score": score,
                "ts": ts,
                "amount": None if i % 31 == 0 else Decimal(i * 1_234 - 150_000).scaleb(-3),
                "d": dt.date(1969, 12, 25) + dt.timedelta(days=i * 3) if i % 37 else None,
            }
        )
    return rows


def kafka_records() -> list[tuple[str, str]]:
    """The ``(key, JSON value)`` records the test produces to :data:`KAFKA_TOPIC`: ids 0-15, then new
    values for ids 4-11. Keyed by id, so a key's records share a partition and arrive in order, and
    the one micro-batch holds several records of a key (the last one wins)."""
    first = [{KAFKA_KEY: i, "id": 0, "item": f"item-{i}", "qty": i * 10} for i in range(16)]
    second = [{KAFKA_KEY: i, "id": 0, "item": f"item-{i}-v2", "qty": -i} for i in range(4, 12)]
    return [(str(r[KAFKA_KEY]), json.dumps(r)) for r in first + second]


def kafka_expected_rows() -> list[dict[str, Any]]:
    """The table after the upsert: the last value of each id, by id."""
    last = {r[KAFKA_KEY]: r for r in (json.loads(value) for _, value in kafka_records())}
    return [last[i] for i in sorted(last)]


def debezium_events() -> list[str]:
    """Envelopes as Kafka Connect's JsonConverter writes PostgreSQL's (with the schema part): ids 1-3
    created, 1 updated, 3 deleted; the second envelope names ``payload`` twice, and its first one
    (``b``) is the event (``get_json_object``'s reading, sources/envelope.py)."""
    fields = [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "name"},
        # Logical types, converted by Spark's expressions here (sources/connect_types.py).
        {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "field": "price",
        },
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "field": "at"},
    ]
    row = {"type": "struct", "fields": fields, "optional": True, "name": "pg.public.items.Value"}
    schema = {
        "type": "struct",
        "name": "pg.public.items.Envelope",
        "optional": False,
        "fields": [{**row, "field": "before"}, {**row, "field": "after"}, {"type": "string", "field": "op"}],
    }

    def event(op: str, lsn: int, before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
        if after is not None:  # 12.50 (unscaled 1250, big-endian, base64), 2022-01-08, 2023-11-14 22:13:20.000001
            after = {**after, "price": "BOI=", "day": 19_000, "at": 1_700_000_000_000_001}
        source = {"db": "shop", "schema": "public", "table": "items", "lsn": lsn}
        payload = {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000, "source": source}
        return json.dumps({"schema": schema, "payload": payload})

    second = json.loads(event("c", 2, None, {"id": 2, "name": "second"}))["payload"]
    repeated = event("c", 2, None, {"id": 2, "name": "b"})[:-1] + f', "payload": {json.dumps(second)}}}'
    return [
        event("c", 1, None, {"id": 1, "name": "a"}),
        repeated,
        event("c", 3, None, {"id": 3, "name": "c"}),
        event("u", 4, {"id": 1, "name": "a"}, {"id": 1, "name": "a2"}),
        event("d", 5, {"id": 3, "name": "c"}, None),
    ]


def debezium_expected_rows() -> list[dict[str, Any]]:
    logical = {"price": Decimal("12.50"), "day": dt.date(2022, 1, 8), "at": dt.datetime(2023, 11, 14, 22, 13, 20, 1)}
    return [{"id": 1, "name": "a2", **logical}, {"id": 2, "name": "b", **logical}]


def bounded_arrow_schema() -> Any:
    """The Arrow schema the bounded rows are read back with (timestamp -> timestamptz in UTC)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.int64()),
            ("user_id", pa.int64()),
            ("name", pa.string()),
            ("score", pa.float64()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("amount", pa.decimal128(12, 3)),
            ("d", pa.date32()),
        ]
    )


def _snapshot_summaries(table: Any) -> list[dict[str, Any]]:
    """Each snapshot's id, parent and summary (``operation`` and every property), oldest first."""
    return [
        {
            "snapshot_id": s.snapshot_id,
            "parent_snapshot_id": s.parent_snapshot_id,
            "summary": {} if s.summary is None else s.summary.model_dump(),
        }
        for s in table.snapshots()
    ]


def _await_available_now(query: Any) -> None:
    """Wait for an ``availableNow`` query to end; raise its error, or TimeoutError."""
    query.awaitTermination(STREAM_TIMEOUT_S)
    if query.isActive:
        query.stop()
        raise TimeoutError(f"the availableNow query did not finish in {STREAM_TIMEOUT_S} s")
    error = query.exception()
    if error is not None:
        raise error


def _run_step(name: str, result: dict[str, Any], step: Any) -> None:
    started = time.monotonic()
    try:
        result[name] = {"ok": True, **step()}
    except BaseException:
        result[name] = {"ok": False, "error": traceback.format_exc()}
        sys.stderr.write(f"step {name} failed:\n{result[name]['error']}\n")
    result[name]["seconds"] = round(time.monotonic() - started, 2)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.integration.spark35_driver")
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--kafka", default=None, help="bootstrap address of a broker holding KAFKA_TOPIC")
    parser.add_argument("--jars", default="", help="spark.jars: Spark's Kafka source for this Spark")
    args = parser.parse_args(argv)
    if args.kafka and not args.jars:
        parser.error("--kafka needs --jars (Spark's Kafka source)")
    return args


def main(argv: list[str]) -> int:
    """Run the steps in the work dir and write ``result.json`` there:

    ``{"pyspark_version", "spark_version", "python", "session_tz",
       "bounded": {"ok", "seconds", "metadata_location", "rows_written", "rows_in_table", "snapshots", ...},
       "streamed": {..., "checkpoint_ids": ["0", "1", ...]},
       "kafka": {"ok", "seconds", "metadata_location", "rows_in_table", "snapshots"}}``

    where ``snapshots`` is ``[{"snapshot_id", "parent_snapshot_id", "summary": {...}}, ...]``
    (``kafka`` only with ``--kafka``).

    A failed step has ``"ok": false`` and ``"error"`` (the traceback) instead.
    """
    args = _parse_args(argv)
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    # Python workers must run this interpreter (the venv with this PySpark and iceberg_sink).
    os.environ["PYSPARK_PYTHON"] = sys.executable

    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from iceberg_sink import IcebergSink
    from tests.integration.sources import EVENT_SCHEMA_DDL, write_source_files

    warehouse = work / "warehouse"
    warehouse.mkdir(exist_ok=True)
    catalog: dict[str, str] = {
        "type": "sql",
        "uri": f"sqlite:///{work / 'catalog.db'}",
        "warehouse": warehouse.as_uri(),
    }

    builder = SparkSession.builder
    if args.jars:
        builder = builder.config("spark.jars", args.jars)
    spark = (
        builder.master("local[2]")
        .appName("iceberg_sink-spark35-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", SESSION_TZ)
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {
        "pyspark_version": pyspark.__version__,
        "spark_version": spark.version,
        "python": sys.executable,
        "session_tz": spark.conf.get("spark.sql.session.timeZone"),
    }

    def bounded() -> dict[str, Any]:
        rows = bounded_rows()
        df = spark.createDataFrame([tuple(r[c] for c in BOUNDED_COLUMNS) for r in rows], BOUNDED_SCHEMA_DDL)
        sink = (
            IcebergSink.builder()
            .catalog("spark35", **catalog)
            .table(BOUNDED_TABLE)
            .create_if_missing(partition_by=list(BOUNDED_PARTITION_BY))
            .build()
        )
        outcome = sink.write(df)
        table = sink.load_table()
        return {
            "metadata_location": table.metadata_location,
            "rows_written": len(rows),
            "outcome_checkpoint_id": None if outcome is None else outcome.checkpoint_id,
            "outcome_snapshot_id": None
            if outcome is None or outcome.snapshot is None
            else outcome.snapshot.snapshot_id,
            "rows_in_table": table.scan().to_arrow().num_rows,
            "snapshots": _snapshot_summaries(table),
        }

    def streamed() -> dict[str, Any]:
        source = work / "source"
        write_source_files(source, files=SOURCE_FILES, rows_per_file=ROWS_PER_FILE)
        sink = (
            IcebergSink.builder()
            .catalog("spark35", **catalog)
            .table(STREAMED_TABLE)
            .create_if_missing(partition_by=list(STREAMED_PARTITION_BY))
            .build()
        )
        df = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
        query = sink.start(df, str(work / "checkpoint"), trigger={"availableNow": True}, query_name="spark35")
        _await_available_now(query)
        table = sink.load_table()
        snapshots = _snapshot_summaries(table)
        return {
            "metadata_location": table.metadata_location,
            "rows_written": SOURCE_FILES * ROWS_PER_FILE,
            "rows_in_table": table.scan().to_arrow().num_rows,
            "snapshots": snapshots,
            "checkpoint_ids": [s["summary"].get(CHECKPOINT_KEY) for s in snapshots],
        }

    def kafka() -> dict[str, Any]:
        sink = (
            IcebergSink.builder()
            .catalog("spark35", **catalog)
            .table(KAFKA_TABLE)
            .create_if_missing()
            .upsert(key=[KAFKA_KEY])
            .build()
        )
        records = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", args.kafka)
            .option("subscribe", KAFKA_TOPIC)
            .option("startingOffsets", "earliest")
            .load()
        )
        df = records.select(F.from_json(F.col("value").cast("string"), KAFKA_VALUE_DDL).alias("v")).select("v.*")
        query = sink.start(df, str(work / "kafka-checkpoint"), trigger={"availableNow": True}, query_name="kafka")
        _await_available_now(query)
        table = sink.load_table()
        return {
            "metadata_location": table.metadata_location,
            "rows_in_table": table.scan().to_arrow().num_rows,
            "snapshots": _snapshot_summaries(table),
        }

    def debezium() -> dict[str, Any]:
        from iceberg_sink.sources.debezium import read_envelope
        from iceberg_sink.vocab.columns import REJECT_COLUMN

        events = debezium_events()
        values = [*events, *DEBEZIUM_GARBAGE]
        df = spark.createDataFrame(
            [("items", 0, i, v) for i, v in enumerate(values)],
            "topic string, partition int, offset long, value string",
        )
        marked = read_envelope(df, rejects="mark", table_column=None)
        refusals = marked.where(F.col(REJECT_COLUMN).isNotNull()).select(REJECT_COLUMN).collect()
        sink = (
            IcebergSink.builder()
            .catalog("spark35", **catalog)
            .table(DEBEZIUM_TABLE)
            .create_if_missing()
            .debezium(value_column="value", table_column=None)
            .cdc(op_column="op", key=["id"], order_by="lsn")
            .build()
        )
        sink.write(df.where(F.col("offset") < len(events)))
        return {
            "metadata_location": sink.load_table().metadata_location,
            "refused": {str(r[0]["offset"]): r[0]["reason"] for r in refusals},
        }

    steps = {
        "bounded": bounded,
        "streamed": streamed,
        "debezium": debezium,
        **({"kafka": kafka} if args.kafka else {}),
    }
    try:
        for name, step in steps.items():
            _run_step(name, result, step)
    finally:
        (work / RESULT_FILE).write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
        spark.stop()
    return 0 if all(result[name]["ok"] for name in steps) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
