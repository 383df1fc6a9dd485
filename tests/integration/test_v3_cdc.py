"""CDC on format v3 tables: every checkpoint is one snapshot on main whose deletes are deletion
vectors, never an equality delete nor a position delete file. After bounded writes (with driver
kills at three points, each run again by a new sink) and streaming micro-batches, the table read
by Iceberg Java 1.9.2, the newest Iceberg Java, DuckDB and PyIceberg 0.12 equals the model."""

from __future__ import annotations

import datetime as dt
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, _faults
from iceberg_sink._iceberg.deletion_vectors import read_deletion_vector
from iceberg_sink._iceberg.files import to_meta
from iceberg_sink._iceberg.lineage import read_entries, read_manifests
from iceberg_sink.topology import maintenance
from iceberg_sink.vocab.files import DataFileMeta
from tests.integration.test_cdc import CHANGE_DDL, apply, expected, frame, random_changes
from tests.integration.test_debezium_truncate import AFTER, AROUND, BEFORE, event, row
from tests.integration.test_debezium_truncate import frame as debezium_frame
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

TABLES = {"flat": [], "partitioned": ["region", "bucket(4, id)"]}
SOURCE = pa.schema(
    [
        (name, pa.int64() if kind == "long" else pa.string())
        for name, kind in (f.split() for f in CHANGE_DDL.split(", "))
    ]
)
# The key index a test's sink resolves deletes with: the driver's, or the partitioned one in table
# storage, every step a Spark job, its one partition split past 2 entries each (tests/unit covers
# splits against brute force; these tables are a few rows).
KEY_INDEXES = {
    "driver index": {},
    "partitioned index": {
        "iceberg-sink.key-index.mode": "partitioned",
        "iceberg-sink.key-index.partitions": 1,
        "iceberg-sink.key-index.driver-max-bytes": 0,
        "iceberg-sink.key-index.partition-max-entries": 2,
    },
}


def with_key_index(builder: Any, layout: str) -> Any:
    for key, value in KEY_INDEXES[layout].items():
        builder = builder.write_option(key, value)
    return builder


KILLS = {3: _faults.AFTER_MANIFESTS, 5: _faults.BEFORE_COMMIT_SEND, 6: _faults.AFTER_COMMIT}


def builder(tmp: Path, partition_by: list[str]) -> Any:
    return (
        IcebergSink.builder()
        .embedded(tmp / "lake")
        .table("db.users")
        .create_if_missing(partition_by=partition_by, format_version=3)
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
    )


def kill_at(point: str) -> None:
    def kill(at: str, _checkpoint: int) -> None:
        if at == point:
            raise RuntimeError(f"driver lost at {point}")

    _faults.install(kill)


