"""Unchanged TOASTed columns: where Debezium's placeholder is found and how a sink batch marks it.

PostgreSQL's connector sends ``unavailable.value.placeholder`` (``__debezium_unavailable_value``) in
an update's ``after`` for a TOASTed column the update did not change: the text itself in a string
column, its UTF-8 bytes in a bytes column (base64 in JSON), a one-element array holding it in an
array of strings. The sink writes whole rows, so the column must get the key's stored value:

1. here, from the event's ``before`` when it holds one (REPLICA IDENTITY FULL);
2. else the row is marked: :data:`UNAVAILABLE_COLUMN` lists the columns still unknown (the value
   itself stays the placeholder) beside the event the row was read from (:func:`with_event`). The
   CDC reduction (topology/changes.py) takes them from the key's previous change in the same batch,
   and what is still unknown after it is read from the table's stored row of the key
   (topology/toast.py) before the writers run;
3. a column that none of them knows is refused, naming it (never stored as the placeholder). The
   refusal records the event as received (its text, Kafka coordinates and source table), not the
   row it became: a dead-letter table keeps what the source sent (docs/dead-letter.md).

Only the builder's ``.debezium(...)`` (``read_envelope(rejects="mark")``) marks rows; called
directly, :func:`iceberg_sink.sources.debezium.read_envelope` keeps refusing such events (its
result has only its documented columns).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._spark_schema import columns_of
from iceberg_sink._sql import parse
from iceberg_sink._sql_expr import Expr
from iceberg_sink._sql_expr import functions as SF
from iceberg_sink.sources.rejects import REJECT_TYPE, refusal_sql, reject_as
from iceberg_sink.vocab.columns import REJECT_COLUMN, UNAVAILABLE_COLUMN

#: The type of :data:`UNAVAILABLE_COLUMN` leaving the reader: the columns still unknown (in the
#: table's order) and the event the row was read from, as a refusal records it (reason empty).
MARKER_TYPE = T.StructType(
    [
        T.StructField("columns", T.ArrayType(T.StringType()), True),
        T.StructField("event", REJECT_TYPE, True),
    ]
)


def can_hold(dtype: T.DataType) -> bool:
    """Whether a column of ``dtype`` can hold Debezium's placeholder (string, bytes, array of strings)."""
    if isinstance(dtype, T.ArrayType):
        return isinstance(dtype.elementType, T.StringType)
    return isinstance(dtype, T.StringType | T.BinaryType)


def holds(value: Expr, dtype: T.DataType, placeholder: str) -> Expr:
    """Whether ``value`` (of ``dtype``, see :func:`can_hold`) is the placeholder (false for null)."""
    if isinstance(dtype, T.ArrayType):
        found = (SF.size(value) == SF.lit(1)) & (SF.get(value, 0) == SF.lit(placeholder))
    elif isinstance(dtype, T.BinaryType):
        found = value == SF.lit(placeholder).cast("binary")
    else:
        found = value == SF.lit(placeholder)
    return SF.coalesce(found, SF.lit(False))


def _message(name: str, placeholder: str, why: str) -> str:
    return (
        f"column '{name}' holds Debezium's placeholder '{placeholder}' (an unchanged TOASTed value) and {why}; "
        "set REPLICA IDENTITY FULL on the source table so updates carry it (see docs/cdc.md)"
    )


