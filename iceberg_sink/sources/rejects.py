"""Rows refused by a source or a rule travel in one column until the job decides: fail, or dead-letter.

A check that can refuse a single row (a Debezium event that is not JSON, a value that does not fit
its declared type, an update without ``after``, a key column that is null, a routed table name the
sink may not write) does not raise by itself: it marks the row with :func:`reject_where`, which fills
:data:`REJECT_COLUMN` (the first reason a row gets wins). The job calls :func:`enforce` once per
batch, in one place for every path: without a dead-letter table the first refused row fails the
batch before anything is committed, with a message naming the reason and the event (Kafka topic,
partition and offset when the batch has them, else the value's first 200 characters); with one, the
refused rows go to it in the same checkpoint (see the dead-letter module).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._spark_schema import columns_of
from iceberg_sink._sql import column, parse, string, struct_type, where
from iceberg_sink.vocab.columns import ERROR_MARKER, REJECT_COLUMN

#: What a refusal records: why, which check (an error class name), which event, and the raw value.
REJECT_TYPE = T.StructType(
    [
        T.StructField("reason", T.StringType(), True),
        T.StructField("error_class", T.StringType(), True),
        T.StructField("event", T.StringType(), True),
        T.StructField("raw", T.StringType(), True),
        T.StructField("source_table", T.StringType(), True),
        T.StructField("topic", T.StringType(), True),
        T.StructField("partition", T.IntegerType(), True),
        T.StructField("offset", T.LongType(), True),
    ]
)

#: Kafka's source columns, read for the coordinates of a refused event when the batch has them.
KAFKA_COLUMNS = ("topic", "partition", "offset")

_RAW_LIMIT = 200

# The mark is computed behind a nondeterministic condition that is always true: Spark's optimizer
# pushes a filter down through a projection only when every expression of the projection is
# deterministic, substituting each column the filter names by the expression that computes it. A
# filter on the mark (fail-fast, dead letters, the change reduction's refusals) would otherwise get a
# copy of every check the mark is made of, and of every conversion those checks read, level by level:
# a Debezium batch of a 22-column MariaDB table took 40 s to plan (6.5 MB of optimized plan, 150 times
# the analyzed one). Behind this condition a filter on the mark stays above the projection that
# computes it, so each check is computed once, where it was written.
_OPTIMIZER_BARRIER = "spark_partition_id() >= 0"


def _label(raw: Column, kafka: bool) -> Column:
    """How a message names an event: ``topic T partition P offset O`` when the batch has Kafka's
    columns (``kafka``), else the raw value's first 200 characters (quoted)."""
    if kafka:
        return F.concat(
            F.lit("topic "),
            F.col("topic").cast("string"),
            F.lit(" partition "),
            F.col("partition").cast("string"),
            F.lit(" offset "),
            F.col("offset").cast("string"),
        )
    text = F.coalesce(raw.cast("string"), F.lit("null"))
    return F.concat(F.lit("value '"), F.substring(text, 1, _RAW_LIMIT), F.lit("'"))


def reject_where(
    df: DataFrame,
    reason: Column | str,
    error_class: str,
    raw: Column | str,
    source_table: Column | str | None = None,
    columns: Sequence[str] | None = None,
) -> DataFrame:
    """Mark the rows where ``reason`` (a string Column) is not null as refused, unless already refused.

    ``raw`` is the event as received (kept whole for a dead-letter table); ``source_table`` the table
    the event names, when known. Kafka coordinates are taken from ``df`` when it has them.
    ``reason``, ``raw`` and ``source_table`` may all be given as Spark SQL text instead: the mark is
    then one expression the JVM parses in one call (:func:`refusal_sql`), the cheap form for a
    batch's hot path; ``columns``: ``df.columns`` when the caller knows them (saves asking Spark).
    """
    names = columns_of(df) if columns is None else columns
    if isinstance(reason, str) and isinstance(raw, str) and (source_table is None or isinstance(source_table, str)):
        return df.withColumn(REJECT_COLUMN, parse(refusal_sql(names, [(reason, error_class)], raw, source_table)))
    assert not isinstance(reason, str) and not isinstance(raw, str) and not isinstance(source_table, str)
    return df.withColumn(REJECT_COLUMN, reject_mark(names, reason, error_class, raw, source_table))


def reject_mark(
    columns: Sequence[str], reason: Column, error_class: str, raw: Column, source_table: Column | None = None
) -> Column:
    """The :data:`REJECT_COLUMN` :func:`reject_where` gives a DataFrame of ``columns`` (its Column
    form): a Column that names columns only, so a caller may build it once and reuse it for every
    batch of the same columns."""
    kafka = all(c in columns for c in KAFKA_COLUMNS)
    refusal = F.struct(
        reason.cast("string").alias("reason"),
        F.lit(error_class).alias("error_class"),
        _label(raw, kafka).alias("event"),
        raw.cast("string").alias("raw"),
        (source_table.cast("string") if source_table is not None else F.lit(None).cast("string")).alias("source_table"),
        (F.col("topic").cast("string") if kafka else F.lit(None).cast("string")).alias("topic"),
        (F.col("partition").cast("int") if kafka else F.lit(None).cast("int")).alias("partition"),
        (F.col("offset").cast("long") if kafka else F.lit(None).cast("long")).alias("offset"),
    )
    mark = F.when(reason.isNotNull(), refusal)
    if REJECT_COLUMN in columns:
        mark = F.coalesce(F.col(REJECT_COLUMN), mark)
    return F.when(parse(_OPTIMIZER_BARRIER), mark.cast(REJECT_TYPE))


