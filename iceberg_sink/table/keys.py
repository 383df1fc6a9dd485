"""Which key an upsert/CDC table is written with: one rule for single-table and routed sinks.

A table's key (its equality-delete fields) comes from, most specific first:

1. **the rows** (routed sinks, ``.cdc(key_column=...)`` / ``.upsert(key_column=...)``): the key column
   names each row's key columns, as a string ``"a,b"`` or an array of names (Debezium's message key
   gives them: ``read_envelope(key_from="key")``). All rows of one table in one micro-batch must name
   the same key; rows where it is null name none;
2. **the table**: an existing table's identifier fields (``ALTER TABLE ... SET IDENTIFIER FIELDS``,
   PyIceberg's ``update_schema().set_identifier_fields``), which a table created by the sink has too
   (unless created with ``create_if_missing(identifier_fields=False)``: then only the builder's key);
3. **the builder**: ``key=[...]`` of ``.cdc``/``.upsert``, for a routed sink the key of the tables
   that give none; for a single-table sink it is the key, whatever the table's identifier fields say
   (as Flink's ``equalityFieldColumns``), and may be omitted for a table that has identifier fields.

A key the rows name that differs from the table's identifier fields is refused, naming both: the
table declared its key, and writing deletes by another one would silently change what an update
replaces. A key that names a missing column, the op column, or the key column itself is refused too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._sql import named
from iceberg_sink.errors import InvalidInputError, InvalidSinkConfigError


def identifier_names(table: Any) -> tuple[str, ...]:
    """The names of ``table``'s identifier fields, in field-id order (empty: none declared)."""
    schema = table.schema()
    return tuple(schema.find_column_name(i) or "" for i in sorted(schema.identifier_field_ids))


def key_names(df_schema: T.StructType, key_column: str) -> Column:
    """The key column as an array of column names (a comma-separated string is split and trimmed)."""
    kind = check_key_column(df_schema, key_column)
    column = named(key_column)
    if isinstance(kind, T.StringType):
        return F.when(column.isNull(), F.lit(None)).otherwise(
            F.transform(F.split(column, ","), lambda name: F.trim(name))
        )
    return column


def check_key_column(df_schema: T.StructType, key_column: str) -> T.DataType:
    """The key column's type, or a clear error when it is missing or neither a string nor an array of
    strings (:func:`key_names` without building its Column)."""
    fields = {f.name: f for f in df_schema.fields}
    field = fields.get(key_column)
    if field is None:
        raise InvalidInputError(
            f"the key column {key_column!r} given to .cdc/.upsert(key_column=...) is missing from the DataFrame "
            f"(columns: {', '.join(df_schema.fieldNames())})"
        )
    kind = field.dataType
    if isinstance(kind, T.StringType) or (isinstance(kind, T.ArrayType) and isinstance(kind.elementType, T.StringType)):
        return kind
    raise InvalidInputError(
        f"key column {key_column!r}: expected a string ('a,b') or an array of strings naming each row's key "
        f"columns, received type {kind.simpleString()}"
    )


def resolve_key(
    table_name: str,
    table: Any,
    named: Collection[tuple[str, ...]],
    configured: Sequence[str],
    *,
    key_column: str | None,
    op_column: str | None,
    prefer_table: bool,
) -> tuple[str, ...]:
    """The key ``table_name`` is written with in this micro-batch (see the module docstring).

    Args:
        table: the table, or None if it does not exist yet.
        named: the distinct keys its rows name in the key column (routed sinks).
        configured: the builder's ``key=`` (maybe empty).
        prefer_table: whether the table's identifier fields win over ``configured`` (routed sinks,
            and a single-table sink given no key).

    Raises:
        InvalidInputError: the rows name several keys, a malformed key, or one the table contradicts.
        InvalidSinkConfigError: no key anywhere.
    """
    where = f"in column {key_column!r}" if key_column else ""
    keys = sorted(set(named))
    if len(keys) > 1:
        shown = "; ".join(str(list(k)) for k in keys[:5])
        raise InvalidInputError(
            f"table {table_name}: its rows name different keys {where} within one micro-batch: {shown}; "
            "expected one key per table"
        )
    row_key = keys[0] if keys else None
    if row_key is not None:
        problems = []
        if not row_key or any(not k for k in row_key):
            problems.append("an empty column name")
        if len(set(row_key)) != len(row_key):
            problems.append("a column twice")
        if op_column is not None and op_column in row_key:
            problems.append(f"the op column {op_column!r}")
        if key_column is not None and key_column in row_key:
            problems.append("the key column itself")
        if problems:
            raise InvalidInputError(
                f"table {table_name}: its rows name key {list(row_key)} {where}, which holds {', '.join(problems)}; "
                "expected distinct column names of the table"
            )
    declared = identifier_names(table) if table is not None else ()
    if row_key is not None and declared and set(row_key) != set(declared):
        raise InvalidInputError(
            f"table {table_name}: its rows name key {list(row_key)} {where} but the table's identifier fields are "
            f"{list(declared)}; a table keeps one key (change its identifier fields first to re-key it)"
        )
    if row_key is not None:
        return declared or row_key
    if declared and (prefer_table or not configured):
        return declared
    if configured:
        return tuple(configured)
    sources = [f"its rows name none {where}"] if key_column else []
    sources.append("the table has no identifier fields" if table is not None else "the table does not exist yet")
    raise InvalidSinkConfigError(
        f"table {table_name}: no upsert/CDC key: {', '.join(sources)}, and .cdc/.upsert was given no key=[...]"
    )
