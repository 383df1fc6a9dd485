"""The sink on a Spark standalone cluster (a master and two workers on loopback), with task
failures and speculative execution.

The driver runs in a subprocess with a working directory of its own; executors run in the workers'
work directories with the workers' environment. Every table is read back here with Iceberg Java
and DuckDB and compared with the rows the test generated.
"""

from __future__ import annotations

import datetime as dt
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
from iceberg_sink.topology.maintenance import remove_orphan_files
from tests.integration.cluster_driver import LAKE
from tests.integration.sources import event_batch, write_source_files
from tests.integration.standalone import StandaloneCluster, run_driver, standalone_cluster
from tests.integration.test_cdc import apply, expected, random_changes
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

PARTITIONED_INDEX = {
    "iceberg-sink.key-index.mode": "partitioned",
    "iceberg-sink.key-index.partitions": 4,
    "iceberg-sink.key-index.driver-max-bytes": 0,
}

# {task:05d}-{attempt id}-{job}-{checkpoint:06d}-{uuid}-{n}[-kind].parquet (writer/task_writer.py)
FILE_NAME = re.compile(r"^(\d{5})-(\d+)-([\w-]+)-(\d{6})-[0-9a-f]+-\d{5}")


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
    """The data and delete files of every snapshot (files compaction replaced included)."""
    return sorted(
        {
            entry.data_file.file_path
            for snapshot in table.snapshots()
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        }
    )


def attempts_by_task(paths: list[str]) -> dict[tuple[str, str, int], set[str]]:
    """(job, checkpoint, task) -> the attempt ids whose files are among ``paths``."""
    found: dict[tuple[str, str, int], set[str]] = {}
    for path in paths:
        if path.endswith("-dv.puffin"):
            continue  # a v3 table's deletion vectors: written by the committer on the driver, not by a task
        match = FILE_NAME.match(Path(path).name)
        assert match is not None, path
        task, attempt, job, checkpoint = match.groups()
        found.setdefault((job, checkpoint, int(task)), set()).add(attempt)
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
            # The partitioned key index (issue 43), every step of it a Spark job on the workers.
            {"kind": "cdc", "table": "db.users_pi", "batches": batches, "write_options": PARTITIONED_INDEX},
        ],
    }
    result = drive(driver_dir, plan)
    assert all(step["ok"] for step in result["steps"]), result
    assert result["returncode"] == 0, result["stderr"][-3000:]
    assert [s["kind"] for s in result["steps"]] == ["stream", "compact", "cdc", "compact", "cdc"]
    assert result["steps"][4]["key_index_jobs"] > 0
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
    check_rows(java_reader, load(driver_dir, "db.users_pi"), expected(model), "id")


def fault_env(*faults: dict[str, Any]) -> dict[str, str]:
    """Spark settings that hand ``faults`` to every Python worker (see iceberg_sink/_task_faults.py)."""
    return {f"spark.executorEnv.{_task_faults.ENV}": json.dumps(list(faults))}


def files_on_disk(table: Table) -> list[str]:
    data = Path(table.location().removeprefix("file://")) / "data"
    return [str(p) for p in data.rglob("*.parquet")]


def committed_attempts(table: Table) -> set[str]:
    return {a for attempts in attempts_by_task(committed_files(table)).values() for a in attempts}


def check_one_attempt_per_task(table: Table) -> dict[tuple[str, str, int], set[str]]:
    """Every task's committed files come from one attempt; returns the attempts found on disk."""
    committed = attempts_by_task([p.removeprefix("file://") for p in committed_files(table)])
    assert committed
    assert all(len(attempts) == 1 for attempts in committed.values()), committed
    on_disk = attempts_by_task(files_on_disk(table))
    for key, attempts in committed.items():
        assert attempts <= on_disk[key]
    return on_disk


