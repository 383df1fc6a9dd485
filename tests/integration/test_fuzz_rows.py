"""Random rows (hypothesis) through real Spark writes, against a model of the table.

Rows carry long and non-ASCII text (also as an identity partition value: path escaping and
shortening), nulls, int64 and double extremes, NaN, signed zeros, infinities, decimals at their
precision and timestamps far from the epoch. Appends and CDC changes (inserts, updates, deletes of
a few keys, ordered by a sequence column) are each written as one or two checkpoints; DuckDB reads
every table back and must return the model's rows, and Iceberg Java reads the last table of each
mode. Hypothesis runs derandomized without an example database, so CI sees the same examples on
every run; max_examples is kept small because each example costs Spark jobs.
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

SETTINGS = settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrinking: each step costs Spark jobs (minutes); the failing example is printed as found.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

DDL = "id long, s string, n long, d double, dec decimal(18,4), ts timestamp, b binary"
ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("s", pa.string()),
        ("n", pa.int64()),
        ("d", pa.float64()),
        ("dec", pa.decimal128(18, 4)),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("b", pa.binary()),
    ]
)
I64 = (-(2**63), 2**63 - 1)

texts = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=200, max_size=300),
    st.sampled_from(["", "..", "a/b", "100%", "#?", " ", "line\nbreak", "x" * 300, "é" * 200]),
)
values = st.fixed_dictionaries(
    {
        "s": st.none() | texts,
        "n": st.none() | st.integers(*I64) | st.sampled_from(I64),
        "d": st.none()
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.sampled_from([float("nan"), -0.0, 0.0, 5e-324, -1.7976931348623157e308]),
        "dec": st.none()
        | st.decimals(min_value=Decimal("-99999999999999.9999"), max_value=Decimal("99999999999999.9999"), places=4),
        "ts": st.none()
        | st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 12, 31)).map(
            lambda t: t.replace(tzinfo=dt.UTC)
        ),
        "b": st.none() | st.binary(max_size=40),
    }
)


def _frame(spark: SparkSession, rows: list[dict[str, Any]], extra: str = "") -> Any:
    columns = [c.split()[0] for c in (DDL + extra).split(", ")]
    return spark.createDataFrame([tuple(r[c] for c in columns) for r in rows], DDL + extra)


def _expected(rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    return normalize(pa.Table.from_pylist([{c: r[c] for c in schema.names} for r in rows], schema=schema), ["id"])


# Always tried first (Phase.explicit): every extreme at once.
EXTREMES = [
    {
        "s": "é" * 200 + "/..%#? \n日本",
        "n": I64[0],
        "d": float("nan"),
        "dec": Decimal("-99999999999999.9999"),
        "ts": dt.datetime(1900, 1, 1, tzinfo=dt.UTC),
        "b": b"\x00\xff",
    },
    {
        "s": "x" * 300,
        "n": I64[1],
        "d": -0.0,
        "dec": Decimal("99999999999999.9999"),
        "ts": dt.datetime(2200, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        "b": b"",
    },
    {"s": None, "n": None, "d": float("-inf"), "dec": None, "ts": None, "b": None},
    {"s": "", "n": 0, "d": 5e-324, "dec": Decimal("0.0001"), "ts": dt.datetime(1970, 1, 1, tzinfo=dt.UTC), "b": None},
]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


_names = itertools.count()


@pytest.mark.parametrize("mode", ["append", "cdc"])
def test_random_rows_read_back_as_the_model(
    spark: SparkSession, lake: Path, java_reader: JavaIcebergReader, mode: str
) -> None:
    last: dict[str, Any] = {}

    if mode == "append":
        batches_strategy = st.lists(st.lists(values, max_size=12), min_size=1, max_size=2)
    else:
        change = st.tuples(st.sampled_from([I64[0], -1, 0, 7, I64[1]]), st.sampled_from(["I", "U", "D"]), values)
        batches_strategy = st.lists(st.lists(change, max_size=12), min_size=1, max_size=2)

    if mode == "append":
        extreme: list[list[Any]] = [EXTREMES[:2], EXTREMES[2:]]
    else:
        extreme = [
            [(I64[0], "I", EXTREMES[0]), (I64[1], "I", EXTREMES[1]), (0, "I", EXTREMES[3]), (I64[0], "U", EXTREMES[2])],
            [(I64[1], "D", EXTREMES[2]), (0, "U", EXTREMES[0]), (-1, "D", EXTREMES[3])],
        ]

    @SETTINGS
    @example(batches=extreme)
    @given(batches=batches_strategy)
    def check(batches: list[list[Any]]) -> None:
        table = f"db.{mode}{next(_names)}"
        builder = IcebergSink.builder().embedded(lake / "lake").table(table)
        model: dict[int, dict[str, Any]] = {}
        if mode == "append":
            sink = builder.create_if_missing(partition_by=["s"]).build()
            next_id = 0
            for batch in batches:
                rows = []
                for v in batch:
                    rows.append({"id": next_id, **v})
                    next_id += 1
                model.update({r["id"]: r for r in rows})
                if rows:
                    sink.write(_frame(spark, rows))
        else:
            sink = builder.create_if_missing(partition_by=["bucket(2, id)"]).cdc("op", ["id"], order_by="lsn").build()
            lsn = 0
            for batch in batches:
                rows = []
                for key, op, v in batch:
                    lsn += 1
                    rows.append({"id": key, **v, "op": op, "lsn": lsn})
                    if op == "D":
                        model.pop(key, None)
                    else:
                        model[key] = {"id": key, **v, "lsn": lsn}
                if rows:
                    sink.write(_frame(spark, rows, ", op string, lsn long"))
        schema = ARROW if mode == "append" else ARROW.append(pa.field("lsn", pa.int64()))
        expected = _expected(list(model.values()), schema)
        if not any(batches):
            return
        location = sink.load_table().metadata_location
        assert normalize(duckdb_read(location), ["id"]) == expected
        last.update(location=location, expected=expected)

    check()
    assert last, "no example wrote anything"
    assert normalize(java_reader.read(last["location"]), ["id"]) == last["expected"]
