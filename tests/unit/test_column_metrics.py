"""Column bounds of written files: exact over every row group, truncated as Iceberg Java truncates.

The writer's bounds must contain every value of the file (a bound that is too narrow makes readers
skip a file holding matching rows and lets the new-key proof skip a needed equality delete), and
truncated upper bounds must be valid UTF-8 that still sorts above the value.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_sink._iceberg.metrics import (
    truncate_binary_max,
    truncate_binary_min,
    truncate_string_max,
    truncate_string_min,
)
from iceberg_sink.vocab.files import DataFileMeta
from tests.helpers import write_batches, writer_spec

UTC = dt.UTC
LONG = "a" * 5000  # longer than Arrow's statistics size limit: its row group gets no min/max

# -- truncation, checked against Iceberg Java's UnicodeUtil / BinaryUtil ------------------------------


@pytest.mark.parametrize(
    ("value", "length", "expected"),
    [
        ("abc", 3, "abc"),  # not longer than the limit: kept as is
        ("abcd", 3, "abd"),
        ("ab\ud7ffz", 3, "ab\ue000"),  # U+D7FF + 1 skips the surrogates
        ("a\U0010ffffz", 2, "b"),  # U+10FFFF cannot be incremented: dropped, the previous one carries
        ("a\U0010ffff\U0010ffffz", 3, "b"),
        ("\U0010ffff\U0010ffffz", 2, None),  # nothing can be incremented: no upper bound
        ("ñ€😀x", 3, "ñ€😁"),  # code points, not bytes or UTF-16 units
        ("a\ufffez", 2, "a\uffff"),
    ],
)
def test_truncate_string_max(value: str, length: int, expected: str | None) -> None:
    got = truncate_string_max(value, length)
    assert got == expected
    if got is not None:
        got.encode("utf-8")  # valid UTF-8 (a surrogate would raise)
        assert got >= value and (got == value or got > value[:length])


def test_truncate_string_min_counts_code_points() -> None:
    assert truncate_string_min("😀😁😂", 2) == "😀😁"
    assert truncate_string_min("ab", 5) == "ab"


@pytest.mark.parametrize(
    ("value", "length", "expected"),
    [
        (b"\x01\x02", 2, b"\x01\x02"),
        (b"\x01\x02\x03", 2, b"\x01\x03"),
        (b"\x01\xff\x03", 2, b"\x02"),  # 0xFF overflows: dropped, the previous byte carries
        (b"\xff\xff\x00", 2, None),
        (b"\x00\xfe\xff", 2, b"\x00\xff"),
    ],
)
def test_truncate_binary_max(value: bytes, length: int, expected: bytes | None) -> None:
    assert truncate_binary_max(value, length) == expected
    assert truncate_binary_min(value, length) == value[:length]


# -- bounds of written files ------------------------------------------------------------------------

NESTED = StructType(
    NestedField(15, "x", StringType(), required=False),
    NestedField(16, "y", DoubleType(), required=False),
    NestedField(17, "z", IntegerType(), required=False),
)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "i", IntegerType(), required=False),
    NestedField(3, "f", FloatType(), required=False),
    NestedField(4, "d", DoubleType(), required=False),
    NestedField(5, "dec", DecimalType(10, 2), required=False),
    NestedField(6, "dt", DateType(), required=False),
    NestedField(7, "tm", TimeType(), required=False),
    NestedField(8, "ts", TimestamptzType(), required=False),
    NestedField(9, "tsn", TimestampType(), required=False),
    NestedField(10, "s", StringType(), required=False),
    NestedField(11, "b", BinaryType(), required=False),
    NestedField(12, "flag", BooleanType(), required=False),
    NestedField(13, "u", UUIDType(), required=False),
    NestedField(14, "st", NESTED, required=False),
)
U1, U2 = uuid.UUID(int=5), uuid.UUID(int=(1 << 127) + 3)  # the second sorts above (unsigned bytes)

# Two rows per row group. The first row group holds the extreme values of most columns, including
# strings and binary too long for Parquet statistics; every column also has nulls and NaN.
ROWS: list[dict[str, Any]] = [
    {
        "id": 0,
        "i": -(2**31),
        "f": math.nan,
        "d": -0.0,
        "dec": Decimal("-99999999.99"),
        "dt": dt.date(1, 1, 1),
        "tm": dt.time(0, 0),
        "ts": dt.datetime(1900, 1, 1, tzinfo=UTC),
        "tsn": dt.datetime(1900, 1, 1),
        "s": LONG,
        "b": b"\x00" + b"\xff" * 4999,
        "flag": False,
        "u": U1,
        "st": {"x": LONG, "y": math.nan, "z": -5},
    },
    {
        "id": 1,
        "i": None,
        "f": -1.5,
        "d": math.nan,
        "dec": None,
        "dt": None,
        "tm": None,
        "ts": None,
        "tsn": None,
        "s": "b",
        "b": b"\x01",
        "flag": None,
        "u": None,
        "st": None,
    },
    {
        "id": 2,
        "i": 7,
        "f": 2.5,
        "d": 1e300,
        "dec": Decimal("0.01"),
        "dt": dt.date(2024, 2, 29),
        "tm": dt.time(12, 30, 0, 5),
        "ts": dt.datetime(2024, 2, 29, 1, 2, 3, 456789, tzinfo=UTC),
        "tsn": dt.datetime(2024, 2, 29, 1, 2, 3, 456789),
        "s": "m",
        "b": b"\x50",
        "flag": True,
        "u": U2,
        "st": {"x": "m", "y": 0.0, "z": None},
    },
    {
        "id": 3,
        "i": 8,
        "f": None,
        "d": 2.0,
        "dec": Decimal("12.34"),
        "dt": dt.date(2024, 3, 1),
        "tm": dt.time(23, 59, 59, 999999),
        "ts": dt.datetime(2024, 3, 1, tzinfo=UTC),
        "tsn": dt.datetime(2024, 3, 1),
        "s": "n",
        "b": b"\x60",
        "flag": True,
        "u": None,
        "st": {"x": "n", "y": 3.0, "z": 9},
    },
]


def _arrow_rows() -> pa.Table:
    schema = SCHEMA.as_arrow()
    rows = [{**r, "u": r["u"].bytes if r["u"] is not None else None} for r in ROWS]
    return pa.Table.from_pylist(rows, schema=schema)


def _write(catalog: Catalog, name: str, props: dict[str, str] | None = None) -> DataFileMeta:
    catalog.create_namespace_if_not_exists("db")
    table = catalog.create_table(f"db.{name}", schema=SCHEMA, partition_spec=PartitionSpec(), properties=props or {})
    # Two flushes (one per batch) of two row groups each.
    spec = writer_spec(table, row_group_limit=2, buffer_bytes=1)
    data = _arrow_rows()
    (meta,) = write_batches(spec, data.slice(0, 2), data.slice(2, 2)).data_files
    assert pq.ParquetFile(meta.path.removeprefix("file://")).metadata.num_row_groups == 2
    return meta


def _as_internal(field_type: PrimitiveType, value: Any) -> Any:
    """A Python value as PyIceberg's from_bytes returns it, for comparison with the bounds."""
    if isinstance(field_type, DateType):
        return (value - dt.date(1970, 1, 1)).days
    if isinstance(field_type, TimeType):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if isinstance(field_type, TimestamptzType):
        return (value - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1)
    if isinstance(field_type, TimestampType):
        return (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)
    if isinstance(field_type, UUIDType):
        return value
    return value


