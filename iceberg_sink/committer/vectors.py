"""A v3 checkpoint's deletes as deletion vectors, resolved against the branch head it commits on.

    committable (data files, equality deletes, in-batch position deletes)
        ──▶ resolve on head H (every commit attempt) ──▶ one DV per data file, a Puffin file each ──▶ RowDelta

On a format v3 table no equality delete and no position delete file reaches the table. The writers
still write them (as on v2: durable files listed by the stored committable), and the committer turns
them into DVs inside each commit attempt, against the exact head the attempt's compare-and-swap
names:

- an equality delete of the checkpoint would get the new snapshot's sequence number, so it would
  apply to every data file live on H (same spec and partition, or every file when it is global or
  the v2 path would commit it as global) and to none of the checkpoint's own files: the rows of
  those files whose key equals one of its keys (a null matching a null) are its positions. Key
  bounds prune files; keys come from the committer's :class:`KeyIndex` (in memory, else its entry
  persisted in table storage by an earlier driver) or from reading the file's key columns (a file
  not indexed yet, or whose persisted entry is missing, corrupt or of another file);
- an in-batch position delete names a row of one of the checkpoint's own data files;
- a data file that gains positions gets one DV holding them and every position already deleted in
  it on H: its live DV (read back and removed in the same snapshot) and any position delete file
  that applies to it (a format v2 table's, before its upgrade). A position delete file that names
  that data file only (file-scoped) is removed in the same snapshot, as Iceberg Java's DV writer
  does; one naming other data files too stays (a reader that finds a DV ignores it).

Because the resolution is redone on every attempt, a head that moved (another writer's DV on the
same file, an append, a compaction that replaced an indexed file) is simply resolved again: nothing
resolved on an older head is ever committed, and a replay after a kill resolves on the head it finds.
The result is the snapshot an equality delete committed on H would read as.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink import options
from iceberg_sink._iceberg.deletes import DeleteRules, keys_may_match
from iceberg_sink._iceberg.deletion_vectors import DeletionVector, Vector, read_vector, write_deletion_vectors
from iceberg_sink._iceberg.entries import live_files
from iceberg_sink._iceberg.files import LiveFile, delete_quietly
from iceberg_sink._iceberg.live_rows import key_columns
from iceberg_sink._iceberg.position_deletes import referenced_data_file, sorted_positions
from iceberg_sink._iceberg.projection import key_schema, name_mapping_of, read_projected
from iceberg_sink.keyindex import fetch
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.vocab.files import DataFileMeta, FileContent

PUFFIN = "PUFFIN"


@attrs.frozen
class ResolvedDeletes:
    """The DVs of one commit attempt.

    Attributes:
        vectors: the new DVs (delete files of format PUFFIN), at most one per data file.
        replaced: (Puffin path, referenced data file) of the live DVs they replace.
        retired: (path, data file) of the live file-scoped position delete files (a v2 table's,
            before its upgrade) whose positions the new DVs hold: removed in the same snapshot.
        written: the Puffin files written for them (_write_puffins: one per DV by default).
        data_files_read: data files whose key columns had to be read (not in the index).
    """

    vectors: tuple[DataFileMeta, ...] = ()
    replaced: frozenset[tuple[str, str]] = frozenset()
    retired: frozenset[tuple[str, str]] = frozenset()
    written: tuple[str, ...] = ()
    data_files_read: int = 0


def _positions_by_file(table: Table, position_deletes: Sequence[DataFileMeta]) -> dict[str, list[np.ndarray]]:
    """The rows the checkpoint's own position delete files delete, by data file path."""
    result: dict[str, list[np.ndarray]] = defaultdict(list)
    for p in position_deletes:
        with table.io.new_input(p.path).open(seekable=True) as stream:
            rows = pq.read_table(stream, columns=["file_path", "pos"])
        paths = rows.column("file_path").to_numpy(zero_copy_only=False)
        pos = rows.column("pos").to_numpy().astype(np.int64)
        for path in np.unique(paths):
            result[str(path)].append(pos[paths == path])
    return result


