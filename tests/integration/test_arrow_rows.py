"""The Arrow reader of Debezium row images (sources/arrow_rows.py) against Spark's expressions.

Drawn schema parts (every Connect type and logical type the Arrow reader reads, parts that widen one
another's columns) and drawn values (clean ones and hostile ones: out of range, another JSON kind,
not finite, halfway between two floats, base64 that is not canonical, wider than a decimal's
precision, zoned timestamps in other forms, duplicate keys) are read both ways. Wherever the Arrow
reader reads an event, Spark's reader must read the same values and refuse nothing; every clean event
must be read by the Arrow reader (so a reader that leaves everything to Spark fails too).
"""

from __future__ import annotations

import base64
import json
import math
import random
import struct
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from iceberg_sink.sources.arrow_rows import RowReader, row_reader
from iceberg_sink.sources.debezium import _row_schema, _row_schema_from_envelopes, read_envelope
from iceberg_sink.vocab.columns import REJECT_COLUMN

DATE, DECIMAL = "io.debezium.time.Date", "org.apache.kafka.connect.data.Decimal"
TIMES = ["org.apache.kafka.connect.data.Time", "io.debezium.time.MicroTime", "io.debezium.time.NanoTime"]
STAMPS = [
    "org.apache.kafka.connect.data.Timestamp",
    "io.debezium.time.MicroTimestamp",
    "io.debezium.time.NanoTimestamp",
]
ZONED = "io.debezium.time.ZonedTimestamp"


class Raw:
    """JSON text written into an image as is (numbers json.dumps cannot write)."""

    def __init__(self, text: str) -> None:
        self.text = text


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unscaled(n: int, extra: int = 0) -> str:
    size = max(1, (n.bit_length() + 8) // 8) + extra
    return _b64(n.to_bytes(size, "big", signed=True))


def _float32_halfway(rng: random.Random) -> float:
    f = struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]
    bits = struct.unpack("<i", struct.pack("<f", f))[0]
    g = struct.unpack("<f", struct.pack("<i", bits + 1))[0]
    return (f + g) / 2


def _zoned(rng: random.Random, digits: int | None = None) -> str:
    digits = rng.choice([0, 1, 3, 6]) if digits is None else digits
    fraction = "." + "".join(rng.choice("0123456789") for _ in range(digits)) if digits else ""
    zone = rng.choice(["Z", "+00:00", "+05:30", "-08:00", "+14:00"])
    return (
        f"{rng.randrange(1, 10000):04d}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        f"T{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}{fraction}{zone}"
    )


