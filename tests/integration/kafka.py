"""A real Kafka broker, Kafka Connect with Debezium, and Spark's Kafka source jars for tests.

Everything comes from scripts/pipeline_components.py (the same code the docs' scripts run): jars
fetched once from Maven Central into ``${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven``, JVMs on
127.0.0.1 in the test's temporary directory. A component that cannot be fetched or started fails the
test with its log; it never skips.

Tests that need Spark's Kafka source run their Spark in a subprocess (the session's shared
SparkSession is started without the jars): :func:`spark_kafka_conf` gives the ``spark.jars`` entry,
for the installed PySpark or another Spark version (tests/integration/test_spark35.py: 3.5).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import scripts


def components() -> ModuleType:
    """scripts/pipeline_components.py as a module (scripts/ is not a package)."""
    return scripts.load("pipeline_components.py")


@contextlib.contextmanager
def started_components(database: Any) -> Iterator[list[Any]]:
    """A list to append each component to before starting it; at exit they are stopped, last first,
    and ``database`` (the source database server) closed. A component that cannot be fetched or
    started fails the test with its message."""
    started: list[Any] = []
    try:
        yield started
    except components().ComponentError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        for component in reversed(started):
            with contextlib.suppress(Exception):
                component.stop()
        database.close()


def _fail(e: Exception) -> None:
    pytest.fail(f"{type(e).__name__}: {e}", pytrace=False)


def spark_kafka_conf(spark_version: str | None = None) -> dict[str, str]:
    """``spark.jars`` of Spark's Kafka source for ``spark_version`` (default: the installed PySpark's;
    the Spark 3.5 tests pass their venv's), fetched on first use."""
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    try:
        jars = components().spark_kafka_jars(spark_version)
    except Exception as e:
        _fail(e)
    return {"spark.jars": ",".join(str(p) for p in jars)}


def start_broker(root: Path) -> object:
    try:
        broker = components().KafkaBroker(root)
        broker.start()
    except Exception as e:
        _fail(e)
    return broker


@pytest.fixture
def kafka_broker(tmp_path: Path) -> Iterator[object]:
    """A started one-node KRaft broker of its own for one test (tests may stop and start it)."""
    broker = start_broker(tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.stop()  # type: ignore[attr-defined]


ROOT = Path(__file__).resolve().parents[2]


def run_spark_driver(module: str, request: Path, fields: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module request`` (a test's Spark driver with Spark's Kafka source) with
    ``fields`` and the source's jars (``"jars"``) written to ``request``, in a process group of its
    own (a driver that kills itself takes its JVM and workers, not the test)."""
    request.write_text(json.dumps({"jars": spark_kafka_conf()["spark.jars"], **fields}))
    return subprocess.run(
        [sys.executable, "-m", module, str(request)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        start_new_session=True,
    )
