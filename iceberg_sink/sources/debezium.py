"""Debezium change events (JSON, as Kafka Connect's JsonConverter writes them) as rows and operations.

A Debezium change event's value is an envelope, with or without the ``schema`` part::

    {"schema": {...}, "payload": {"before": {...} | null, "after": {...} | null,
                                  "op": "c" | "u" | "d" | "r", "ts_ms": ...,
                                  "source": {"db": ..., "schema": ..., "table": ..., "lsn": ..., ...}}}

(``schemas.enable=false`` leaves the payload alone at the top.) :func:`read_envelope` turns a
Kafka-style DataFrame (one string or binary ``value`` column per event) into one row per event:

- the row's columns: ``after`` for c, u and r events, ``before`` for d (a delete carries its key there);
- the operation column (``op``): Debezium's code as is; :meth:`IcebergSinkBuilder.cdc` accepts c and
  r as inserts, u as updates, d as deletes;
- the order column (``lsn``): ``payload.source.lsn`` by default, any payload path (``ts_ms``,
  ``source.ts_ms``, ...) with ``order_by=``;
- the source table column (``source_table``): the table name sources/source_names.py makes of the
  ``source`` fields (by default the table's name, ``<schema>__<table>`` outside the default schema),
  for ``.route(table_column=...)``;
- the key names column (``key_columns``, with ``key_from=`` the Kafka message key column): the field
  names of Debezium's message key (the source row's primary key), for ``.cdc(key_column=...)``.

Tombstones (a null value: the Kafka delete marker Debezium sends after a ``d`` event for log
compaction) and empty values are skipped, as are message events (op ``m``) and the events a
connector sends beside its change events, on topics a subscription to its topic prefix also reads:
schema changes, transaction boundaries and heartbeats (:func:`iceberg_sink.sources.envelope.connector_event`).

Column types come from the envelopes' ``schema`` part when they carry one (Kafka Connect types: int8,
int16, int32 to int; int64 to long; float32 to float; float64 to double; boolean; string; bytes to
binary; struct, array, map), the union over the batch's distinct schemas, merged along Iceberg's
legal promotions (so a source column altered from INT to BIGINT mid-batch widens; anything else is an
error naming the column). Logical types keep their physical type (Debezium's ``io.debezium.time.Date``
is an int of days, a precise ``Decimal`` base64 bytes: configure the connector's
``decimal.handling.mode`` / ``time.precision.mode`` for other representations). Without a schema
part the types are inferred from the batch's ``after`` and ``before`` documents as
:func:`iceberg_sink.sources.readers.read_json` does; in a batch mixing both, the columns that only events
without a schema part have are added to the schema parts' union with their inferred types. A field
whose values are of several JSON kinds (``"id": "5002"`` among long ids) takes the type of the
sink's table column (or of the schema parts), else the kind most events give it, and an event whose
value does not fit is refused, naming the field (:mod:`iceberg_sink.sources.bare_types`). Either
way the batch's schema is the union of its events', so schema evolution (``.schema_evolution``) sees
every new column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._session import classic_frame
from iceberg_sink._spark_schema import built, columns_of
from iceberg_sink._sql import column, named, string
from iceberg_sink._sql_expr import Expr
from iceberg_sink._sql_expr import functions as SF
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.sources import toast
from iceberg_sink.sources.arrow_rows import arrow_udfs, reading_column, row_reader
from iceberg_sink.sources.bare_types import settle
from iceberg_sink.sources.connect_types import (
    VARIABLE_SCALE_DECIMAL,
    connect_to_spark,
    convert_value,
    fit_value,
    logical_name,
    physical_type,
    sub_path,
    type_label,
)
from iceberg_sink.sources.envelope import (
    AFTER,
    BEFORE,
    IMAGE,
    OP,
    PAYLOAD,
    SCHEMA,
    EnvelopeArgs,
    LastCounts,
    batch_stats,
    envelope_columns,
    unlike,
    warn_unordered,
)
from iceberg_sink.sources.event_order import order_paths
from iceberg_sink.sources.readers import union_types
from iceberg_sink.sources.rejects import fail_on_reject, reject_where
from iceberg_sink.table.schema import case_clashes
from iceberg_sink.vocab.columns import SOURCE_COLUMN, UNAVAILABLE_COLUMN

_ROW = "__iceberg_sink_row"
_REASON = "__iceberg_sink_dbz_reason"
_ROW_REASON = "__iceberg_sink_dbz_row_reason"
_TEXTS = "__iceberg_sink_dbz_texts"
_PARSED = "__iceberg_sink_dbz_parsed"
_CONVERTED = "__iceberg_sink_dbz_converted"
_OLD = "__iceberg_sink_dbz_old"

#: The error class a refused Debezium event carries (sources/rejects.py).
REJECT_CLASS = "InvalidInputError"

#: What :func:`read_envelope` does with a refused event: fail the job reading it, or mark it for the sink.
REJECT_POLICIES = ("fail", "mark")

#: ``truncate=`` policies of :func:`read_envelope`.
TRUNCATE_POLICIES = ("apply", "skip", "fail")

#: What PostgreSQL's connector sends for an unchanged TOASTed column (``unavailable.value.placeholder``).
UNAVAILABLE_VALUE = "__debezium_unavailable_value"


def _refusal(
    value: Expr, raw: Expr, dtype: T.DataType, schema: dict[str, Any] | None, path: str, texts: Expr | None = None
) -> Expr:
    """The reason (a string Expr, null when none) a value read from JSON text ``raw`` is refused:
    a non-null JSON value that reads as null (it does not fit its declared type: an int32 holding
    3000000000, a boolean "yes", bad base64, a decimal wider than its precision), or a float that
    became infinite from a finite number; checked for every field, nested ones too."""
    name = f"field '{path}'" if path else "the row image"
    message = SF.concat(
        SF.lit(f"{name} holds '"),
        SF.substring(raw, 1, 100),
        SF.lit(f"', which does not fit its declared type {type_label(schema, dtype)}"),
    )
    lost = raw.isNotNull() & value.isNull()
    if isinstance(dtype, T.FloatType | T.DoubleType):
        lost = lost | (raw.isNotNull() & value.isin(float("inf"), float("-inf")) & ~SF.lower(raw).contains("inf"))
    here = SF.when(lost, message)
    fields = (schema or {}).get("fields") if schema is not None else None
    by_name = {f.get("field"): f for f in fields or [] if isinstance(f, dict)}
    if isinstance(dtype, T.StructType):
        if schema is not None and logical_name(schema) == VARIABLE_SCALE_DECIMAL:
            return here
        if texts is None:
            texts = SF.from_json(raw, T.MapType(T.StringType(), T.StringType()))
        children = [
            _refusal(
                value.getField(f.name),
                SF.try_element_at(texts, SF.lit(f.name)),
                f.dataType,
                by_name.get(f.name) if schema is not None else None,
                sub_path(path, f.name),
            )
            for f in dtype.fields
        ]
        return SF.coalesce(here, *children) if children else here
    if isinstance(dtype, T.ArrayType):
        items = (schema or {}).get("items") if schema is not None else None
        texts = SF.from_json(raw, T.ArrayType(T.StringType()))
        inner = SF.zip_with(value, texts, lambda v, r: _refusal(v, r, dtype.elementType, items, f"{path}.element"))
        return SF.coalesce(here, SF.get(SF.filter(inner, lambda x: x.isNotNull()), 0))
    if isinstance(dtype, T.MapType) and isinstance(dtype.keyType, T.StringType):
        values = (schema or {}).get("values") if schema is not None else None
        entries = SF.from_json(raw, T.MapType(T.StringType(), T.StringType()))
        inner = SF.map_zip_with(
            value, entries, lambda _k, v, r: _refusal(v, r, dtype.valueType, values, f"{path}.value")
        )
        return SF.coalesce(here, SF.get(SF.filter(SF.map_values(inner), lambda x: x.isNotNull()), 0))
    return here


# -- row schemas


def _row_schema(envelope_text: str) -> dict[str, Any]:
    try:
        envelope = json.loads(envelope_text)
    except ValueError as e:
        raise InvalidInputError(
            f"Debezium envelope: its 'schema' part is not JSON ({e}): {envelope_text[:200]!r}"
        ) from e
    fields = {f.get("field"): f for f in envelope.get("fields") or [] if isinstance(f, dict)}
    row = fields.get("after") or fields.get("before")
    if row is None:
        raise InvalidInputError(
            "Debezium envelope: its schema has no 'after' or 'before' field; expected a Debezium change "
            f"event envelope, received schema fields {sorted(k for k in fields if k)}"
        )
    return dict(row)


def _row_schema_from_envelopes(schemas: list[str]) -> T.StructType | None:
    """The union of the row schemas (``after``, else ``before``) of distinct envelope schemas."""
    merged: T.DataType | None = None
    problems: list[str] = []
    for text in schemas:
        row_type = connect_to_spark(_row_schema(text))
        merged = row_type if merged is None else union_types(merged, row_type, "", problems)
    if problems:
        raise InvalidInputError(
            "Debezium envelopes of this batch give columns types no single column type holds (only Iceberg's "
            "promotions int->long, float->double and wider decimals are merged): " + "; ".join(problems)
        )
    assert merged is None or isinstance(merged, T.StructType)
    return merged


def _merge_row_schemas(declared: T.StructType, inferred: T.StructType) -> T.StructType:
    """The schema parts' row type plus the fields only the events without one have (types inferred
    from their documents). A declared field keeps its declared type: the events without a schema are
    parsed with it, as when every event of the batch names a field."""
    fields = list(declared.fields)
    known = {f.name: i for i, f in enumerate(fields)}
    for field in inferred.fields:
        i = known.get(field.name)
        if i is None:
            fields.append(field)
            continue
        ours = fields[i].dataType
        if isinstance(ours, T.StructType) and isinstance(field.dataType, T.StructType):
            fields[i] = T.StructField(field.name, _merge_row_schemas(ours, field.dataType), True)
    return T.StructType(fields)


def _collisions(table_column: str) -> str:
    """SQL text: a reason for the rows whose routed name another source of this batch also maps to."""
    name, identity = column(table_column), column(SOURCE_COLUMN)
    low, high = (f"{f}({identity}) OVER (PARTITION BY {name})" for f in ("min", "max"))
    other = f"CASE WHEN {identity} = {low} THEN {high} ELSE {low} END"
    opening, middle = string("routed table name '"), string("' is the name of two sources in this batch (")
    closing = string("); table_fields must give each source its own name (see docs/cdc.md)")
    return (
        f"CASE WHEN {name} IS NOT NULL AND {low} != {high} THEN "
        f"concat({opening}, {name}, {middle}, {identity}, ' and ', {other}, {closing}) END"
    )


def read_envelope(
    df: DataFrame,
    value_column: str = "value",
    *,
    op_column: str = "op",
    order_by: str | Sequence[str] | None = "source.lsn",
    order_column: str = "lsn",
    order_type: str | Sequence[str] = "long",
    table_column: str | None = "source_table",
    table_fields: Sequence[str] | None = None,
    row_schema: T.StructType | None = None,
    row_column: str | None = None,
    keep: Sequence[str] = (),
    key_from: str | None = None,
    key_column: str = "key_columns",
    truncate: str = "fail",
    unavailable_value: str | None = UNAVAILABLE_VALUE,
    rejects: str = "fail",
    last_counts: LastCounts | None = None,
) -> DataFrame:
    """Debezium JSON change events in ``value_column`` as rows, their operation, order and source table.

    Plug the result into ``.cdc(op_column="op", key=[...], order_by="lsn")``; see the module docstring.
    An event that cannot be read (not JSON, an unknown op, an update without ``after``, a value that
    does not fit its declared type, ...) is refused with :func:`iceberg_sink.sources.rejects.reject_where`,
    naming the reason and the event. Called directly (``rejects="fail"``, the default), the first
    refused event fails the Spark job that reads the result, and the result has only the columns
    listed below; the builder's ``.debezium(...)`` passes ``rejects="mark"``, so the sink fails the
    batch on it or dead-letters it (``.dead_letter(...)``).

    Args:
        df: a bounded DataFrame of events (a micro-batch; for streams use the builder's
            ``.debezium(...)``, which applies this to every micro-batch).
        value_column: the event value (string or binary JSON); null values (tombstones) are skipped.
        op_column: name of the operation column in the result (Debezium's c, u, d, r; t with ``truncate="apply"``).
        order_by: payload path of the order value (``source.lsn``, ``ts_ms``, ``source.ts_ms``, ...), or
            a list of paths ordered lexicographically (MySQL: ``["source.file", "source.pos", "source.row"]``
            with ``order_type=["binlog", "long", "long"]``,
            the order column is then a struct of them, null when any is missing); None for no order column.
        order_column: name of the order column in the result.
        order_type: Spark type the order value is cast to (``long``, ``string``, ...), or ``"binlog"``
            for a binlog file name (``source.file``), ordered by its sequence number (a long: names do
            not sort as text past ``binlog.999999``); one per path for a list of paths (a single type
            applies to all of them).
        table_column: name of the source table column in the result; None for none.
        table_fields: ``source`` fields forming the source table name; None (the default): the
            table's name, prefixed with ``<schema>__`` outside the database's default schema
            (sources/source_names.py).
        row_schema: the row's schema; by default from the envelopes' schema parts, else inferred.
        row_column: keep each row image as JSON text in this column instead of expanding it into
            columns (for per-table expansion after routing, with :func:`iceberg_sink.sources.readers.read_json`).
        keep: columns of ``df`` to keep (a Kafka offset or partition, ...).
        key_from: the Kafka message key column of ``df`` (Debezium's key: the source row's primary
            key, JSON with or without a schema part); its field names, in order, go to ``key_column``
            as an array, for ``.cdc(key_column=...)``: each routed table keyed by its source's primary key.
        key_column: name of the key names column in the result (with ``key_from``).
        truncate: what a truncate event (op ``t``) does: ``"fail"`` (default: it is refused, naming the
            op), ``"skip"`` (ignored), ``"apply"``: it becomes a row with op ``t``, its order value and
            source table and null row columns, which ``.cdc`` applies by emptying the table at that
            point of the change order (topology/changes.py). Message events (op ``m``) are always skipped.
        unavailable_value: the placeholder PostgreSQL's connector sends for an unchanged TOASTed column
            (``unavailable.value.placeholder``); such a column takes the event's ``before`` value,
            else (``rejects="mark"``, the sink) is marked to keep the key's stored value
            (sources/toast.py, docs/cdc.md), else is refused. None: no placeholder.
        rejects: ``"fail"`` (default): a refused event fails the Spark job reading the result with an
            error naming the reason and the event; ``"mark"``: refused events stay as rows carrying
            their refusal in :data:`iceberg_sink.vocab.columns.REJECT_COLUMN` (for the sink, which
            fails the batch or dead-letters them).
        last_counts: the statistics of this reader's batches, kept across them (the builder's
            ``.debezium(...)`` keeps one per sink): inside
            :func:`iceberg_sink.sources.envelope.reading_batch` a batch is planned on the
            last counted ones when they were plain, without a Spark job of its own, and each event is
            checked to agree with them (a Spark job over an event that does not fails with
            :data:`iceberg_sink.sources.envelope.STALE_COUNTS`; read the batch again outside).

    Raises:
        InvalidInputError: a bad argument, a column name clash, an unknown Connect type, or conflicting column types.
    """
    df = classic_frame(df, "read_envelope(df)")
    if truncate not in TRUNCATE_POLICIES:
        raise InvalidInputError(
            f"read_envelope(truncate=...): expected one of {TRUNCATE_POLICIES}, received {truncate!r}"
        )
    if rejects not in REJECT_POLICIES:
        raise InvalidInputError(f"read_envelope(rejects=...): expected one of {REJECT_POLICIES}, received {rejects!r}")
    if table_fields is not None and (
        isinstance(table_fields, str) or not all(isinstance(f, str) for f in table_fields)
    ):
        raise InvalidInputError(
            f"read_envelope(table_fields=...): expected None or a list of source field names such as "
            f'["db", "schema", "table"], received {table_fields!r}'
        )
    paths, types = order_paths(order_by, order_type)
    present = columns_of(df)
    missing = [c for c in (value_column, *keep, *([key_from] if key_from else [])) if c not in present]
    if missing:
        raise InvalidInputError(f"read_envelope: expected columns {missing} in the DataFrame; it has {present}")
    kafka = [c for c in ("topic", "partition", "offset") if c in present and c not in keep]
    carried = [*keep, *kafka]
    # Placeholders are looked for (one more aggregate of the same job) only where the sink marks them.
    marks = unavailable_value if rejects == "mark" and row_column is None else None
    args = EnvelopeArgs(
        value_column=value_column,
        carried=tuple(carried),
        key_from=key_from,
        paths=tuple(paths),
        types=tuple(types),
        truncate=truncate,
        op_column=op_column,
        order_column=order_column,
        table_column=table_column,
        table_fields=tuple(table_fields) if table_fields is not None else None,
        key_column=key_column,
        need_schemas=row_column is None and row_schema is None,
        placeholder=marks,
    )
    c = envelope_columns(df.sparkSession, args)
    added = c.added
    clash = [name for name in keep if name in added]
    if clash or len(set(added)) != len(added):
        raise InvalidInputError(f"read_envelope: output column names clash: {added} and kept columns {list(keep)}")
    events = df.where(c.present).select(*c.first).withColumn(PAYLOAD, c.payload).select("*", *c.parts)
    events = events.where(c.kept).withColumn(IMAGE, c.image)
    refusal, counts = c.reason, None
    if last_counts is not None and c.stats is not None:
        counts = last_counts.plan_on()
        if counts is not None:
            # Planned on the last batch's statistics: an event they do not cover fails the job (STALE_COUNTS).
            refusal = F.coalesce(unlike(df.sparkSession, counts, args, c.stats[2]), c.reason)
    if counts is None:
        counts = batch_stats(events, c.stats)
        if last_counts is not None:
            last_counts.remember(counts, args.need_schemas)
        warn_unordered(counts, paths)
    reason = refusal.alias(_REASON)
    if row_column is not None:
        rows = events.select(*c.carried, c.value, F.col(IMAGE).alias(row_column), *c.extra, *c.helpers, reason)
        return _finish(rows, value_column, table_column, keep, rejects)
    schema = row_schema
    declared = sorted(s for s in counts.schemas if s is not None)
    if schema is None:
        schema = _row_schema_from_envelopes(declared)
        if schema is None or None in counts.schemas:
            # Events without a schema part (schemas.enable=false, perhaps beside events with one: a
            # stream of several connectors): their documents' types, settled on the table's and the
            # schema parts' (sources/bare_types.py), merged with the schema parts'. An event whose
            # value does not fit its field's type is refused.
            source = c.helpers[0] if c.helpers else None
            bare = settle(events.where(F.col(SCHEMA).isNull()), AFTER, BEFORE, source, schema)
            schema = bare.schema if schema is None else _merge_row_schemas(schema, bare.schema)
            misfit = bare.reason(schema, F.when(F.col(SCHEMA).isNull(), F.col(IMAGE)))
            if misfit is not None:
                reason = F.coalesce(refusal, misfit).alias(_REASON)
    ours = {name.lower() for name in [*added, *carried]}  # names that differ only in case clash too
    clash = [name for name in schema.fieldNames() if name.lower() in ours]
    if clash:
        raise InvalidInputError(
            f"read_envelope: source columns {clash} clash with the columns it adds ({added}) or keeps "
            f"({list(keep)}); pass other names (op_column=, order_column=, table_column=, key_column=)"
        )
    cased = case_clashes(schema)
    if cased:
        raise InvalidInputError(
            "Debezium row images of this batch: " + "; ".join(cased) + " (leave one out with the connector's "
            "column.exclude.list, or rename it at the source)"
        )
    staged = events.select(*c.carried, c.value, OP, BEFORE, IMAGE, SCHEMA, *c.extra, *c.helpers, reason)
    arrow = None
    if (
        row_schema is None
        and last_counts is not None
        and declared
        and None not in counts.schemas
        and (unavailable_value is None or (marks is not None and counts.placeholders == 0))
        and last_counts.arrow_reads()
    ):
        # Every event has a schema part and none holds the placeholder (a planned batch's jobs fail
        # on one that does): the images may be read by the Arrow reader (sources/arrow_rows.py).
        arrow = _arrow_rows(events.sparkSession, declared, schema)
    if arrow is not None:
        staged = staged.select("*", arrow.alias(_ROW), F.lit(None).cast("string").alias(_ROW_REASON))
    else:
        staged = _read_rows(staged, declared if row_schema is None else [], schema)
        if unavailable_value is not None:
            # Marked only in a batch that may hold one: a batch without any costs the sink nothing more.
            staged = _unavailable(staged, schema, unavailable_value, mark=marks is not None and counts.placeholders > 0)
    rows = staged.select(
        *c.carried,
        c.value,
        F.col(f"`{_ROW}`.*"),  # the image's fields in one Column (a Column each: two Py4J calls each)
        *[named(a) for a in added],
        *([UNAVAILABLE_COLUMN] if UNAVAILABLE_COLUMN in columns_of(staged) else []),
        *([SOURCE_COLUMN] if c.helpers else []),
        F.coalesce(F.col(_REASON), F.col(_ROW_REASON)).alias(_REASON),
    )
    return _finish(rows, value_column, table_column, keep, rejects)


def _arrow_rows(spark: SparkSession, declared: list[str], target: T.StructType) -> Column | None:
    """The row image as ``target`` read by the Arrow reader, or None where Spark reads it (an older
    PySpark, a field the Arrow reader leaves to Spark). Built once per set of schema parts."""

    def build() -> Column | None:
        if not arrow_udfs():
            return None
        reader = row_reader({text: _row_schema(text) for text in declared}, target)
        return reading_column(reader, F.col(IMAGE), F.col(SCHEMA), target) if reader is not None else None

    return built(spark, ("arrow rows", tuple(declared), target.json()), build)  # type: ignore[no-any-return]


def _read_rows(staged: DataFrame, declared: list[str], target: T.StructType) -> DataFrame:
    """``staged`` with each event's row image as ``target`` in column ``_ROW`` (read with its own schema
    part's types, logical types converted) and in ``_ROW_REASON`` the reason it is refused (a value
    that does not fit its declared type), or null. Built in steps of columns, so no expression repeats another."""
    texts, parsed, converted, row, reason, parts = built(
        staged.sparkSession, ("rows", tuple(declared), target.json()), lambda: _row_columns(declared, target)
    )
    staged = staged.withColumn(_TEXTS, texts)
    staged = staged.select("*", *parsed)
    staged = staged.select("*", *converted)
    return staged.select("*", row.alias(_ROW), reason.alias(_ROW_REASON)).drop(*parts, _TEXTS)


def _row_columns(
    declared: list[str], target: T.StructType
) -> tuple[Column, list[Column], list[Column], Column, Column, list[str]]:
    """The columns of :func:`_read_rows`: the row image as a map of texts, each schema part's parse and
    conversion, the row, its refusal reason, and the helper columns to drop. Built as SQL text
    (iceberg_sink/_sql_expr.py): one Py4J call per column returned, whatever the schema's width."""
    image, schema_part = SF.col(IMAGE), SF.col(SCHEMA)
    texts = SF.col(_TEXTS)
    texts_column = SF.from_json(image, T.MapType(T.StringType(), T.StringType()))
    connects = [_row_schema(text) for text in declared]
    parsed = []
    for i, (text, connect) in enumerate(zip(declared, connects, strict=True)):
        physical = physical_type(connect, "")
        assert isinstance(physical, T.StructType)
        parsed.append(SF.when(schema_part == SF.lit(text), SF.from_json(image, physical)).alias(f"{_PARSED}{i}"))
    known = schema_part.isin(*declared) if declared else SF.lit(False)
    parsed.append(SF.when(~known | schema_part.isNull(), SF.from_json(image, target)).alias(f"{_PARSED}b"))
    converted = [
        convert_value(SF.col(f"{_PARSED}{i}"), connect, "").alias(f"{_CONVERTED}{i}")
        for i, connect in enumerate(connects)
    ]
    bare = SF.col(f"{_PARSED}b")
    row = SF.when(bare.isNotNull(), bare)
    reason = SF.when(bare.isNotNull(), _refusal(bare, image, target, None, "", texts))
    for i, connect in enumerate(connects):
        value = SF.col(f"{_CONVERTED}{i}")
        own = connect_to_spark(connect)
        row = row.when(value.isNotNull(), fit_value(value, own, target))
        reason = reason.when(value.isNotNull(), _refusal(value, image, own, connect, "", texts))
    parts = [f"{_PARSED}{i}" for i in range(len(connects))] + [f"{_PARSED}b"]
    parts += [f"{_CONVERTED}{i}" for i in range(len(connects))]
    return (
        texts_column.column(),
        [p.column() for p in parsed],
        [c.column() for c in converted],
        row.column(),
        reason.column(),
        parts,
    )


