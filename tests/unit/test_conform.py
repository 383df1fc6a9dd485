"""Arrow batches brought to the table's Arrow schema: nulls, required fields under optional structs."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iceberg_sink import InvalidInputError
from iceberg_sink.writer.conform import conform_batch

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
