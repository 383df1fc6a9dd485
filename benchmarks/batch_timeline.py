"""Where each micro-batch of a streaming query spends its wall time, from Spark's event log.

    .venv/bin/python -m benchmarks.cdc ... --sink-spark-conf spark.eventLog.enabled=true \\
        --sink-spark-conf spark.eventLog.dir=file:///tmp/ev --sink-spark-conf spark.eventLog.compress=false
    .venv/bin/python -m benchmarks.batch_timeline /tmp/ev/eventlog_v2_local-... [--skip 3]

A micro-batch is one root SQL execution whose description names a streaming run (``runId =``: Spark's
``addBatch``, which runs the sink's ``foreachBatch``); the Spark jobs it holds are those of the
executions under it (``rootExecutionId``). For each micro-batch, in wall milliseconds:

- ``before_jobs``: from the micro-batch's start to its first job's submission (the sink's driver work:
  reading, planning and building the batch, then Spark's planning of the write; no task runs);
- ``jobs``: from the first job's submission to the last one's end (the write job, and any other
  Spark job of the batch, such as a Debezium reader's statistics);
- ``after_jobs``: from the last job's end to the micro-batch's end (the committable staged, the
  commit or its hand-over to the commit lane);
- ``between``: from its end to the next micro-batch's start (Spark's offset and commit logs, the
  source's next offsets, the next batch's planning in Spark);
- the tasks of its jobs: how many, and the median task's run and CPU milliseconds (CPU of the JVM
  thread only: a Python worker's CPU is not in it).

Prints JSON: each micro-batch, and the medians over those after the first ``--skip``. Nothing here
changes what is measured: it only reads the log a run wrote.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_START = "SparkListenerSQLExecutionStart"
_END = "SparkListenerSQLExecutionEnd"


def events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of an uncompressed event log: a file, or a rolling log's folder (its
    ``events_*`` files in order)."""
    files = sorted(p for p in path.glob("events_*") if p.suffix == "") if path.is_dir() else [path]
    if not files:
        raise SystemExit(f"batch_timeline: expected an uncompressed event log at {path}, found none")
    for file in files:
        with file.open(encoding="utf-8") as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)


def _kind(event: dict[str, Any]) -> str:
    return str(event["Event"]).rsplit(".", 1)[-1]


def timeline(log: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per micro-batch of ``log``, in order (module docstring)."""
    started: dict[int, int] = {}
    ended: dict[int, int] = {}
    root_of: dict[int, int] = {}
    batches: list[int] = []
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    for event in log:
        kind = _kind(event)
        if kind == _START:
            execution = int(event["executionId"])
            root = int(event.get("rootExecutionId", execution))
            started[execution] = int(event["time"])
            root_of[execution] = root
            if root == execution and "runId =" in str(event.get("description", "")):
                batches.append(execution)
        elif kind == _END:
            ended[int(event["executionId"])] = int(event["time"])
        elif kind == "SparkListenerJobStart":
            execution_id = (event.get("Properties") or {}).get("spark.sql.execution.id")
            if execution_id is None:
                continue
            job = int(event["Job ID"])
            jobs[job] = {"execution": int(execution_id), "start": int(event["Submission Time"]), "tasks": []}
            for stage in event.get("Stage IDs", []):
                stage_job[int(stage)] = job
        elif kind == "SparkListenerJobEnd" and int(event["Job ID"]) in jobs:
            jobs[int(event["Job ID"])]["end"] = int(event["Completion Time"])
        elif kind == "SparkListenerTaskEnd" and int(event["Stage ID"]) in stage_job:
            metrics = event.get("Task Metrics") or {}
            jobs[stage_job[int(event["Stage ID"])]]["tasks"].append(
                (int(metrics.get("Executor Run Time", 0)), int(metrics.get("Executor CPU Time", 0)) / 1e6)
            )
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for job in jobs.values():
        if "end" in job and job["execution"] in root_of:
            by_batch.setdefault(root_of[job["execution"]], []).append(job)
    rows = []
    for n, batch in enumerate(batches):
        if batch not in ended:
            continue  # the log ends inside it
        held = by_batch.get(batch, [])
        first = min((j["start"] for j in held), default=ended[batch])
        last = max((j["end"] for j in held), default=ended[batch])
        tasks = [t for j in held for t in j["tasks"]]
        after = batches[n + 1] if n + 1 < len(batches) else None
        rows.append(
            {
                "execution": batch,
                "total": ended[batch] - started[batch],
                "before_jobs": first - started[batch],
                "jobs": last - first,
                "after_jobs": ended[batch] - last,
                "between": started[after] - ended[batch] if after is not None else None,
                "spark_jobs": len(held),
                "tasks": len(tasks),
                "task_run_p50": statistics.median(t[0] for t in tasks) if tasks else None,
                "task_cpu_p50": round(statistics.median(t[1] for t in tasks), 1) if tasks else None,
            }
        )
    return rows


def medians(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median of each field over ``rows`` (fields with no value left out of a median)."""
    fields = [k for k in (rows[0] if rows else {}) if k != "execution"]
    result: dict[str, float | None] = {}
    for field in fields:
        values = [r[field] for r in rows if r[field] is not None]
        result[field] = statistics.median(values) if values else None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batch_timeline", description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="an uncompressed event log: its file, or a rolling log's folder")
    parser.add_argument("--skip", type=int, default=3, help="first micro-batches left out of the medians")
    args = parser.parse_args(argv)
    rows = timeline(events(args.log))
    steady = rows[args.skip :]
    print(json.dumps({"batches": rows, "skipped": args.skip, "median": medians(steady)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
