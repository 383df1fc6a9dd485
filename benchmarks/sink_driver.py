"""The iceberg_sink side of the CDC benchmark: PySpark 4.x in the main venv.

Started by ``benchmarks/cdc.py`` in a process of its own (so its JVM is gone before the next system
starts)::

    .venv/bin/python -m benchmarks.sink_driver SPEC.json

``SPEC.json`` names the Parquet files of the initial load and of each batch, a scratch directory
and the Spark settings. The driver:

1. builds an ``.upsert(key=["id"])`` sink on ``bench.cdc`` in an embedded catalog (SQLite +
   local warehouse) under the scratch directory; an empty write creates the table, whose ``id``
   becomes a required identifier field;
2. appends the initial rows through a second, append-mode sink on the same table, timed;
3. writes each batch with ``sink.write(batch_df, checkpoint_location=..., checkpoint_id=i)``, the
   code path of the streaming ``foreachBatch`` (one snapshot per batch; one equality delete per
   changed key), timing it from reading the batch's file to the end of the commit.

``spec["format_version"]`` (2 by default) is the format of the table the upsert sink creates: on
3 each checkpoint commits deletion vectors instead of equality deletes (docs/format-v3.md). The CPU
seconds of this process tree (driver, JVM, Python workers) are read before and after the load and
every batch (``benchmarks/cpu_monitor.tree_cpu_seconds``).

With ``spec["convert_every"]`` N > 0 the upsert sink also runs the equality-delete conversion
(``.convert_equality_deletes(every_n_commits=N)``, on a background thread of this driver, beside
the batches). With ``spec["scan_every"]`` K > 0 the table's metadata location is recorded right
after every K-th batch's commit (and after the last): the reader process's Iceberg Java times a full
scan of the table as it was then. At the end the driver waits for a running conversion.

``spec["mode"]`` "stream" writes every batch through one streaming query (``sink.start``) over the
batch files (:func:`run_stream`); "kafka" through one streaming query over the change topic of
``benchmarks/cdc_kafka.py`` (:func:`run_kafka_stream`, Spark's Kafka source: ``spec["spark_jars"]``).

The result (per-batch seconds and wall-clock intervals, a breakdown by stage, snapshot summaries and
the table's metadata location, which the reader process's Iceberg Java reads back) is written as JSON to
the ``result`` path of the spec. Progress goes to stderr.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cdc_data import SPARK_DDL
from benchmarks.cdc_systems import entry_changes
from benchmarks.cpu_monitor import quiet_gate, tree_cpu_seconds
from benchmarks.driver_main import driver_main
from benchmarks.java_spark import local_builder

TABLE = "bench.cdc"


def log(message: str) -> None:
    print(f"[iceberg_sink {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def batch_phases(sink: Any, elapsed: float) -> dict[str, float]:
    """The stages of the batch ``sink`` just wrote, in seconds, from its progress record's
    ``phases_ms`` (plan, build, write, stage, commit: docs/metrics.md); ``other`` is the rest of
    ``elapsed`` (reading the batch's file, the checkpoint store, the record itself)."""
    record = sink.last_progress() or {}
    phases = {k: v / 1000 for k, v in (record.get("phases_ms") or {}).items()}
    phases["other"] = max(0.0, elapsed - sum(phases.values()))
    return phases


def start_spark(spec: dict[str, Any], work_dir: Path) -> Any:
    # Python workers (the mapInArrow writers) must run this interpreter, the one with iceberg_sink.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["SPARK_LOCAL_DIRS"] = str(work_dir / "spark-local")
    builder = local_builder(spec, work_dir, "cdc-benchmark-iceberg-sink")
    if spec.get("spark_jars"):  # Spark's Kafka source (the kafka mode)
        builder = builder.config("spark.jars", ",".join(spec["spark_jars"]))
    for key, value in (spec.get("spark_conf") or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def with_write_options(builder: Any, spec: dict[str, Any]) -> Any:
    """``builder`` with the spec's ``write_options`` (``--write-option``): both sinks take them."""
    for key, value in (spec.get("write_options") or {}).items():
        builder = builder.write_option(key, value)
    return builder


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import pyiceberg
    import pyspark
    from pyspark.sql import functions as F

    from iceberg_sink import IcebergSink

    work_dir = Path(spec["work_dir"])
    monitor, wait_quiet = quiet_gate(spec)
    if spec.get("kafka"):  # the change topic's broker is the benchmark's, not another process
        monitor.adopt(int(spec["kafka"]["broker_pid"]))
    spark = start_spark(spec, work_dir)
    try:
        lake = work_dir / "lake"
        format_version = int(spec.get("format_version") or 2)
        builder = (
            IcebergSink.builder()
            .embedded(lake)
            .table(TABLE)
            .create_if_missing(format_version=format_version)
            .upsert(key=["id"], order_by=spec.get("order_by"))
        )
        builder = with_write_options(builder, spec)
        convert_every = int(spec.get("convert_every") or 0)
        if convert_every > 0:
            builder = builder.convert_equality_deletes(every_n_commits=convert_every, background=True)
        upsert_sink = builder.build()
        scan_every = int(spec.get("scan_every") or 0)
        scan_points: list[dict[str, Any]] = []
        upsert_sink.write(spark.createDataFrame([], SPARK_DDL))  # creates the table, commits nothing
        append_sink = with_write_options(IcebergSink.builder().embedded(lake).table(TABLE), spec).build()

        load_waited = wait_quiet()
        cpu_before = tree_cpu_seconds()
        started = time.perf_counter()
        initial = spark.read.schema(SPARK_DDL).parquet(*spec["initial_files"])
        # The table's id is required: drop nulls (there are none) and use an expression Spark knows is not null.
        initial = initial.where(F.col("id").isNotNull()).withColumn("id", F.coalesce("id", F.lit(0).cast("bigint")))
        append_sink.write(initial)
        load_seconds = time.perf_counter() - started
        load_cpu = cpu_delta(cpu_before, tree_cpu_seconds())
        log(f"loaded the initial rows in {load_seconds:.1f}s")

        checkpoint = str(work_dir / "checkpoint")

        def common() -> dict[str, Any]:
            """What every mode reports, read when the writes are done."""
            table = upsert_sink.load_table()
            return {
                "format_version": format_version,
                "convert_every": convert_every,
                "final_summary": dict(table.current_snapshot().summary.additional_properties),  # type: ignore[union-attr]
                "spark_version": spark.version,
                "pyspark_version": pyspark.__version__,
                "pyiceberg_version": pyiceberg.__version__,
                "load_seconds": load_seconds,
                "load_waited_for_quiet_seconds": load_waited,
                "load_cpu_seconds": load_cpu,
                "metadata_location": table.metadata_location,
            }

        if spec.get("mode") in ("stream", "kafka"):
            run_mode = run_stream if spec["mode"] == "stream" else run_kafka_stream
            streamed = run_mode(spark, upsert_sink, spec, work_dir, checkpoint, monitor, wait_quiet)
            return {**streamed, **common(), "scan_every": 0, "scan_points": [], "conversion_metrics": {}}
        seconds: list[float] = []
        waited: list[float] = []
        intervals: list[tuple[float, float]] = []
        phases: list[dict[str, float]] = []
        summaries: list[dict[str, str]] = []
        cpu: list[float | None] = []
        for index, path in enumerate(spec["batch_files"]):
            waited.append(wait_quiet())
            cpu_before = tree_cpu_seconds()
            wall = time.time()
            started = time.perf_counter()
            batch = spark.read.schema(SPARK_DDL).parquet(path)
            outcome = upsert_sink.write(batch, checkpoint_location=checkpoint, checkpoint_id=index)
            elapsed = time.perf_counter() - started
            cpu.append(cpu_delta(cpu_before, tree_cpu_seconds()))
            seconds.append(elapsed)
            intervals.append((wall, wall + elapsed))
            phase = batch_phases(upsert_sink, elapsed)
            phases.append(phase)
            snapshot = outcome.snapshot if outcome is not None else None
            summary = dict(snapshot.summary.additional_properties) if snapshot and snapshot.summary else {}
            summaries.append(summary)
            last = index == len(spec["batch_files"]) - 1
            if scan_every > 0 and ((index + 1) % scan_every == 0 or last):
                scan_points.append(
                    {
                        "batch": index + 1,
                        "metadata_location": upsert_sink.load_table().metadata_location,
                        "summary": dict(upsert_sink.load_table().current_snapshot().summary.additional_properties),  # type: ignore[union-attr]
                    }
                )
            log(
                f"batch {index + 1}/{len(spec['batch_files'])}: {elapsed:.2f}s "
                f"({', '.join(f'{k} {v:.2f}s' for k, v in phase.items())}; "
                f"data files {summary.get('total-data-files')}, delete files {summary.get('total-delete-files')})"
            )
        upsert_sink.await_conversions()
        metrics = upsert_sink.metrics()
        return {
            **common(),
            "scan_every": scan_every,
            "scan_points": scan_points,
            "conversion_metrics": {
                "triggered": metrics.conversions_triggered,
                "succeeded": metrics.conversions_succeeded,
                "failed": metrics.conversions_failed,
                "removed_equality_delete_files": metrics.conversion_removed_equality_delete_files,
                "added_position_delete_files": metrics.conversion_added_position_delete_files,
                "last_duration_ms": metrics.last_conversion_duration_ms,
                "total_duration_ms": metrics.conversion_duration_ms,
                "data_files_read": metrics.conversion_data_files_read,
                "key_index_bytes": metrics.conversion_key_index_bytes,
                "last_error": metrics.last_conversion_error,
            },
            "batch_cpu_seconds": cpu,
            "batch_seconds": seconds,
            "batch_waited_for_quiet_seconds": waited,
            "batch_intervals": intervals,
            "batch_phases": phases,
            "batch_summaries": summaries,
        }
    finally:
        spark.stop()
        monitor.stop()


def run_stream(
    spark: Any, sink: Any, spec: dict[str, Any], work_dir: Path, checkpoint: str, monitor: Any, wait_quiet: Any
) -> dict[str, Any]:
    """Every batch through one streaming query (``sink.start``), as a user deploys the sink for CDC.

    The batch files are copied (before the timed window) into one directory with increasing
    modification times, the order Spark's file source takes them in; the query reads them with
    ``maxFilesPerTrigger`` = ``spec["files_per_trigger"]`` (so each micro-batch is that many input
    batches) and the default trigger (the next micro-batch as soon as the last one ended). Timed from
    the ``start`` call to the last micro-batch's commit. The driver polls the sink's progress records
    every 10 ms: each newly seen record ends one entry (its seconds since the previous entry, or since
    the start call; the CPU of this process tree in between); its changes are the input rows of the
    micro-batches it committed, exactly (each micro-batch reads the next ``files_per_trigger`` files).
    """
    import shutil

    import pyarrow.parquet as pq

    per_trigger = int(spec.get("files_per_trigger") or 1)
    source_dir = work_dir / "stream-input"
    source_dir.mkdir()
    base = time.time() - 10 * len(spec["batch_files"])
    for index, path in enumerate(spec["batch_files"]):
        copy = source_dir / f"batch-{index:05d}.parquet"
        shutil.copyfile(path, copy)
        os.utime(copy, (base + index, base + index))
    expected = -(-len(spec["batch_files"]) // per_trigger)
    # Each micro-batch's changes are the rows of its input files (the reduction may keep fewer when a
    # key repeats across them; Flink's added-records count every input row, so this is the same count).
    file_rows = [pq.ParquetFile(path).metadata.num_rows for path in spec["batch_files"]]
    inputs = [sum(file_rows[i * per_trigger : (i + 1) * per_trigger]) for i in range(expected)]
    stream = spark.readStream.schema(SPARK_DDL).option("maxFilesPerTrigger", per_trigger).parquet(str(source_dir))

    before = sink.last_progress()  # the table creation's record, of a job of its own
    earlier_job = before["job_id"] if before is not None else None

    waited = wait_quiet()
    cpu_before = tree_cpu_seconds()
    wall = time.time()
    started = time.perf_counter()
    query = sink.start(stream, checkpoint_location=checkpoint)
    ends, last_ids = poll_commits(sink, query, earlier_job, (started, wall, cpu_before), lambda i: i >= expected - 1)
    stream_seconds = time.perf_counter() - started
    # Spark's own breakdown of each micro-batch (addBatch is the sink's foreachBatch; walCommit,
    # commitOffsets, latestOffset are its checkpoint and source work), by batch id.
    spark_phases = {int(p.batchId): dict(p.durationMs) for p in query.recentProgress}
    query.stop()
    records = {int(r["checkpoint_id"]): r for r in sink.progress() if r["job_id"] != earlier_job}
    missing = [i for i in range(expected) if i not in records or records[i]["status"] != "committed"]
    if missing:  # the sink keeps its newest 100 records: more micro-batches than that are not measured
        raise RuntimeError(f"expected {expected} committed micro-batches, not committed or not kept: {missing[:10]}")
    table = sink.load_table()
    by_id = {s.snapshot_id: s for s in table.snapshots()}
    snapshots = [by_id[int(records[i]["snapshot_id"])] for i in range(expected)]
    changes = entry_changes(inputs, [i + 1 for i in last_ids])
    log(f"stream: {sum(changes)} changes in {stream_seconds:.1f}s, {expected} micro-batches of {per_trigger} file(s)")
    summaries = [dict(s.summary.additional_properties) if s.summary else {} for s in snapshots]
    return {
        "mode": "stream",
        "files_per_trigger": per_trigger,
        "order_by": spec.get("order_by"),
        "stream_seconds": stream_seconds,
        "stream_waited_for_quiet_seconds": waited,
        "stream_snapshots": expected,
        **entries(ends, changes, records, spark_phases, summaries, monitor),
    }


class DriverCollections:
    """The driver's garbage collections while the block runs (``gc.callbacks``): how many of each
    generation and the wall time they took. A full collection walks every object PySpark, PyIceberg
    and PyArrow created; inside a micro-batch it is on the stream's critical path."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._runs: dict[int, list[float]] = {0: [], 1: [], 2: []}

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._runs[int(info["generation"])].append(time.perf_counter() - self._started)
            self._started = None

    def __enter__(self) -> DriverCollections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        return {
            f"generation_{g}": {
                "count": len(runs),
                "seconds": round(sum(runs), 4),
                "max_seconds": round(max(runs, default=0.0), 4),
            }
            for g, runs in self._runs.items()
        }


def kafka_offsets(checkpoint: str, batch_id: int, topic: str) -> dict[int, int]:
    """The end offset of each partition of ``topic`` in micro-batch ``batch_id``, from Spark's offset
    log (``<checkpoint>/offsets/<id>``: a version line, the batch's metadata, one line per source)."""
    import json

    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    for line in lines[2:]:
        data = json.loads(line)
        if isinstance(data, dict) and topic in data:
            return {int(p): int(o) for p, o in data[topic].items()}
    raise RuntimeError(f"no offsets of {topic} in micro-batch {batch_id}'s offset log: {lines}")


def run_kafka_stream(
    spark: Any, sink: Any, spec: dict[str, Any], work_dir: Path, checkpoint: str, monitor: Any, wait_quiet: Any
) -> dict[str, Any]:
    """Every change through one streaming query over the change topic (``spec["kafka"]``,
    ``benchmarks/cdc_kafka.py``), the way the sink is deployed on Kafka.

    Spark's Kafka source from the earliest offsets, ``maxOffsetsPerTrigger`` changes per micro-batch
    (spread over the partitions by their lag), each value parsed by ``from_json`` into the five
    columns; the sink (built with ``order_by="version"``: a micro-batch holds several changes of a key,
    read by one task per partition) upserts them by ``id``. Default trigger: the next micro-batch as
    soon as the last one ended. Timed from the ``start`` call to the commit of the micro-batch that
    reached the topic's end; entries as in :func:`run_stream`, each holding the changes of its
    micro-batches, exactly: the differences of their end offsets in Spark's offset log (read when a
    micro-batch's record is seen, a small local file, and after the window). The broker counts as this
    benchmark's (not other processes'); its CPU during the stream is ``broker_cpu_seconds``. Spark keeps
    every micro-batch's progress (``spark.sql.streaming.numRecentProgressUpdates``, 100 by default:
    a million changes at 10,000 per micro-batch are a few more than 100)."""
    from pyspark.sql import functions as F

    from iceberg_sink.sources.kafka_offsets import parse_summary

    kafka = spec["kafka"]
    topic, total, broker_pid = kafka["topic"], int(kafka["messages"]), int(kafka["broker_pid"])
    per_trigger = int(kafka["max_offsets_per_trigger"])
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    # Spark deletes offset log entries older than its last 100 micro-batches; the changes of each are
    # read from them after the window, so a longer stream keeps them all (nothing else changes below 100).
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", str(max(100, total // max(per_trigger, 1) + 10)))
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka["bootstrap"])
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_trigger))
        .options(**kafka.get("source_options", {}))
        .load()
        .select(F.from_json(F.col("value").cast("string"), SPARK_DDL).alias("change"))
        .select("change.*")
    )
    before = sink.last_progress()  # the table creation's record, of a job of its own
    earlier_job = before["job_id"] if before is not None else None
    records: dict[int, dict[str, Any]] = {}

    def keep_records() -> None:  # the sink keeps its newest 100 records only
        records.update({int(r["checkpoint_id"]): r for r in sink.progress() if r["job_id"] != earlier_job})

    def last(batch_id: int) -> bool:
        return sum(kafka_offsets(checkpoint, batch_id, topic).values()) >= total

    waited = wait_quiet()
    broker_before = tree_cpu_seconds(broker_pid)
    cpu_before = tree_cpu_seconds()
    wall = time.time()
    started = time.perf_counter()
    with DriverCollections() as collections:
        query = sink.start(stream, checkpoint_location=checkpoint)
        ends, last_ids = poll_commits(sink, query, earlier_job, (started, wall, cpu_before), last, keep_records)
    stream_seconds = time.perf_counter() - started
    broker_cpu = cpu_delta(broker_before, tree_cpu_seconds(broker_pid))
    spark_phases = {int(p.batchId): dict(p.durationMs) for p in query.recentProgress}
    query.stop()
    keep_records()
    batches = last_ids[-1] + 1
    missing = [i for i in range(batches) if i not in records or records[i]["status"] not in COMMITTED]
    if missing:
        raise RuntimeError(f"expected {batches} committed micro-batches, not committed or not seen: {missing[:10]}")
    ends_offsets = [kafka_offsets(checkpoint, i, topic) for i in range(batches)]
    consumed = [sum(o.values()) for o in ends_offsets]
    inputs = [b - a for a, b in itertools.pairwise([0, *consumed])]  # a new topic starts at offset 0
    changes = entry_changes(inputs, [i + 1 for i in last_ids])
    table = sink.load_table()
    by_checkpoint = checkpoint_snapshots(table, records[batches - 1]["job_id"])
    snapshots = [by_checkpoint[i] for i in range(batches)]
    summaries = [dict(s.summary.additional_properties) if s.summary else {} for s in snapshots]
    log(f"kafka stream: {sum(changes)} changes in {stream_seconds:.1f}s, {batches} micro-batches of <= {per_trigger}")
    metrics = sink.metrics()
    return {
        "mode": "kafka",
        "driver": "sink",
        "driver_gc": collections.summary(),
        # Whether the committer's key index held every file (v3): files it had to read or load.
        "key_index": {
            "data_files_read": metrics.key_index_data_files_read,
            "entries_loaded": metrics.key_index_entries_loaded,
        },
        "kafka": kafka,
        "order_by": spec.get("order_by"),
        "files_per_trigger": None,
        "stream_seconds": stream_seconds,
        "stream_waited_for_quiet_seconds": waited,
        "stream_snapshots": batches,
        "micro_batches": batches,
        "micro_batch_changes": inputs,
        "broker_cpu_seconds": broker_cpu,
        # The sink records the Kafka offsets each snapshot holds: the last one's are the topic's end.
        "kafka_offsets_committed": {
            "last_snapshot": {t: {str(p): o for p, o in v.items()} for t, v in parse_summary(summaries[-1]).items()},
            "equal_to_the_last_micro_batch": parse_summary(summaries[-1]) == {topic: ends_offsets[-1]},
        },
        **entries(ends, changes, records, spark_phases, summaries, monitor),
    }


