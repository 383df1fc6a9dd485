"""A driver in a fresh process (a SparkContext no Python task ran in yet) for test_worker_start.py.

    python -m tests.integration.worker_start_driver ROOT on|off

Starts a file stream (``processingTime`` 200 ms, its source directory empty) into a routed sink (whose
first micro-batch counts its tables in a Spark job before it writes) with
``iceberg-sink.write.start-python-workers`` on or off. With it on, waits for the sink's start job
(writer/workers.py) to finish. Then lists the Python workers of Spark's daemon (``before``), drops one
source file, waits for its commit and lists them again (``after``); prints one JSON line: the start
jobs and their stages, both lists, and which workers of ``before`` had loaded PyIceberg's native
library (``imported``: a module of the writers' list, read from the process's memory maps).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.writer import workers


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def python_workers(jvm_pid: int) -> list[int]:
    """The Python workers forked by Spark's daemon(s) under the JVM ``jvm_pid``."""
    found = []
    for child in _children(jvm_pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pyspark.daemon" in command:
            found += _children(child)
    return sorted(found)


def _wait(condition: object, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def main(root: Path, mode: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    tracker = spark.sparkContext.statusTracker()
    source = root / "source"
    source.mkdir(parents=True)
    sink = (
        IcebergSink.builder()
        .embedded(root / "lake")
        .route(table_column="t", namespace="db")
        .create_if_missing()
        .write_option("iceberg-sink.write.start-python-workers", mode == "on")
        .build()
    )
    stream = spark.readStream.schema("id long, v string, t string").json(str(source))
    query = sink.start(stream, str(root / "checkpoint"), trigger={"processingTime": "200 milliseconds"})

    def start_jobs() -> list[int]:
        return list(tracker.getJobIdsForGroup(workers.START_JOB_GROUP))

    if mode == "on":
        _wait(lambda: start_jobs() and all(tracker.getJobInfo(j).status == "SUCCEEDED" for j in start_jobs()), "start")
    before = python_workers(jvm_pid)
    imported = [pid for pid in before if b"pyiceberg_core" in Path(f"/proc/{pid}/maps").read_bytes()]
    (source / "part-0.json").write_text(
        "".join(json.dumps({"id": i, "v": f"v{i}", "t": "t"}) + "\n" for i in range(10))
    )

    def committed() -> bool:
        try:
            return len(sink.load_table("db.t").snapshots()) >= 1
        except InvalidSinkConfigError:  # not created yet
            return False

    _wait(committed, "the commit")
    after = python_workers(jvm_pid)
    rows = sink.load_table("db.t").scan().to_arrow().num_rows
    query.stop()
    stages = [list(tracker.getJobInfo(j).stageIds) for j in start_jobs()]
    print(
        json.dumps(
            {
                "start_jobs": len(start_jobs()),
                "stages": stages,
                "before": before,
                "imported": imported,
                "after": after,
                "rows": rows,
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
