"""A DataFrame's next steps written as SQL text and made one DataFrame by one Spark statement.

Each DataFrame step (``withColumn``, ``where``, ``select``, ``sortWithinPartitions``, ``drop``) is a
Dataset that Spark analyses whole, and costs Py4J round trips for its Columns (a name PySpark resolves
through ``jvm.functions`` is a failed class lookup over every jar of the class path): the change
reduction's seven steps were 16 round trips (26 with a window) and seven analyses of a growing plan.
The same steps as nested SELECTs over a temporary view of the input are analysed once, in a handful of
round trips; and since the text of a batch is the text of the batch before it (the same schema, the
same view name), it is parsed once per Spark context (Spark's SQL parser took 70 % of the statement's
JVM time): each batch then only binds the view to its rows and has the parsed plan analysed.

Each step is its own subquery, so the optimizer sees the operators the DataFrame steps made (a
nondeterministic column still stops filters below it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink._spark_schema import built
from iceberg_sink._sql import checked, column, ident, quoted


class Steps:
    """Steps of ``df`` as SQL text, run as one statement by :meth:`frame`. ``columns``: the input's
    column names, kept in step with the steps (a column named twice is not supported)."""

    def __init__(self, df: DataFrame, columns: Sequence[str]) -> None:
        self.df = df
        self.columns = list(columns)
        # One view name per thread: the text (and its parsed plan) is the same from batch to batch,
        # and two threads building at once never bind the same name.
        self._view = f"__iceberg_sink_steps_{threading.get_ident()}"
        self._text: str | None = None
        self._depth = 0

    def _source(self) -> str:
        if self._text is None:
            return quoted(self._view)
        self._depth += 1
        return f"({self._text}) AS {quoted(f'__iceberg_sink_step_{self._depth}')}"

    def add(self, *named: tuple[str, str]) -> Steps:
        """Columns of SQL text, each (expression, name) as ``withColumn``: a column of that name is
        replaced where it stands, any other added at the end."""
        new = {name: checked(expression) for expression, name in named}
        if not any(c in new for c in self.columns):
            items = ", ".join(f"{expression} AS {ident(name)}" for name, expression in new.items())
            self._text = f"SELECT *, {items} FROM {self._source()}"
        else:
            listed = [f"{new.pop(c)} AS {ident(c)}" if c in new else column(c) for c in self.columns]
            listed += [f"{expression} AS {ident(name)}" for name, expression in new.items()]
            self._text = f"SELECT {', '.join(listed)} FROM {self._source()}"
        self.columns += [name for _, name in named if name not in self.columns]
        return self

    def where(self, condition: str) -> Steps:
        """Only the rows where the SQL text ``condition`` holds."""
        self._text = f"SELECT * FROM {self._source()} WHERE {checked(condition)}"
        return self

    def one_partition(self) -> Steps:
        """``coalesce(1)``: the rows in one partition, without a shuffle."""
        self._text = f"SELECT /*+ COALESCE(1) */ * FROM {self._source()}"
        return self

    def sort_within(self, order: Sequence[str]) -> Steps:
        """``sortWithinPartitions`` by the SQL text ``order`` (each item an expression and its direction)."""
        self._text = f"SELECT * FROM {self._source()} SORT BY {checked(', '.join(order))}"
        return self

    def drop(self, names: Iterable[str]) -> Steps:
        """Without the columns named exactly ``names`` (a name not among them is left alone)."""
        gone = set(names) & set(self.columns)
        if gone:
            self.columns = [c for c in self.columns if c not in gone]
            self._text = f"SELECT {', '.join(column(c) for c in self.columns)} FROM {self._source()}"
        return self

    def frame(self) -> DataFrame:
        """The steps as one DataFrame: the input bound to the view for as long as Spark takes to
        analyse the statement (the analysed plan holds the input's own plan, not the view's name)."""
        if self._text is None:
            return self.df
        text = checked(self._text)
        spark = self.df.sparkSession
        session = spark._jsparkSession  # type: ignore[attr-defined]
        plan = built(spark, ("steps", text), lambda: session.sessionState().sqlParser().parsePlan(text))
        self.df._jdf.createOrReplaceTempView(self._view)  # type: ignore[operator]
        try:
            jdf = _datasets(spark).ofRows(session, plan)
        finally:
            session.catalog().dropTempView(self._view)
        return DataFrame(jdf, spark)


def _datasets(spark: SparkSession) -> Any:
    """Spark's ``Dataset`` companion (``ofRows``: a DataFrame of a logical plan, analysed), named in
    full as py4j's JavaClass (a ``jvm.org...`` chain is a failed class lookup per dotted prefix):
    ``org.apache.spark.sql.classic.Dataset`` on Spark 4, ``org.apache.spark.sql.Dataset`` before."""

    def find() -> Any:
        client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
        name = (
            "org.apache.spark.sql.classic.Dataset"
            if int(spark.version.split(".")[0]) >= 4
            else "org.apache.spark.sql.Dataset"
        )
        return JavaClass(name, client)

    return built(spark, ("steps-datasets",), find)
