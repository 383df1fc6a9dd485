"""A streaming driver for crash tests: run as a subprocess, optionally SIGKILLed at a fault point.

    python -m tests.integration.crash_driver REQUEST.json

The request (JSON) names the catalog (``catalog``: properties)
and the streams (``streams``: a list of ``{"kind": "append"|"cdc", "table", "source", "checkpoint"}``),
all started in this one driver with ``availableNow`` triggers and one source file per micro-batch.
With ``kill`` = ``[POINT, CHECKPOINT]`` the driver SIGKILLs its whole process group (Python driver,
JVM and Python workers, as a lost machine would) once *every* stream has reached ``POINT`` of
checkpoint ``CHECKPOINT``: a stream that gets there first waits for the others, so each is killed at
exactly that step. ``POINT`` is an :mod:`iceberg_sink._faults` point or :data:`WRITERS_RUNNING`.

With ``until_checkpoints`` = N the queries run with a ``processingTime`` trigger until every table
holds checkpoint N-1, then stop. Randomized kills use this mode: once, a driver killed after Spark's
file source had logged batch 9's file (``sources/0``) but before the offset log had batch 9 never ran
that batch after an ``availableNow`` restart (the restart ended with DONE at batch 8): Spark's side,
not the sink's (cause not investigated further; with a processing-time trigger the source's own log
says batch 9 exists).

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


def kill_process_group_at(kill_point: str, kill_at: int, streams: int = 1, data_dirs: list[Path] | None = None) -> None:
    """SIGKILL this whole process group once ``streams`` streams reached ``kill_point`` of checkpoint
    ``kill_at`` (for :data:`WRITERS_RUNNING`: once each of ``data_dirs`` holds a file of it)."""
    from iceberg_sink import _faults

    lock = threading.Lock()
    arrived: list[str] = []

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
            arrived.append(point)
            last = len(arrived) >= streams
        if last:
            kill_group(f"{point} {checkpoint_id}")
        wait_forever()

    _faults.install(kill)


def _max_checkpoint(sink: Any) -> int:
    snapshots = sink.load_table().snapshots()
    return max((int(s.summary["iceberg-sink.checkpoint-id"]) for s in snapshots if s.summary is not None), default=-1)


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    os.environ["PYSPARK_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    from iceberg_sink import IcebergSink
    from tests.integration.sources import CHANGE_SCHEMA_DDL, EVENT_SCHEMA_DDL

    streams = request["streams"]
    data_dirs: list[Path] = []  # filled once the tables exist
    if request.get("kill"):
        point, checkpoint = request["kill"]
        kill_process_group_at(point, int(checkpoint), streams=len(streams), data_dirs=data_dirs)

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
        builder = IcebergSink.builder().catalog("crash", **request["catalog"]).table(stream["table"])
        if stream["kind"] == "cdc":
            builder = builder.cdc(op_column="op", key=["id"], order_by="lsn").create_if_missing(
                partition_by=["bucket(4, id)"]
            )
            ddl = CHANGE_SCHEMA_DDL
        else:
            builder = builder.create_if_missing(partition_by=["bucket(3, user_id)"])
            ddl = EVENT_SCHEMA_DDL
        df = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).parquet(stream["source"])
        table = stream["table"]
        builder = builder.post_commit_hook(lambda result, table=table: say(f"COMMITTED {table} {result.checkpoint_id}"))
        sink = builder.build()
        trigger = {"processingTime": "0 seconds"} if until else {"availableNow": True}
        queries.append(sink.start(df, stream["checkpoint"], trigger=trigger))
        sinks.append(sink)
        data_dirs.append(Path(sink.load_table().location().removeprefix("file://")) / "data")
    say("STREAMING")
    if until:
        # Until every table holds the last checkpoint; then stop (see the module docstring).
        while not all(_max_checkpoint(sink) >= until - 1 for sink in sinks):
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
