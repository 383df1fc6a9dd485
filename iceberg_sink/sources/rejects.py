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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink.topology.changes import ERROR_MARKER

#: The column that carries a row's refusal (null for a good row). Never stored in a table.
REJECT_COLUMN = "__iceberg_sink_reject"

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


def event_label(df: DataFrame, raw: Column) -> Column:
    """How a message names an event: ``topic T partition P offset O`` when ``df`` has Kafka's
    columns, else the raw value's first 200 characters (quoted)."""
    if all(c in df.columns for c in KAFKA_COLUMNS):
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
    reason: Column,
    error_class: str,
    raw: Column,
    source_table: Column | None = None,
) -> DataFrame:
    """Mark the rows where ``reason`` (a string Column) is not null as refused, unless already refused.

    ``raw`` is the event as received (kept whole for a dead-letter table); ``source_table`` the table
    the event names, when known. Kafka coordinates are taken from ``df`` when it has them.
    """
    kafka = all(c in df.columns for c in KAFKA_COLUMNS)
    refusal = F.struct(
        reason.cast("string").alias("reason"),
        F.lit(error_class).alias("error_class"),
        event_label(df, raw).alias("event"),
        raw.cast("string").alias("raw"),
        (source_table.cast("string") if source_table is not None else F.lit(None).cast("string")).alias("source_table"),
        (F.col("topic").cast("string") if kafka else F.lit(None).cast("string")).alias("topic"),
        (F.col("partition").cast("int") if kafka else F.lit(None).cast("int")).alias("partition"),
        (F.col("offset").cast("long") if kafka else F.lit(None).cast("long")).alias("offset"),
    )
    mark = F.when(reason.isNotNull(), refusal)
    if REJECT_COLUMN in df.columns:
        mark = F.coalesce(F.col(REJECT_COLUMN), mark)
    return df.withColumn(REJECT_COLUMN, mark.cast(REJECT_TYPE))


def has_rejects_column(df: DataFrame) -> bool:
    return REJECT_COLUMN in df.columns


def fail_on_reject(df: DataFrame) -> DataFrame:
    """The fail-fast rule: a refused row fails the batch's Spark job with an ERROR_MARKER message
    (the driver reports it as InvalidInputError, before anything is committed); the column is dropped.
    Costs no extra Spark job: the check runs as the rows are written."""
    if REJECT_COLUMN not in df.columns:
        return df
    r = F.col(REJECT_COLUMN)
    message = F.concat(
        F.lit(f"{ERROR_MARKER} "),
        F.coalesce(r.getField("reason"), F.lit("refused")),
        F.lit(" (event: "),
        F.coalesce(r.getField("event"), F.lit("unknown")),
        F.lit(")"),
    )
    checked = F.when(r.isNotNull(), F.raise_error(message))
    # raise_error is typed null; the filter keeps every row that was not refused (all of them, or the job failed).
    return df.where(checked.isNull()).drop(REJECT_COLUMN)
