"""The snapshot-producer base: summary totals, format-version dispatch and requirements."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink._iceberg import producer, rewrites, row_delta
from iceberg_sink._iceberg.entries import live_files
from iceberg_sink._iceberg.summary import summary_totals
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType()))


def test_totals_start_at_zero_on_a_new_branch_and_follow_the_changes() -> None:
    first = summary_totals(None, {"added-data-files": "2", "added-records": "10", "added-files-size": "100"})
    assert first["total-data-files"] == "2" and first["total-records"] == "10" and first["total-delete-files"] == "0"
    second = summary_totals(first, {"deleted-data-files": "1", "deleted-records": "4", "removed-files-size": "30"})
    assert (second["total-data-files"], second["total-records"], second["total-files-size"]) == ("1", "6", "70")


def test_totals_are_never_made_up_nor_negative() -> None:
    # A parent that carries no totals (written by a tool that keeps none): nothing can be known.
    assert summary_totals({}, {"added-data-files": "1", "added-records": "5"}) == {}
    # A parent whose totals are wrong: a negative result is left out, not reported.
    assert "total-records" not in summary_totals({"total-records": "3"}, {"deleted-records": "5"})
    assert "total-records" not in summary_totals({"total-records": "x"}, {"added-records": "5"})


@pytest.fixture
def v1_catalog(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("db")
    cat.create_table("db.v1", schema=SCHEMA, properties={"format-version": "1"})
    return cat


def _manifest_format_versions(table: object, snapshot: object) -> set[str]:
    versions = set()
    for manifest in snapshot.manifests(table.io):  # type: ignore[attr-defined]
        with AvroFile[object](table.io.new_input(manifest.manifest_path)) as avro:  # type: ignore[attr-defined]
            versions.add(avro.header.meta["format-version"])
    return versions


def test_every_commit_kind_writes_v1_manifests_into_a_v1_table(v1_catalog: SqlCatalog) -> None:
    table = v1_catalog.load_table("db.v1")
    for checkpoint, ids in enumerate([[1, 2], [3]]):
        result = write_batches(
            writer_spec(table, checkpoint_id=checkpoint),
            pa.table({"id": pa.array(ids, pa.int64()), "v": ["x"] * len(ids)}),
        )
        changes = row_delta.SnapshotChanges(data_files=result.data_files)
        table = producer.commit_prepared(table, row_delta.RowDelta(table, "main", changes, {}).prepare())
    data, _ = live_files(table, table.current_snapshot())
    # A rewrite of both files into one, then a manifest rewrite: each must stay format version 1.
    merged = write_batches(
        writer_spec(table, checkpoint_id=9), pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["x"] * 3})
    )
    removed = frozenset(f.meta.path for f in data)
    table = producer.commit_prepared(
        table, rewrites.RewriteFiles(table, "main", merged.data_files, removed, 1, {}).prepare()
    )
    assert _manifest_format_versions(table, table.current_snapshot()) == {"1"}
    # Two appends and a rewrite left several manifests: the manifest rewrite merges them.
    rewrite = rewrites.RewriteManifests(table, "main", 10_000, {})
    assert rewrite.worthwhile()
    table = producer.commit_prepared(table, rewrite.prepare())
    assert _manifest_format_versions(table, table.current_snapshot()) == {"1"}
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary["total-records"] == "3" and summary["total-data-files"] == "1"


def test_delete_files_are_refused_for_a_v1_table(v1_catalog: SqlCatalog) -> None:
    table = v1_catalog.load_table("db.v1")
    result = write_batches(
        writer_spec(table, equality_field_ids=(1,), op_column="op"),
        pa.table({"id": pa.array([1], pa.int64()), "v": ["x"], "op": ["U"]}),
    )
    changes = row_delta.SnapshotChanges(data_files=result.data_files, delete_files=result.delete_files)
    with pytest.raises(ValueError, match="format version 2"):
        row_delta.RowDelta(table, "main", changes, {})


def test_a_truncating_row_delta_removes_every_live_file_and_adds_its_own(tmp_path: Path) -> None:
    (tmp_path / "wh2").mkdir()
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c2.db", warehouse=(tmp_path / "wh2").as_uri())
    cat.create_namespace("db")
    table = cat.create_table("db.v2", schema=SCHEMA, properties={"format-version": "2"})
    for checkpoint, ids in enumerate([[1, 2], [3]]):
        upserts = pa.table({"id": pa.array(ids, pa.int64()), "v": ["x"] * len(ids), "op": ["U"] * len(ids)})
        result = write_batches(
            writer_spec(table, checkpoint_id=checkpoint, equality_field_ids=(1,), op_column="op"), upserts
        )
        changes = row_delta.SnapshotChanges(data_files=result.data_files, delete_files=result.delete_files)
        table = producer.commit_prepared(table, row_delta.RowDelta(table, "main", changes, {}).prepare())
    data, deletes = live_files(table, table.current_snapshot())
    assert len(data) == 2 and len(deletes) == 2
    # The rows after the truncate: one data file, and the marker row is reported, not written.
    after = pa.table({"id": pa.array([None, 7], pa.int64()), "v": [None, "y"], "op": ["T", "I"]})
    result = write_batches(writer_spec(table, checkpoint_id=2, equality_field_ids=(1,), op_column="op"), after)
    assert result.truncated and len(result.data_files) == 1
    changes = row_delta.SnapshotChanges(data_files=result.data_files, delete_files=result.delete_files, truncate=True)
    assert changes.operation.value == "overwrite"
    assert row_delta.SnapshotChanges(truncate=True).operation.value == "delete"
    table = producer.commit_prepared(table, row_delta.RowDelta(table, "main", changes, {}).prepare())
    data, deletes = live_files(table, table.current_snapshot())
    assert [f.meta.path for f in data] == [f.path for f in result.data_files]
    assert {f.meta.path for f in deletes} == {f.path for f in result.delete_files}
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary.operation.value == "overwrite"
    assert (summary["deleted-data-files"], summary["removed-delete-files"], summary["total-data-files"]) == (
        "2",
        "2",
        "1",
    )
