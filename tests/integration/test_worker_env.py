"""Spark's Python workers must be able to import what the writers need; if they cannot, start() and
write() raise one WorkerEnvironmentError naming the interpreter and the missing modules, before
anything is written. Checked with real interpreters: a bare venv, and a path that does not exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.errors import WorkerEnvironmentError
from iceberg_sink.writer import workers
from tests.integration.cluster_driver import LAKE
from tests.integration.sources import EVENT_SCHEMA_DDL, event_batch, write_source_files
from tests.integration.standalone import run_driver

pytestmark = pytest.mark.slow


def test_workers_without_the_sink_fail_once_with_the_interpreter_and_modules(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = bare / "bin" / "python"
    driver_dir = tmp_path / "driver"
    write_source_files(driver_dir / "src", files=1, rows_per_file=10)
    plan = {
        "master": "local[2]",
        "steps": [
            {"kind": "append", "table": "db.events", "batches": [[0, 20]]},
            {"kind": "stream", "table": "db.events", "source": "src", "checkpoint": "ckpt"},
        ],
        "continue_on_error": True,
    }
    (driver_dir / "plan.json").write_text(json.dumps(plan))
    done = run_driver(
        "tests.integration.cluster_driver", ["plan.json"], cwd=driver_dir, extra_env={"PYSPARK_PYTHON": str(python)}
    )
    result = json.loads((driver_dir / "result.json").read_text())
    assert [s["kind"] for s in result["steps"]] == ["append", "stream"], done.stderr[-3000:]
    for step in result["steps"]:
        assert step["error_type"] == "WorkerEnvironmentError", step
        message = step["error"]
        assert str(python) in message, message
        assert "pyarrow" in message and "pyiceberg" in message, message
        assert "Traceback" not in message and "at org.apache" not in message, message
    # No Python worker ran a writer: no task failed, so Spark logged no task's stack trace.
    assert "Lost task" not in done.stderr and "ModuleNotFoundError" not in done.stderr, done.stderr[-3000:]
    # Nothing was written: not even the table was created.
    assert not (driver_dir / LAKE / "warehouse" / "db").exists()


def test_a_worker_interpreter_that_cannot_start_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-env" / "bin" / "python"
    driver_dir = tmp_path / "driver"
    plan = {"master": "local[1]", "steps": [{"kind": "append", "table": "db.events", "batches": [[0, 20]]}]}
    driver_dir.mkdir()
    (driver_dir / "plan.json").write_text(json.dumps(plan))
    done = run_driver(
        "tests.integration.cluster_driver", ["plan.json"], cwd=driver_dir, extra_env={"PYSPARK_PYTHON": str(missing)}
    )
    result = json.loads((driver_dir / "result.json").read_text())
    step = result["steps"][0]
    assert step["error_type"] == "WorkerEnvironmentError", (step, done.stderr[-3000:])
    assert str(missing) in step["error"], step["error"]


def test_the_check_runs_once_per_spark_context_and_needs_no_spark_job_on_a_local_master(
    spark: SparkSession, tmp_path: Path
) -> None:
    tracker = spark.sparkContext.statusTracker()
    workers._checked.clear()
    before = len(tracker.getJobIdsForGroup(workers.PROBE_JOB_GROUP))
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.events").create_if_missing().build()
    sink.write(spark.createDataFrame(event_batch(0, 10).to_pylist(), EVENT_SCHEMA_DDL))
    key = (str(spark.sparkContext.applicationId), str(spark.sparkContext.pythonExec))
    assert workers._checked == {key}
    sink.write(spark.createDataFrame(event_batch(10, 10).to_pylist(), EVENT_SCHEMA_DDL))
    # local[2]: the workers' interpreter was asked here, in a subprocess, not by a Spark job.
    assert len(tracker.getJobIdsForGroup(workers.PROBE_JOB_GROUP)) == before
    # A module the subprocess misses goes to the Spark job, which decides (one job) and names it; the
    # job's group does not stick to the caller's later jobs.
    workers._checked.clear()
    with pytest.raises(WorkerEnvironmentError, match="no_such_module_here"):
        workers.check_python_workers(spark, (*workers.REQUIRED_MODULES, "no_such_module_here"))
    assert len(tracker.getJobIdsForGroup(workers.PROBE_JOB_GROUP)) == before + 1
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


def test_the_local_check_finds_what_a_worker_would_and_nothing_more(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = spark.sparkContext
    assert workers._local_check(context, sys.executable, workers.REQUIRED_MODULES)
    # A module only the working directory holds: a worker's working directory may differ.
    (tmp_path / "only_in_the_working_directory.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert not workers._local_check(context, sys.executable, ("only_in_the_working_directory",))
    # A module on PYTHONPATH is found, as Spark passes PYTHONPATH on to its workers.
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert workers._local_check(context, sys.executable, ("only_in_the_working_directory",))
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    assert not workers._local_check(context, str(bare / "bin" / "python"), workers.REQUIRED_MODULES)
    assert not workers._local_check(context, str(tmp_path / "no-such-python"), workers.REQUIRED_MODULES)
