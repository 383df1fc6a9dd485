"""The CDC race on one Kafka topic for both systems (issue 41, target 1): the broker, the topic, the
messages, and the parts of each driver's spec and result that come from them.

``benchmarks.cdc --systems iceberg_sink_kafka,flink_kafka`` (``_v3`` for format v3 tables) starts one
Apache Kafka broker (KRaft, one node, 127.0.0.1, ``scripts/pipeline_components.py``: its jars from
Maven Central through the project's cache) in the scratch directory before each system that reads it
(a fresh broker per system: ``--kafka-shared-broker`` starts one for all, before the first), and:

1. creates one topic of ``--kafka-partitions`` partitions (default 2);
2. writes the change stream of ``benchmarks/cdc_data.py`` (every batch's rows, batch after batch, in
   each batch's file order: the rows the file race reads) as JSON messages keyed by ``id`` (the key's
   text), e.g. ``{"id":7,"name":"user-7-v3","version":3,"amount":12.5,"ts":"2024-02-01T10:00:00.123456Z"}``,
   and produces them with Kafka's console producer (the broker's own jars; idempotent, ``acks=all``).
   Kafka's default partitioner hashes the key, so every change of one id is in one partition, in
   stream order; across the partitions there is no order;
3. checks that the topic's end offsets add up to the number of changes.

None of this is timed for either system, and each gets the same: a broker that has served no one
(with one broker for both, the system that ran first paid the broker's JIT compiling its fetch path,
1.9 of the broker's 5.8 CPU-s in a 43 s window of session 59's race, and the second found it warm). Then each system, in a fresh
process of its own, loads the initial rows as in the file race and reads the whole topic from its
earliest offsets in one streaming query (``benchmarks/sink_driver.py``: Spark's Kafka source,
``maxOffsetsPerTrigger`` = ``--kafka-max-offsets-per-trigger``, ``from_json``, ``.upsert(key=["id"],
order_by="version")``) or one streaming job (``benchmarks/flink_driver.py`` with
``benchmarks/flink_kafka.py``: Flink's Kafka SQL connector, the ``json`` format, bounded at the
latest offsets, committing per checkpoint). The broker is stopped after its system's run.

Its CPU is no system's own: each driver counts it as the benchmark's (not "other processes") and
reports the broker's CPU-seconds during its stream beside its own (``broker_cpu_seconds``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from iceberg_sink.sources import kafka_source

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TOPIC = "cdc-changes"
DEFAULT_PARTITIONS = 2
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 10_000
PRODUCE_TIMEOUT_S = 1800.0


def log(message: str) -> None:
    print(f"[cdc-kafka {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def components() -> ModuleType:
    """scripts/pipeline_components.py (scripts/ is not a package), loaded once as the tests load it."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    from tests import scripts

    return scripts.load("pipeline_components.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-max-offsets-per-trigger",
        type=int,
        default=DEFAULT_MAX_OFFSETS_PER_TRIGGER,
        help="iceberg_sink_kafka: Spark's maxOffsetsPerTrigger, the micro-batch size in changes (default 10000)",
    )
    parser.add_argument(
        "--kafka-partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="the _kafka systems: partitions of the change topic (default 2)",
    )
    parser.add_argument(
        "--kafka-source-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="iceberg_sink_kafka: an option of Spark's Kafka source (repeatable); by default the source has "
        "what the guides set (iceberg_sink.sources.kafka_source.RECOMMENDED: kafka.fetch.max.wait.ms=10, "
        "kafka.max.poll.records=20000), e.g. kafka.max.poll.records=500 measures Kafka's default",
    )
    parser.add_argument(
        "--kafka-shared-broker",
        action="store_true",
        help="one broker and topic for every _kafka system, produced before the first (the harness before "
        "session 60; the first system pays the broker's warm-up); default: a fresh broker per system",
    )


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """The sink's Kafka source options: what the guides set, with ``--kafka-source-option`` over them."""
    return {**kafka_source.RECOMMENDED, **dict(option.split("=", 1) for option in args.kafka_source_option)}


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if any("=" not in option for option in args.kafka_source_option):
        parser.error(f"--kafka-source-option: expected KEY=VALUE, received {args.kafka_source_option}")
    if args.kafka_max_offsets_per_trigger < 1 or args.kafka_partitions < 1:
        parser.error(
            "--kafka-max-offsets-per-trigger and --kafka-partitions: expected >= 1, received "
            f"{args.kafka_max_offsets_per_trigger} and {args.kafka_partitions}"
        )