def _as_global(table: Table, rules: DeleteRules, equality: Sequence[DataFileMeta], data: Sequence[LiveFile]) -> bool:
    """Whether partitioned equality deletes reach every data file, as the v2 path commits them
    (committer ``_deletes_for_head``): when the head has live data files of another spec."""
    delete_specs = {f.spec_id for f in equality}
    if all(s in rules.unpartitioned_spec_ids for s in delete_specs):
        return False
    return bool({f.meta.spec_id for f in data} - delete_specs)


def resolve(
    table: Table,
    head: Snapshot | None,
    data_files: Sequence[DataFileMeta],
    equality_deletes: Sequence[DataFileMeta],
    position_deletes: Sequence[DataFileMeta],
    index: KeyIndex,
) -> ResolvedDeletes:
    """The DVs that make ``head`` plus the checkpoint (its new ``data_files``) read as if its deletes
    were committed on ``head`` as delete files (module docstring).

    Writes the Puffin files of its DVs (``written``); the caller deletes them if the attempt does not land.
    ``head`` None: the deletes reach no live file (a truncate's), only the checkpoint's own rows.

    Raises:
        ValueError: a position delete names a data file neither live on ``head`` nor the checkpoint's.
        CorruptFileError: a live DV that has to be merged fails its checks.
    """
    io, schema = table.io, table.schema()
    index.bind(table)
    data, deletes = live_files(table, head, index.manifests)  # DVs with their blob locations (v3)
    index.retain_manifests(m.manifest_path for m in (head.manifests(io) if head is not None else []))
    index.retain({f.meta.path for f in data}, {d.meta.path for d in deletes}, schema.schema_id)
    rules = DeleteRules.from_specs(table.specs())
    found: dict[str, list[np.ndarray]] = _positions_by_file(table, position_deletes)
    read = _match_keys(table, schema, rules, equality_deletes, data, index, found)
    by_path = {f.meta.path: f.meta for f in data} | {f.path: f for f in data_files}
    unknown = sorted(p for p, arrays in found.items() if p not in by_path and any(len(a) for a in arrays))
    if unknown:
        # An in-batch position delete names a row of the checkpoint's own files, never another.
        raise ValueError(f"position deletes of a data file neither live nor in the checkpoint: {unknown[0]}")
    return attrs.evolve(write_vectors(table, data, deletes, found, by_path, index), data_files_read=read)


