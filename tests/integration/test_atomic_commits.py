"""A checkpoint's tables (a routed sink's, a dead-letter table) land in one SQL catalog transaction:
a reader of the catalog sees the checkpoint in every table or in none (job/together.py).

Every test reads the catalog the way another engine does: its own SQLite connection to the catalog
file, one query over every table's pointer (a consistent cut), and the current snapshot's
checkpoint read from each metadata file; the tables are read back by Iceberg Java and DuckDB.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, RoutedOutcome, _faults
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.errors import AtomicCommitsUnavailableError, InvalidSinkConfigError
from iceberg_sink.job.together import Together
from iceberg_sink.table.catalog import CatalogConfig
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

DDL = "tbl string, id long, v string"
TABLES = ("db.a", "db.b", "db.errors")


def catalog_file(props: dict[str, str]) -> str:
    return props["uri"].removeprefix("sqlite:///")


def catalog_state(props: dict[str, str], tables: tuple[str, ...] = TABLES) -> dict[str, int | None]:
    """Each table's current checkpoint (None: no snapshot of the sink, or no table), from one query
    over every table's pointer on a connection of its own, as another engine reads the catalog."""
    with sqlite3.connect(catalog_file(props), timeout=30) as connection:
        rows = connection.execute(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables"
        ).fetchall()
    locations = {f"{ns}.{name}": location for ns, name, location in rows}
    state: dict[str, int | None] = {}
    for table in tables:
        location = locations.get(table)
        state[table] = None if location is None else _checkpoint_at(location)
    return state


def _checkpoint_at(metadata_location: str) -> int | None:
    metadata = json.loads(Path(metadata_location.removeprefix("file://")).read_text())
    current = metadata.get("current-snapshot-id")
    for snapshot in metadata.get("snapshots", []):
        if snapshot["snapshot-id"] == current:
            value = snapshot["summary"].get("iceberg-sink.checkpoint-id")
            return int(value) if value is not None else None
    return None


def checkpoints(catalog: Catalog, name: str) -> list[int]:
    table = catalog.load_table(name)
    marks = [s.summary.get("iceberg-sink.checkpoint-id") for s in table.snapshots() if s.summary is not None]
    return [int(m) for m in marks if m is not None]


