"""Shared fixtures: one real local SparkSession per test session, and real SQLite catalogs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.interop.fixtures"]

# Python workers must run this interpreter (the one with iceberg_sink installed).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

# A session time zone that is not UTC, so time zone mistakes in transforms and casts show up.
SESSION_TZ = "America/Los_Angeles"


# The test files that take longest (minutes each: subprocess drivers killed and restarted, clusters,
# the model check), longest first. scripts/test.sh runs whole files on 2 workers in collection order
# (--no-loadscope-reorder), so these start first and the run does not end on one long file while
# the other worker idles. Order only: nothing is skipped.
SLOW_FILES_FIRST = (  # seconds per file in a 2-worker run of 2026-11-26 (junit times)
    "integration/test_debezium_transactions.py",  # 575 alone on a shared machine (2026-12-02; new since)
    "model/test_model.py",  # 397
    "integration/test_recovery.py",  # 244
    "integration/test_debezium_toast.py",  # 154
    "integration/test_v3_cdc.py",  # about 150 (new since; estimated from its setup and Java reads)
    "integration/test_v3_rest.py",  # about 170 (new since; SeaweedFS, REST, Java and DuckDB)
    "integration/test_key_index_restart.py",  # about 200 (new since; two key forms, three reads each)
    "integration/test_key_index_s3.py",  # about 55 (new in session 33)
    "integration/test_cluster.py",  # 138
    "e2e/test_pipeline_e2e.py",  # 137
    "e2e/test_transactions_e2e.py",  # about 130 (new since; the consistent leg)
    "integration/test_dead_letter.py",  # 136
    "integration/test_routing_keys_recovery.py",  # 129
    "integration/test_spark_submit.py",  # 116
    "integration/test_routing_recovery.py",  # 116
    "integration/test_conversion.py",  # 113
    "integration/test_debezium_events.py",  # 102
    "integration/test_v3_compaction.py",  # about 100 (new since; estimated)
    "docs/test_samples.py",  # 101
    "integration/test_cli.py",  # 95
    "integration/test_routing_many.py",  # 88
    "integration/test_demo.py",  # 78
    "integration/test_catalog_outage.py",  # 77
    "integration/test_key_index_partitioned.py",  # about 75 (new in session 32: Spark jobs, three readers)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    tests_root = Path(__file__).parent

    def file_rank(item: pytest.Item) -> int:
        try:
            name = item.path.relative_to(tests_root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(name, len(rank))

    items.sort(key=file_rank)  # stable: every other test keeps its place


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


@pytest.fixture(params=[False, True], ids=["escapes", "escaped-literals"])
def literal_mode(request: pytest.FixtureRequest, spark: Any) -> Iterator[bool]:
    """Both of Spark's ways to read a string literal in SQL text: backslash escapes (the default), and
    ``spark.sql.parser.escapedStringLiterals=true`` (a legacy setting: backslashes kept as written)."""
    spark.conf.set("spark.sql.parser.escapedStringLiterals", str(request.param).lower())
    try:
        yield request.param
    finally:
        spark.conf.unset("spark.sql.parser.escapedStringLiterals")


@pytest.fixture(params=[True, False], ids=["ansi", "no-ansi"])
def ansi_mode(request: pytest.FixtureRequest, spark: Any) -> Iterator[bool]:
    """Both of Spark's ways to meet a value that does not fit (a bad cast, an overflow): an error
    under ANSI mode (Spark 4's default) and a null without it (Spark 3.5's default, a setting users
    keep). The sink's refusals must not depend on it."""
    spark.conf.set("spark.sql.ansi.enabled", str(request.param).lower())
    try:
        yield request.param
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")


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
