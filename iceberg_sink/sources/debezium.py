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
- the source table column (``source_table``): the ``source`` fields named by ``table_fields`` joined
  with ``_`` (by default ``source.table``), for ``.route(table_column=...)``;
- the key names column (``key_columns``, with ``key_from=`` the Kafka message key column): the field
  names of Debezium's message key (the source row's primary key), for ``.cdc(key_column=...)``.

Tombstones (a null value: the Kafka delete marker Debezium sends after a ``d`` event for log
compaction) and empty values are skipped.

Column types come from the envelopes' ``schema`` part when they carry one (Kafka Connect types: int8,
int16, int32 to int; int64 to long; float32 to float; float64 to double; boolean; string; bytes to
binary; struct, array, map), the union over the batch's distinct schemas, merged along Iceberg's
legal promotions (so a source column altered from INT to BIGINT mid-batch widens; anything else is an
error naming the column). Logical types keep their physical type (Debezium's ``io.debezium.time.Date``
is an int of days, a precise ``Decimal`` base64 bytes: configure the connector's
``decimal.handling.mode`` / ``time.precision.mode`` for other representations). Without a schema
part the types are inferred from the batch's ``after`` and ``before`` documents as
:func:`iceberg_sink.sources.readers.read_json` does; in a batch mixing both, the columns that only events
without a schema part have are added to the schema parts' union with their inferred types. Either
way the batch's schema is the union of its events', so schema evolution (``.schema_evolution``) sees
every new column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink.errors import InvalidInputError
from iceberg_sink.sources.readers import infer_json_schema, union_types

_PAYLOAD = "__iceberg_sink_payload"
_ROW = "__iceberg_sink_row"
_KEY = "__iceberg_sink_message_key"

_CONNECT_PRIMITIVES: dict[str, T.DataType] = {
    "int8": T.IntegerType(),
    "int16": T.IntegerType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "float": T.FloatType(),
    "float32": T.FloatType(),
    "double": T.DoubleType(),
    "float64": T.DoubleType(),
    "boolean": T.BooleanType(),
    "string": T.StringType(),
    "bytes": T.BinaryType(),
}


def connect_to_spark(schema: dict[str, Any], path: str = "") -> T.DataType:
    """The Spark type of a Kafka Connect JSON schema (``{"type": "struct", "fields": [...]}``, ...).

    Raises:
        InvalidInputError: an unknown Connect type, naming the field.
    """
    kind = schema.get("type")
    if kind == "struct":
        fields = []
        for f in schema.get("fields") or []:
            name = f.get("field")
            fields.append(T.StructField(name, connect_to_spark(f, f"{path}.{name}" if path else name), True))
        return T.StructType(fields)
    if kind == "array":
        return T.ArrayType(connect_to_spark(schema.get("items") or {}, f"{path}.element"))
    if kind == "map":
        return T.MapType(
            connect_to_spark(schema.get("keys") or {}, f"{path}.key"),
            connect_to_spark(schema.get("values") or {}, f"{path}.value"),
        )
    if isinstance(kind, str) and kind in _CONNECT_PRIMITIVES:
        return _CONNECT_PRIMITIVES[kind]
    raise InvalidInputError(
        f"Debezium envelope schema: field {path or '(value)'!r} has Kafka Connect type {kind!r}; expected one of "
        f"struct, array, map, {', '.join(_CONNECT_PRIMITIVES)}"
    )


def _row_schema_from_envelopes(schemas: list[str]) -> T.StructType | None:
    """The union of the row schemas (``after``, else ``before``) of distinct envelope schemas."""
    merged: T.DataType | None = None
    problems: list[str] = []
    for text in schemas:
        try:
            envelope = json.loads(text)
        except ValueError as e:
            raise InvalidInputError(f"Debezium envelope: its 'schema' part is not JSON ({e}): {text[:200]!r}") from e
        fields = {f.get("field"): f for f in envelope.get("fields") or [] if isinstance(f, dict)}
        row = fields.get("after") or fields.get("before")
        if row is None:
            raise InvalidInputError(
                "Debezium envelope: its schema has no 'after' or 'before' field; expected a Debezium change "
                f"event envelope, received schema fields {sorted(k for k in fields if k)}"
            )
        row_type = connect_to_spark(row)
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


def _json_path(path: str) -> str:
    return "$." + path