def _values(field_id: int) -> list[Any]:
    """Every non-null, non-NaN value of a (possibly nested) field in ROWS."""
    name = SCHEMA.find_column_name(field_id)
    assert name is not None
    result = []
    for row in ROWS:
        value: Any = row
        for part in name.split("."):
            value = None if value is None else value[part]
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            result.append(value)
    return result


def test_bounds_contain_every_value_of_every_row_group(catalog: Catalog) -> None:
    meta = _write(catalog, "bounds")
    lower, upper = dict(meta.lower_bounds), dict(meta.upper_bounds)
    checked = 0
    for field_id in [*range(1, 14), 15, 16, 17]:
        field_type = SCHEMA.find_field(field_id).field_type
        assert isinstance(field_type, PrimitiveType)
        values = [_as_internal(field_type, v) for v in _values(field_id)]
        low, high = from_bytes(field_type, lower[field_id]), from_bytes(field_type, upper[field_id])
        if isinstance(field_type, UUIDType):
            values = [v.bytes for v in values]
            low, high = (
                low.bytes if isinstance(low, uuid.UUID) else low,
                high.bytes if isinstance(high, uuid.UUID) else high,
            )
        for v in values:
            assert low <= v <= high, (SCHEMA.find_column_name(field_id), low, v, high)
        checked += 1
    assert checked == 16
    # Exact where nothing is truncated; strings and binary: 16 characters/bytes (the default truncate(16)).
    assert from_bytes(StringType(), lower[10]) == "a" * 16
    assert from_bytes(StringType(), upper[10]) == "n"
    assert from_bytes(BinaryType(), lower[11]) == b"\x00" + b"\xff" * 15
    assert from_bytes(BinaryType(), upper[11]) == b"\x60"
    assert from_bytes(StringType(), lower[15]) == "a" * 16 and from_bytes(StringType(), upper[15]) == "n"
    assert from_bytes(IntegerType(), lower[2]) == -(2**31) and from_bytes(IntegerType(), upper[2]) == 8
    assert from_bytes(DecimalType(10, 2), lower[5]) == Decimal("-99999999.99")