def test_writer_task_retries_commit_only_the_successful_attempt(java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    """Writer and compaction tasks whose first attempt fails after writing files: the worker process
    dies (its files stay behind, unreferenced) or the task raises (it deletes its files); the retry's
    files are the only ones committed."""
    driver_dir = tmp_path / "driver"
    batches, model = change_batches(seed=9, batches=2)
    faults = fault_env(
        {"point": _task_faults.TASK_AFTER_WRITE, "action": "exit", "partition": 0, "attempt": 0},
        {"point": _task_faults.TASK_AFTER_WRITE, "action": "fail", "partition": 1, "attempt": 0},
    )
    plan = {
        "master": "local[2,2]",  # two attempts per task
        "conf": faults,
        "steps": [
            {"kind": "append", "table": "db.events", "batches": [[0, 60], [60, 60]]},
            {"kind": "compact", "table": "db.events"},
            {"kind": "cdc", "table": "db.users", "batches": batches},
        ],
    }
    result = drive(driver_dir, plan)
    assert all(step["ok"] for step in result["steps"]), result
    assert result["steps"][1]["rewritten"] == 4, result

    events = load(driver_dir, "db.events")
    assert events.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    check_rows(
        java_reader,
        events,
        normalize(pa.concat_tables([event_batch(0, 60), event_batch(60, 60)]), ["event_id"]),
        "event_id",
    )
    for table in (events, load(driver_dir, "db.users")):
        on_disk = check_one_attempt_per_task(table)
        # Task 0's first attempt died with its files written: they are left, unreferenced.
        assert all(len(on_disk[key]) == 2 for key in on_disk if key[2] == 0), on_disk
        # Task 1's first attempt raised and deleted its own files.
        assert all(len(on_disk[key]) == 1 for key in on_disk if key[2] == 1), on_disk
    check_rows(java_reader, load(driver_dir, "db.users"), expected(model), "id")


def test_speculative_copies_commit_one_attempt_per_task(
    cluster: StandaloneCluster, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """The first attempt of writer task 0 stalls after writing its files; Spark runs a speculative
    copy on the other worker, which wins. One attempt's files per task are committed."""
    driver_dir = tmp_path / "driver"
    batches, model = change_batches(seed=13, batches=2)
    conf = {
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.multiplier": "1.1",
        "spark.speculation.minTaskRuntime": "200ms",
        "spark.speculation.efficiency.enabled": "false",
        # Adaptive execution would coalesce the CDC writers' input into one task: none to compare with.
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        **fault_env(
            {"point": _task_faults.TASK_AFTER_WRITE, "action": "sleep", "partition": 0, "attempt": 0, "seconds": 12}
        ),
    }
    plan = {
        "master": cluster.url,
        "conf": conf,
        "steps": [
            {"kind": "append", "table": "db.events", "batches": [[0, 60], [60, 60]]},
            {"kind": "cdc", "table": "db.users", "batches": batches},
        ],
    }
    result = drive(driver_dir, plan)
    assert all(step["ok"] for step in result["steps"]), result

    events = load(driver_dir, "db.events")
    check_rows(
        java_reader,
        events,
        normalize(pa.concat_tables([event_batch(0, 60), event_batch(60, 60)]), ["event_id"]),
        "event_id",
    )
    users = load(driver_dir, "db.users")
    check_rows(java_reader, users, expected(model), "id")
    for table in (events, users):
        on_disk = check_one_attempt_per_task(table)
        # A speculative copy did run: the stalled attempt's files are on disk too, unreferenced.
        speculated = {key: attempts for key, attempts in on_disk.items() if len(attempts) == 2}
        assert speculated, (on_disk, cluster.executor_logs())
        losers = {
            path
            for path in files_on_disk(table)
            if (match := FILE_NAME.match(Path(path).name)) is not None
            and match.group(2) not in committed_attempts(table)
        }
        assert losers
        # They are orphans: the remove-orphans maintenance deletes them once old enough.
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
        orphans = remove_orphan_files(
            lambda t=table: t,  # type: ignore[misc]
            older_than=dt.timedelta(hours=1),
            dry_run=True,
            now=later,
        )
        assert losers <= {o.removeprefix("file://") for o in orphans.orphan_files}
