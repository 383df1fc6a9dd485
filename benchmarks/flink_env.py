"""Where the Flink side of the CDC benchmark runs: PyFlink in a venv of its own, plus its jars.

``ensure_flink_env()`` returns the venv's python (built on first use, then reused: a marker file
holding the requirement list is written only after a successful install, as in
``tests/interop/java_env.py``) and the jars the driver puts on the JVM's class path, fetched once
from Maven Central into the project's cache (``tests/interop/maven.py``).

Versions, as published on 2026-11-26:

- Apache Iceberg 1.12.0 is the newest release, but it publishes no ``iceberg-flink-runtime-*`` on
  Maven Central (1.20, 2.0, 2.1 and 2.2 all refused for 1.12.0); the newest release that does is
  **1.11.0**, with runtimes for Flink 2.0 and **2.1** (none for 2.2).
- PyPI's ``apache-flink`` has 2.1.3, the last 2.1 patch, with wheels for Python 3.11 (it pins
  its own NumPy, pandas, PyArrow and Apache Beam, so it cannot share the project's venv).
- The Iceberg Hadoop catalog needs Hadoop's classes, which PyFlink does not ship: the shaded
  client, ``hadoop-client-api`` (the public API, ``Configuration``, ``FileSystem``) and
  ``hadoop-client-runtime`` (its shaded third-party dependencies), 3.4.1.
- The ``_kafka`` systems only (``ensure_flink_env(kafka=True)``): Flink's Kafka connector for Flink
  2.1, ``flink-connector-kafka`` **5.0.0-2.1**, with its runtime dependencies (``kafka-clients``
  4.2.0, its compression libraries, Jackson, commons-lang3; Flink's own artifacts and slf4j, which
  PyFlink ships, left out). Maven Central has no ``flink-sql-connector-kafka`` (the shaded jar) for
  2.1: 4.0.1-2.0 and 5.0.0-2.2 only. The ``json`` format is PyFlink's own (``lib/flink-json-2.1.3.jar``).

The venv lives at ``$ICEBERG_SINK_FLINK_VENV`` or ``<project>/.venv-flink``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT: Path = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from tests.interop.java_env import ensure_pip_venv  # noqa: E402  (the project root must be importable first)
from tests.interop.maven import fetch_jars  # noqa: E402

FLINK_VERSION: str = "2.1.3"
FLINK_MINOR: str = "2.1"
ICEBERG_VERSION: str = "1.11.0"
HADOOP_VERSION: str = "3.4.1"
KAFKA_CONNECTOR_VERSION: str = f"5.0.0-{FLINK_MINOR}"
REQUIREMENTS: tuple[str, ...] = (f"apache-flink=={FLINK_VERSION}",)
DEFAULT_VENV_DIR: Path = PROJECT_ROOT / ".venv-flink"
VENV_ENV_VAR: str = "ICEBERG_SINK_FLINK_VENV"


@dataclass(frozen=True)
class FlinkEnv:
    """The Flink venv's python and the jars its driver puts on the JVM's class path."""

    python: Path
    jars: tuple[Path, ...]


def ensure_flink_python(venv_dir: Path | None = None) -> Path:
    """The python of the Flink venv (``REQUIREMENTS``), built once and reused."""
    override = os.environ.get(VENV_ENV_VAR)
    if venv_dir is None:
        venv_dir = Path(override).expanduser() if override else DEFAULT_VENV_DIR
    # No pip check: apache-flink pins versions its own dependencies' metadata disagree with.
    return ensure_pip_venv(venv_dir, REQUIREMENTS, "Flink", "import pyflink.table, pyarrow.parquet", pip_check=False)


def flink_jars() -> tuple[Path, ...]:
    """``iceberg-flink-runtime`` and the Hadoop client jars (fetched once, cached)."""
    runtime = f"iceberg-flink-runtime-{FLINK_MINOR}"
    jars = fetch_jars(f"{runtime}-{ICEBERG_VERSION}", [f"org.apache.iceberg:{runtime}:{ICEBERG_VERSION}"])
    hadoop = fetch_jars(
        f"hadoop-client-{HADOOP_VERSION}",
        [
            f"org.apache.hadoop:hadoop-client-api:{HADOOP_VERSION}",
            f"org.apache.hadoop:hadoop-client-runtime:{HADOOP_VERSION}",
        ],
    )
    return (*jars, *hadoop)


def flink_kafka_jars() -> tuple[Path, ...]:
    """``flink-connector-kafka`` and its runtime dependencies but Flink's and slf4j (fetched once, cached)."""
    coordinate = f"org.apache.flink:flink-connector-kafka:{KAFKA_CONNECTOR_VERSION}"
    connector = fetch_jars(f"flink-connector-kafka-{KAFKA_CONNECTOR_VERSION}-jar", [coordinate])
    # Excluding Flink's group leaves the connector itself out too: its dependencies are a set of their own.
    dependencies = fetch_jars(
        f"flink-connector-kafka-{KAFKA_CONNECTOR_VERSION}",
        [coordinate],
        transitive=True,
        exclude_groups=["org.apache.flink", "org.slf4j"],
    )
    return (*connector, *dependencies)


def ensure_flink_env(venv_dir: Path | None = None, kafka: bool = False) -> FlinkEnv:
    """The venv and the jars; with ``kafka``, Flink's Kafka connector's too (the _kafka systems)."""
    jars = flink_jars() + (flink_kafka_jars() if kafka else ())
    return FlinkEnv(python=ensure_flink_python(venv_dir), jars=jars)


if __name__ == "__main__":
    env = ensure_flink_env(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"python={env.python}\njars={', '.join(str(j) for j in env.jars)}")