def test_nan_is_counted_and_kept_out_of_bounds(catalog: Catalog) -> None:
    meta = _write(catalog, "nan")
    lower, upper, nans = dict(meta.lower_bounds), dict(meta.upper_bounds), dict(meta.nan_value_counts)
    assert nans[3] == 1 and nans[4] == 1 and nans[16] == 1
    assert from_bytes(FloatType(), lower[3]) == -1.5 and from_bytes(FloatType(), upper[3]) == 2.5
    assert from_bytes(DoubleType(), upper[4]) == 1e300
    # A zero minimum is -0.0 and a zero maximum +0.0, so both zeros are inside the bounds.
    d_low = from_bytes(DoubleType(), lower[4])
    assert d_low == 0.0 and math.copysign(1.0, d_low) == -1.0
    y_low = from_bytes(DoubleType(), lower[16])
    assert y_low == 0.0 and math.copysign(1.0, y_low) == -1.0


def test_all_zero_and_all_nan_columns(catalog: Catalog) -> None:
    catalog.create_namespace_if_not_exists("db")
    schema = Schema(NestedField(1, "z", DoubleType(), required=False), NestedField(2, "n", FloatType(), required=False))
    table = catalog.create_table("db.zeros", schema=schema)
    data = pa.table({"z": pa.array([0.0, 0.0], pa.float64()), "n": pa.array([math.nan, None], pa.float32())})
    (meta,) = write_batches(writer_spec(table), data).data_files
    lower, upper = dict(meta.lower_bounds), dict(meta.upper_bounds)
    assert math.copysign(1.0, from_bytes(DoubleType(), lower[1])) == -1.0
    assert math.copysign(1.0, from_bytes(DoubleType(), upper[1])) == 1.0
    assert 2 not in lower and 2 not in upper  # NaN is never a bound
    assert dict(meta.nan_value_counts)[2] == 1 and dict(meta.null_value_counts)[2] == 1


def test_metrics_modes_apply_to_computed_bounds(catalog: Catalog) -> None:
    meta = _write(
        catalog,
        "modes",
        {
            "write.metadata.metrics.default": "truncate(4)",
            "write.metadata.metrics.column.b": "full",
            "write.metadata.metrics.column.i": "counts",
            "write.metadata.metrics.column.d": "none",
            "write.metadata.metrics.column.st.x": "truncate(2)",
        },
    )
    lower, upper = dict(meta.lower_bounds), dict(meta.upper_bounds)
    assert from_bytes(StringType(), lower[10]) == "aaaa" and from_bytes(StringType(), upper[10]) == "n"
    assert from_bytes(BinaryType(), lower[11]) == b"\x00" + b"\xff" * 4999  # full
    assert 2 not in lower and 2 in dict(meta.value_counts)  # counts
    assert 4 not in lower and 4 not in dict(meta.value_counts) and 4 not in dict(meta.nan_value_counts)  # none
    assert from_bytes(StringType(), lower[15]) == "aa"
    assert from_bytes(LongType(), upper[1]) == 3  # truncate(N) keeps non-text types whole


def test_upper_bound_dropped_when_no_truncated_value_can_be_rounded_up(catalog: Catalog) -> None:
    catalog.create_namespace_if_not_exists("db")
    schema = Schema(
        NestedField(1, "s", StringType(), required=False), NestedField(2, "b", BinaryType(), required=False)
    )
    table = catalog.create_table(
        "db.maxed", schema=schema, properties={"write.metadata.metrics.default": "truncate(2)"}
    )
    data = pa.table({"s": ["\U0010ffff" * 3, "a"], "b": [b"\xff" * 3, b"\x00"]})
    (meta,) = write_batches(writer_spec(table), data).data_files
    assert 1 not in dict(meta.upper_bounds) and 2 not in dict(meta.upper_bounds)
    assert from_bytes(StringType(), dict(meta.lower_bounds)[1]) == "a"
    assert from_bytes(BinaryType(), dict(meta.lower_bounds)[2]) == b"\x00"