def message_lines(path: Path) -> list[str]:
    """One batch file's rows as ``key<TAB>value`` lines for the console producer: the key is the id's
    text, the value one JSON object of the five columns (``ts`` in ISO-8601 UTC with microseconds and
    a ``Z``; ``amount`` in the shortest text that reads back as the same double)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    text = {name: pc.cast(table.column(name), pa.string()) for name in ("id", "version", "amount")}
    ts = pc.strftime(table.column("ts"), format="%Y-%m-%dT%H:%M:%SZ")  # %S holds the microseconds
    values = pc.binary_join_element_wise(
        '{"id":',
        text["id"],
        ',"name":"',
        table.column("name"),
        '","version":',
        text["version"],
        ',"amount":',
        text["amount"],
        ',"ts":"',
        ts,
        '"}',
        "",
    )
    lines = pc.binary_join_element_wise(text["id"], values, "\t")
    if lines.null_count:
        raise ValueError(f"{path}: a row with a null column cannot be written as a message")
    return lines.to_pylist()  # type: ignore[no-any-return]


def check_messages(path: Path, lines: list[str], rows: int = 200) -> None:
    """The first ``rows`` messages of a batch read back as JSON equal the file's rows (exact doubles,
    the timestamp to the microsecond): what both systems parse is what the model expects."""
    import datetime as dt
    import json

    import pyarrow.parquet as pq

    table = pq.read_table(path).slice(0, rows).to_pylist()
    for line, row in zip(lines, table, strict=False):
        key, value = line.split("\t", 1)
        got = json.loads(value)
        got["ts"] = dt.datetime.strptime(got["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        if key != str(row["id"]) or got != row:
            raise AssertionError(f"{path}: message {line!r} does not read back as {row!r}")


@dataclass
class ChangeTopic:
    """The change stream on a running broker, as the drivers need it and the result reports it."""

    bootstrap: str
    topic: str
    partitions: int
    messages: int
    broker_pid: int
    kafka_version: str
    message_bytes: int
    write_seconds: float
    produce_seconds: float
    end_offsets: dict[int, int] = field(default_factory=dict)

    def spec(self, max_offsets_per_trigger: int) -> dict[str, Any]:
        """The ``kafka`` entry of a driver's spec."""
        return {
            "bootstrap": self.bootstrap,
            "topic": self.topic,
            "partitions": self.partitions,
            "messages": self.messages,
            "broker_pid": self.broker_pid,
            "max_offsets_per_trigger": max_offsets_per_trigger,
        }

    def config(self, max_offsets_per_trigger: int) -> dict[str, Any]:
        """What the JSON result says about the topic (``config.kafka``)."""
        return {
            "broker": f"Apache Kafka {self.kafka_version}, one KRaft node on 127.0.0.1",
            "topic": self.topic,
            "partitions": self.partitions,
            "messages": self.messages,
            "message_bytes": self.message_bytes,
            "end_offsets": {str(k): v for k, v in sorted(self.end_offsets.items())},
            "key": "the id's text; Kafka's default partitioner: each id's changes in one partition, in order",
            "value": "JSON: id, name, version, amount, ts (ISO-8601 UTC, microseconds)",
            "producer": "Kafka's console producer, idempotent, acks=all, no compression",
            "written_seconds_untimed": self.write_seconds,
            "produced_seconds_untimed": self.produce_seconds,
            "sink_max_offsets_per_trigger": max_offsets_per_trigger,
            "starting_offsets": "earliest",
        }


