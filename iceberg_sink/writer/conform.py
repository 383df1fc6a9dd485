"""Bring an Arrow batch from Spark to the exact Arrow schema of the Iceberg table.

The driver already checked the DataFrame schema against the table; here each batch is cast by
name (allowed promotions, time zone normalisation, Spark's large string types), missing columns
are filled with their write-default (format v3 default values) or else nulls, and nulls arriving in
required columns are refused.

A column the input lacks, at any depth (a struct field, one inside list elements or map values),
gets the field's ``write-default`` when the table's schema has one: the spec says "the write default
for a field must be written if a field is not supplied to a write", as Iceberg Java's writers do. A
null the input holds is a supplied value and stays null. This is the one place rows get their
defaults: every Arrow writer (appends, upserts, CDC, routed tables) conforms its batches here, and
Spark's own Parquet writer is not used for a write that would need one (writer/jvm.py).

A null struct holds no value for its required children, but Parquet writers refuse a required
column with a null in any row, so under a null struct (or a missing optional struct column) a
required child gets a placeholder value that no reader sees.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema, index_by_id

from iceberg_sink._iceberg.files import field_id
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.vocab.columns import ERROR_MARKER

#: Field id -> the field's write-default (only fields that have one).
WriteDefaults = Mapping[int, Any]
_NO_DEFAULTS: WriteDefaults = MappingProxyType({})


def write_defaults(schema: Schema) -> dict[int, Any]:
    """The write-default of every field of ``schema`` that has one, by field id."""
    return {field_id: f.write_default for field_id, f in index_by_id(schema).items() if f.write_default is not None}


def _defaults_below(t: pa.DataType, defaults: WriteDefaults) -> bool:
    """Whether a struct field inside ``t`` (at any depth) has a write-default (only struct fields
    can: a list element or map value is never missing on its own)."""
    if pa.types.is_struct(t):
        return any(field_id(f) in defaults or _defaults_below(f.type, defaults) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _defaults_below(t.value_type, defaults)
    if pa.types.is_map(t):
        return _defaults_below(t.item_type, defaults)
    return False


def list_elements(array: pa.Array, set_here: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The elements (values) of a list (map) array, and per element whether its row is set."""
    values = array.items if pa.types.is_map(array.type) else array.values
    # Without the array's own nulls (set_here has them), so both kernels see the same elements.
    kind = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
    plain = kind.from_arrays(array.offsets, values)
    return pc.list_flatten(plain), pc.take(set_here, pc.list_parent_indices(plain))


def _missing(length: int, target: pa.Field, defaults: WriteDefaults) -> pa.Array | None:
    """``length`` rows of ``target``'s write-default; None when it has none (a missing required
    field without one is the caller's error)."""
    target_id = field_id(target)
    if target_id is None or target_id not in defaults:
        return None
    value = defaults[target_id]
    if isinstance(value, uuid.UUID) and pa.types.is_fixed_size_binary(target.type):
        value = value.bytes
    return pa.repeat(pa.scalar(value, type=target.type), length)


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


def _conform_array(
    array: pa.Array, target: pa.Field, path: str, valid: pa.Array | None = None, defaults: WriteDefaults = _NO_DEFAULTS
) -> pa.Array:
    """``array`` cast to ``target``; ``valid``: the rows whose enclosing structs are all set
    (None: every row), the only rows where a null in a required field is an error; ``defaults``:
    the write-defaults of fields the input may lack."""
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
                child = _conform_array(child, child_target, f"{path}.{child_target.name}", child_valid, defaults)
            else:
                filled = _missing(len(array), child_target, defaults)
                child = _all_null(len(array), child_target.type) if filled is None else filled
            if not child_target.nullable and child.null_count:
                # Nulls left here are under null structs only (checked above).
                child = pc.if_else(child.is_null(), _placeholder(len(array), child_target.type), child)
            children.append(child)
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if defaults:  # tables without defaults never pay for this
        nesting = _nesting(t)
        if nesting is not None and _nesting(array.type) == nesting and _defaults_below(t, defaults):
            return _conform_nested(array, target, path, valid, defaults)
    if array.type == t:
        return array
    return array.cast(t)


def _nesting(t: pa.DataType) -> str | None:
    """``map``, ``list`` (either offset width) or None."""
    if pa.types.is_map(t):
        return "map"
    return "list" if pa.types.is_list(t) or pa.types.is_large_list(t) else None


