"""The change reduction as one Spark SQL statement (iceberg_sink/_steps.py ``Steps``): the same rows and
columns as the DataFrame steps it replaced, names Spark's SQL text reads otherwise kept as written,
one analysis per batch, the statement parsed once, nothing registered in the session's catalog."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from py4j.java_gateway import GatewayClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink._sql import column
from iceberg_sink._steps import Steps
from iceberg_sink.config import ChangeConfig
from iceberg_sink.sources.rejects import fail_on_reject
from iceberg_sink.topology.changes import reduce_changes
from iceberg_sink.vocab.columns import OP_COLUMN, REJECT_COLUMN

# Names SQL text reads otherwise when written plainly: a dot (a nested field), a substitution, a quote
# and a backtick, another case.
ODD = ["a.b", "x${y}", "it's", "back`tick", "Mixed"]


def frame(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            (1, "one", 10, "x", "q", "i", "b", "m"),
            (2, "two", 20, "y", "r", "j", "c", "n"),
            (3, None, 30, "z", "s", "k", "d", "o"),
        ],
        ["id", "name", "n", *ODD],
    )


def sink_views(spark: SparkSession) -> list[str]:
    return [t.name for t in spark.catalog.listTables() if t.name.startswith("__iceberg_sink")]


#: The Py4J methods that make a Dataset, each an analysis of its whole plan.
ANALYSED = ("ofRows", "withColumn", "withColumns", "select", "filter", "drop", "sortWithinPartitions", "sql")


def test_steps_give_the_dataframe_steps_rows_and_columns(spark: SparkSession) -> None:
    df = frame(spark)
    steps = (
        Steps(df, df.columns)
        .add(("n * 2", "twice"), (f"concat({column('x${y}')}, {column('a.b')})", "joined"))
        .add(("upper(name)", "name"))  # replaced where it stands, as withColumn replaces it
        .where(f"{column('it' + chr(39) + 's')} <> 'j'")
        .sort_within(["n DESC"])
        .drop(["twice", "Mixed", "absent"])
    )
    out = steps.frame()
    expected = (
        df.withColumn("twice", F.col("n") * 2)
        .withColumn("joined", F.concat(F.col("`x${y}`"), F.col("`a.b`")))
        .withColumn("name", F.upper("name"))
        .where(F.col("`it's`") != "j")
        .sortWithinPartitions(F.col("n").desc())
        .drop("twice", "Mixed")
    )
    assert out.columns == expected.columns == steps.columns
    assert out.schema == expected.schema
    assert sorted(out.collect()) == sorted(expected.collect())
    assert [r["joined"] for r in sorted(out.collect())] == ["qx", "sz"]
    assert sink_views(spark) == []


def test_steps_without_a_step_are_the_input(spark: SparkSession) -> None:
    df = frame(spark)
    assert Steps(df, df.columns).drop(["absent"]).frame() is df


@contextmanager
def counted_round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The Py4J commands sent from now on (each a round trip)."""
    calls: list[str] = []
    send = GatewayClient.send_command

    def counted(client: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(command)
        return send(client, command, *args, **kwargs)

    monkeypatch.setattr(GatewayClient, "send_command", counted)
    try:
        yield calls
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("in_writers", [True, False], ids=["in-writers", "window"])
def test_the_reduction_is_one_analysis_of_a_statement_parsed_once(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch, in_writers: bool
) -> None:
    """Counted, not timed: as DataFrame steps the reduction was seven analyses of its growing plan
    (``withColumn``, ``filter``, ``select``, ``sortWithinPartitions``, ``drop``); as one statement it is
    one (``ofRows``), and the statement is parsed for the first batch of a schema only."""
    df = spark.createDataFrame(
        [(1, "I", 1, "a"), (1, "U", 2, "b"), (2, "I", 3, "c"), (2, "D", 4, None), (3, "UB", 5, "d")],
        "k long, op string, lsn long, v string",
    )
    config = ChangeConfig(key=("k",), op_column="op", order_by="lsn")
    reduce_changes(df, config, in_writers=in_writers)  # the schema asked for once, as a stream's first batch
    with counted_round_trips(monkeypatch) as calls:
        reduced = reduce_changes(df, config, in_writers=in_writers)
    methods = [c.split("\n")[2] for c in calls if c.startswith("c\n")]
    assert [m for m in methods if m in ANALYSED] == ["ofRows"], methods
    assert "parsePlan" not in methods, "the statement was parsed again"
    assert sink_views(spark) == []
    if not in_writers:
        rows = {r["k"]: (r[OP_COLUMN], r["v"]) for r in reduced.collect()}
        assert rows == {1: ("U", "b"), 2: ("D", None)}


def test_a_refused_rows_raw_value_is_left_out_only_where_no_dead_letter_table_stores_it(spark: SparkSession) -> None:
    """Without a dead-letter table a refused Kafka row fails the batch, and the message names the message
    by its coordinates: its raw value (a wide row's JSON text, hundreds of expressions) is not built.
    Without Kafka's columns the message quotes the raw value, so it is built either way."""
    kafka = spark.createDataFrame(
        [(None, "I", "t", 0, 7), (1, "I", "t", 0, 8)], "k long, op string, topic string, partition int, offset long"
    )
    plain = kafka.drop("topic", "partition", "offset")
    config = ChangeConfig(key=("k",), op_column="op")

    def refusal(df: DataFrame, raw_kept: bool) -> Any:
        (row,) = reduce_changes(df, config, raw_kept=raw_kept).where(F.col(REJECT_COLUMN).isNotNull()).collect()
        return row[REJECT_COLUMN]

    kept, left_out = refusal(kafka, raw_kept=True), refusal(kafka, raw_kept=False)
    assert '"k":null' in kept["raw"] and left_out["raw"] is None
    assert kept["event"] == left_out["event"] == "topic t partition 0 offset 7"
    assert '"k":null' in refusal(plain, raw_kept=False)["raw"]
    with pytest.raises(Exception, match="topic t partition 0 offset 7"):
        fail_on_reject(reduce_changes(kafka, config, raw_kept=False)).collect()


def test_batches_of_one_schema_share_a_parsed_statement_and_each_reads_its_own_rows(spark: SparkSession) -> None:
    """The statement's parsed plan is kept and the view rebound for each batch: a batch built after
    another reads its own rows, and the one before still reads its own (its plan holds its input's
    plan, not the view's name), also side by side in one plan."""
    schema = "k long, op string, v string"
    config = ChangeConfig(key=("k",), op_column="op")
    first = reduce_changes(spark.createDataFrame([(1, "I", "a"), (1, "U", "b")], schema), config)
    second = reduce_changes(spark.createDataFrame([(2, "I", "c"), (3, "D", None)], schema), config)

    def rows(df: DataFrame) -> set[tuple[Any, ...]]:
        return {(r["k"], r[OP_COLUMN], r["v"]) for r in df.collect()}

    assert rows(second) == {(2, "I", "c"), (3, "D", None)}
    assert rows(first) == {(1, "U", "b")}
    assert rows(first.unionByName(second)) == rows(first) | rows(second)
    assert sink_views(spark) == []
