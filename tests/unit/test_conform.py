"""Arrow batches brought to the table's Arrow schema: nulls, required fields under optional structs."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    FixedType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_sink import InvalidInputError
from iceberg_sink._iceberg.files import arrow_schema
from iceberg_sink.writer.conform import conform_batch, write_defaults

INNER = pa.struct([pa.field("c", pa.int64(), nullable=False), pa.field("o", pa.string())])
DEEP = pa.struct(
    [
        pa.field("r", INNER, nullable=False),
        pa.field("l", pa.list_(pa.int64()), nullable=False),
        pa.field("m", pa.map_(pa.string(), pa.int64()), nullable=False),
        pa.field("s", pa.string(), nullable=False),
    ]
)
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("opt", INNER),  # optional struct with a required child
        pa.field("deep", DEEP),  # optional struct with required struct, list, map and string children
    ]
)


def _round_trip(table: pa.Table) -> list[dict[str, object]]:
    """Write with the Parquet writer the sink uses (it checks required fields) and read back."""
    buffer = io.BytesIO()
    with pq.ParquetWriter(buffer, table.schema) as writer:
        writer.write_table(table)
    buffer.seek(0)
    return pq.read_table(buffer).to_pylist()


def test_missing_optional_struct_with_required_children_is_written_as_null() -> None:
    batch = pa.table({"id": pa.array([1, 2], pa.int64())})
    assert _round_trip(conform_batch(batch, SCHEMA)) == [
        {"id": 1, "opt": None, "deep": None},
        {"id": 2, "opt": None, "deep": None},
    ]


def test_null_struct_with_required_children_is_accepted() -> None:
    # A null struct holds no value for its required child: only a set struct must set it.
    opt = pa.array([{"c": 1, "o": "a"}, None, {"c": 3, "o": None}], pa.struct([("c", pa.int64()), ("o", pa.string())]))
    batch = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "opt": opt})
    assert _round_trip(conform_batch(batch, SCHEMA)) == [
        {"id": 1, "opt": {"c": 1, "o": "a"}, "deep": None},
        {"id": 2, "opt": None, "deep": None},
        {"id": 3, "opt": {"c": 3, "o": None}, "deep": None},
    ]


def test_null_in_a_required_child_of_a_set_struct_is_refused() -> None:
    opt = pa.array([{"c": 1}, {"c": None}, None], pa.struct([("c", pa.int64())]))
    batch = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "opt": opt})
    with pytest.raises(InvalidInputError, match=r"column 'opt.c' is required \(not null\) .* 1 row\(s\)"):
        conform_batch(batch, SCHEMA)


def _defaults_schema() -> tuple[pa.Schema, dict[int, object], dict[str, object]]:
    """An Iceberg schema with a write-default on fields of every primitive kind, at the top level,
    in a struct, in list elements and in map values; its Arrow schema and defaults as the writer gets them."""

    def point(first: int) -> StructType:
        return StructType(
            NestedField(first, "x", IntegerType(), required=True, initial_default=-1, write_default=5),
            NestedField(first + 1, "y", StringType()),
        )

    values: list[tuple[str, object, object]] = [
        ("i", IntegerType(), 7),
        ("l", LongType(), -(2**40)),
        ("b", BooleanType(), True),
        ("str", StringType(), "d\n,ü"),
        ("day", DateType(), dt.date(2024, 2, 29)),
        ("ts", TimestampType(), dt.datetime(2024, 1, 2, 3, 4, 5, 6)),
        ("tstz", TimestamptzType(), dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)),
        ("t", TimeType(), dt.time(23, 59, 59, 999999)),
        ("dec", DecimalType(9, 2), decimal.Decimal("-12.50")),
        ("u", UUIDType(), uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")),
        ("fx", FixedType(3), b"\x00\x01\x02"),
        ("bin", BinaryType(), b"\xff"),
    ]
    fields = [NestedField(1, "id", LongType(), required=True)]
    fields += [
        NestedField(10 + n, name, typ, required=n % 2 == 1, initial_default=v, write_default=v)
        for n, (name, typ, v) in enumerate(values)
    ]
    fields += [
        NestedField(40, "p", point(41)),
        NestedField(50, "ps", ListType(52, point(53), element_required=False)),
        NestedField(60, "pm", MapType(61, StringType(), 62, point(63), value_required=False)),
    ]
    schema = Schema(*fields)
    return arrow_schema(schema), write_defaults(schema), {name: v for name, _, v in values}


def test_missing_fields_take_their_write_default_and_supplied_nulls_stay_null() -> None:
    schema, defaults, by_name = _defaults_schema()
    point = pa.struct([pa.field("y", pa.string())])  # the input's structs lack x
    batch = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "i": pa.array([None, 4, None], pa.int32()),  # supplied: its nulls stay null
            "p": pa.array([{"y": "a"}, None, {"y": None}], point),
            "ps": pa.array([[{"y": "a"}, None, {"y": "b"}], None, []], pa.list_(point)),
            "pm": pa.array([[("k", {"y": "a"})], None, [("n", None)]], pa.map_(pa.string(), point)),
        }
    )
    rows = _round_trip(conform_batch(batch, schema, defaults))
    assert [r["i"] for r in rows] == [None, 4, None]
    for name in ("l", "b", "str", "day", "ts", "tstz", "t", "dec", "fx", "bin"):
        assert [r[name] for r in rows] == [by_name[name]] * 3, name
    assert {uuid.UUID(bytes=r["u"]) if isinstance(r["u"], bytes) else r["u"] for r in rows} == {by_name["u"]}
    # In a struct the input lacks x: 5 (the write-default, not the initial-default -1) where the struct is set.
    assert [r["p"] for r in rows] == [{"x": 5, "y": "a"}, None, {"x": 5, "y": None}]
    assert [r["ps"] for r in rows] == [[{"x": 5, "y": "a"}, None, {"x": 5, "y": "b"}], None, []]
    assert [r["pm"] for r in rows] == [[("k", {"x": 5, "y": "a"})], None, [("n", None)]]


def test_write_defaults_reach_slices_of_lists() -> None:
    """A batch that is a slice of a larger one (offsets not starting at 0) gets the same defaults."""
    schema, defaults, _ = _defaults_schema()
    point = pa.struct([pa.field("y", pa.string())])
    whole = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "ps": pa.array([[{"y": "a"}], [{"y": "b"}, {"y": "c"}], None, [{"y": "d"}]], pa.list_(point)),
        }
    )
    rows = _round_trip(conform_batch(whole.slice(1, 3), schema, defaults))
    assert [r["ps"] for r in rows] == [[{"x": 5, "y": "b"}, {"x": 5, "y": "c"}], None, [{"x": 5, "y": "d"}]]


def test_a_missing_required_column_without_a_write_default_is_refused() -> None:
    schema, defaults, _ = _defaults_schema()
    with pytest.raises(InvalidInputError, match=r"'id' is required in the table but missing .*no write-default"):
        conform_batch(pa.table({"i": pa.array([1], pa.int32())}), schema, defaults)