def kinds(rng: random.Random) -> list[tuple[str, dict[str, Any], Any, Any]]:
    """(kind, Connect schema, clean value drawer, hostile value drawer)."""
    precision = rng.randrange(1, 39)
    scale = rng.randrange(0, precision + 1)
    limit = 10**precision
    i32, i64 = 2**31, 2**63
    time, stamp = rng.choice(TIMES), rng.choice(STAMPS)
    stamp_unit = {STAMPS[0]: 1, STAMPS[1]: 1000, STAMPS[2]: 1_000_000}[stamp]
    return [
        (
            "int32",
            {"type": rng.choice(["int8", "int16", "int32"])},
            lambda: rng.choice([rng.randrange(-i32, i32), -i32, i32 - 1, 0, 300]),
            lambda: rng.choice([i32, -i32 - 1, 5.0, "5", True, Raw("1e3")]),
        ),
        (
            "int64",
            {"type": "int64"},
            lambda: rng.choice([rng.randrange(-i64, i64), -i64, i64 - 1, 0]),
            lambda: rng.choice([i64, -i64 - 1, 1.5, "x", False]),
        ),
        (
            "float",
            {"type": rng.choice(["float", "float32"])},
            lambda: rng.choice(
                [rng.uniform(-1e6, 1e6), rng.randrange(-1000, 1000), 0.1, -0.0, 3.4e38, 1e-46, 1e-40, 2**53]
            ),
            lambda: rng.choice([1e39, "NaN", Raw("NaN"), Raw("Infinity"), 2**60, _float32_halfway(rng), "1.5"]),
        ),
        (
            "double",
            {"type": rng.choice(["double", "float64"])},
            lambda: rng.choice([rng.uniform(-1e300, 1e300), rng.random(), -0.0, 5e-324, 1.7976931348623157e308, 2**53]),
            lambda: rng.choice([Raw("NaN"), Raw("-Infinity"), Raw("1e400"), "1.5", 2**60 + 1, True]),
        ),
        ("boolean", {"type": "boolean"}, lambda: rng.random() < 0.5, lambda: rng.choice(["true", 1, 0, "false"])),
        (
            "string",
            {"type": "string"},
            lambda: rng.choice(["", "plain", 'quote " and \\ back', "é 😀 \u0000 \t", "line\nbreak", '{"a": 1}']),
            lambda: rng.choice([5, {"a": 1}, [1, 2], True, 1.5]),
        ),
        (
            "bytes",
            {"type": "bytes"},
            lambda: _b64(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 9)))),
            lambda: rng.choice(["!!", "QQ", "QR==", "Q Q==", 5]),
        ),
        (
            "decimal",
            {
                "type": "bytes",
                "name": DECIMAL,
                "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
            },
            lambda: rng.choice([_unscaled(rng.randrange(-limit + 1, limit), rng.choice([0, 0, 1])), "", _unscaled(0)]),
            lambda: rng.choice([_unscaled(limit), _unscaled(-limit), "not base64!", 12]),
        ),
        (
            "date",
            {"type": rng.choice(["int32", "int64"]), "name": DATE},
            lambda: rng.choice([rng.randrange(-1_000_000, 1_000_000), 0, 19000]),
            lambda: rng.choice([i32, "2020-01-01", 1.5]),
        ),
        (
            "time",
            {"type": "int32" if time == TIMES[0] else "int64", "name": time},
            lambda: rng.choice([rng.randrange(0, 86_400_000), 0, rng.randrange(-(2**31), 2**31)]),
            lambda: rng.choice([1.5, "10:00", i64 if time != TIMES[0] else i32]),
        ),
        (
            "timestamp",
            {"type": "int64", "name": stamp},
            lambda: rng.choice([rng.randrange(-(10**11), 10**11) * stamp_unit, 1_700_000_000_000 * stamp_unit, -1, 0]),
            lambda: rng.choice([i64 - 1, 1.5, "2020-01-01T00:00:00"]),
        ),
        (
            "zoned",
            {"type": "string", "name": ZONED},
            lambda: _zoned(rng),
            lambda: rng.choice([_zoned(rng, 9), "2020-01-01T10:00:00", "2020-02-30T10:00:00Z", "garbage", 5]),
        ),
    ]


