"""Everything iceberg_sink needs from PyIceberg beyond its public table API, in one place.

PyIceberg 0.12 cannot write delete manifests, commit pre-built manifests, row deltas or rewrites. This
module builds them from PyIceberg's manifest/manifest-list writers and its catalog ``commit_table``
with explicit requirements, the same way its own snapshot producers do. It is pinned to
``pyiceberg==0.12.0`` (pyproject.toml); tests/test_pyiceberg_compat.py and the interop tests (Iceberg
Java, DuckDB) check what it writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
)
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import IntegerType, ListType, NestedField, StructType

from iceberg_sink.writer.result import DataFileMeta, FileContent

SUPPORTED_FORMAT_VERSIONS = (1, 2)


# ---------------------------------------------------------------------------------------------
# Writing files: Arrow schema with field ids and Parquet column metrics.


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of ``schema`` with Iceberg field ids in each field's Parquet metadata."""
    return schema_to_pyarrow(schema, include_field_ids=True)


def parquet_metrics(metadata: pq.FileMetaData, schema: Schema, properties: Mapping[str, str]) -> dict[str, Any]:
    """Iceberg column metrics from a written Parquet footer, honouring ``write.metadata.metrics.*``."""
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, dict(properties)),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return stats.to_serialized_dict()


def nan_counts_by_field_id(
    schema: Schema, nan_counts_by_name: Mapping[str, int], metrics: Mapping[str, Any]
) -> dict[int, int]:
    """NaN counts keyed by field id, for columns whose metrics are collected at all."""
    collected = metrics["value_counts"]
    result = {}
    for name, count in nan_counts_by_name.items():
        field_id = schema.find_field(name).field_id
        if field_id in collected:
            result[field_id] = count
    return result


def column_by_path(table: pa.Table, path: str) -> pa.Array:
    """A column of ``table`` by Iceberg column name (``a.b`` reaches into structs)."""
    if path in table.column_names:
        return table.column(path).combine_chunks()
    parts = path.split(".")
    array = table.column(parts[0]).combine_chunks()
    return pc.struct_field(array, parts[1:])


def partition_values(spec: PartitionSpec, schema: Schema, transformed: Sequence[Any]) -> tuple[Any, ...]:
    """Iceberg's internal representation of transformed partition values (dates as days, ...).

    PyIceberg's PartitionKey refuses two fields on one source column (e.g. day(ts) and hour(ts)),
    which Iceberg allows, so the conversion is done per field here.
    """
    result = []
    for field, value in zip(spec.fields, transformed, strict=True):
        result_type = field.transform.result_type(schema.find_field(field.source_id).field_type)
        result.append(_to_partition_representation(result_type, value))
    return tuple(result)


@attrs.frozen
class PartitionPath:
    """What PyIceberg's location providers need of a partition key: its escaped path."""

    spec: PartitionSpec
    schema: Schema
    values: tuple[Any, ...]

    @property
    def partition(self) -> Record:
        return Record(*self.values)

    def to_path(self) -> str:
        # partition_to_path URL-escapes every name and value (quote_plus, safe=""), so no value
        # can add a path separator or climb out of the table's data folder.
        return self.spec.partition_to_path(Record(*self.values), self.schema)


# ---------------------------------------------------------------------------------------------
# Files and manifests.


def to_data_file(meta: DataFileMeta, format_version: int) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent(int(meta.content)),
        file_path=meta.path,
        file_format=FileFormat(meta.file_format),
        partition=Record(*meta.partition),
        record_count=meta.record_count,
        file_size_in_bytes=meta.file_size_in_bytes,
        column_sizes=dict(meta.column_sizes),
        value_counts=dict(meta.value_counts),
        null_value_counts=dict(meta.null_value_counts),
        nan_value_counts=dict(meta.nan_value_counts),
        lower_bounds=dict(meta.lower_bounds),
        upper_bounds=dict(meta.upper_bounds),
        key_metadata=None,
        split_offsets=list(meta.split_offsets) or None,
        equality_ids=list(meta.equality_ids) if meta.equality_ids is not None else None,
        sort_order_id=meta.sort_order_id,
        spec_id=meta.spec_id,
    )


