"""Shared fixtures: one real local SparkSession per test session, and real SQLite catalogs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.interop.fixtures"]

# Python workers must run this interpreter (the one with iceberg_sink installed).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

# A session time zone that is not UTC, so time zone mistakes in transforms and casts show up.
SESSION_TZ = "America/Los_Angeles"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("iceberg_sink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", SESSION_TZ)
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def catalog_props(tmp_path: Path) -> dict[str, str]:
    """Properties of a fresh SQLite catalog with a local warehouse."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    return {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": warehouse.as_uri()}


@pytest.fixture
def catalog(catalog_props: dict[str, str]) -> object:
    from pyiceberg.catalog import load_catalog

    return load_catalog("test", **catalog_props)
