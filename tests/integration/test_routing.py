"""One stream routed to many tables (``.route``): every table is read back by Iceberg Java and DuckDB
and must equal its model; one snapshot per table per checkpoint; a table dropped and re-created by
someone else is a clear error that loses nothing in the other tables."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, Row, SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, _faults
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.errors import UncommittableCheckpointError
from tests.integration.sources import ROUTED_CHANGE_SCHEMA_DDL, apply_changes, write_routed_change_files
from tests.interop.readers import JavaIcebergReader, assert_readers_agree_many, duckdb_read, normalize

pytestmark = pytest.mark.interop

JOB_KEY = "iceberg-sink.job-id"
CHECKPOINT_KEY = "iceberg-sink.checkpoint-id"
EVENT_DDL = "tbl string, id long, name string, score double"


def events(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, EVENT_DDL).repartition(3)


def checkpoints(table: Table) -> list[int]:
    return [int(s.summary[CHECKPOINT_KEY]) for s in table.snapshots()]  # type: ignore[index]


def jobs(table: Table) -> set[str]:
    return {s.summary[JOB_KEY] for s in table.snapshots()}  # type: ignore[index]


def check_readers(java: JavaIcebergReader, table: Table, expected: list[dict[str, Any]], key: str) -> None:
    assert normalize(java.read(table.metadata_location), [key]) == expected, f"{table.name()}: Iceberg Java"
    assert normalize(duckdb_read(table.metadata_location), [key]) == expected, f"{table.name()}: DuckDB"


def expected_events(rows: list[tuple[Any, ...]], table: str) -> list[dict[str, Any]]:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    picked = [{"id": r[1], "name": r[2], "score": r[3]} for r in rows if r[0] == table]
    return normalize(pa.Table.from_pylist(picked, schema=schema), ["id"])


def test_builder_refuses_route_with_table_and_bad_routes(catalog_props: dict[str, str]) -> None:
    base = IcebergSink.builder().catalog("test", **catalog_props)
    with pytest.raises(InvalidSinkConfigError, match=r"either one table \(\.table\).*not both"):
        base.table("db.x").route(table_column="tbl").build()
    with pytest.raises(InvalidSinkConfigError, match="exactly one of fn"):
        IcebergSink.builder().catalog("test", **catalog_props).route(lambda r: "a.b", table_column="tbl").build()
    with pytest.raises(InvalidSinkConfigError, match="exactly one of fn"):
        IcebergSink.builder().catalog("test", **catalog_props).route().build()
    with pytest.raises(InvalidSinkConfigError, match=r"route\(fn\): expected a callable"):
        IcebergSink.builder().catalog("test", **catalog_props).route("tbl").build()  # type: ignore[arg-type]
    with pytest.raises(InvalidSinkConfigError, match="every routed table must include the source column"):
        (
            IcebergSink.builder()
            .catalog("test", **catalog_props)
            .route(table_column="tbl", namespace="db")
            .create_if_missing(partition_by=["name"])
            .upsert(key=["id"])
            .build()
        )


def test_routed_write_creates_each_table_and_commits_one_snapshot_each(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="cdc", allow=["cdc.*", "other.b"])
        .create_if_missing(partition_by=["bucket(4, id)"])
        .build()
    )
    first = [("a", i, f"n{i}", i * 0.5) for i in range(20)] + [("other.b", i, None, 1.0) for i in range(5)]
    second = [("a", 100 + i, "x", 2.0) for i in range(3)] + [("cdc.c", 7, "c", float("nan"))]
    ckpt = str(tmp_path / "ck")
    sink.write(events(spark, first), checkpoint_location=ckpt)
    assert set(sink.last_write_outcomes()) == {"cdc.a", "other.b"}
    sink.write(events(spark, second), checkpoint_location=ckpt)
    # "cdc.c" names its namespace; "a" gets the route's.
    assert set(sink.last_write_outcomes()) == {"cdc.a", "cdc.c"}
    tables = {name: catalog.load_table(name) for name in ("cdc.a", "other.b", "cdc.c")}  # type: ignore[attr-defined]
    assert checkpoints(tables["cdc.a"]) == [0, 1]
    assert checkpoints(tables["other.b"]) == [0]
    assert checkpoints(tables["cdc.c"]) == [1]
    # One job id for every table of the job; the route column is not a table column.
    assert len(set.union(*(jobs(t) for t in tables.values()))) == 1
    for table in tables.values():
        assert table.schema().column_names == ["id", "name", "score"]
        assert [f.name for f in table.spec().fields] == ["id_bucket"]
    rows = first + second
    # Iceberg Java 1.9.2, the newest Iceberg Java and DuckDB: one request per reader for the three tables.
    models = {"cdc.a": "a", "other.b": "other.b", "cdc.c": "cdc.c"}
    assert_readers_agree_many(
        java_readers, {tables[t].metadata_location: expected_events(rows, r) for t, r in models.items()}, ["id"]
    )
    # Replaying checkpoint 1 (a write() rerun after a crash) commits nothing twice.
    sink.write(events(spark, second), checkpoint_location=ckpt, checkpoint_id=1)
    assert checkpoints(catalog.load_table("cdc.a")) == [0, 1]  # type: ignore[attr-defined]
    assert all(o is not None and o.already_committed for o in sink.last_write_outcomes().values())


def test_routed_rows_without_a_valid_table_are_refused(spark: SparkSession, catalog_props: dict[str, str]) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", allow=["db.*"])
        .create_if_missing()
        .build()
    )
    with pytest.raises(InvalidInputError, match=r"routed table 'plain' has no namespace: each part of"):
        sink.write(events(spark, [("plain", 1, "x", 1.0)]))
    with pytest.raises(InvalidInputError, match=r"a row names no table \(the route gave null\)"):
        sink.write(events(spark, [(None, 1, "x", 1.0), ("db.ok", 2, "y", 2.0)]))
    assert not load_catalog("test", **catalog_props).table_exists("db.ok")
    with pytest.raises(Exception, match=r"tbl: the column given to \.route"):
        sink.write(spark.createDataFrame([(1,)], "id long"))


def test_routed_cdc_stream_by_function_applies_deletes_across_checkpoints_per_table(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    names = ["orders", "users", "items"]
    per_table = write_routed_change_files(tmp_path / "src", names, files=4, changes_per_file=40, keys=25, seed=3)

    def route(row: Row) -> str:
        return f"{row['tbl']}_v1"  # a function of the whole row; namespace added by the route

    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(route, namespace="cdc")
        # v2: equality deletes (v3: test_routed_cdc_on_format_v3_commits_deletion_vectors_per_table)
        .create_if_missing(partition_by=["bucket(2, id)"], format_version=2)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    df = (
        spark.readStream.schema(ROUTED_CHANGE_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "src"))
    )
    query = sink.start(df, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    for name in names:
        table = catalog.load_table(f"cdc.{name}_v1")  # type: ignore[attr-defined]
        assert checkpoints(table) == [0, 1, 2, 3], name
        # The fn routed by the input's tbl column, which is therefore kept (only a table_column is dropped).
        assert table.schema().column_names == ["tbl", "id", "v", "lsn"]
        summary = table.current_snapshot().summary  # type: ignore[union-attr]
        assert int(summary["total-equality-deletes"]) > 0, name  # type: ignore[index]
        state = apply_changes(per_table[name])
        model = state.add_column(0, "tbl", pa.array([name] * state.num_rows, pa.string()))
        check_readers(java_reader, table, normalize(model, ["id"]), "id")


def _drop_and_recreate(catalog: Catalog, name: str) -> None:
    schema = catalog.load_table(name).schema()  # type: ignore[attr-defined]
    catalog.drop_table(name)  # type: ignore[attr-defined]
    catalog.create_table(name, schema)  # type: ignore[attr-defined]


def test_table_dropped_and_recreated_by_someone_else_is_a_clear_error_and_the_others_lose_nothing(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing()
        .upsert(key=["id"])
        .atomic_commits("off")  # one table at a time: the others commit (atomically none would)
        .build()
    )
    ckpt = str(tmp_path / "ck")
    batches = [[(t, i + 10 * n, f"{t}{n}", float(n)) for t in ("a", "b", "c") for i in range(4)] for n in range(3)]
    sink.write(events(spark, batches[0]), checkpoint_location=ckpt)
    _drop_and_recreate(catalog, "db.b")
    # Before anything of checkpoint 1 is written: the error names the table and what to do.
    with pytest.raises(
        UncommittableCheckpointError, match=r"table db\.b was written by this job with UUID .* it was dropped"
    ):
        sink.write(events(spark, batches[1]), checkpoint_location=ckpt)
    for name in ("db.a", "db.c"):
        assert checkpoints(catalog.load_table(name)) == [0]  # type: ignore[attr-defined]
    # The fix the error names: forget this job's state of db.b, then write checkpoint 1 again.
    shutil.rmtree(CheckpointStore.for_table(ckpt, "db.b").root)
    sink.write(events(spark, batches[1]), checkpoint_location=ckpt, checkpoint_id=1)
    assert checkpoints(catalog.load_table("db.b")) == [1]  # type: ignore[attr-defined]

    # Dropped and re-created between its committable being persisted and its commit: the other
    # tables still commit checkpoint 2; db.b's error is raised once every table was tried.
    dropped: list[int] = []

    def drop_after_persist(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_MANIFESTS and checkpoint_id == 2 and not dropped:
            dropped.append(checkpoint_id)
            _drop_and_recreate(catalog, "db.b")

    _faults.install(drop_after_persist)
    try:
        with pytest.raises(UncommittableCheckpointError, match=r"db\.b .*dropped and re-created"):
            sink.write(events(spark, batches[2]), checkpoint_location=ckpt, checkpoint_id=2)
    finally:
        _faults.clear()
    for name in ("db.a", "db.c"):
        table = catalog.load_table(name)  # type: ignore[attr-defined]
        assert checkpoints(table) == [0, 1, 2]
        expected = expected_events(batches[0] + batches[1] + batches[2], name.split(".")[1])
        check_readers(java_reader, table, expected, "id")
    assert checkpoints(catalog.load_table("db.b")) == []  # type: ignore[attr-defined]
    # db.b's checkpoint 2 was not lost: it is still stored for the table it was written for.
    assert CheckpointStore.for_table(ckpt, "db.b").pending_ids() == [2]


def test_two_hundred_tables_in_one_stream(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    count, per_batch, batches = 200, 3, 2
    src = tmp_path / "src"
    src.mkdir()
    import os

    import pyarrow.parquet as pq

    rows: list[tuple[Any, ...]] = []
    for b in range(batches):
        batch = [
            (f"t{t:03d}", b * 1000 + t * 10 + i, f"r{b}", float(i)) for i in range(per_batch) for t in range(count)
        ]
        rows += batch
        path = src / f"part-{b:05d}.parquet"
        pq.write_table(
            pa.Table.from_pylist(
                [dict(zip(("tbl", "id", "name", "score"), r, strict=True)) for r in batch],
                pa.schema([("tbl", pa.string()), ("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())]),
            ),
            path,
        )
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="many")
        .create_if_missing()
        # Fewer open files per task than tables: the writers close files across tables to stay under it.
        .write_option("iceberg-sink.writer.max-open-files", 16)
        .build()
    )
    df = spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", 1).parquet(str(src))
    query = sink.start(df, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(900)
    assert query.exception() is None
    names = [f"many.t{t:03d}" for t in range(count)]
    assert sorted(".".join(i) for i in catalog.list_tables("many")) == names  # type: ignore[attr-defined]
    for name in names:
        table = catalog.load_table(name)  # type: ignore[attr-defined]
        assert checkpoints(table) == list(range(batches)), name
        assert table.scan().to_arrow().num_rows == per_batch * batches, name
    for name in names[::67]:
        check_readers(java_reader, catalog.load_table(name), expected_events(rows, name.split(".")[1]), "id")  # type: ignore[attr-defined]
    assert sink.metrics().commits == count * batches


def test_spark_jobs_per_batch_do_not_grow_with_the_number_of_tables(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="j")
        .create_if_missing()
        .build()
    )
    context = spark.sparkContext

    def jobs_for(tables: int, group: str) -> int:
        rows = [(f"t{t}", t * 10 + i, "x", 1.0) for t in range(tables) for i in range(3)]
        context.setJobGroup(group, group)
        try:
            sink.write(events(spark, rows), checkpoint_location=str(tmp_path / group))
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return len(context.statusTracker().getJobIdsForGroup(group))

    jobs_for(2, "warm-up")  # the one-time worker check
    few, many = jobs_for(3, "three"), jobs_for(40, "forty")
    # Listing the batch's tables and one write for all of them (each shuffle stage of adaptive query
    # execution counts as a job of its own): the same for 3 tables as for 40.
    assert few == many, (few, many)


def test_catalog_outage_keeps_each_tables_checkpoints_pending_until_a_later_batch(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """A routed stream rides out a catalog outage per table: its checkpoint is written and stays
    pending in each table's state; once the catalog answers, a later micro-batch commits it in order,
    also for a table that later batch routes no row to."""
    import sqlite3

    from iceberg_sink.job.routing import RoutedJob

    (tmp_path / "wh").mkdir()
    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'cat.db'}?timeout=0.2",
        "warehouse": (tmp_path / "wh").as_uri(),
    }
    sink = (
        IcebergSink.builder()
        .catalog("test", **props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing()
        .upsert(key=["id"])
        .build()
    )
    job = RoutedJob(sink.config, str(tmp_path / "ck"), streaming=True)  # what start() runs per micro-batch
    batches = [
        [("a", 1, "a0", 0.0), ("b", 1, "b0", 0.0)],
        [("a", 1, "a1", 1.0), ("b", 2, "b1", 1.0)],
        [("a", 3, "a2", 2.0)],
    ]
    job.process(events(spark, batches[0]), 0)
    lock = sqlite3.connect(tmp_path / "cat.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        outcomes = job.process(events(spark, batches[1]), 1)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert all(o is not None and o.pending for o in outcomes.values()), outcomes
    for name in ("db.a", "db.b"):
        assert CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids() == [1]
    job.process(events(spark, batches[2]), 2)  # no row for db.b: its pending checkpoint is committed too
    catalog = load_catalog("test", **props)
    assert checkpoints(catalog.load_table("db.a")) == [0, 1, 2]
    assert checkpoints(catalog.load_table("db.b")) == [0, 1]
    for name in ("db.a", "db.b"):
        assert CheckpointStore.for_table(str(tmp_path / "ck"), name).pending_ids() == []
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
    expected = {
        "db.a": [{"id": 1, "name": "a1", "score": 1.0}, {"id": 3, "name": "a2", "score": 2.0}],
        "db.b": [{"id": 1, "name": "b0", "score": 0.0}, {"id": 2, "name": "b1", "score": 1.0}],
    }
    for name, rows in expected.items():
        check_readers(
            java_reader, catalog.load_table(name), normalize(pa.Table.from_pylist(rows, schema=schema), ["id"]), "id"
        )


@pytest.mark.parametrize("mode", ["hash", "range", "none"])
def test_distribution_modes_over_tables_of_different_partition_layouts(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaIcebergReader,
    mode: str,
) -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform, TruncateTransform
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "score", DoubleType(), required=False),
    )
    catalog.create_namespace("d")  # type: ignore[attr-defined]
    # Two existing tables with layouts of their own; the others are created with bucket(2, id).
    catalog.create_table(
        "d.by_name", schema, partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))
    )  # type: ignore[attr-defined]
    catalog.create_table(
        "d.by_id", schema, partition_spec=PartitionSpec(PartitionField(1, 1000, TruncateTransform(10), "id_trunc"))
    )  # type: ignore[attr-defined]
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="d")
        .create_if_missing(partition_by=["bucket(2, id)"])
        .distribution_mode(mode)
        .build()
    )
    names = ["by_name", "by_id", "new1", "new2"]
    rows = [(t, i, f"n{i % 3}", float(i)) for t in names for i in range(12)]
    sink.write(events(spark, rows), checkpoint_location=str(tmp_path / "ck"))
    for t in names:
        table = catalog.load_table(f"d.{t}")  # type: ignore[attr-defined]
        assert checkpoints(table) == [0]
        check_readers(java_reader, table, expected_events(rows, t), "id")
    if mode == "hash":
        # One writer task per (table, partition): one data file each.
        files = catalog.load_table("d.by_name").inspect.files().to_pylist()  # type: ignore[attr-defined]
        assert len(files) == len({str(f["partition"]) for f in files}) == 3


def test_routed_sink_keeps_map_batches_and_prometheus(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """``.map_batches`` (and so ``.debezium``) and ``.prometheus`` apply to a routed sink too: the
    batch is mapped before it is split by table (here the mapping makes the route column)."""
    from pyspark.sql import functions as F

    rows = [("a", 1, "x", 1.0), ("b", 2, "y", 2.0), ("a", 3, "z", 3.0)]

    def add_route(df: DataFrame) -> DataFrame:
        return df.withColumn("tbl", F.upper(F.col("src")).cast("string")).drop("src")

    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="mapped")
        .create_if_missing()
        .map_batches(add_route)
        .prometheus(port=0, addr="127.0.0.1")
        .build()
    )
    try:
        assert sink.config.map_batches == (add_route,)
        assert sink.prometheus_port
        source = spark.createDataFrame(rows, "src string, id long, name string, score double")
        sink.write(source, checkpoint_location=str(tmp_path / "ckpt"))
        upper = [(r[0].upper(), *r[1:]) for r in rows]
        for name in ("A", "B"):
            table = catalog.load_table(f"mapped.{name}")
            check_readers(java_reader, table, expected_events(upper, name), "id")
    finally:
        sink.close()


def test_a_table_whose_commit_failed_is_committed_by_a_later_batch_without_its_rows(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path
) -> None:
    """A table whose commit was refused (a pre-commit hook's veto, once) keeps its checkpoint stored;
    the job remembers it, and a later micro-batch that routes no row to it commits it first."""
    from iceberg_sink import CommitVetoedError
    from iceberg_sink.job.routing import RoutedJob

    vetoes = []

    def veto_b_once(summary: Any) -> None:
        if summary.table == "db.b" and not vetoes:
            vetoes.append(summary.checkpoint_id)
            raise RuntimeError("not now")

    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing()
        .upsert(key=["id"])
        .pre_commit_hook(veto_b_once)
        .build()
    )
    job = RoutedJob(sink.config, str(tmp_path / "ck"), streaming=True)  # what start() runs per micro-batch
    with pytest.raises(CommitVetoedError, match="vetoed checkpoint 0"):
        job.process(events(spark, [("a", 1, "a0", 0.0), ("b", 1, "b0", 0.0)]), 0)
    assert job.has_pending() and vetoes == [0]
    assert CheckpointStore.for_table(str(tmp_path / "ck"), "db.b").pending_ids() == [0]
    job.process(events(spark, [("a", 2, "a1", 1.0)]), 1)  # no row for db.b
    assert checkpoints(catalog.load_table("db.b")) == [0]  # type: ignore[attr-defined]
    assert checkpoints(catalog.load_table("db.a")) == [0, 1]  # type: ignore[attr-defined]
    assert not job.has_pending()


def test_tables_commit_on_several_threads_and_hooks_run_one_at_a_time(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path
) -> None:
    """Six tables, three commit threads: commits overlap (seen at the point a prepared snapshot is
    sent), hooks never do; with one thread nothing overlaps. Each table holds its rows once.

    A commit waits (up to a minute) for a second one to arrive rather than sleeping a fixed time, so a
    slow machine cannot make the three-thread run look serial; once two have overlapped nobody waits."""
    active = {"commits": 0, "hooks": 0}
    peak = {"commits": 0, "hooks": 0}
    changed = threading.Condition()
    threads_now = [0]

    def enter(kind: str) -> None:
        with changed:
            active[kind] += 1
            peak[kind] = max(peak[kind], active[kind])
            changed.notify_all()
            waits = kind == "commits" and threads_now[0] > 1
            if waits and not changed.wait_for(lambda: peak["commits"] >= 2, timeout=60):
                threads_now[0] = 1  # no overlap within a minute: stop waiting, the assertion fails
        time.sleep(0.1)  # a hook lingers: a second hook running at once would be seen
        with changed:
            active[kind] -= 1
            changed.notify_all()

    def sending(point: str, _checkpoint: int) -> None:
        if point == _faults.BEFORE_COMMIT_SEND:
            enter("commits")

    def sink(threads: int) -> IcebergSink:
        return (
            IcebergSink.builder()
            .catalog("test", **catalog_props)
            .route(table_column="tbl", namespace=f"par{threads}")
            .create_if_missing()
            .write_option("iceberg-sink.route.commit-threads", threads)
            .atomic_commits("off")  # the threads of the one-table-at-a-time mode (atomically: one per table)
            .pre_commit_hook(lambda _summary: enter("hooks") or {})
            .post_commit_hook(lambda _result: enter("hooks"))
            .build()
        )

    rows = [(f"t{i % 6}", i, f"n{i}", 1.0) for i in range(60)]
    _faults.install(sending)
    try:
        for threads in (3, 1):
            peak.update(commits=0, hooks=0)
            threads_now[0] = threads
            sink(threads).write(events(spark, rows), checkpoint_location=str(tmp_path / f"ck{threads}"))
            assert peak["hooks"] == 1, (threads, peak)
            assert (peak["commits"] >= 2) if threads == 3 else (peak["commits"] == 1), (threads, peak)
            for t in range(6):
                table = catalog.load_table(f"par{threads}.t{t}")  # type: ignore[attr-defined]
                assert checkpoints(table) == [0]
                assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == list(range(t, 60, 6))
    finally:
        _faults.clear()


def test_routed_cdc_on_format_v3_commits_deletion_vectors_per_table(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    """Routed tables created at format v3: each checkpoint's deletes of each table are DVs on that
    table's data files, never equality deletes; every reader agrees with each table's model."""
    from tests.integration.test_v3_cdc import delete_files

    names = ["orders", "users"]
    per_table = write_routed_change_files(tmp_path / "src", names, files=3, changes_per_file=40, keys=15, seed=7)
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="rv3")
        .create_if_missing(format_version=3)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    for checkpoint, path in enumerate(sorted((tmp_path / "src").iterdir())):
        sink.write(spark.read.schema(ROUTED_CHANGE_SCHEMA_DDL).parquet(str(path)), str(tmp_path / "ck"))
        assert set(sink.last_write_outcomes()) == {f"rv3.{n}" for n in names}, checkpoint
    for name in names:
        table = catalog.load_table(f"rv3.{name}")  # type: ignore[attr-defined]
        assert table.format_version == 3 and checkpoints(table) == [0, 1, 2], name
        summary = table.current_snapshot().summary  # type: ignore[union-attr]
        assert int(summary["total-equality-deletes"]) == 0, name  # type: ignore[index]
        deletes = delete_files(table)
        assert deletes and all(d.file_format.upper() == "PUFFIN" for d, _ in deletes), (name, deletes)
        assert_readers_agree_many(
            java_readers, {table.metadata_location: normalize(apply_changes(per_table[name]), ["id"])}, ["id"]
        )


def test_route_column_named_with_a_dot_and_a_backtick_is_that_column(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """``.route(table_column=...)`` names a column of the batch: a dot and a backtick are part of the
    name (it was quoted without doubling the backtick), beside a struct ``to`` whose field ``t`` the
    name would select as a path (a decoy naming another table)."""
    name = "to.`t`"
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column=name, namespace="db")
        .create_if_missing()
        .build()
    )
    rows = [("a", ("decoy",), i, f"n{i}", 1.0) for i in range(3)]
    df = spark.createDataFrame(rows, "r string, to struct<t: string>, id long, name string, score double")
    sink.write(df.withColumnRenamed("r", name), checkpoint_location=str(tmp_path / "ck"))
    assert set(sink.last_write_outcomes()) == {"db.a"}
    assert not catalog.table_exists("db.decoy")  # type: ignore[attr-defined]
    location = catalog.load_table("db.a").metadata_location  # type: ignore[attr-defined]
    want = [{"id": i, "name": f"n{i}", "to": {"t": "decoy"}} for i in range(3)]
    assert normalize(java_reader.read(location).select(["id", "name", "to"]), ["id"]) == want
    assert normalize(duckdb_read(location).select(["id", "name", "to"]), ["id"]) == want


def test_a_routed_batchs_route_and_planning_columns_are_built_once_per_schema(
    spark: SparkSession,
    catalog_props: dict[str, str],
    catalog: Catalog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The route's Columns (each row's table, its name checked) and the planning job's aggregates
    (each table's carried columns) name columns only: built through Py4J once per schema (and set of
    tables the job knows) and reused by later batches, about 0.2 s of every micro-batch of a routed
    Debezium stream when built each time. Counted, not timed; the reused Columns still route and refuse."""
    from iceberg_sink.job import routing

    builds = {"route": 0, "carried": 0}

    def counting(name: str, build: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            builds[name] += 1
            return build(*args, **kwargs)

        return counted

    monkeypatch.setattr(routing, "_route_columns", counting("route", routing._route_columns))
    monkeypatch.setattr(routing, "carried_counts", counting("carried", routing.carried_counts))
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="once")
        .create_if_missing()
        .build()
    )
    # A column name of this test only: no other test's batches built Columns for this schema.
    ddl = "tbl string, id long, built_once_v string"

    def write(rows: list[tuple[Any, ...]]) -> dict[str, int]:
        before = dict(builds)
        sink.write(spark.createDataFrame(rows, ddl), checkpoint_location=str(tmp_path / "ck"))
        return {k: builds[k] - before[k] for k in builds}

    # The first batch builds both; the second knows its tables from their checkpoints (a set lookup
    # instead of the name rule: new route Columns); later batches of the same tables and schema build nothing.
    assert write([("a", 1, "x"), ("b", 2, "y")]) == {"route": 1, "carried": 1}
    assert write([("a", 3, "z")]) == {"route": 1, "carried": 0}
    assert write([("b", 4, "w"), ("a", 5, "v")]) == {"route": 0, "carried": 0}
    before = dict(builds)
    with pytest.raises(InvalidInputError, match=r"routed table 'once\.a#b' holds other characters"):
        sink.write(
            spark.createDataFrame([("a", 6, "u"), ("a#b", 7, "t")], ddl), checkpoint_location=str(tmp_path / "ck")
        )
    assert builds == before
    ids = {t: sorted(r["id"] for r in catalog.load_table(f"once.{t}").scan().to_arrow().to_pylist()) for t in "ab"}
    assert ids == {"a": [1, 3, 5], "b": [2, 4]}


