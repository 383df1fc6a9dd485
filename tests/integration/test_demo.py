"""`iceberg-sink demo`: it streams, summarizes, checks the table against its model, and fails when
the table differs.

The demo starts and stops its own SparkSession, so it runs in a subprocess.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.cli.demo import Generator, LiveDisplay, differences

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEMO = (sys.executable, "-m", "iceberg_sink.cli", "demo", "--compact-every", "2")


def run_demo(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [*DEMO, "--root", str(tmp_path / "demo"), "--batches", "3", "--rows", "300", "--keys", "400", *extra],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_demo_streams_summarizes_and_checks(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--prometheus-port", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Prometheus metrics at http://127.0.0.1:" in out
    # Not a terminal: one plain line per micro-batch instead of the live display.
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("checkpoint ")] == [
        "checkpoint 1/3 committed",
        "checkpoint 2/3 committed",
        "checkpoint 3/3 committed",
    ]
    assert "900 change events" in out and "summary" in out
    assert "compactions     1 of 1 triggered" in out
    assert "CHECK PASSED: the table read by DuckDB's Iceberg extension holds exactly" in out


def test_demo_check_fails_when_the_table_differs(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--tamper")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "CHECK FAILED: the table read by DuckDB's Iceberg extension differs from what was sent" in done.stdout
    assert "1 accounts not expected (e.g. account_id [1000000000])" in done.stdout


def test_demo_checks_with_pyiceberg_without_duckdb(tmp_path: Path) -> None:
    done = run_demo(tmp_path, "--reader", "pyiceberg")
    assert done.returncode == 0, done.stdout + done.stderr
    # The CDC table is format v3: PyIceberg reads its deletion vectors, nothing converted first.
    assert "CHECK PASSED: the table read by PyIceberg holds exactly" in done.stdout


def test_differences_names_missing_extra_changed_and_duplicate_rows() -> None:
    generator = Generator(seed=1, keys=50)
    generator.batch(200)
    expected = generator.expected()
    assert differences(expected, expected) == []
    rows = expected.to_pylist()
    changed = dict(rows[1], plan="changed")
    extra = dict(rows[2], account_id=999, updated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    actual = pa.Table.from_pylist([changed, *rows[2:], extra, rows[3]], schema=expected.schema)
    assert differences(actual, expected) == [
        "1 duplicate rows of one key",
        f"1 accounts missing (e.g. account_id [{rows[0]['account_id']}])",
        "1 accounts not expected (e.g. account_id [999])",
        f"1 accounts with other values (e.g. account_id [{rows[1]['account_id']}])",
    ]


def test_live_display_renders_the_sinks_progress(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing().upsert(["id"]).build()
    for i in range(2):
        sink.write(spark.createDataFrame([(i, "a"), (i + 10, "b")], "id long, v string"))
    display = LiveDisplay()
    display.update(sink, 3, 4)
    display.close()
    out = capsys.readouterr().out
    assert "2/3 micro-batches, 2 snapshots committed" in out
    assert "4 rows written from 4 change events" in out
    assert "newest micro-batches" in out and "committed" in out