def entries(
    ends: list[tuple[float, float, float | None]],
    changes: list[int],
    records: dict[int, dict[str, Any]],
    spark_phases: dict[int, dict[str, Any]],
    summaries: list[dict[str, str]],
    monitor: Any,
) -> dict[str, Any]:
    """The per-entry and per-micro-batch fields of a stream's result (both stream modes): each entry's
    seconds, changes, wall-clock interval and CPU from ``ends`` (:func:`poll_commits`), and each
    micro-batch's stages from the sink's progress ``records`` and Spark's ``spark_phases``."""
    seconds = [b[0] - a[0] for a, b in itertools.pairwise(ends)]
    intervals = [(a[1], b[1]) for a, b in itertools.pairwise(ends)]
    batches = range(len(summaries))
    return {
        "batch_seconds": seconds,
        "batch_changes": changes,
        "batch_waited_for_quiet_seconds": [0.0] * len(seconds),
        "batch_intervals": intervals,
        "batch_phases": [
            # A commit on the sink's commit lane (status "committing") has no commit time of its own
            # in its record: the next micro-batch's commit phase holds the wait for it.
            {"write": records[i]["write_ms"] / 1000, "commit": (records[i]["commit_ms"] or 0) / 1000}
            for i in batches
        ],
        "batch_sink_phases_ms": [records[i].get("phases_ms", {}) for i in batches],
        "batch_spark_duration_ms": [spark_phases.get(i, {}) for i in batches],
        "batch_summaries": summaries,
        "batch_cpu_seconds": [cpu_delta(a[2], b[2]) for a, b in itertools.pairwise(ends)],
        "batch_foreign_cpu_seconds": [monitor.between(a, b) for a, b in intervals],
    }


