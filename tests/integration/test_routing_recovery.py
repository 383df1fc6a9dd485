"""A routed CDC stream (three tables, the same keys in each) with the driver SIGKILLed at each step of
a checkpoint, most importantly between two tables' commits; after every restart each table holds
each checkpoint exactly once, and finally Iceberg Java and DuckDB read each table equal to its model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog, load_catalog

from iceberg_sink import _faults
from iceberg_sink.committer.store import CheckpointStore
from tests.helpers import driver_env
from tests.integration.sources import ROUTED_CHANGE_SCHEMA_DDL, apply_changes, write_routed_change_files
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.slow, pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[2]
TABLES = ["orders", "users", "items"]
NAMES = [f"cdc.{t}" for t in TABLES]
FIRST, *OTHERS = sorted(NAMES)  # with one commit thread, tables commit in name order
# The tables commit one after another (.atomic_commits("off")), in name order on one thread, so a
# kill can fall between two tables' commits; test_atomic_... below is the default on a SQL catalog.
ONE_AT_A_TIME = {"write_options": {"iceberg-sink.route.commit-threads": 1}, "atomic_commits": "off"}
CONCURRENT = {"atomic_commits": "off"}
# (point, checkpoint, tables holding checkpoint c after the kill, tables with c stored after the kill)
# (A kill after the write, before any committable is stored, is test_recovery.py's: routing adds
# nothing to it.)
KILLS: list[tuple[str, int, list[str], list[str]]] = [
    # The first table's committable is persisted, the others' not yet.
    (_faults.AFTER_MANIFESTS, 3, [], [FIRST]),
    # Every committable persisted; the first table's commit reached the catalog.
    (_faults.COMMIT_SENT, 4, [FIRST], NAMES),
    # Between two tables' commits: the first committed (its committable not yet removed), the others stored.
    (_faults.AFTER_COMMIT, 5, [FIRST], NAMES),
]
# Kills while the tables commit on several threads: (point, checkpoint), after KILLS.
CONCURRENT_KILLS = [(_faults.COMMIT_SENT, 6), (_faults.AFTER_COMMIT, 7)]
FILES = 9


def run_driver(
    root: Path, catalog_props: dict[str, str], kill: Sequence[Any] | None, options: dict[str, Any] | None = None
) -> str:
    """Run the routed stream ``root``/src -> ``root``/ck in a crash driver; ``options`` add to or
    override the stream's request (crash_driver.py: ``key_column``, ``schema_evolution``, ...)."""
    request = root / "request.json"
    stream = {
        "kind": "cdc",
        "route": {"table_column": "tbl", "namespace": "cdc"},
        "ddl": ROUTED_CHANGE_SCHEMA_DDL,
        "source": str(root / "src"),
        "checkpoint": str(root / "ck"),
    } | (options or {})
    request.write_text(
        json.dumps({"catalog": catalog_props, "streams": [stream], "kill": list(kill) if kill else None})
    )
    out = root / f"driver-{time.monotonic_ns()}.out"
    env = driver_env()
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.crash_driver", str(request)],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out.read_text(encoding="utf-8", errors="replace")


def committed(catalog: Catalog, name: str) -> list[int]:
    if not catalog.table_exists(name):
        return []
    snapshots = catalog.load_table(name).snapshots()
    assert len({s.summary["iceberg-sink.job-id"] for s in snapshots}) <= 1  # type: ignore[index]
    return [int(s.summary["iceberg-sink.checkpoint-id"]) for s in snapshots]  # type: ignore[index]