def to_meta(data_file: DataFile) -> DataFileMeta:
    return DataFileMeta(
        content=FileContent(int(data_file.content)),
        path=data_file.file_path,
        file_format=str(data_file.file_format.value),
        spec_id=data_file.spec_id,
        partition=tuple(data_file.partition),  # type: ignore[arg-type]  # Record is iterable
        record_count=data_file.record_count,
        file_size_in_bytes=data_file.file_size_in_bytes,
        column_sizes=data_file.column_sizes or {},
        value_counts=data_file.value_counts or {},
        null_value_counts=data_file.null_value_counts or {},
        nan_value_counts=data_file.nan_value_counts or {},
        lower_bounds=data_file.lower_bounds or {},
        upper_bounds=data_file.upper_bounds or {},
        split_offsets=tuple(data_file.split_offsets or []),
        equality_ids=tuple(data_file.equality_ids or []) or None,
        sort_order_id=data_file.sort_order_id,
    )


def _spec_data_file_type(partition_type: StructType, format_version: TableVersion) -> Schema:
    """The manifest entry schema with ``equality_ids`` as ``list<int>``.

    PyIceberg 0.12 declares it ``list<long>``; the Iceberg spec (field 135, element 136) says int,
    and Iceberg Java fails to read equality delete entries written as longs.
    """
    data_file = data_file_with_partition(partition_type=partition_type, format_version=format_version)
    fields = [
        NestedField(
            field_id=135,
            name="equality_ids",
            field_type=ListType(element_id=136, element_type=IntegerType(), element_required=True),
            required=False,
            doc=f.doc,
        )
        if f.field_id == 135
        else f
        for f in data_file.fields
    ]
    return manifest_entry_schema_with_data_file(format_version=format_version, data_file=StructType(*fields))


class _ManifestWriterV2(ManifestWriterV2):
    """PyIceberg 0.12's v2 manifest writer with the spec's ``equality_ids`` type."""

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        partition_type = self._spec.partition_type(self._schema)
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=_spec_data_file_type(partition_type, 2),
            record_schema=_spec_data_file_type(partition_type, 2),
            schema_name="manifest_entry",
            metadata=self._meta,
        )


class _DeleteManifestWriterV2(_ManifestWriterV2):
    """The v2 manifest writer, for delete files (content=deletes)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


@attrs.frozen
class StagedManifest:
    """A manifest written before its commit: entries carry no snapshot id or sequence numbers."""

    path: str
    length: int
    spec_id: int
    content: int  # 0 data, 1 deletes

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "length": self.length, "spec_id": self.spec_id, "content": self.content}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> StagedManifest:
        return cls(path=obj["path"], length=obj["length"], spec_id=obj["spec_id"], content=obj["content"])


def write_staged_manifest(
    io: FileIO,
    path: str,
    spec: PartitionSpec,
    schema: Schema,
    files: Sequence[DataFileMeta],
    deletes: bool,
) -> StagedManifest:
    """Write ``files`` as a v2 manifest whose entries inherit snapshot id and sequence numbers.

    Staged manifests are private to the sink (read back by the committer), so they are always v2,
    whatever the table's format version.
    """
    writer_cls = _DeleteManifestWriterV2 if deletes else _ManifestWriterV2
    writer = writer_cls(spec, schema, io.new_output(path), snapshot_id=-1, avro_compression="deflate")
    with writer:
        for meta in files:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=None,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=to_data_file(meta, 2),
                )
            )
    manifest = writer.to_manifest_file()
    return StagedManifest(path=path, length=manifest.manifest_length, spec_id=spec.spec_id, content=1 if deletes else 0)


def read_staged_manifest(io: FileIO, staged: StagedManifest) -> list[DataFileMeta]:
    manifest = ManifestFile.from_args(
        manifest_path=staged.path,
        manifest_length=staged.length,
        partition_spec_id=staged.spec_id,
        content=ManifestContent(staged.content),
        sequence_number=0,
        min_sequence_number=0,
        added_snapshot_id=0,
    )
    return [to_meta(e.data_file) for e in manifest.fetch_manifest_entry(io, discard_deleted=True)]


# ---------------------------------------------------------------------------------------------
# Committing a snapshot.


@attrs.frozen
class SnapshotChanges:
    """The files one snapshot adds, grouped by content."""

    data_files: tuple[DataFileMeta, ...] = ()
    delete_files: tuple[DataFileMeta, ...] = ()

    @property
    def operation(self) -> Operation:
        if self.delete_files and self.data_files:
            return Operation.OVERWRITE
        if self.delete_files:
            return Operation.DELETE
        return Operation.APPEND


def branch_head(table: Table, branch: str) -> Snapshot | None:
    """The snapshot a new commit to ``branch`` builds on (main's head for a branch not yet created)."""
    metadata = table.metadata
    if branch in metadata.refs:
        return metadata.snapshot_by_id(metadata.refs[branch].snapshot_id)
    return metadata.current_snapshot()


def _has_live_files(manifest: ManifestFile) -> bool:
    """Whether a carried-over manifest still lists live files. One holding only deleted entries
    (left by a rewrite) is dropped from the next snapshot, as Iceberg Java does."""
    if manifest.added_files_count is None or manifest.existing_files_count is None:
        return True
    return manifest.added_files_count + manifest.existing_files_count > 0


def _new_manifest_path(table: Table, commit_uuid: str, n: int) -> str:
    return table.location_provider().new_metadata_location(f"{commit_uuid}-m{n}.avro")


def _write_manifests(
    table: Table,
    io: FileIO,
    snapshot_id: int,
    commit_uuid: str,
    files: Iterable[DataFileMeta],
    deletes: bool,
    written: list[str],
) -> list[ManifestFile]:
    metadata = table.metadata
    by_spec: dict[int, list[DataFileMeta]] = {}
    for meta in files:
        by_spec.setdefault(meta.spec_id, []).append(meta)
    result = []
    for spec_id, metas in sorted(by_spec.items()):
        path = _new_manifest_path(table, commit_uuid, len(written))
        written.append(path)
        spec = metadata.specs()[spec_id]
        writer: ManifestWriter
        if deletes:
            writer = _DeleteManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
        else:
            writer = (
                _ManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
                if metadata.format_version == 2
                else write_manifest(1, spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
            )
        with writer:
            for meta in metas:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=None,
                        data_file=to_data_file(meta, metadata.format_version),
                    )
                )
        result.append(writer.to_manifest_file())
    return result


