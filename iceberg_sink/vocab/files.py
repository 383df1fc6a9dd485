"""File values every layer speaks: the content kinds of Iceberg's files and one written file as a
manifest describes it (Iceberg Java's ``FileContent`` and ``DataFile``, in its ``api`` module)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import attrs

from iceberg_sink import _codec


class FileContent(IntEnum):
    """Iceberg's content type of a file (spec: data_file.content)."""

    DATA = 0
    POSITION_DELETES = 1
    EQUALITY_DELETES = 2


def _int_tuple(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value or ())


def _int_map(value: Any) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((int(k), int(v)) for k, v in dict(value or {}).items()))


def _bytes_map(value: Any) -> tuple[tuple[int, bytes], ...]:
    return tuple(sorted((int(k), bytes(v)) for k, v in dict(value or {}).items()))


@attrs.frozen
class DataFileMeta:
    """One written file as Iceberg's manifest will describe it.

    Metric maps are sorted tuples of (field id, value) so the value is hashable and immutable.
    ``partition`` holds Iceberg's internal representation of each partition field (ints for dates,
    times and bucket numbers, strings, bytes, Decimals).
    """

    content: FileContent
    path: str
    spec_id: int
    partition: tuple[Any, ...]
    record_count: int
    file_size_in_bytes: int
    column_sizes: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_int_map)
    value_counts: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_int_map)
    null_value_counts: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_int_map)
    nan_value_counts: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_int_map)
    lower_bounds: tuple[tuple[int, bytes], ...] = attrs.field(default=(), converter=_bytes_map)
    upper_bounds: tuple[tuple[int, bytes], ...] = attrs.field(default=(), converter=_bytes_map)
    split_offsets: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    equality_ids: tuple[int, ...] | None = None
    sort_order_id: int | None = None
    file_format: str = "PARQUET"
    referenced_data_file: str | None = None
    content_offset: int | None = None
    content_size_in_bytes: int | None = None
    """A deletion vector's (format v3, ``file_format`` PUFFIN) data file and blob within the file."""

    @property
    def is_dv(self) -> bool:
        """Whether this is a deletion vector: a Puffin position delete (Iceberg Java's
        ``ContentFileUtil.isDV``). The one test for it; ``_iceberg/live_vectors.is_deletion_vector`` is
        the same rule on a manifest entry's record."""
        return self.content == FileContent.POSITION_DELETES and self.file_format.upper() == "PUFFIN"

    def to_json(self) -> dict[str, Any]:
        return {
            "content": int(self.content),
            "path": self.path,
            "format": self.file_format,
            "spec_id": self.spec_id,
            "partition": [_codec.encode_value(v) for v in self.partition],
            "record_count": self.record_count,
            "file_size_in_bytes": self.file_size_in_bytes,
            "column_sizes": self.column_sizes,
            "value_counts": self.value_counts,
            "null_value_counts": self.null_value_counts,
            "nan_value_counts": self.nan_value_counts,
            "lower_bounds": [(k, _codec.encode_value(v)) for k, v in self.lower_bounds],
            "upper_bounds": [(k, _codec.encode_value(v)) for k, v in self.upper_bounds],
            "split_offsets": self.split_offsets,
            "equality_ids": self.equality_ids,
            "sort_order_id": self.sort_order_id,
            **(
                {
                    "referenced_data_file": self.referenced_data_file,
                    "content_offset": self.content_offset,
                    "content_size_in_bytes": self.content_size_in_bytes,
                }
                if self.referenced_data_file is not None
                else {}
            ),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DataFileMeta:
        return cls(
            content=FileContent(obj["content"]),
            path=obj["path"],
            file_format=obj["format"],
            spec_id=obj["spec_id"],
            partition=tuple(_codec.decode_value(v) for v in obj["partition"]),
            record_count=obj["record_count"],
            file_size_in_bytes=obj["file_size_in_bytes"],
            column_sizes=obj["column_sizes"],
            value_counts=obj["value_counts"],
            null_value_counts=obj["null_value_counts"],
            nan_value_counts=obj["nan_value_counts"],
            lower_bounds=[(k, _codec.decode_value(v)) for k, v in obj["lower_bounds"]],
            upper_bounds=[(k, _codec.decode_value(v)) for k, v in obj["upper_bounds"]],
            split_offsets=obj["split_offsets"],
            equality_ids=tuple(obj["equality_ids"]) if obj["equality_ids"] is not None else None,
            sort_order_id=obj["sort_order_id"],
            referenced_data_file=obj.get("referenced_data_file"),
            content_offset=obj.get("content_offset"),
            content_size_in_bytes=obj.get("content_size_in_bytes"),
        )
