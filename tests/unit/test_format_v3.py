"""Format v3 tables: creation, the v3 manifest and manifest-list bytes, row lineage as the spec and
Iceberg Java assign it, and the refusal of every commit kind v3 cannot take yet (no Spark)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink import IcebergSink, InvalidSinkConfigError, UnsupportedTableError
from iceberg_sink._iceberg import producer, row_delta, schema_update
from iceberg_sink._iceberg.delete_rewrite import RewriteDeletes
from iceberg_sink._iceberg.lineage import ManifestListWriterV3, assign_first_row_ids, read_entries, read_manifests
from iceberg_sink._iceberg.manifests import as_v3_data_file, data_file_first_row_id
from iceberg_sink.config import CreateOptions
from iceberg_sink.table.catalog import create_table
from iceberg_sink.topology.maintenance import expire_snapshots, rewrite_manifests
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType()))


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())


def _v3(
    catalog: SqlCatalog, name: str = "db.t", spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC, **props: str
) -> Table:
    return create_table(catalog, name, SCHEMA, spec, {"format-version": "3", **props})


def _metadata_json(table: Table) -> dict[str, Any]:
    return json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())


def _append(table: Table, ids: list[int], checkpoint: int = 0, v: str = "x") -> Table:
    result = write_batches(
        writer_spec(table, checkpoint_id=checkpoint), pa.table({"id": pa.array(ids, pa.int64()), "v": [v] * len(ids)})
    )
    changes = row_delta.SnapshotChanges(data_files=result.data_files)
    return producer.commit_prepared(table, row_delta.RowDelta(table, "main", changes, {}).prepare())


def _file_row_ids(table: Table) -> dict[int, int | None]:
    """Smallest id of each live data file -> its (inherited or written) first row id."""
    result = {}
    snapshot = table.current_snapshot()
    assert snapshot is not None
    for manifest in read_manifests(table.io, snapshot, 3):
        for entry in read_entries(table.io, manifest):
            lower = int.from_bytes(entry.data_file.lower_bounds[1], "little", signed=True)
            result[lower] = data_file_first_row_id(entry.data_file)
    return result


def test_a_v3_table_is_created_with_next_row_id_zero_and_pyiceberg_alone_still_refuses(catalog: SqlCatalog) -> None:
    table = _v3(catalog)
    written = _metadata_json(table)
    assert written["format-version"] == 3 and written["next-row-id"] == 0
    assert table.metadata.format_version == 3 and table.metadata.next_row_id == 0
    # Outside the sink's own commits PyIceberg's refusal to write v3 metadata stands.
    with pytest.raises(NotImplementedError, match=r"V3"):
        table.metadata.model_dump_json()


def test_appends_assign_row_ids_as_the_spec_and_java_do_merges_included(catalog: SqlCatalog) -> None:
    # Merging at 3 manifests: the third commit merges the three into one new manifest.
    table = _v3(catalog, **{"commit.manifest.min-count-to-merge": "3"})
    ranges = []
    for checkpoint, ids in enumerate([[1, 2, 3], [4, 5], [6], [7, 8]]):
        table = _append(table, ids, checkpoint)
        snapshot = table.current_snapshot()
        assert snapshot is not None
        ranges.append((snapshot.first_row_id, snapshot.added_rows, table.metadata.next_row_id))
    # 1st: ids 0-2. 2nd: 3-4. 3rd: the merged manifest has no first_row_id, so the list gives it 5
    # and reserves its added (1) and existing (5) rows: added-rows 6. 4th: 11-12.
    assert ranges == [(0, 3, 3), (3, 2, 5), (5, 6, 11), (11, 2, 13)]
    # Every row keeps its id through the merge: existing entries write their inherited ids out.
    assert _file_row_ids(table) == {1: 0, 4: 3, 6: 5, 7: 11}
    written = _metadata_json(table)
    assert written["next-row-id"] == 13
    assert [(s["first-row-id"], s["added-rows"]) for s in written["snapshots"]] == [(0, 3), (3, 2), (5, 6), (11, 2)]
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(1, 9))  # PyIceberg reads it


def test_the_v3_manifest_and_manifest_list_bytes(catalog: SqlCatalog) -> None:
    table = _append(_append(_v3(catalog), [1, 2]), [3], 1)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    with AvroFile[Any](table.io.new_input(snapshot.manifest_list)) as avro:
        meta = avro.header.meta
        fields = json.loads(meta["avro.schema"])["fields"]
        records = list(avro)
    assert (meta["format-version"], meta["first-row-id"], meta["sequence-number"]) == ("3", "2", "2")
    assert meta["snapshot-id"] == str(snapshot.snapshot_id) and meta["parent-snapshot-id"] == str(
        snapshot.parent_snapshot_id
    )
    assert fields[-1] == {"name": "first_row_id", "type": ["null", "long"], "default": None, "field-id": 520}
    assert [r[15] for r in records] == [2, 0]  # the new manifest gets the table's next-row-id; the old keeps its own
    manifest = read_manifests(table.io, snapshot, 3)[0]
    with AvroFile[Any](table.io.new_input(manifest.manifest_path)) as avro:
        meta = avro.header.meta
        entry_fields = json.loads(meta["avro.schema"])["fields"]
        raw = list(avro)
    assert (meta["format-version"], meta["content"]) == ("3", "data")
    data_file = next(f for f in entry_fields if f["name"] == "data_file")["type"]["fields"]
    assert [(f["name"], f["field-id"]) for f in data_file][-4:] == [
        ("first_row_id", 142),
        ("referenced_data_file", 143),
        ("content_offset", 144),
        ("content_size_in_bytes", 145),
    ]
    assert all(f["type"][0] == "null" for f in data_file[-4:])  # optional
    # A new file is written without a first_row_id: it inherits the manifest's.
    assert raw[0][4][16] is None and raw[0][4][17] is None


def test_partitioned_files_take_consecutive_ids_in_manifest_order(catalog: SqlCatalog) -> None:
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="v"))
    table = _v3(catalog, spec=spec)
    result = write_batches(
        writer_spec(table), pa.table({"id": pa.array([1, 2, 3, 4, 5], pa.int64()), "v": ["a", "b", "a", "b", "b"]})
    )
    table = producer.commit_prepared(
        table, row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(data_files=result.data_files), {}).prepare()
    )
    snapshot = table.current_snapshot()
    assert snapshot is not None and (snapshot.first_row_id, snapshot.added_rows) == (0, 5)
    (manifest,) = read_manifests(table.io, snapshot, 3)
    entries = read_entries(table.io, manifest)
    counts = [e.data_file.record_count for e in entries]
    assert [data_file_first_row_id(e.data_file) for e in entries] == [0, counts[0]]
    assert table.metadata.next_row_id == 5


def _entry(status: ManifestEntryStatus, records: int, first_row_id: int | None = None) -> ManifestEntry:
    data_file = as_v3_data_file(
        DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=f"f{records}",
            file_format=FileFormat.PARQUET,
            partition=Record(),
            record_count=records,
            file_size_in_bytes=1,
        )
    )
    data_file[16] = first_row_id
    return ManifestEntry.from_args(
        status=status, snapshot_id=1, sequence_number=1, file_sequence_number=1, data_file=data_file
    )


def _manifest(content: ManifestContent, first_row_id: int | None, added: int = 0, existing: int = 0) -> ManifestFile:
    base = ManifestFile.from_args(
        manifest_path=f"m-{content}-{first_row_id}",
        manifest_length=1,
        partition_spec_id=0,
        content=content,
        sequence_number=1,
        min_sequence_number=1,
        added_snapshot_id=1,
        added_files_count=1,
        existing_files_count=1,
        deleted_files_count=0,
        added_rows_count=added,
        existing_rows_count=existing,
        deleted_rows_count=0,
    )
    return ManifestFile(*[base[i] for i in range(len(base))], first_row_id)


def test_reading_assigns_ids_as_javas_manifest_reader() -> None:
    entries = [
        _entry(ManifestEntryStatus.EXISTING, 4, first_row_id=100),  # written out: kept
        _entry(ManifestEntryStatus.ADDED, 3),  # inherits the manifest's, 50
        _entry(ManifestEntryStatus.DELETED, 7),  # deleted: takes none, moves nothing
        _entry(ManifestEntryStatus.ADDED, 2),  # 50 + 3
    ]
    assign_first_row_ids(entries, _manifest(ManifestContent.DATA, 50))
    assert [data_file_first_row_id(e.data_file) for e in entries] == [100, 50, None, 53]
    # A manifest without a first_row_id (pre-v3) gives none, even to a file that has one written.
    again = [_entry(ManifestEntryStatus.EXISTING, 4, first_row_id=100), _entry(ManifestEntryStatus.ADDED, 3)]
    assign_first_row_ids(again, _manifest(ManifestContent.DATA, None))
    assert [data_file_first_row_id(e.data_file) for e in again] == [None, None]


def test_the_manifest_list_assigns_ids_to_data_manifests_without_one_only(tmp_path: Path, catalog: SqlCatalog) -> None:
    table = _v3(catalog)
    path = str(tmp_path / "list.avro")
    writer = ManifestListWriterV3(table.io.new_output(path), 7, None, 4, first_row_id=20)
    with writer:
        writer.add_manifests(
            [
                _manifest(ManifestContent.DATA, None, added=2, existing=3),  # 20; room for 5 rows
                _manifest(ManifestContent.DATA, 9, added=6),  # keeps 9
                _manifest(ManifestContent.DELETES, None, added=4),  # delete manifests take none
                _manifest(ManifestContent.DATA, None, added=1),  # 25
            ]
        )
    assert writer.next_row_id == 26  # the snapshot's added-rows is 26 - 20 = 6
    with AvroFile[Any](table.io.new_input(path)) as avro:
        assert avro.header.meta["first-row-id"] == "20" and avro.header.meta["parent-snapshot-id"] == "null"
        assert [r[15] for r in avro] == [20, 9, None, 25]


def test_manifest_rewrite_keeps_every_rows_id(catalog: SqlCatalog) -> None:
    table = _v3(catalog, **{"commit.manifest-merge.enabled": "false"})
    for checkpoint, ids in enumerate([[1, 2], [3], [4, 5, 6]]):
        table = _append(table, ids, checkpoint)
    before = _file_row_ids(table)
    assert before == {1: 0, 3: 2, 4: 3} and table.metadata.next_row_id == 6
    assert rewrite_manifests(lambda: catalog.load_table("db.t"), "main", 100) is not None
    table = catalog.load_table("db.t")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    # The one new manifest holds only existing entries (ids written out); the list reserves its 6 rows.
    assert _file_row_ids(table) == before
    assert (snapshot.first_row_id, snapshot.added_rows, table.metadata.next_row_id) == (6, 6, 12)


def test_schema_evolution_and_expiry_commit_on_a_v3_table(catalog: SqlCatalog) -> None:
    table = _append(_append(_v3(catalog), [1]), [2], 1)
    schema_update.commit(table, [(("extra",), "add", StringType())])
    table = catalog.load_table("db.t")
    assert table.schema().find_field("extra") and table.metadata.next_row_id == 2
    result = expire_snapshots(lambda: catalog.load_table("db.t"), dt.datetime.now(dt.UTC), retain_last=1)
    assert len(result.expired_snapshot_ids) == 1
    table = catalog.load_table("db.t")
    assert len(table.metadata.snapshots) == 1 and _metadata_json(table)["next-row-id"] == 2
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2]


def test_a_commit_whose_first_row_id_went_stale_is_a_retryable_conflict(catalog: SqlCatalog) -> None:
    table = _append(_v3(catalog), [1])
    # Two writers prepare on the same metadata, one on another branch: the second to land carries a
    # first row id below the table's next-row-id, which the catalog refuses; that is retried.
    on_branch = row_delta.RowDelta(
        table, "other", row_delta.SnapshotChanges(data_files=_files(table, [2])), {}
    ).prepare()
    on_main = row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(data_files=_files(table, [3])), {}).prepare()
    producer.commit_prepared(table, on_branch)
    with pytest.raises(CommitFailedException, match=r"first row id"):
        producer.commit_prepared(table, on_main)


def _files(table: Table, ids: list[int]) -> tuple[Any, ...]:
    batch = pa.table({"id": pa.array(ids, pa.int64()), "v": ["x"] * len(ids)})
    return write_batches(writer_spec(table, checkpoint_id=ids[0]), batch).data_files


def test_every_commit_kind_v3_cannot_take_is_refused_before_anything_is_written(catalog: SqlCatalog) -> None:
    table = _append(_v3(catalog), [1, 2])
    deletes = write_batches(
        writer_spec(table, checkpoint_id=5, equality_field_ids=(1,), op_column="op"),
        pa.table({"id": pa.array([1], pa.int64()), "v": ["y"], "op": ["U"]}),
    )
    changes = row_delta.SnapshotChanges(data_files=deletes.data_files, delete_files=deletes.delete_files)
    with pytest.raises(UnsupportedTableError, match=r"equality or position delete files.*deletion vectors only"):
        row_delta.RowDelta(table, "main", changes, {})
    with pytest.raises(UnsupportedTableError, match=r"expected deletion vectors.*deletion vectors only"):
        RewriteDeletes(table, "main", deletes.delete_files, frozenset(), {})
    assert len(catalog.load_table("db.t").metadata.snapshots) == 1  # nothing was committed


def test_create_if_missing_without_a_version_gives_upserts_and_cdc_v3_and_appends_v2(tmp_path: Path) -> None:
    """Issue 42 item 13: PyIceberg reads no equality deletes, so a table the sink creates for upserts
    or CDC is v3 (deletion vectors) unless told otherwise; appends stay v2. The tables themselves,
    routed and dead-letter ones included: tests/integration/test_default_format_version.py."""

    def version(create: dict[str, Any], mode: str | None = None) -> int | None:
        builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing(**create)
        if mode == "upsert":
            builder = builder.upsert(key=["id"])
        elif mode == "cdc":
            builder = builder.cdc(op_column="op", key=["id"])
        config = builder.build().config.create
        assert config is not None
        return config.format_version

    assert [version({}, mode) for mode in ("upsert", "cdc", None)] == [3, 3, 2]
    assert [version({"format_version": 2}, mode) for mode in ("upsert", "cdc", None)] == [2, 2, 2]
    assert [version({"format_version": 3}, mode) for mode in ("upsert", "cdc", None)] == [3, 3, 3]
    assert version({"format_version": 1}) == 1
    # A configuration made without the builder (the dead-letter table's) resolves the same way.
    assert (CreateOptions().version_for(True), CreateOptions().version_for(False)) == (3, 2)
    assert CreateOptions(format_version=2).version_for(True) == 2


def test_the_builder_takes_v3_for_appends_and_names_what_it_refuses(tmp_path: Path, catalog: SqlCatalog) -> None:
    def builder(table: str = "db.new") -> Any:
        uri, warehouse = f"sqlite:///{tmp_path}/c.db", (tmp_path / "wh").as_uri()
        return IcebergSink.builder().catalog("t", type="sql", uri=uri, warehouse=warehouse).table(table)

    assert builder().create_if_missing(format_version=3).build() is not None
    assert builder().create_if_missing(format_version=3).upsert(key=["id"]).build() is not None
    assert builder().create_if_missing(format_version=3).compaction(every_n_commits=2).build() is not None
    # Equality-delete conversion writes deletion vectors on v3 (tests/unit/test_v3_conversion.py).
    assert builder().create_if_missing(format_version=3).convert_equality_deletes(every_n_commits=1).build()
    with pytest.raises(InvalidSinkConfigError, match=r"expected 1, 2 or 3, received 4"):
        builder().create_if_missing(format_version=4).build()
    _v3(catalog, "db.old")
    assert builder("db.old").build() is not None
    assert builder("db.old").upsert(key=["id"]).build() is not None
    assert builder("db.old").compaction(every_n_commits=2).build() is not None
