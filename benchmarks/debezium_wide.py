"""What a Debezium micro-batch costs as its table gets wider: the first batch and the later ones.

For each width in ``--columns`` (one ``id`` and N-1 columns cycling through Connect's int32, int64,
string, Decimal, Date, MicroTimestamp, boolean and float64), a fresh Python process starts a
``local[2]`` SparkSession, builds an upsert sink (``.debezium(table_column=None)`` + ``.cdc(...)``,
embedded SQLite catalog, the table created by the first write) and writes ``--batches`` bounded
micro-batches of ``--events`` Debezium envelopes with the schema part, each a checkpoint.

Per width it reports the SparkSession's start, then per batch: the ``write()`` wall time (and the
sink's own ``phases_ms`` of it, docs/metrics.md), the Py4J
round trips it made (``GatewayClient.send_command`` counted; a count does not depend on the
machine's load), the driver's Python CPU seconds and the whole process tree's (driver, JVM, Python
workers), and the CPU other processes used meanwhile (benchmarks/cpu_monitor.py: the machine was
shared when it is large). ``end_to_end_s`` is from before the SparkSession's start to the end of the
first write; ``steady_s`` the median of the batches after the first.

    python -m benchmarks.debezium_wide --columns 4 80 160 --out benchmarks/results/debezium-wide.json

``--option KEY=VALUE`` (repeatable) sets a ``write_option`` of the sink in every width's process.
``--source`` says where the batches come from: bounded writes of Python rows (``rows``, the default,
which Spark cannot size) or of a text file per batch (``file``), or the micro-batches of one
streaming query over a Kafka topic (``kafka``, :func:`one_kafka`: the sink as deployed on Debezium).

``--alternate KEY=VALUE`` (with ``--source kafka``) compares one of the sink's small-batch settings
(``job/codegen.py`` ``SMALL_BATCH``) with another value inside one process: every other micro-batch
(the second, the fourth...) runs with ``KEY=VALUE`` instead of the sink's. Runs in fresh processes
differ by more than a setting worth 50 ms a micro-batch (the 160-column stream's steady median moved
between 0.42 and 0.62 s from one process to the next on the same code); two halves of one stream
share the JVM's warm-up, the machine's state and the topic. The report's ``alternate`` gives both
halves' medians over micro-batches 10 to the one before the last (the last one waits at the topic's
end).

Results: docs/benchmarks-debezium-wide.md (``--table`` prints result files as its table).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import driver_options

KINDS: list[tuple[dict[str, Any], Callable[[int], Any]]] = [
    ({"type": "int32"}, lambda i: i),
    ({"type": "int64"}, lambda i: i * 1000),
    ({"type": "string"}, lambda i: f"s{i}"),
    (
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        lambda i: base64.b64encode((i * 125).to_bytes(4, "big", signed=True)).decode(),
    ),
    ({"type": "int32", "name": "io.debezium.time.Date"}, lambda i: 19000 + i),
    ({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, lambda i: 1_700_000_000_000_000 + i),
    ({"type": "boolean"}, lambda i: i % 2 == 0),
    ({"type": "double"}, lambda i: i / 3),
]


def envelopes(columns: int, batch: int, events: int) -> list[str]:
    """``events`` Debezium envelopes of batch ``batch``: creates in the first batch, updates of the
    same keys later, each with a growing lsn."""
    fields: list[dict[str, Any]] = [{"type": "int64", "optional": False, "field": "id"}]
    values = []
    for c in range(columns - 1):
        kind, value = KINDS[c % len(KINDS)]
        fields.append({**kind, "optional": True, "field": f"c{c}"})
        values.append((f"c{c}", value))
    row = {"type": "struct", "fields": fields, "optional": True}
    schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
    out = []
    for i in range(events):
        lsn = batch * events + i + 1
        after = {"id": i, **{name: value(i + lsn) for name, value in values}}
        payload = {
            "before": None,
            "after": after,
            "op": "c" if batch == 0 else "u",
            "source": {"db": "d", "schema": "s", "table": "t", "lsn": lsn},
        }
        out.append(json.dumps({"schema": schema, "payload": payload}))
    return out


def session(jfr: str | None, jars: list[str] | None, driver_jvm: str, scratch: Path) -> Any:
    """The width's ``local[2]`` SparkSession (``jfr``: recorded there; ``jars``: on ``spark.jars``;
    ``driver_jvm``: its JVM's options, benchmarks/driver_options.py, ``scratch`` the run's folder)."""
    from pyspark.sql import SparkSession

    from benchmarks.jvm_profile import JFR_OPTIONS

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    options = driver_options.java_options(driver_jvm, scratch)
    if jfr is not None:
        options = f"{options} {JFR_OPTIONS.format(path=jfr)}".strip()
    if options:
        builder = builder.config("spark.driver.extraJavaOptions", options)
    return builder.getOrCreate()


def wide_sink(lake: Path, write_options: dict[str, str] | None) -> Any:
    """The upsert sink of every width: ``.debezium(table_column=None)`` + ``.cdc(...)`` into ``db.wide``
    of an embedded catalog in ``lake``, created by the first write."""
    from iceberg_sink import IcebergSink

    builder = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.wide")
        .create_if_missing(format_version=2)  # as docs/benchmarks-debezium-wide.md measured it (v3: the CDC default)
        .debezium(table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
    )
    for key, value in (write_options or {}).items():
        builder = builder.write_option(key, value)
    return builder.build()


def one(
    columns: int,
    batches: int,
    events: int,
    jfr: str | None = None,
    write_options: dict[str, str] | None = None,
    source: str = "rows",
    driver_jvm: str = "sink",
) -> dict[str, Any]:
    """One width in this process (a fresh one: ``--one``); ``jfr``: record the JVM there
    (benchmarks/jvm_profile.py reads it); ``write_options``: the sink's ``write_option``s;
    ``source``: each batch a DataFrame of Python rows (``rows``: Spark has no size estimate of it)
    or read from a text file of its events (``file``: sized, as Spark's file sources and the sink's
    Kafka micro-batches are)."""
    from py4j.java_gateway import GatewayClient

    from benchmarks.cpu_monitor import ForeignCpuMonitor, tree_cpu_seconds

    monitor = ForeignCpuMonitor(interval=0.5).start()
    calls = 0
    send = GatewayClient.send_command

    def counted(client: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return send(client, *args, **kwargs)

    GatewayClient.send_command = counted  # type: ignore[method-assign]
    lake = Path(tempfile.mkdtemp(prefix="debezium-wide-"))
    started = time.time()
    spark = session(jfr, None, driver_jvm, lake)
    spark_start = time.time() - started
    sink = wide_sink(lake, write_options)
    rows = []
    for b in range(batches):
        if source == "file":  # written before the timed window, as a Kafka topic holds its events
            path = lake / "input" / f"batch-{b}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text("".join(v + "\n" for v in envelopes(columns, b, events)))
            df = spark.read.text(str(path))
        else:
            df = spark.createDataFrame([(v,) for v in envelopes(columns, b, events)], "value string")
        calls, cpu, tree, begin = 0, time.process_time(), tree_cpu_seconds(), time.time()
        sink.write(df, checkpoint_location=str(lake / "checkpoint"))
        end = time.time()
        after = tree_cpu_seconds()
        rows.append(
            {
                "batch": b,
                "write_s": round(end - begin, 3),
                "py4j_calls": calls,
                "driver_python_cpu_s": round(time.process_time() - cpu, 3),
                "process_tree_cpu_s": round(after - tree, 3) if after is not None and tree is not None else None,
                "foreign_cpu_s": monitor.between(begin, end),
                "phases_ms": (sink.last_progress() or {}).get("phases_ms"),
            }
        )
    snapshots = len(sink.load_table().snapshots())  # one per checkpoint: each batch was committed
    monitor.stop()
    spark.stop()
    later = [r["write_s"] for r in rows[1:]]
    return {
        "columns": columns,
        "source": source,
        "events_per_batch": events,
        "driver_jvm": driver_jvm,
        "spark_start_s": round(spark_start, 3),
        "end_to_end_s": round(spark_start + rows[0]["write_s"], 3),
        "first_write_s": rows[0]["write_s"],
        "steady_s": round(statistics.median(later), 3) if later else None,
        "batches": rows,
        "snapshots": snapshots,
    }


def alternating(setting: str, value: str) -> list[bool]:
    """Make every other micro-batch of this process (the second, the fourth...) run with Spark setting
    ``setting`` = ``value`` instead of the sink's small-batch value (``--alternate``); the returned list
    gets, per micro-batch in order, whether it did. ``setting`` must be one the sink sets and puts back
    (``codegen.SMALL_BATCH``), so a batch's value never leaks into the next one."""
    from iceberg_sink.job import codegen

    if setting not in codegen.SMALL_BATCH:
        raise SystemExit(f"--alternate: expected one of {sorted(codegen.SMALL_BATCH)}, received {setting!r}")
    marks: list[bool] = []
    sized, apply = codegen.sized, codegen._Sized.apply

    @contextmanager
    def sized_alternating(df: Any, max_rows: int) -> Iterator[bool]:
        if codegen._SIZED.get() is None:  # a micro-batch's own block, not one nested in it
            marks.append(len(marks) % 2 == 1)
        with sized(df, max_rows) as small:
            yield small

    def apply_alternating(self: Any) -> None:
        apply(self)
        if marks and marks[-1]:
            self.conf.set(setting, value)

    codegen.sized = sized_alternating  # type: ignore[assignment]
    codegen._Sized.apply = apply_alternating  # type: ignore[method-assign]
    return marks


