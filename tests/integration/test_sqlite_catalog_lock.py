"""A SQLite catalog file another process keeps locked: every commit fails with SQLite's "database is
locked", and the sink says why, in the log, the metrics, ``iceberg-sink inspect`` and the error a
bounded write raises, then commits everything in order once the lock is gone.

The other process is real: a Python subprocess that opens the catalog file with ``sqlite3`` and keeps
a read transaction open, as an Iceberg Java ``JdbcCatalog`` session on the same file does (its JDBC
connection leaves a read statement open and holds the file's shared lock for the whole session; in
SQLite's default rollback-journal mode no other process can then commit a write). The sink's catalog
gives up on a locked file after 0.3 s (SQLite's busy timeout, ``?timeout=`` in the URI; 5 s by
default) so the retries are quick.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import CommitStateUnknownError, IcebergSink
from iceberg_sink.builder import IcebergSinkBuilder
from iceberg_sink.cli import EXIT_OK, main
from iceberg_sink.errors import SQLITE_CATALOG_ADVICE, SQLITE_CATALOG_LOCKED
from tests.integration.sources import EVENT_SCHEMA_DDL, event_batch
from tests.integration.test_cli import cli_json
from tests.interop.readers import normalize

ROWS = 20

# The other process: a read transaction left open on the catalog file (its shared lock is held until
# the transaction ends), then it waits for a line on stdin and ends the transaction.
_HOLDER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN")
connection.execute("SELECT count(*) FROM iceberg_tables").fetchone()
print("holding", flush=True)
sys.stdin.readline()
connection.execute("COMMIT")
"""


@contextmanager
def lock_held(catalog_file: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holds the SQLite catalog file's lock until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(catalog_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        yield holder
    finally:
        if holder.poll() is None:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=30)
    assert holder.returncode == 0


def catalog_properties(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "wh").mkdir(exist_ok=True)
    return {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}?timeout=0.3",
        "warehouse": (tmp_path / "wh").as_uri(),
    }


def builder(props: dict[str, str]) -> IcebergSinkBuilder:
    return (
        IcebergSink.builder()
        .catalog("local", **props)
        .table("db.t")
        .create_if_missing()
        .write_option("commit.retry.num-retries", 3)  # 4 attempts: the third one logs the cause
        .write_option("commit.retry.min-wait-ms", 20)
    )


def inspect_args(props: dict[str, str], checkpoint: Path) -> list[str]:
    return [
        "inspect",
        "db.t",
        "--catalog",
        "local",
        *[a for k, v in props.items() for a in ("--catalog-property", f"{k}={v}")],
        "--checkpoint-location",
        str(checkpoint),
    ]


def add_file(source: Path, n: int) -> pa.Table:
    """Source file ``n`` of the stream (renamed into place: the stream never sees half a file)."""
    table = event_batch(n * ROWS, ROWS)
    hidden = source / f".part-{n:05d}.parquet.tmp"  # the file stream ignores names starting with "."
    pq.write_table(table, hidden)
    hidden.rename(source / f"part-{n:05d}.parquet")
    return table


def checkpoint_ids(sink: IcebergSink) -> list[str | None]:
    return [
        None if s.summary is None else s.summary.get("iceberg-sink.checkpoint-id")
        for s in sink.load_table().snapshots()
    ]


