"""Rewriting one group inside a Spark task: read, apply deletes, sort, write.

Each data file is read as the table's current schema, matching columns by Iceberg field id at every
nesting level (renamed, added, dropped and widened fields all line up; _iceberg/projection.py).
Then the delete files that apply to it (_iceberg/deletes.py) are applied: position deletes by
(file_path, pos), equality deletes as an anti-join on their equality columns in which a null
matches a null, as Iceberg's equality deletes do (SQL's ``null = null`` is not true, so a plain
join would let rows with null keys survive their deletes). Rows go through the sink's own
TaskWriter, so new files have the same layout, metrics and naming rules as streamed ones; files
written in the table's sort order record its id. Memory: one data file at a time plus the group's
delete keys (all rows of the group when the table has a sort order).

On a format v3 table every row keeps its row lineage: the writer's schema then holds the reserved
``_row_id`` and ``_last_updated_sequence_number`` columns (``_iceberg/lineage.py``), each row's values
are read from its file where written and otherwise computed as the spec says (the file's first row id
plus the row's position, the file's data sequence number) before any delete moves a position, and
written out as columns, as Iceberg Java's Spark rewrite does. Readers take a non-null column value
over what the new file would give.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import NameMapping
from pyiceberg.transforms import BucketTransform, IdentityTransform, TimeTransform, TruncateTransform, parse_transform
from pyiceberg.types import PrimitiveType
from pyspark import TaskContext

from iceberg_sink import _task_faults
from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink._iceberg.lineage import LAST_UPDATED_SEQUENCE_NUMBER, ROW_ID
from iceberg_sink._iceberg.live_vectors import VectorRef
from iceberg_sink._iceberg.projection import (
    column_by_id,
    key_schema,
    name_mapping_of,
    null_struct_depth,
    read_projected,
)
from iceberg_sink.topology.compaction.planner import RewriteGroup
from iceberg_sink.writer.result import DataFileMeta, FileContent, WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_writer import TaskWriter


@attrs.frozen
class SortField:
    """One field of a table sort order, as the rewrite task needs it.

    Attributes:
        source_id: the sorted field's id (possibly nested in structs).
        transform: the Iceberg transform applied before sorting (``identity``, ``bucket[16]``, ...).
        descending: sort direction.
        nulls_first: whether nulls sort before all values.
    """

    source_id: int
    transform: str
    descending: bool
    nulls_first: bool


@attrs.frozen
class SortSpec:
    """The table's sort order, when every field of it can be applied to Arrow rows."""

    order_id: int
    fields: tuple[SortField, ...]


def encode_group(
    group: RewriteGroup,
    sort: SortSpec | None,
    rules: DeleteRules,
    first_row_ids: dict[str, int | None] | None = None,
    vectors: dict[str, VectorRef] | None = None,
) -> bytes:
    """The JSON payload one rewrite task receives for ``group``. ``first_row_ids`` (v3 tables only:
    each data file's first row id) makes the task carry row lineage into the new files; ``vectors``
    (v3) are the live deletion vectors by data file (``_iceberg/live_vectors.py``)."""
    live = vectors or {}

    def files(fs: tuple[LiveFile, ...]) -> list[dict[str, Any]]:
        return [{"meta": f.meta.to_json(), "seq": f.data_sequence_number} for f in fs]

    return json.dumps(
        {
            "data": files(group.data_files),
            "deletes": files(group.delete_files),
            "sort": None
            if sort is None
            else {"order_id": sort.order_id, "fields": [attrs.asdict(f) for f in sort.fields]},
            "unpartitioned_spec_ids": sorted(rules.unpartitioned_spec_ids),
            "first_row_ids": None
            if first_row_ids is None
            else {f.meta.path: first_row_ids.get(f.meta.path) for f in group.data_files},
            "vectors": {f.meta.path: ref.to_json() for f in group.data_files if (ref := live.get(f.meta.path))},
        }
    ).encode()


def _decode(
    data: bytes,
) -> tuple[
    list[LiveFile], list[LiveFile], SortSpec | None, DeleteRules, dict[str, int | None] | None, dict[str, VectorRef]
]:
    obj = json.loads(data)

    def files(items: list[dict[str, Any]]) -> list[LiveFile]:
        return [LiveFile(DataFileMeta.from_json(i["meta"]), i["seq"], "") for i in items]

    sort = obj["sort"]
    return (
        files(obj["data"]),
        files(obj["deletes"]),
        None if sort is None else SortSpec(sort["order_id"], tuple(SortField(**f) for f in sort["fields"])),
        DeleteRules(obj["unpartitioned_spec_ids"]),
        obj.get("first_row_ids"),
        {path: VectorRef.from_json(v) for path, v in obj.get("vectors", {}).items()},
    )


