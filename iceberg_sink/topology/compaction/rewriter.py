"""Rewriting one group inside a Spark task: read, apply deletes, sort, write.

Each data file is read as the table's current schema, matching columns by Iceberg field id at every
nesting level (renamed, added, dropped and widened fields all line up; _iceberg/projection.py).
Then the delete files that apply to it are applied, by the one rule of _iceberg/live_rows.py. Rows
go through the sink's own TaskWriter, so new files have the same layout, metrics and naming rules as
streamed ones; files written in the table's sort order record its id. Memory: one data file at a time plus the group's
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
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, IdentityTransform, TimeTransform, TruncateTransform, parse_transform
from pyiceberg.types import PrimitiveType

from iceberg_sink import _task_faults
from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink._iceberg.lineage import LAST_UPDATED_SEQUENCE_NUMBER, ROW_ID
from iceberg_sink._iceberg.live_rows import DeleteCache, apply_deletes
from iceberg_sink._iceberg.live_vectors import VectorRef
from iceberg_sink._iceberg.projection import (
    column_by_id,
    name_mapping_of,
    read_projected,
)
from iceberg_sink.topology.compaction.planner import RewriteGroup
from iceberg_sink.vocab.files import DataFileMeta
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_start import task_start
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


def rewrite_group(spec: WriterSpec, payload: bytes, task_id: int, attempt_id: int) -> WriteResult:
    """Rewrite one group into new data files of the table's current partition spec."""
    data_files, delete_files, sort, rules, row_ids, vectors = _decode(payload)
    schema = spec.schema  # with the lineage columns when ``row_ids`` is given (compaction/job.py)
    io = spec.file_io()
    mapping = name_mapping_of(spec.properties)  # the compaction job ships the table's properties
    cache = DeleteCache(io, schema, mapping)
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
        task_id, attempt, attempt_number = task_start()
        for index, payload in items:
            spec = load_spec()
            result = rewrite_group(spec, payload, task_id, attempt).encode()
            _task_faults.hit(_task_faults.TASK_AFTER_WRITE, task_id, attempt_number, spec.checkpoint_id)
            yield index, result

    return run
