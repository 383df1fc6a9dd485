"""Dictionary encoding per column, decided as parquet-mr decides it on a column's first page: kept
where the dictionary and its indices are smaller than the plain values, left off for columns of
(nearly) unique values, which PyArrow would otherwise start with a dictionary as large as the
values. Checked on the files the task writer writes, read back with PyArrow's Parquet reader."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, IntegerType, ListType, LongType, NestedField, StringType

from iceberg_sink._iceberg.encoding import SAMPLE_ROWS, dictionary_columns
from tests.helpers import write_batches, writer_spec

ROWS = 30_000
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "status", StringType()),
    NestedField(3, "email", StringType()),
    NestedField(4, "amount", DoubleType()),
    NestedField(5, "a.b/c?\x01", IntegerType()),  # a name with a dot and control characters: a few values
    NestedField(6, "empty", LongType()),
)


def events() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "status": [("new", "paid", "shipped")[i % 3] for i in range(ROWS)],
            "email": [f"user-{i * 7919}@example.com" for i in range(ROWS)],
            "amount": [i * 1.25 for i in range(ROWS)],
            "a.b/c?\x01": pa.array([i % 10 for i in range(ROWS)], pa.int32()),
            "empty": pa.array([None] * ROWS, pa.int64()),
        }
    )


def encodings(path: str) -> dict[str, set[str]]:
    metadata = pq.ParquetFile(path).metadata
    found: dict[str, set[str]] = {}
    for group in range(metadata.num_row_groups):
        for index in range(metadata.num_columns):
            column = metadata.row_group(group).column(index)
            found.setdefault(column.path_in_schema, set()).update(column.encodings)
    return found


def test_unique_columns_are_written_plain_and_repeated_ones_with_a_dictionary(catalog: Catalog) -> None:
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=SCHEMA)
    result = write_batches(writer_spec(table), events())
    [data_file] = result.data_files
    found = encodings(data_file.path.removeprefix("file://"))
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    for unique in ("id", "email", "amount"):
        assert not found[unique] & dictionary, (unique, found[unique])
    for repeated in ("status", "a.b/c?\x01", "empty"):
        assert found[repeated] & dictionary, (repeated, found[repeated])
    # The values are the same whatever the encoding.
    assert pq.read_table(data_file.path.removeprefix("file://")).to_pydict() == events().to_pydict()


def test_the_decision_is_made_on_the_first_rows_only() -> None:
    # Unique in its first SAMPLE_ROWS rows, repeated after: parquet-mr's first page decides, so here too.
    values = list(range(SAMPLE_ROWS)) + [0] * (3 * SAMPLE_ROWS)
    table = pa.table({"x": pa.array(values, pa.int64()), "y": pa.array([1] * len(values), pa.int64())})
    assert dictionary_columns(table) == ["y"]
    assert dictionary_columns(table.slice(SAMPLE_ROWS)) is True


def test_a_table_with_a_nested_column_keeps_dictionaries_on_every_column() -> None:
    # use_dictionary takes leaf paths, which top-level names are not for nested columns.
    table = pa.table(
        {
            "id": pa.array(range(100), pa.int64()),
            "tags": pa.array([[str(i)] for i in range(100)], pa.list_(pa.string())),
        }
    )
    assert dictionary_columns(table) is True


def test_a_nested_table_is_written_and_read_back(catalog: Catalog) -> None:
    catalog.create_namespace("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "tags", ListType(3, StringType(), element_required=False)),
    )
    table = catalog.create_table("db.nested", schema=schema)
    rows = pa.table(
        {
            "id": pa.array(range(100), pa.int64()),
            "tags": pa.array([[str(i % 4)] for i in range(100)], pa.list_(pa.string())),
        }
    )
    [data_file] = write_batches(writer_spec(table), rows).data_files
    assert (
        pq.read_table(data_file.path.removeprefix("file://")).column("tags").to_pylist()
        == rows.column("tags").to_pylist()
    )
