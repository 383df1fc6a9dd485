"""Compacting format v3 tables with ``sink.compact()``: every reader (Iceberg Java 1.9.2, the newest
Iceberg Java, DuckDB, PyIceberg) reads the same rows before and after, the newest Java's ``_row_id``
and ``_last_updated_sequence_number`` metadata columns are unchanged by the rewrite, Java reads the
rewrite commit's row-id ranges as the sink wrote them, and deletion vectors Iceberg Java wrote are
applied and dropped with their data files only."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.lineage import read_entries, read_manifests
from iceberg_sink._iceberg.live_vectors import live_vectors
from iceberg_sink._iceberg.manifests import data_file_first_row_id
from iceberg_sink.topology.compaction.config import CompactionConfig
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

SCHEMA = "id long, user_id long, ts timestamp, v string"


def rows(start: int, n: int) -> list[tuple[Any, ...]]:
    base = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    return [(i, i % 5, base + dt.timedelta(hours=7 * i), f"v{i}") for i in range(start, start + n)]


def _lineage_by_id(java: JavaIcebergReader, table: Table) -> dict[int, tuple[int, int]]:
    got = java.row_lineage(table.metadata_location).to_pylist()
    return {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in got}


def _data_files(table: Table) -> dict[str, int | None]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        e.data_file.file_path: data_file_first_row_id(e.data_file)
        for m in read_manifests(table.io, snapshot, 3)
        if m.content == ManifestContent.DATA
        for e in read_entries(table.io, m)
    }


@pytest.mark.parametrize("partition_by", [[], ["bucket(2, user_id)"]], ids=["flat", "partitioned"])
def test_compacted_v3_table_reads_the_same_rows_and_lineage_in_every_reader(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, partition_by: list[str]
) -> None:
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.t")
        .create_if_missing(partition_by=partition_by, format_version=3)
        .build()
    )
    batches = [rows(0, 30), rows(30, 7), rows(37, 12), rows(49, 1), rows(50, 20)]
    for batch in batches:
        sink.write(spark.createDataFrame(batch, SCHEMA))
    expected = pa.Table.from_pylist(
        [dict(zip(["id", "user_id", "ts", "v"], r, strict=True)) for b in batches for r in b]
    )
    before = sink.load_table()
    newest = java_readers[-1]
    lineage_before = _lineage_by_id(newest, before)
    assert len(lineage_before) == 70 and len({v[0] for v in lineage_before.values()}) == 70

    result = sink.compact(spark, CompactionConfig(min_input_files=2))
    table = sink.load_table()
    assert result.committed_groups >= 1 and result.rewritten_data_files > result.added_data_files
    assert len(_data_files(table)) < len(_data_files(before))

    assert_readers_agree(java_readers, table.metadata_location, expected, ["id"])  # both Javas and DuckDB
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(expected, ["id"])
    # Every row keeps its _row_id and _last_updated_sequence_number (the newest Java's metadata columns).
    assert _lineage_by_id(newest, table) == lineage_before
    # The new files hold the lineage as columns, by the spec's field ids.
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary.operation.value == "replace"
    for path in _data_files(table):
        ids = {int(f.metadata[b"PARQUET:field_id"]) for f in pq.read_schema(path.removeprefix("file://"))}
        if path not in _data_files(before):
            assert {2147483540, 2147483539} <= ids
    # Java reads the commit's lineage as the sink wrote it, and the spec's arithmetic holds.
    ranges = [(s.first_row_id, s.added_rows) for s in table.metadata.snapshots]
    for (first, added), (following, _) in itertools.pairwise(ranges):
        assert first is not None and added is not None and following == first + added
    for java in java_readers:
        view = java.lineage(table.metadata_location)
        assert [(s["first_row_id"], s["added_rows"]) for s in view["snapshots"]] == ranges, java.label
        assert view["next_row_id"] == table.metadata.next_row_id, java.label
        assert {f["path"]: f["first_row_id"] for f in view["files"]} == _data_files(table), java.label

    # Appends after the compaction take fresh ids; a second compaction keeps them all again.
    next_row_id = table.metadata.next_row_id
    sink.write(spark.createDataFrame(rows(70, 3), SCHEMA))
    lineage_before = _lineage_by_id(newest, sink.load_table())
    assert all(lineage_before[i][0] >= next_row_id for i in (70, 71, 72))
    sink.compact(spark, CompactionConfig(min_input_files=2))
    assert _lineage_by_id(newest, sink.load_table()) == lineage_before


def _live_vectors(table: Table) -> dict[str, str]:
    """Each live deletion vector's data file -> its Puffin file."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {data: ref.path for data, ref in live_vectors(table.io, snapshot).items()}