@attrs.frozen
class PreparedCommit:
    """A snapshot ready to commit, with the files written for it (deleted if it never lands)."""

    snapshot: Snapshot
    updates: tuple[Any, ...]
    requirements: tuple[Any, ...]
    written_files: tuple[str, ...]


def _finish(
    table: Table,
    io: FileIO,
    branch: str,
    parent: Snapshot | None,
    snapshot_id: int,
    commit_uuid: str,
    manifests: list[ManifestFile],
    summary: Summary,
    written: list[str],
) -> PreparedCommit:
    """Write the manifest list and build the snapshot, ref update and the commit's requirements: the
    table is the same one and the branch head is still ``parent`` (compare-and-swap)."""
    metadata = table.metadata
    sequence_number = metadata.next_sequence_number()
    manifest_list = table.location_provider().new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    written.append(manifest_list)
    parent_id = parent.snapshot_id if parent is not None else None
    with write_manifest_list(
        format_version=metadata.format_version,
        output_file=io.new_output(manifest_list),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        avro_compression="deflate",
    ) as list_writer:
        list_writer.add_manifests(manifests)
    snapshot = Snapshot(  # type: ignore[call-arg]  # pydantic aliases
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    current_ref = metadata.refs.get(branch)
    updates = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(  # type: ignore[call-arg]
            snapshot_id=snapshot_id, parent_snapshot_id=parent_id, ref_name=branch, type=SnapshotRefType.BRANCH
        ),
    )
    requirements = (
        AssertTableUUID(uuid=metadata.table_uuid),
        AssertRefSnapshotId(ref=branch, snapshot_id=current_ref.snapshot_id if current_ref else None),  # type: ignore[call-arg]
    )
    return PreparedCommit(snapshot=snapshot, updates=updates, requirements=requirements, written_files=tuple(written))


def prepare_commit(
    table: Table,
    io: FileIO,
    branch: str,
    changes: SnapshotChanges,
    snapshot_properties: Mapping[str, str],
) -> PreparedCommit:
    """Write the manifests and manifest list of one snapshot on top of ``branch``'s head."""
    metadata = table.metadata
    if metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise ValueError(f"format version {metadata.format_version} is not supported")
    parent = branch_head(table, branch)
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4().hex
    written: list[str] = []
    new_manifests = _write_manifests(table, io, snapshot_id, commit_uuid, changes.data_files, False, written)
    new_manifests += _write_manifests(table, io, snapshot_id, commit_uuid, changes.delete_files, True, written)
    existing = [m for m in parent.manifests(io) if _has_live_files(m)] if parent is not None else []
    collector = SnapshotSummaryCollector()
    schema = metadata.schema()
    specs = metadata.specs()
    for meta in (*changes.data_files, *changes.delete_files):
        collector.add_file(
            to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
        )
    summary = update_snapshot_summaries(
        Summary(operation=changes.operation, **collector.build(), **snapshot_properties),
        previous_summary=parent.summary if parent is not None else None,
    )
    return _finish(table, io, branch, parent, snapshot_id, commit_uuid, new_manifests + existing, summary, written)