def write_vectors(
    table: Table,
    data: Sequence[LiveFile],
    deletes: Sequence[LiveFile],
    found: dict[str, list[np.ndarray]],
    by_path: dict[str, DataFileMeta],
    index: KeyIndex,
) -> ResolvedDeletes:
    """One DV for every data file of ``found`` (path -> positions to delete) that gains a position,
    holding those and every position already deleted in it on the snapshot whose live files are
    ``data`` and ``deletes``: its live DV (which the new one replaces) and any position delete file
    that applies (a file-scoped one is retired with it; a reader that finds a DV ignores the
    others). Written by :func:`_write_puffins`; ``by_path`` gives the data files' specs and partitions. The v3
    checkpoint commit and the v3 equality-delete conversion (topology/conversion/job.py) both go
    through here: the one rule for merging DVs.

    Raises:
        CorruptFileError: a live DV that has to be merged fails its checks.
        OSError: a Puffin file cannot be written (nothing is committed).
    """
    io = table.io
    rules = DeleteRules.from_specs(table.specs())
    dvs: dict[str, LiveFile] = {}
    older: dict[str, list[LiveFile]] = defaultdict(list)
    for d in deletes:
        if d.meta.is_dv:
            dvs[str(d.meta.referenced_data_file)] = d
        elif d.meta.content == FileContent.POSITION_DELETES:
            for f in data:
                if f.meta.path in found and rules.applies(d, f):
                    older[f.meta.path].append(d)
    news = {path: new for path, arrays in sorted(found.items()) if len(new := sorted_positions(arrays))}
    # What the data files gaining positions have deleted already, read at once on object storage:
    # their live DVs (a request each, at every checkpoint) and the position delete files that apply.
    with_dv = [dvs[path] for path in news if path in dvs]  # (one Puffin file may hold several)
    read = fetch.each(_read_vector(table), with_dv, fetch.overlapped(v.meta.path for v in with_dv))
    vectors_read = {str(v.meta.referenced_data_file): vector for v, vector in zip(with_dv, read, strict=True)}
    pairs = [(p.meta.path, path) for path in news for p in older.get(path, [])]
    earlier = dict(zip(pairs, index.positions_of(io, pairs), strict=True))
    positions: dict[str, Vector] = {}
    replaced: set[tuple[str, str]] = set()
    retired: set[tuple[str, str]] = set()
    for path, new in news.items():
        old = dvs.get(path)
        before = [earlier[(p.meta.path, path)] for p in older.get(path, [])]
        # A live DV is added to as it was read (its bitmaps), not decoded and encoded again.
        merged = vectors_read[path].union([*before, new]) if old is not None else Vector.of([*before, new])
        # A reader that finds a DV ignores position delete files; without one it applies them.
        already = old.meta.record_count if old is not None else len(sorted_positions(before))
        if len(merged) == already:
            continue  # every row found is deleted already
        positions[path] = merged
        if old is not None:
            replaced.add((old.meta.path, path))
        retired.update((p.meta.path, path) for p in older.get(path, []) if referenced_data_file(p.meta) == path)
    if not positions:
        return ResolvedDeletes()
    written, paths = _write_puffins(table, positions)
    vectors = tuple(
        DataFileMeta(
            content=FileContent.POSITION_DELETES,
            path=v.path,
            spec_id=by_path[v.referenced_data_file].spec_id,
            partition=by_path[v.referenced_data_file].partition,
            record_count=v.cardinality,
            file_size_in_bytes=v.file_size_in_bytes,
            file_format=PUFFIN,
            referenced_data_file=v.referenced_data_file,
            content_offset=v.content_offset,
            content_size_in_bytes=v.content_size_in_bytes,
        )
        for v in written
    )
    return ResolvedDeletes(vectors, frozenset(replaced), frozenset(retired), paths)


def _read_vector(table: Table) -> Callable[[LiveFile], Vector]:
    """Reads a live DV (checked: CorruptFileError when it does not hold)."""

    def read(dv: LiveFile) -> Vector:
        meta = dv.meta
        assert meta.content_offset is not None and meta.content_size_in_bytes is not None
        return read_vector(table.io, meta.path, meta.content_offset, meta.content_size_in_bytes, meta.record_count)

    return read