COMMITTED = ("committed", "committing")
"""Progress statuses of a micro-batch whose checkpoint is committed or being committed (the sink's
commit lane: the next micro-batch takes its result before its own commit)."""


def poll_commits(
    sink: Any,
    query: Any,
    earlier_job: str | None,
    start: tuple[float, float, float | None],
    last: Any,
    on_record: Any = None,
) -> tuple[list[tuple[float, float, float | None]], list[int]]:
    """Poll the sink's newest progress record every 10 ms until ``last(checkpoint_id)`` says the
    micro-batch just seen is the last: each newly seen record ends one entry. Returns each entry's end
    (perf counter, wall clock, CPU of this process tree), ``start`` first, and the newest checkpoint id
    each entry ends at (-1 first); ``on_record()`` is called at each.

    The record is the sink's, in this process; whether the query failed is asked of Spark's JVM (two
    Py4J calls) every 0.5 s only: asked every 10 ms, those calls cost the driver and the JVM CPU the
    measured system would otherwise have (py-spy put a fifth of the driver's samples in this loop)."""
    ends: list[tuple[float, float, float | None]] = [start]  # (perf, wall, cpu) per entry
    last_ids: list[int] = [-1]  # the newest checkpoint id each entry ends at
    next_check = time.perf_counter()
    while True:
        record = sink.last_progress()
        if record is not None and record["job_id"] != earlier_job and int(record["checkpoint_id"]) != last_ids[-1]:
            ends.append((time.perf_counter(), time.time(), tree_cpu_seconds()))
            last_ids.append(int(record["checkpoint_id"]))
            if on_record is not None:
                on_record()
            if record["status"] not in COMMITTED:
                raise RuntimeError(
                    f"micro-batch {record['checkpoint_id']} was {record['status']}: {record.get('error')}"
                )
            if last(last_ids[-1]):
                return ends, last_ids
        if time.perf_counter() >= next_check:
            error = query.exception()
            if error is not None or not query.isActive:
                raise RuntimeError(f"the streaming query stopped before its last micro-batch: {error}")
            next_check = time.perf_counter() + 0.5
        time.sleep(0.01)


def checkpoint_snapshots(table: Any, job_id: str) -> dict[int, Any]:
    """The snapshot of each checkpoint of ``job_id`` (a checkpoint whose commit ran on the sink's
    commit lane names its snapshot in no progress record of its own)."""
    found = {}
    for snapshot in table.snapshots():
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if any(k.endswith(".job-id") and v == job_id for k, v in props.items()):
            found[int(next(v for k, v in props.items() if k.endswith(".checkpoint-id")))] = snapshot
    return found


def cpu_delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def main(argv: list[str]) -> int:
    return driver_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
