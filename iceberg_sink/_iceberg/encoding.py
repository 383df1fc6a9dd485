"""Which columns of a new Parquet file get dictionary encoding: the check parquet-mr (Iceberg Java's
writer) makes on a column's first page, made on the file's first rows.

PyArrow dictionary-encodes every column until its dictionary passes a size limit and then falls
back to plain pages, so a column of unique values (ids, timestamps, amounts) starts with a
dictionary as large as the values plus an index for every value: larger files that compress worse
(a CDC table's ids: 5.2 MB with zstd against parquet-mr's 2.9 MB) and a column chunk of mixed
pages that readers decode on their slower path. parquet-mr keeps the dictionary only if the first
page's dictionary plus its indices are smaller than its plain values, and otherwise writes the
whole column plain. :func:`dictionary_columns` makes that decision per column on the first
``SAMPLE_ROWS`` rows (parquet-mr's page row limit) of the rows that open a file.

Nested columns keep PyArrow's default (a table with one keeps dictionaries on every column): their
leaf paths are not the top-level names ``use_dictionary`` would be given.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

# Rows of a file's first rows the decision is made on: parquet-mr's default page row count limit
# (parquet.page.row.count.limit), so the same rows its first page holds when values are small.
SAMPLE_ROWS = 20_000
# Plain encoding's length prefix of each binary or string value.
_LENGTH_PREFIX = 4


def dictionary_columns(table: pa.Table) -> bool | list[str]:
    """``use_dictionary`` for a Parquet file whose first rows are ``table``: True for every column,
    or the names of the columns that get a dictionary."""
    if any(_nested(field.type) for field in table.schema):
        return True
    sample = table.slice(0, SAMPLE_ROWS)
    chosen = [field.name for field, column in zip(table.schema, sample.columns, strict=True) if _worth_it(column)]
    return True if len(chosen) == table.num_columns else chosen


def _nested(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_nested(arrow_type))


def _worth_it(column: pa.ChunkedArray) -> bool:
    """parquet-mr's check: the dictionary and its indices take fewer bytes than the plain values."""
    values = column.drop_null()
    count = len(values)
    if count == 0 or pa.types.is_boolean(values.type):
        return True  # nothing to weigh; booleans are bit-packed either way
    distinct = pc.unique(values)
    indices = count * max(1, math.ceil(math.log2(len(distinct)))) / 8 if len(distinct) > 1 else 0
    if pa.types.is_binary(values.type) or pa.types.is_string(values.type) or _large(values.type):
        plain = _binary_bytes(values) + _LENGTH_PREFIX * count
        dictionary = _binary_bytes(distinct) + _LENGTH_PREFIX * len(distinct)
    else:
        width = _byte_width(values.type)
        if width is None:
            return True
        plain = width * count
        dictionary = width * len(distinct)
    return dictionary + indices < plain


def _large(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_large_binary(arrow_type) or pa.types.is_large_string(arrow_type))


def _binary_bytes(values: pa.Array | pa.ChunkedArray) -> int:
    lengths = pc.binary_length(values)
    total = pc.sum(lengths).as_py()
    return int(total or 0)


def _byte_width(arrow_type: pa.DataType) -> int | None:
    try:
        bits = int(arrow_type.bit_width)
    except ValueError:
        return None
    return max(1, bits // 8)
