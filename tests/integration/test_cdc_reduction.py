"""Property: the Spark reduction keeps exactly each key's last change, as a Python model says."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from iceberg_sink.config import ChangeConfig
from iceberg_sink.sources.rejects import REJECT_COLUMN
from iceberg_sink.topology.changes import OP_COLUMN, reduce_changes

CODES = {
    "I": "I",
    "insert": "I",
    "c": "I",
    "r": "I",
    "+I": "I",
    "U": "U",
    "u": "U",
    "+U": "U",
    "D": "D",
    "d": "D",
    "-D": "D",
}

change_lists = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from([*sorted(CODES), "UB", "-U"]), st.integers(0, 4)),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(change_lists)
def test_reduction_keeps_the_last_change_of_each_key(spark: SparkSession, changes: list[tuple[int, str, int]]) -> None:
    # lsn ties are broken by arrival order; value carries the arrival index to tell rows apart.
    rows = [(key, op, lsn, i) for i, (key, op, lsn) in enumerate(changes)]
    df = spark.createDataFrame(rows, "k long, op string, lsn long, arrival long").coalesce(1)
    reduced = reduce_changes(df, ChangeConfig(key=("k",), op_column="op", order_by="lsn")).collect()
    model: dict[int, tuple[Any, ...]] = {}
    for key, op, lsn, arrival in sorted(rows, key=lambda r: (r[2], r[3])):
        if op not in ("UB", "-U"):
            model[key] = (CODES[op], lsn, arrival)
    got = {r["k"]: (r[OP_COLUMN], r["lsn"], r["arrival"]) for r in reduced}
    assert got == model
    assert "op" not in reduced[0].asDict() if reduced else True


def test_names_and_codes_that_need_quoting_in_sql_text(spark: SparkSession) -> None:
    """The reduction is built from SQL text (iceberg_sink/_sql.py): column names holding a backtick, a
    quote or a space (a dot too, outside the key and order_by, where it selects a nested field), and op
    codes holding quotes or a backslash, are read as given; the refusal's message quotes them unchanged."""
    key, op, order, value = "k`ey 1", "o'p \\x", 'l s"n', "v.1 `x'"
    df = spark.createDataFrame(
        [(1, "U", 1, "a"), (1, "D", 2, "b"), (2, "I", 1, "c"), (2, "U", 3, "d"), (3, "I", 1, "e")],
        ["k", "o", "l", "v"],
    ).toDF(key, op, order, value)
    reduced = reduce_changes(df, ChangeConfig(key=(key,), op_column=op, order_by=order)).collect()
    assert {r[key]: (r[OP_COLUMN], r[value]) for r in reduced} == {1: ("D", "b"), 2: ("U", "d"), 3: ("I", "e")}
    assert op not in reduced[0].asDict()

    bad = spark.createDataFrame([(4, "x'\\y", 1, "f")], ["k", "o", "l", "v"]).toDF(key, op, order, value)
    refused = reduce_changes(bad, ChangeConfig(key=(key,), op_column=op, order_by=order)).collect()
    reason = refused[0][REJECT_COLUMN]["reason"]
    assert reason.startswith(f"unknown operation code 'x'\\y' in column {op!r}; expected one of I, insert")
    assert reason.endswith(f"row key: {key}=4")
    assert refused[0][REJECT_COLUMN]["error_class"] == "UnknownOperationError"
