"""Spark schemas against Iceberg schemas: conversion for table creation and the write-time check.

Columns match by name. Allowed promotions are Iceberg's (int→long, float→double, widening decimal
precision); Spark's TimestampType maps to ``timestamptz`` and TimestampNTZType to ``timestamp``.
Every mismatch is collected so the error lists them all at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as T

from iceberg_sink._iceberg import DELETE_FILE_FORMAT_VERSIONS, V3_CHANGES_REFUSAL
from iceberg_sink.errors import InvalidSinkConfigError, SchemaMismatchError, UnsupportedTableError


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> int:
        self.next += 1
        return self.next


def _convert(dt: T.DataType, ids: _Ids, path: str) -> IcebergType:
    if isinstance(dt, T.ByteType | T.ShortType | T.IntegerType):
        return IntegerType()
    if isinstance(dt, T.LongType):
        return LongType()
    if isinstance(dt, T.FloatType):
        return FloatType()
    if isinstance(dt, T.DoubleType):
        return DoubleType()
    if isinstance(dt, T.BooleanType):
        return BooleanType()
    if isinstance(dt, T.StringType | T.VarcharType | T.CharType):
        return StringType()
    if isinstance(dt, T.BinaryType):
        return BinaryType()
    if isinstance(dt, T.DateType):
        return DateType()
    if isinstance(dt, T.TimestampNTZType):
        return TimestampType()
    if isinstance(dt, T.TimestampType):
        return TimestamptzType()
    if isinstance(dt, T.DecimalType):
        return DecimalType(dt.precision, dt.scale)
    if isinstance(dt, T.StructType):
        return StructType(*_fields(dt.fields, ids, path))
    if isinstance(dt, T.ArrayType):
        element_id = ids()
        return ListType(
            element_id, _convert(dt.elementType, ids, f"{path}.element"), element_required=not dt.containsNull
        )
    if isinstance(dt, T.MapType):
        key_id, value_id = ids(), ids()
        return MapType(
            key_id,
            _convert(dt.keyType, ids, f"{path}.key"),
            value_id,
            _convert(dt.valueType, ids, f"{path}.value"),
            value_required=not dt.valueContainsNull,
        )
    raise _Unstorable(path, dt)


class _Unstorable(Exception):
    """A Spark type Iceberg has no type for; reported as a mismatch by the caller."""

    def __init__(self, path: str, dt: T.DataType) -> None:
        super().__init__(path)
        self.path = path
        self.spark_type = dt

    def problem(self, target: IcebergType | None = None) -> str:
        what = "void (an untyped null)" if isinstance(self.spark_type, T.NullType) else self.spark_type.simpleString()
        fix = f"cast it to the table's type {target}" if target is not None else "cast it to a type Iceberg stores"
        if isinstance(self.spark_type, T.VariantType):
            # Iceberg format v3 has a variant type; the sink's writers (PyArrow) do not write it.
            fix = "store its JSON text instead (to_json(column))" if target is None else fix
            return f"{self.path}: column has Spark type variant, which iceberg_sink does not write yet; {fix}"
        return f"{self.path}: column has Spark type {what}, which Iceberg cannot store; {fix}"


def _fields(fields: Iterable[T.StructField], ids: _Ids, prefix: str) -> list[NestedField]:
    result = []
    for f in fields:
        path = f"{prefix}.{f.name}" if prefix else f.name
        field_id = ids()
        result.append(NestedField(field_id, f.name, _convert(f.dataType, ids, path), required=not f.nullable))
    return result


def case_clashes(struct: T.StructType) -> list[str]:
    """Each pair of columns (or fields of one struct) whose names differ only in case, described: no
    table can hold both (readers that ignore case could not tell them apart)."""
    problems: list[str] = []
    _case_clashes(struct, "", problems)
    return problems


def _case_clashes(struct: T.StructType, prefix: str, problems: list[str]) -> None:
    seen: dict[str, str] = {}
    for f in struct.fields:
        path = f"{prefix}.{f.name}" if prefix else f.name
        other = seen.setdefault(f.name.lower(), path)
        if other != path:
            problems.append(
                f"columns {other!r} and {path!r} differ only in case; readers that ignore case (Spark by default, "
                "DuckDB) cannot tell them apart: rename one"
            )
        if isinstance(f.dataType, T.StructType):
            _case_clashes(f.dataType, path, problems)


def spark_to_iceberg(struct: T.StructType, required: Iterable[str] = (), table_name: str = "") -> Schema:
    """An Iceberg schema for a Spark schema, to create a table from; columns in ``required`` become
    required.

    Raises:
        SchemaMismatchError: listing every column Iceberg cannot store or readers could not tell
            apart, or if there are no columns at all.
    """
    problems: list[str] = []
    if not struct.fields:
        problems.append("the DataFrame has no columns; a table needs at least one")
    _case_clashes(struct, "", problems)
    ids = _Ids()
    for f in struct.fields:
        try:
            _convert(f.dataType, _Ids(), f.name)
        except _Unstorable as e:
            problems.append(e.problem())
    if problems:
        raise SchemaMismatchError(table_name or "(new table)", problems)
    fields = _fields(struct.fields, ids, "")
    must = set(required)
    fields = [
        NestedField(f.field_id, f.name, f.field_type, required=f.required or f.name in must, doc=f.doc) for f in fields
    ]
    return Schema(*fields)


def _type_problem(source: IcebergType, target: IcebergType, path: str, problems: list[str]) -> None:
    if source == target:
        return
    if isinstance(target, StructType) and isinstance(source, StructType):
        _struct_problems(source, target, path, problems)
        return
    if isinstance(target, ListType) and isinstance(source, ListType):
        if target.element_required and not source.element_required:
            problems.append(f"{path}: list elements may be null in the DataFrame but are required in the table")
        _type_problem(source.element_type, target.element_type, f"{path}.element", problems)
        return
    if isinstance(target, MapType) and isinstance(source, MapType):
        _type_problem(source.key_type, target.key_type, f"{path}.key", problems)
        if target.value_required and not source.value_required:
            problems.append(f"{path}: map values may be null in the DataFrame but are required in the table")
        _type_problem(source.value_type, target.value_type, f"{path}.value", problems)
        return
    if isinstance(source, IntegerType) and isinstance(target, LongType):
        return
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return
    if (
        isinstance(source, DecimalType)
        and isinstance(target, DecimalType)
        and source.scale == target.scale
        and source.precision <= target.precision
    ):
        return
    hint = ""
    if isinstance(source, TimestamptzType) and isinstance(target, TimestampType):
        hint = " (cast the column to TimestampNTZType to write a timestamp without time zone)"
    elif isinstance(source, TimestampType) and isinstance(target, TimestamptzType):
        hint = " (cast the column to TimestampType to write a timestamp with time zone)"
    problems.append(f"{path}: table type {target} cannot take DataFrame type {source}{hint}")


def _struct_problems(
    source: StructType,
    target: StructType,
    prefix: str,
    problems: list[str],
    runtime_checked: frozenset[str] = frozenset(),
) -> None:
    target_by_name = {f.name: f for f in target.fields}
    source_by_name = {f.name: f for f in source.fields}
    lower_targets = {name.lower(): name for name in target_by_name}
    for f in source.fields:
        path = f"{prefix}.{f.name}" if prefix else f.name
        t = target_by_name.get(f.name)
        if t is None:
            near = lower_targets.get(f.name.lower())
            suggestion = (
                f" (the table has {near!r}: names are case sensitive)"
                if near
                else "; this sink does not change the table's schema: add the column to the table first "
                "(e.g. with PyIceberg's table.update_schema()), drop it from the DataFrame, or let the sink add it "
                "with .schema_evolution('add-columns')"
            )
            problems.append(f"{path}: column is not in the table{suggestion}")
            continue
        if t.required and not f.required and path not in runtime_checked:
            problems.append(
                f"{path}: column is required (not null) in the table but nullable in the DataFrame; "
                "make it non-nullable (e.g. filter nulls and use a non-null expression) or make the table column optional"
            )
        _type_problem(f.field_type, t.field_type, path, problems)
    for t in target.fields:
        # A missing field with a write-default gets it (format v3 default values: writer/conform.py).
        if t.name not in source_by_name and t.required and t.write_default is None:
            path = f"{prefix}.{t.name}" if prefix else t.name
            problems.append(
                f"{path}: column is required in the table but missing from the DataFrame (no write-default)"
            )


def storable_struct(struct: T.StructType) -> StructType:
    """The Iceberg struct of ``struct``'s columns Iceberg can store (field ids are placeholders);
    the others are named by :func:`check_compatible`."""
    storable = []
    for f in struct.fields:
        try:
            _convert(f.dataType, _Ids(), f.name)
            storable.append(f)
        except _Unstorable:
            continue
    return StructType(*_fields(storable, _Ids(), ""))


def checked_key(struct: T.StructType, table: Any) -> tuple[str, int]:
    """What a passed check of input ``struct`` against ``table`` holds for, as a cache key: the
    input's Spark schema and the table's current schema id. Another writer renaming, dropping or
    changing a column gives the table a new schema id, so the input is checked (and the schema
    evolved) again instead of the writers silently dropping the column's values."""
    return struct.json(), int(table.metadata.current_schema_id)