def test_compaction_applies_deletion_vectors_iceberg_java_wrote_and_drops_only_the_dangling_ones(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """The newest Iceberg Java writes a partitioned v3 table and deletes rows of two partitions as
    deletion vectors. Compacting one partition applies its DV and drops it, and keeps the other
    partition's DV (even when both sit in one Puffin file); compacting the rest drops that one too.
    Every reader reads the right rows after each step, and every row keeps its lineage."""
    java = java_readers[-1]
    warehouse = tmp_path / "java-warehouse"
    jw = java.catalog(warehouse)
    for statement in [
        f"CREATE TABLE {jw}.db.dv (id bigint, part string, v string) USING iceberg PARTITIONED BY (part) "
        "TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')",
        f"INSERT INTO {jw}.db.dv VALUES (1, 'a', 'x'), (2, 'a', 'x'), (3, 'a', 'x'), (4, 'a', 'x')",
        f"INSERT INTO {jw}.db.dv VALUES (5, 'a', 'y'), (6, 'a', 'y'), (7, 'b', 'y'), (8, 'b', 'y'), (9, 'b', 'y')",
        f"INSERT INTO {jw}.db.dv VALUES (10, 'b', 'z')",
        f"DELETE FROM {jw}.db.dv WHERE id IN (2, 3, 8)",
    ]:
        java.sql(statement)
    metadata = max((warehouse / "db" / "dv" / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:-14]))
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    catalog = load_catalog("t", **props)
    catalog.create_namespace("db")
    catalog.register_table("db.dv", metadata.as_uri())
    sink = IcebergSink.builder().catalog("t", **props).table("db.dv").build()
    before = sink.load_table()
    vectors = _live_vectors(before)
    assert len(vectors) == 2  # one DV per data file with deletes, in partitions a and b
    lineage = _lineage_by_id(java, before)
    live = [(i, p, v) for i, p, v in [(1, "a", "x"), (4, "a", "x"), (5, "a", "y"), (6, "a", "y")]]
    live += [(7, "b", "y"), (9, "b", "y"), (10, "b", "z")]
    expected = [{"id": i, "part": p, "v": v} for i, p, v in live]

    config = CompactionConfig(min_input_files=2, delete_file_threshold=1)
    result = sink.compact(spark, config, partition_filter=lambda _spec, values: values == ("a",))
    table = sink.load_table()
    assert result.committed_groups == 1
    b_vector = {d: f for d, f in vectors.items() if "part=b" in d}
    assert _live_vectors(table) == b_vector  # a's DV dropped with its data file, b's kept
    assert_readers_agree(java_readers, table.metadata_location, expected, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(
        pa.Table.from_pylist(expected), ["id"]
    )
    assert _lineage_by_id(java, table) == lineage

    sink.compact(spark, config)
    table = sink.load_table()
    assert _live_vectors(table) == {}
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and int(summary["total-delete-files"]) == 0
    assert_readers_agree(java_readers, table.metadata_location, expected, ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(
        pa.Table.from_pylist(expected), ["id"]
    )
    assert _lineage_by_id(java, table) == lineage


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_post_commit_compaction_of_a_v3_table_keeps_every_rows_lineage(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, background: bool
) -> None:
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "data")
        .table("db.t")
        .create_if_missing(format_version=3)
        .compaction(every_n_commits=3, background=background)
        .build()
    )
    batches = [rows(0, 10), rows(10, 5), rows(15, 8)]
    for batch in batches[:2]:
        sink.write(spark.createDataFrame(batch, SCHEMA))
    newest = java_readers[-1]
    lineage = _lineage_by_id(newest, sink.load_table())
    next_row_id = sink.load_table().metadata.next_row_id
    sink.write(spark.createDataFrame(batches[2], SCHEMA))  # the third commit triggers a compaction
    sink.await_compactions(300)
    assert sink.metrics().compactions_succeeded == 1 and sink.metrics().compactions_failed == 0
    table = sink.load_table()
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary.operation.value == "replace"
    after = _lineage_by_id(newest, table)
    assert {i: after[i] for i in lineage} == lineage
    third = sorted(after[i][0] for i in range(15, 23))
    assert third == list(range(next_row_id, next_row_id + 8))  # the third commit's ids, kept by the rewrite
    expected = pa.Table.from_pylist(
        [dict(zip(["id", "user_id", "ts", "v"], r, strict=True)) for b in batches for r in b]
    )
    assert_readers_agree(java_readers, table.metadata_location, expected, ["id"])
