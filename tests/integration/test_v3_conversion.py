"""Equality-delete conversion on format v3: a v2 upsert table (equality deletes) upgraded to v3
keeps its equality deletes; the conversion turns them into deletion vectors, one per data file,
carrying the positions of the DVs they replace, while the sink's own v3 checkpoint and Iceberg Java
commit DVs on the same data files between the conversion's plan and its commit. Iceberg Java 1.9.2, the newest
Iceberg Java, DuckDB and PyIceberg (which reads no equality delete) read the model; rows keep their
lineage. The post-commit trigger converts on v3 too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.deletion_vectors import read_deletion_vector
from iceberg_sink.topology.conversion import convert_equality_deletes
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from tests.integration.test_v3_cdc import delete_files, java_commits
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

DDL = "id long not null, v string"


def _sink(lake: Path, **conversion: Any) -> Any:
    builder = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.t")
        .create_if_missing(partition_by=["bucket(2, id)"], format_version=2)  # v2, upgraded by the tests
        .upsert(key=["id"])
    )
    return (builder.convert_equality_deletes(**conversion) if conversion else builder).build()


def _write(spark: SparkSession, sink: Any, model: dict[int, str], rows: list[tuple[int, str]]) -> None:
    sink.write(spark.createDataFrame(rows, DDL))
    model.update(rows)


def _rows(model: dict[int, str]) -> list[dict[str, Any]]:
    return [{"id": i, "v": v} for i, v in sorted(model.items())]


def _positions(table: Table, dv: DataFileMeta) -> set[int]:
    assert dv.content_offset is not None and dv.content_size_in_bytes is not None
    return {int(p) for p in read_deletion_vector(table.io, dv.path, dv.content_offset, dv.content_size_in_bytes)}


def _dvs(table: Table, only: bool = True) -> dict[str, set[int]]:
    """Each data file's live DV's positions; fails on two DVs for a data file and, when ``only``,
    on a live delete file that is not a DV."""
    deletes = [d for d, _ in delete_files(table)]
    assert not only or all(d.is_dv for d in deletes), [d.path for d in deletes if not d.is_dv]
    deletes = [d for d in deletes if d.is_dv]
    targets = [str(d.referenced_data_file) for d in deletes]
    assert len(targets) == len(set(targets)), "two DVs for one data file"
    return {str(d.referenced_data_file): _positions(table, d) for d in deletes}


def _lineage(java: JavaIcebergReader, table: Table) -> dict[int, tuple[int, int]]:
    got = java.row_lineage(table.metadata_location).to_pylist()
    return {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in got}


# A row of the first data files that Iceberg Java deletes while a conversion is planned.
JAVA_DELETED = 27


def _java_deletes(java: JavaIcebergReader, sink: Any, tmp_path: Path, row_id: int) -> None:
    """Iceberg Java deletes one row (merge-on-read: a DV) through a JDBC catalog of its own; the
    sink's catalog then points at Java's metadata, as if Java had committed to the same catalog."""
    java_commits(
        java,
        sink.config.catalog.load(),
        sink.load_table(),
        tmp_path,
        "ALTER TABLE {t} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')",
        f"DELETE FROM {{t}} WHERE id = {row_id}",
    )
    assert "added-dvs" in sink.load_table().current_snapshot().summary.additional_properties


def _racing(load: Callable[[], Table], before_commit: Callable[[], None]) -> Callable[[], Table]:
    """A table loader that lets another writer commit before the second load (the commit's)."""
    calls = {"n": 0}

    def loader() -> Table:
        calls["n"] += 1
        if calls["n"] == 2:
            before_commit()
        return load()

    return loader


def test_an_upgraded_tables_equality_deletes_become_dvs_beside_a_concurrent_checkpoint(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    lake, model = tmp_path / "lake", {}
    v2 = _sink(lake)
    _write(spark, v2, model, [(i, f"a{i}") for i in range(30)])
    _write(spark, v2, model, [(i, f"b{i}") for i in range(5, 15)])  # equality deletes on v2
    _write(spark, v2, model, [(i, f"c{i}") for i in range(10, 20)])
    v3 = _sink(lake)
    v3.upgrade_format_version(3)
    _write(spark, v3, model, [(i, f"d{i}") for i in range(3)])  # DVs on the first files
    before = v3.load_table()
    assert before.metadata.format_version == 3
    assert int(before.current_snapshot().summary["total-equality-deletes"]) > 0  # type: ignore[union-attr]
    dvs_before = _dvs(before, only=False)
    assert dvs_before
    newest = java_readers[-1]
    lineage_before = _lineage(newest, before)

    # Between the plan and the commit the sink updates more rows of the first files (new DVs there),
    # then Iceberg Java deletes a row of them (its DV merges the sink's and replaces it): the
    # conversion plans again and merges both writers' positions.
    racing = [(i, f"e{i}") for i in range(20, 26)]

    def race() -> None:
        _write(spark, v3, model, racing)
        _java_deletes(newest, v3, tmp_path, JAVA_DELETED)
        del model[JAVA_DELETED]

    result = convert_equality_deletes(_racing(v3.load_table, race))
    table = v3.load_table()
    assert result.snapshot_id is not None and result.replans == 1
    assert result.added_dvs > 0 and result.replaced_dvs > 0 and result.added_position_delete_files == 0
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == result.snapshot_id and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace" and snapshot.added_rows == 0
    assert snapshot.summary["total-equality-deletes"] == "0"
    assert "added-position-delete-files" not in snapshot.summary.additional_properties

    # Main holds DVs only, at most one per data file, each keeping every position deleted before.
    dvs_after = _dvs(table)
    assert all(dvs_before[path] <= dvs_after[path] for path in dvs_before)
    assert sum(map(len, dvs_after.values())) > sum(map(len, dvs_before.values())) + len(racing)
    assert_readers_agree(java_readers, table.metadata_location, _rows(model), ["id"])  # both Javas, DuckDB
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == normalize(
        pa.Table.from_pylist(_rows(model)), ["id"]
    )
    # The conversion moved no row's lineage (the racing checkpoint did, for the rows it updated).
    after = _lineage(newest, table)
    moved = {*dict(racing), JAVA_DELETED}
    assert {k: v for k, v in after.items() if k not in moved} == {
        k: v for k, v in lineage_before.items() if k not in moved
    }
    # Java's DV was merged, not lost: its row stays deleted in the converted DVs.
    assert JAVA_DELETED not in after


def test_the_post_commit_trigger_converts_on_v3(spark: SparkSession, tmp_path: Path) -> None:
    lake, model = tmp_path / "lake", {}
    v2 = _sink(lake)
    _write(spark, v2, model, [(i, f"a{i}") for i in range(10)])
    _write(spark, v2, model, [(i, f"b{i}") for i in range(5)])  # equality deletes on v2
    sink = _sink(lake, every_n_commits=1, background=False)
    assert sink.upgrade_format_version(3).metadata.format_version == 3
    _write(spark, sink, model, [(9, "c9")])  # a v3 checkpoint (a DV), then the trigger's conversion
    sink.await_conversions(120)
    table = sink.load_table()
    assert table.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    assert not [d for d, _ in delete_files(table) if d.content == FileContent.EQUALITY_DELETES]
    _dvs(table)
    metrics = sink.metrics()
    assert (metrics.conversions_succeeded, metrics.conversion_added_position_delete_files) == (1, 0)
    assert metrics.conversion_added_dvs >= 1
    for got in (pyiceberg_read(table.metadata_location), duckdb_read(table.metadata_location)):
        assert normalize(got, ["id"]) == normalize(pa.Table.from_pylist(_rows(model)), ["id"])
