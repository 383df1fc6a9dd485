"""Kill the driver (SIGKILL, whole process group) at each step of a checkpoint and at random times,
restart it on the same checkpoint locations, and check with Iceberg Java and DuckDB that every change
is in the table exactly once and every checkpoint is one snapshot.

Each driver runs two streams at once, an append sink and a CDC (upsert/delete) sink, so one driver
start covers both kinds; the deterministic test chains the kill points: each restart replays the
killed checkpoint and is itself killed at the next step of a later checkpoint.

``ICEBERG_SINK_KILL_PROFILE=long`` runs the randomized kills with more seeds, kills and batches
(docs/model-check.md).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from iceberg_sink import _faults
from iceberg_sink.committer.store import CheckpointStore
from tests.helpers import driver_env
from tests.integration.crash_driver import WRITERS_RUNNING
from tests.integration.sources import apply_changes, write_change_files, write_source_files
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.slow, pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[2]
KILL_PROFILE_ENV = "ICEBERG_SINK_KILL_PROFILE"
CHECKPOINT_KEY = "iceberg-sink.checkpoint-id"
JOB_KEY = "iceberg-sink.job-id"

# Every step of a checkpoint, in the order a checkpoint passes them, each at its own checkpoint.
KILL_CHAIN: list[tuple[str, int]] = [
    (_faults.BATCH_START, 1),  # Spark recorded batch 0, batch 1 has begun
    (WRITERS_RUNNING, 2),
    (_faults.AFTER_WRITE, 3),
    (_faults.AFTER_STAGE, 4),
    (_faults.AFTER_MANIFESTS, 5),
    (_faults.COMMIT_SENT, 6),
    (_faults.AFTER_COMMIT, 7),
]
# What the table and the checkpoint store hold after a kill at each point of checkpoint c:
# (checkpoint c committed, committable of c pending, data files of c written, staged manifests of c left).
STATE_AFTER_KILL: dict[str, tuple[bool, bool, bool, bool]] = {
    _faults.BATCH_START: (False, False, False, False),
    WRITERS_RUNNING: (False, False, True, False),
    _faults.AFTER_WRITE: (False, False, True, False),
    _faults.AFTER_STAGE: (False, False, True, True),
    _faults.AFTER_MANIFESTS: (False, True, True, True),
    _faults.COMMIT_SENT: (True, True, True, True),
    _faults.AFTER_COMMIT: (True, True, True, False),
}


class Streams:
    """The two streams of one test (append on ``db.events``, CDC on ``db.changes``) and their sources."""

    def __init__(self, root: Path, files: int, seed: int, until_done: bool = False) -> None:
        self.root = root
        self.until_done = until_done  # processingTime trigger until all is committed (crash_driver.py)
        (root / "wh").mkdir()
        self.catalog_props = {
            "type": "sql",
            "uri": f"sqlite:///{root / 'cat.db'}",
            "warehouse": (root / "wh").as_uri(),
        }
        self.events = write_source_files(root / "src-events", files=files, rows_per_file=40)
        self.changes = write_change_files(root / "src-changes", files=files, changes_per_file=30, keys=40, seed=seed)
        self.files = files
        self.streams = [
            {
                "kind": "append",
                "table": "db.events",
                "source": str(root / "src-events"),
                "checkpoint": str(root / "ck-e"),
            },
            {
                "kind": "cdc",
                "table": "db.changes",
                "source": str(root / "src-changes"),
                "checkpoint": str(root / "ck-c"),
            },
        ]

    def request(self, kill: tuple[str, int] | tuple[str, int, int] | None) -> Path:
        path = self.root / "request.json"
        req = {
            "catalog": self.catalog_props,
            "streams": self.streams,
            "kill": list(kill) if kill else None,
            "until_checkpoints": self.files if self.until_done else None,
        }
        path.write_text(json.dumps(req), encoding="utf-8")
        return path

    def start(self, kill: tuple[str, int] | tuple[str, int, int] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        out = self.root / f"driver-{time.monotonic_ns()}.out"
        env = driver_env()
        with out.open("wb") as stdout:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.crash_driver", str(self.request(kill))],
                cwd=ROOT,
                env=env,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the SIGKILL takes nothing else with it
            )
        return proc, out

    def run(self, kill: tuple[str, int] | tuple[str, int, int] | None = None) -> str:
        proc, out = self.start(kill)
        try:
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        return out.read_text(encoding="utf-8", errors="replace")

    def catalog(self) -> Catalog:
        return load_catalog("crash", **self.catalog_props)

    def table(self, stream: dict[str, str]) -> Table:
        return self.catalog().load_table(stream["table"])

    def exists(self, stream: dict[str, str]) -> bool:
        return self.catalog().table_exists(stream["table"])

    def committed(self, stream: dict[str, str]) -> list[int]:
        """Checkpoint ids of the table's snapshots, oldest first (one job per table here)."""
        table = self.table(stream)
        assert len({s.summary[JOB_KEY] for s in table.snapshots()}) <= 1  # type: ignore[index]
        return [int(s.summary[CHECKPOINT_KEY]) for s in table.snapshots()]  # type: ignore[index]

    def pending(self, stream: dict[str, str]) -> list[int]:
        return [c.checkpoint_id for c in CheckpointStore(stream["checkpoint"]).pending()]

    def table_dir(self, stream: dict[str, str]) -> Path:
        return Path(self.table(stream).location().removeprefix("file://"))

    def data_files_of(self, stream: dict[str, str], checkpoint: int) -> list[Path]:
        pattern = re.compile(rf"^\d{{5}}-\d+-[0-9a-f]+-{checkpoint:06d}-.*\.parquet$")
        return [p for p in (self.table_dir(stream) / "data").rglob("*.parquet") if pattern.match(p.name)]

    def staged_checkpoints(self, stream: dict[str, str]) -> list[int]:
        """Checkpoint ids of the staged manifests left in the table's metadata folder."""
        names = (p.name for p in (self.table_dir(stream) / "metadata").glob("iceberg-sink-*.avro"))
        return sorted({int(m.group(1)) for n in names if (m := re.match(r"iceberg-sink-[0-9a-f]+-(\d{6})-", n))})

    def check_final(self, java: JavaIcebergReader, orphan_stagings: set[int]) -> None:
        expected = {
            "db.events": normalize(pa.concat_tables(self.events), ["event_id"]),
            "db.changes": normalize(apply_changes(self.changes), ["id"]),
        }
        for stream in self.streams:
            name = stream["table"]
            committed = self.committed(stream)
            if self.until_done:
                # A restart may run two batches the file source had logged as one micro-batch (see
                # crash_driver._caught_up): fewer checkpoints, each once; the content checks below
                # still require every file's rows exactly once.
                assert committed == list(range(len(committed))) and 0 < len(committed) <= self.files, name
            else:
                assert committed == list(range(self.files)), name
            assert self.pending(stream) == [], name
            # Staged manifests are removed once committed; only those of a committable that was never
            # persisted (a kill at AFTER_STAGE) are left, as orphans for remove_orphan_files.
            assert set(self.staged_checkpoints(stream)) <= orphan_stagings, name
            table = self.table(stream)
            key = "event_id" if stream["kind"] == "append" else "id"
            assert normalize(java.read(table.metadata_location), [key]) == expected[name], f"{name}: Iceberg Java"
            assert normalize(duckdb_read(table.metadata_location), [key]) == expected[name], f"{name}: DuckDB"


