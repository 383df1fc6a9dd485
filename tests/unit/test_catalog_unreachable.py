"""Which errors count as an unreachable catalog, and how the one retry loop ends on one (real catalogs)."""

from __future__ import annotations

import logging
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table

from iceberg_sink import CatalogUnavailableError, CommitStateUnknownError, IcebergSink, InvalidSinkConfigError, _faults
from iceberg_sink._iceberg.producer import PreparedCommit
from iceberg_sink._iceberg.retry import CommitAttempt, RetryPolicy, catalog_unreachable, commit_with_retry
from iceberg_sink._iceberg.rewrites import RewriteManifests
from iceberg_sink.errors import SQLITE_CATALOG_ADVICE, SQLITE_CATALOG_LOCKED, pending_because, sqlite_catalog_locked


def _sql_catalog(tmp_path: Path, busy_timeout_s: float | None = None) -> Catalog:
    (tmp_path / "wh").mkdir(exist_ok=True)
    uri = f"sqlite:///{tmp_path / 'catalog.db'}" + (f"?timeout={busy_timeout_s}" if busy_timeout_s else "")
    return load_catalog("unit", type="sql", uri=uri, warehouse=(tmp_path / "wh").as_uri())


@pytest.fixture
def table(tmp_path: Path) -> Table:
    catalog = _sql_catalog(tmp_path)
    catalog.create_namespace("db")
    return catalog.create_table("db.t", schema=pa.schema([("id", pa.int64())]))


@pytest.fixture
def fast_catalog(tmp_path: Path, table: Table) -> Catalog:
    """The catalog of ``table``, giving up on a locked file after 50 ms."""
    return _sql_catalog(tmp_path, busy_timeout_s=0.05)