def with_row_lineage(rows: pa.Table, first_row_id: int | None, data_sequence_number: int) -> pa.Table:
    """``rows`` (all of one data file, in file order, read with the lineage columns) with each row's
    ``_row_id`` and ``_last_updated_sequence_number`` as readers see them: the file's value where it
    holds one, else the file's first row id plus the row's position and the file's data sequence
    number. A file without a first row id (a v2 file no v3 snapshot has listed yet) has no lineage
    to inherit: its nulls stay null, as Iceberg Java reads them."""
    if first_row_id is None:
        return rows
    row_id = ROW_ID.name
    updated = LAST_UPDATED_SEQUENCE_NUMBER.name
    positions = pa.array(np.arange(first_row_id, first_row_id + rows.num_rows, dtype=np.int64))
    row_ids = pc.coalesce(rows.column(row_id), positions)
    sequence = pc.coalesce(rows.column(updated), pa.scalar(data_sequence_number, pa.int64()))
    rows = rows.set_column(rows.schema.get_field_index(row_id), rows.schema.field(row_id), row_ids)
    return rows.set_column(rows.schema.get_field_index(updated), rows.schema.field(updated), sequence)


def sortable(schema: Schema, field: SortField) -> bool:
    """Whether the rewrite can order rows by ``field`` (a primitive source and a known transform)."""
    try:
        source = schema.find_field(field.source_id).field_type
        transform = parse_transform(field.transform)
        return isinstance(source, PrimitiveType) and isinstance(
            transform, (IdentityTransform, BucketTransform, TimeTransform, TruncateTransform)
        )
    except ValueError:
        return False


def sort_rows(rows: pa.Table, schema: Schema, sort: SortSpec) -> pa.Table:
    """``rows`` in the order of ``sort``, including each field's transform and null order."""
    keys: dict[str, pa.Array] = {}
    order: list[tuple[str, str]] = []
    for i, field in enumerate(sort.fields):
        values = column_by_id(rows, schema, field.source_id)
        transform = parse_transform(field.transform)
        if not isinstance(transform, IdentityTransform):
            values = transform.pyarrow_transform(schema.find_field(field.source_id).field_type)(values)
        # Arrow places nulls at one end for all keys at once; a null flag per field sorted before the
        # field's values gives each field its own null order.
        keys[f"n{i}"] = pc.is_null(values)
        order.append((f"n{i}", "descending" if field.nulls_first else "ascending"))
        keys[f"v{i}"] = values
        order.append((f"v{i}", "descending" if field.descending else "ascending"))
    if not rows.num_rows:
        return rows
    return rows.take(pc.sort_indices(pa.table(keys), sort_keys=order))


class _DeleteCache:
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


def delete_cache(io: FileIO, schema: Schema, mapping: NameMapping | None) -> _DeleteCache:
    """A cache of delete files read for :func:`apply_deletes` (each file read once); ``mapping``: the
    table's name mapping (``projection.name_mapping_of``)."""
    return _DeleteCache(io, schema, mapping)


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
    cache: _DeleteCache,
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


def rewrite_group(spec: WriterSpec, payload: bytes, task_id: int, attempt_id: int) -> WriteResult:
    """Rewrite one group into new data files of the table's current partition spec."""
    data_files, delete_files, sort, rules, row_ids, vectors = _decode(payload)
    schema = spec.schema  # with the lineage columns when ``row_ids`` is given (compaction/job.py)
    io = spec.file_io()
    mapping = name_mapping_of(spec.properties)  # the compaction job ships the table's properties
    cache = _DeleteCache(io, schema, mapping)
    writer = TaskWriter(spec, task_id=task_id, attempt_id=attempt_id)
    kept: list[pa.Table] = []
    try:
        for data in data_files:
            rows = read_projected(io, data.meta.path, schema, mapping=mapping)
            if row_ids is not None:
                # Before the deletes: a row's position is its place in the file it was read from.
                rows = with_row_lineage(rows, row_ids.get(data.meta.path), data.data_sequence_number)
            ref = vectors.get(data.meta.path)
            vector = None if ref is None else ref.read(io)
            rows = apply_deletes(rows, data, delete_files, cache, schema, rules, vector)
            if sort is not None:
                kept.append(rows)
            elif rows.num_rows:
                writer.write(rows)
        if sort is not None and kept:
            writer.write(sort_rows(pa.concat_tables(kept), schema, sort))
        result = writer.complete()
    except BaseException:
        writer.abort()
        raise
    if sort is None:
        return result
    # Every file holds a slice of the sorted rows (the writer splits by partition and rolls files
    # in order): tell readers so, as Iceberg's writers do.
    return attrs.evolve(
        result, data_files=tuple(attrs.evolve(f, sort_order_id=sort.order_id) for f in result.data_files)
    )


def spark_rewrite(load_spec: Callable[[], WriterSpec]) -> Any:
    """The function Spark runs per partition of (group index, payload) pairs; ``load_spec`` gives
    the spec inside the task (see writer.spark.shipped)."""

    def run(items: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
        context = TaskContext.get()
        task_id = context.partitionId() if context is not None else 0
        attempt = context.taskAttemptId() if context is not None else 0
        attempt_number = context.attemptNumber() if context is not None else 0
        for index, payload in items:
            spec = load_spec()
            result = rewrite_group(spec, payload, task_id, attempt).encode()
            _task_faults.hit(_task_faults.TASK_AFTER_WRITE, task_id, attempt_number, spec.checkpoint_id)
            yield index, result

    return run
