"""A streaming driver for crash tests: run as a subprocess, optionally SIGKILLed at a fault point.

    python -m tests.integration.crash_driver REQUEST.json

The request (JSON) names the catalog (``catalog``: properties)
and the streams (``streams``: a list of ``{"kind": "append"|"cdc", "table", "source", "checkpoint"}``, or
for a routed stream ``{"kind", "route": {.route() arguments}, "ddl", "source", "checkpoint"}``),
all started in this one driver with ``availableNow`` triggers and one source file per micro-batch.
A cdc stream may also give ``key`` (the builder's ``key=``, default ``["id"]``), ``key_column``
(``.cdc(key_column=...)``, per-table keys of a routed stream), ``partition_by`` (of
``create_if_missing``, default ``["bucket(4, id)"]``), ``schema_evolution``, ``dead_letter`` (the
``.dead_letter`` table; any stream) and ``atomic_commits`` (``.atomic_commits``).
With ``kill`` = ``[POINT, CHECKPOINT]`` the driver SIGKILLs its whole process group (Python driver,
JVM and Python workers, as a lost machine would) once *every* stream has reached ``POINT`` of
checkpoint ``CHECKPOINT``: a stream that gets there first waits for the others, so each is killed at
exactly that step. ``POINT`` is an :mod:`iceberg_sink._faults` point or :data:`WRITERS_RUNNING`.
``[POINT, CHECKPOINT, N]`` (one stream) kills at the N-th time the stream reaches that point of that
checkpoint: a routed stream hits ``AFTER_COMMIT`` once per table, so N=2 kills after the second
table's commit.

With ``until_checkpoints`` set the queries run with a ``processingTime`` trigger until every stream
has committed its whole source (see ``_caught_up``), then stop. Randomized kills use this mode: a
driver killed after Spark's file source had logged a batch but before the offset log had it may, on
restart, run that batch together with the next as one micro-batch, so a stream can end with fewer
checkpoints than files (with an ``availableNow`` restart it once ended without that batch at all).

It prints ``STREAMING`` once the queries run, ``COMMITTED <table> <checkpoint>`` after each commit,
``KILLING ...`` right before the kill and ``DONE`` when every stream has processed its whole source.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

WRITERS_RUNNING = "writers-running"
"""Killed while writer tasks run: once each stream's table holds a data file of the checkpoint, before
any stream's tasks have all finished (a stream that finishes its writes first waits at AFTER_WRITE)."""
WAIT_FOR_OTHERS_SECONDS = 300


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def kill_group(why: str) -> None:
    say(f"KILLING at {why}")
    os.killpg(os.getpgid(0), signal.SIGKILL)


def kill_process_group_at(
    kill_point: str, kill_at: int, streams: int = 1, data_dirs: list[Path] | None = None, nth: int = 1
) -> None:
    """SIGKILL this whole process group once ``streams`` streams reached ``kill_point`` of checkpoint
    ``kill_at`` (for :data:`WRITERS_RUNNING`: once each of ``data_dirs`` holds a file of it); with
    ``nth`` > 1 (one stream), at its ``nth`` time there."""
    from iceberg_sink import _faults

    lock = threading.Lock()
    arrived: list[str] = []
    passed: list[str] = []  # hits let through before the nth

    def wait_forever() -> None:
        # Hold this stream here; the last stream to arrive kills everyone.
        time.sleep(WAIT_FOR_OTHERS_SECONDS)
        kill_group(f"{kill_point} {kill_at} (timeout: only {len(arrived)} of {streams} streams got there)")

    if kill_point == WRITERS_RUNNING:
        pattern = re.compile(rf"^\d{{5}}-\d+-[0-9a-f]+-{kill_at:06d}-.*\.parquet$")

        def written(folder: Path) -> bool:
            return folder.is_dir() and any(pattern.match(p.name) for p in folder.rglob("*.parquet"))

        def watch() -> None:
            while len(data_dirs or []) < streams or not all(written(d) for d in data_dirs or []):
                time.sleep(0.02)
            with lock:
                done = list(arrived)
            kill_group(f"{kill_point} {kill_at} (streams past their writes: {len(done)})")

        threading.Thread(target=watch, daemon=True).start()

        def hold_after_write(point: str, checkpoint_id: int) -> None:
            if point == _faults.AFTER_WRITE and checkpoint_id == kill_at:
                with lock:
                    arrived.append(point)
                wait_forever()

        _faults.install(hold_after_write)
        return

    def kill(point: str, checkpoint_id: int) -> None:
        if point != kill_point or checkpoint_id != kill_at:
            return
        with lock:
            if len(passed) < nth - 1:
                passed.append(point)
                return
            arrived.append(point)
            last = len(arrived) >= streams
        if last:
            kill_group(f"{point} {checkpoint_id}")
        wait_forever()

    _faults.install(kill)


