"""The key index a conversion keeps between runs: the equality keys of data files, in driver memory.

A data file never changes once written, so its key column, read once, stays right for as long as
the file is live: the next conversion looks keys up in memory instead of reading every data file the
equality deletes apply to (random updates defeat key-bounds pruning, so that is every older file).
An entry is keyed by the file's path, the key field ids and the schema id it was projected with, and
checked against the file's size and record count at every use (a different file under a reused path
is read again). Which data files an equality delete applies to (sequence numbers, partitions) is
decided by the plan (``_iceberg/deletes.py``), never here: the index only answers "which rows of
this file hold one of these keys".

Each file is indexed in one of two forms:

- **sorted**: the key is one top-level field of an integer-like type (int, long, date, time,
  timestamp) and the file holds no null key: the keys as a sorted numpy int64 array and the row
  positions in that order (uint32; left out when the file is already sorted by key, as rows
  appended with increasing ids are). A lookup of k keys is 2k binary searches, O(k log n) per file,
  or, when the file has fewer rows in the keys' range than about 8k and the keys' range is narrow
  (a table of a byte per value, built once per checkpoint), a read of each of those rows' keys in
  that table (keys.py ``WantedKeys``): a random update of a table of many small files reads each
  file's keys once instead of searching every file for every key. 12 bytes per row (8 when the
  file is sorted).
- **arrow**: any other key (several fields, strings, binary, nested fields, nullable keys): the
  projected key columns as Arrow; a lookup is one hash lookup per row of the file (``is_in``, or a
  semi-join for several fields, nulls matching nulls as in Iceberg). Exact, no file read; memory is
  the columns' Arrow size (about 8 bytes per row for a long, the string bytes plus 4 for a string).

The positions of position delete files the conversion wrote or read are kept too (8 bytes per
position), so merging a data file's earlier position deletes into its new file reads nothing; and
so are the live entries of the branch's manifests (about 6 KB per live file), so a run reads only
the manifests committed since the last one.

Memory is bounded by ``max_bytes`` (option ``iceberg-sink.conversion.key-index-max-bytes``): a file
is admitted while the total stays within it and kept until it is no longer live; a file that does
not fit is read at every conversion that needs it, as without an index. Entries of files that are no
longer live (compacted away, or a conversion replaced a position delete file) are dropped at each
conversion (:meth:`KeyIndex.retain`).

Data files' keys are also kept in table storage (``persisted.py``; option
``iceberg-sink.conversion.key-index-persist``, on by default): an entry admitted to memory is written
in the background, and a file missing from memory is looked up there before its data file is read,
so after a restart the first conversion or checkpoint reads only the files indexed by no earlier
run. Loaded entries are admitted under the same bound. Positions and manifest entries are rebuilt
after a restart (they are read from small files).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import NameMapping

from iceberg_sink._iceberg.entries import ManifestEntries
from iceberg_sink._iceberg.live_rows import matching_rows
from iceberg_sink._iceberg.position_deletes import read_positions, sorted_positions
from iceberg_sink._iceberg.projection import key_schema, read_projected
from iceberg_sink.keyindex import fetch
from iceberg_sink.keyindex.keys import IndexEntry, SortedKeys, WantedKeys, as_int64, index_rows
from iceberg_sink.keyindex.manifest import FOLDER, IndexKey
from iceberg_sink.keyindex.partitioned import DEFAULT_PARTITION_MAX_ENTRIES, PartitionedIndex
from iceberg_sink.keyindex.persisted import PersistCounters, PersistedKeys, index_location
from iceberg_sink.keyindex.runner import Runner
from iceberg_sink.vocab.files import DataFileMeta

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


class _KeptManifests(ManifestEntries):
    """Manifest entries kept across runs within the index's memory bound."""

    def __init__(self, index: KeyIndex) -> None:
        super().__init__()
        self._index = index

    def keep(self, count: int) -> bool:
        return self._index._admit(count * self.ENTRY_BYTES)