def commit_prepared(table: Table, prepared: PreparedCommit) -> Table:
    """Send one prepared snapshot to the catalog; returns the table as of the new metadata.

    Raises PyIceberg's CommitFailedException (another writer moved the branch: refresh and retry)
    or CommitStateUnknownException (may or may not have landed).
    """
    response = table.catalog.commit_table(table, prepared.requirements, prepared.updates)
    return Table(
        identifier=table.name(),
        metadata=response.metadata,
        metadata_location=response.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )


# ---------------------------------------------------------------------------------------------
# Reading live files with their sequence numbers, and committing rewrites.


@attrs.frozen
class LiveFile:
    """A live data or delete file of a snapshot, with the sequence numbers Iceberg assigned it."""

    meta: DataFileMeta
    data_sequence_number: int
    manifest_path: str


def live_files(table: Table, snapshot: Snapshot | None) -> tuple[list[LiveFile], list[LiveFile]]:
    """The live data files and delete files of ``snapshot``."""
    if snapshot is None:
        return [], []
    data: list[LiveFile] = []
    deletes: list[LiveFile] = []
    for manifest in snapshot.manifests(table.io):
        target = data if manifest.content == ManifestContent.DATA else deletes
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            target.append(LiveFile(to_meta(entry.data_file), int(entry.sequence_number or 0), manifest.manifest_path))
    return data, deletes


def _replace_summary(
    table: Table, parent: Snapshot | None, added: Sequence[DataFileMeta], removed: Sequence[DataFileMeta]
) -> Summary:
    """Summary of a ``replace`` snapshot (PyIceberg's summary update refuses that operation)."""
    metadata = table.metadata
    collector = SnapshotSummaryCollector()
    specs, schema = metadata.specs(), metadata.schema()
    for meta in added:
        collector.add_file(
            to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
        )
    for meta in removed:
        collector.remove_file(
            to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
        )
    props = collector.build()
    previous = dict(parent.summary.additional_properties) if parent is not None and parent.summary else {}

    def total(key: str, plus: str, minus: str) -> str:
        return str(int(previous.get(key, "0")) + int(props.get(plus, "0")) - int(props.get(minus, "0")))

    props.update(
        {
            "total-data-files": total("total-data-files", "added-data-files", "deleted-data-files"),
            "total-delete-files": total("total-delete-files", "added-delete-files", "removed-delete-files"),
            "total-records": total("total-records", "added-records", "deleted-records"),
            "total-files-size": total("total-files-size", "added-files-size", "removed-files-size"),
            "total-position-deletes": total(
                "total-position-deletes", "added-position-deletes", "removed-position-deletes"
            ),
            "total-equality-deletes": total(
                "total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"
            ),
        }
    )
    return Summary(operation=Operation.REPLACE, **props)