def _unavailable(staged: DataFrame, schema: T.StructType, placeholder: str, mark: bool) -> DataFrame:
    """Columns of an update holding ``placeholder`` (an unchanged TOASTed value) take the event's
    ``before`` value when it holds one; the others are marked for the sink (``mark``) or refused,
    naming the column (sources/toast.py, docs/cdc.md)."""
    holders = [f for f in schema.fields if toast.can_hold(f.dataType)]
    if not holders:
        return staged

    def build() -> tuple[Column, Column, Column | None, Column | None]:
        old = SF.from_json(SF.col(BEFORE), T.StructType(holders))
        row, marker, reason = toast.unavailable(SF.col(_ROW), SF.col(_OLD), SF.col(OP), schema, placeholder, mark)
        return (
            old.column(),
            row.column(),
            marker.column() if marker is not None else None,
            reason.column() if reason is not None else None,
        )

    old, row, marker, reason = built(staged.sparkSession, ("toast", schema.json(), placeholder, mark), build)
    staged = staged.withColumn(_OLD, old)
    return staged.select(
        *[named(c) for c in columns_of(staged) if c not in (_ROW, _ROW_REASON, _OLD)],
        row.alias(_ROW),
        F.coalesce(F.col(_ROW_REASON), *([reason] if reason is not None else [])).alias(_ROW_REASON),
        *([marker.alias(UNAVAILABLE_COLUMN)] if marker is not None else []),
    )


