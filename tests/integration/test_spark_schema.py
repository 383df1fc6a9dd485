"""A DataFrame's schema served from the schemas the driver rendered before (iceberg_sink/_spark_schema.py).

The answer must be the schema PySpark itself renders for the DataFrame, whatever schemas were asked
before: drawn schemas that differ from one another only in one place (a field's nullability, its
metadata, the case of its name, a decimal's precision, a nested field's nullability, a string's
collation, char and varchar) are asked in a shuffled order, several times each, and every answer is
compared with a fresh rendering by PySpark. A schema asked again must not be rendered again, and the
answer is a copy: adding a field to it changes no other DataFrame's schema.
"""

from __future__ import annotations

import random

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from iceberg_sink import _spark_schema
from iceberg_sink._spark_schema import columns_of, schema_of


def _fresh(df: DataFrame) -> T.StructType:
    """``df``'s schema as PySpark renders it (JSON from the JVM), on a new DataFrame object of the same plan."""
    return DataFrame(df._jdf, df.sparkSession).schema


def _kept(spark: SparkSession) -> int:
    rendered = _spark_schema._RENDERED.get(spark.sparkContext)
    return 0 if rendered is None else sum(len(v) for v in rendered.by_hash.values())


def _variants() -> list[str]:
    """SQL select lists whose schemas differ pairwise, most in one place only."""
    base = "CAST(1 AS BIGINT) AS id, CAST('a' AS STRING) AS name, CAST(1.5 AS DECIMAL(10,2)) AS price"
    return [
        base,
        base.replace("DECIMAL(10,2)", "DECIMAL(11,2)"),
        base.replace("DECIMAL(10,2)", "DECIMAL(10,3)"),
        base.replace("AS name", "AS Name"),
        base.replace("CAST(1 AS BIGINT) AS id", "CAST(NULL AS BIGINT) AS id"),  # nullable id
        base.replace("CAST(1 AS BIGINT)", "CAST(1 AS INT)"),
        base + ", named_struct('a', 1, 'b', CAST(NULL AS INT)) AS s",
        base + ", named_struct('a', 1, 'b', 2) AS s",  # only the nested field's nullability differs
        base + ", named_struct('a', 1, 'B', 2) AS s",
        base + ", array(1, 2) AS xs",
        base + ", array(1, NULL) AS xs",  # contains nulls
        base + ", map('k', 1) AS m",
        base + ", CAST('x' AS CHAR(3)) AS c",  # char and varchar are metadata on a string field
        base + ", CAST('x' AS VARCHAR(3)) AS c",
        base + ", CAST('x' AS VARCHAR(4)) AS c",
        base + ", CAST('x' AS STRING) AS c",
        base + ", 'x' COLLATE UTF8_LCASE AS c",
        base + ", 'x' COLLATE UNICODE_CI AS c",
        base + ", TIMESTAMP'2020-01-01 00:00:00' AS t",
        base + ", TIMESTAMP_NTZ'2020-01-01 00:00:00' AS t",
    ]


def _frame(spark: SparkSession, select: str, comment: str | None) -> DataFrame:
    df = spark.sql(f"SELECT {select}")
    if comment is not None:  # metadata only: the same names and types
        df = df.withMetadata("id", {"comment": comment})
    return df


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_answer_is_the_schema_pyspark_renders(spark: SparkSession, seed: int) -> None:
    rng = random.Random(seed)
    try:
        spark.sql("SELECT 'x' COLLATE UTF8_LCASE").collect()
        variants = _variants()
    except Exception:  # Spark before 4.0: no collations
        variants = [v for v in _variants() if "COLLATE" not in v]
    drawn = [(v, c) for v in variants for c in (None, "a", "b")]
    asks = drawn * 3
    rng.shuffle(asks)
    for select, comment in asks:
        df = _frame(spark, select, comment)
        answer = schema_of(df)
        fresh = _fresh(df)
        assert answer == fresh, (select, comment)
        assert answer.json() == fresh.json(), (select, comment)  # metadata and collations too
        assert columns_of(_frame(spark, select, comment)) == fresh.fieldNames()


def test_a_schema_asked_again_is_not_rendered_again_and_the_answer_is_a_copy(spark: SparkSession) -> None:
    _spark_schema._RENDERED.pop(spark.sparkContext, None)  # other tests of the session may have filled it
    select = "CAST(1 AS BIGINT) AS id, " + ", ".join(f"CAST({i} AS STRING) AS c{i}" for i in range(160))
    first = spark.sql(f"SELECT {select}")
    schema_of(first)
    kept = _kept(spark)
    again = spark.sql(f"SELECT {select}").where("id > 0")  # another plan, the same schema
    answer = schema_of(again)
    assert _kept(spark) == kept  # served from what was rendered
    assert answer == _fresh(again)
    assert again.schema is answer  # PySpark's own cache holds it: mapInArrow's df.columns renders nothing
    answer.add("extra", T.IntegerType())
    assert "extra" not in schema_of(first).fieldNames()
    assert "extra" not in schema_of(spark.sql(f"SELECT {select}")).fieldNames()
    other = spark.sql(f"SELECT {select}, 1 AS more")
    schema_of(other)
    assert _kept(spark) == kept + 1


def test_the_kept_schemas_are_bounded(spark: SparkSession) -> None:
    for i in range(_spark_schema.KEPT + 20):
        df = spark.sql(f"SELECT 1 AS bounded_{i}")
        assert schema_of(df).fieldNames() == [f"bounded_{i}"]
    rendered = _spark_schema._RENDERED[spark.sparkContext]
    assert len(rendered.by_hash) == _spark_schema.KEPT  # the oldest forgotten first
    assert schema_of(spark.sql("SELECT 1 AS bounded_0")).fieldNames() == ["bounded_0"]  # forgotten: rendered again