def delete_files(table: Table) -> list[tuple[DataFileMeta, int]]:
    """The live delete files of main's head, as the sink reads them (with the DVs' blob locations)."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        (to_meta(e.data_file), int(e.sequence_number or 0))
        for m in read_manifests(table.io, snapshot, 3)
        if m.content == ManifestContent.DELETES
        for e in read_entries(table.io, m)
    ]


def java_commits(java: JavaIcebergReader, catalog: Catalog, table: Table, tmp_path: Path, *statements: str) -> Path:
    """Iceberg Java runs ``statements`` (``{t}`` names the table, ``{c}`` the catalog) on ``table``
    through a JDBC catalog of its own (registered from the table's metadata), then ``catalog``
    points ``db.t`` at Java's newest metadata file, as if Java had committed to the same catalog.
    Returns that file."""
    jdbc = java.catalog(f"{tmp_path}/java-catalog-warehouse", jdbc_uri=f"jdbc:sqlite:file:{tmp_path}/java-catalog.db")
    java.sql(f"CREATE NAMESPACE IF NOT EXISTS {jdbc}.db")
    java.sql(f"CALL {jdbc}.system.register_table(table => 'db.t', metadata_file => '{table.metadata_location}')")
    for statement in statements:
        java.sql(statement.format(t=f"{jdbc}.db.t", c=jdbc))
    newest = max(
        (Path(table.location().removeprefix("file://")) / "metadata").glob("*.metadata.json"),
        key=lambda p: p.stat().st_mtime_ns,
    )
    catalog.drop_table("db.t")
    catalog.register_table("db.t", newest.as_uri())
    return newest


def assert_reads_with_live_dvs(
    table: Table, java_readers: tuple[JavaIcebergReader, ...], changed: dict[int, str]
) -> None:
    """Rows 1..8 as first written ("v1".."v8") with ``changed`` applied, read alike by every reader;
    the table's deletes are DVs of live data files only."""
    model = {i: f"v{i}" for i in range(1, 9)} | changed
    rows = [{"id": i, "v": v} for i, v in sorted(model.items())]
    assert_readers_agree(java_readers, table.metadata_location, rows, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(pa.Table.from_pylist(rows), ["id"])
    deletes = delete_files(table)
    assert deletes and all(d.file_format == "PUFFIN" for d, _ in deletes)
    live = set(table.inspect.files()["file_path"].to_pylist())
    assert {d.referenced_data_file for d, _ in deletes} <= live


@pytest.fixture(scope="module")
def written(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Table, list[Any], int]]:
    """Each table: 8 bounded writes of random changes (kills at checkpoints 3, 5 and 6), then 3
    streaming micro-batches; the model applies every change in lsn order."""
    result = {}
    for name, partition_by in TABLES.items():
        tmp = tmp_path_factory.mktemp(f"v3cdc-{name}")
        rng = random.Random(23)
        model: dict[int, dict[str, Any]] = {}
        sink = builder(tmp, partition_by).build()
        ckpt, lsn = str(tmp / "ckpt-writes"), 0
        for checkpoint in range(8):
            changes = random_changes(rng, model, lsn, rng.randrange(10, 60), keys=40)
            lsn = max(c["lsn"] for c in changes)
            rng.shuffle(changes)  # arrival order is not lsn order
            if checkpoint in KILLS:
                kill_at(KILLS[checkpoint])
                try:
                    with pytest.raises(RuntimeError, match="driver lost"):
                        sink.write(frame(spark, changes), checkpoint_location=ckpt, checkpoint_id=checkpoint)
                finally:
                    _faults.clear()
                sink = builder(tmp, partition_by).build()  # a restarted driver
            sink.write(frame(spark, changes), checkpoint_location=ckpt, checkpoint_id=checkpoint)
            apply(model, changes)
        (tmp / "src").mkdir()
        for i in range(3):
            changes = random_changes(rng, model, lsn, 40, keys=40)
            lsn = max(c["lsn"] for c in changes)
            apply(model, changes)
            part = tmp / "src" / f"part-{i}.parquet"
            pq.write_table(pa.Table.from_pylist(changes, schema=SOURCE), part)
            os.utime(part, (1_700_000_000 + i, 1_700_000_000 + i))  # Spark takes the files in mtime order
        stream = spark.readStream.schema(CHANGE_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp / "src"))
        query = sink.start(stream, str(tmp / "ckpt-stream"), trigger={"availableNow": True})
        query.awaitTermination(600)
        assert query.exception() is None
        result[name] = (sink.load_table(), expected(model), 8 + 3)
    return result


