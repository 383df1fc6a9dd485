"""Conversions between the sink's file values and PyIceberg's, partition paths, and a live file's
value (entries.py reads a snapshot's live files)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
)
from pyiceberg.partitioning import PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import (
    Snapshot,
)
from pyiceberg.typedef import Record

from iceberg_sink.vocab.files import DataFileMeta, FileContent

if TYPE_CHECKING:  # writer tasks import this module: pyiceberg.table and .io.pyarrow cost them ~0.4 s
    from pyiceberg.table import Table

logger = logging.getLogger(__name__)


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of ``schema`` with Iceberg field ids in each field's Parquet metadata."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(schema, include_field_ids=True)


def field_id(field: pa.Field) -> int | None:
    """The Iceberg field id an Arrow field carries in its Parquet metadata (None: none)."""
    value = (field.metadata or {}).get(b"PARQUET:field_id")
    return int(value) if value is not None else None


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
        # can add a path separator or climb out of the table's data folder, and each field is one
        # "name=value" segment; over-long ones are shortened (the exact value is in the manifest).
        path = self.spec.partition_to_path(Record(*self.values), self.schema)
        return "/".join(short_segment(segment) for segment in path.split("/"))


#: Longest partition folder name written as is. File systems refuse names over 255 bytes (and
#: URL-escaping triples non-ASCII text), so longer ones become a prefix and a hash.
MAX_SEGMENT_BYTES = 128
_HASH_CHARS = 32  # 128 bits of SHA-256


def short_segment(segment: str) -> str:
    """``segment`` if it is at most :data:`MAX_SEGMENT_BYTES` bytes, else a readable prefix of it,
    ``-`` and a hash of the whole segment: deterministic, and distinct for distinct segments.

    Readers never parse folder names (partition values come from manifests), so the folder only
    groups a partition's files.
    """
    if len(segment.encode()) <= MAX_SEGMENT_BYTES:
        return segment
    digest = hashlib.sha256(segment.encode()).hexdigest()[:_HASH_CHARS]
    # The escaped segment is ASCII; never cut inside a %XX escape.
    prefix = segment[: MAX_SEGMENT_BYTES - _HASH_CHARS - 1]
    cut = prefix.rfind("%", len(prefix) - 2)
    if cut != -1:
        prefix = prefix[:cut]
    return f"{prefix}-{digest}"


_V3_DV_FIELDS = 17  # position of referenced_data_file in a v3 data_file record (then offset, size)


def to_data_file(meta: DataFileMeta, format_version: int) -> DataFile:
    """``meta`` as PyIceberg's DataFile; a deletion vector (v3) as a v3-shaped record that carries its
    ``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes``."""
    data_file = _to_v2_data_file(meta)
    if meta.referenced_data_file is None:
        return data_file
    if format_version < 3:
        raise ValueError(f"deletion vector {meta.path} on a table of format version {format_version}")
    fields = [data_file[i] for i in range(len(data_file))]
    result = DataFile(*fields, None, meta.referenced_data_file, meta.content_offset, meta.content_size_in_bytes)
    result.spec_id = meta.spec_id
    return result


def _dv_fields(data_file: DataFile) -> dict[str, Any]:
    if len(data_file) <= _V3_DV_FIELDS or data_file[_V3_DV_FIELDS] is None:
        return {}
    return {
        "referenced_data_file": data_file[_V3_DV_FIELDS],
        "content_offset": data_file[_V3_DV_FIELDS + 1],
        "content_size_in_bytes": data_file[_V3_DV_FIELDS + 2],
    }


def _to_v2_data_file(meta: DataFileMeta) -> DataFile:
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
        **_dv_fields(data_file),
    )


def branch_head(table: Table, branch: str) -> Snapshot | None:
    """The snapshot a new commit to ``branch`` builds on (main's head for a branch not yet created)."""
    metadata = table.metadata
    if branch in metadata.refs:
        return metadata.snapshot_by_id(metadata.refs[branch].snapshot_id)
    return metadata.current_snapshot()


@attrs.frozen
class LiveFile:
    """A live data or delete file of a snapshot, with the sequence numbers Iceberg assigned it."""

    meta: DataFileMeta
    data_sequence_number: int
    manifest_path: str


def delete_quietly(io: FileIO, paths: Iterable[str]) -> None:
    """Best-effort delete of files no snapshot references (a failure leaves an orphan, never an error:
    remove-orphans cleans those up)."""
    for path in paths:
        try:
            io.delete(path)
        except Exception:
            logger.warning("could not delete unreferenced file %s", path)