def test_routed_stream_killed_between_two_tables_commits_and_at_every_step(
    tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    (tmp_path / "wh").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}
    per_table = write_routed_change_files(tmp_path / "src", TABLES, files=FILES, changes_per_file=25, keys=20, seed=5)
    catalog = load_catalog("crash", **props)
    for point, checkpoint, holding, stored in KILLS:
        output = run_driver(tmp_path, props, (point, checkpoint), ONE_AT_A_TIME)
        assert f"KILLING at {point} {checkpoint}" in output and "timeout" not in output, output[-4000:]
        for name in NAMES:
            where = f"{name} killed at {point} of checkpoint {checkpoint}"
            held = committed(catalog, name)
            assert held == list(range(checkpoint + (1 if name in holding else 0))), where
            pending = CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids()
            assert pending == ([checkpoint] if name in stored else []), where
    # Then with the tables committing on several threads (the default): whichever commits had landed
    # when the driver died, each table holds the checkpoint or has it stored, never neither.
    for point, checkpoint in CONCURRENT_KILLS:
        output = run_driver(tmp_path, props, (point, checkpoint), CONCURRENT)
        assert f"KILLING at {point} {checkpoint}" in output and "timeout" not in output, output[-4000:]
        holding = []
        for name in NAMES:
            where = f"{name} killed at {point} of checkpoint {checkpoint} (concurrent commits)"
            held = committed(catalog, name)
            assert held in (list(range(checkpoint)), list(range(checkpoint + 1))), where
            pending = CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids()
            if len(held) == checkpoint:
                assert pending == [checkpoint], where  # not committed: stored
            else:
                holding.append(name)
                assert pending in ([], [checkpoint]), where
        assert holding, f"killed at {point} of checkpoint {checkpoint}: no table holds it"
    output = run_driver(tmp_path, props, None, CONCURRENT)
    assert "DONE" in output, output[-4000:]
    check_tables(catalog, tmp_path, per_table, java_reader)


def check_tables(catalog: Catalog, root: Path, per_table: dict[str, Any], java_reader: JavaIcebergReader) -> None:
    """Every table holds each checkpoint once, nothing is pending, and Iceberg Java and DuckDB read it
    equal to its model."""
    for table, name in zip(TABLES, NAMES, strict=True):
        assert committed(catalog, name) == list(range(FILES)), name
        assert CheckpointStore.for_table(str(root / "ck"), name).pending_ids() == [], name
        loaded = catalog.load_table(name)
        assert loaded.schema().column_names == ["id", "v", "lsn"]
        expected = normalize(apply_changes(per_table[table]), ["id"])
        assert normalize(java_reader.read(loaded.metadata_location), ["id"]) == expected, f"{name}: Iceberg Java"
        assert normalize(duckdb_read(loaded.metadata_location), ["id"]) == expected, f"{name}: DuckDB"


# Atomic commits (the default on a SQL catalog): (kill, tables holding checkpoint c after it, whether
# every table has c stored). BETWEEN_TABLE_SWAPS and TRANSACTION_COMMITTED are hit once per
# transaction of several tables (checkpoint id -1): the N-th is checkpoint N-1's.
ATOMIC_KILLS: list[tuple[list[Any], int, bool, bool]] = [
    # Inside the transaction, after the first table's pointer moved: rolled back, none holds it.
    ([_faults.BETWEEN_TABLE_SWAPS, -1, 3], 2, False, True),
    # The transaction committed, no table has seen the answer: every table holds it, all stored.
    ([_faults.TRANSACTION_COMMITTED, -1, 2], 3, True, True),
    # The first table to see the answer (the others hold it too).
    ([_faults.COMMIT_SENT, 4], 4, True, True),
    # A table removed its committable... or not yet: every table holds the checkpoint.
    ([_faults.AFTER_COMMIT, 5], 5, True, None),  # type: ignore[list-item]
]


def test_atomic_routed_stream_killed_inside_its_transaction_and_at_every_step(
    tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """Every kill leaves every table at the same checkpoint: none or all of them hold the checkpoint
    being committed, and each has it stored until it holds it."""
    (tmp_path / "wh").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}
    per_table = write_routed_change_files(tmp_path / "src", TABLES, files=FILES, changes_per_file=25, keys=20, seed=7)
    catalog = load_catalog("crash", **props)
    for kill, checkpoint, holds, stored in ATOMIC_KILLS:
        output = run_driver(tmp_path, props, kill)
        assert f"KILLING at {kill[0]}" in output and "timeout" not in output, output[-4000:]
        where = f"killed at {kill} (checkpoint {checkpoint})"
        held = {name: committed(catalog, name) for name in NAMES}
        assert all(h == list(range(checkpoint + (1 if holds else 0))) for h in held.values()), (where, held)
        pending = {name: CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids() for name in NAMES}
        if stored is None:
            assert all(p in ([], [checkpoint]) for p in pending.values()), (where, pending)
        else:
            assert all(p == ([checkpoint] if stored else []) for p in pending.values()), (where, pending)
    output = run_driver(tmp_path, props, None)
    assert "DONE" in output, output[-4000:]
    check_tables(catalog, tmp_path, per_table, java_reader)
