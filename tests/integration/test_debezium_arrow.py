"""The sink reads a Debezium batch's row images with Arrow where it can, and with Spark where it must.

A stream of batches with logical types (Decimal, Date, MicroTimestamp, ZonedTimestamp, float): the
Arrow reader reads the batches whose images it reads exactly (sources/arrow_rows.py); a batch
holding a value it leaves to Spark (a string column given a JSON number, which Spark reads as its
text) is read again by Spark's expressions, with one progress record; the next two batches are
left to Spark, the one after is Arrow's again. The table equals the model read by PyIceberg,
Iceberg Java and DuckDB.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from iceberg_sink.sources import debezium as debezium_module
from iceberg_sink.sources.envelope import READ_BY_SPARK
from tests.integration.test_debezium import customers_sink
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

ROW = {
    "type": "struct",
    "optional": True,
    "fields": [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "name"},
        {
            "type": "bytes",
            "optional": True,
            "field": "price",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "38"},
        },
        {"type": "int32", "optional": True, "field": "day", "name": "io.debezium.time.Date"},
        {"type": "int64", "optional": True, "field": "seen", "name": "io.debezium.time.MicroTimestamp"},
        {"type": "string", "optional": True, "field": "at", "name": "io.debezium.time.ZonedTimestamp"},
        {"type": "float", "optional": True, "field": "ratio"},
    ],
}
SCHEMA = {"type": "struct", "fields": [{**ROW, "field": "before"}, {**ROW, "field": "after"}]}


def _unscaled(value: Decimal) -> str:
    n = int(value.scaleb(2))
    return base64.b64encode(n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)).decode()


class Stream:
    def __init__(self) -> None:
        self.lsn = 0
        self.model: dict[int, dict[str, Any]] = {}

    def change(self, key: int, name: Any = None) -> str:
        self.lsn += 1
        n = self.lsn
        price = Decimal(10**35 + n * 7919).scaleb(-2) * (-1 if n % 2 else 1)  # 36 digits: past a 34-digit context
        after = {
            "id": key,
            "name": f"n{n}" if name is None else name,
            "price": _unscaled(price),
            "day": 19000 + n,
            "seen": 1_700_000_000_000_000 + n,
            "at": f"2024-03-0{1 + n % 9}T10:00:0{n % 10}.{n:06d}+02:00",
            "ratio": n / 3,
        }
        op = "u" if key in self.model else "c"
        self.model[key] = {
            "id": key,
            "name": str(after["name"]),
            "price": price,
            "day": dt.date(1970, 1, 1) + dt.timedelta(days=19000 + n),
            "seen": dt.datetime(2023, 11, 14, 22, 13, 20) + dt.timedelta(microseconds=n),
            "at": dt.datetime(2024, 3, 1 + n % 9, 8, 0, n % 10, n, tzinfo=dt.UTC),
            "ratio": float(np.float32(n / 3)),
            "lsn": n,
        }
        payload = {
            "before": None,
            "after": after,
            "op": op,
            "source": {"db": "d", "schema": "s", "table": "t", "lsn": n},
        }
        return json.dumps({"schema": SCHEMA, "payload": payload})


def test_row_images_are_read_by_arrow_where_exact_and_by_spark_where_not(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    arrow_batches: list[int] = []  # the batches whose reading the Arrow reader was asked to build
    building = debezium_module._arrow_rows
    sink_batch = [0]

    def counting(*args: Any) -> Any:
        arrow_batches.append(sink_batch[0])
        return building(*args)

    monkeypatch.setattr(debezium_module, "_arrow_rows", counting)
    sink = customers_sink(tmp_path / "lake", "off")  # one sink: its reader keeps its state across batches
    stream = Stream()
    plan: list[list[str]] = [
        [stream.change(k) for k in (1, 2, 3)],  # 0: counted, Arrow
        [stream.change(k) for k in (2, 4)],  # 1: planned, Arrow
        [stream.change(1), stream.change(5, name=12345)],  # 2: a number for a string: read again by Spark
        [stream.change(3)],  # 3, 4: Spark's (the two after a batch Arrow left)
        [stream.change(4)],
        [stream.change(5), stream.change(6)],  # 5: Arrow's again
    ]
    with caplog.at_level(logging.INFO, logger="iceberg_sink"):
        for batch, events in enumerate(plan):
            sink_batch[0] = batch
            sink.write(spark.createDataFrame([(e,) for e in events], "value string"), str(tmp_path / "ckpt"))

    assert arrow_batches == [0, 1, 2, 5]
    again = [r.getMessage() for r in caplog.records if "read again" in r.getMessage()]
    assert len(again) == 1 and READ_BY_SPARK in again[0] and "string column" in again[0], again
    assert [r["checkpoint_id"] for r in sink.progress()] == list(range(len(plan)))
    table = sink.load_table()
    want = sorted(stream.model.values(), key=lambda r: r["id"])
    assert normalize(table.scan().to_arrow(), ["id"]) == want
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want