def reject_as(df: DataFrame, reason: Column, refusal: Column) -> DataFrame:
    """Mark the rows where ``reason`` is not null as refused, unless already refused, with the
    refusal ``refusal`` (a :data:`REJECT_TYPE` value recorded earlier: the event a row was read
    from, with its raw text and Kafka coordinates) under that reason."""
    mark = F.when(reason.isNotNull(), refusal.withField("reason", reason.cast("string")))
    if REJECT_COLUMN in columns_of(df):
        mark = F.coalesce(F.col(REJECT_COLUMN), mark)
    return df.withColumn(REJECT_COLUMN, F.when(parse(_OPTIMIZER_BARRIER), mark.cast(REJECT_TYPE)))


def refusal_sql(
    columns: Sequence[str],
    checks: Sequence[tuple[str, str]],
    raw: str,
    source_table: str | None = None,
    raw_kept: bool = True,
) -> str:
    """SQL text of :data:`REJECT_COLUMN` after :func:`reject_where` of each (reason, error_class) of
    ``checks`` in turn, on a DataFrame of ``columns``: the first refusal a row gets wins. Without
    ``raw_kept`` (no dead-letter table will store it) the mark's raw value is null where Kafka's
    coordinates name the event, and ``raw`` is not in the text."""
    kafka = all(c in columns for c in KAFKA_COLUMNS)
    if kafka:
        event = (
            "concat('topic ', CAST(`topic` AS STRING), ' partition ', CAST(`partition` AS STRING), "
            "' offset ', CAST(`offset` AS STRING))"
        )
    else:
        text = f"coalesce(CAST(({raw}) AS STRING), 'null')"
        opening, closing = string("value '"), string("'")
        event = f"concat({opening}, substring({text}, 1, {_RAW_LIMIT}), {closing})"
    # The row's raw value (a wide row's JSON text: hundreds of expressions) is written once, whatever
    # the number of checks: each check's own copy made the mark's text, its parsing and its analysis
    # grow with the checks (two checks of a 160-column batch: four copies).
    reasons = [f"CAST(({reason}) AS STRING)" for reason, _ in checks]
    assert reasons, "refusal_sql needs at least one check"
    first = reasons[0] if len(reasons) == 1 else f"coalesce({', '.join(reasons)})"
    error_class = (
        string(checks[0][1])
        if len(checks) == 1
        else "CASE "
        + " ".join(f"WHEN {r} IS NOT NULL THEN {string(c)}" for r, (_, c) in zip(reasons, checks, strict=True))
        + " END"
    )
    fields = {
        "reason": first,
        "error_class": error_class,
        "event": event,
        "raw": f"CAST(({raw}) AS STRING)" if raw_kept or not kafka else "CAST(NULL AS STRING)",
        "source_table": f"CAST(({source_table}) AS STRING)" if source_table is not None else "CAST(NULL AS STRING)",
        "topic": "CAST(`topic` AS STRING)" if kafka else "CAST(NULL AS STRING)",
        "partition": "CAST(`partition` AS INT)" if kafka else "CAST(NULL AS INT)",
        "offset": "CAST(`offset` AS BIGINT)" if kafka else "CAST(NULL AS BIGINT)",
    }
    refusal = "named_struct(" + ", ".join(f"{string(n)}, {e}" for n, e in fields.items()) + ")"
    this = f"CASE WHEN {first} IS NOT NULL THEN {refusal} END"
    # A row already refused keeps its refusal: the first reason a row gets wins.
    mark = this if REJECT_COLUMN not in columns else f"coalesce({column(REJECT_COLUMN)}, {this})"
    mark = f"CAST({mark} AS {struct_type(REJECT_TYPE)})"
    return f"CASE WHEN {_OPTIMIZER_BARRIER} THEN {mark} END"


def has_rejects_column(df: DataFrame) -> bool:
    return REJECT_COLUMN in columns_of(df)


def fail_on_reject(df: DataFrame) -> DataFrame:
    """The fail-fast rule: a refused row fails the batch's Spark job with an ERROR_MARKER message
    (the driver reports it as InvalidInputError, before anything is committed); the column is dropped.
    Costs no extra Spark job: the check runs as the rows are written."""
    if REJECT_COLUMN not in columns_of(df):
        return df
    r = column(REJECT_COLUMN)
    message = (
        f"concat({string(ERROR_MARKER + ' ')}, coalesce({r}.`reason`, 'refused'), ' (event: ', "
        f"coalesce({r}.`event`, 'unknown'), ')')"
    )
    # raise_error is typed null; the filter keeps every row that was not refused (all of them, or the job failed).
    return where(df, f"(CASE WHEN {r} IS NOT NULL THEN raise_error({message}) END) IS NULL").drop(REJECT_COLUMN)
