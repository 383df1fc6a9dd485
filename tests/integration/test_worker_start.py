"""start() starts the Python workers the first micro-batch's write task reuses (writer/workers.py).

A new Python worker imports the writer (PyArrow, PyIceberg, pandas) before its first task runs: in a
fresh SparkContext the first micro-batch's write job waited for that. Each case runs a driver in a
fresh process (tests/integration/worker_start_driver.py), since the test session's workers have long
been started, and reads the daemon's workers from ``/proc``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.writer import workers

ROOT = Path(__file__).resolve().parents[2]


def run_driver(root: Path, mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
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


def test_started_once_per_spark_context(spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_started", set())  # as if this session had not started them yet
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(workers.START_JOB_GROUP))
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "a.json").write_text('{"id": 1}\n')
    stream = spark.readStream.schema("id long").json(str(tmp_path / "source"))
    for n in range(2):
        sink = IcebergSink.builder().embedded(tmp_path / "lake").table(f"db.t{n}").create_if_missing().build()
        query = sink.start(stream, str(tmp_path / f"checkpoint{n}"), trigger={"availableNow": True})
        query.awaitTermination()
        assert query.exception() is None
        assert sink.load_table().scan().to_arrow().num_rows == 1
    started = set(tracker.getJobIdsForGroup(workers.START_JOB_GROUP)) - before
    assert len(started) == 1, started  # the second start() ran none