def _write_puffins(table: Table, positions: dict[str, Vector]) -> tuple[list[DeletionVector], tuple[str, ...]]:
    """Write the DVs of ``positions`` (data file -> every position it has deleted) where the data files
    go, laid out as the table property ``iceberg-sink.deletion-vectors.files`` says: all in one Puffin
    file, spaced apart (the default), a Puffin file per DV, or all in one side by side. The one rule
    for the layout of the sink's Puffin files.

    Not side by side by default because DuckDB's iceberg extension 1.5.5 reads a blob through a cache
    that returns the start of a cached range, not the blob's offset in it: a DV whose bytes a read of
    another DV before it in the same file covered (the extension widens a read to the next cached
    range when the gap is at most the read's length) is read as that other DV, and rows come back
    wrong (docs/format-v3.md). Spaced (deletion_vectors.spaced_gaps) no read can widen over another
    DV, and a commit writes one file however many data files it touches (a file per DV was hundreds
    of files a commit on a table of hundreds of data files). On object storage a file per DV is
    written by the read pool's threads. Files written are deleted again if any fails.

    Raises:
        InvalidSinkConfigError: the table property holds another value.
        OSError: a Puffin file cannot be written (nothing is committed).
    """
    io = table.io
    layout = options.DELETION_VECTOR_FILES.from_properties(table.properties)
    spaced = layout == "one-per-commit-spaced"
    location = table.location_provider()
    files = [[path] for path in sorted(positions)] if layout == "one-per-vector" else [sorted(positions)]
    paths = tuple(location.new_data_location(data_file_name=f"{uuid.uuid4().hex}-dv.puffin") for _ in files)

    def write(index: int) -> tuple[DeletionVector, ...] | OSError:
        try:
            return write_deletion_vectors(io, paths[index], {path: positions[path] for path in files[index]}, spaced)
        except OSError as e:
            return e

    results = fetch.each(write, range(len(files)), fetch.overlapped(paths))
    failed = [(paths[i], r) for i, r in enumerate(results) if isinstance(r, OSError)]
    if failed:
        delete_quietly(io, [p for p, r in zip(paths, results, strict=True) if not isinstance(r, OSError)])
        path, error = failed[0]
        # Still an OSError (storage, as a data file write failing): what differs is the file's kind.
        raise OSError(
            f"cannot write the deletion vectors of this commit to {path}: {error}. Nothing was committed. "
            "Format v3 upserts write Puffin files (.puffin) where the data files go; storage that takes "
            "only data file formats there (a SeaweedFS table bucket answers 403 Access Denied) needs the "
            "table property write.data.path set to a location that takes Puffin files"
        ) from error
    return [v for r in results if not isinstance(r, OSError) for v in r], paths


def _match_keys(
    table: Table,
    schema: Schema,
    rules: DeleteRules,
    equality: Sequence[DataFileMeta],
    data: Sequence[LiveFile],
    index: KeyIndex,
    found: dict[str, list[np.ndarray]],
) -> int:
    """Add to ``found`` the rows of ``data`` the equality deletes remove; returns files read."""
    if not equality:
        return 0
    everywhere = _as_global(table, rules, equality, data)
    mapping = name_mapping_of(table.properties)
    keys: dict[tuple[tuple[int, ...], tuple[str, ...]], pa.Table] = {}
    applying: dict[str, list[DataFileMeta]] = defaultdict(list)
    by_partition: dict[tuple[int, tuple[object, ...]], list[LiveFile]] = defaultdict(list)
    for f in data:
        by_partition[(f.meta.spec_id, f.meta.partition)].append(f)
    files = {f.meta.path: f for f in data}
    for e in equality:
        is_global = everywhere or e.spec_id in rules.unpartitioned_spec_ids
        for f in data if is_global else by_partition.get((e.spec_id, e.partition), []):
            if keys_may_match(e, f.meta, schema):
                applying[f.meta.path].append(e)
    requests: dict[tuple[int, ...], list[tuple[DataFileMeta, pa.Table]]] = defaultdict(list)
    for path, es in sorted(applying.items()):
        by_ids: dict[tuple[int, ...], list[DataFileMeta]] = defaultdict(list)
        for e in es:
            by_ids[tuple(e.equality_ids or ())].append(e)
        for ids, group in by_ids.items():
            key = (ids, tuple(sorted(e.path for e in group)))
            if key not in keys:
                wanted = key_schema(schema, ids)
                tables = [
                    key_columns(
                        read_projected(table.io, e.path, wanted, only_needed_columns=True, mapping=mapping),
                        wanted,
                        ids,
                    )
                    for e in group
                ]
                keys[key] = pa.concat_tables(tables).combine_chunks()
            requests[ids].append((files[path].meta, keys[key]))
    positions, read = index.match(table.io, schema, requests, mapping)
    for path, arrays in positions.items():
        found[path].extend(arrays)
    return read
