"""Kill the driver (SIGKILL, whole process group) at each point of a checkpoint, restart, and check
that every input row is in the table exactly once and every checkpoint is one snapshot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from iceberg_sink import _faults
from iceberg_sink.committer.store import CheckpointStore
from tests.integration.sources import write_source_files
from tests.interop.readers import duckdb_read, normalize

ROOT = Path(__file__).resolve().parents[2]


def run_driver(tmp_path: Path, *fault: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "wh").mkdir(exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "tests.integration.crash_driver",
        f"sqlite:///{tmp_path / 'cat.db'}",
        (tmp_path / "wh").as_uri(),
        str(tmp_path / "src"),
        str(tmp_path / "ckpt"),
        *fault,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, start_new_session=True, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", [_faults.AFTER_WRITE, _faults.AFTER_MANIFESTS, _faults.AFTER_COMMIT])
def test_driver_killed_then_restarted_loses_and_doubles_nothing(tmp_path: Path, point: str) -> None:
    tables = write_source_files(tmp_path / "src", files=3, rows_per_file=40)
    crashed = run_driver(tmp_path, point, "1")
    assert "KILLING at" in crashed.stdout, crashed.stdout + crashed.stderr[-3000:]
    assert crashed.returncode != 0

    catalog = load_catalog(
        "crash", type="sql", uri=f"sqlite:///{tmp_path / 'cat.db'}", warehouse=(tmp_path / "wh").as_uri()
    )
    before = catalog.load_table("db.crash")
    committed_before = [s.summary["iceberg-sink.checkpoint-id"] for s in before.snapshots()]  # type: ignore[index]
    assert committed_before == (["0", "1"] if point == _faults.AFTER_COMMIT else ["0"])
    pending = [c.checkpoint_id for c in CheckpointStore(str(tmp_path / "ckpt")).pending()]
    assert pending == ([] if point == _faults.AFTER_WRITE else [1])

    restarted = run_driver(tmp_path)
    assert "DONE" in restarted.stdout, restarted.stderr[-3000:]
    table = catalog.load_table("db.crash")
    checkpoints = [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()]  # type: ignore[index]
    assert checkpoints == ["0", "1", "2"]
    assert len({s.summary["iceberg-sink.job-id"] for s in table.snapshots()}) == 1  # type: ignore[index]
    expected = normalize(pa.concat_tables(tables), ["event_id"])
    assert normalize(duckdb_read(table.metadata_location), ["event_id"]) == expected
    assert normalize(table.scan().to_arrow(), ["event_id"]) == expected
    assert CheckpointStore(str(tmp_path / "ckpt")).pending() == []
    # No staged manifest is left behind once its checkpoint is committed.
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    assert not [p for p in metadata_dir.iterdir() if p.name.startswith("iceberg-sink-")]