def test_driver_killed_at_every_step_of_a_checkpoint(tmp_path: Path, java_reader: JavaIcebergReader) -> None:
    streams = Streams(tmp_path, files=9, seed=7)
    for point, checkpoint in KILL_CHAIN:
        output = streams.run((point, checkpoint))
        assert f"KILLING at {point} {checkpoint}" in output and "timeout" not in output, output[-4000:]
        assert "DONE" not in output
        committed, pending, written, staged = STATE_AFTER_KILL[point]
        for stream in streams.streams:
            where = f"{stream['table']} killed at {point} of checkpoint {checkpoint}"
            assert streams.committed(stream) == list(range(checkpoint + (1 if committed else 0))), where
            assert streams.pending(stream) == ([checkpoint] if pending else []), where
            assert bool(streams.data_files_of(stream, checkpoint)) == written, where
            assert (checkpoint in streams.staged_checkpoints(stream)) == staged, where
    output = streams.run()
    assert "DONE" in output, output[-4000:]
    streams.check_final(java_reader, orphan_stagings={4})


def test_driver_killed_inside_the_partitioned_key_indexs_save(tmp_path: Path, java_reader: JavaIcebergReader) -> None:
    """The v3 CDC stream resolving its deletes through the partitioned key index (every step a Spark
    job, partitions split past 8 entries each): its driver SIGKILLed after the index wrote a new
    manifest and before it moved its pointer, then after the pointer moved and before the commit;
    each restart replays the pending checkpoint against the index as stored (the runs and manifest
    of the killed save are orphans no pointer names) and the table ends as the changes say, by
    Iceberg Java and DuckDB."""
    streams = Streams(tmp_path, files=7, seed=5)
    streams.streams = [
        {
            **s,
            "write_options": {
                "iceberg-sink.key-index.mode": "partitioned",
                "iceberg-sink.key-index.partitions": 2,
                "iceberg-sink.key-index.driver-max-bytes": 0,
                "iceberg-sink.key-index.partition-max-entries": 8,
            },
        }
        for s in streams.streams
        if s["kind"] == "cdc"
    ]
    (stream,) = streams.streams
    for point in (_faults.INDEX_RUNS_WRITTEN, _faults.INDEX_MANIFEST_WRITTEN):
        committed = len(streams.committed(stream)) if streams.exists(stream) else 0
        output = streams.run((point, -1, 2))  # at the second save of this driver's index
        assert f"KILLING at {point} -1" in output and "DONE" not in output, output[-4000:]
        assert len(streams.committed(stream)) > committed and len(streams.pending(stream)) == 1, output[-4000:]
    output = streams.run()
    assert "DONE" in output, output[-4000:]
    streams.check_final(java_reader, orphan_stagings=set())
    pointers = list(streams.table_dir(stream).rglob("partitioned/*/current"))
    assert len(pointers) == 1, pointers