@pytest.fixture
def locked(tmp_path: Path, fast_catalog: Catalog) -> Iterator[None]:
    """The catalog file held by another connection's exclusive transaction."""
    lock = sqlite3.connect(tmp_path / "catalog.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        lock.execute("ROLLBACK")
        lock.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_refused_http_connection_is_unreachable() -> None:
    with pytest.raises(requests.exceptions.ConnectionError) as failure:
        requests.get(f"http://127.0.0.1:{_closed_port()}/v1/config", timeout=5)
    assert catalog_unreachable(failure.value)


def test_locked_sqlite_catalog_is_unreachable(fast_catalog: Catalog, locked: None) -> None:
    with pytest.raises(Exception) as failure:
        fast_catalog.load_table("db.t")
    assert "database is locked" in str(failure.value)
    assert catalog_unreachable(failure.value)
    # Raised from it: still the same outage.
    wrapped = CatalogUnavailableError("checkpoint 3: the catalog is unreachable")
    wrapped.__cause__ = failure.value
    assert catalog_unreachable(wrapped)


def test_conflicts_and_refusals_are_not_outages(tmp_path: Path, table: Table) -> None:
    with pytest.raises(NoSuchTableError) as missing:
        _sql_catalog(tmp_path).load_table("db.nope")
    assert not catalog_unreachable(missing.value)
    conflict = CommitFailedException("Table has been updated by another process")
    conflict.__cause__ = ConnectionResetError()
    assert not catalog_unreachable(conflict)
    assert not catalog_unreachable(ValueError("bad input"))


def test_retry_loop_ends_with_catalog_unavailable_after_its_budget(fast_catalog: Catalog, locked: None) -> None:
    catalog = fast_catalog
    loads: list[int] = []
    prepared: list[Table] = []

    def load() -> Table:
        loads.append(1)
        return catalog.load_table("db.t")

    def prepare(current: Table) -> None:
        prepared.append(current)

    with pytest.raises(CatalogUnavailableError) as failure:
        commit_with_retry(
            "checkpoint 7 of job j",
            load,
            prepare,
            RetryPolicy(num_retries=2, min_wait_ms=1),
            sleep=lambda _: None,
            on_give_up="; it stays pending",
        )
    assert len(loads) == 3 and not prepared
    message = str(failure.value)
    assert message.startswith("checkpoint 7 of job j: the catalog is unreachable (OperationalError")
    assert message.endswith("; it stays pending")


def test_a_locked_sqlite_catalog_file_is_named_after_a_few_attempts(
    fast_catalog: Catalog, locked: None, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's "database is locked" (another connection holds the file) is told apart from other
    outages: the third attempt logs the cause once, and the error names it and what to do."""

    def load() -> Table:
        return fast_catalog.load_table("db.t")

    with caplog.at_level(logging.WARNING, logger="iceberg_sink"), pytest.raises(CatalogUnavailableError) as failure:
        commit_with_retry("checkpoint 7 of job j", load, lambda _: None, RetryPolicy(4, 1), sleep=lambda _: None)
    assert sqlite_catalog_locked(failure.value) and pending_because(failure.value) == SQLITE_CATALOG_LOCKED
    message = str(failure.value)
    assert f"database is locked); {SQLITE_CATALOG_LOCKED}. {SQLITE_CATALOG_ADVICE}" in message
    named = [r.getMessage() for r in caplog.records if SQLITE_CATALOG_LOCKED in r.getMessage()]
    assert named == [
        f"checkpoint 7 of job j: 3 attempts failed because {SQLITE_CATALOG_LOCKED}; {SQLITE_CATALOG_ADVICE}"
    ]


def test_other_sqlite_errors_and_outages_are_not_a_locked_catalog(tmp_path: Path, table: Table) -> None:
    connection = sqlite3.connect(tmp_path / "catalog.db")
    with pytest.raises(sqlite3.OperationalError) as no_table:
        connection.execute("SELECT * FROM no_such_table")
    assert not sqlite_catalog_locked(no_table.value)
    assert not sqlite_catalog_locked(ConnectionRefusedError("refused"))
    assert pending_because(ConnectionRefusedError("refused")) == "the catalog is unreachable"


def test_max_pending_checkpoints_is_checked_by_build(tmp_path: Path) -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"iceberg-sink\.commit\.max-pending-checkpoints.*>= 0"):
        IcebergSink.builder().embedded(tmp_path).table("db.t").max_pending_checkpoints(-1).build()


def test_a_lost_answer_then_an_outage_is_unknown_and_keeps_the_files(tmp_path: Path, table: Table) -> None:
    """The catalog applies a manifest rewrite, its answer is lost (a connection error at the fault
    point after the commit), and the catalog file stays locked past the budget: the commit ends in
    CommitStateUnknownError, not CatalogUnavailableError, and its files are deleted only once a table
    read proves no snapshot lists them."""
    for i in range(3):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    fast = _sql_catalog(tmp_path, busy_timeout_s=0.05)
    lock = sqlite3.connect(tmp_path / "catalog.db", isolation_level=None)
    sent: list[str] = []

    def lose(point: str, checkpoint_id: int) -> None:
        if point == _faults.MAINTENANCE_COMMIT_SENT and not sent:
            sent.append(point)
            lock.execute("BEGIN EXCLUSIVE")
            raise ConnectionResetError("answer lost")

    attempt = CommitAttempt("manifest rewrite", lambda: fast.load_table("db.t"), RetryPolicy(2, 1), lambda _: None)
    prepared: list[str] = []

    def prepare(current: Table) -> PreparedCommit | None:
        rewrite = RewriteManifests(current, "main", 10_000, {})
        commit = rewrite.prepare()
        prepared.extend(commit.written_files)
        return commit

    _faults.install(lose)
    try:
        with pytest.raises(CommitStateUnknownError, match="outcome is unknown"):
            attempt.run(prepare)
        assert attempt.outcome_unknown
        # The table cannot be read: nothing proves the files unused, so they stay.
        assert not attempt.discard(table.io, prepared)
    finally:
        _faults.clear()
        lock.execute("ROLLBACK")
        lock.close()
    assert all(Path(p.removeprefix("file://")).exists() for p in prepared)
    landed = _sql_catalog(tmp_path).load_table("db.t")
    head = landed.current_snapshot()
    assert head is not None and head.manifest_list in prepared
    # The table lists them: still kept. A file no snapshot lists is deleted.
    assert not attempt.discard(table.io, prepared)
    stray = tmp_path / "wh" / "stray.avro"
    stray.write_bytes(b"x")
    assert attempt.discard(table.io, [stray.as_uri()])
    assert not stray.exists()
    assert sorted(landed.scan().to_arrow()["id"].to_pylist()) == [0, 1, 2]