def _conform_nested(
    array: pa.Array, target: pa.Field, path: str, valid: pa.Array | None, defaults: WriteDefaults
) -> pa.Array:
    """A list (map) whose elements (values) hold structs with write-defaults: the elements are
    conformed one level down, so a struct field they lack gets its default (a plain cast would
    leave it null)."""
    t = target.type
    mask = array.is_null() if array.null_count else None
    # A required element is only an error where the list itself is set (and its structs above).
    row_set = array.is_valid() if valid is None else pc.and_(valid, array.is_valid())
    elements, element_valid = list_elements(array, row_set)
    offsets = _zero_based(array.offsets)
    if pa.types.is_map(t):
        keys = pc.list_flatten(pa.ListArray.from_arrays(array.offsets, array.keys)).cast(t.key_type)
        items = _conform_array(elements, t.item_field, f"{path}.value", element_valid, defaults)
        return pa.MapArray.from_arrays(offsets, keys, items, type=t, mask=mask)
    values = _conform_array(elements, t.value_field, f"{path}.element", element_valid, defaults)
    kind = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    return kind.from_arrays(offsets, values, type=t, mask=mask)


def _zero_based(offsets: pa.Array) -> pa.Array:
    """List offsets rebased to start at 0 (the flattened values start at the first list's first element)."""
    first = offsets[0].as_py()
    return pc.subtract(offsets, pa.scalar(first, offsets.type)) if first else offsets


def conform_batch(
    batch: pa.RecordBatch | pa.Table, schema: pa.Schema, defaults: WriteDefaults | None = None
) -> pa.Table:
    """Return ``batch`` as a table with exactly ``schema`` (names, order, types, field ids), a
    column (or nested field) it lacks filled with ``defaults`` (:func:`write_defaults` of the
    table's schema) where the field has one, else with nulls."""
    defaults = defaults or _NO_DEFAULTS
    columns = []
    names = set(batch.schema.names)
    for target in schema:
        if target.name in names:
            columns.append(_conform_array(batch.column(target.name), target, target.name, None, defaults))
            continue
        filled = _missing(batch.num_rows, target, defaults)
        if filled is not None:
            columns.append(filled)
        elif target.nullable:
            columns.append(_all_null(batch.num_rows, target.type))
        else:
            raise InvalidInputError(
                f"column {target.name!r} is required in the table but missing from the input (no write-default)"
            )
    table = pa.Table.from_arrays(columns, schema=schema)
    check_utf8(table)
    return table


def _has_strings(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_strings(f.type) for f in t)
    if pa.types.is_map(t):
        return _has_strings(t.key_type) or _has_strings(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_strings(t.value_type)
    return False


def repaired_utf8(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A string ``array`` whose values that are not valid UTF-8 have each bad byte sequence replaced by
    U+FFFD (as Java decodes them); ``array`` itself when every value is valid. For text the sink
    writes about refused input (a dead-letter row's ``raw`` event and ``event``), which must stay
    readable whatever bytes the input held."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    try:
        array.validate(full=True)
        return array
    except pa.ArrowInvalid:
        raw = array.cast(pa.large_string()).view(pa.large_binary()).to_pylist()
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in raw], array.type)


def check_utf8(table: pa.Table) -> None:
    """Refuse a batch holding a string that is not valid UTF-8, at any depth.

    Spark strings may hold any bytes (``cast(unhex('C328') as string)``, a binary column cast, a
    source that did not validate); Iceberg strings are UTF-8, and DuckDB refuses to read a table that
    holds one that is not. The message carries ``ERROR_MARKER``, so the driver reports it as
    InvalidInputError naming the column (nothing of the batch is committed).

    Raises:
        InvalidInputError: naming the first such column and where Arrow found the bytes.
    """
    for field, column in zip(table.schema, table.columns, strict=True):
        if not _has_strings(field.type):
            continue
        try:
            column.validate(full=True)
        except pa.ArrowInvalid as e:
            raise InvalidInputError(
                f"{ERROR_MARKER} column {field.name!r} holds a string that is not valid UTF-8 ({e}; in a batch "
                f"of {table.num_rows} rows); Iceberg strings are UTF-8: write such values as binary "
                f"(cast the column to binary) or repair them (Spark 4: make_valid_utf8)"
            ) from None
