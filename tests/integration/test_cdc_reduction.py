"""Property: the Spark reduction keeps exactly each key's last change, as a Python model says."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from iceberg_sink.config import ChangeConfig
from iceberg_sink.sources.rejects import reject_where
from iceberg_sink.topology import estimate
from iceberg_sink.topology.changes import fits_one_task, reduce_changes
from iceberg_sink.vocab.columns import OP_COLUMN, REJECT_COLUMN

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
@given(change_lists, st.sampled_from([0, 8 * 1024 * 1024]), st.integers(1, 3))
def test_reduction_keeps_the_last_change_of_each_key(
    spark: SparkSession, changes: list[tuple[int, str, int]], single_task_max_bytes: int, partitions: int
) -> None:
    # lsn ties are broken by arrival order; value carries the arrival index to tell rows apart. The
    # rows arrive in ``partitions`` contiguous slices (partition order is arrival order); a small
    # batch is reduced in one task without a shuffle unless single_task_max_bytes is 0.
    rows = [(key, op, lsn, i) for i, (key, op, lsn) in enumerate(changes)]
    # Built on spark.range, whose slices are contiguous and in order and whose size Spark knows.
    keys, ops, lsns = (",".join(v) for v in zip(*((str(k), f"'{o}'", str(n)) for k, o, n in changes), strict=True))
    df = spark.range(0, len(rows), 1, min(partitions, len(rows))).selectExpr(
        f"element_at(array({keys}), cast(id AS int) + 1) AS k",
        f"element_at(array({ops}), cast(id AS int) + 1) AS op",
        f"element_at(array({lsns}), cast(id AS int) + 1) AS lsn",
        "id AS arrival",
    )
    config = ChangeConfig(key=("k",), op_column="op", order_by="lsn")
    reduction = reduce_changes(df, config, single_task_max_bytes=single_task_max_bytes)
    assert fits_one_task(df, single_task_max_bytes) == (single_task_max_bytes > 0)
    plan = reduction._jdf.queryExecution().executedPlan().toString()
    one_slice = min(partitions, len(rows)) == 1  # already one partition: no shuffle either way
    assert plan.count("Exchange hashpartitioning") == (0 if single_task_max_bytes or one_slice else 1), plan
    reduced = reduction.collect()
    model: dict[int, tuple[Any, ...]] = {}
    for key, op, lsn, arrival in sorted(rows, key=lambda r: (r[2], r[3])):
        if op not in ("UB", "-U"):
            model[key] = (CODES[op], lsn, arrival)
    got = {r["k"]: (r[OP_COLUMN], r["lsn"], r["arrival"]) for r in reduced}
    assert got == model
    assert "op" not in reduced[0].asDict() if reduced else True


def test_only_a_batch_spark_knows_to_be_small_is_reduced_in_one_task(spark: SparkSession, tmp_path: Path) -> None:
    """The size comes from Spark's statistics: a file source's files fit; a source without an
    estimate (an RDD: Spark reports the largest size) never does, and keeps its shuffle."""
    spark.range(0, 1000).selectExpr("id AS k", "'U' AS op").write.parquet(str(tmp_path / "batch"))
    files = spark.read.parquet(str(tmp_path / "batch"))
    assert fits_one_task(files, 8 * 1024 * 1024) and not fits_one_task(files, 10)
    rdd = spark.createDataFrame(files.rdd, files.schema)
    assert not fits_one_task(rdd, 8 * 1024 * 1024)
    reduced = reduce_changes(rdd, ChangeConfig(key=("k",), op_column="op"), single_task_max_bytes=8 * 1024 * 1024)
    assert "Exchange hashpartitioning" in reduced._jdf.queryExecution().executedPlan().toString()
    assert reduced.count() == 1000


def test_a_batch_whose_records_the_sink_counted_is_sized_by_them(spark: SparkSession, tmp_path: Path) -> None:
    """A Kafka micro-batch has no estimate either; the sink counts its records from Spark's offset
    log (sink.KafkaBatchRecords) and sizes it by them: a small one is reduced in one task, without a
    shuffle; a count too large for one task keeps the shuffle; outside the count, no estimate."""
    spark.range(0, 1000).selectExpr("id AS k", "'U' AS op").write.parquet(str(tmp_path / "batch"))
    files = spark.read.parquet(str(tmp_path / "batch"))
    rdd = spark.createDataFrame(files.rdd, files.schema)
    config, one_task = ChangeConfig(key=("k",), op_column="op"), 8 * 1024 * 1024
    with estimate.counted(1000):
        assert estimate.estimated_bytes(rdd) == 1000 * (8 + 20)  # a long and a string, Spark's default sizes
        reduced = reduce_changes(rdd, config, single_task_max_bytes=one_task)
        plan = reduced._jdf.queryExecution().executedPlan().toString()
        assert "Exchange" not in plan, plan
        assert sorted(r["k"] for r in reduced.collect()) == list(range(1000))
    with estimate.counted(10_000_000):
        assert (
            "Exchange hashpartitioning"
            in reduce_changes(rdd, config, single_task_max_bytes=one_task)
            ._jdf.queryExecution()
            .executedPlan()
            .toString()
        )
    with estimate.counted(None):
        assert estimate.estimated_bytes(rdd) is None
    assert estimate.estimated_bytes(rdd) is None
    assert estimate.estimated_bytes(files) == estimate.estimated_bytes(files)  # Spark's own, counted or not
    with estimate.counted(5):
        assert estimate.estimated_bytes(files) not in (None, 5 * 28)


def test_names_and_codes_that_need_quoting_in_sql_text(spark: SparkSession, literal_mode: bool) -> None:
    """The reduction is built from SQL text (iceberg_sink/_sql.py): column names holding a backtick, a
    quote, a space or ``${...}`` (a dot too, outside the key and order_by, where it selects a nested
    field), and op codes holding quotes, a backslash or ``${...}``, are read as given under either
    literal-parsing mode; the refusal's message quotes them unchanged. Spark substitutes ``${...}`` in
    SQL text: each such name has a decoy column named as the substituted text, holding other values."""
    key, op, order, value = "k`ey ${x}", "o'p \\x${env:HOME}", 'l s"n${y}', "v.1 `x'"
    decoys = ["k`ey ", f"o'p \\x{os.environ['HOME']}", 'l s"n']
    columns = [key, op, order, value, *decoys]
    rows = [(1, "U", 1, "a"), (1, "D", 2, "b"), (2, "I", 1, "c"), (2, "U", 3, "d"), (3, "I", 1, "e")]
    # Decoys: key 9 everywhere, op I, order descending: read instead, they give one row (9, I, "e"...).
    df = spark.createDataFrame(
        [(*r, 9, "I", -i) for i, r in enumerate(rows)], "k int, o string, l int, v string, dk int, do string, dl int"
    ).toDF(*columns)
    reduced = reduce_changes(df, ChangeConfig(key=(key,), op_column=op, order_by=order)).collect()
    assert {r[key]: (r[OP_COLUMN], r[value]) for r in reduced} == {1: ("D", "b"), 2: ("U", "d"), 3: ("I", "e")}
    assert op not in reduced[0].asDict()

    code = "x'\\y${env:HOME}"
    bad = spark.createDataFrame([(4, code, 1, "f", 9, "I", 0)], df.schema)
    refused = reduce_changes(bad, ChangeConfig(key=(key,), op_column=op, order_by=order)).collect()
    reason = refused[0][REJECT_COLUMN]["reason"]
    assert reason.startswith(f"unknown operation code '{code}' in column {op!r}; expected one of I, insert"), reason
    assert reason.endswith(f"row key: {key}=4"), reason
    assert refused[0][REJECT_COLUMN]["error_class"] == "UnknownOperationError"
    assert f'"{key}":4' in refused[0][REJECT_COLUMN]["raw"], refused[0][REJECT_COLUMN]["raw"]


def test_a_row_refused_twice_keeps_its_first_refusal(spark: SparkSession) -> None:
    """The reduction's checks run in order (a null key, then an unknown operation code), each row's
    first refusal wins, and a refusal the row already had (from its source) wins over both: one mark
    holds the raw row once, whatever the number of checks (sources/rejects.py ``refusal_sql``)."""
    config = ChangeConfig(key=("k",), op_column="op")
    df = spark.createDataFrame(
        [(None, "X", "both"), (None, "U", "key"), (1, "X", "code"), (2, "U", "fine"), (3, "X", "source")],
        "k int, op string, v string",
    )
    marked = reject_where(df, "CASE WHEN v = 'source' THEN 'read wrong' END", "SourceError", "to_json(struct(v))")
    rows = {r["v"]: r[REJECT_COLUMN] for r in reduce_changes(marked, config).collect()}
    assert {v: (m["error_class"] if m is not None else None) for v, m in rows.items()} == {
        "both": "NullKeyError",
        "key": "NullKeyError",
        "code": "UnknownOperationError",
        "fine": None,
        "source": "SourceError",
    }
    assert rows["both"]["reason"].startswith("a key column is null (k must all be set)"), rows["both"]["reason"]
    assert rows["code"]["reason"].startswith("unknown operation code 'X' in column 'op'"), rows["code"]["reason"]
    assert rows["source"]["reason"] == "read wrong"
    assert rows["source"]["raw"] == '{"v":"source"}'
    assert rows["both"]["raw"] == '{"k":null,"op":"X","v":"both"}', rows["both"]["raw"]
    assert rows["both"]["event"] == "value '" + rows["both"]["raw"] + "'"


def test_a_refused_rows_raw_value_names_each_field_as_its_column(spark: SparkSession, literal_mode: bool) -> None:
    """A refused row's raw value (its JSON, kept for a dead-letter table) names each field as its column,
    whether the row is written as ``struct(...)`` or, where a name holds ``${``, as ``named_struct(...)``
    (iceberg_sink/_sql.py ``row_struct``: a reference to such a name would name its field ``colN``)."""
    for names in (["k", "a.b", "we`ird", "it's", "back\\slash", "ünï", "op"], ["k", "a.b", "x${y}", "op"]):
        values = [None, *range(1, len(names) - 1), "I"]
        df = spark.createDataFrame([tuple(values)], ", ".join(f"c{i} string" for i in range(len(names)))).toDF(*names)
        refused = reduce_changes(df, ChangeConfig(key=("k",), op_column="op")).collect()
        raw = refused[0][REJECT_COLUMN]["raw"]
        assert list(json.loads(raw).items()) == [
            (n, None if v is None else str(v)) for n, v in zip(names, values, strict=True)
        ], raw
