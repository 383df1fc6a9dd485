"""A wide change batch's value columns carried to the writers in one struct (job/packing.py).

The same drawn CDC stream (inserts, updates, deletes, several changes of a key in one batch, out of
order values of the order column, nulls in every value column) of a table with every kind of column
(decimal, date, timestamp, binary, array, map, struct, names with a dash, a space and a capital) is
written by two sinks: one packs every value column (``packed-columns-min`` 1), one never packs (0).
After every batch both tables equal the model; the packed sink's writers received the struct and the
other's did not (a spy on the writers' ``mapInArrow``, which calls through). A null key fails both
sinks' batch with the same message (the refused row's value written in the batch's column order).
DuckDB reads both tables after every batch, Iceberg Java (and PyIceberg for v3) the packed one at the end.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._spark_schema import columns_of
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.writer import spark as writer_spark
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

TYPES = {  # value columns between the ones the road names: a refused row's value keeps this order
    "name": "STRING",
    "id": "BIGINT",
    "price": "DECIMAL(38,2)",
    "region": "STRING",
    "day": "DATE",
    "op": "STRING",
    "at": "TIMESTAMP",
    "seq": "BIGINT",
    "ratio": "DOUBLE",
    "flag": "BOOLEAN",
    "blob": "BINARY",
    "small": "INT",
    "tags": "ARRAY<STRING>",
    "attrs": "MAP<STRING,INT>",
    "point": "STRUCT<x: DOUBLE, y: DOUBLE>",
    "with-dash": "STRING",
    "sp ace": "BIGINT",
    "Note": "STRING",
}
DDL = ", ".join(f"`{name}` {kind}" for name, kind in TYPES.items())
VALUES = [c for c in TYPES if c not in ("id", "region", "op", "seq")]
KEYS = 8


def _value(rng: random.Random, name: str) -> Any:
    if rng.random() < 0.2:
        return None
    return {
        "name": lambda: rng.choice(["a", "b'q", "ü", "x" * 40, ""]),
        "price": lambda: Decimal(rng.randrange(-(10**36), 10**36)).scaleb(-2),
        "day": lambda: dt.date(2020, 1, 1) + dt.timedelta(days=rng.randrange(3000)),
        "at": lambda: dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randrange(10**12)),
        "ratio": lambda: rng.choice([0.5, -1e300, 3.25, 1 / 3]),
        "flag": lambda: rng.random() < 0.5,
        "blob": lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(5))),
        "small": lambda: rng.randrange(-(2**31), 2**31),
        "tags": lambda: [rng.choice(["t", None, "u"]) for _ in range(rng.randrange(3))],
        "attrs": lambda: {f"k{i}": rng.choice([i, None]) for i in range(rng.randrange(3))},
        "point": lambda: {"x": rng.random(), "y": rng.choice([None, 2.0])},
        "with-dash": lambda: "d",
        "sp ace": lambda: rng.randrange(10**12),
        "Note": lambda: "n",
    }[name]()


class Stream:
    """Drawn changes and the model of the table they leave."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.model: dict[tuple[int, str], dict[str, Any]] = {}
        self.seq = 0

    def batch(self) -> list[dict[str, Any]]:
        rng, changes = self.rng, []
        for _ in range(rng.randrange(5, 25)):
            key = (rng.randrange(KEYS), rng.choice(["eu", "us"]))
            self.seq += rng.randrange(1, 4)
            op = "d" if key in self.model and rng.random() < 0.25 else ("u" if key in self.model else "c")
            row = {"id": key[0], "region": key[1], "op": op, "seq": self.seq}
            row.update({c: _value(rng, c) for c in VALUES})
            changes.append(row)
        rng.shuffle(changes)  # arrival order is not the order column's
        for row in sorted(changes, key=lambda r: r["seq"]):
            key = (row["id"], row["region"])
            if row["op"] == "d":
                self.model.pop(key, None)
            else:
                self.model[key] = {k: v for k, v in row.items() if k not in ("op", "seq")}
        return changes

    def rows(self) -> list[dict[str, Any]]:
        return sorted(self.model.values(), key=lambda r: (r["id"], r["region"]))


