"""Iceberg column metrics of the Parquet files the sink writes.

Counts, sizes and split offsets come from the Parquet footer. Lower/upper bounds and NaN counts do
not: Arrow leaves min/max out of a row group's statistics when a value is longer than its
statistics size limit, and a footer-based aggregate over the remaining row groups would then be
narrower than the data (readers would prune a file holding matching rows, and the new-key proof
would skip a needed equality delete). :class:`ColumnValueStats` therefore sees every batch as it is
written and keeps the exact min/max of each primitive column, which are truncated and serialized
the way Iceberg Java's ``ParquetMetrics`` does when the file is closed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    MetricsMode,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    match_metrics_mode,
    parquet_path_to_id_mapping,
)
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

# Java's UnicodeUtil skips the surrogate range when incrementing a code point: a surrogate is not
# a Unicode scalar value and has no valid UTF-8 encoding.
_MIN_SURROGATE = 0xD800
_MAX_SURROGATE = 0xDFFF
_MAX_CODE_POINT = 0x10FFFF


def parquet_metrics(metadata: pq.FileMetaData, schema: Schema, properties: Mapping[str, str]) -> dict[str, Any]:
    """Counts, column sizes and split offsets from a written Parquet footer (``write.metadata.metrics.*``).

    Bounds are not taken from the footer (see the module docstring; PyIceberg's truncation can also
    produce a surrogate, which does not encode): every column that would get them is read in
    ``counts`` mode here, and :class:`ColumnValueStats` provides them.
    """
    counts = MetricsMode(MetricModeTypes.COUNTS)
    plan = {
        field_id: collector if collector.mode.type == MetricModeTypes.NONE else replace(collector, mode=counts)
        for field_id, collector in compute_statistics_plan(schema, dict(properties)).items()
    }
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=plan,
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    result = stats.to_serialized_dict()
    result.pop("lower_bounds", None)
    result.pop("upper_bounds", None)
    return result


def truncate_string_min(value: str, length: int) -> str:
    """A lower bound of ``value`` at most ``length`` code points long (a prefix)."""
    return value[:length]


def truncate_string_max(value: str, length: int) -> str | None:
    """An upper bound of ``value`` at most ``length`` code points long, or None if there is none.

    As Iceberg Java's ``UnicodeUtil.truncateStringMax``: keep ``length`` code points, then increment
    the last one that can be incremented (U+D7FF becomes U+E000; U+10FFFF cannot be and is dropped)
    and drop everything after it, so the result stays valid UTF-8 and sorts above every string
    starting with the prefix.
    """
    if len(value) <= length:
        return value
    code_points = [ord(c) for c in value[:length]]
    for i in range(len(code_points) - 1, -1, -1):
        code_point = code_points[i]
        if code_point == _MAX_CODE_POINT:
            continue
        following = _MAX_SURROGATE + 1 if code_point == _MIN_SURROGATE - 1 else code_point + 1
        return "".join(map(chr, code_points[:i])) + chr(following)
    return None


def truncate_binary_min(value: bytes, length: int) -> bytes:
    """A lower bound of ``value`` at most ``length`` bytes long (a prefix)."""
    return value[:length]


def truncate_binary_max(value: bytes, length: int) -> bytes | None:
    """An upper bound of ``value`` at most ``length`` bytes long, or None if there is none.

    As Iceberg Java's ``BinaryUtil.truncateBinaryMax``: keep ``length`` bytes, increment the last byte
    that is not 0xFF and drop the bytes after it.
    """
    if len(value) <= length:
        return value
    prefix = value[:length]
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] != 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return None


@attrs.frozen
class _Leaf:
    """One primitive column whose values are tracked: where it is, and what to record for it."""

    path: tuple[str, ...]
    field_id: int
    field_type: PrimitiveType
    bounds: bool
    truncate: int | None  # for strings and binary under truncate(N); None keeps the full value


def _metrics_mode(name: str, properties: Mapping[str, str]) -> Any:
    default = properties.get(
        TableProperties.DEFAULT_WRITE_METRICS_MODE, TableProperties.DEFAULT_WRITE_METRICS_MODE_DEFAULT
    )
    column = properties.get(f"{TableProperties.METRICS_MODE_COLUMN_CONF_PREFIX}.{name}")
    return match_metrics_mode(column or default)


def _leaves(
    fields: tuple[NestedField, ...], prefix: tuple[str, ...], schema: Schema, properties: Mapping[str, str]
) -> Iterator[_Leaf]:
    for field in fields:
        path = (*prefix, field.name)
        if isinstance(field.field_type, StructType):
            yield from _leaves(field.field_type.fields, path, schema, properties)
        elif isinstance(field.field_type, ListType | MapType):
            # Iceberg Java records no bounds for repeated fields.
            continue
        elif isinstance(field.field_type, PrimitiveType):
            name = schema.find_column_name(field.field_id) or ".".join(path)
            mode = _metrics_mode(name, properties)
            if mode.type == MetricModeTypes.NONE:
                continue
            bounds = mode.type in (MetricModeTypes.TRUNCATE, MetricModeTypes.FULL)
            truncates = mode.type == MetricModeTypes.TRUNCATE and isinstance(field.field_type, StringType | BinaryType)
            yield _Leaf(path, field.field_id, field.field_type, bounds, mode.length if truncates else None)


def _leaf_array(batch: pa.RecordBatch, path: tuple[str, ...]) -> pa.Array:
    array: pa.Array = batch.column(path[0])
    for name in path[1:]:
        assert isinstance(array, pa.StructArray)
        # flatten() applies the struct's own nulls to its children: a field of a null struct is null.
        array = array.flatten()[array.type.get_field_index(name)]
    return array


def _comparable(array: pa.Array) -> pa.Array:
    """``array`` as values whose Arrow order is Iceberg's order and whose Python form is Iceberg's internal one."""
    if isinstance(array, pa.ExtensionArray):  # uuid: its 16 bytes, compared unsigned
        array = array.storage
    t = array.type
    if pa.types.is_date32(t):
        return array.cast(pa.int32())  # days since epoch
    if pa.types.is_time64(t) or pa.types.is_timestamp(t):
        return array.cast(pa.int64())  # microseconds (the table's Arrow schema has unit "us")
    return array


class ColumnValueStats:
    """Exact min/max and NaN counts per primitive column over every batch written to one file.

    Args:
        schema: the Iceberg schema of the file (its Arrow schema is ``schema_to_pyarrow(schema)``).
        properties: table properties; ``write.metadata.metrics.default`` and
            ``write.metadata.metrics.column.<name>`` choose none, counts, truncate(N) or full per column.
    """

    def __init__(self, schema: Schema, properties: Mapping[str, str]) -> None:
        self._leaves = tuple(_leaves(schema.as_struct().fields, (), schema, properties))
        self._min: dict[int, Any] = {}
        self._max: dict[int, Any] = {}
        self._nans: dict[int, int] = {}

    def update(self, table: pa.Table) -> None:
        """Fold the values of ``table`` (in the file's Arrow schema) into the running statistics."""
        # Batch by batch: combining a column's chunks would copy it, and a flush can be large.
        for batch in table.to_batches():
            self._update(batch)

    def _update(self, batch: pa.RecordBatch) -> None:
        for leaf in self._leaves:
            floating = isinstance(leaf.field_type, FloatType | DoubleType)
            if not leaf.bounds and not floating:
                continue
            array = _leaf_array(batch, leaf.path)
            if floating:
                self._nans[leaf.field_id] = self._nans.get(leaf.field_id, 0) + (pc.sum(pc.is_nan(array)).as_py() or 0)
            if not leaf.bounds:
                continue
            # min_max skips nulls and NaN; an all-NaN array gives NaN, which is no bound (Iceberg
            # keeps NaN out of bounds and counts it in nan_value_counts).
            extremes = pc.min_max(_comparable(array)).as_py()
            low, high = extremes["min"], extremes["max"]
            if low is None or (isinstance(low, float) and math.isnan(low)):
                continue
            current_min, current_max = self._min.get(leaf.field_id), self._max.get(leaf.field_id)
            self._min[leaf.field_id] = low if current_min is None else min(current_min, low)
            self._max[leaf.field_id] = high if current_max is None else max(current_max, high)

    def nan_value_counts(self) -> dict[int, int]:
        """NaN counts of float and double columns whose metrics mode is not ``none``."""
        return dict(self._nans)

    def lower_bounds(self) -> dict[int, bytes]:
        """Serialized lower bounds (Iceberg's single-value binary form) per field id."""
        result = {}
        for leaf in self._leaves:
            value = self._min.get(leaf.field_id)
            if value is None:
                continue
            if isinstance(value, float) and value == 0.0:
                # Bounds compare -0.0 below 0.0 (Java's Double.compare) while Arrow treats them as
                # equal: a zero minimum is written as -0.0 so that it bounds both (as Parquet does).
                value = -0.0
            elif leaf.truncate is not None:
                value = (truncate_string_min if isinstance(value, str) else truncate_binary_min)(value, leaf.truncate)
            result[leaf.field_id] = to_bytes(leaf.field_type, value)
        return result

    def upper_bounds(self) -> dict[int, bytes]:
        """Serialized upper bounds per field id; absent where a truncated value cannot be rounded up."""
        result = {}
        for leaf in self._leaves:
            value = self._max.get(leaf.field_id)
            if value is None:
                continue
            if isinstance(value, float) and value == 0.0:
                value = 0.0  # see lower_bounds: a zero maximum is +0.0
            elif leaf.truncate is not None:
                value = (truncate_string_max if isinstance(value, str) else truncate_binary_max)(value, leaf.truncate)
                if value is None:
                    continue
            result[leaf.field_id] = to_bytes(leaf.field_type, value)
        return result


def _footer_value(raw: Any, field_type: PrimitiveType, physical: str) -> Any:
    """A footer statistic (``min_raw``/``max_raw``) as Iceberg's internal value, or None if unsupported."""
    if isinstance(field_type, BooleanType) and physical == "BOOLEAN":
        return bool(raw)
    if isinstance(field_type, IntegerType | DateType) and physical == "INT32":
        return int(raw)
    if isinstance(field_type, LongType | TimestampType | TimestamptzType) and physical == "INT64":
        return int(raw)
    if isinstance(field_type, DecimalType) and physical in ("INT32", "INT64"):
        return Decimal(int(raw)).scaleb(-field_type.scale)
    if isinstance(field_type, StringType) and physical == "BYTE_ARRAY":
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(field_type, BinaryType) and physical == "BYTE_ARRAY":
        return bytes(raw)
    # Floating point (NaN and -0.0 are not provable from a footer), fixed-length decimals (the
    # footer's comparator is not checked here), and anything else: no bound.
    return None


def footer_metrics(metadata: pq.FileMetaData, schema: Schema, properties: Mapping[str, str]) -> dict[str, Any]:
    """Iceberg metrics of a Parquet file written by another writer (Spark's), from its footer only.

    Counts, sizes and split offsets as :func:`parquet_metrics`. Bounds only for top-level columns of
    types whose footer statistics are exact in Iceberg's order (booleans, ints, longs, dates,
    timestamps, INT32/INT64 decimals, strings, binary), and only when every row group with
    non-null values has them; strings and binary are truncated as Iceberg Java does. Float and
    double columns get no bounds and no NaN counts (absent metrics are safe: readers then read the
    file). A column whose null count is missing in any row group gets no null count.
    """
    result = parquet_metrics(metadata, schema, properties)
    leaves = {
        leaf.path[0]: leaf for leaf in _leaves(schema.as_struct().fields, (), schema, properties) if len(leaf.path) == 1
    }
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    null_counts = dict(result.get("null_value_counts") or {})
    columns = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for name, leaf in leaves.items():
        position = columns.get(name)
        if position is None:
            null_counts.pop(leaf.field_id, None)
            continue
        low: Any = None
        high: Any = None
        provable = leaf.bounds
        for r in range(metadata.num_row_groups):
            column = metadata.row_group(r).column(position)
            stats = column.statistics if column.is_stats_set else None
            if stats is None or not stats.has_null_count:
                null_counts.pop(leaf.field_id, None)
                provable = False
                break
            if not provable or stats.null_count == column.num_values:
                continue  # only nulls in this row group: it bounds nothing
            if not stats.has_min_max:
                provable = False
                continue
            lo = _footer_value(stats.min_raw, leaf.field_type, stats.physical_type)
            hi = _footer_value(stats.max_raw, leaf.field_type, stats.physical_type)
            if lo is None or hi is None:
                provable = False
                continue
            low = lo if low is None else min(low, lo)
            high = hi if high is None else max(high, hi)
        if not provable or low is None or high is None:
            continue
        if leaf.truncate is not None:
            low = (truncate_string_min if isinstance(low, str) else truncate_binary_min)(low, leaf.truncate)
            high = (truncate_string_max if isinstance(high, str) else truncate_binary_max)(high, leaf.truncate)
        lower[leaf.field_id] = to_bytes(leaf.field_type, low)
        if high is not None:
            upper[leaf.field_id] = to_bytes(leaf.field_type, high)
    result["null_value_counts"] = null_counts
    result["nan_value_counts"] = {}
    result["lower_bounds"] = lower
    result["upper_bounds"] = upper
    return result