def check_compatible(
    table_name: str, table_schema: Schema, struct: T.StructType, runtime_checked: Iterable[str] = ()
) -> None:
    """Raise :class:`SchemaMismatchError` listing every way ``struct`` cannot be written to the table.

    Args:
        runtime_checked: top-level columns that may be nullable in the DataFrame although required in
            the table, because the writer refuses a null at run time (key columns in CDC modes).
    """
    problems: list[str] = []
    if not struct.fields:
        names = ", ".join(table_schema.column_names[:8]) + (", ..." if len(table_schema.column_names) > 8 else "")
        raise SchemaMismatchError(
            table_name, [f"the DataFrame has no columns; expected columns of table {table_name}: {names}"]
        )
    storable = []
    for f in struct.fields:
        try:
            _convert(f.dataType, _Ids(), f.name)
            storable.append(f)
        except _Unstorable as e:
            target = table_schema.find_field(f.name).field_type if f.name in table_schema.column_names else None
            problems.append(e.problem(target))
    source = spark_to_iceberg(T.StructType(storable), table_name=table_name).as_struct() if storable else StructType()
    _struct_problems(source, table_schema.as_struct(), "", problems, frozenset(runtime_checked))
    if problems:
        raise SchemaMismatchError(table_name, problems)


def check_changes_table(table_name: str, table: Any, key: Iterable[str]) -> None:
    """Refuse a table that upserts/CDC cannot write correctly, naming what to change.

    Equality deletes need format version 2 or later; an equality delete applies only within its
    partition, so every partition field must be derived from key columns (otherwise an update that
    moves a row to another partition would leave the old row behind).
    """

    if table.metadata.format_version < 2:
        raise UnsupportedTableError(
            f"table {table_name} has format version {table.metadata.format_version}; upserts and CDC write equality "
            "deletes, which need format version 2 (upgrade with table.transaction().upgrade_table_version(2))"
        )
    if table.metadata.format_version not in DELETE_FILE_FORMAT_VERSIONS:
        raise UnsupportedTableError(
            f"table {table_name}: upserts and CDC expected format version 2, received "
            f"{table.metadata.format_version} ({V3_CHANGES_REFUSAL})"
        )
    schema = table.schema()
    keys = list(key)
    problems = []
    for k in keys:
        try:
            schema.find_field(k)
        except ValueError:
            problems.append(f"key column {k!r} is not in table {table_name} ({', '.join(schema.column_names)})")
    if problems:
        raise InvalidSinkConfigError("; ".join(problems))
    check_key_columns(table_name, schema, keys)
    partition_problem(
        table_name,
        [(f.name, str(f.transform), schema.find_column_name(f.source_id) or "?") for f in table.spec().fields],
        keys,
    )