def unavailable(
    row: Expr, old: Expr, op: Expr, schema: T.StructType, placeholder: str, mark: bool
) -> tuple[Expr, Expr | None, Expr | None]:
    """The row image with placeholders replaced by the ``before`` image ``old`` where it holds a
    value; then either (``mark``) the :data:`UNAVAILABLE_COLUMN` value for the rest, or (not
    ``mark``) the refusal reason naming the first of them. Returns (row, marker, reason)."""
    fields: list[Expr] = []
    missing: list[Expr] = []
    reasons: list[Expr] = []
    for f in schema.fields:
        current = row.getField(f.name)
        if not can_hold(f.dataType):
            fields.append(current.alias(f.name))
            continue
        unchanged = op.isin("u", "c", "r") & holds(current, f.dataType, placeholder)
        previous = old.getField(f.name)
        known = previous.isNotNull() & ~holds(previous, f.dataType, placeholder)
        fields.append(SF.when(unchanged & known, previous).otherwise(current).alias(f.name))
        missing.append(SF.when(unchanged & ~known, SF.lit(f.name)))
        reasons.append(
            SF.when(
                unchanged & ~known, SF.lit(_message(f.name, placeholder, "the event's before does not hold its value"))
            )
        )
    carried = SF.when(row.isNull(), SF.lit(None).cast(schema)).otherwise(SF.struct(*fields))
    if not missing:
        return carried, None, None
    if mark:
        names = SF.filter(SF.array(*missing), lambda n: n.isNotNull())
        return carried, SF.when(SF.size(names) > SF.lit(0), names), None
    return carried, None, SF.coalesce(*reasons)


def with_event(df: DataFrame, error_class: str, raw: str, source_table: str | None = None) -> DataFrame:
    """``df`` with its marker (:data:`UNAVAILABLE_COLUMN`, the names :func:`unavailable` gives) as a
    :data:`MARKER_TYPE`: the names beside the event the row was read from, recorded as a refusal of
    ``error_class`` would record it (``raw``, ``source_table``: SQL text, as for
    :func:`iceberg_sink.sources.rejects.refusal_sql`; Kafka's coordinates when ``df`` has them)."""
    if UNAVAILABLE_COLUMN not in columns_of(df):
        return df
    columns = [c for c in columns_of(df) if c != REJECT_COLUMN]
    event = refusal_sql(columns, [("''", error_class)], raw, source_table)
    names = F.col(UNAVAILABLE_COLUMN)
    marker = F.when(names.isNotNull(), F.struct(names.alias("columns"), parse(event).alias("event")))
    return df.withColumn(UNAVAILABLE_COLUMN, marker.cast(MARKER_TYPE))


def unknown_columns(marker: Column) -> Column:
    """The names of the columns still unknown in a marker (null when the row has none)."""
    return marker.getField("columns")


def remark(marker: Column, left: Column) -> Column:
    """``marker`` with the names ``left`` (an array of the columns still unknown), null when none is."""
    return F.when(marker.isNotNull() & (F.size(left) > F.lit(0)), marker.withField("columns", left))


def placeholder_reason(column: Column, why: str) -> Column:
    """The refusal of a change whose column (named by the string Column ``column``; null: none) holds
    the placeholder with no known value, ``why`` saying why (one wording for every such refusal)."""
    return F.when(
        column.isNotNull(),
        F.concat(
            F.lit("column '"), column, F.lit(f"' holds Debezium's placeholder (an unchanged TOASTed value) and {why}")
        ),
    )


def refuse_marked(df: DataFrame, reason: Column) -> DataFrame:
    """Refuse the marked rows where ``reason`` is not null, recording the event each was read from."""
    return reject_as(df, reason, F.col(UNAVAILABLE_COLUMN).getField("event"))


def refuse_unavailable(df: DataFrame, why: str) -> DataFrame:
    """Refuse the rows that still hold a placeholder (``why`` the value is not known), naming the
    first such column, with the event they were read from, and drop :data:`UNAVAILABLE_COLUMN`."""
    if UNAVAILABLE_COLUMN not in columns_of(df):
        return df
    reason = placeholder_reason(
        F.get(unknown_columns(F.col(UNAVAILABLE_COLUMN)), 0),
        f"{why}; set REPLICA IDENTITY FULL on the source table so updates carry it (see docs/cdc.md)",
    )
    return refuse_marked(df, reason).drop(UNAVAILABLE_COLUMN)