def read_envelope(
    df: DataFrame,
    value_column: str = "value",
    *,
    op_column: str = "op",
    order_by: str | None = "source.lsn",
    order_column: str = "lsn",
    order_type: str = "long",
    table_column: str | None = "source_table",
    table_fields: Sequence[str] = ("table",),
    row_schema: T.StructType | None = None,
    row_column: str | None = None,
    keep: Sequence[str] = (),
    key_from: str | None = None,
    key_column: str = "key_columns",
) -> DataFrame:
    """Debezium JSON change events in ``value_column`` as rows, their operation, order and source table.

    Plug the result into ``.cdc(op_column="op", key=[...], order_by="lsn")``; see the module docstring.

    Args:
        df: a bounded DataFrame of events (a micro-batch; for streams use the builder's
            ``.debezium(...)``, which applies this to every micro-batch).
        value_column: the event value (string or binary JSON); null values (tombstones) are skipped.
        op_column: name of the operation column in the result (Debezium's c, u, d, r).
        order_by: payload path of the order value (``source.lsn``, ``ts_ms``, ``source.ts_ms``, ...);
            None for no order column.
        order_column: name of the order column in the result.
        order_type: Spark type the order value is cast to (``long``, ``string``, ...).
        table_column: name of the source table column in the result; None for none.
        table_fields: ``source`` fields forming the source table name, joined with ``_``
            (``("db", "table")`` gives ``inventory_customers``).
        row_schema: the row's schema; by default from the envelopes' schema parts, else inferred.
        row_column: keep each row image as JSON text in this column instead of expanding it into
            columns (for per-table expansion after routing, with :func:`iceberg_sink.sources.readers.read_json`).
        keep: columns of ``df`` to keep (a Kafka offset or partition, ...).
        key_from: the Kafka message key column of ``df`` (Debezium's key: the source row's primary
            key, JSON with or without a schema part); its field names, in order, go to ``key_column``
            as an array, for ``.cdc(key_column=...)``: each routed table keyed by its source's primary key.
        key_column: name of the key names column in the result (with ``key_from``).

    Raises:
        InvalidInputError: a column name clash, an unknown Connect type, or conflicting column types.
    """
    missing = [c for c in (value_column, *keep, *([key_from] if key_from else [])) if c not in df.columns]
    if missing:
        raise InvalidInputError(f"read_envelope: expected columns {missing} in the DataFrame; it has {df.columns}")
    value = F.col(value_column).cast("string")
    message_key = [F.col(key_from).cast("string").alias(_KEY)] if key_from is not None else []
    events = df.where(value.isNotNull() & (F.trim(value) != F.lit(""))).select(
        *[F.col(c) for c in keep], value.alias(value_column), *message_key
    )
    v = F.col(value_column)
    # With the schema part, the payload is under "payload"; without it the value is the payload.
    events = events.withColumn(_PAYLOAD, F.coalesce(F.get_json_object(v, "$.payload"), v))
    payload = F.col(_PAYLOAD)
    op = F.get_json_object(payload, "$.op")
    extra: list[Column] = [op.alias(op_column)]
    if order_by is not None:
        extra.append(F.get_json_object(payload, _json_path(order_by)).cast(order_type).alias(order_column))
    if table_column is not None:
        parts = [F.get_json_object(payload, f"$.source.{f}") for f in table_fields]
        extra.append(F.concat_ws("_", *parts).alias(table_column))
    if key_from is not None:
        k = F.col(_KEY)
        # With the schema part the key's fields are under "payload"; without it the key is them.
        fields = F.when(F.get_json_object(k, "$.schema").isNotNull(), F.get_json_object(k, "$.payload")).otherwise(k)
        extra.append(F.json_object_keys(fields).alias(key_column))
    added = [op_column] + ([order_column] if order_by is not None else []) + ([table_column] if table_column else [])
    added += [key_column] if key_from is not None else []
    clash = [c for c in keep if c in added]
    if clash or len(set(added)) != len(added):
        raise InvalidInputError(f"read_envelope: output column names clash: {added} and kept columns {list(keep)}")
    image = F.when(op == F.lit("d"), F.get_json_object(payload, "$.before")).otherwise(
        F.get_json_object(payload, "$.after")
    )
    if row_column is not None:
        return events.select(*[F.col(c) for c in keep], image.alias(row_column), *extra)
    schema = row_schema
    if schema is None:
        # The distinct schema parts, null among them when some events carry none.
        distinct = [r[0] for r in events.select(F.get_json_object(v, "$.schema").alias("s")).distinct().collect()]
        schema = _row_schema_from_envelopes(sorted(s for s in distinct if s is not None))
        if schema is None or None in distinct:
            # Events without a schema part (schemas.enable=false, perhaps beside events with one: a
            # stream of several connectors): their documents' types, merged with the schema parts'.
            bare = events.where(F.get_json_object(v, "$.schema").isNull())
            images = bare.select(
                F.explode(F.array(F.get_json_object(payload, "$.after"), F.get_json_object(payload, "$.before"))).alias(
                    _ROW
                )
            )
            inferred = infer_json_schema(images, _ROW, what="Debezium row images ('after'/'before')")
            schema = inferred if schema is None else _merge_row_schemas(schema, inferred)
    clash = [c for c in schema.fieldNames() if c in added or c in keep]
    if clash:
        raise InvalidInputError(
            f"read_envelope: source columns {clash} clash with the columns it adds ({added}) or keeps "
            f"({list(keep)}); pass other names (op_column=, order_column=, table_column=, key_column=)"
        )
    rows = events.select(*[F.col(c) for c in keep], F.from_json(image, schema).alias(_ROW), *extra)
    return rows.select(
        *[F.col(c) for c in keep], *[F.col(_ROW).getField(f.name).alias(f.name) for f in schema.fields], *added
    )
