"""Manifest files: the writers (with the spec's ``equality_ids`` type), staged manifests of pending
checkpoints, and the files a table's metadata references."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import Any

import attrs
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record, TableVersion
from pyiceberg.types import FloatType, IntegerType, ListType, NestedField, StructType

from iceberg_sink._iceberg.avro_read import fetch_entries
from iceberg_sink._iceberg.avro_write import ReusingAvroOutputFile
from iceberg_sink._iceberg.files import to_data_file, to_meta
from iceberg_sink.vocab.files import DataFileMeta

# Entry schemas by (partition type as JSON, format version): built once per partition spec, not for
# every manifest (a routed checkpoint writes two or three manifests per table). Schemas are immutable.
_ENTRY_SCHEMAS: dict[tuple[str, int], Schema] = {}
_ENTRY_SCHEMAS_MAX = 256


def _spec_data_file_type(partition_type: StructType, format_version: TableVersion) -> Schema:
    """The manifest entry schema with ``equality_ids`` as ``list<int>``.

    PyIceberg 0.12 declares it ``list<long>``; the Iceberg spec (field 135, element 136) says int,
    and Iceberg Java fails to read equality delete entries written as longs.
    """
    key = (partition_type.model_dump_json(), int(format_version))
    schema = _ENTRY_SCHEMAS.get(key)
    if schema is None:
        schema = _entry_schema(partition_type, format_version)
        if len(_ENTRY_SCHEMAS) >= _ENTRY_SCHEMAS_MAX:
            _ENTRY_SCHEMAS.clear()
        _ENTRY_SCHEMAS[key] = schema
    return schema


def _entry_schema(partition_type: StructType, format_version: TableVersion) -> Schema:
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


BLOCK_ENTRIES = 100
"""Manifest entries per Avro block (Iceberg Java's writers cut blocks at ~64 KB, about as many)."""


class _BlockedAvroOutputFile(ReusingAvroOutputFile[ManifestEntry]):
    """An Avro output file that writes entries in blocks of up to :data:`BLOCK_ENTRIES`.

    PyIceberg 0.12's manifest writers write one block per entry, each compressed on its own: the
    manifests come out many times larger (a 2,000-entry manifest: 316 KB instead of 9 KB) and are
    slower to write and, for every reader, to read. Its writer and header schema are built once per
    entry schema (``_iceberg/avro_write.py``).
    """

    _pending: list[ManifestEntry]

    def __enter__(self) -> _BlockedAvroOutputFile:
        super().__enter__()
        self._pending = []
        return self

    def write_block(self, objects: list[ManifestEntry]) -> None:
        self._pending.extend(objects)
        if len(self._pending) >= BLOCK_ENTRIES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            super().write_block(self._pending)
            self._pending = []

    def __exit__(
        self, exctype: type[BaseException] | None, excinst: BaseException | None, exctb: TracebackType | None
    ) -> None:
        if exctype is None:
            self._flush()
        super().__exit__(exctype, excinst, exctb)


class _ManifestWriterV1(ManifestWriterV1):
    """PyIceberg 0.12's v1 manifest writer, writing blocks of many entries."""

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        return _BlockedAvroOutputFile(
            output_file=self._output_file,
            file_schema=self._with_partition(1),
            record_schema=self._with_partition(DEFAULT_READ_VERSION),
            schema_name="manifest_entry",
            metadata=self._meta,
        )


class _ManifestWriterV2(ManifestWriterV2):
    """PyIceberg 0.12's v2 manifest writer with the spec's ``equality_ids`` type, writing blocks of
    many entries."""

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        partition_type = self._spec.partition_type(self._schema)
        return _BlockedAvroOutputFile(
            output_file=self._output_file,
            file_schema=_spec_data_file_type(partition_type, 2),
            record_schema=_spec_data_file_type(partition_type, 2),
            schema_name="manifest_entry",
            metadata=self._meta,
        )


class _Deletes:
    """Makes a manifest writer (v2 or v3) one for delete files (content=deletes)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}  # type: ignore[misc]


class _DeleteManifestWriterV2(_Deletes, _ManifestWriterV2):
    """The v2 manifest writer, for delete files."""


V2_DATA_FILE_FIELDS = len(DATA_FILE_TYPE[2].fields)
V3_DATA_FILE_FIELDS = len(DATA_FILE_TYPE[3].fields)
DATA_FILE_FIRST_ROW_ID = 16
"""Position of ``first_row_id`` (field 142) in a v3 ``data_file`` record."""

V2_MANIFEST_FILE_FIELDS = len(MANIFEST_LIST_FILE_SCHEMAS[2].fields)
MANIFEST_FILE_FIRST_ROW_ID = 15
"""Position of ``first_row_id`` (field 520) in a v3 manifest-list record."""


def _fields(record: Record) -> list[Any]:
    return [record[i] for i in range(len(record))]


def as_v3_data_file(data_file: DataFile) -> DataFile:
    """``data_file`` as a record of the v3 ``data_file`` struct: a v2-shaped record (what PyIceberg
    builds and reads) gets ``first_row_id``, ``referenced_data_file``, ``content_offset`` and
    ``content_size_in_bytes`` as null; a v3-shaped one is returned as is."""
    if len(data_file) == V3_DATA_FILE_FIELDS:
        return data_file
    if len(data_file) != V2_DATA_FILE_FIELDS:
        raise ValueError(
            f"a data_file record has {len(data_file)} fields; expected {V2_DATA_FILE_FIELDS} or {V3_DATA_FILE_FIELDS}"
        )
    result = DataFile(*_fields(data_file), None, None, None, None)
    if "_spec_id" in vars(data_file):  # set when read from a manifest (never written to one)
        result.spec_id = data_file.spec_id
    return result


def data_file_first_row_id(data_file: DataFile) -> int | None:
    """A data file's ``first_row_id`` (None when unassigned, or the record is not v3-shaped)."""
    return data_file[DATA_FILE_FIRST_ROW_ID] if len(data_file) == V3_DATA_FILE_FIELDS else None


def manifest_first_row_id(manifest: ManifestFile) -> int | None:
    """A manifest's ``first_row_id`` from its manifest list (None when unassigned, or the record was
    read with PyIceberg's v2 manifest-list schema, which drops it)."""
    return manifest[MANIFEST_FILE_FIRST_ROW_ID] if len(manifest) > MANIFEST_FILE_FIRST_ROW_ID else None


def as_v3_manifest(manifest: ManifestFile, first_row_id: int | None) -> ManifestFile:
    """A new v3-shaped manifest-list record: ``manifest``'s fields and ``first_row_id``."""
    return ManifestFile(*_fields(manifest)[:V2_MANIFEST_FILE_FIELDS], first_row_id)


class _ManifestWriterV3(_ManifestWriterV2):
    """The format v3 manifest writer (PyIceberg 0.12 has none): the v2 writer's rules, and the v3
    ``data_file`` struct (fields 142-145). An entry keeps the ``first_row_id`` its data file carries:
    a new file has none (it inherits one from the manifest's, assigned by the manifest list), a
    carried-over file read through :func:`iceberg_sink._iceberg.lineage.read_entries` has its
    inherited one written out, as Iceberg Java's ``ManifestWriter.V3Writer`` does."""

    @property
    def version(self) -> TableVersion:
        return 3

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        partition_type = self._spec.partition_type(self._schema)
        return _BlockedAvroOutputFile(
            output_file=self._output_file,
            file_schema=_spec_data_file_type(partition_type, 3),
            record_schema=_spec_data_file_type(partition_type, 3),
            schema_name="manifest_entry",
            metadata=self._meta,
        )

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        entry = super().prepare_entry(entry)
        entry.data_file = as_v3_data_file(entry.data_file)
        return entry

    def to_manifest_file(self) -> ManifestFile:
        # No first_row_id yet: the manifest list assigns it (ManifestListWriter.V3Writer).
        return as_v3_manifest(super().to_manifest_file(), None)


class _DeleteManifestWriterV3(_Deletes, _ManifestWriterV3):
    """The v3 manifest writer, for delete files."""


def new_manifest_writer(
    format_version: int,
    content: ManifestContent,
    spec: PartitionSpec,
    schema: Schema,
    output: OutputFile,
    snapshot_id: int,
) -> ManifestWriter:
    """The manifest writer for a table of ``format_version``: the one place that dispatches on it.

    Format version 1 has no delete files and no sequence numbers; asking for a v1 delete manifest is
    a bug in the caller (the sink refuses upserts into v1 tables before writing anything). A v3
    delete manifest only ever rewrites delete entries already in the table (manifest merging); the
    sink adds no delete file to a v3 table yet.
    """
    if format_version == 1:
        if content == ManifestContent.DELETES:
            raise ValueError("format version 1 tables cannot hold delete files")
        return _ManifestWriterV1(spec, schema, output, snapshot_id, "deflate")
    if format_version == 2:
        cls = _DeleteManifestWriterV2 if content == ManifestContent.DELETES else _ManifestWriterV2
        return cls(spec, schema, output, snapshot_id, "deflate")
    if format_version == 3:
        v3 = _DeleteManifestWriterV3 if content == ManifestContent.DELETES else _ManifestWriterV3
        return v3(spec, schema, output, snapshot_id, "deflate")
    raise ValueError(f"format version {format_version} is not supported (expected 1, 2 or 3)")


@attrs.frozen
class StagedManifest:
    """A manifest written before its commit: entries carry no snapshot id or sequence numbers.

    ``files``: what its entries hold, as a read of it returns them, kept by the object that
    :func:`write_staged_manifest` returned (never stored: a committable read back from the
    checkpoint location, after a failure or restart, reads the manifest itself).
    """

    path: str
    length: int
    spec_id: int
    content: int  # 0 data, 1 deletes
    files: tuple[DataFileMeta, ...] | None = attrs.field(default=None, eq=False, repr=False)

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
    whatever the table's format version. The returned object keeps what the entries hold (as a
    read returns it: the fields a v2 manifest keeps), so committing the committable just staged
    reads nothing back; not for a float partition value, which the manifest stores in single
    precision (a read gives another number).
    """
    writer_cls = _DeleteManifestWriterV2 if deletes else _ManifestWriterV2
    writer = writer_cls(spec, schema, io.new_output(path), snapshot_id=-1, avro_compression="deflate")
    data_files = [to_data_file(meta, 2) for meta in files]
    for data_file in data_files:
        data_file.spec_id = spec.spec_id  # what a read gives each entry (the staged manifest's spec)
    with writer:
        for data_file in data_files:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=None,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=data_file,
                )
            )
    manifest = writer.to_manifest_file()
    exact = not any(isinstance(f.field_type, FloatType) for f in spec.partition_type(schema).fields)
    return StagedManifest(
        path=path,
        length=manifest.manifest_length,
        spec_id=spec.spec_id,
        content=1 if deletes else 0,
        files=tuple(to_meta(data_file) for data_file in data_files) if exact else None,
    )


def read_staged_manifest(io: FileIO, staged: StagedManifest) -> list[DataFileMeta]:
    """The files ``staged`` lists: as kept by the object that wrote it, else read from the file."""
    if staged.files is not None:
        return list(staged.files)
    manifest = ManifestFile.from_args(
        manifest_path=staged.path,
        manifest_length=staged.length,
        partition_spec_id=staged.spec_id,
        content=ManifestContent(staged.content),
        sequence_number=0,
        min_sequence_number=0,
        added_snapshot_id=0,
    )
    return [to_meta(e.data_file) for e in fetch_entries(io, manifest, discard_deleted=True)]


def has_live_files(manifest: ManifestFile) -> bool:
    """Whether a carried-over manifest still lists live files. One holding only deleted entries
    (left by a rewrite) is dropped from the next snapshot, as Iceberg Java does."""
    if manifest.added_files_count is None or manifest.existing_files_count is None:
        return True
    return manifest.added_files_count + manifest.existing_files_count > 0


def reachable_files(table: Table, without: Collection[int] = ()) -> set[str]:
    """Every file the table's metadata references: metadata files, manifest lists, manifests, data
    and delete files of every snapshot, statistics files. ``without``: snapshot ids to leave out
    (what an expiry of them would leave reachable)."""
    metadata = table.metadata
    io = table.io
    result = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    result.update(s.statistics_path for s in metadata.statistics if s.snapshot_id not in without)
    seen_manifests: set[str] = set()
    for snapshot in metadata.snapshots:
        if snapshot.snapshot_id in without:
            continue
        result.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            result.add(manifest.manifest_path)
            for entry in fetch_entries(io, manifest, discard_deleted=False):
                result.add(entry.data_file.file_path)
    return result


def expiry_cleanup(
    io: FileIO, before: TableMetadata, after: TableMetadata | None = None, expired_ids: Collection[int] = ()
) -> set[str]:
    """The files an expiry that took ``before`` to ``after`` (or, for a dry run, that would expire
    ``expired_ids`` of ``before``) leaves unreferenced, as Iceberg Java's
    ``ReachableFileCleanup`` finds them (``ExpireSnapshots`` with file cleanup):

    - the manifest lists of the snapshots ``after`` no longer holds;
    - the manifests those snapshots listed that no remaining snapshot lists;
    - the data and delete files live (added or existing) in those manifests that no manifest of a
      remaining snapshot lists as live. A file a remaining snapshot only lists as deleted (a
      compaction's replaced files) is not kept by it: reading that snapshot never needs it;
    - statistics files only the expired snapshots had.

    Metadata files are not included (they are the table's history log, removed by
    ``write.metadata.delete-after-commit.enabled``).
    """
    if after is not None:
        remaining = list(after.snapshots)
        kept_statistics = {s.statistics_path for s in after.statistics}
    else:
        remaining = [s for s in before.snapshots if s.snapshot_id not in expired_ids]
        kept_statistics = {s.statistics_path for s in before.statistics if s.snapshot_id not in expired_ids}
    kept_ids = {s.snapshot_id for s in remaining}
    expired = [s for s in before.snapshots if s.snapshot_id not in kept_ids]
    result = {s.manifest_list for s in expired}
    candidates: dict[str, ManifestFile] = {}
    for snapshot in expired:
        for manifest in snapshot.manifests(io):
            candidates.setdefault(manifest.manifest_path, manifest)
    current: dict[str, ManifestFile] = {}
    for snapshot in remaining:
        for manifest in snapshot.manifests(io):
            current.setdefault(manifest.manifest_path, manifest)
    to_delete = [m for path, m in candidates.items() if path not in current]
    result.update(m.manifest_path for m in to_delete)
    files = {e.data_file.file_path for m in to_delete for e in fetch_entries(io, m, discard_deleted=True)}
    if files:
        for manifest in current.values():
            files.difference_update(e.data_file.file_path for e in fetch_entries(io, manifest, discard_deleted=True))
    result.update(files)
    result.update(s.statistics_path for s in before.statistics if s.statistics_path not in kept_statistics)
    return result


def staged_manifest_files(io: FileIO, path: str) -> list[str]:
    """The data and delete files a staged (not yet committed) manifest lists."""
    return [meta.path for meta in read_staged_manifest(io, StagedManifest(path=path, length=0, spec_id=0, content=0))]
