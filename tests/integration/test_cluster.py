"""The sink on a Spark standalone cluster (a master and two workers on loopback), with task
failures and speculative execution.

The driver runs in a subprocess with a working directory of its own; executors run in the workers'
work directories with the workers' environment. Every table is read back here with Iceberg Java
and DuckDB and compared with the rows the test generated.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

from iceberg_sink import _task_faults
from tests.integration.cluster_driver import LAKE
from tests.integration.sources import event_batch, write_source_files
from tests.integration.standalone import StandaloneCluster, run_driver, standalone_cluster
from tests.integration.test_cdc import apply, expected, random_changes
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

# {task:05d}-{attempt id}-{job}-{checkpoint:06d}-{uuid}-{n}[-kind].parquet (writer/task_writer.py)
FILE_NAME = re.compile(r"^(\d{5})-(\d+)-([0-9a-f]+)-(\d{6})-[0-9a-f]+-\d{5}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


def drive(driver_dir: Path, plan: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the plan in a driver subprocess whose working directory is ``driver_dir``."""
    driver_dir.mkdir(parents=True, exist_ok=True)
    (driver_dir / "plan.json").write_text(json.dumps(plan))
    done = run_driver("tests.integration.cluster_driver", ["plan.json"], cwd=driver_dir, extra_env=env)
    result_file = driver_dir / "result.json"
    assert result_file.exists(), done.stdout + done.stderr[-5000:]
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["returncode"] = done.returncode
    result["stderr"] = done.stderr
    return result


def load(driver_dir: Path, name: str) -> Table:
    lake = driver_dir / LAKE
    catalog = load_catalog("iceberg_sink", type="sql", uri=f"sqlite:///{lake / 'catalog.db'}")
    return catalog.load_table(name)


def check_rows(java_reader: JavaIcebergReader, table: Table, rows: list[dict[str, Any]], key: str) -> None:
    assert normalize(java_reader.read(table.metadata_location), [key]) == rows
    assert normalize(duckdb_read(table.metadata_location), [key]) == rows


def change_batches(seed: int, batches: int) -> tuple[list[list[dict[str, Any]]], dict[int, dict[str, Any]]]:
    rng = random.Random(seed)
    model: dict[int, dict[str, Any]] = {}
    out = []
    lsn = 0
    for _ in range(batches):
        changes = random_changes(rng, model, lsn, rng.randrange(20, 50), keys=30)
        lsn = max(c["lsn"] for c in changes)
        apply(model, changes)
        out.append(changes)
    return out, model


def committed_files(table: Table) -> list[str]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        entry.data_file.file_path
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def attempts_by_task(paths: list[str]) -> dict[tuple[str, int], set[str]]:
    """(checkpoint, task) -> the attempt ids whose files are among ``paths``."""
    found: dict[tuple[str, int], set[str]] = {}
    for path in paths:
        match = FILE_NAME.match(Path(path).name)
        assert match is not None, path
        task, attempt, _, checkpoint = match.groups()
        found.setdefault((checkpoint, int(task)), set()).add(attempt)
    return found


def test_streaming_cdc_and_compaction_on_a_standalone_cluster(
    cluster: StandaloneCluster, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    driver_dir = tmp_path / "driver"
    sources = write_source_files(driver_dir / "src", files=3, rows_per_file=40)
    batches, model = change_batches(seed=5, batches=3)
    plan = {
        "master": cluster.url,
        "steps": [
            # Relative paths: the driver's, never the executors'.
            {"kind": "stream", "table": "db.events", "source": "src", "checkpoint": "ckpt/events"}
            | {"partition_by": ["bucket(4, user_id)"]},
            {"kind": "compact", "table": "db.events", "partition_by": ["bucket(4, user_id)"]},
            {"kind": "cdc", "table": "db.users", "batches": batches, "partition_by": ["bucket(2, id)"]},
            {"kind": "compact", "table": "db.users", "partition_by": ["bucket(2, id)"]},
        ],
    }
    result = drive(driver_dir, plan)
    assert all(step["ok"] for step in result["steps"]), result
    assert result["returncode"] == 0, result["stderr"][-3000:]
    assert [s["kind"] for s in result["steps"]] == ["stream", "compact", "cdc", "compact"]
    assert result["steps"][0]["commits"] == 3
    assert result["steps"][1]["rewritten"] > result["steps"][1]["added"] > 0
    assert result["steps"][3]["rewritten"] > 0

    # The executors ran in the workers' directories, not the driver's.
    executors = cluster.executor_dirs()
    assert executors, cluster.logs()
    assert all(driver_dir not in e.parents for e in executors)

    events = load(driver_dir, "db.events")
    check_rows(java_reader, events, normalize(pa.concat_tables(sources), ["event_id"]), "event_id")
    summaries = [s.summary for s in events.snapshots() if s.summary is not None]
    assert [s.get("iceberg-sink.checkpoint-id") for s in summaries] == ["0", "1", "2", None]
    assert summaries[-1].operation.value == "replace"

    users = load(driver_dir, "db.users")
    check_rows(java_reader, users, expected(model), "id")
    assert users.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
