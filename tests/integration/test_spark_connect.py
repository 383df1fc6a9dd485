"""A Spark Connect session is refused by name, before anything is created (iceberg_sink/_session.py).

The sink's driver side needs the Spark application's JVM (broadcast variables, the Python workers'
check, compaction tasks); a Connect client has none, and its ``foreachBatch`` runs in a Python
process of the server. Before the check every call failed deep inside with PySpark's
``JVM_ATTRIBUTE_NOT_SUPPORTED`` (``sparkContext``). The Connect session is real: a local server
started by the driver in a process of its own (this process already has a classic session).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from iceberg_sink import IcebergSink
from iceberg_sink.errors import InvalidSinkConfigError
from tests.integration import connect_driver as driver

ROOT = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def connect_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    work = tmp_path_factory.mktemp("connect")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SPARK_REMOTE", "SPARK_CONNECT"))}
    env["PYTHONPATH"] = str(ROOT)
    env["PYSPARK_PYTHON"] = sys.executable
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.connect_driver", str(work)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"connect_driver did not finish in {DRIVER_TIMEOUT_S:.0f}s; output tail:\n{output[-5000:]}")
    result = work / driver.RESULT_FILE
    if proc.returncode != 0 or not result.is_file():
        pytest.fail(f"connect_driver failed (exit {proc.returncode}); output tail:\n{output[-5000:]}")
    return work, json.loads(result.read_text(encoding="utf-8"))


def test_the_driver_used_a_real_spark_connect_session(connect_run: tuple[Path, dict[str, Any]]) -> None:
    _, result = connect_run
    assert result["session"].startswith("pyspark.sql.connect."), result["session"]
    assert result["rows"] == [[1, "a"]]  # the session itself answers


@pytest.mark.parametrize(
    "call",
    sorted(
        [
            "write",
            "write_debezium",
            "start",
            "compact_spark",
            "compact_active",
            "read_envelope",
            "read_json",
            "infer_json_schema",
        ]
    ),
)
def test_each_call_refuses_a_spark_connect_object_by_name(connect_run: tuple[Path, dict[str, Any]], call: str) -> None:
    _, result = connect_run
    outcome = result["calls"][call]
    assert outcome.get("error") == "InvalidSinkConfigError", outcome
    message = outcome["message"]
    assert "received a Spark Connect" in message and "needs a classic SparkSession" in message, message
    assert "SparkSession.builder.remote(...)" in message, message


def test_nothing_was_created_by_the_refused_calls(connect_run: tuple[Path, dict[str, Any]]) -> None:
    work, _ = connect_run
    assert not (work / "checkpoint").exists()
    with pytest.raises(InvalidSinkConfigError, match=f"table {driver.TABLE} does not exist"):
        IcebergSink.builder().embedded(work / "lake").table(driver.TABLE).build()
