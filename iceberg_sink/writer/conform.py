"""Bring an Arrow batch from Spark to the exact Arrow schema of the Iceberg table.

The driver already checked the DataFrame schema against the table; here each batch is cast by
name (allowed promotions, time zone normalisation, Spark's large string types), missing optional
columns are filled with nulls, and nulls arriving in required columns are refused.

A null struct holds no value for its required children, but Parquet writers refuse a required
column with a null in any row, so under a null struct (or a missing optional struct column) a
required child gets a placeholder value that no reader sees.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from iceberg_sink.errors import InvalidInputError


def _placeholder(length: int, t: pa.DataType) -> pa.Array:
    """``length`` non-null values of ``t`` (zeros, empty strings and lists, structs of those)."""
    if pa.types.is_struct(t):
        children = [pa.nulls(length, f.type) if f.nullable else _placeholder(length, f.type) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return pa.array([[] for _ in range(length)], t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        value: pa.Scalar = pa.scalar("", t)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        value = pa.scalar(b"", t)
    elif pa.types.is_fixed_size_binary(t):
        value = pa.scalar(b"\0" * t.byte_width, t)
    elif pa.types.is_boolean(t):
        value = pa.scalar(False)
    elif pa.types.is_decimal(t):
        value = pa.scalar(0, pa.int64()).cast(t)
    elif pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t):
        value = pa.scalar(0, pa.int32() if t.bit_width == 32 else pa.int64()).cast(t)
    else:
        value = pa.scalar(0, pa.int64()).cast(t)
    return pa.repeat(value, length)


def _all_null(length: int, t: pa.DataType) -> pa.Array:
    """``length`` nulls of ``t`` that a Parquet writer accepts (see the module docstring)."""
    if not pa.types.is_struct(t):
        return pa.nulls(length, t)
    return pa.StructArray.from_arrays(
        _placeholder(length, t).flatten(), fields=list(t), mask=pa.array([True] * length, pa.bool_())
    )


def _conform_array(array: pa.Array, target: pa.Field, path: str, valid: pa.Array | None = None) -> pa.Array:
    """``array`` cast to ``target``; ``valid``: the rows whose enclosing structs are all set
    (None: every row), the only rows where a null in a required field is an error."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not target.nullable and array.null_count:
        nulls = array.null_count if valid is None else pc.sum(pc.and_(array.is_null(), valid)).as_py() or 0
        if nulls:
            raise InvalidInputError(
                f"column {path!r} is required (not null) in the table, but {nulls} row(s) of this "
                "batch hold null there; filter or fill them before writing"
            )
    t = target.type
    if pa.types.is_struct(t):
        if not pa.types.is_struct(array.type):
            return array.cast(t)
        mask = array.is_null() if array.null_count else None
        child_valid = valid
        if mask is not None:
            child_valid = pc.invert(mask) if valid is None else pc.and_(valid, pc.invert(mask))
        names = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = []
        for child_target in t:
            if child_target.name in names:
                # struct_field does not carry the parent's nulls into the child: child_valid does.
                child = pc.struct_field(array, [names[child_target.name]])
                child = _conform_array(child, child_target, f"{path}.{child_target.name}", child_valid)
            else:
                child = _all_null(len(array), child_target.type)
            if not child_target.nullable and child.null_count:
                # Nulls left here are under null structs only (checked above).
                child = pc.if_else(child.is_null(), _placeholder(len(array), child_target.type), child)
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if array.type == t:
        return array
    return array.cast(t)


def conform_batch(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.Table:
    """Return ``batch`` as a table with exactly ``schema`` (names, order, types, field ids)."""
    columns = []
    names = set(batch.schema.names)
    for target in schema:
        if target.name in names:
            columns.append(_conform_array(batch.column(target.name), target, target.name))
        elif target.nullable:
            columns.append(_all_null(batch.num_rows, target.type))
        else:
            raise InvalidInputError(f"column {target.name!r} is required in the table but missing from the input")
    return pa.Table.from_arrays(columns, schema=schema)