@pytest.mark.parametrize("single_task_max_bytes", [8 * 1024 * 1024, 0])
def test_a_small_routed_batch_counts_its_tables_columns_in_one_stage(
    spark: SparkSession, tmp_path: Path, single_task_max_bytes: int
) -> None:
    """The planning job of a routed micro-batch (each table's carried columns) of a batch Spark sizes
    under ``iceberg-sink.changes.single-task-max-bytes`` runs in one task: one stage, without its
    aggregation's shuffle, as the batch's write does; with the bound at 0 it shuffles as before."""
    from tests.helpers import query_stages

    source = tmp_path / "source"
    for b in range(2):
        batch = spark.createDataFrame([("a", 2 * b, "x"), ("b", 2 * b + 1, "y")], "tbl string, id long, v string")
        batch.coalesce(1).write.mode("append").parquet(str(source))
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .route(table_column="tbl", namespace="small")
        .create_if_missing()
        .write_option("iceberg-sink.changes.single-task-max-bytes", single_task_max_bytes)
        .build()
    )
    stream = spark.readStream.schema("tbl string, id long, v string").option("maxFilesPerTrigger", 1)
    query = sink.start(stream.parquet(str(source)), str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    stages = [len(job) for job in query_stages(spark, str(query.runId))]
    # Two micro-batches of two jobs each: the planning job and the write.
    assert len(stages) == 4, stages
    assert stages == ([1, 1, 1, 1] if single_task_max_bytes else [2, 1, 2, 1]), stages
    for table, ids in (("a", [0, 2]), ("b", [1, 3])):
        assert sorted(r["id"] for r in sink.load_table(f"small.{table}").scan().to_arrow().to_pylist()) == ids