class KeyIndex:
    """Equality keys of data files, positions of position delete files and manifest entries, kept
    across conversions within ``max_bytes`` (see the module docstring). Used by one conversion at a
    time.

    Args:
        max_bytes: the memory bound.
        persist: keep data files' keys in the storage of the table given to :meth:`bind` too.
        partitions: above 0, keys are looked up in the partitioned index in table storage instead
            (partitioned.py: the driver holds none of them), with that many partitions.
        partition_max_entries: the partitioned index splits its partitions past this many entries each.
        runner: where the partitioned index's tasks run (runner.py; default: this process).
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_BYTES,
        persist: bool = False,
        partitions: int = 0,
        runner: Runner | None = None,
        partition_max_entries: int = DEFAULT_PARTITION_MAX_ENTRIES,
    ) -> None:
        self.max_bytes = max_bytes
        self.persist = persist
        self.partitions = partitions
        self.partition_max_entries = partition_max_entries
        self.runner = runner
        self.partitioned: PartitionedIndex | None = None
        """The partitioned index of the bound table (when ``partitions`` > 0)."""
        self.lock = threading.RLock()
        """Held by a user of an index that several jobs share (the v3 committers of one sink)."""
        self._store: PersistedKeys | None = None
        self._bytes = 0
        self.data_files_read = 0
        """Data files whose key columns were read, ever."""
        self._keys: dict[tuple[str, int, tuple[int, ...]], IndexEntry] = {}
        self._positions: dict[tuple[str, str], np.ndarray] = {}
        self._last_deleted: tuple[pa.Table, WantedKeys] | None = None
        self._live: Collection[str] | None = None  # the data files live at the last retain()
        self.manifests: ManifestEntries = _KeptManifests(self)
        """The branch's manifests, read once each (ManifestEntries)."""

    @property
    def layout(self) -> tuple[int, bool, int, int]:
        """Memory bound, persistence, partitions and their bound: what an index shared by several jobs
        must agree on."""
        return (self.max_bytes, self.persist, self.partitions, self.partition_max_entries)

    @property
    def nbytes(self) -> int:
        """Bytes the index holds now."""
        return self._bytes

    @property
    def files(self) -> int:
        """Data files whose keys the index holds."""
        return len(self._keys)

    def bind(self, table: Table) -> None:
        """Use the persisted entries of ``table`` (when persisting) or its partitioned index, with its
        current FileIO.

        Raises:
            InvalidSinkConfigError: the partitioned index cannot write to the table's storage.
        """
        if self.partitions > 0:
            location = f"{index_location(table)}/{FOLDER}"
            if self.partitioned is None or self.partitioned.location != location:
                self.partitioned = PartitionedIndex.shared(
                    table.io, location, self.runner, self.partitions, self.partition_max_entries
                )
            else:
                self.partitioned.io = table.io
            self.partitioned.check_writable()
        if not self.persist or self.partitions > 0:
            return
        location = index_location(table)
        if self._store is None or self._store.location != location.rstrip("/"):
            if self._store is not None:
                self._store.flush()
            self._store = PersistedKeys(table.io, location)
        else:
            self._store.io = table.io

    @property
    def persisted(self) -> PersistCounters:
        """What was loaded from and written to table storage (all zero when not persisting)."""
        return self._store.counters if self._store is not None else PersistCounters()

    def flush(self, timeout: float | None = None) -> None:
        """Wait for the entries being written to table storage (a clean shutdown, tests)."""
        if self._store is not None:
            self._store.flush(timeout)

    def data_paths(self) -> frozenset[str]:
        """The data files whose keys the index holds."""
        return frozenset(path for path, _, _ in self._keys)

    def _admit(self, size: int) -> bool:
        if self._bytes + size > self.max_bytes:
            return False
        self._bytes += size
        return True

    def retain_manifests(self, manifest_paths: Iterable[str]) -> None:
        """Forget the entries of manifests the branch head no longer lists."""
        self._bytes -= self.manifests.retain(manifest_paths) * ManifestEntries.ENTRY_BYTES

    def retain(self, data_paths: Collection[str], delete_paths: Collection[str], schema_id: int) -> None:
        """Drop what no longer serves: data files not in ``data_paths``, keys projected with another
        schema than ``schema_id``, and position delete files not in ``delete_paths``. The partitioned
        index forgets the files not in ``data_paths`` at its next :meth:`match`."""
        self._live = data_paths
        for key in [k for k in self._keys if k[0] not in data_paths or k[1] != schema_id]:
            self._bytes -= self._keys.pop(key).keys.nbytes
            if self._store is not None and key[0] not in data_paths:
                self._store.forget(key[0])  # its persisted entry will never serve again
        for pkey in [k for k in self._positions if k[0] not in delete_paths or k[1] not in data_paths]:
            self._bytes -= self._positions.pop(pkey).nbytes

    def match(
        self,
        io: FileIO,
        schema: Schema,
        requests: Mapping[tuple[int, ...], Sequence[tuple[DataFileMeta, pa.Table]]],
        mapping: NameMapping | None,
    ) -> tuple[dict[str, list[np.ndarray]], int]:
        """For each key (field ids) of ``requests`` and each (data file, deleted keys built by
        ``key_columns``) under it: the row positions (int64, ascending; only non-empty arrays, by
        data file path) whose key is one of those keys, and how many data files had to be read.
        Through the partitioned index when there is one and it can index the key, else file by file;
        the data files live are the ones the last :meth:`retain` kept."""
        found: dict[str, list[np.ndarray]] = defaultdict(list)
        read = 0
        for ids, asked in requests.items():
            key = IndexKey.of(schema, ids) if self.partitioned is not None else None
            if self.partitioned is not None and key is not None:
                matched, indexed = self.partitioned.match(schema, key, asked, mapping, self._live)
                self.data_files_read += indexed
                read += indexed
            else:
                matched = {}
                # The files that share a table of deleted keys one after another: :meth:`_wanted`
                # keeps the last table's distinct keys, built again at every change of table.
                by_table: dict[int, list[tuple[DataFileMeta, pa.Table]]] = {}
                for meta, deleted in asked:
                    by_table.setdefault(id(deleted), []).append((meta, deleted))
                for meta, deleted in (pair for group in by_table.values() for pair in group):
                    positions, was_read = self.matching_positions(io, schema, meta, ids, deleted, mapping)
                    matched[meta.path] = np.asarray(positions, dtype=np.int64)
                    read += was_read
            for path, rows in matched.items():
                if len(rows):
                    found[path].append(rows)
        self._last_deleted = None  # its membership table (up to 64 MiB) is this lookup's only
        return dict(found), read

    def matching_positions(
        self,
        io: FileIO,
        schema: Schema,
        data: DataFileMeta,
        ids: tuple[int, ...],
        deleted: pa.Table,
        mapping: NameMapping | None,
    ) -> tuple[pa.Array, bool]:
        """Row positions (int64, ascending) of ``data`` whose key ``ids`` equals a key of ``deleted``
        (built by ``key_columns``; a null matching a null), and whether ``data`` had to be read
        (through ``mapping``, the table's name mapping, when it has no field ids)."""
        key = (data.path, schema.schema_id, ids)
        entry = self._keys.get(key)
        if entry is not None and (entry.file_size, entry.record_count) != (data.file_size_in_bytes, data.record_count):
            self._bytes -= self._keys.pop(key).keys.nbytes  # not the file it was read from
            entry = None
        read = False
        if entry is None and self._store is not None:
            entry = self._store.load(data, schema.schema_id, ids)
            if entry is not None and self._admit(entry.keys.nbytes):
                self._keys[key] = entry
        if entry is None:
            read = True
            self.data_files_read += 1
            wanted = key_schema(schema, ids)
            rows = read_projected(io, data.path, wanted, only_needed_columns=True, mapping=mapping)
            if rows.num_rows != data.record_count:
                raise ValueError(
                    f"{data.path}: expected {data.record_count} rows (its manifest entry), read {rows.num_rows}; "
                    "positions would be wrong, nothing is converted"
                )
            entry = IndexEntry(data.file_size_in_bytes, data.record_count, index_rows(rows, wanted, ids))
            if self._admit(entry.keys.nbytes):
                self._keys[key] = entry
                if self._store is not None:
                    self._store.save(data, schema.schema_id, ids, entry)
        if isinstance(entry.keys, SortedKeys):
            return pa.array(entry.keys.lookup(self._wanted(deleted))), read
        return matching_rows(entry.keys.rows, key_schema(schema, ids), ids, deleted), read

    def _wanted(self, deleted: pa.Table) -> WantedKeys:
        """The distinct non-null keys of ``deleted`` as int64, with their membership table (the same
        table serves many data files in a row: the last one is remembered)."""
        if self._last_deleted is not None and self._last_deleted[0] is deleted:
            return self._last_deleted[1]
        # Projected with the same schema, the deleted keys have the file's integer-like type; a
        # null key matches no row (the file has none).
        values = as_int64(deleted.column(0).combine_chunks().drop_null())
        if values is None:
            raise TypeError(f"equality delete keys of type {deleted.schema.field(0).type} for an integer key")
        wanted = WantedKeys.of(values)
        self._last_deleted = (deleted, wanted)
        return wanted

    def positions(self, io: FileIO, delete_path: str, data_path: str) -> np.ndarray:
        """The positions (int64, sorted, distinct) the position delete file ``delete_path`` deletes in
        ``data_path``."""
        return self.positions_of(io, [(delete_path, data_path)])[0]

    def positions_of(self, io: FileIO, wanted: Sequence[tuple[str, str]]) -> list[np.ndarray]:
        """:meth:`positions` of each ``(delete_path, data_path)`` of ``wanted``. Those not kept are
        read at once on object storage (fetch.py: a request's latency each, the files of a
        checkpoint's data files after a restart), one after another on a local file system."""
        out: list[np.ndarray | None] = [self._positions.get(key) for key in wanted]
        missing = [i for i, values in enumerate(out) if values is None]
        read = fetch.each(
            lambda i: sorted_positions([read_positions(io, *wanted[i])]),
            missing,
            fetch.overlapped(wanted[i][0] for i in missing),
        )
        for i, values in zip(missing, read, strict=True):
            self.remember_positions(*wanted[i], values)
            out[i] = values
        return [values for values in out if values is not None]

    def remember_positions(self, delete_path: str, data_path: str, positions: np.ndarray) -> None:
        """Keep the positions (sorted, distinct) of a position delete file (one just written)."""
        key = (delete_path, data_path)
        if key in self._positions:
            return
        values = positions
        if self._admit(values.nbytes):
            self._positions[key] = values
