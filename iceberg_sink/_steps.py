"""A DataFrame's next steps written as SQL text and made one DataFrame by one Spark analysis.

Each DataFrame step (``withColumn``, ``where``, ``select``, ``sortWithinPartitions``, ``drop``) is a
Dataset that Spark analyses whole when it is made, and its Columns are Py4J round trips (a name
PySpark resolves through ``jvm.functions`` is a failed class lookup over every jar of the class
path): the change reduction's DataFrame steps were seven analyses of a growing plan in every batch.
The same steps written as nested SELECTs over a placeholder relation are parsed once per Spark
context and text (the text of a batch is the text of the batch before it: Spark's SQL parser took
70 % of such a statement's JVM time); each batch puts its input's own plan in the placeholder's
place (``withNewChildren`` up the parsed plan's single line of nodes, two round trips a node, with
nothing registered in the session's catalog) and has the whole analysed once.

Each step is its own subquery, so the optimizer sees the operators the DataFrame steps made (a
nondeterministic column still stops filters below it), and a parsed plan is never changed: each
batch's copy is its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from py4j.java_gateway import JavaClass
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink._spark_schema import built
from iceberg_sink._sql import checked, column, ident, quoted

#: The placeholder relation the text reads from; each batch's input takes its place.
_INPUT = "__iceberg_sink_steps_input"


class Steps:
    """Steps of ``df`` as SQL text, run as one statement by :meth:`frame`. ``columns``: the input's
    column names, kept in step with the steps (a column named twice is not supported)."""

    def __init__(self, df: DataFrame, columns: Sequence[str]) -> None:
        self.df = df
        self.columns = list(columns)
        self._text: str | None = None
        self._depth = 0

    def _source(self) -> str:
        if self._text is None:
            return quoted(_INPUT)
        self._depth += 1
        return f"({self._text}) AS {quoted(f'__iceberg_sink_step_{self._depth}')}"

    def add(self, *named: tuple[str, str]) -> Steps:
        """Columns of SQL text, each (expression, name) as ``withColumn``: a column of that name is
        replaced where it stands, any other added at the end."""
        new = {name: expression for expression, name in named}
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
        self._text = f"SELECT * FROM {self._source()} WHERE {condition}"
        return self

    def one_partition(self) -> Steps:
        """``coalesce(1)``: the rows in one partition, without a shuffle."""
        self._text = f"SELECT /*+ COALESCE(1) */ * FROM {self._source()}"
        return self

    def sort_within(self, order: Sequence[str]) -> Steps:
        """``sortWithinPartitions`` by the SQL text ``order`` (each item an expression and its direction)."""
        self._text = f"SELECT * FROM {self._source()} SORT BY {', '.join(order)}"
        return self

    def drop(self, names: Iterable[str]) -> Steps:
        """Without the columns named exactly ``names`` (a name not among them is left alone)."""
        gone = set(names) & set(self.columns)
        if gone:
            self.columns = [c for c in self.columns if c not in gone]
            self._text = f"SELECT {', '.join(column(c) for c in self.columns)} FROM {self._source()}"
        return self

    def frame(self) -> DataFrame:
        """The steps as one DataFrame: the statement's parsed plan with the input's own plan in place
        of the placeholder relation, analysed. The text is checked to hold no ``${`` here, where it
        reaches Spark (iceberg_sink/_sql.py)."""
        if self._text is None:
            return self.df
        text = checked(self._text)
        spark = self.df.sparkSession
        session = spark._jsparkSession  # type: ignore[attr-defined]
        chain = built(spark, ("steps", text), lambda: _chain(session.sessionState().sqlParser().parsePlan(text)))
        classes = _classes(spark)
        plan = self.df._jdf.logicalPlan()  # type: ignore[operator]
        for node in reversed(chain):
            plan = node.withNewChildren(getattr(classes.empty, "$colon$colon")(plan))
        return DataFrame(classes.datasets.ofRows(session, plan), spark)


def _chain(plan: Any) -> list[Any]:
    """The nodes of a parsed statement from its top to the one above its relation (each step has one
    child: a projection, a filter, a sort, a hint, a subquery's alias)."""
    chain = []
    while plan.children().size() == 1:
        chain.append(plan)
        plan = plan.children().apply(0)
    assert plan.getClass().getSimpleName() == "UnresolvedRelation", plan.getClass().getName()
    return chain


@attrs.frozen
class _Classes:
    datasets: Any  # Spark's Dataset companion: ofRows, a DataFrame of a logical plan, analysed
    empty: Any  # Scala's empty List: empty.$colon$colon(x) is List(x)


def _classes(spark: SparkSession) -> _Classes:
    """The JVM classes :meth:`Steps.frame` calls, named in full as py4j's JavaClass (a ``jvm.org...``
    chain is a failed class lookup per dotted prefix): Spark 4's ``Dataset`` is in ``classic``."""

    def find() -> _Classes:
        client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
        classic = int(spark.version.split(".")[0]) >= 4
        name = "org.apache.spark.sql.classic.Dataset" if classic else "org.apache.spark.sql.Dataset"
        return _Classes(
            JavaClass(name, client), getattr(JavaClass("scala.collection.immutable.Nil$", client), "MODULE$")
        )

    classes: _Classes = built(spark, ("steps-classes",), find)
    return classes