def test_a_stream_names_the_process_holding_the_sqlite_catalog_then_commits_in_order(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    props = catalog_properties(tmp_path)
    source, checkpoint = tmp_path / "src", tmp_path / "ckpt"
    source.mkdir()
    sink = builder(props).build()
    stream = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = sink.start(stream, str(checkpoint))
    written = []
    try:
        written.append(add_file(source, 0))
        query.processAllAvailable()  # checkpoint 0: committed
        assert checkpoint_ids(sink) == ["0"]
        caplog.set_level(logging.WARNING)
        with lock_held(tmp_path / "catalog.db"):
            for n in (1, 2):  # checkpoints 1 and 2: written, their commits fail on the lock, pending
                written.append(add_file(source, n))
                query.processAllAvailable()
            assert query.exception() is None
            metrics = sink.metrics()
            assert (metrics.pending_checkpoints, metrics.deferred_commits, metrics.catalog_locked_commits) == (2, 2, 2)
            assert metrics.pending_reason is not None
            assert (
                metrics.pending_reason.startswith(SQLITE_CATALOG_LOCKED)
                and SQLITE_CATALOG_ADVICE in metrics.pending_reason
            )
            assert [t.pending_reason for t in metrics.tables] == [metrics.pending_reason]
            # The log: the retry loop names the cause after a few attempts, and each deferral says it too.
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any(
                f"3 attempts failed because {SQLITE_CATALOG_LOCKED}; {SQLITE_CATALOG_ADVICE}" in w for w in warnings
            ), warnings
            deferrals = [w for w in warnings if "stays pending" in w]
            prefix = re.compile(rf"{re.escape(SQLITE_CATALOG_LOCKED)}: checkpoint (\d+) of table db\.t stays pending")
            assert {int(m.group(1)) for w in deferrals if (m := prefix.match(w))} == {1, 2}, deferrals
            assert all(SQLITE_CATALOG_ADVICE in w for w in deferrals)
            # inspect (another reader of the same file: a shared lock is no obstacle to reading).
            [location] = cli_json(capsys, *inspect_args(props, checkpoint))["checkpoint_locations"]
            assert [p["checkpoint_id"] for p in location["pending"]] == [1, 2]
            reason = location["pending_reason"]
            assert reason["reason"] == SQLITE_CATALOG_LOCKED and reason["checkpoint_id"] == 2
            assert "database is locked" in reason["error"] and SQLITE_CATALOG_ADVICE in reason["error"]
            assert main(inspect_args(props, checkpoint)) == EXIT_OK
            assert f"  pending because {SQLITE_CATALOG_LOCKED} (checkpoint 2 at " in capsys.readouterr().out
            [job] = cli_json(capsys, "inspect", "--catalog", "local", *inspect_args(props, checkpoint)[4:])[
                "checkpoint_locations"
            ]
            assert [t["pending_reason"]["reason"] for t in job["tables"]] == [SQLITE_CATALOG_LOCKED]
        written.append(add_file(source, 3))
        query.processAllAvailable()  # checkpoints 1 and 2 first, in order, then 3
        assert query.exception() is None
    finally:
        query.stop()
    assert checkpoint_ids(sink) == ["0", "1", "2", "3"]
    want = normalize(pa.concat_tables(written), ["event_id"])
    assert normalize(sink.load_table().scan().to_arrow(), ["event_id"]) == want
    metrics = sink.metrics()
    assert (metrics.pending_checkpoints, metrics.pending_reason, metrics.tables[0].pending_reason) == (0, None, None)
    [location] = cli_json(capsys, *inspect_args(props, checkpoint))["checkpoint_locations"]
    assert (location["pending"], location["pending_reason"]) == ([], None)
    assert not (checkpoint / "iceberg_sink" / "pending_reason.json").exists()


def test_a_bounded_write_raises_naming_the_process_holding_the_sqlite_catalog(
    spark: SparkSession, tmp_path: Path
) -> None:
    props = catalog_properties(tmp_path)
    checkpoint = str(tmp_path / "ckpt")
    sink = builder(props).build()
    rows: list[dict[str, Any]] = [{"id": i} for i in range(3)]
    sink.write(spark.createDataFrame([(r["id"],) for r in rows[:1]], "id long"), checkpoint_location=checkpoint)
    with lock_held(tmp_path / "catalog.db"), pytest.raises(CommitStateUnknownError) as failure:
        sink.write(spark.createDataFrame([(r["id"],) for r in rows[1:]], "id long"), checkpoint_location=checkpoint)
    message = str(failure.value)
    assert "database is locked" in message and SQLITE_CATALOG_LOCKED in message and SQLITE_CATALOG_ADVICE in message
    # The lock gone, the next write there commits the kept checkpoint first.
    sink.write(spark.createDataFrame([(9,)], "id long"), checkpoint_location=checkpoint)
    assert checkpoint_ids(sink) == ["0", "1", "2"]
    assert sorted(sink.load_table().scan().to_arrow()["id"].to_pylist()) == [0, 1, 2, 9]