@pytest.mark.parametrize("name", list(TABLES))
def test_every_reader_reads_the_v3_cdc_table_as_the_model(
    written: dict[str, tuple[Table, list[Any], int]], java_readers: tuple[JavaIcebergReader, ...], name: str
) -> None:
    table, model, checkpoints = written[name]
    assert table.metadata.format_version == 3
    assert len(table.metadata.snapshots) == checkpoints  # one per checkpoint: the replays doubled nothing
    assert_readers_agree(java_readers, table.metadata_location, model, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == model


@pytest.mark.parametrize("name", list(TABLES))
def test_main_holds_deletion_vectors_only_at_most_one_per_data_file(
    written: dict[str, tuple[Table, list[Any], int]], name: str
) -> None:
    table, _, _ = written[name]
    deletes = delete_files(table)
    assert deletes, "the changes deleted rows of earlier checkpoints"
    for meta, _ in deletes:
        assert meta.file_format == "PUFFIN" and meta.referenced_data_file is not None, meta.path
        assert meta.equality_ids is None
    targets = [meta.referenced_data_file for meta, _ in deletes]
    assert len(targets) == len(set(targets))
    live = set(table.inspect.files()["file_path"].to_pylist())
    assert set(targets) <= live
    for meta, _ in deletes:
        assert meta.content_offset is not None and meta.content_size_in_bytes is not None
        read_deletion_vector(table.io, meta.path, meta.content_offset, meta.content_size_in_bytes, meta.record_count)
    # No snapshot ever held an equality delete or a position delete file: every delete entry any
    # snapshot's manifests list (added, existing or deleted) is a DV.
    seen = set()
    for snapshot in table.metadata.snapshots:
        assert snapshot.summary is not None and snapshot.summary.get("total-equality-deletes", "0") == "0"
        for manifest in read_manifests(table.io, snapshot, 3):
            if manifest.content != ManifestContent.DELETES or manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in read_entries(table.io, manifest, discard_deleted=False):
                assert str(entry.data_file.file_format.value) == "PUFFIN", entry.data_file.file_path
    assert seen


def test_the_sink_merges_iceberg_javas_deletion_vectors_and_java_merges_the_sinks(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """The newest Iceberg Java and the sink take turns deleting rows of the same data file: each
    one's new DV carries the other's positions and replaces it, and every reader agrees."""
    java = java_readers[-1]
    warehouse = tmp_path / "java-warehouse"
    hadoop = java.catalog(warehouse)
    for statement in [
        f"CREATE TABLE {hadoop}.db.t (id bigint NOT NULL, v string) USING iceberg "
        "TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')",
        f"INSERT INTO {hadoop}.db.t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e'), (6, 'f')",
        f"DELETE FROM {hadoop}.db.t WHERE id = 2",
    ]:
        java.sql(statement)
    metadata = max((warehouse / "db" / "t" / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:-14]))
    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    catalog = load_catalog("t", **catalog_props)
    catalog.create_namespace("db")
    catalog.register_table("db.t", metadata.as_uri())
    sink = IcebergSink.builder().catalog("t", **catalog_props).table("db.t").upsert(key=["id"]).build()
    sink.write(spark.createDataFrame([(3, "c2"), (7, "g")], "id long, v string"))
    table = sink.load_table()
    [(dv, _)] = delete_files(table)
    assert dv.record_count == 2  # Java's position of id 2 and the sink's of id 3, in one DV
    expected_rows = {1: "a", 3: "c2", 4: "d", 5: "e", 6: "f", 7: "g"}
    assert_readers_agree(
        java_readers, table.metadata_location, [{"id": i, "v": v} for i, v in expected_rows.items()], ["id"]
    )
    # Java deletes from the same file on top of the sink's DV, then the sink updates a row of it again.
    java_commits(java, catalog, table, tmp_path, "DELETE FROM {t} WHERE id = 4")
    sink = IcebergSink.builder().catalog("t", **catalog_props).table("db.t").upsert(key=["id"]).build()
    sink.write(spark.createDataFrame([(5, "e2")], "id long, v string"))
    table = sink.load_table()
    del expected_rows[4]
    expected_rows[5] = "e2"
    model = [{"id": i, "v": v} for i, v in expected_rows.items()]
    assert_readers_agree(java_readers, table.metadata_location, model, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(pa.Table.from_pylist(model), ["id"])
    deletes = delete_files(table)
    assert [d.record_count for d, _ in deletes if d.referenced_data_file == dv.referenced_data_file] == [4]
    assert all(d.file_format == "PUFFIN" for d, _ in deletes)


@pytest.mark.parametrize("layout", list(KEY_INDEXES))
def test_a_debezium_truncate_on_v3_removes_every_file_and_dv(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, layout: str
) -> None:
    builder = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.items")
        .create_if_missing(format_version=3)
        .debezium(value_column="value", table_column=None, truncate="apply")
        .cdc(op_column="op", key=["id"], order_by="lsn")
    )
    sink = with_key_index(builder, layout).build()
    ckpt = str(tmp_path / "ckpt")
    sink.write(debezium_frame(spark, BEFORE), checkpoint_location=ckpt, checkpoint_id=0)
    sink.write(debezium_frame(spark, [event("d", 3, row(2, "b"))]), checkpoint_location=ckpt, checkpoint_id=1)
    assert [d.record_count for d, _ in delete_files(sink.load_table())] == [1]  # a DV, before the truncate
    sink.write(debezium_frame(spark, AROUND), checkpoint_location=ckpt, checkpoint_id=2)
    table = sink.load_table()
    assert not delete_files(table)
    model = [{**r, "lsn": lsn} for r, lsn in zip(AFTER, (12, 11), strict=True)]  # ids 2 and 5: their lsns
    assert_readers_agree(java_readers, table.metadata_location, model, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(pa.Table.from_pylist(model), ["id"])


@pytest.mark.parametrize("layout", list(KEY_INDEXES))
def test_a_compaction_by_iceberg_java_between_checkpoints_leaves_no_delete_behind(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, layout: str
) -> None:
    """The sink's committer has the keys of the table's files in its index; Iceberg Java 1.12
    compacts them (the DVs applied, new files); the same sink then updates and deletes rows that now
    live in the compacted file: the index drops the replaced files and the rows are found anew."""
    java = java_readers[-1]
    catalog_props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    builder = (
        IcebergSink.builder()
        .catalog("t", **catalog_props)
        .table("db.t")
        .create_if_missing(format_version=3)
        .upsert(key=["id"])
    )
    sink = with_key_index(builder, layout).build()
    sink.write(spark.createDataFrame([(i, f"v{i}") for i in range(1, 9)], "id long, v string"))
    sink.write(spark.createDataFrame([(2, "b2"), (9, "i")], "id long, v string"))
    sink.write(spark.createDataFrame([(3, "c2")], "id long, v string"))
    table = sink.load_table()
    assert delete_files(table)  # DVs on the first file
    # Java compacts through a catalog of its own.
    java_commits(
        java,
        load_catalog("t", **catalog_props),
        table,
        tmp_path,
        "CALL {c}.system.rewrite_data_files(table => 'db.t', "
        "options => map('min-input-files', '1', 'rewrite-all', 'true'))",
    )
    table = sink.load_table()
    assert table.current_snapshot() is not None and table.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    assert not delete_files(table)
    # The same sink (its index still holds the keys of the replaced files) updates rows of the compacted file.
    sink.write(spark.createDataFrame([(4, "d2"), (2, "b3"), (10, "j")], "id long, v string"))
    table = sink.load_table()
    assert_reads_with_live_dvs(table, java_readers, {2: "b3", 3: "c2", 4: "d2", 9: "i", 10: "j"})


@pytest.mark.parametrize("layout", list(KEY_INDEXES))
def test_the_sinks_own_compaction_of_a_v3_cdc_table_applies_its_dvs_and_upserts_go_on(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, layout: str
) -> None:
    """The sink's upserts leave DVs on a v3 table; the sink's own compaction applies them (rows keep
    their _row_id and _last_updated_sequence_number, as the newest Java reads them) and drops them
    with the files they referenced; the snapshots before it are expired (the replaced files deleted,
    which the index still covers); later upserts find their rows in the compacted file."""
    newest = java_readers[-1]
    builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing(format_version=3)
    sink = with_key_index(builder.upsert(key=["id"]), layout).build()
    sink.write(spark.createDataFrame([(i, f"v{i}") for i in range(1, 9)], "id long, v string"))
    sink.write(spark.createDataFrame([(2, "b2"), (9, "i")], "id long, v string"))
    sink.write(spark.createDataFrame([(3, "c2"), (2, "b3")], "id long, v string"))
    table = sink.load_table()
    assert delete_files(table)

    def lineage(metadata: str) -> list[dict[str, Any]]:
        got = newest.row_lineage(metadata).select(["id", "v", "_row_id", "_last_updated_sequence_number"])
        return sorted(got.to_pylist(), key=lambda r: r["id"])

    before = lineage(table.metadata_location)
    sink.compact(spark)
    table = sink.load_table()
    assert table.current_snapshot() is not None and table.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    assert not delete_files(table)  # every DV referenced a rewritten file
    assert lineage(table.metadata_location) == before
    replaced = {p for p in (Path(table.location().removeprefix("file://")) / "data").rglob("*.parquet")}
    maintenance.expire_snapshots(sink.load_table, dt.datetime.now(dt.UTC), retain_last=1)
    assert {p for p in replaced if not p.exists()}, "the expiry deleted the replaced data files"
    sink.write(spark.createDataFrame([(4, "d2"), (2, "b4"), (10, "j")], "id long, v string"))
    table = sink.load_table()
    assert_reads_with_live_dvs(table, java_readers, {2: "b4", 3: "c2", 4: "d2", 9: "i", 10: "j"})


def test_a_delete_only_checkpoint_is_decided_on_the_table_as_it_is_at_the_commit(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """Issue 42, item 6: a v3 checkpoint of deletes only found "nothing to commit" on the table as
    loaded at the batch's start. Another writer's rows that landed since (here: between the batch's
    start and its commit, from a pre-commit hook) kept rows the checkpoint deletes, and no
    compare-and-swap checked that decision. The v2 path loaded the table again first; v3 does now."""
    armed: list[bool] = []

    def other_writer(summary: Any) -> dict[str, str]:
        if armed:  # once, for checkpoint 1 only: another job (an appending sink) commits first
            armed.clear()
            other = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").build()
            other.write(spark.createDataFrame([(2, "theirs"), (3, "kept")], "id long not null, v string"))
        return {}

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=3)
        .cdc(op_column="op", key=["id"])
        .pre_commit_hook(other_writer)
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    ddl = "id long, v string, op string"
    sink.write(spark.createDataFrame([(1, "a", "I")], ddl), checkpoint_location=ckpt, checkpoint_id=0)
    armed.append(True)
    # Key 2 is nowhere in the table when the batch starts: only its commit can find the other writer's row.
    outcome = sink.write(spark.createDataFrame([(2, None, "D")], ddl), checkpoint_location=ckpt, checkpoint_id=1)
    assert outcome is not None and outcome.snapshot is not None
    table = sink.load_table()
    assert_readers_agree(java_readers, table.metadata_location, [{"id": 1, "v": "a"}, {"id": 3, "v": "kept"}], ["id"])
