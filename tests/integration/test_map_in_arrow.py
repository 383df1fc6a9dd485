"""``writer/spark.map_in_arrow``: the function gets every column of the batch, in order, with its
values and types, whatever the columns are named; the columns are named to the JVM in one string,
and a name holding that string's separator takes PySpark's own ``mapInArrow``."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink.writer.spark import map_in_arrow
from tests.helpers import package_lookups


def _seen(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One row per batch: its column names, its Arrow types and its rows, as text."""
    for batch in batches:
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "names": "|".join(batch.schema.names),
                    "types": "|".join(str(t) for t in batch.schema.types),
                    "rows": repr(batch.to_pylist()),
                }
            ]
        )


NAMES = ["id", "a.b", "c`d", "e f", "${x}", "ü", "__iceberg_sink_op", "g"]


@pytest.mark.parametrize("names", [NAMES, ["only"]], ids=["odd-names", "one-column"])
def test_every_column_reaches_the_function_in_order(spark: SparkSession, names: list[str]) -> None:
    values = [1, "b", Decimal("2.50"), None, [1, 2], {"k": 3}, 4.5, True][: len(names)]
    types = ["long", "string", "decimal(5,2)", "string", "array<int>", "map<string,int>", "double", "boolean"]
    schema = ", ".join(f"`{n.replace('`', '``')}` {t}" for n, t in zip(names, types, strict=False))
    df = spark.createDataFrame([tuple(values), tuple(values)], schema)
    out = map_in_arrow(df.coalesce(1), _seen, "names string, types string, rows string").collect()
    # What Spark's own Arrow conversion of the batch holds: names, types and values alike.
    arrow = df.toArrow()
    assert [r["names"] for r in out] == ["|".join(arrow.schema.names)]
    assert arrow.schema.names == names
    assert out[0]["types"] == "|".join(str(t) for t in arrow.schema.types)
    assert out[0]["rows"] == repr(arrow.to_pylist())
    assert len(arrow.to_pylist()) == 2 and arrow.to_pylist()[0][names[0]] == values[0]


def test_pysparks_way_only_for_a_name_holding_the_separator(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wide batch's columns are named in one string (not two Py4J calls each, PySpark's
    ``mapInArrow``); a name holding the string's separator takes PySpark's way."""
    calls: list[int] = []
    wide = spark.range(3).selectExpr(*[f"id + {i} AS c{i}" for i in range(160)])
    original = type(wide).mapInArrow  # PySpark's (the classic DataFrame's)

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(self.columns))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(wide), "mapInArrow", counted)
    out = map_in_arrow(wide, _seen, "names string, types string, rows string").collect()
    assert calls == []
    assert "|".join(r["names"] for r in out[:1]) == "|".join(f"c{i}" for i in range(160))
    assert sum(len(eval(r["rows"])) for r in out) == 3  # our own repr of plain ints
    odd = spark.createDataFrame([(1, 2)], "`x\x00y` long, z long")
    assert len(map_in_arrow(odd, _seen, "names string, types string, rows string").collect()) == 1
    assert calls == [2]


def test_no_java_class_is_resolved_through_a_package_chain(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``jvm.org.apache...`` asks the JVM for each dotted prefix, and each is a failed class lookup
    that walks every jar of the class path (1.4 ms a chain here, every micro-batch): the classes
    are named in full instead."""
    asked = package_lookups(monkeypatch)
    wide = spark.range(3).selectExpr("id", "id + 1 AS b")
    out = map_in_arrow(wide, _seen, "names string, types string, rows string").collect()
    assert next(r["names"] for r in out if r["rows"] != "[]") == "id|b"
    assert asked == []
