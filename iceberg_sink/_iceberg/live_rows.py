"""The one rule for which rows of a data file are live: its applicable delete files applied to its rows.

A file's rows are read as the table's schema (projection.py); then the delete files that apply to it
(deletes.py ``DeleteRules``) are applied: position deletes by (file_path, pos), a deletion vector's
positions (v3), and equality deletes as an anti-join on their equality columns in which a null
matches a null, as Iceberg's equality deletes do (SQL's ``null = null`` is not true, so a plain join
would let rows with null keys survive their deletes). Compaction's rewrite, the key index, v3 delete
resolution and TOAST lookups all read live rows through here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import NameMapping

from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink._iceberg.projection import column_by_id, key_schema, null_struct_depth, read_projected
from iceberg_sink.vocab.files import FileContent


class DeleteCache:
    def __init__(self, io: FileIO, schema: Schema, mapping: NameMapping | None) -> None:
        self._io = io
        self._schema = schema
        self._mapping = mapping
        self._tables: dict[str, pa.Table] = {}

    def get(self, delete: LiveFile) -> pa.Table:
        path = delete.meta.path
        if path not in self._tables:
            if delete.meta.content == FileContent.POSITION_DELETES:
                with self._io.new_input(path).open(seekable=True) as stream:
                    self._tables[path] = pq.read_table(stream, columns=["file_path", "pos"])
            else:
                keys = key_schema(self._schema, delete.meta.equality_ids or ())
                self._tables[path] = read_projected(self._io, path, keys, mapping=self._mapping)
        return self._tables[path]


def delete_cache(io: FileIO, schema: Schema, mapping: NameMapping | None) -> DeleteCache:
    """A cache of delete files read for :func:`apply_deletes` (each file read once); ``mapping``: the
    table's name mapping (``projection.name_mapping_of``)."""
    return DeleteCache(io, schema, mapping)


def _null_safe_codes(data: pa.Array, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Integer codes for ``data`` and ``keys`` on which equality matches Iceberg's: null equals null.

    Both sides are dictionary-encoded together with nulls encoded as a value of their own, so equal
    values (and nulls) get equal codes, and the codes themselves are never null.
    """
    both = pa.concat_arrays([data, keys.cast(data.type)])
    if isinstance(both, pa.ExtensionArray):  # uuid: encode its fixed-size binary storage
        both = both.storage
    codes = pc.dictionary_encode(both, null_encoding="encode").indices
    return codes.slice(0, len(data)), codes.slice(len(data))


def key_columns(rows: pa.Table, schema: Schema, ids: tuple[int, ...]) -> pa.Table:
    """The equality key ``ids`` of ``rows`` (of ``schema``): one column per field, plus, for a field
    nested in structs, which of those structs is null (see null_struct_depth)."""
    columns: dict[str, pa.Array] = {}
    for i in ids:
        columns[str(i)] = column_by_id(rows, schema, i)
        depth = null_struct_depth(rows, schema, i)
        if depth is not None:
            columns[f"{i}.depth"] = depth
    return pa.table(columns)


def row_numbers(count: int) -> pa.Array:
    """0, 1, ..., count - 1 as int64 (numpy: building it from a Python range costs ~0.4 s per million)."""
    return pa.array(np.arange(count, dtype=np.int64))


def matching_rows(rows: pa.Table, schema: Schema, ids: tuple[int, ...], keys_table: pa.Table) -> pa.Array:
    """Row numbers (int64, ascending) of ``rows`` (of ``schema``) whose equality key ``ids`` equals a
    key of ``keys_table`` (built by :func:`key_columns`), a null matching a null as in Iceberg."""
    if not rows.num_rows or not keys_table.num_rows:
        return pa.array([], pa.int64())
    data_keys = key_columns(rows, schema, ids)
    if data_keys.num_columns == 1:
        # One top-level key column: a hash lookup, in which a null matches a null (skip_nulls=False).
        values = data_keys.column(0).combine_chunks()
        keys = keys_table.column(0).combine_chunks().cast(values.type)
        if isinstance(values, pa.ExtensionArray):  # uuid: look up its fixed-size binary storage
            values, keys = values.storage, keys.storage
        mask = pc.is_in(values, value_set=keys, skip_nulls=False)
        return pc.indices_nonzero(mask).cast(pa.int64())
    left: dict[str, pa.Array] = {}
    right: dict[str, pa.Array] = {}
    for name in data_keys.column_names:
        left[name], right[name] = _null_safe_codes(
            data_keys.column(name).combine_chunks(), keys_table.column(name).combine_chunks()
        )
    matched = (
        pa.table({**left, "__row": row_numbers(rows.num_rows)})
        .join(pa.table(right), keys=list(left), join_type="left semi", use_threads=False)
        .column("__row")
        .combine_chunks()
    )
    return pc.take(matched, pc.sort_indices(matched))


def apply_deletes(
    rows: pa.Table,
    data: LiveFile,
    deletes: list[LiveFile],
    cache: DeleteCache,
    schema: Schema,
    rules: DeleteRules,
    vector: np.ndarray | None = None,
) -> pa.Table:
    """``rows`` of ``data`` (in ``schema``) without the rows its applicable delete files remove.
    ``vector``: the positions of ``data``'s deletion vector (v3), read by the caller; Puffin files
    among ``deletes`` are skipped (PyIceberg reads them without the blob's location)."""
    positions: list[pa.Array] = [] if vector is None else [pa.array(vector, pa.int64())]
    equality: dict[tuple[int, ...], list[pa.Table]] = {}
    for delete in deletes:
        if delete.meta.file_format.upper() == "PUFFIN" or not rules.applies(delete, data):
            continue
        table = cache.get(delete)
        if delete.meta.content == FileContent.POSITION_DELETES:
            mask = pc.equal(table.column("file_path"), data.meta.path)
            positions.append(table.column("pos").filter(mask).combine_chunks())
        else:
            ids = tuple(delete.meta.equality_ids or ())
            equality.setdefault(ids, []).append(key_columns(table, key_schema(schema, ids), ids))
    if positions:
        drop = pa.concat_arrays([p.cast(pa.int64()) for p in positions])
        rows = rows.filter(pc.invert(pc.is_in(row_numbers(rows.num_rows), value_set=drop)))
    for ids, tables in equality.items():
        if not rows.num_rows:
            break
        keys_table = pa.concat_tables(tables).combine_chunks()
        if not keys_table.num_rows:
            continue
        matched = matching_rows(rows, schema, ids, keys_table)
        # Filtering by row number keeps the input order.
        rows = rows.filter(pc.invert(pc.is_in(row_numbers(rows.num_rows), value_set=matched)))
    return rows