def _sink(lake: Path, table: str, packed_min: int, format_version: int, partitioned: bool) -> Any:
    return (
        IcebergSink.builder()
        .embedded(lake)
        .table(table)
        .create_if_missing(partition_by=["region"] if partitioned else (), format_version=format_version)
        .cdc(op_column="op", key=["id", "region"], order_by="seq")
        .write_option("iceberg-sink.write.packed-columns-min", packed_min)
        .build()
    )


def _frame(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([tuple(r[n] for n in TYPES) for r in rows], DDL)


@pytest.mark.parametrize(("format_version", "partitioned"), [(3, False), (2, True)])
def test_packed_and_unpacked_batches_write_the_same_table(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    format_version: int,
    partitioned: bool,
) -> None:
    seen: list[list[str]] = []
    calling = writer_spark.map_in_arrow

    def spy(df: DataFrame, task: object, schema: str) -> DataFrame:
        seen.append(columns_of(df))
        return calling(df, task, schema)

    monkeypatch.setattr(writer_spark, "map_in_arrow", spy)
    lake = tmp_path / "lake"
    packed = _sink(lake, "db.packed", 1, format_version, partitioned)
    plain = _sink(lake, "db.plain", 0, format_version, partitioned)
    stream = Stream(seed=format_version)
    for b in range(4):
        df = _frame(spark, stream.batch())
        seen.clear()
        packed.write(df, str(tmp_path / "ckpt-packed"))
        assert seen and all("__iceberg_sink_packed" in c and len(c) < 8 for c in seen), seen
        seen.clear()
        plain.write(df, str(tmp_path / "ckpt-plain"))
        assert seen and all("__iceberg_sink_packed" not in c and "sp ace" in c for c in seen), seen
        want = normalize(duckdb_read(plain.load_table().metadata_location), ["id", "region"])
        assert normalize(duckdb_read(packed.load_table().metadata_location), ["id", "region"]) == want, b
        assert [(r["id"], r["region"]) for r in want] == [(r["id"], r["region"]) for r in stream.rows()]
    table = packed.load_table()
    assert normalize(java_reader.read(table.metadata_location), ["id", "region"]) == want
    if format_version == 3:  # PyIceberg reads deletion vectors, not v2's equality deletes
        assert normalize(table.scan().to_arrow(), ["id", "region"]) == want

    # A null key: both refuse the batch with the same words, the row's value in the batch's column order.
    bad = stream.batch()
    bad[0]["id"] = None
    errors = []
    for sink, where in ((packed, "ckpt-packed"), (plain, "ckpt-plain")):
        with pytest.raises(InvalidInputError) as refused:
            sink.write(_frame(spark, bad), str(tmp_path / where))
        errors.append(str(refused.value).replace("db.packed", "T").replace("db.plain", "T"))
    assert errors[0] == errors[1]
    at = [errors[0].index(f'"{name}":') for name in ("name", "id", "price")]
    assert at == sorted(at), errors[0]


def test_model_values_survive_packing(spark: SparkSession, tmp_path: Path) -> None:
    """Every value the stream wrote reads back as written (not only equal between the two sinks)."""
    stream = Stream(seed=7)
    sink = _sink(tmp_path / "lake", "db.values", 1, 3, False)
    for _ in range(3):
        sink.write(_frame(spark, stream.batch()), str(tmp_path / "ckpt"))
    got = normalize(sink.load_table().scan().to_arrow(), ["id", "region"])
    want = stream.rows()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for c in ("id", "region", "name", "price", "day", "ratio", "flag", "small", "with-dash", "sp ace", "Note"):
            assert g[c] == w[c], (c, g[c], w[c])
        assert g["at"] == w["at"]
        assert (g["blob"] is None) == (w["blob"] is None) and (g["blob"] or b"") == (w["blob"] or b"")
        assert g["tags"] == w["tags"]
        assert (g["point"] is None) == (w["point"] is None)