def _finish(
    rows: DataFrame, value_column: str, table_column: str | None, keep: Sequence[str], rejects: str
) -> DataFrame:
    """Mark refused events (sources/rejects.py), fail on them unless ``rejects="mark"``, and drop the helper columns."""
    # SQL text (iceberg_sink/_sql.py): one Py4J call for the refusal, where Column calls took 150.
    reason = column(_REASON)
    source = None
    if table_column is not None:
        # Two sources meeting in one name: refused here for a direct call; a routed sink (rejects="mark")
        # holds each table to one source across batches instead (job/source_ledger.py).
        if rejects != "mark":
            reason = f"coalesce({reason}, {_collisions(table_column)})"
        source = column(table_column)
    marked = reject_where(rows, reason, REJECT_CLASS, column(value_column), source_table=source)
    # A row still holding a TOAST placeholder keeps its event: a refusal for the value (after the
    # reduction, or the stored row's lookup) records the event as received, not the row it became.
    marked = toast.with_event(marked, REJECT_CLASS, column(value_column), source)
    # A routed sink (rejects="mark") keeps each event's source: it holds every table to one source.
    helpers = [_REASON, *([SOURCE_COLUMN] if rejects != "mark" else [])]
    helpers += [c for c in (value_column, "topic", "partition", "offset") if c not in keep]
    present = columns_of(marked)
    out = marked.drop(*[c for c in helpers if c in present and c not in keep])
    return out if rejects == "mark" else fail_on_reject(out)
