"""Debezium events as connectors really emit them (issue 18, part 2), through the reader and the sink.

Each test fails on the code before the issue: null-only columns of a key-only delete inferred as
string (SchemaMismatchError); values that do not fit their declared type written as null; logical
types written as their physical form (a NUMERIC(10,2) as opaque bytes); truncate, message and
garbage events reported as "a key column is null"; the TOAST placeholder written over the stored
value; same-named tables of two schemas merged; a list of order paths refused. Tables are read back
by Iceberg Java and DuckDB.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.types import (
    DateType,
    DecimalType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, SchemaMismatchError
from iceberg_sink.sources.debezium import UNAVAILABLE_VALUE, read_envelope
from iceberg_sink.sources.envelope import LastCounts, reading_batch
from iceberg_sink.sources.readers import read_json
from iceberg_sink.vocab.columns import REJECT_COLUMN
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


def decimal_bytes(value: Decimal, scale: int) -> str:
    """Kafka Connect's Decimal: the unscaled value, two's-complement big-endian, base64."""
    unscaled = int(value.scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def field(name: str, kind: str, logical: str | None = None, **params: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "optional": name != "id", "field": name}
    if logical:
        out["name"] = logical
    if params:
        out["parameters"] = params
    return out


def envelope(
    op: str,
    lsn: int | str | None,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    row_fields: list[dict[str, Any]] | None = None,
    source: dict[str, Any] | None = None,
) -> str:
    payload = {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": 1_700_000_000_000,
        "source": {"db": "inventory", "schema": "public", "table": "items", "lsn": lsn, **(source or {})},
    }
    if row_fields is None:
        return json.dumps(payload)
    row = {"type": "struct", "fields": row_fields, "optional": True, "name": "srv.public.items.Value"}
    schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "string", "field": "op", "optional": False},
        ],
        "name": "srv.public.items.Envelope",
    }
    return json.dumps({"schema": schema, "payload": payload})


def frame(spark: SparkSession, values: list[str | None]) -> DataFrame:
    """Kafka-style records: topic, partition, offset and value."""
    return spark.createDataFrame(
        [("items", 0, i, v) for i, v in enumerate(values)], "topic string, partition int, offset long, value string"
    )


def refusals(df: DataFrame) -> dict[int, str]:
    """Offset -> reason of the refused events (read before the sink's fail-fast check)."""
    marked = df.where(df[REJECT_COLUMN].isNotNull()).select(REJECT_COLUMN).collect()
    return {r[0]["offset"]: r[0]["reason"] for r in marked}


def sink(lake: Path, table: str = "cdc.items", **debezium: Any) -> IcebergSink:
    return (
        IcebergSink.builder()
        .embedded(lake)
        .table(table)
        .create_if_missing()
        .debezium(value_column="value", table_column=None, **debezium)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )


def read_back(java_reader: JavaIcebergReader, s: IcebergSink, columns: list[str]) -> list[dict[str, Any]]:
    location = s.load_table().metadata_location
    java = normalize(java_reader.read(location).select(columns), ["id"])
    duck = normalize(duckdb_read(location).select(columns), ["id"])
    assert java == duck
    return java


def test_key_only_delete_with_null_columns_takes_the_tables_types(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """PostgreSQL's default replica identity, schemas disabled: a delete's before holds the key and
    JSON nulls. Before, qty and name were inferred as string: SchemaMismatchError, every replay."""
    s = sink(tmp_path / "lake")
    first = [
        envelope("c", 1, None, {"id": 1, "name": "a", "qty": 5}),
        envelope("c", 2, None, {"id": 2, "name": "b", "qty": 6}),
    ]
    s.write(frame(spark, first), checkpoint_location=str(tmp_path / "ckpt"))
    second = [envelope("d", 3, {"id": 1, "name": None, "qty": None}, None)]
    s.write(frame(spark, second), checkpoint_location=str(tmp_path / "ckpt"))
    table = s.load_table()
    assert table.schema().find_field("qty").field_type == LongType()
    assert table.schema().find_field("name").field_type == StringType()
    assert read_back(java_reader, s, ["id", "name", "qty"]) == [{"id": 2, "name": "b", "qty": 6}]


ROW = [
    field("id", "int64"),
    field("qty", "int32"),
    field("big", "int64"),
    field("ok", "boolean"),
    field("blob", "bytes"),
    field("ratio", "float"),
    {"type": "struct", "field": "dims", "optional": True, "fields": [field("w", "int32")]},
]


def test_values_that_do_not_fit_their_declared_type_are_refused_never_written_as_null(
    spark: SparkSession, tmp_path: Path, ansi_mode: bool
) -> None:
    good = {"id": 1, "qty": 1, "big": 1, "ok": True, "blob": "AQI=", "ratio": 0.5, "dims": {"w": 1}}
    bad = [
        ("qty", 3_000_000_000, "'qty' holds '3000000000', which does not fit its declared type int32"),
        ("big", 2**63, "'big' holds '9223372036854775808', which does not fit its declared type int64"),
        ("ok", "yes", "'ok' holds 'yes', which does not fit its declared type boolean"),
        ("blob", "!!not base64", "'blob' holds '!!not base64', which does not fit its declared type bytes"),
        ("ratio", 1e40, "'ratio' holds '1.0E40', which does not fit its declared type float"),
        ("dims", {"w": "wide"}, "'dims.w' holds 'wide', which does not fit its declared type int32"),
    ]
    values = [envelope("c", 1, None, good, ROW)]
    values += [envelope("c", 2 + i, None, {**good, "id": 2 + i, name: v}, ROW) for i, (name, v, _) in enumerate(bad)]
    out = read_envelope(frame(spark, values), rejects="mark")
    got = refusals(out)
    assert sorted(got) == list(range(1, len(bad) + 1))
    for offset, (_, _, message) in enumerate(bad, start=1):
        assert message in got[offset], (offset, got[offset])
    # Through the sink: the batch fails naming the field, the value and the event; nothing is committed.
    s = sink(tmp_path / "lake")
    with pytest.raises(InvalidInputError, match=r"'qty' holds '3000000000'.*topic items partition 0 offset 1"):
        s.write(frame(spark, values[:2]), checkpoint_location=str(tmp_path / "ckpt"))
    table = s.load_table()
    assert table.current_snapshot() is None


def test_names_spark_would_substitute_are_read_and_written_as_given(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """Spark replaces ``${...}`` in SQL text (``${x}``: "", ``${env:HOME}``: the home directory), and
    the reader's expressions are SQL text: columns and nested fields named with it, beside decoys named
    as the substitution, are read and written under their own names; a refusal names its field as
    given, never the driver's environment."""
    home = os.environ["HOME"]
    row = [
        field("id", "int64"),
        field("price_${currency}", "int32"),
        field("price_", "int32"),
        field(f"h{home}", "string"),
        field("h${env:HOME}", "string"),
        {
            "type": "struct",
            "field": "geo${x}",
            "optional": True,
            "fields": [field("a${y}", "int32"), field("a", "int32")],
        },
        {"type": "struct", "field": "geo", "optional": True, "fields": [field("a", "int32")]},
    ]
    images = [
        {
            "id": i,
            "price_${currency}": i,
            "price_": -i,
            f"h{home}": "decoy",
            "h${env:HOME}": f"v{i}",
            "geo${x}": {"a${y}": 10 * i, "a": -1},
            "geo": {"a": -2},
        }
        for i in range(1, 4)
    ]
    values = [envelope("c", i, None, image, row) for i, image in enumerate(images, start=1)]
    values.append(envelope("u", 9, None, {**images[0], "price_${currency}": 3_000_000_000}, row))
    refused = refusals(read_envelope(frame(spark, values), rejects="mark"))
    assert refused == {3: "field 'price_${currency}' holds '3000000000', which does not fit its declared type int32"}

    s = sink(tmp_path / "lake")
    s.write(frame(spark, values[:3]), checkpoint_location=str(tmp_path / "ckpt"))
    columns = ["id", "price_${currency}", "price_", "h${env:HOME}", f"h{home}", "geo${x}"]
    got = read_back(java_reader, s, columns)
    assert got == [
        {
            "id": i,
            "price_${currency}": i,
            "price_": -i,
            "h${env:HOME}": f"v{i}",
            f"h{home}": "decoy",
            "geo${x}": {"a${y}": 10 * i, "a": -1},
        }
        for i in range(1, 4)
    ]


def test_input_columns_named_with_dots_are_those_columns_not_nested_fields(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """``value_column=``, ``keep=`` and ``key_from=`` name columns of the DataFrame (checked against
    ``df.columns``), and a dot is part of such a name. Beside struct columns ``my`` and ``kafka`` whose
    nested fields those names would select as paths (decoys holding other events and keys), the
    named columns are read: by read_envelope (and its ``table_column=``, ``op_column=`` outputs
    named with dots), by read_json, and by the sink."""
    row = [field("id", "int64"), field("name", "string")]
    real = [envelope("c", i, None, {"id": i, "name": f"n{i}"}, row) for i in range(1, 4)]
    decoy = [envelope("c", i, None, {"id": 100 + i, "name": "decoy"}, row) for i in range(1, 4)]
    ddl = (
        "`my.value` string, `kafka.key` string, `off.set` int, "
        "my struct<value: string>, kafka struct<key: string>, topic string, partition int, offset long"
    )
    records = [
        (v, json.dumps({"id": i}), i, (d,), (json.dumps({"name": i}),), "t", 0, i)
        for i, (v, d) in enumerate(zip(real, decoy, strict=True), start=1)
    ]
    df = spark.createDataFrame(records, ddl)
    out = read_envelope(
        df,
        value_column="my.value",
        keep=["kafka.key", "off.set"],
        key_from="kafka.key",
        table_column="src.table",
        op_column="op.code",
    )
    plain = read_envelope(frame(spark, real)).select("source_table").first()
    assert plain is not None
    got = sorted(
        (r["id"], r["name"], r["kafka.key"], r["off.set"], r["op.code"], r["src.table"], list(r["key_columns"]))
        for r in out.collect()
    )
    assert got == [(i, f"n{i}", json.dumps({"id": i}), i, "c", plain["source_table"], ["id"]) for i in range(1, 4)]

    texts = spark.createDataFrame(
        [('{"a": 1}', 5, ('{"a": 2}',), (99,))], "`j.s` string, `k.k` int, j struct<s: string>, k struct<k: int>"
    )
    assert [r.asDict() for r in read_json(texts, "j.s", keep=["k.k"]).collect()] == [{"k.k": 5, "a": 1}]

    s = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.items")
        .create_if_missing()
        .debezium(value_column="my.value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    s.write(df, checkpoint_location=str(tmp_path / "ckpt"))
    assert read_back(java_reader, s, ["id", "name"]) == [{"id": i, "name": f"n{i}"} for i in range(1, 4)]


@pytest.mark.parametrize("with_schema", [True, False], ids=["schema", "schemaless"])
def test_columns_whose_names_differ_only_in_case_are_refused_naming_them(
    spark: SparkSession, tmp_path: Path, with_schema: bool
) -> None:
    """PostgreSQL can hold columns "Name" and name; no table can (readers that ignore case, Spark by
    default and DuckDB, could not tell them apart), nor beside a column the reader adds (op). The batch
    fails naming them, before anything is committed (it was Spark's ambiguous-reference error)."""
    cases = [
        (["Name", "name"], "columns 'Name' and 'name' differ only in case"),
        (["OP"], r"source columns \['OP'\] clash with the columns it adds"),
    ]
    for extra, message in cases:
        row = [field("id", "int64"), *[field(c, "string") for c in extra]]
        image = {"id": 1, **{c: c.lower() + c for c in extra}}
        values = [envelope("c", 1, None, image, row if with_schema else None)]
        s = sink(tmp_path / "lake", table=f"cdc.t{len(extra)}")
        with pytest.raises(InvalidInputError, match=message):
            s.write(frame(spark, values), checkpoint_location=str(tmp_path / f"ckpt{len(extra)}"))
        with pytest.raises(InvalidSinkConfigError, match="does not exist yet"):
            s.load_table()  # nothing was created, let alone committed


LOGICAL = [
    field("id", "int64"),
    field("price", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "10"}),
    field("amount", "bytes", "org.apache.kafka.connect.data.Decimal", scale="3"),
    {
        "type": "struct",
        "field": "exact",
        "optional": True,
        "name": "io.debezium.data.VariableScaleDecimal",
        "fields": [field("scale", "int32"), field("value", "bytes")],
    },
    field("day", "int32", "io.debezium.time.Date"),
    field("cday", "int32", "org.apache.kafka.connect.data.Date"),
    field("at", "int64", "io.debezium.time.MicroTimestamp"),
    field("at_ms", "int64", "io.debezium.time.Timestamp"),
    field("at_ns", "int64", "io.debezium.time.NanoTimestamp"),
    field("zoned", "string", "io.debezium.time.ZonedTimestamp"),
    field("clock", "int64", "io.debezium.time.MicroTime"),
    field("clock_ms", "int32", "org.apache.kafka.connect.data.Time"),
    field("uid", "string", "io.debezium.data.Uuid"),
    field("doc", "string", "io.debezium.data.Json"),
    field("mood", "string", "io.debezium.data.Enum"),
]


def logical_row(i: int, price: str, amount: str, exact: tuple[int, str]) -> dict[str, Any]:
    return {
        "id": i,
        "price": decimal_bytes(Decimal(price), 2),
        "amount": decimal_bytes(Decimal(amount), 3),
        "exact": {"scale": exact[0], "value": decimal_bytes(Decimal(exact[1]), exact[0])},
        "day": 19_000 + i,
        "cday": -1,
        "at": 1_700_000_000_123_456 + i,
        "at_ms": 1_700_000_000_123,
        "at_ns": 1_700_000_000_123_456_789,
        "zoned": "2024-03-10T10:30:00.5+02:00",
        "clock": 3_723_000_001,
        "clock_ms": 3_723_001,
        "uid": "6f1d0a3e-8a1c-4c4f-9a51-6d0a7c1e2b3f",
        "doc": '{"a": [1, 2]}',
        "mood": "happy",
    }


def test_logical_types_become_the_iceberg_types_a_user_expects(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    rows = [
        logical_row(1, "12345678.90", "0.001", (3, "-0.500")),
        logical_row(2, "-12345678.99", "-98765432109876543210.123", (0, "42")),
        logical_row(3, "0.00", "127.000", (5, "1.00001")),
    ]
    s = sink(tmp_path / "lake")
    s.write(
        frame(spark, [envelope("c", r["id"], None, r, LOGICAL) for r in rows]), checkpoint_location=str(tmp_path / "c")
    )
    schema = s.load_table().schema()
    expected_types = {
        "price": DecimalType(10, 2),
        "amount": DecimalType(38, 3),
        "exact": StringType(),
        "day": DateType(),
        "cday": DateType(),
        "at": TimestampType(),
        "at_ms": TimestampType(),
        "at_ns": TimestampType(),
        "zoned": TimestamptzType(),
        "clock": LongType(),
        "clock_ms": LongType(),
        "uid": StringType(),
        "doc": StringType(),
        "mood": StringType(),
    }
    assert {n: schema.find_field(n).field_type for n in expected_types} == expected_types
    got = read_back(java_reader, s, ["id", *expected_types])
    epoch = dt.date(1970, 1, 1)
    assert got == [
        {
            "id": r["id"],
            "price": Decimal(p),
            "amount": Decimal(a),
            "exact": e,
            "day": epoch + dt.timedelta(days=19_000 + r["id"]),
            "cday": dt.date(1969, 12, 31),
            "at": dt.datetime(2023, 11, 14, 22, 13, 20, 123_456 + r["id"]),
            "at_ms": dt.datetime(2023, 11, 14, 22, 13, 20, 123_000),
            "at_ns": dt.datetime(2023, 11, 14, 22, 13, 20, 123_456),
            "zoned": dt.datetime(2024, 3, 10, 8, 30, 0, 500_000, tzinfo=dt.UTC),
            "clock": 3_723_000_001,
            "clock_ms": 3_723_001_000,
            "uid": "6f1d0a3e-8a1c-4c4f-9a51-6d0a7c1e2b3f",
            "doc": '{"a": [1, 2]}',
            "mood": "happy",
        }
        for r, p, a, e in zip(
            rows,
            ["12345678.90", "-12345678.99", "0.00"],
            ["0.001", "-98765432109876543210.123", "127.000"],
            ["-0.500", "42", "1.00001"],
            strict=True,
        )
    ]
    # A value wider than its declared precision is refused, not nulled.
    wide = logical_row(4, "123456789.00", "1", (0, "1"))
    marked = refusals(read_envelope(frame(spark, [envelope("c", 4, None, wide, LOGICAL)]), rejects="mark"))
    assert "'price' holds" in marked[0] and "decimal(10,2)" in marked[0]


def test_truncate_message_and_garbage_events_are_refused_naming_the_reason_and_the_event(
    spark: SparkSession, tmp_path: Path, ansi_mode: bool
) -> None:
    values = [
        envelope("c", 1, None, {"id": 1, "name": "a"}),
        "this is not json",
        envelope("u", 2, {"id": 1}, None),
        envelope("d", 3, None, None),
        envelope("c", "abc", None, {"id": 2, "name": "b"}),
        envelope("x", 4, None, {"id": 3, "name": "c"}),
        envelope("t", 5, None, None),
        envelope("m", 6, None, None),
    ]
    got = refusals(read_envelope(frame(spark, values), rejects="mark"))
    assert got == {
        1: "value is not JSON",
        2: "update without after",
        3: "delete without before",
        4: "order value 'abc' at source.lsn is not a long",
        5: "unknown op 'x'; expected one of c, r, u, d, t, m",
        6: "truncate event (op 't') refused by truncate='fail'; pass truncate='apply' to empty the table at that "
        "point, or truncate='skip' to ignore truncates",
    }  # the message event (offset 7) is skipped
    skipped = read_envelope(frame(spark, [values[0], values[6], values[7]]), truncate="skip", rejects="mark")
    assert [(r["id"], r["op"]) for r in skipped.collect()] == [(1, "c")]
    assert refusals(skipped) == {}
    with pytest.raises(InvalidInputError, match=r"truncate='fail'.*\(event: topic items partition 0 offset 1\)"):
        sink(tmp_path / "lake").write(frame(spark, [values[0], values[6]]), checkpoint_location=str(tmp_path / "c"))
    with pytest.raises(InvalidInputError, match=r"value is not JSON \(event: topic items partition 0 offset 1\)"):
        sink(tmp_path / "lake").write(frame(spark, values[:2]), checkpoint_location=str(tmp_path / "c"))
    with pytest.raises(Exception, match="truncate"):
        IcebergSink.builder().debezium(truncate="drop")


def test_the_whole_value_is_parsed_again_only_for_an_event_refused_either_way(spark: SparkSession) -> None:
    """sources/envelope.py checks that a value is JSON only for an event whose payload is no object:
    JSON that is no object (an envelope inside an array, a string) and a value cut short after a
    whole payload are refused with the reasons they had; where a key repeats, its first value is read
    (get_json_object's)."""
    fields = [field("id", "int64"), field("name", "string")]
    good = envelope("c", 1, None, {"id": 1, "name": "a"}, fields)
    doc = json.loads(good)
    first = json.loads(envelope("c", 1, None, {"id": 9, "name": "first"}, fields))["payload"]
    repeated = (
        f'{{"payload": {json.dumps(first)}, "schema": {json.dumps(doc["schema"])}, '
        f'"payload": {json.dumps(doc["payload"])}}}'
    )
    values = [good, json.dumps([doc]), good[:-1] + ', "tail": }', '"text"', repeated]
    read = read_envelope(frame(spark, values), rejects="mark", table_column=None, keep=["offset"])
    assert refusals(read) == {1: "value is not a JSON object", 2: "value is not JSON", 3: "value is not a JSON object"}
    rows = read.where(read[REJECT_COLUMN].isNull()).select("offset", "id", "name").orderBy("offset").collect()
    assert [tuple(r) for r in rows] == [(0, 1, "a"), (4, 9, "first")]


def test_a_placeholder_only_a_schema_part_names_is_none(spark: SparkSession) -> None:
    """The TOAST placeholder is looked for in the payload, where the row images are (sources/envelope.py
    ``_per_event``): a schema part naming it (a column's default) leaves the batch's statistics plain,
    so the next batch is planned on them; a row image holding it does not."""
    fields = [field("id", "int64"), {**field("name", "string"), "default": UNAVAILABLE_VALUE}]
    named = envelope("c", 1, None, {"id": 1, "name": "a"}, fields)
    held = envelope("u", 2, {"id": 1, "name": "a"}, {"id": 1, "name": UNAVAILABLE_VALUE}, fields)
    for values, plain in (([named], True), ([named, held], False)):
        last = LastCounts()
        with reading_batch(plan=True):
            read_envelope(frame(spark, values), rejects="mark", table_column=None, last_counts=last).collect()
        with reading_batch(plan=True):
            assert (last.plan_on() is not None) is plain, values


@pytest.mark.parametrize("truncate", ["fail", "skip", "apply"])
def test_a_batch_without_row_events_commits_nothing_and_keeps_the_table(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, truncate: str
) -> None:
    """A batch of message events and tombstones only (and, under "skip", a truncate) has no row
    document to infer columns from, so it lacks even the key column: it must pass as an empty
    checkpoint, before the table exists and after (found by the model check, seed 202: it was a
    SchemaMismatchError "id: column is required in the table but missing")."""
    s = sink(tmp_path / "lake", truncate=truncate)
    checkpoint = str(tmp_path / "c")
    rowless = [envelope("m", 1, None, None), None]
    s.write(frame(spark, rowless), checkpoint_location=checkpoint)  # no table yet: nothing to create
    s.write(frame(spark, [envelope("c", 2, None, {"id": 1, "name": "a"})]), checkpoint_location=checkpoint)
    if truncate == "skip":
        rowless.insert(1, envelope("t", 3, None, None))
    table = s.load_table()
    snapshots = len(table.metadata.snapshots)
    s.write(frame(spark, rowless), checkpoint_location=checkpoint)
    assert len(s.load_table().metadata.snapshots) == snapshots, "an empty checkpoint commits no snapshot"
    assert read_back(java_reader, s, ["id", "name"]) == [{"id": 1, "name": "a"}]


def test_toast_placeholder_keeps_the_stored_value(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """PostgreSQL's connector sends ``__debezium_unavailable_value`` for an unchanged TOASTed column;
    before, the sink stored the placeholder over the value."""
    s = sink(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [envelope("c", 1, None, {"id": 1, "doc": "long text", "n": 1})]), checkpoint_location=ckpt)
    update = envelope(
        "u", 2, {"id": 1, "doc": "long text", "n": 1}, {"id": 1, "doc": "__debezium_unavailable_value", "n": 2}
    )
    s.write(frame(spark, [update]), checkpoint_location=ckpt)
    assert read_back(java_reader, s, ["id", "doc", "n"]) == [{"id": 1, "doc": "long text", "n": 2}]
    # Without the old value in the event (REPLICA IDENTITY DEFAULT) the sink reads the stored row
    # (tests/integration/test_debezium_toast.py has the rest).
    blind = envelope("u", 3, {"id": 1}, {"id": 1, "doc": "__debezium_unavailable_value", "n": 3})
    s.write(frame(spark, [blind]), checkpoint_location=ckpt)
    assert read_back(java_reader, s, ["id", "doc", "n"]) == [{"id": 1, "doc": "long text", "n": 3}]
    # read_envelope called directly has no table to read: it refuses the event, naming the column.
    with pytest.raises(Exception, match="column 'doc' holds Debezium's placeholder"):
        read_envelope(frame(spark, [blind])).collect()


def test_routed_names_keep_same_named_tables_of_two_schemas_apart(spark: SparkSession) -> None:
    a = envelope("c", 1, None, {"id": 1}, source={"schema": "sales"})
    b = envelope("c", 2, None, {"id": 1}, source={"schema": "hr"})
    c = envelope("c", 3, None, {"id": 2}, source={"schema": "hr", "table": "pay_roll"})
    d = envelope("c", 4, None, {"id": 3})  # public: the table's own name
    out = read_envelope(frame(spark, [a, b, c, d]), rejects="mark")
    assert sorted(r["source_table"] for r in out.collect()) == ["hr__items", "hr__pay_roll", "items", "sales__items"]
    assert refusals(out) == {}
    # The earlier default, named: database, schema and table, each _ doubled, joined with _s_.
    fields = ("db", "schema", "table")
    earlier = read_envelope(frame(spark, [a, c]), table_fields=fields, rejects="mark")
    assert sorted(r["source_table"] for r in earlier.collect()) == [
        "inventory_s_hr_s_pay__roll",
        "inventory_s_sales_s_items",
    ]
    # Called directly, a mapping that sends two sources to one table is refused, naming both (a
    # routed sink holds each table to one source itself: tests/integration/test_routed_names.py).
    both = r"inventory\.(hr|sales)\.items and inventory\.(hr|sales)\.items"
    with pytest.raises(
        Exception, match=rf"routed table name 'items' is the name of two sources in this batch \({both}\)"
    ):
        read_envelope(frame(spark, [a, b]), table_fields=("table",)).collect()


def test_order_by_several_paths_orders_lexicographically_and_warns_of_unordered_events(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    """MySQL orders by binlog file, position and row; an event without an order value is counted."""

    def mysql(op: str, file: str, pos: int, row: int, after: dict[str, Any]) -> str:
        return envelope(op, None, None, after, source={"file": file, "pos": pos, "row": row})

    values = [
        mysql("c", "mysql-bin.000010", 4, 0, {"id": 1, "v": "newest"}),
        mysql("c", "mysql-bin.000009", 900, 1, {"id": 1, "v": "older"}),
        mysql("c", "mysql-bin.000010", 4, 1, {"id": 2, "v": "x"}),
        envelope("c", None, None, {"id": 3, "v": "unordered"}),
    ]
    with caplog.at_level(logging.WARNING, logger="iceberg_sink"):
        out = read_envelope(
            frame(spark, values),
            order_by=["source.file", "source.pos", "source.row"],
            order_type=["string", "long", "long"],
            order_column="pos",
        )
    assert "1 of 4 Debezium events of this batch have no order value" in caplog.text
    rows = sorted(out.collect(), key=lambda r: (r["pos"] is None, r["pos"] or ()))
    assert [r["v"] for r in rows] == ["older", "newest", "x", "unordered"]
    assert out.schema["pos"].dataType.simpleString() == "struct<source_file:string,source_pos:bigint,source_row:bigint>"


def test_binlog_file_names_order_by_their_sequence_number_past_six_digits(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """After ``mysql-bin.999999`` MySQL and MariaDB write ``mysql-bin.1000000``, which sorts first as
    text: a key changed on both sides of the rollover in one batch kept its older value. The binlog
    order type orders by the number; a file name without one is refused, naming it."""

    def mysql(op: str, file: str, pos: int, row: int, before: Any, after: Any) -> str:
        return envelope(op, None, before, after, source={"file": file, "pos": pos, "row": row})

    values = [
        mysql("c", "mysql-bin.999999", 900, 0, None, {"id": 1, "v": "older"}),
        mysql("u", "mysql-bin.1000000", 4, 0, {"id": 1, "v": "older"}, {"id": 1, "v": "newest"}),
        mysql("c", "mysql-bin.1000000", 4, 1, None, {"id": 2, "v": "kept"}),
        mysql("d", "mysql-bin.1000001", 4, 0, {"id": 3, "v": None}, None),
        mysql("c", "mysql-bin.999998", 4, 0, None, {"id": 3, "v": "deleted later"}),
    ]
    paths = ["source.file", "source.pos", "source.row"]
    out = read_envelope(frame(spark, values), order_by=paths, order_type=["binlog", "long", "long"])
    assert out.schema["lsn"].dataType.simpleString() == "struct<source_file:bigint,source_pos:bigint,source_row:bigint>"
    ordered = [(r["id"], r["op"]) for r in out.orderBy("lsn").collect()]
    assert ordered == [(3, "c"), (1, "c"), (1, "u"), (2, "c"), (3, "d")]

    s = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.binlog")
        .create_if_missing()
        .debezium(value_column="value", table_column=None, order_by=paths, order_type=["binlog", "long", "long"])
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    s.write(frame(spark, values), checkpoint_location=str(tmp_path / "ckpt"))
    assert read_back(java_reader, s, ["id", "v"]) == [{"id": 1, "v": "newest"}, {"id": 2, "v": "kept"}]

    bad = [mysql("c", name, 4, 0, None, {"id": 1, "v": "x"}) for name in ("mysql-bin", "mysql-bin.", "bin.12a")]
    marked = read_envelope(
        frame(spark, bad), order_by=paths, order_type=["binlog", "long", "long"], rejects="mark", table_column=None
    )
    assert sorted(refusals(marked).values()) == [
        f"order value '{name}' at source.file is not a binlog file name (a name, a dot and its sequence number: "
        "mysql-bin.000042)"
        for name in ("bin.12a", "mysql-bin", "mysql-bin.")
    ]
    for order_type in ("lnog", ["binlog", "long"], ["binlog", 5, "long"]):
        with pytest.raises(InvalidInputError, match=r"order_type") as raised:
            read_envelope(frame(spark, values), order_by=paths, order_type=order_type)  # type: ignore[arg-type]
        assert repr(order_type) in str(raised.value)


def test_a_table_ordered_by_binlog_file_text_switches_to_the_binlog_type_under_a_new_column(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """docs/cdc.md "MariaDB and MySQL": a table written with the file name as text refuses the binlog
    type's long in the same column, naming it, before anything is committed; a new order column
    (add-columns) takes it, the old one null for new rows."""

    def mysql(op: str, file: str, pos: int, before: Any, after: Any) -> str:
        return envelope(op, None, before, after, source={"file": file, "pos": pos, "row": 0})

    paths = ["source.file", "source.pos", "source.row"]

    def binlog_sink(order_type: str, order_column: str) -> IcebergSink:
        return (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("cdc.switch")
            .create_if_missing()
            .debezium(
                table_column=None, order_by=paths, order_type=[order_type, "long", "long"], order_column=order_column
            )
            .cdc(op_column="op", key=["id"], order_by=order_column)
            .schema_evolution("add-columns")
            .build()
        )

    checkpoint = str(tmp_path / "ckpt")
    binlog_sink("string", "binlog").write(
        frame(spark, [mysql("c", "b.000001", 4, None, {"id": 1, "v": "a"})]), checkpoint
    )
    second = frame(spark, [mysql("u", "b.000002", 4, {"id": 1, "v": "a"}, {"id": 1, "v": "b"})])
    switched = binlog_sink("binlog", "binlog")
    snapshots = len(switched.load_table().snapshots())
    with pytest.raises(
        SchemaMismatchError, match=r"binlog\.source_file: table type string cannot take DataFrame type long"
    ):
        switched.write(second, checkpoint)
    assert len(switched.load_table().snapshots()) == snapshots
    renamed = binlog_sink("binlog", "binlog_position")
    renamed.write(second, checkpoint)
    got = read_back(java_reader, renamed, ["id", "v", "binlog", "binlog_position"])
    assert got == [
        {"id": 1, "v": "b", "binlog": None, "binlog_position": {"source_file": 2, "source_pos": 4, "source_row": 0}}
    ]


def test_a_filter_on_refusals_keeps_the_plan_the_size_it_was_written(spark: SparkSession) -> None:
    """A filter on the refusal mark (fail-fast, dead letters) must not be pushed down through the
    conversions: Spark would copy every check and conversion into it, level by level (a real 22-column
    MariaDB table took 40 s to plan a 15-event batch, its optimized plan 30 times the analyzed one;
    these four columns, as Debezium's MariaDB connector declares them, gave 5 times)."""
    columns = [
        field("id", "int64"),
        field("name", "string"),
        field("qty", "int16"),
        field(
            "price", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "10"}
        ),
    ]
    rows = [{"id": i, "name": f"n{i}", "qty": i, "price": decimal_bytes(Decimal("1.25") * i, 2)} for i in (1, 2)]
    values = [envelope("c", r["id"], None, r, columns) for r in rows]

    def sizes(df: DataFrame) -> tuple[int, int]:
        execution = df._jdf.queryExecution()
        return len(execution.analyzed().toString()), len(execution.optimizedPlan().toString())

    # No source table column: its name-collision check is a window, which the optimizer does not push through.
    marked = read_envelope(frame(spark, values), table_column=None, rejects="mark")
    for df in (marked.where(marked[REJECT_COLUMN].isNull()), read_envelope(frame(spark, values), table_column=None)):
        analyzed, optimized = sizes(df)
        assert optimized < 2 * analyzed, (analyzed, optimized)
        assert sorted((r["id"], r["price"]) for r in df.collect()) == [(1, Decimal("1.25")), (2, Decimal("2.50"))]


def test_the_connectors_schema_changes_transactions_and_heartbeats_are_skipped(spark: SparkSession) -> None:
    """What Debezium's connectors send beside change events (the shapes of Debezium 3.5's MariaDB
    connector; tests/integration/test_debezium_mariadb.py has the real ones), with and without the
    schema part: skipped, never refused. An event without op that is none of them is still refused."""
    source = {"connector": "mariadb", "name": "maria", "db": "shop", "table": "items", "file": "binlog.000001"}
    schema_change = {
        "source": source,
        "ts_ms": 1,
        "databaseName": "shop",
        "schemaName": None,
        "ddl": "ALTER TABLE items ADD COLUMN note varchar(10)",
        "tableChanges": [{"type": "ALTER", "id": '"shop"."items"', "table": {"columns": []}}],
    }
    begin = {"status": "BEGIN", "id": "0-1-27", "event_count": None, "data_collections": None, "ts_ms": 1}
    end = {**begin, "status": "END", "event_count": 2, "data_collections": [{"data_collection": "shop.items"}]}
    heartbeat = {"ts_ms": 1795819156451}
    names = {
        "schema_change": "io.debezium.connector.mariadb.SchemaChangeValue",
        "begin": "io.debezium.connector.common.TransactionMetadataValue",
        "end": "io.debezium.connector.common.TransactionMetadataValue",
        "heartbeat": "io.debezium.connector.common.Heartbeat",
    }
    payloads = {"schema_change": schema_change, "begin": begin, "end": end, "heartbeat": heartbeat}
    values = [json.dumps(p) for p in payloads.values()]
    values += [
        json.dumps({"schema": {"type": "struct", "fields": [], "name": names[k]}, "payload": p})
        for k, p in payloads.items()
    ]
    values += [envelope("c", 1, None, {"id": 1, "v": "kept"})]
    values += [json.dumps({"ts_ms": 1, "other": 2}), json.dumps({"status": "BEGIN"})]  # not Debezium's: refused
    out = read_envelope(frame(spark, values), rejects="mark")
    assert [r["id"] for r in out.where(out[REJECT_COLUMN].isNull()).collect()] == [1]
    refused = refusals(out)
    assert sorted(refused) == [9, 10] and all(r.startswith("event has no op") for r in refused.values()), refused


def test_a_wide_schemas_conversions_take_few_round_trips_and_later_batches_reuse_them(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row image's conversions and checks are built as SQL text, parsed by the JVM once per column
    returned (iceberg_sink/_sql_expr.py), and kept per schema for later batches: built through Py4J
    Column calls, tens of round trips per column made a wide table slow whatever its batches' size
    (160 columns: 77,000 round trips and 16 s for the first batch; 80 columns: 118,000 per batch before
    they were kept), also when each batch comes in a session object of its own, as ``foreachBatch``
    hands micro-batches over. Counted, not timed."""
    from py4j.java_gateway import GatewayClient

    columns = [field("id", "int64")] + [
        field(
            f"w{i}", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "9"}
        )
        for i in range(30)
    ]

    def batch(first: int) -> DataFrame:
        rows = [
            {"id": i, **{f"w{j}": decimal_bytes(Decimal(i) + Decimal("0.25"), 2) for j in range(30)}}
            for i in (first, first + 1)
        ]
        return frame(spark, [envelope("c", r["id"], None, r, columns) for r in rows])

    calls = 0
    send = GatewayClient.send_command

    def counted(client: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return send(client, *args, **kwargs)

    def round_trips(df: DataFrame) -> tuple[DataFrame, int]:
        nonlocal calls
        calls = 0
        monkeypatch.setattr(GatewayClient, "send_command", counted)
        out = read_envelope(df, table_column=None)
        monkeypatch.undo()
        return out, calls

    one, two = batch(1), batch(3)
    first, built_first = round_trips(one)
    assert sorted(r["w29"] for r in first.collect()) == [Decimal("1.25"), Decimal("2.25")]
    # As foreachBatch hands it over: the micro-batch in a session object of its own, the same JVM session.
    second, built = round_trips(DataFrame(two._jdf, SparkSession(spark.sparkContext, spark._jsparkSession)))
    assert sorted(r["w29"] for r in second.collect()) == [Decimal("3.25"), Decimal("4.25")]
    # Through Column calls: 42,000 for the first batch, and for every batch before they were kept.
    assert built_first < 5000, built_first
    assert built < 5000, built