def routed_sink(props: dict[str, str], mode: str | None = None, threads: int | None = None) -> IcebergSink:
    builder = (
        IcebergSink.builder()
        .catalog("test", **props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing(partition_by=["bucket(2, id)"])
        .dead_letter("db.errors")
    )
    if mode is not None:
        builder = builder.atomic_commits(mode)
    if threads is not None:
        builder = builder.write_option("iceberg-sink.route.commit-threads", threads)
    return builder.build()


def batch(spark: SparkSession, n: int) -> DataFrame:
    """Rows for db.a and db.b, and one row naming no table (refused: it goes to db.errors)."""
    rows = [("a", 10 * n + i, f"a{n}") for i in range(3)] + [("b", 10 * n + i, f"b{n}") for i in range(2)]
    return spark.createDataFrame([*rows, (None, 10 * n, "lost")], DDL)


def checkpoint_zero(spark: SparkSession, props: dict[str, str], tmp_path: Path) -> tuple[IcebergSink, str]:
    """A routed sink (atomic by default) and its checkpoint location, checkpoint 0 committed."""
    sink = routed_sink(props)
    ckpt = str(tmp_path / "ck")
    sink.write(batch(spark, 0), checkpoint_location=ckpt)
    return sink, ckpt


@pytest.fixture
def faults() -> Iterator[list[Any]]:
    handlers: list[Any] = []
    try:
        yield handlers
    finally:
        _faults.clear()


def test_a_routed_checkpoint_lands_in_every_table_or_in_none(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaIcebergReader,
    faults: list[Any],
) -> None:
    sink = routed_sink(catalog_props)
    ckpt = str(tmp_path / "ck")
    first = sink.write(batch(spark, 0), checkpoint_location=ckpt)
    assert isinstance(first, RoutedOutcome) and first.atomic
    assert set(first.snapshots) == set(TABLES) and all(o is not None and o.atomic for o in first.values())
    assert catalog_state(catalog_props) == dict.fromkeys(TABLES, 0)

    # The driver dies inside the transaction, after the first table's pointer moved: another
    # connection sees no table moved, and the rollback leaves every table at checkpoint 0 with
    # checkpoint 1 stored for each.
    seen: list[dict[str, int | None]] = []

    def die_between(point: str, _: int) -> None:
        if point == _faults.BETWEEN_TABLE_SWAPS:
            seen.append(catalog_state(catalog_props))
            raise RuntimeError("driver died between two tables' swaps")

    _faults.install(die_between)
    with pytest.raises(RuntimeError, match="between two tables' swaps"):
        sink.write(batch(spark, 1), checkpoint_location=ckpt)
    _faults.clear()
    assert seen == [dict.fromkeys(TABLES, 0)]
    assert catalog_state(catalog_props) == dict.fromkeys(TABLES, 0)
    for name in TABLES:
        assert checkpoints(catalog, name) == [0], name
        assert CheckpointStore.for_table(ckpt, name).pending_ids() == [1], name

    # The rerun commits the stored checkpoint in all three, once.
    again = sink.write(batch(spark, 1), checkpoint_location=ckpt, checkpoint_id=1)
    assert isinstance(again, RoutedOutcome) and again.atomic and set(again.snapshots) == set(TABLES)
    assert catalog_state(catalog_props) == dict.fromkeys(TABLES, 1)
    for name in TABLES:
        assert checkpoints(catalog, name) == [0, 1], name
        assert CheckpointStore.for_table(ckpt, name).pending_ids() == [], name

    want = {
        "db.a": [{"id": 10 * n + i, "v": f"a{n}"} for n in (0, 1) for i in range(3)],
        "db.b": [{"id": 10 * n + i, "v": f"b{n}"} for n in (0, 1) for i in range(2)],
    }
    for name, rows in want.items():
        location = catalog.load_table(name).metadata_location
        expected = sorted(rows, key=lambda r: r["id"])
        assert normalize(java_reader.read(location), ["id"]) == expected, name
        assert normalize(duckdb_read(location), ["id"]) == expected, name
    errors = catalog.load_table("db.errors").metadata_location
    for read in (java_reader.read(errors), duckdb_read(errors)):
        assert sorted(r["checkpoint_id"] for r in read.to_pylist()) == [0, 1]


def test_one_table_at_a_time_when_off_shows_the_state_atomic_commits_prevent(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, faults: list[Any]
) -> None:
    sink = routed_sink(catalog_props, mode="off", threads=1)
    ckpt = str(tmp_path / "ck")
    first = sink.write(batch(spark, 0), checkpoint_location=ckpt)
    assert isinstance(first, RoutedOutcome) and not first.atomic
    assert all(o is not None and not o.atomic for o in first.values())

    seen: list[dict[str, int | None]] = []

    def look_after_each(point: str, _: int) -> None:
        if point == _faults.AFTER_COMMIT:
            seen.append(catalog_state(catalog_props))

    _faults.install(look_after_each)
    sink.write(batch(spark, 1), checkpoint_location=ckpt)
    _faults.clear()
    # Tables commit in name order on one thread: after db.a's commit a reader sees rows of
    # checkpoint 1 in db.a and not in db.b (nor the refused row in db.errors).
    assert seen == [
        {"db.a": 1, "db.b": 0, "db.errors": 0},
        {"db.a": 1, "db.b": 1, "db.errors": 0},
        {"db.a": 1, "db.b": 1, "db.errors": 1},
    ]
    assert all(checkpoints(catalog, name) == [0, 1] for name in TABLES)


def test_an_answer_lost_after_the_transaction_landed_commits_each_table_once(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, faults: list[Any]
) -> None:
    sink = routed_sink(catalog_props)
    ckpt = str(tmp_path / "ck")
    lost: list[str] = []

    def lose_answer(point: str, _: int) -> None:
        if point == _faults.TRANSACTION_COMMITTED and not lost:
            lost.append(point)
            raise ConnectionResetError("connection reset after COMMIT")

    _faults.install(lose_answer)
    outcome = sink.write(batch(spark, 0), checkpoint_location=ckpt)
    assert lost and isinstance(outcome, RoutedOutcome) and outcome.atomic
    assert set(outcome.snapshots) == set(TABLES)
    for name in TABLES:
        assert checkpoints(catalog, name) == [0], name  # found landed, not committed twice
    assert catalog_state(catalog_props) == dict.fromkeys(TABLES, 0)


def test_another_writer_between_load_and_commit_makes_every_table_retry(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, faults: list[Any]
) -> None:
    sink, ckpt = checkpoint_zero(spark, catalog_props, tmp_path)
    hits: list[int] = []
    lock = threading.Lock()
    other = pa.table({"id": pa.array([999], pa.int64()), "v": pa.array(["other"])})

    def other_writer(point: str, _: int) -> None:
        if point != _faults.BEFORE_COMMIT_SEND:
            return
        with lock:
            hits.append(1)
            # Every table has prepared on its loaded head: another writer moves db.b's.
            if len(hits) == len(TABLES):
                catalog.load_table("db.b").append(other)

    _faults.install(other_writer)
    outcome = sink.write(batch(spark, 1), checkpoint_location=ckpt)
    _faults.clear()
    assert len(hits) > len(TABLES)  # every table prepared again after the lost race
    assert isinstance(outcome, RoutedOutcome) and outcome.atomic and set(outcome.snapshots) == set(TABLES)
    for name in TABLES:
        assert checkpoints(catalog, name)[-1] == 1 and checkpoints(catalog, name).count(1) == 1, name
    ids = sorted(catalog.load_table("db.b").scan().to_arrow()["id"].to_pylist())
    assert ids == [0, 1, 10, 11, 999]


def test_a_table_and_its_dead_letter_table_commit_together(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, faults: list[Any]
) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .table("db.t")
        .upsert(key=["id"])
        .create_if_missing()
        .dead_letter("db.errors")
        .build()
    )
    ckpt = str(tmp_path / "ck")
    rows = spark.createDataFrame([(1, "x"), (None, "no key"), (2, "y")], "id long, v string")
    outcome = sink.write(rows, checkpoint_location=ckpt)
    assert outcome is not None and outcome.atomic
    tables = ("db.t", "db.errors")
    assert catalog_state(catalog_props, tables) == dict.fromkeys(tables, 0)

    def die_between(point: str, _: int) -> None:
        if point == _faults.BETWEEN_TABLE_SWAPS:
            raise RuntimeError("driver died between two tables' swaps")

    _faults.install(die_between)
    more = spark.createDataFrame([(3, "z"), (None, "no key either")], "id long, v string")
    with pytest.raises(RuntimeError, match="between two tables' swaps"):
        sink.write(more, checkpoint_location=ckpt)
    _faults.clear()
    assert catalog_state(catalog_props, tables) == dict.fromkeys(tables, 0)
    sink.write(more, checkpoint_location=ckpt, checkpoint_id=1)
    assert catalog_state(catalog_props, tables) == dict.fromkeys(tables, 1)
    assert sorted(catalog.load_table("db.t").scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    assert catalog.load_table("db.errors").scan().to_arrow().num_rows == 2


def test_a_stream_never_shows_its_tables_at_different_checkpoints(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path
) -> None:
    """A routed stream whose every micro-batch writes both tables, watched by a reader taking
    consistent cuts of the catalog as fast as it can: every cut shows both at one checkpoint."""
    source = tmp_path / "src"
    for n in range(8):
        batch(spark, n).where("tbl IS NOT NULL").coalesce(1).write.mode("append").parquet(str(source / f"b{n:02d}"))
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).parquet(str(source / "*"))
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing(partition_by=["bucket(2, id)"])
        .build()
    )
    cuts: list[dict[str, int | None]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            # (the catalog file or a table's first metadata may be being created)
            with contextlib.suppress(sqlite3.OperationalError, FileNotFoundError, json.JSONDecodeError):
                cuts.append(catalog_state(catalog_props, ("db.a", "db.b")))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    query = sink.start(df, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(300)
    stop.set()
    watcher.join()
    assert query.exception() is None
    assert checkpoints(catalog, "db.a") == checkpoints(catalog, "db.b") == list(range(8))
    moving = [c for c in cuts if c["db.a"] is not None or c["db.b"] is not None]
    assert len({c["db.a"] for c in moving}) >= 4, cuts[-5:]  # the reader saw the stream move
    assert all(c["db.a"] == c["db.b"] for c in moving), [c for c in moving if c["db.a"] != c["db.b"]][:5]


def test_atomic_commits_mode_is_checked(catalog_props: dict[str, str]) -> None:
    builder = IcebergSink.builder().catalog("test", **catalog_props).table("db.t").create_if_missing()
    with pytest.raises(
        InvalidSinkConfigError, match=r"atomic_commits: expected one of 'auto', 'required', 'off', received 'yes'"
    ):
        builder.atomic_commits("yes").build()
    # A SQL catalog commits several tables in one transaction: required is accepted.
    assert builder.atomic_commits("required").build() is not None
    # PyIceberg's in-memory catalog cannot (test_s3_rest.py: a REST catalog serving transactions can).
    memory = {"type": "in-memory", "warehouse": catalog_props["warehouse"]}
    with pytest.raises(AtomicCommitsUnavailableError, match=r"received catalog 'mem'.* commits one table at a time"):
        IcebergSink.builder().catalog("mem", **memory).route(table_column="tbl", namespace="db").atomic_commits(
            "required"
        ).build()
    sink = (
        IcebergSink.builder()
        .catalog("mem", **memory)
        .route(table_column="tbl", namespace="db")
        .atomic_commits("auto")
        .build()
    )
    assert sink is not None  # auto: one table at a time there
    # A job started with "required" on a catalog that cannot (build() passed on another catalog, or a
    # REST catalog became unreachable since) refuses to start rather than commit one table at a time.
    loaded = CatalogConfig("mem", memory).load()
    with pytest.raises(AtomicCommitsUnavailableError, match=r"job j1: atomic_commits\('required'\), but catalog 'mem'"):
        Together.of("j1", "required", loaded, "routed tables")
    assert not Together.of("j1", "auto", loaded, "routed tables").atomic


def test_one_tables_failed_commit_keeps_the_checkpoint_from_every_table(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, faults: list[Any]
) -> None:
    sink, ckpt = checkpoint_zero(spark, catalog_props, tmp_path)
    failed: list[int] = []
    lock = threading.Lock()

    def refuse_one(point: str, _: int) -> None:
        if point == _faults.BEFORE_COMMIT_SEND:
            with lock:
                if failed:
                    return
                failed.append(1)
            raise ValueError("the catalog refused this table's commit")

    _faults.install(refuse_one)
    with pytest.raises(ValueError, match="refused this table's commit") as raised:
        sink.write(batch(spark, 1), checkpoint_location=ckpt)
    _faults.clear()
    # The table's own error is raised; the others name it as why they did not commit.
    assert any("failed too" in note for note in getattr(raised.value, "__notes__", []))
    assert catalog_state(catalog_props) == dict.fromkeys(TABLES, 0)
    for name in TABLES:
        assert CheckpointStore.for_table(ckpt, name).pending_ids() == [1], name
    outcome = sink.write(batch(spark, 1), checkpoint_location=ckpt, checkpoint_id=1)
    assert isinstance(outcome, RoutedOutcome) and set(outcome.snapshots) == set(TABLES)
    assert catalog_state(catalog_props) == dict.fromkeys(TABLES, 1)
