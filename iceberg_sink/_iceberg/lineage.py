"""Row lineage of format v3 tables: reading manifests with their first row ids, and the v3 manifest
list writer that assigns them (PyIceberg 0.12 has neither).

The spec (https://iceberg.apache.org/spec/#row-lineage) and Iceberg Java, which this module follows
step by step:

- a snapshot's ``first-row-id`` is the table's ``next-row-id`` when it is written
  (``SnapshotProducer``); its manifest list (``ManifestListWriter.V3Writer``) gives each *data*
  manifest that has no ``first_row_id`` the next free id and moves on by the manifest's existing
  plus added row counts (room for existing files without one, as a pre-v3 manifest's); manifests
  that have one, and delete manifests, are listed as they are;
- the snapshot's ``added-rows`` is what its manifest list assigned, and the table's ``next-row-id``
  advances by it (``TableMetadata.Builder.addSnapshot``; PyIceberg's ``AddSnapshotUpdate`` does the
  same);
- reading a data manifest (``ManifestReader.idAssigner``): every live entry whose data file has no
  ``first_row_id`` inherits the manifest's, advanced by the record counts of the entries before it
  that inherited; deleted entries take none. A manifest without a ``first_row_id`` (and every delete
  manifest) gives its files none, even one written in the file. A rewritten or merged manifest
  therefore writes the inherited ids out for its existing entries, keeping each row's id, while its
  new files inherit from the id its new manifest list assigns.

PyIceberg reads manifest lists and manifests with its v2 schemas, which drop ``first_row_id``
(fields 520 and 142): every manifest a v3 commit carries over or rewrites is read here instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyiceberg.avro.codecs import AVRO_CODEC_KEY
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestListWriterV1,
    ManifestListWriterV2,
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import TableVersion
from pyiceberg.types import LongType, NestedField

from iceberg_sink._iceberg.avro_read import CachedAvroFile, fetch_entries
from iceberg_sink._iceberg.avro_write import ReusingAvroOutputFile
from iceberg_sink._iceberg.manifests import (
    DATA_FILE_FIRST_ROW_ID,
    MANIFEST_FILE_FIRST_ROW_ID,
    as_v3_data_file,
    as_v3_manifest,
    data_file_first_row_id,
    manifest_first_row_id,
)
from iceberg_sink.errors import UnsupportedTableError

ROW_LINEAGE_FORMAT_VERSION = 3
"""The first format version with row lineage (Java's MIN_FORMAT_VERSION_ROW_LINEAGE)."""

ROW_ID = NestedField(2147483540, "_row_id", LongType(), required=False)
"""The reserved ``_row_id`` column (Java's ``MetadataColumns.ROW_ID``): written into data files only by
rewrites, which must keep each row's id; null (or absent) means the file's first row id plus the row's
position."""

LAST_UPDATED_SEQUENCE_NUMBER = NestedField(2147483539, "_last_updated_sequence_number", LongType(), required=False)
"""The reserved ``_last_updated_sequence_number`` column (Java's
``MetadataColumns.LAST_UPDATED_SEQUENCE_NUMBER``); null (or absent) means the file's data sequence
number."""


def with_lineage_columns(schema: Schema) -> Schema:
    """``schema`` plus the two row lineage columns, as a v3 rewrite reads and writes data files (Iceberg
    Java's Spark rewrite adds ``MetadataColumns.ROW_ID`` and ``LAST_UPDATED_SEQUENCE_NUMBER`` the same
    way).

    Raises:
        UnsupportedTableError: ``schema`` already has a column of one of those names.
    """
    names = {field.name for field in schema.fields}
    taken = names & {ROW_ID.name, LAST_UPDATED_SEQUENCE_NUMBER.name}
    if taken:
        raise UnsupportedTableError(
            f"table schema has column(s) {sorted(taken)}; expected none: format v3 reserves those names for row "
            "lineage, which a rewrite writes into the new files; rename the column(s) to compact this table"
        )
    return Schema(
        *schema.fields,
        ROW_ID,
        LAST_UPDATED_SEQUENCE_NUMBER,
        schema_id=schema.schema_id,
        identifier_field_ids=list(schema.identifier_field_ids),
    )


def first_row_ids(io: FileIO, snapshot: Snapshot, manifest_paths: set[str]) -> dict[str, int | None]:
    """Each live data file of the data manifests ``manifest_paths`` of v3 ``snapshot`` -> its first row
    id (inherited or written; None for a file of a manifest that has none, as after an upgrade from
    v2 until the next snapshot is written)."""
    result: dict[str, int | None] = {}
    for manifest in read_manifests(io, snapshot, ROW_LINEAGE_FORMAT_VERSION):
        if manifest.content != ManifestContent.DATA or manifest.manifest_path not in manifest_paths:
            continue
        for entry in read_entries(io, manifest):
            result[entry.data_file.file_path] = data_file_first_row_id(entry.data_file)
    return result


def table_next_row_id(metadata: TableMetadata) -> int:
    """The ``next-row-id`` of a v3 table: the ``first-row-id`` of its next snapshot.

    A v3 table created by PyIceberg holds None until its metadata is first written (the sink writes
    0, ``_iceberg/v3_metadata.py``); a table with snapshots and none has lost its lineage.
    """
    value = getattr(metadata, "next_row_id", None)
    if value is not None:
        return int(value)
    if metadata.snapshots:
        raise ValueError(
            f"format v{metadata.format_version} table has {len(metadata.snapshots)} snapshots but no next-row-id; "
            "expected one (the spec requires it)"
        )
    return 0


def read_manifests(io: FileIO, snapshot: Snapshot, format_version: int) -> list[ManifestFile]:
    """The manifests ``snapshot`` lists. For a v3 table, read with the v3 manifest-list schema, so
    each keeps its ``first_row_id``; earlier versions with the schema PyIceberg reads them with
    (``Snapshot.manifests``, which reads the list again on every call and resolves its reader for
    every file: here the reader is shared, ``_iceberg/avro_read.py``)."""
    version = 3 if format_version >= ROW_LINEAGE_FORMAT_VERSION else DEFAULT_READ_VERSION
    with CachedAvroFile[ManifestFile](
        io.new_input(snapshot.manifest_list),
        MANIFEST_LIST_FILE_SCHEMAS[version],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return list(reader)


def assign_first_row_ids(entries: Sequence[ManifestEntry], manifest: ManifestFile) -> None:
    """Give ``entries`` (all of ``manifest``'s, in file order, v3-shaped) the first row ids they
    inherit, in place: Iceberg Java's ``ManifestReader.idAssigner``. A committed data manifest
    without a first row id (written before the table became v3) gives its files none, whatever they
    carry; a manifest of the commit being made (no sequence number yet: a manifest it rewrote, read
    again to merge it) keeps the ids its entries carry, as Java's commit does."""
    first = manifest_first_row_id(manifest) if manifest.content == ManifestContent.DATA else None
    if first is None:
        if manifest.content == ManifestContent.DATA and manifest.sequence_number in (None, UNASSIGNED_SEQ):
            return  # explicit ids of existing files stay; new files get theirs from the manifest list
        for entry in entries:
            entry.data_file[DATA_FILE_FIRST_ROW_ID] = None
        return
    next_row_id = first
    for entry in entries:
        if entry.status == ManifestEntryStatus.DELETED:
            continue
        if data_file_first_row_id(entry.data_file) is None:
            entry.data_file[DATA_FILE_FIRST_ROW_ID] = next_row_id
            next_row_id += entry.data_file.record_count


def read_entries(
    io: FileIO, manifest: ManifestFile, discard_deleted: bool = True, format_version: int | None = None
) -> list[ManifestEntry]:
    """``manifest``'s entries with inherited snapshot ids, sequence numbers and (for a manifest read
    by :func:`read_manifests` from a v3 table) first row ids. A delete manifest of a table of
    ``format_version`` 3 is read with the v3 schema too, however its manifest list was read, so its
    deletion vectors keep ``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes``;
    other manifests read as PyIceberg does."""
    v3_deletes = (
        format_version is not None
        and format_version >= ROW_LINEAGE_FORMAT_VERSION
        and manifest.content == ManifestContent.DELETES
    )
    if len(manifest) <= MANIFEST_FILE_FIRST_ROW_ID and not v3_deletes:
        return fetch_entries(io, manifest, discard_deleted=discard_deleted)
    with CachedAvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        entries = [_inherit_from_manifest(entry, manifest) for entry in reader]
    for entry in entries:
        entry.data_file = as_v3_data_file(entry.data_file)
    assign_first_row_ids(entries, manifest)
    if discard_deleted:
        return [e for e in entries if e.status != ManifestEntryStatus.DELETED]
    return entries


class _Reusing:
    """Makes a manifest list writer open a :class:`ReusingAvroOutputFile` (records read as
    ``_record_version``'s schema: PyIceberg's v1/v2 writers take v2 records, the v3 one v3)."""

    _record_version: int = DEFAULT_READ_VERSION
    _output_file: OutputFile
    _format_version: TableVersion
    _meta: dict[str, str]
    _writer: Any

    def __enter__(self) -> Any:
        self._writer = ReusingAvroOutputFile[ManifestFile](
            output_file=self._output_file,
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[self._record_version],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[self._format_version],
            schema_name="manifest_file",
            metadata=self._meta,
        )
        self._writer.__enter__()
        return self


class ManifestListWriterV3(_Reusing, ManifestListWriter):
    """The format v3 manifest list: the v2 list's sequence-number rules plus ``first_row_id``
    (field 520), assigned as Iceberg Java's ``ManifestListWriter.V3Writer`` does (module doc).
    :attr:`next_row_id` is the table's next row id once every manifest was added."""

    _record_version = 3

    def __init__(
        self,
        output_file: OutputFile,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int,
        first_row_id: int,
    ) -> None:
        super().__init__(
            format_version=3,
            output_file=output_file,
            meta={
                "snapshot-id": str(snapshot_id),
                "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
                "sequence-number": str(sequence_number),
                "first-row-id": str(first_row_id),
                "format-version": "3",
                AVRO_CODEC_KEY: "deflate",
            },
        )
        self._commit_snapshot_id = snapshot_id
        self._sequence_number = sequence_number
        self.next_row_id = first_row_id

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        # A fresh record: PyIceberg's v2 writer mutates a shallow copy that shares its fields.
        prepared = as_v3_manifest(manifest_file, manifest_first_row_id(manifest_file))
        for position, value in ((4, prepared.sequence_number), (5, prepared.min_sequence_number)):
            if value == UNASSIGNED_SEQ:
                # Only a manifest written by this commit can lack its sequence numbers.
                if prepared.added_snapshot_id != self._commit_snapshot_id:
                    raise ValueError(
                        f"found unassigned sequence number for a manifest from snapshot {prepared.added_snapshot_id}; "
                        f"expected only manifests of snapshot {self._commit_snapshot_id}"
                    )
                prepared[position] = self._sequence_number
        if prepared.content == ManifestContent.DATA and manifest_first_row_id(prepared) is None:
            prepared[MANIFEST_FILE_FIRST_ROW_ID] = self.next_row_id
            # Room for existing rows too: files of a pre-v3 manifest have no first_row_id.
            self.next_row_id += (prepared.existing_rows_count or 0) + (prepared.added_rows_count or 0)
        return prepared


class _ManifestListWriterV1(_Reusing, ManifestListWriterV1):
    """PyIceberg's v1 manifest list writer (same bytes), its Avro writer reused."""


class _ManifestListWriterV2(_Reusing, ManifestListWriterV2):
    """PyIceberg's v2 manifest list writer (same bytes), its Avro writer reused."""


def new_manifest_list_writer(
    format_version: int,
    output_file: OutputFile,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int,
    first_row_id: int | None,
) -> ManifestListWriter:
    """The manifest list writer for a table of ``format_version`` (``first_row_id``: the table's
    ``next-row-id``, for v3)."""
    if format_version == 1:
        return _ManifestListWriterV1(output_file, snapshot_id, parent_snapshot_id, "deflate")
    if format_version == 2:
        return _ManifestListWriterV2(output_file, snapshot_id, parent_snapshot_id, sequence_number, "deflate")
    if format_version > ROW_LINEAGE_FORMAT_VERSION:
        raise ValueError(f"format version {format_version} is not supported (expected 1, 2 or 3)")
    if first_row_id is None:
        raise ValueError("a format v3 manifest list needs the table's next-row-id as its first-row-id")
    return ManifestListWriterV3(output_file, snapshot_id, parent_snapshot_id, sequence_number, first_row_id)


def snapshot_row_range(writer: ManifestListWriter, first_row_id: int | None) -> dict[str, Any]:
    """The ``first-row-id`` and ``added-rows`` of the snapshot whose manifest list ``writer`` wrote
    (nothing before v3)."""
    if not isinstance(writer, ManifestListWriterV3) or first_row_id is None:
        return {}
    return {"first_row_id": first_row_id, "added_rows": writer.next_row_id - first_row_id}
