"""start() starts the Python workers the first micro-batch's write task reuses (writer/workers.py).

A new Python worker imports the writer (PyArrow, PyIceberg, pandas) before its first task runs: in a
fresh SparkContext the first micro-batch's write job waited for that. A stream of Debezium envelopes
or a routed one starts them while its first micro-batch runs its other Spark jobs; a stream whose
first job is its write does not (the start job would compete with it). The first two cases run a
driver in a fresh process (tests/integration/worker_start_driver.py), since the test session's
workers have long been started, and read the daemon's workers from ``/proc``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.writer import workers
from tests.helpers import driver_env

ROOT = Path(__file__).resolve().parents[2]


def run_driver(root: Path, mode: str) -> dict[str, Any]:
    env = driver_env()
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.worker_start_driver", str(root), mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_first_write_reuses_the_workers_start_started(tmp_path: Path) -> None:
    got = run_driver(tmp_path / "on", "on")
    assert got["rows"] == 10
    # One job of one stage; its single task chained two Python functions: two workers, each of which
    # imported the writers' modules before any micro-batch ran.
    assert got["start_jobs"] == 1 and [len(s) for s in got["stages"]] == [1], got
    assert len(got["before"]) == workers.STARTED_WORKERS, got
    assert got["imported"] == got["before"], got
    # The micro-batch's write task ran in one of them: no worker was forked for it.
    assert got["after"] == got["before"], got


def test_without_the_option_the_write_starts_its_own(tmp_path: Path) -> None:
    got = run_driver(tmp_path / "off", "off")
    assert got["rows"] == 10
    assert got["start_jobs"] == 0 and got["before"] == [], got
    assert got["after"], got  # forked by the micro-batch's write task


def test_started_once_per_spark_context_for_routed_and_debezium_streams(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers, "_started", set())  # as if this session had not started them yet
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(workers.START_JOB_GROUP))

    def started() -> set[int]:
        return set(tracker.getJobIdsForGroup(workers.START_JOB_GROUP)) - before

    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "a.json").write_text('{"id": 1, "t": "a"}\n')
    stream = spark.readStream.schema("id long, t string").json(str(tmp_path / "source"))
    lake = tmp_path / "lake"
    plain = IcebergSink.builder().embedded(lake).table("db.plain").create_if_missing().build()
    routed = IcebergSink.builder().embedded(lake).route(table_column="t", namespace="db").create_if_missing().build()
    envelopes = spark.readStream.schema("value string").json(str(tmp_path / "source"))
    debezium = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.dbz")
        .create_if_missing()
        .debezium(table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    for n, (sink, source, want) in enumerate(((plain, stream, 0), (routed, stream, 1), (routed, stream, 1))):
        query = sink.start(source, str(tmp_path / f"checkpoint{n}"), trigger={"availableNow": True})
        query.awaitTermination()
        assert query.exception() is None
        # A plain stream's first job is its write: nothing started. The routed one starts them once.
        assert len(started()) == want, (n, started())
    monkeypatch.setattr(workers, "_started", set())
    query = debezium.start(envelopes, str(tmp_path / "checkpoint-dbz"), trigger={"availableNow": True})
    query.awaitTermination()
    assert len(started()) == 2  # the Debezium stream started them too