def filled_topic(broker: Any, topic: str, lines: Iterable[str], lines_file: Path, partitions: int = 1) -> None:
    """``topic`` created (``partitions`` partitions: Kafka's producer spreads the lines over them by
    their key) and filled with ``lines`` (``key<TAB>value``), written to ``lines_file`` first, by
    :func:`produce`."""
    broker.create_topic(topic, partitions=partitions)
    with lines_file.open("w", encoding="utf-8", newline="\n") as out:
        for line in lines:
            out.write(f"{line}\n")
    produce(broker, topic, lines_file)


def produce(broker: Any, topic: str, lines_file: Path) -> None:
    """Send every line of ``lines_file`` (``key<TAB>value``) to ``topic``, in order, with Kafka's
    console producer from the broker's jars (the one the tests use; here reading a file, not a
    string: a million messages)."""
    java = components().java()
    command = [
        java,
        "-Xmx512m",
        "-cp",
        broker.classpath,
        "org.apache.kafka.tools.ConsoleProducer",
        "--bootstrap-server",
        broker.bootstrap,
        "--topic",
        topic,
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=\t",
        "--batch-size",
        str(1 << 20),
        "--command-property",
        "linger.ms=20",
        "--command-property",
        "enable.idempotence=true",
        "--command-property",
        "acks=all",
    ]
    with lines_file.open("rb") as stdin:
        done = subprocess.run(command, stdin=stdin, capture_output=True, timeout=PRODUCE_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"the console producer failed ({done.returncode}):\n{done.stdout.decode(errors='replace')[-3000:]}\n"
            f"{done.stderr.decode(errors='replace')[-3000:]}"
        )


@dataclass(frozen=True)
class Messages:
    """The change stream as the console producer's input: written once, produced to each broker."""

    path: Path
    count: int
    write_seconds: float


def write_messages(work_dir: Path, batch_files: list[Path]) -> Messages:
    """Every batch's rows as message lines in ``work_dir`` (the first batch's checked against its file)."""
    started = time.perf_counter()
    path = work_dir / "kafka-messages.txt"
    count = 0
    with path.open("w", encoding="utf-8", newline="\n") as out:
        for index, batch in enumerate(batch_files):
            lines = message_lines(batch)
            if index == 0:
                check_messages(batch, lines)
            out.write("\n".join(lines) + "\n")
            count += len(lines)
    return Messages(path, count, time.perf_counter() - started)