def kill_profile() -> tuple[list[int], int, int]:
    """(seeds, kills per seed, source files per stream) of the randomized kills."""
    if os.environ.get(KILL_PROFILE_ENV, "short") == "long":
        return [11, 12, 13, 14], 10, 24
    return [11], 3, 10


def wait_for_commits(proc: subprocess.Popen[bytes], out: Path, commits: int) -> None:
    """Until the driver printed ``commits`` commits of the CDC stream, or exited."""
    while (
        proc.poll() is None
        and out.read_text(encoding="utf-8", errors="replace").count("COMMITTED db.changes") < commits
    ):
        time.sleep(0.02)


@pytest.mark.parametrize("seed", kill_profile()[0])
def test_driver_killed_at_random_times(tmp_path: Path, java_reader: JavaIcebergReader, seed: int) -> None:
    _, kills, files = kill_profile()
    rng = random.Random(seed)
    streams = Streams(tmp_path, files=files, seed=seed, until_done=True)
    killed: list[str] = []
    period: float | None = None
    for _ in range(kills):
        proc, out = streams.start()
        # Killed at a random moment after a commit of the CDC stream, within two checkpoint periods (as
        # measured between its first two commits), so it falls anywhere inside or between checkpoints on
        # a fast or a loaded machine. One in five comes 2 s after the launch, before anything commits.
        if rng.random() < 0.2:
            delay = 2.0
        else:
            wait_for_commits(proc, out, 1)
            if period is None:
                first = time.monotonic()
                wait_for_commits(proc, out, 2)
                period = max(0.1, time.monotonic() - first)
            delay = rng.uniform(0.0, 2 * period)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        state = {}
        for s in streams.streams:
            if not streams.exists(s):
                continue
            committed, pending = streams.committed(s), streams.pending(s)
            state[s["table"]] = (len(committed), pending)
            # Whenever the driver dies: checkpoints 0..n-1 each once, at most the next one or the
            # last one (committed, not yet removed) pending.
            assert committed == list(range(len(committed))), (s["table"], committed)
            assert set(pending) <= {len(committed) - 1, len(committed)}, (s["table"], committed, pending)
        killed.append(f"exit {proc.returncode} after {delay:.1f} s: (checkpoints committed, pending) {state}")
        if proc.returncode == 0:
            break  # finished before the kill
    output = streams.run()
    assert "DONE" in output, "\n".join(killed) + "\n" + output[-4000:]
    streams.check_final(java_reader, orphan_stagings=set(range(files)))
    assert any("exit -9" in k for k in killed), killed
    sys.stderr.write(f"random kills, seed {seed}:\n  " + "\n  ".join(killed) + "\n")