def alternated_halves(rows: list[dict[str, Any]], setting: str, value: str) -> dict[str, Any]:
    """Both halves of an ``--alternate`` run: medians of micro-batches 10 to the one before the last."""
    middle = rows[10:-1]

    def half(changed: bool) -> dict[str, Any]:
        picked = [r for r in middle if r["alternated"] is changed]
        medians = {
            "trigger_s": [r["write_s"] for r in picked],
            "add_batch_s": [r["add_batch_s"] for r in picked],
            "write_phase_ms": [r["phases_ms"]["write"] for r in picked],
            "build_phase_ms": [r["phases_ms"]["build"] for r in picked],
        }
        return {
            "micro_batches": len(picked),
            **{k: round(statistics.median(v), 4) if v else None for k, v in medians.items()},
        }

    return {"setting": setting, "value": value, "sinks": half(False), "alternated": half(True)}


def one_kafka(
    columns: int,
    batches: int,
    events: int,
    jfr: str | None = None,
    write_options: dict[str, str] | None = None,
    alternate: tuple[str, str] | None = None,
    driver_jvm: str = "sink",
) -> dict[str, Any]:
    """One width as a stream: the sink deployed on Kafka (``--source kafka``).

    A Kafka broker (``scripts/pipeline_components.py``, its jars from Maven Central) holds the
    ``batches`` x ``events`` envelopes on one partition, produced before anything is timed; one
    ``sink.start`` query reads them with Spark's Kafka source, ``maxOffsetsPerTrigger`` = ``events``,
    so each micro-batch is one batch of :func:`envelopes`. Per micro-batch: Spark's
    ``triggerExecution`` (the whole micro-batch: offset and commit logs, planning, the sink) and
    ``addBatch`` (the sink's ``foreachBatch``), the sink's ``phases_ms`` and whether its write job ran
    without generated code. CPU: the process tree's (driver, JVM, Python workers) over the stream,
    the broker's left out."""
    from benchmarks import cdc_kafka
    from benchmarks.cpu_monitor import ForeignCpuMonitor, tree_cpu_seconds

    lake = Path(tempfile.mkdtemp(prefix="debezium-wide-"))
    broker = cdc_kafka.components().KafkaBroker(lake / "kafka")
    broker.start()
    try:
        broker_pid = int(broker.process.pid())
        messages = (
            f"{json.dumps({'id': json.loads(value)['payload']['after']['id']})}\t{value}"
            for b in range(batches)
            for value in envelopes(columns, b, events)
        )
        cdc_kafka.filled_topic(broker, "wide", messages, lake / "messages.txt")
        jars = cdc_kafka.spark_kafka_jars()
        monitor = ForeignCpuMonitor(interval=0.5).start()
        monitor.adopt(broker_pid)
        started = time.time()
        spark = session(jfr, jars, driver_jvm, lake)
        spark_start = time.time() - started
        sink = wide_sink(lake, write_options)
        marks = alternating(*alternate) if alternate is not None else None
        stream = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", "wide")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(events))
            .load()
        )
        tree = tree_cpu_seconds(without=broker_pid)
        begin = time.time()
        query = sink.start(stream, checkpoint_location=str(lake / "checkpoint"), trigger={"availableNow": True})
        query.awaitTermination()
        end = time.time()
        after = tree_cpu_seconds(without=broker_pid)
        if query.exception() is not None:
            raise RuntimeError(f"the stream failed: {query.exception()}")
        records = {int(r["checkpoint_id"]): r for r in sink.progress()}
        rows = []
        for progress in query.recentProgress:
            batch_id, durations = int(progress.batchId), dict(progress.durationMs)
            record = records.get(batch_id, {})
            rows.append(
                {
                    "batch": batch_id,
                    "input_rows": int(progress.numInputRows),
                    "write_s": round(durations.get("triggerExecution", 0) / 1000, 3),
                    "add_batch_s": round(durations.get("addBatch", 0) / 1000, 3),
                    "phases_ms": record.get("phases_ms"),
                    "interpreted": record.get("interpreted"),
                    "status": record.get("status"),
                }
            )
        snapshots = len(sink.load_table().snapshots())
        monitor.stop()
        spark.stop()
    finally:
        broker.stop()
    if len(rows) != batches or any(r["status"] != "committed" for r in rows):
        raise RuntimeError(f"expected {batches} committed micro-batches of {events} events: {rows}")
    if marks is not None:
        if len(marks) != batches:
            raise RuntimeError(f"--alternate: {len(marks)} micro-batch blocks for {batches} micro-batches")
        for row, mark in zip(rows, marks, strict=True):
            row["alternated"] = mark
    later = rows[1:]
    cpu = after - tree if after is not None and tree is not None else None
    return {
        "columns": columns,
        "source": "kafka",
        "events_per_batch": events,
        "driver_jvm": driver_jvm,
        "spark_start_s": round(spark_start, 3),
        "end_to_end_s": round(spark_start + rows[0]["write_s"], 3),
        "first_write_s": rows[0]["write_s"],
        "steady_s": round(statistics.median(r["write_s"] for r in later), 3) if later else None,
        "steady_add_batch_s": round(statistics.median(r["add_batch_s"] for r in later), 3) if later else None,
        "stream_s": round(end - begin, 3),
        "process_tree_cpu_s_per_batch": round(cpu / batches, 3) if cpu is not None else None,
        "foreign_cpu_s": monitor.between(begin, end),
        "batches": rows,
        "snapshots": snapshots,
        **({"alternate": alternated_halves(rows, *alternate)} if alternate is not None else {}),
    }


