"""Reading a data or delete file written under any earlier schema as the table's current schema.

Iceberg resolves columns by field id, at every nesting level (struct fields, list elements, map
keys and values): a renamed field keeps its id, a field added later is null in older files, a
dropped one is ignored, and a promoted type (int to long, float to double, decimal precision) is
widened. PyIceberg's own scan does exactly this in ``_to_requested_schema``; it is wrapped here so
the rest of the project does not lean on a private PyIceberg name.

A file without field ids (added by ``add_files`` or a migration from Hive/Parquet) is read through the
table's name mapping (``schema.name-mapping.default``), as the spec says and every engine does: its
columns are matched by the names the mapping lists for each field id (old names after a rename too).
Every read of a data or delete file's rows passes the table's mapping (:func:`name_mapping_of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.schema import Accessor, Schema, prune_columns
from pyiceberg.table import TableProperties
from pyiceberg.table.name_mapping import NameMapping, parse_mapping_from_json

from iceberg_sink._iceberg.files import field_id


def key_schema(schema: Schema, field_ids: Iterable[int]) -> Schema:
    """``schema`` cut down to the fields ``field_ids`` (and the structs that hold them)."""
    return prune_columns(schema, set(field_ids), select_full_types=False)


def columns_schema(schema: Schema, field_ids: Iterable[int]) -> Schema:
    """``schema`` cut down to the whole top-level fields ``field_ids`` (lists, maps and structs included)."""
    return prune_columns(schema, set(field_ids), select_full_types=True)


def name_mapping_of(properties: Mapping[str, str]) -> NameMapping | None:
    """The name mapping of a table with ``properties`` (its ``schema.name-mapping.default``), or None:
    PyIceberg's ``Table.name_mapping()`` for the table properties a writer task receives too."""
    text = properties.get(TableProperties.DEFAULT_NAME_MAPPING)
    return parse_mapping_from_json(text) if text else None


def _mapped_id(mapping: NameMapping | None, name: str) -> int | None:
    """The field id ``mapping`` gives a top-level column ``name`` (None: not listed, so ignored)."""
    for field in mapping.root if mapping is not None else ():
        if name in field.names:
            return field.field_id
    return None


def read_projected(
    io: FileIO, path: str, schema: Schema, only_needed_columns: bool = False, *, mapping: NameMapping | None
) -> pa.Table:
    """The Parquet file at ``path`` as rows of ``schema``, its columns matched by field id, or, in a file
    without field ids, by the names ``mapping`` (the table's name mapping: :func:`name_mapping_of`)
    gives them.

    ``only_needed_columns`` reads just the file's top-level columns whose field ids ``schema`` has
    (a key lookup reads the key column, not the whole file); every row is still returned, in order.

    Raises:
        pyiceberg.exceptions.ResolveError: a required field of ``schema`` is not in the file.
        ValueError: the file has no field ids and the table no name mapping.
    """
    with io.new_input(path).open(seekable=True) as stream:
        parquet = pq.ParquetFile(stream)
        names = None
        if only_needed_columns:
            wanted = {f.field_id for f in schema.fields}
            names = [
                f.name
                for f in parquet.schema_arrow
                if (field_id(f) if field_id(f) is not None else _mapped_id(mapping, f.name)) in wanted
            ]
            # Without one of them the row count would be lost: read everything instead.
            names = names or None
        table = parquet.read(columns=names)
    # Timestamps in nanoseconds only reach v1/v2 tables from foreign writers; Iceberg reads them as us.
    file_schema = pyarrow_to_schema(table.schema, name_mapping=mapping, downcast_ns_timestamp_to_us=True)
    target = schema_to_pyarrow(schema, include_field_ids=False)
    batches = [
        _to_requested_schema(
            schema, file_schema, batch, downcast_ns_timestamp_to_us=True, allow_timestamp_tz_mismatch=True
        )
        for batch in table.combine_chunks().to_batches()
        if batch.num_rows
    ]
    if not batches:
        return target.empty_table()
    # One Arrow type per Iceberg type (a list read from a file and one filled with nulls differ in
    # offset width otherwise), so tables of different files concatenate and compare.
    return pa.Table.from_batches(batches).cast(target)


def column_by_id(table: pa.Table, schema: Schema, field_id: int) -> pa.Array:
    """The values of field ``field_id`` (possibly nested in structs) of rows ``table`` of ``schema``.

    A field inside a null struct is null (see null_struct_depth to tell the two apart).
    """
    accessor = schema.accessor_for_field(field_id)
    array = table.column(accessor.position).combine_chunks()
    inner = accessor.inner
    while inner is not None:
        array = pc.struct_field(array, [inner.position])
        inner = inner.inner
    return array


def null_struct_depth(table: pa.Table, schema: Schema, field_id: int) -> pa.Array | None:
    """Per row, 0 when every struct holding field ``field_id`` is set, else 1 + the nesting level of
    the outermost null one; None for a top-level field.

    Iceberg Java compares equality-delete keys as projected structs, so ``s = null`` and
    ``s = {a: null}`` are different keys for the field ``s.a``: this tells them apart.
    """
    accessor = schema.accessor_for_field(field_id)
    if accessor.inner is None:
        return None
    array = table.column(accessor.position).combine_chunks()
    depth = pa.array([0] * len(array), pa.int32())
    level = 1
    inner: Accessor | None = accessor.inner
    while inner is not None:
        depth = pc.if_else(pc.and_(pc.equal(depth, 0), pc.is_null(array)), level, depth)
        array = pc.struct_field(array, [inner.position])
        level, inner = level + 1, inner.inner
    return depth