def prepare_rewrite(
    table: Table,
    io: FileIO,
    branch: str,
    added: Sequence[DataFileMeta],
    removed_paths: frozenset[str],
    data_sequence_number: int,
    snapshot_properties: Mapping[str, str],
) -> PreparedCommit:
    """A ``replace`` snapshot: ``removed_paths`` (data and delete files) out, ``added`` in.

    Added data files carry ``data_sequence_number`` (the sequence number of the snapshot the rewrite
    read), so equality deletes committed after that snapshot still apply to the rewritten rows.
    """
    metadata = table.metadata
    parent = branch_head(table, branch)
    if parent is None:
        raise ValueError("cannot rewrite files of a branch without snapshots")
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4().hex
    written: list[str] = []
    manifests: list[ManifestFile] = []
    removed: list[DataFileMeta] = []

    by_spec: dict[int, list[DataFileMeta]] = {}
    for meta in added:
        by_spec.setdefault(meta.spec_id, []).append(meta)
    for spec_id, metas in sorted(by_spec.items()):
        path = _new_manifest_path(table, commit_uuid, len(written))
        written.append(path)
        writer = _ManifestWriterV2(
            metadata.specs()[spec_id], metadata.schema(), io.new_output(path), snapshot_id, "deflate"
        )
        with writer:
            for meta in metas:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=data_sequence_number,
                        file_sequence_number=None,
                        data_file=to_data_file(meta, metadata.format_version),
                    )
                )
        manifests.append(writer.to_manifest_file())

    for manifest in parent.manifests(io):
        entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
        hits = [e for e in entries if e.data_file.file_path in removed_paths]
        if not hits:
            if _has_live_files(manifest):
                manifests.append(manifest)
            continue
        path = _new_manifest_path(table, commit_uuid, len(written))
        written.append(path)
        spec = metadata.specs()[manifest.partition_spec_id]
        rewritten: ManifestWriter = (
            _DeleteManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
            if manifest.content == ManifestContent.DELETES
            else _ManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
        )
        with rewritten:
            for entry in entries:
                if entry.data_file.file_path in removed_paths:
                    rewritten.delete(entry)
                    removed.append(to_meta(entry.data_file))
                else:
                    rewritten.existing(entry)
        manifests.append(rewritten.to_manifest_file())

    summary = _replace_summary(table, parent, added, removed)
    summary = Summary(operation=summary.operation, **{**summary.additional_properties, **snapshot_properties})
    return _finish(table, io, branch, parent, snapshot_id, commit_uuid, manifests, summary, written)


def prepare_manifest_rewrite(
    table: Table, io: FileIO, branch: str, entries_per_manifest: int, snapshot_properties: Mapping[str, str]
) -> PreparedCommit | None:
    """A ``replace`` snapshot that only regroups the branch's live entries into fewer manifests.

    Entries keep their status-independent identity (snapshot id, data and file sequence numbers) as
    ``EXISTING``; no file is added or removed. None when there is nothing to merge.
    """
    metadata = table.metadata
    parent = branch_head(table, branch)
    if parent is None:
        return None
    old = parent.manifests(io)
    groups: dict[tuple[int, int], list[ManifestEntry]] = {}
    for manifest in old:
        key = (int(manifest.content), manifest.partition_spec_id)
        groups.setdefault(key, []).extend(manifest.fetch_manifest_entry(io, discard_deleted=True))
    planned = sum(max(1, -(-len(e) // entries_per_manifest)) for e in groups.values() if e)
    if planned >= len(old):
        return None
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4().hex
    written: list[str] = []
    manifests: list[ManifestFile] = []
    for (content, spec_id), entries in sorted(groups.items()):
        for start in range(0, len(entries), entries_per_manifest):
            path = _new_manifest_path(table, commit_uuid, len(written))
            written.append(path)
            spec = metadata.specs()[spec_id]
            cls = _DeleteManifestWriterV2 if content == int(ManifestContent.DELETES) else _ManifestWriterV2
            writer: ManifestWriter = (
                cls(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
                if metadata.format_version >= 2
                else write_manifest(1, spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
            )
            with writer:
                for entry in entries[start : start + entries_per_manifest]:
                    writer.existing(entry)
            manifests.append(writer.to_manifest_file())
    previous = dict(parent.summary.additional_properties) if parent.summary else {}
    totals = {k: v for k, v in previous.items() if k.startswith("total-")}
    summary = Summary(
        operation=Operation.REPLACE,
        **totals,
        **{"manifests-created": str(len(manifests)), "manifests-replaced": str(len(old))},
        **snapshot_properties,
    )
    return _finish(table, io, branch, parent, snapshot_id, commit_uuid, manifests, summary, written)


def reachable_files(table: Table) -> set[str]:
    """Every file the table's metadata references: metadata files, manifest lists, manifests, data
    and delete files of every snapshot, statistics files."""
    metadata = table.metadata
    io = table.io
    result = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    result.update(s.statistics_path for s in metadata.statistics)
    seen_manifests: set[str] = set()
    for snapshot in metadata.snapshots:
        result.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            result.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                result.add(entry.data_file.file_path)
    return result


def staged_manifest_files(io: FileIO, path: str) -> list[str]:
    """The data and delete files a staged (not yet committed) manifest lists."""
    return [meta.path for meta in read_staged_manifest(io, StagedManifest(path=path, length=0, spec_id=0, content=0))]
