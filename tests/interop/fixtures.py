"""Session-scoped pytest fixtures for the interop readers.

Register with ``pytest_plugins = ["tests.interop.fixtures"]`` in tests/conftest.py.

- ``java_reader``: Iceberg Java 1.9.2 on Spark 3.5 (the reference reader).
- ``java_newest_reader``: the newest Iceberg Java on the project's own Spark 4.x.
- ``java_readers``: both, for ``readers.assert_readers_agree`` ("1.9.2, the newest and DuckDB all
  equal the model"). Each server is started once per session, on first use.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interop.java_env import JavaEnv, ensure_java_env, newest_runtime, reference_runtime
from tests.interop.readers import JavaIcebergReader


@pytest.fixture(scope="session")
def java_env() -> JavaEnv:
    """The PySpark 3.5 + Iceberg Java 1.9.2 venv (built on first use, ~1 min; then reused)."""
    return ensure_java_env()


@pytest.fixture(scope="session")
def java_reader(java_env: JavaEnv) -> Iterator[JavaIcebergReader]:
    """One Iceberg Java 1.9.2 reader server (one SparkSession) for the whole test session."""
    reader = JavaIcebergReader(reference_runtime(java_env))
    try:
        yield reader
    finally:
        reader.close()


@pytest.fixture(scope="session")
def java_newest_reader() -> Iterator[JavaIcebergReader]:
    """One reader server of the newest Iceberg Java (on this venv's PySpark) for the whole session."""
    reader = JavaIcebergReader(newest_runtime())
    try:
        yield reader
    finally:
        reader.close()


@pytest.fixture(scope="session")
def java_readers(
    java_reader: JavaIcebergReader, java_newest_reader: JavaIcebergReader
) -> tuple[JavaIcebergReader, ...]:
    """Iceberg Java 1.9.2 and the newest Iceberg Java, in that order."""
    return (java_reader, java_newest_reader)
