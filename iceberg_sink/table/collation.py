"""Strings compared as the table compares them: byte by byte.

Spark 4 strings may carry a collation (``string collate UTF8_LCASE``, ``UNICODE_CI``...): a column read
from a collated source table, or made with ``collate(...)``. Spark then groups, joins and compares
those values by the collation, so ``'A'`` and ``'a'`` are one key under ``UTF8_LCASE``. An Iceberg
table has no collation: its readers and its equality deletes compare strings byte by byte. Left as
they came, a batch would be reduced by the collation (of two rows ``'A'`` and ``'a'`` in one batch
only the later was written, without a word) while the same two keys in two batches stay two rows:
what the table holds would depend on where batches happen to end. (Op codes and routed table names
were already compared as binary strings: their checks cast to ``string``, which drops the collation.)

:func:`binary_strings` is the one rule: the sink's input (``job/reading.read_batch``, after the
``map_batches`` functions, before routing) has every collated string, nested ones included, cast to
Spark's binary ``string``, so every comparison the sink makes is the table's.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from iceberg_sink._spark_schema import schema_of
from iceberg_sink._sql import named

BINARY = "UTF8_BINARY"
COLLATIONS = hasattr(T.StringType(), "collation")  # Spark 4+; Spark 3.5 strings are binary


def collated(data_type: T.DataType) -> bool:
    """Whether ``data_type`` holds a string with a collation other than the binary one."""
    if isinstance(data_type, T.StringType):
        return getattr(data_type, "collation", BINARY) != BINARY  # Spark 3.5: no collations
    if isinstance(data_type, T.StructType):
        return any(collated(f.dataType) for f in data_type.fields)
    if isinstance(data_type, T.ArrayType):
        return collated(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return collated(data_type.keyType) or collated(data_type.valueType)
    return False


def binary(data_type: Any) -> Any:
    """``data_type`` with every string binary (nested fields keep their names and nullability)."""
    if isinstance(data_type, T.StringType):
        return T.StringType()
    if isinstance(data_type, T.StructType):
        return T.StructType(
            [T.StructField(f.name, binary(f.dataType), f.nullable, f.metadata) for f in data_type.fields]
        )
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(binary(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, T.MapType):
        return T.MapType(binary(data_type.keyType), binary(data_type.valueType), data_type.valueContainsNull)
    return data_type


def binary_strings(df: DataFrame) -> DataFrame:
    """``df`` with its collated string columns cast to binary strings (see the module docstring);
    ``df`` itself when it has none (no new projection to analyse)."""
    if not COLLATIONS:
        return df
    fields = [(f, collated(f.dataType)) for f in schema_of(df).fields]
    if not any(c for _, c in fields):
        return df
    return df.select(
        *[
            named(f.name).cast(binary(f.dataType)).alias(f.name, metadata=f.metadata) if c else named(f.name)
            for f, c in fields
        ]
    )