def table(paths: list[str]) -> str:
    """A Markdown table of result files (the rows of docs/benchmarks-debezium-wide.md)."""
    lines = [
        "| run | columns | Spark start (s) | first write (s) | end to end (s) | steady write, median (s) "
        "| Py4J calls, first / later | process tree CPU-s, first / later median | others' CPU-s per batch (max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        report = json.loads(Path(path).read_text())
        for w in report["widths"]:
            later = w["batches"][1:]
            cpu = statistics.median(b["process_tree_cpu_s"] for b in later) if later else None
            foreign = max((b["foreign_cpu_s"] or 0.0) for b in w["batches"])
            lines.append(
                f"| {Path(path).stem} | {w['columns']} | {w['spark_start_s']:.1f} | {w['first_write_s']:.1f} | "
                f"{w['end_to_end_s']:.1f} | {w['steady_s']:.2f} | {w['batches'][0]['py4j_calls']:,} / "
                f"{statistics.median(b['py4j_calls'] for b in later):,.0f} | "
                f"{w['batches'][0]['process_tree_cpu_s']:.1f} / {cpu:.1f} | {foreign:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--columns", type=int, nargs="+", default=[4, 80, 160])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--one", type=int, help="run one width in this process (used by the orchestration)")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument(
        "--jfr",
        metavar="PREFIX",
        help="record each width's JVM with Java Flight Recorder into PREFIX-<columns>.jfr "
        "(python -m benchmarks.jvm_profile reads it)",
    )
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="a write_option of the sink (repeatable)"
    )
    parser.add_argument(
        "--source",
        choices=["rows", "file", "kafka"],
        default="rows",
        help="each batch a bounded write of Python rows (no size estimate) or of a text file of its events "
        "(sized), or a micro-batch of one streaming query over a Kafka topic (one_kafka)",
    )
    parser.add_argument(
        "--alternate",
        metavar="KEY=VALUE",
        help="with --source kafka: every other micro-batch runs with this small-batch Spark setting instead of "
        "the sink's (job/codegen.py SMALL_BATCH); both halves are reported",
    )
    driver_options.add_argument(parser)
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print result files as a Markdown table")
    args = parser.parse_args(argv)
    if args.alternate and (args.source != "kafka" or "=" not in args.alternate):
        parser.error("--alternate takes KEY=VALUE and needs --source kafka")
    if args.table:
        print(table(args.table))
        return 0
    if args.one is not None:
        jfr = f"{args.jfr}-{args.one}.jfr" if args.jfr else None
        options = dict(o.split("=", 1) for o in args.option)
        if args.source == "kafka":
            alternate = tuple(args.alternate.split("=", 1)) if args.alternate else None
            result = one_kafka(args.one, args.batches, args.events, jfr, options, alternate, args.driver_jvm)  # type: ignore[arg-type]
        else:
            result = one(args.one, args.batches, args.events, jfr, options, args.source, args.driver_jvm)
        print(json.dumps(result))
        return 0
    results = []
    for columns in args.columns:
        command = [sys.executable, "-m", "benchmarks.debezium_wide", "--one", str(columns)]
        command += ["--batches", str(args.batches), "--events", str(args.events)]
        command += ["--jfr", args.jfr] if args.jfr else []
        command += [f"--option={o}" for o in args.option]
        command += ["--source", args.source]
        command += ["--alternate", args.alternate] if args.alternate else []
        command += ["--driver-jvm", args.driver_jvm]
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"width {columns} failed (exit {done.returncode})")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    report = {
        "benchmark": "debezium_wide",
        "write_options": dict(o.split("=", 1) for o in args.option),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "widths": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
