"""The Kafka parts of the Flink side of the CDC race on one topic (``flink_kafka``, issue 41 target 1).

Runs in the Flink venv, imported by ``benchmarks/flink_driver.py`` for ``"mode": "kafka"``; standard
library and PyFlink only (with ``benchmarks.cpu_monitor``).

- :func:`kafka_source_table`: the change topic as a Flink table, with Flink's Kafka SQL connector
  (``flink-connector-kafka`` 5.0.0-2.1, ``benchmarks/flink_env.py``) and the ``json`` format, from the
  earliest offsets to the latest ones at the job's start (``scan.bounded.mode``), so that the
  streaming job ends after the last message, its last commit included. Each of the job's source
  readers (parallelism ``parallelism``) reads its partitions in offset order; the upsert sink shuffles
  by ``id``, so every change of a key reaches its writer in stream order.
- :class:`CheckpointWatcher`: Flink's own checkpoint statistics of the job, read from the
  mini-cluster's REST endpoint (``rest.port``: a free port on 127.0.0.1) at each commit the driver
  sees, because the mini-cluster shuts down as soon as the job has ended: the checkpoints completed
  after the last successful read are missing from it (``checkpoints.history_complete`` says so).
"""

from __future__ import annotations

import json
import socket
import urllib.request
from typing import Any

COLUMNS = "id BIGINT, name STRING, version BIGINT, amount DOUBLE, ts TIMESTAMP_LTZ(6)"
SELECT_COLUMNS = "id, name, version, amount, ts"
GROUP_ID = "cdc-benchmark-flink"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rest_conf(port: int) -> dict[str, str]:
    """The mini-cluster's REST endpoint on ``port`` of 127.0.0.1 only, keeping every checkpoint's
    statistics (not only the newest 10)."""
    return {
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "rest.port": str(port),
        "rest.bind-port": str(port),
        "web.checkpoints.history": "100000",
    }


def kafka_source_table(t_env: Any, name: str, kafka: dict[str, Any]) -> str:
    """A temporary table over the change topic (JSON values; the key is not read)."""
    options = {
        "connector": "kafka",
        "topic": kafka["topic"],
        "properties.bootstrap.servers": kafka["bootstrap"],
        "properties.group.id": GROUP_ID,
        "scan.startup.mode": "earliest-offset",
        "scan.bounded.mode": "latest-offset",
        "format": "json",
        "json.timestamp-format.standard": "ISO-8601",
        "json.fail-on-missing-field": "true",
        "json.ignore-parse-errors": "false",
    }
    text = ", ".join(f"'{k}'='{v}'" for k, v in options.items())
    t_env.execute_sql(f"DROP TEMPORARY TABLE IF EXISTS {name}")
    t_env.execute_sql(f"CREATE TEMPORARY TABLE {name} ({COLUMNS}) WITH ({text})")
    return name


class CheckpointWatcher:
    """The job's checkpoint statistics from the REST endpoint, merged across reads by checkpoint id."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.job_id: str | None = None
        self.history: dict[int, dict[str, Any]] = {}
        self.summary: dict[str, Any] | None = None
        self.counts: dict[str, Any] | None = None
        self.reads = 0
        self.failed_reads = 0
        self.last_error: str | None = None

    def poll(self) -> None:
        """Read ``/jobs/<id>/checkpoints`` once; a failed read (the cluster gone) is counted, not raised."""
        if self.job_id is None:
            return
        url = f"http://127.0.0.1:{self.port}/jobs/{self.job_id}/checkpoints"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                data = json.loads(answer.read())
        except (OSError, ValueError) as e:
            self.failed_reads += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return
        self.reads += 1
        self.summary = data.get("summary")
        self.counts = data.get("counts")
        for entry in data.get("history") or []:
            self.history[int(entry["id"])] = entry

    def result(self) -> dict[str, Any]:
        """Each completed checkpoint's end-to-end duration (trigger to the last acknowledgement) and state
        size, Flink's summary over all of them, and whether every completed checkpoint was seen."""
        keep = ("id", "status", "trigger_timestamp", "latest_ack_timestamp", "end_to_end_duration", "state_size")
        entries = [{k: e.get(k) for k in keep} for _, e in sorted(self.history.items())]
        completed = [e for e in entries if e.get("status") == "COMPLETED"]
        in_order: list[float] = [float(d) for e in completed if (d := e.get("end_to_end_duration")) is not None]
        durations = sorted(in_order)
        counts = self.counts or {}
        return {
            "source": f"Flink's REST endpoint (127.0.0.1:{self.port}), read at each commit the driver saw",
            "reads": self.reads,
            "failed_reads": self.failed_reads,
            "last_error": self.last_error,
            "completed_seen": len(completed),
            "completed_at_last_read": counts.get("completed"),
            "history_complete": None if not counts else len(completed) == counts.get("completed"),
            "end_to_end_duration_ms": in_order,
            "end_to_end_duration_ms_p50": _median(durations),
            "end_to_end_duration_ms_max": durations[-1] if durations else None,
            "summary_at_last_read": self.summary,
            "history": entries,
        }


def _median(ordered: list[float]) -> float | None:
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