@contextlib.contextmanager
def change_topic(broker_dir: Path, written: Messages, partitions: int) -> Iterator[ChangeTopic]:
    """A started broker (its files in ``broker_dir``) holding the ``written`` messages on one topic;
    the broker is stopped at exit."""
    pc = components()
    broker = pc.KafkaBroker(broker_dir / "kafka")
    try:
        broker.start()
        pid = broker.process.pid()
        if pid is None:
            raise RuntimeError(f"the Kafka broker on {broker.bootstrap} is not running")
        log(f"Kafka {pc.KAFKA_VERSION} broker on {broker.bootstrap} (pid {pid})")
        broker.create_topic(TOPIC, partitions=partitions)
        lines_file, messages, write_seconds = written.path, written.count, written.write_seconds

        started = time.perf_counter()
        produce(broker, TOPIC, lines_file)
        produce_seconds = time.perf_counter() - started
        end = broker.end_offsets(TOPIC).get(TOPIC, {})
        if len(end) != partitions or sum(end.values()) != messages:
            raise RuntimeError(
                f"topic {TOPIC}: expected {messages} messages on {partitions} partitions, end offsets {end}"
            )
        log(
            f"produced {messages} changes to {TOPIC} ({partitions} partitions: {dict(sorted(end.items()))}) in "
            f"{produce_seconds:.1f}s (messages written in {write_seconds:.1f}s; neither timed for any system)"
        )
        yield ChangeTopic(
            bootstrap=broker.bootstrap,
            topic=TOPIC,
            partitions=partitions,
            messages=messages,
            broker_pid=pid,
            kafka_version=pc.KAFKA_VERSION,
            message_bytes=lines_file.stat().st_size,
            write_seconds=write_seconds,
            produce_seconds=produce_seconds,
            end_offsets=end,
        )
    finally:
        broker.stop()


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka source for the installed PySpark (``spark.jars``), fetched once into the cache."""
    import pyspark

    return [str(p) for p in components().spark_kafka_jars(pyspark.__version__)]


def engine_suffix(raw: dict[str, Any]) -> str:
    """How a _kafka system read the topic, for its ``engine`` text."""
    kafka = raw.get("kafka") or {}
    if raw.get("driver") == "flink":
        return (
            f", one streaming job over Kafka topic {kafka.get('topic')} ({kafka.get('partitions')} partitions, "
            f"Flink's Kafka SQL connector {raw.get('kafka_connector')}, json format, earliest to latest offsets), "
            f"committing every {raw.get('checkpoint_interval_ms')} ms checkpoint"
        )
    return (
        f", one streaming query (sink.start) over Kafka topic {kafka.get('topic')} ({kafka.get('partitions')} "
        f"partitions, Spark's Kafka source, from_json, maxOffsetsPerTrigger {kafka.get('max_offsets_per_trigger')}, "
        f"startingOffsets earliest), ordered by {raw.get('order_by')}"
    )


def extras(raw: dict[str, Any]) -> dict[str, Any]:
    """The _kafka part of a system's result."""
    keys = (
        "kafka",
        "stream_seconds",
        "stream_snapshots",
        "micro_batches",
        "broker_cpu_seconds",
        "kafka_offsets_committed",
        "checkpoints",
        "kafka_connector",
        "driver_gc",
        "key_index",
    )
    return {k: raw[k] for k in keys if k in raw}


def report_line(system: dict[str, Any]) -> str:
    """A _kafka system's commits, end-to-end rate and checkpoint or micro-batch breakdown, in one line."""
    steady, e2e = system["steady_state"], system["end_to_end"]
    cpu = e2e.get("batch_cpu_seconds_per_million_changes")
    broker = system.get("broker_cpu_seconds")
    text = (
        f"{len(system['batch_seconds'])} commits (entries), {steady.get('changes_per_commit_median') or 0:.0f} "
        f"changes per commit p50; end to end {e2e.get('changes_per_second') or 0:.0f} changes/s in "
        f"{e2e['batch_seconds']:.1f}s, {'?' if cpu is None else f'{cpu:.0f}'} CPU-s per M changes; broker "
        f"{'?' if broker is None else f'{broker:.1f}'} CPU-s"
    )
    checkpoints = system.get("checkpoints")
    if checkpoints:
        p50 = checkpoints.get("end_to_end_duration_ms_p50")
        text += (
            f"; {checkpoints['completed_seen']} checkpoints seen (of {checkpoints.get('completed_at_last_read')} at "
            f"the last read), duration p50 {'?' if p50 is None else f'{p50:.0f}'} ms"
        )
    phases = system.get("batch_sink_phases_ms") or []
    if phases:
        medians = {k: statistics.median(p.get(k, 0.0) for p in phases) for k in sorted({k for p in phases for k in p})}
        text += f"; micro-batches {system.get('micro_batches')}, sink phases p50 ms " + ", ".join(
            f"{k} {v:.0f}" for k, v in medians.items()
        )
        triggers = [
            d["triggerExecution"] for d in system.get("batch_spark_duration_ms") or [] if "triggerExecution" in d
        ]
        if triggers:
            text += f", Spark triggerExecution p50 {statistics.median(triggers):.0f}"
    collections = (system.get("driver_gc") or {}).get("generation_2")
    if collections:
        text += f"; the driver's full garbage collections {collections['count']} ({collections['seconds']:.2f} s)"
    return text