def _max_checkpoint(sink: Any) -> int:
    snapshots = sink.load_table().snapshots()
    return max((int(s.summary["iceberg-sink.checkpoint-id"]) for s in snapshots if s.summary is not None), default=-1)


def _batch_files(folder: Path) -> dict[int, Path]:
    """Spark's metadata-log files in ``folder`` by batch id (``7``, ``9.compact``; not ``.crc``/temp files)."""
    out = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        head = path.name.removesuffix(".compact")
        if head.isdigit():
            out[int(head)] = path
    return out


def _caught_up(stream: dict[str, str], sink: Any) -> bool:
    """Whether the stream has processed and committed every file of its source.

    After a kill between the file source logging a batch and the offset log recording it, the restart
    may run two logged batches as one micro-batch, so the number of checkpoints is not the number of
    files; what is fixed is that every source file is in the source log, the last micro-batch Spark
    committed ends at the log's last batch, and the sink holds that checkpoint.
    """
    checkpoint = Path(stream["checkpoint"])
    logged = _batch_files(checkpoint / "sources" / "0")
    commits = _batch_files(checkpoint / "commits")
    if not logged or not commits:
        return False
    paths = set()
    for path in logged.values():
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            paths.add(Path(json.loads(line)["path"].removeprefix("file://")).name)
    if paths != {p.name for p in Path(stream["source"]).glob("*.parquet")}:
        return False
    last = max(commits)
    offsets = _batch_files(checkpoint / "offsets").get(last)
    if offsets is None:
        return False
    end = json.loads(offsets.read_text(encoding="utf-8").splitlines()[-1])["logOffset"]
    return bool(end == max(logged) and _max_checkpoint(sink) >= last)


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink
    from tests.integration.sources import CHANGE_SCHEMA_DDL, EVENT_SCHEMA_DDL

    streams = request["streams"]
    data_dirs: list[Path] = []  # filled once the tables exist
    if request.get("kill"):
        point, checkpoint, *nth = request["kill"]
        kill_process_group_at(
            point, int(checkpoint), streams=len(streams), data_dirs=data_dirs, nth=int(nth[0] if nth else 1)
        )

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    queries = []
    sinks: list[Any] = []
    until = int(request.get("until_checkpoints") or 0)
    for stream in streams:
        builder = IcebergSink.builder().catalog("crash", **request["catalog"])
        # A routed stream has ``route`` (.route() keyword arguments) and ``ddl`` (the source schema).
        builder = builder.route(**stream["route"]) if stream.get("route") else builder.table(stream["table"])
        if stream["kind"] == "cdc":
            per_table = {"key_column": stream["key_column"]} if stream.get("key_column") else {}
            builder = builder.cdc(
                op_column="op", key=stream.get("key", ["id"]), order_by="lsn", **per_table
            ).create_if_missing(partition_by=stream.get("partition_by", ["bucket(4, id)"]))
            ddl = CHANGE_SCHEMA_DDL
        else:
            builder = builder.create_if_missing(partition_by=["bucket(3, user_id)"])
            ddl = EVENT_SCHEMA_DDL
        ddl = stream.get("ddl") or ddl
        if stream.get("schema_evolution"):
            builder = builder.schema_evolution(stream["schema_evolution"])
        if stream.get("dead_letter"):
            builder = builder.dead_letter(stream["dead_letter"])
        if stream.get("atomic_commits"):
            builder = builder.atomic_commits(stream["atomic_commits"])
        for key, value in (stream.get("write_options") or {}).items():
            builder = builder.write_option(key, value)
        df = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(stream["source"])
        builder = builder.post_commit_hook(lambda result: say(f"COMMITTED {result.table} {result.checkpoint_id}"))
        sink = builder.build()
        trigger = {"processingTime": "0 seconds"} if until else {"availableNow": True}
        queries.append(sink.start(df, stream["checkpoint"], trigger=trigger))
        sinks.append(sink)
        if stream.get("route"):
            continue
        data_dirs.append(Path(sink.load_table().location().removeprefix("file://")) / "data")
    say("STREAMING")
    if until:
        # Until every table holds the last checkpoint; then stop (see the module docstring).
        while not all(_caught_up(stream, sink) for stream, sink in zip(request["streams"], sinks, strict=True)):
            for query in queries:
                if not query.isActive:
                    query.awaitTermination()  # raises the query's error
            time.sleep(0.2)
        for query in queries:
            query.stop()
    for query in queries:
        query.awaitTermination()
    say("DONE")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
