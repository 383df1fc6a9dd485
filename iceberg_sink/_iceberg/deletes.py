"""The one rule for which delete file applies to which data file (Iceberg spec, "Scan Planning").

Used by everything that reasons about deletes: compaction planning, rewriting and removability.
A delete file applies to a data file when

- it is an *equality* delete with a strictly higher data sequence number than the data file, and
  either its partition spec is unpartitioned (a *global* delete: it applies to every partition of
  every spec) or it has the data file's spec id and partition;
- it is a *position* delete with a data sequence number at least the data file's, and the same spec
  id and partition; it then removes only rows of the file it names. A position delete file whose
  ``file_path`` bounds are equal names that one file only (file-scoped, as Java's
  ``ContentFileUtil.referencedDataFile`` reads it) and applies to no other. Position deletes are never
  global, even under an unpartitioned spec (the spec says so, and Iceberg Java's DeleteFileIndex
  only indexes equality deletes as global).

A spec is unpartitioned when it has no fields or only ``void`` ones (Iceberg Java's
``PartitionSpec.isUnpartitioned``: v1 tables keep dropped partition fields as ``void``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from typing import Any, cast

import attrs
from pyiceberg.conversions import to_bytes
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import VoidTransform
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink._iceberg.position_deletes import referenced_data_file
from iceberg_sink.vocab.files import DataFileMeta, FileContent


def _spec_ids(value: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in value)


@attrs.frozen
class DeleteRules:
    """Which delete files apply to which data files in one table.

    The only table fact the rule needs is which partition specs are unpartitioned, so this value is
    small and picklable: it travels to the Spark tasks that rewrite files.

    Attributes:
        unpartitioned_spec_ids: ids of the table's specs without (non-void) partition fields.
    """

    unpartitioned_spec_ids: frozenset[int] = attrs.field(converter=_spec_ids)

    @classmethod
    def from_specs(cls, specs: Mapping[int, PartitionSpec]) -> DeleteRules:
        """The rules of a table whose partition specs are ``specs`` (``table.specs()``)."""
        return cls(
            spec_id
            for spec_id, spec in specs.items()
            if all(isinstance(f.transform, VoidTransform) for f in spec.fields)
        )

    def is_global(self, delete: LiveFile) -> bool:
        """Whether ``delete`` applies to data files of every spec and partition."""
        return (
            delete.meta.content == FileContent.EQUALITY_DELETES and delete.meta.spec_id in self.unpartitioned_spec_ids
        )

    def applies(self, delete: LiveFile, data: LiveFile) -> bool:
        """Whether ``delete`` removes rows of ``data`` (see the module docstring)."""
        if delete.meta.content == FileContent.EQUALITY_DELETES:
            if delete.data_sequence_number <= data.data_sequence_number:
                return False
        elif delete.data_sequence_number < data.data_sequence_number:
            return False
        else:
            named = referenced_data_file(delete.meta)
            if named is not None and named != data.meta.path:
                return False
        if self.is_global(delete):
            return True
        return delete.meta.spec_id == data.meta.spec_id and delete.meta.partition == data.meta.partition


def _comparable(field_type: IcebergType, value: bytes) -> Any:
    """A Python value ordered as Iceberg orders ``value`` (a single-value bound), or None.

    Bounds of a file written before a type promotion keep the old width (an int bound of a column
    now long is 4 bytes, a float bound of a double column 4): widths are read from the bytes, so
    both sides compare after widening.
    """
    if isinstance(field_type, IntegerType | LongType | DateType | TimeType | TimestampType | TimestamptzType):
        return int.from_bytes(value, "little", signed=True)
    if isinstance(field_type, FloatType | DoubleType):
        number = struct.unpack("<f" if len(value) == 4 else "<d", value)[0]
        return None if math.isnan(number) else number
    if isinstance(field_type, DecimalType):
        return int.from_bytes(value, "big", signed=True)  # unscaled; promotion keeps the scale
    if isinstance(field_type, StringType | BinaryType | FixedType | UUIDType):
        return bytes(value)  # UTF-8 byte order is code point order; uuid bounds are big-endian
    return None


def keys_may_match(delete: DataFileMeta, data: DataFileMeta, schema: Schema) -> bool:
    """Whether the equality delete file ``delete`` may hold a key of a row of ``data``, by the
    column metrics of both (bounds of each key field, null counts). False only when some key field
    proves it: its non-null ranges do not overlap and nulls cannot match either (one side has none).
    Missing metrics, truncated bounds (still conservative) and unknown types never prune.
    """
    d_lower, d_upper = dict(delete.lower_bounds), dict(delete.upper_bounds)
    f_lower, f_upper = dict(data.lower_bounds), dict(data.upper_bounds)
    d_nulls, f_nulls = dict(delete.null_value_counts), dict(data.null_value_counts)
    d_values, f_values = dict(delete.value_counts), dict(data.value_counts)
    for field_id in delete.equality_ids or ():
        try:
            field_type = schema.find_field(field_id).field_type
        except ValueError:
            continue
        # Nulls of one side can match nulls of the other; unknown counts may hold nulls.
        nulls_may_match = d_nulls.get(field_id, 1) > 0 and f_nulls.get(field_id, 1) > 0
        if nulls_may_match:
            continue
        # Either side holding only nulls (its non-null range is empty) cannot match the other's values.
        if d_values.get(field_id) is not None and d_values[field_id] == d_nulls.get(field_id):
            return False
        if f_values.get(field_id) is not None and f_values[field_id] == f_nulls.get(field_id):
            return False
        bounds = (d_lower.get(field_id), d_upper.get(field_id), f_lower.get(field_id), f_upper.get(field_id))
        if any(b is None for b in bounds):
            continue
        values = [_comparable(field_type, cast(bytes, b)) for b in bounds]
        if any(v is None for v in values):
            continue
        low, high, data_low, data_high = values
        if high < data_low or data_high < low:
            return False
    return True


def bounds_may_hold(
    file: DataFileMeta, schema: Schema, keys: Iterable[tuple[Any, ...]], field_ids: tuple[int, ...]
) -> bool:
    """Whether the data or delete file ``file`` may hold a row whose fields ``field_ids`` equal one
    of ``keys`` (Python values of the fields' Iceberg types), by its column bounds. False only when
    every key has a field outside the file's ``[lower, upper]`` bounds of that field; a field without
    bounds or of a type with no order here never prunes (truncated bounds stay conservative)."""
    lower, upper = dict(file.lower_bounds), dict(file.upper_bounds)
    ranges: list[tuple[IcebergType, Any, Any] | None] = []
    for field_id in field_ids:
        low, high = lower.get(field_id), upper.get(field_id)
        try:
            field_type = schema.find_field(field_id).field_type
        except ValueError:
            ranges.append(None)
            continue
        if low is None or high is None:
            ranges.append(None)
            continue
        low_value, high_value = _comparable(field_type, low), _comparable(field_type, high)
        ranges.append(None if low_value is None or high_value is None else (field_type, low_value, high_value))
    for key in keys:
        inside = True
        for value, bound in zip(key, ranges, strict=True):
            if bound is None:
                continue
            field_type, low_value, high_value = bound
            if value is None:
                continue  # a null key: bounds say nothing about nulls
            try:
                encoded = _comparable(field_type, to_bytes(cast(PrimitiveType, field_type), value))
            except (TypeError, ValueError, AttributeError, struct.error):
                continue  # a value this type's encoder does not take (text for a number): no pruning
            if encoded is not None and not (low_value <= encoded <= high_value):
                inside = False
                break
        if inside:
            return True
    return False
