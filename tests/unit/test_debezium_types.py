"""Kafka Connect schemas to Spark types (sources/debezium.py): logical types as Iceberg's Kafka
Connect sink maps them, and the builder's truncate policy checked up front (issue 18, part 2)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import types as T

from iceberg_sink import IcebergSink, InvalidSinkConfigError
from iceberg_sink.sources.debezium import connect_to_spark


def leaf(kind: str, name: str | None = None, **params: str) -> dict[str, Any]:
    return {"type": kind, **({"name": name} if name else {}), **({"parameters": params} if params else {})}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (
            leaf("bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "10"}),
            T.DecimalType(10, 2),
        ),
        (leaf("bytes", "org.apache.kafka.connect.data.Decimal", scale="4"), T.DecimalType(38, 4)),
        (
            {
                "type": "struct",
                "name": "io.debezium.data.VariableScaleDecimal",
                "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}],
            },
            T.StringType(),
        ),
        (leaf("int32", "org.apache.kafka.connect.data.Date"), T.DateType()),
        (leaf("int32", "io.debezium.time.Date"), T.DateType()),
        (leaf("int32", "org.apache.kafka.connect.data.Time"), T.LongType()),
        (leaf("int64", "io.debezium.time.MicroTime"), T.LongType()),
        (leaf("int64", "io.debezium.time.NanoTime"), T.LongType()),
        (leaf("int64", "org.apache.kafka.connect.data.Timestamp"), T.TimestampNTZType()),
        (leaf("int64", "io.debezium.time.Timestamp"), T.TimestampNTZType()),
        (leaf("int64", "io.debezium.time.MicroTimestamp"), T.TimestampNTZType()),
        (leaf("int64", "io.debezium.time.NanoTimestamp"), T.TimestampNTZType()),
        (leaf("string", "io.debezium.time.ZonedTimestamp"), T.TimestampType()),
        (leaf("string", "io.debezium.data.Uuid"), T.StringType()),
        (leaf("string", "io.debezium.data.Json"), T.StringType()),
        (leaf("string", "io.debezium.data.Enum"), T.StringType()),
        (leaf("string", "io.debezium.data.EnumSet"), T.StringType()),
        (leaf("bytes"), T.BinaryType()),
        (leaf("int16"), T.IntegerType()),
        ({"type": "array", "items": leaf("int32", "io.debezium.time.Date")}, T.ArrayType(T.DateType())),
    ],
)
def test_connect_logical_types_map_to_the_types_a_user_expects(schema: dict[str, Any], expected: T.DataType) -> None:
    assert connect_to_spark(schema) == expected


def test_a_decimal_iceberg_cannot_hold_is_refused_naming_the_field() -> None:
    from iceberg_sink import InvalidInputError

    wide = leaf("bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "40"})
    with pytest.raises(InvalidInputError, match=r"field 'price' is a Decimal of precision 40"):
        connect_to_spark({"type": "struct", "fields": [{**wide, "field": "price"}]})


def test_builder_checks_the_truncate_policy_up_front() -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"expected one of \('apply', 'skip', 'fail'\), received 'drop'"):
        IcebergSink.builder().debezium(truncate="drop")
    IcebergSink.builder().debezium(truncate="apply")  # accepted: the table is emptied at a truncate


def test_builder_checks_its_reader_arguments_up_front() -> None:
    """An unknown argument or an order that is not a path (or one type per path) is refused when
    ``.debezium(...)`` is called, not by the first batch of a running stream."""
    with pytest.raises(
        InvalidSinkConfigError, match=r"debezium\(\.\.\.\): expected arguments among .*order_type.*\['orderby'\]"
    ):
        IcebergSink.builder().debezium(orderby="source.lsn")
    paths = ["source.file", "source.pos", "source.row"]
    for order_by, order_type in (
        (paths, ["binlog", "long"]),
        ([], "long"),
        (paths, ["binlog", 5, "long"]),
        ("", "long"),
    ):
        with pytest.raises(InvalidSinkConfigError, match=r"debezium\(order_by=\.\.\., order_type=\.\.\.\): expected"):
            IcebergSink.builder().debezium(order_by=order_by, order_type=order_type)
    IcebergSink.builder().debezium(order_by=paths, order_type=["binlog", "long", "long"], order_column="binlog")
    IcebergSink.builder().debezium(order_by=None)
