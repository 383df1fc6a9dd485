"""Upgrading a v2 upsert table (equality deletes included) to format v3 with
``sink.upgrade_format_version(3)``, then appending to it and compacting it: Iceberg Java 1.9.2, the
newest Iceberg Java and DuckDB read the right rows at every step, PyIceberg too once the compaction
removed the equality deletes (it reads none), the newest Java's ``_row_id`` and
``_last_updated_sequence_number`` are the spec's and survive the compaction, and Java reads the
lineage the sink committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.lineage import read_entries, read_manifests
from iceberg_sink._iceberg.manifests import data_file_first_row_id
from iceberg_sink.topology.compaction.config import CompactionConfig
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

DDL = "id long not null, v string"


def _files(table: Table) -> dict[str, tuple[int | None, int]]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        e.data_file.file_path: (data_file_first_row_id(e.data_file), e.sequence_number or 0)
        for m in read_manifests(table.io, snapshot, 3)
        if m.content == ManifestContent.DATA
        for e in read_entries(table.io, m)
    }


def _spec_lineage(table: Table, model: dict[int, str]) -> dict[int, tuple[int, int]]:
    """The spec's lineage of the live rows of ``model`` (a row is live when its value is the model's:
    the older version of an updated row sits in an older file, deleted by an equality delete), from
    files the sink wrote without lineage columns."""
    result = {}
    for path, (first, sequence) in _files(table).items():
        assert first is not None
        for pos, row in enumerate(pq.read_table(path.removeprefix("file://"), columns=["id", "v"]).to_pylist()):
            if model.get(row["id"]) == row["v"]:
                assert row["id"] not in result
                result[row["id"]] = (first + pos, sequence)
    return result


def _java_lineage(java: JavaIcebergReader, table: Table) -> dict[int, tuple[int, int]]:
    got = java.row_lineage(table.metadata_location).to_pylist()
    return {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in got}


def test_an_upgraded_v2_upsert_table_takes_appends_and_compaction_and_every_reader_agrees(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    upserts = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.t")
        .create_if_missing(format_version=2)
        .upsert(key=["id"])
        .build()
    )
    model: dict[int, str] = {}

    def write(sink: Any, rows: list[tuple[int, str]]) -> None:
        sink.write(spark.createDataFrame(rows, DDL))
        model.update(rows)

    def expected() -> list[dict[str, Any]]:
        return [{"id": i, "v": v} for i, v in sorted(model.items())]

    write(upserts, [(i, f"a{i}") for i in range(20)])
    write(upserts, [(i, f"b{i}") for i in range(5, 10)])  # updates: equality deletes on v2
    v2 = upserts.load_table()
    assert v2.metadata.format_version == 2
    assert int(v2.current_snapshot().summary["total-equality-deletes"]) > 0  # type: ignore[union-attr]

    appends = IcebergSink.builder().embedded(lake).table("db.t").build()
    table = appends.upgrade_format_version(3)
    assert table.metadata.format_version == 3 and table.metadata.next_row_id == 0
    assert [s.snapshot_id for s in table.metadata.snapshots] == [s.snapshot_id for s in v2.metadata.snapshots]
    assert_readers_agree(java_readers, table.metadata_location, expected(), ["id"])  # both Javas and DuckDB

    write(appends, [(i, f"c{i}") for i in range(20, 25)])
    table = appends.load_table()
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.first_row_id == 0
    assert table.metadata.next_row_id == snapshot.added_rows
    assert all(first is not None for first, _ in _files(table).values())  # every v2 file has ids now
    assert_readers_agree(java_readers, table.metadata_location, expected(), ["id"])
    newest = java_readers[-1]
    lineage = _java_lineage(newest, table)
    assert lineage == _spec_lineage(table, model)
    ranges = [(s.first_row_id, s.added_rows) for s in table.metadata.snapshots]
    for java in java_readers:
        view = java.lineage(table.metadata_location)
        assert [(s["first_row_id"], s["added_rows"]) for s in view["snapshots"]] == ranges, java.label
        assert view["next_row_id"] == table.metadata.next_row_id, java.label
        assert {f["path"]: f["first_row_id"] for f in view["files"]} == {p: f for p, (f, _) in _files(table).items()}, (
            java.label
        )

    # Compaction applies the v2 equality deletes, removes them, and keeps every row's lineage.
    result = appends.compact(spark, CompactionConfig(min_input_files=2))
    table = appends.load_table()
    assert result.committed_groups >= 1 and result.removed_delete_files > 0
    assert int(table.current_snapshot().summary["total-equality-deletes"]) == 0  # type: ignore[union-attr]
    assert_readers_agree(java_readers, table.metadata_location, expected(), ["id"])
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(
        pa.Table.from_pylist(expected()), ["id"]
    )
    assert _java_lineage(newest, table) == lineage
