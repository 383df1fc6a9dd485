"""Session-scoped pytest fixtures for the interop readers.

Register with ``pytest_plugins = ["tests.interop.fixtures"]`` in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interop.java_env import JavaEnv, ensure_java_env
from tests.interop.readers import JavaIcebergReader


@pytest.fixture(scope="session")
def java_env() -> JavaEnv:
    """The PySpark 3.5 + Iceberg Java 1.9.2 venv (built on first use, ~1 min; then reused)."""
    return ensure_java_env()


@pytest.fixture(scope="session")
def java_reader(java_env: JavaEnv) -> Iterator[JavaIcebergReader]:
    """One Iceberg Java reader server (one SparkSession) for the whole test session."""
    reader = JavaIcebergReader(java_env)
    try:
        yield reader
    finally:
        reader.close()
