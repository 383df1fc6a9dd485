"""Rewriting one group inside a Spark task: read, apply deletes, sort, write.

Each data file is read by Iceberg field id (so renamed columns still line up), then the delete
files that apply to it are applied: position deletes by (file_path, pos), equality deletes as an
anti-join on their equality columns. Rows go through the sink's own TaskWriter, so new files have
the same layout, metrics and naming rules as streamed ones. Memory: one data file at a time plus the
group's delete keys (all rows of the group when the table has a sort order).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyspark import TaskContext

from iceberg_sink._iceberg.deletes import applies
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink.topology.compaction.planner import RewriteGroup
from iceberg_sink.writer.result import DataFileMeta, FileContent, WriteResult
from iceberg_sink.writer.spec import WriterSpec
from iceberg_sink.writer.task_writer import TaskWriter

_FIELD_ID = b"PARQUET:field_id"


def encode_group(group: RewriteGroup, sort_columns: list[tuple[str, str]]) -> bytes:
    def files(fs: tuple[LiveFile, ...]) -> list[dict[str, Any]]:
        return [{"meta": f.meta.to_json(), "seq": f.data_sequence_number} for f in fs]

    return json.dumps(
        {"data": files(group.data_files), "deletes": files(group.delete_files), "sort": sort_columns}
    ).encode()


def _decode(data: bytes) -> tuple[list[LiveFile], list[LiveFile], list[tuple[str, str]]]:
    obj = json.loads(data)

    def files(items: list[dict[str, Any]]) -> list[LiveFile]:
        return [LiveFile(DataFileMeta.from_json(i["meta"]), i["seq"], "") for i in items]

    return files(obj["data"]), files(obj["deletes"]), [tuple(s) for s in obj["sort"]]  # type: ignore[misc]


def read_by_field_id(io: FileIO, path: str, schema: Schema) -> pa.Table:
    """A Parquet file's columns renamed to ``schema``'s names by field id; missing columns are null."""
    with io.new_input(path).open(seekable=True) as stream:
        table = pq.read_table(stream)
    by_id = {}
    for i, field in enumerate(table.schema):
        if field.metadata and _FIELD_ID in field.metadata:
            by_id[int(field.metadata[_FIELD_ID])] = i
    columns, names = [], []
    for field in schema.fields:
        if field.field_id in by_id:
            columns.append(table.column(by_id[field.field_id]))
            names.append(field.name)
    return pa.Table.from_arrays(columns, names=names) if columns else pa.table({})


class _DeleteCache:
    def __init__(self, io: FileIO, schema: Schema) -> None:
        self._io = io
        self._schema = schema
        self._tables: dict[str, pa.Table] = {}

    def get(self, delete: LiveFile) -> pa.Table:
        path = delete.meta.path
        if path not in self._tables:
            if delete.meta.content == FileContent.POSITION_DELETES:
                with self._io.new_input(path).open(seekable=True) as stream:
                    self._tables[path] = pq.read_table(stream, columns=["file_path", "pos"])
            else:
                self._tables[path] = read_by_field_id(self._io, path, self._schema)
        return self._tables[path]


def apply_deletes(
    rows: pa.Table, data: LiveFile, deletes: list[LiveFile], cache: _DeleteCache, schema: Schema
) -> pa.Table:
    """``rows`` of ``data`` without the rows its applicable delete files remove."""
    positions: list[pa.Array] = []
    equality: dict[tuple[str, ...], list[pa.Table]] = {}
    for delete in deletes:
        if not applies(delete, data):
            continue
        table = cache.get(delete)
        if delete.meta.content == FileContent.POSITION_DELETES:
            mask = pc.equal(table.column("file_path"), data.meta.path)
            positions.append(table.column("pos").filter(mask).combine_chunks())
        else:
            names = tuple(schema.find_column_name(i) or "" for i in delete.meta.equality_ids or ())
            equality.setdefault(names, []).append(table.select(list(names)))
    if positions:
        drop = pa.concat_arrays([p.cast(pa.int64()) for p in positions])
        index = pa.array(range(rows.num_rows), pa.int64())
        rows = rows.filter(pc.invert(pc.is_in(index, value_set=drop)))
    for names, tables in equality.items():
        keys = pa.concat_tables(tables).combine_chunks()
        key_cast = keys.cast(rows.select(list(names)).schema)
        rows = rows.join(key_cast, keys=list(names), join_type="left anti", use_threads=False)
    return rows


def rewrite_group(spec: WriterSpec, payload: bytes, task_id: int, attempt_id: int) -> WriteResult:
    """Rewrite one group into new data files of the table's current partition spec."""
    data_files, delete_files, sort = _decode(payload)
    schema = spec.schema
    io = spec.file_io()
    cache = _DeleteCache(io, schema)
    writer = TaskWriter(spec, task_id=task_id, attempt_id=attempt_id)
    kept: list[pa.Table] = []
    try:
        for data in data_files:
            rows = apply_deletes(read_by_field_id(io, data.meta.path, schema), data, delete_files, cache, schema)
            if sort:
                kept.append(rows)
            elif rows.num_rows:
                writer.write(rows)
        if kept:
            rows = pa.concat_tables(kept, promote_options="permissive")
            writer.write(rows.sort_by(sort) if rows.num_rows else rows)
        return writer.complete()
    except BaseException:
        writer.abort()
        raise


def spark_rewrite(spec: WriterSpec) -> Any:
    """The function Spark runs per partition of (group index, payload) pairs."""

    def run(items: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
        context = TaskContext.get()
        task_id = context.partitionId() if context is not None else 0
        attempt = context.taskAttemptId() if context is not None else 0
        for index, payload in items:
            yield index, rewrite_group(spec, payload, task_id, attempt).encode()

    return run
