"""Stored rows of a few keys, read from a table's snapshot on the driver (no Spark, no scan of the table).

Used for unchanged TOASTed columns (topology/toast.py): an update whose column holds Debezium's
placeholder keeps the key's stored value. The read is planned like a scan, file by file:

1. the snapshot's live data and delete files (``_iceberg/entries.live_files``);
2. data files pruned by the key fields' column bounds (``_iceberg/deletes.bounds_may_hold``): with
   keys clustered (ids growing over time, as sequences give) a key falls in the bounds of few files;
3. each candidate file's key columns read, the rows its delete files remove dropped by the one rule
   of which delete applies to which file (``_iceberg/deletes.DeleteRules``, through the compaction
   rewriter's ``apply_deletes``: a format v3 file's deletion vector, position deletes, equality
   deletes of higher data sequence number), equality delete files whose bounds hold none of the keys
   left out;
4. only for files holding a live row of a wanted key, the wanted columns of those rows.

Columns are resolved by field id against the table's current schema (a renamed column is found in
files written before the rename; a column added later reads as null), or through the table's name
mapping in files without field ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from iceberg_sink._iceberg.deletes import DeleteRules, bounds_may_hold
from iceberg_sink._iceberg.entries import live_files
from iceberg_sink._iceberg.files import arrow_schema, branch_head
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION
from iceberg_sink._iceberg.live_rows import apply_deletes, delete_cache, matching_rows, row_numbers
from iceberg_sink._iceberg.live_vectors import live_vectors
from iceberg_sink._iceberg.projection import columns_schema, key_schema, name_mapping_of, read_projected
from iceberg_sink.vocab.files import FileContent

_POSITION = "__iceberg_sink_position"


def stored_rows(
    table: Table, branch: str, key: Sequence[str], keys: Sequence[tuple[Any, ...]], columns: Sequence[str]
) -> tuple[list[tuple[Any, ...]], int]:
    """The live rows of ``table``'s ``branch`` head whose top-level ``key`` columns equal one of
    ``keys``: each as its key values then the values of ``columns`` (names of the current schema;
    None for a column the table does not have). Also returns how many data files were read.

    Raises:
        ValueError: a key column is not a top-level field of the table.
    """
    schema = table.schema()
    ids = tuple(schema.find_field(k).field_id for k in key)
    if any(schema.accessor_for_field(i).inner is not None for i in ids):
        raise ValueError(f"key {list(key)}: stored values are looked up by top-level key columns only")
    present = [c for c in columns if _has(schema, c)]
    wanted_ids = {schema.find_field(c).field_id for c in present}
    snapshot = branch_head(table, branch)
    if not keys or snapshot is None:
        return [], 0
    data, deletes = live_files(table, snapshot)
    rules = DeleteRules.from_specs(table.specs())
    types = _arrow_types(schema, ids)
    # Keys may come as text (a routed batch collects every table's keys in one column): Arrow casts them.
    wanted = pa.table({str(i): pa.array([k[n] for k in keys]).cast(types[n]) for n, i in enumerate(ids)})
    keys = list(zip(*[wanted.column(n).to_pylist() for n in range(len(ids))], strict=True))
    deletes = [
        d
        for d in deletes
        if d.meta.content == FileContent.POSITION_DELETES or bounds_may_hold(d.meta, schema, keys, ids)
    ]
    equality_ids = {i for d in deletes for i in d.meta.equality_ids or ()}
    projected = key_schema(schema, set(ids) | equality_ids)
    mapping = name_mapping_of(table.properties)
    cache = delete_cache(table.io, projected, mapping)
    # A v3 data file's deletion vector (PyIceberg's manifest reads lose where its blob is).
    vectors = live_vectors(table.io, snapshot) if table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION else {}
    found: list[tuple[Any, ...]] = []
    read = 0
    for file in data:
        if file.meta.content != FileContent.DATA or not bounds_may_hold(file.meta, schema, keys, ids):
            continue
        read += 1
        rows = read_projected(table.io, file.meta.path, projected, only_needed_columns=True, mapping=mapping)
        rows = rows.append_column(_POSITION, row_numbers(rows.num_rows))
        ref = vectors.get(file.meta.path)
        vector = None if ref is None else ref.read(table.io)
        rows = apply_deletes(rows, file, deletes, cache, projected, rules, vector)
        hits = matching_rows(rows, projected, ids, wanted)
        if not len(hits):
            continue
        positions = rows.column(_POSITION).take(hits)
        values = read_projected(
            table.io, file.meta.path, columns_schema(schema, set(ids) | wanted_ids), True, mapping=mapping
        )
        picked = values.take(positions).to_pydict()
        key_names = [schema.find_column_name(i) or "" for i in ids]
        for n in range(len(positions)):
            found.append(
                tuple(picked[k][n] for k in key_names) + tuple(picked[c][n] if c in picked else None for c in columns)
            )
    return found, read


def _has(schema: Schema, name: str) -> bool:
    try:
        schema.find_field(name)
    except ValueError:
        return False
    return True


def _arrow_types(schema: Schema, ids: tuple[int, ...]) -> list[pa.DataType]:
    """The Arrow types :func:`read_projected` gives the top-level fields ``ids``."""
    arrow = arrow_schema(key_schema(schema, ids))
    return [arrow.field(schema.find_column_name(i) or "").type for i in ids]
