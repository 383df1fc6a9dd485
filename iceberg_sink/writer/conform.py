"""Bring an Arrow batch from Spark to the exact Arrow schema of the Iceberg table.

The driver already checked the DataFrame schema against the table; here each batch is cast by
name (allowed promotions, time zone normalisation, Spark's large string types), missing optional
columns are filled with nulls, and nulls arriving in required columns are refused.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from iceberg_sink.errors import InvalidInputError


def _conform_array(array: pa.Array, target: pa.Field, path: str) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not target.nullable and array.null_count:
        raise InvalidInputError(
            f"column {path!r} is required (not null) in the table, but {array.null_count} row(s) of this "
            "batch hold null there; filter or fill them before writing"
        )
    t = target.type
    if pa.types.is_struct(t):
        if not pa.types.is_struct(array.type):
            return array.cast(t)
        names = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = []
        for i in range(t.num_fields):
            child_target = t.field(i)
            if child_target.name in names:
                child = pc.struct_field(array, [names[child_target.name]])
                # struct_field does not carry the parent's nulls into the child.
                if array.null_count:
                    child = pc.if_else(array.is_null(), pa.nulls(len(array), child.type), child)
                children.append(_conform_array(child, child_target, f"{path}.{child_target.name}"))
            else:
                children.append(pa.nulls(len(array), child_target.type))
        return pa.StructArray.from_arrays(children, fields=list(t), mask=array.is_null() if array.null_count else None)
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
            columns.append(pa.nulls(batch.num_rows, target.type))
        else:
            raise InvalidInputError(f"column {target.name!r} is required in the table but missing from the input")
    return pa.Table.from_arrays(columns, schema=schema)