def _widened(schema: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The same column in another part, perhaps widened as a source's ALTER would."""
    if rng.random() < 0.5:
        return schema
    kind = schema["type"]
    if kind in ("int8", "int16", "int32") and "name" not in schema:
        return {**schema, "type": "int64"}
    if kind in ("float", "float32"):
        return {**schema, "type": "double"}
    if schema.get("name") == DECIMAL:
        params = dict(schema["parameters"])
        params["connect.decimal.precision"] = str(min(38, int(params["connect.decimal.precision"]) + 2))
        return {**schema, "parameters": params}
    return schema


def _image(values: dict[str, Any]) -> str:
    parts = []
    for name, value in values.items():
        text = value.text if isinstance(value, Raw) else json.dumps(value)
        parts.append(f"{json.dumps(name)}: {text}")
    return "{" + ", ".join(parts) + "}"


def draw_batch(seed: int, hostile_share: float) -> tuple[list[str], list[bool]]:
    """Envelopes of one batch (two or three schema parts) and, per event, whether it is clean."""
    rng = random.Random(seed)
    columns = {f"c{i}": kinds(rng)[rng.randrange(12)] for i in range(rng.randrange(2, 14))}
    rows = []
    for _ in range(rng.randrange(2, 4)):
        fields = [{"type": "int64", "optional": False, "field": "id"}]
        for name, (_, schema, _, _) in columns.items():
            if rng.random() < 0.85:
                fields.append({**_widened(schema, rng), "optional": True, "field": name})
        rows.append({"type": "struct", "optional": True, "fields": fields})
    events, clean = [], []
    for n in range(60):
        row = rng.choice(rows)
        values: dict[str, Any] = {"id": n}
        ok = True
        for field in row["fields"][1:]:
            _, _, good, bad = columns[field["field"]]
            r = rng.random()
            if r < 0.1:
                continue  # missing: null
            if r < 0.2:
                values[field["field"]] = None
            elif r < 0.2 + hostile_share:
                values[field["field"]] = bad()
                ok = False
            else:
                values[field["field"]] = good()
        if rng.random() < 0.1:
            values["not_in_schema"] = [1, {"x": "y"}]
        image = _image(values)
        if rng.random() < hostile_share / 4:
            image = image[:-1] + ', "id": 7}'  # a key named twice
            ok = False
        schema = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
        payload = f'{{"before": null, "after": {image}, "op": "c", "source": {{"lsn": {n}}}}}'
        events.append(f'{{"schema": {json.dumps(schema)}, "payload": {payload}}}')
        clean.append(ok)
    return events, clean


def _plain(array: pa.Array) -> list[Any]:
    """Values as Python sees them; dates and timestamps as their stored integers (any year)."""
    if pa.types.is_date32(array.type):
        return array.view(pa.int32()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_timestamp(array.type):
        return array.view(pa.int64()).to_pylist()  # type: ignore[no-any-return]
    return array.to_pylist()  # type: ignore[no-any-return]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return bool(a == b) and type(a) is type(b)


@pytest.mark.parametrize("seed", range(12))
def test_the_arrow_reader_reads_what_spark_reads_or_leaves_it(spark: SparkSession, seed: int) -> None:
    events, clean = draw_batch(seed, hostile_share=0.0 if seed % 4 == 0 else 0.08)
    df = spark.createDataFrame(list(enumerate(events)), "n int, value string")
    # The texts the sink's reader hands the Arrow reader: Spark's own serialization of each part.
    payload = F.coalesce(F.get_json_object("value", "$.payload"), F.col("value"))
    parts = df.select(
        F.get_json_object(payload, "$.after").alias("image"), F.get_json_object("value", "$.schema").alias("schema")
    ).collect()  # in the order of n: one partition, no shuffle
    # An event Spark cannot parse (NaN and Infinity tokens) has no schema part to Spark: never
    # planned for the Arrow reader (the batch is left to Spark's, sources/envelope.py ``unlike``).
    assert all(clean[i] is False for i, p in enumerate(parts) if p["schema"] is None)
    texts = sorted({p["schema"] for p in parts if p["schema"] is not None})
    target = _row_schema_from_envelopes(texts)
    assert target is not None
    reader = row_reader({t: _row_schema(t) for t in texts}, target)
    assert isinstance(reader, RowReader), "every drawn type is one the Arrow reader reads"

    spark_table = read_envelope(df, rejects="mark", table_column=None, keep=["n"]).orderBy("n").toArrow()
    assert spark_table.column("n").to_pylist() == list(range(len(events)))
    refusals = spark_table.column(REJECT_COLUMN).to_pylist()
    spark_values = {name: _plain(spark_table.column(name).combine_chunks()) for name in target.fieldNames()}
    read = 0
    for i, part in enumerate(parts):
        if part["schema"] is None:
            continue
        try:
            ours = reader.read([part["image"]], [reader.texts.index(part["schema"])])
        except Exception as e:  # the Arrow reader leaves this event to Spark
            assert type(e).__name__ == "_Leave", f"event {i}: the Arrow reader failed instead of leaving: {e!r}"
            assert not clean[i], f"event {i} is clean but the Arrow reader left it to Spark ({e}): {events[i]}"
            continue
        read += 1
        assert refusals[i] is None, f"event {i}: read by Arrow, refused by Spark: {refusals[i]}"
        for name in target.fieldNames():
            mine, theirs = _plain(ours.field(name))[0], spark_values[name][i]
            assert _same(mine, theirs), f"event {i} column {name}: Arrow {mine!r}, Spark {theirs!r}\n{events[i]}"
    assert read >= sum(clean)


def test_an_arrow_batch_is_one_struct_array_with_null_images(spark: SparkSession) -> None:
    events, _ = draw_batch(100, hostile_share=0.0)
    schema = json.dumps(json.loads(events[0])["schema"], separators=(",", ":"))
    target = _row_schema_from_envelopes([schema])
    assert target is not None
    reader = row_reader({schema: _row_schema(schema)}, target)
    assert reader is not None
    assert reader.texts == [schema]
    out = reader(pa.array(['{"id": 1}', None]), pa.array([0, None], pa.int32()))
    assert out.to_pylist()[0]["id"] == 1 and out.to_pylist()[1] is None
    with pytest.raises(RuntimeError, match="Arrow reader leaves to Spark"):
        reader(pa.array(['{"id": 1.5}']), pa.array([0], pa.int32()))
    for part in (None, -1, 1):  # no schema part, another one (reading_column's -1), out of range
        with pytest.raises(RuntimeError, match="schema part this reader was not built for"):
            reader(pa.array(['{"id": 1}']), pa.array([part], pa.int32()))
