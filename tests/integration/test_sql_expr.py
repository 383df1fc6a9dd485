"""iceberg_sink/_sql_expr.py against PySpark's own Column calls: the same expression built both ways
reads the same values, over names and literals data chooses (dots, backticks, quotes, backslashes,
``${...}``, control characters, emoji), nested lambdas, and literals at the edges of their types,
under both of Spark's literal-parsing modes.

Spark substitutes ``${...}`` in SQL text (``spark.sql.variable.substitute``): ``${x}`` reads as "",
``${env:HOME}`` as the driver's home directory; the top-level columns have decoys named as those
substitutions, holding other values."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._sql_expr import Expr, sql_type
from iceberg_sink._sql_expr import functions as SF

NAMES = [
    "a.b",
    "we`ird",
    "it's",
    "back\\slash",
    "tab\there",
    "new\nline",
    "nul\x00x",
    "ü 😀",
    "select",
    " ",
    "$",
    "a$b{c}",
]
SUBSTITUTED = ["price_${currency}", "${env:HOME}", "it's ${x}\\"]  # names Spark would substitute in SQL text

FIELDS = T.StructType(
    [T.StructField(n, T.StringType()) for n in NAMES + SUBSTITUTED] + [T.StructField("n", T.LongType())]
)
TOP = ["price_${currency}", "price_", "h${env:HOME}", f"h{os.environ['HOME']}"]  # each ${} name, then its decoy
ROW_TYPE = T.StructType(
    [
        T.StructField("s", FIELDS),
        T.StructField("xs", T.ArrayType(T.LongType())),
        T.StructField("m", T.MapType(T.StringType(), T.LongType())),
        T.StructField("j", T.StringType()),
        T.StructField("f", T.DoubleType()),
    ]
)


def _rows() -> list[tuple[Any, ...]]:
    strings = {n: f"v-{n}-'\\`${{x}}" for n in NAMES + SUBSTITUTED}
    return [
        (
            ({**strings, "n": 2**40}, [1, -2, 3], {"k'1": 5, "": -7, "${x}": 3}, '{"it\'s": "1", "a.b": [1,2]}', 1e308),
            *range(len(TOP)),
        ),
        (({**{n: None for n in NAMES + SUBSTITUTED}, "n": None}, [], {}, "not json", float("nan")), *range(10, 14)),
        ((None, None, None, None, None), None, None, None, None),
    ]


# (what, the expression through Column calls, through SQL text): F and SF share the interface.
def _cases() -> list[tuple[str, Callable[[Any], Any]]]:
    def fields(f: Any) -> Any:
        row = f.col("r")
        return f.struct(*[row.getField("s").getField(n).alias(n + "!") for n in NAMES])

    def substituted_fields(f: Any) -> Any:
        row = f.col("r")
        return f.struct(*[row.getField("s").getField(n).alias(n + "${y}") for n in SUBSTITUTED])

    def columns(f: Any) -> Any:
        return f.array(*[f.col(n).cast("string") for n in TOP], f.col("r").getField("m").getItem("${x}").cast("string"))

    def literals(f: Any) -> Any:
        values = [
            "it's \\ `q` \n \t \x01 😀",
            "",
            2**31 - 1,
            -(2**31),
            2**31,
            -(2**63),
            2**63 - 1,
            0.1,
            -0.0,
            1e-300,
            -1.5e300,
            True,
            False,
        ]
        return f.array(*[f.lit(v).cast("string") for v in values])

    def lambdas(f: Any) -> Any:
        xs = f.col("r").getField("xs")
        # Nested: the inner lambda's variable must not capture the outer one.
        return f.transform(
            xs, lambda x: f.aggregate(f.transform(xs, lambda y: y * x), f.lit(0).cast("long"), lambda a, b: a + b)
        )

    def maps(f: Any) -> Any:
        m = f.col("r").getField("m")
        doubled = f.transform_values(m, lambda _k, v: v * 2)
        zipped = f.map_zip_with(m, doubled, lambda _k, a, b: f.when(a.isNull(), f.lit(-1)).otherwise(a + b))
        return f.get(f.filter(f.map_values(zipped), lambda v: v > 0), 0)

    def case(f: Any) -> Any:
        n = f.col("r").getField("s").getField("n")
        return (
            f.when(n.isNull(), f.lit("none"))
            .when((n > 2**31) & ~(n == 0) | n.isin(1, 2), f.concat(f.lit("big:"), n.cast("string")))
            .otherwise(f.lit(None).cast("string"))
        )

    def json(f: Any) -> Any:
        j = f.col("r").getField("j")
        parsed = f.from_json(
            j,
            T.StructType(
                [
                    T.StructField("it's", T.IntegerType()),
                    T.StructField("a.b", T.ArrayType(T.LongType())),
                    T.StructField("${x}", T.StringType()),
                ]
            ),
        )
        texts = f.from_json(j, T.MapType(T.StringType(), T.StringType()))
        return f.struct(
            parsed.alias("p"),
            f.try_element_at(texts, f.lit("a.b")).alias("t"),
            f.size(parsed.getField("a.b")).alias("n"),
        )

    def arithmetic(f: Any) -> Any:
        n = f.col("r").getField("s").getField("n")
        x = f.col("r").getField("f")
        return f.array(
            (n * 3 - 1).cast("string"),
            (n / 7).cast("string"),
            (-n).cast("string"),
            f.try_multiply(n, f.lit(2**40)).cast("string"),
            f.try_add(n, f.lit(1)).cast("string"),
            f.floor(n.cast("decimal(38,0)") / f.lit(86_400_000_000)).try_cast("long").cast("string"),
            f.conv(f.hex(n).substr(1, 2), 16, 10),
            f.greatest(f.length(f.hex(n)), f.lit(3)).cast("string"),
            f.regexp_replace((-n).cast("string"), f.lit("^-"), f.lit("")),
            x.isin(float("inf"), float("-inf")).cast("string"),
            f.lower(x.cast("string")).contains("inf").cast("string"),
            f.substring(x.cast("string"), 1, 3),
            f.date_add(f.lit("1970-01-01").cast("date"), f.lit(19000)).cast("string"),
            (
                f.lit("1970-01-01 00:00:00").cast("timestamp_ntz")
                + f.make_dt_interval(f.lit(1), f.lit(0), f.lit(0), f.lit(1.5).cast("decimal(18,6)"))
            ).cast("string"),
            f.sequence(f.lit(1), f.lit(3)).cast("string"),
            f.zip_with(f.array(f.lit(1), f.lit(2)), f.array(f.lit(3)), lambda a, b: f.coalesce(b, a)).cast("string"),
        )

    def casts(f: Any) -> Any:
        return f.struct(
            f.lit(None).cast(FIELDS).alias("null_struct"),  # ${} names: a typed null from from_json
            f.lit("${x}").alias("${x}"),
            f.lit("12").try_cast("int").alias("ok"),
            f.lit("x").try_cast("int").alias("bad"),
            f.lit("1").cast(T.DecimalType(10, 2)).alias("dec"),
        )

    return [
        ("fields", fields),
        ("substituted_fields", substituted_fields),
        ("columns", columns),
        ("literals", literals),
        ("lambdas", lambdas),
        ("maps", maps),
        ("case", case),
        ("json", json),
        ("arithmetic", arithmetic),
        ("casts", casts),
    ]


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return _canonical(value.asDict(recursive=True))
    return value


def _frame(spark: SparkSession) -> DataFrame:
    top = [T.StructField(n, T.LongType()) for n in TOP]
    return spark.createDataFrame(_rows(), T.StructType([T.StructField("r", ROW_TYPE), *top]))


@pytest.mark.parametrize("case", _cases(), ids=[c[0] for c in _cases()])
def test_sql_text_reads_what_the_column_calls_read(
    spark: SparkSession, literal_mode: bool, case: tuple[str, Callable[[Any], Any]]
) -> None:
    df = _frame(spark)
    build = case[1]
    if literal_mode and case[0] == "substituted_fields":
        # A struct field lookup needs a literal, and under escapedStringLiterals no literal can hold
        # "${" without Spark substituting it: the name is not found, and the batch fails loudly.
        with pytest.raises(AnalysisException):
            df.select(build(SF).alias("v").column()).collect()
        return
    want_column = build(F)
    got_expr = build(SF)
    assert isinstance(want_column, Column) and isinstance(got_expr, Expr)
    want = df.select(want_column.alias("v"))
    got = df.select(got_expr.alias("v").column())
    assert got.schema["v"].dataType == want.schema["v"].dataType, (got.schema, want.schema)
    assert _canonical([r["v"] for r in got.collect()]) == _canonical([r["v"] for r in want.collect()])


def test_types_keep_names_and_required_fields(spark: SparkSession) -> None:
    """A struct type's text quotes its field names and keeps NOT NULL, and parses back to the same type."""
    nested = T.StructType(
        [
            T.StructField("it's `x`", T.ArrayType(T.MapType(T.StringType(), T.DecimalType(38, 0)))),
            T.StructField("req", T.LongType(), nullable=False),
            T.StructField("t", T.TimestampNTZType()),
        ]
    )
    parsed = spark.sql(f"SELECT CAST(NULL AS {sql_type(nested)}) AS v").schema["v"].dataType
    assert parsed == nested


def test_an_expression_has_no_truth_value() -> None:
    """As with Column: ``a and b`` or ``if expr`` would silently drop a condition."""
    with pytest.raises(ValueError, match="no truth value"):
        bool(SF.col("a") == 1)
    with pytest.raises(ValueError, match="must be aliased"):
        SF.struct(SF.col("a"))
    with pytest.raises(TypeError, match="no SQL literal"):
        SF.lit(object())