def _path_to(struct: StructType, field_id: int) -> list[NestedField | IcebergType] | None:
    """The fields from the top of ``struct`` down to ``field_id``; a list or map on the way is included."""
    for field in struct.fields:
        if field.field_id == field_id:
            return [field]
        inner = field.field_type
        below: list[NestedField | IcebergType] | None = None
        if isinstance(inner, StructType):
            below = _path_to(inner, field_id)
        elif isinstance(inner, ListType | MapType):
            children = (inner.element_field,) if isinstance(inner, ListType) else (inner.key_field, inner.value_field)
            below = _path_to(StructType(*children), field_id)
            if below is not None:
                below = [inner, *below]
        if below is not None:
            return [field, *below]
    return None


def check_key_columns(table_name: str, schema: Schema, key: Iterable[str]) -> None:
    """Raise :class:`InvalidSinkConfigError` for key columns that cannot be equality or identifier fields.

    The Iceberg spec requires identifier fields (and the sink's equality delete ids are the key) to
    be primitive, not float or double (NaN and -0.0 make equality ambiguous across engines), not
    inside a list or map, and not nested under an optional struct (a null struct would make the key
    null). The sink itself supports top-level key columns only. Every bad column is named at once,
    before anything is written or created.
    """
    problems = []
    for name in key:
        field = schema.find_field(name)
        path = _path_to(schema.as_struct(), field.field_id) or [field]
        t = field.field_type
        if isinstance(t, FloatType | DoubleType):
            problems.append(
                f"key column {name!r} has type {t}; the Iceberg spec forbids float and double equality/identifier "
                "fields; use an integer, decimal or string column as the key"
            )
        elif not isinstance(t, PrimitiveType):
            problems.append(
                f"key column {name!r} has type {t}; expected a primitive column (not a struct, list or map)"
            )
        if any(isinstance(p, ListType | MapType) for p in path):
            problems.append(
                f"key column {name!r} is inside a list or map; expected a column reached through structs only"
            )
        optional = [p.name for p in path[:-1] if isinstance(p, NestedField) and not p.required]
        if optional:
            problems.append(
                f"key column {name!r} is nested under optional struct {optional[0]!r}; expected its parent structs to be "
                "required (not null), or choose a top-level key column"
            )
        elif len(path) > 1 and not any(isinstance(p, ListType | MapType) for p in path):
            # Iceberg allows it, but the writer projects delete rows by top-level column.
            problems.append(f"key column {name!r} is nested in a struct; this sink supports top-level key columns only")
    if problems:
        raise InvalidSinkConfigError(f"upsert/CDC key of table {table_name}: " + "; ".join(problems))


def partition_problem(table_name: str, fields: Iterable[tuple[str, str, str]], key: Iterable[str]) -> None:
    """Raise when a partition field's source column is not a key column."""

    keys = set(key)
    bad = [(name, transform, source) for name, transform, source in fields if source not in keys]
    if bad:
        listed = ", ".join(f"{name} = {transform}({source})" for name, transform, source in bad)
        raise InvalidSinkConfigError(
            f"upsert/CDC key {sorted(keys)} of table {table_name} must include the source column of every partition "
            f"field (an equality delete applies only within its partition, so a key whose rows could move between "
            f"partitions would keep stale rows); not in the key: {listed}. Add those columns to the key."
        )
