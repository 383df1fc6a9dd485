"""The partitioned key index: key -> (data file, position), partitioned by key hash, in table storage.

    checkpoint's deleted keys ──▶ hash ──▶ partitions (top bits of the hash)
        ──▶ runs of those partitions: only the blocks the keys fall in are read (runs.py), in tasks
            that run in the driver or on Spark's executors (runner.py)
        ──▶ (data file, position) of every entry with one of the keys ──▶ kept where the file is one
            the delete applies to, live as the caller sees it ──▶ the caller's DVs / position deletes

Its state is a *manifest* (JSON, in ``<metadata>/iceberg-sink-key-index/partitioned/<key>/``): the
runs, which runs serve each partition, and the data files whose entries the runs hold (*covered*:
path, size and record count). A pointer file ``current`` names the newest manifest, so a restarted
driver reads one small file and builds nothing it had built.

What keeps it right:

- **Entries are facts about immutable files.** "Row p of file f had key k" stays true for as long
  as f exists, so any manifest, however old, is right about what it covers: hits are kept only for
  the data files the caller names (live on the head it resolves against, with the same size and
  record count). A compaction, an expiry, a truncate or another writer's files change which files
  are live, never what an entry says; rows deleted since are already in the caller's DVs.
- **Coverage is checked, never assumed.** A data file the caller asks about that the manifest does
  not cover is indexed first (*catch-up*: its key column read in a task, its entries written as a
  new run), whoever wrote it: the sink's own checkpoints, another writer, a compaction.
- **A broken index is rebuilt, never trusted.** A missing or corrupt run or manifest (each checked
  by CRC-32) drops the index; the lookup is redone after a catch-up of every file it needs.

Growth (*split*): when a partition holds more than ``partition_max_entries`` entries, every
partition is split in two (one more bit of the hash; hashes are uniform, so all grow alike), in the
manifest only: each half is served by the runs of its parent that reach into it, and merges rewrite
those runs half by half as they come due. A merge task (one partition, or neighbours that merge the
same runs) stays bounded however large the table grows; at most ``MAX_BITS`` bits.

Maintenance (*merge*): each partition's runs are merged size-tiered (the smallest runs, while the
next is at most ``fan_in`` times their sum) when the partition has more than ``fan_in`` runs, in one
task per partition, or per range of neighbouring partitions that merge the same runs (the small runs
catch-ups write span every partition: merged as one run, not sixteen); while the whole index holds
at most ``whole_entries`` entries it is merged as one key range instead (a small index stays a few
files). Entries of files no longer covered are dropped then. A run that no partition uses any more
is deleted once the manifest that drops it is current.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
import weakref
import zlib
from collections.abc import Callable, Collection, Sequence

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import NameMapping

from iceberg_sink import _faults
from iceberg_sink._arrays import distinct
from iceberg_sink._iceberg.live_rows import key_columns
from iceberg_sink._iceberg.projection import key_schema, read_projected
from iceberg_sink.errors import CorruptFileError, InvalidSinkConfigError
from iceberg_sink.keyindex import runs
from iceberg_sink.keyindex.manifest import POINTER, IndexKey, Manifest, file_key, read_current
from iceberg_sink.keyindex.runner import LocalRunner, Runner
from iceberg_sink.keyindex.runs import DIGEST, DTYPES, INT, FileKey, RunFile
from iceberg_sink.vocab.files import DataFileMeta

logger = logging.getLogger("iceberg_sink")

DEFAULT_PARTITIONS = 16
DEFAULT_BLOCK = 32
DEFAULT_FAN_IN = 4
DEFAULT_WHOLE_ENTRIES = 4_000_000
DEFAULT_PARTITION_MAX_ENTRIES = 8_000_000
"""A partition past this many entries is split (module docstring): a merge task of one partition
holds about 100-200 MB of entries at most."""
MAX_BITS = 12
"""At most 4,096 partitions: the manifest lists each one's runs."""
ROWS_PER_TASK = 4_000_000
"""Catch-up: data file rows one task indexes (about 100 MB of entries at most in its memory)."""


@attrs.frozen
class _Build:
    """A catch-up task: index ``files`` into one run at ``path``."""

    files: tuple[DataFileMeta, ...]
    schema: Schema
    key: IndexKey
    mapping: NameMapping | None
    path: str
    block: int


def _build(io: FileIO, task: _Build) -> RunFile:
    wanted = key_schema(task.schema, task.key.ids)
    parts = []
    for ordinal, meta in enumerate(task.files):
        if meta.record_count > runs.MAX_POSITION:
            raise ValueError(f"{meta.path}: {meta.record_count} rows, more than a key index entry can address")
        rows = read_projected(io, meta.path, wanted, only_needed_columns=True, mapping=task.mapping)
        if rows.num_rows != meta.record_count:
            raise ValueError(
                f"{meta.path}: expected {meta.record_count} rows (its manifest entry), read {rows.num_rows}; "
                "positions would be wrong, nothing is converted"
            )
        hashes = runs.key_hashes(key_columns(rows, wanted, task.key.ids), task.key.kind)
        entries = np.empty(rows.num_rows, DTYPES[task.key.kind])
        for name in hashes.dtype.names or ():
            entries[name] = hashes[name]
        entries["f"] = ordinal
        entries["p"] = np.arange(rows.num_rows, dtype=np.uint32)
        parts.append(entries)
    entries = runs.sort_entries(np.concatenate(parts)) if parts else np.empty(0, DTYPES[task.key.kind])
    return runs.write_run(io, task.path, task.key.kind, entries, [file_key(f) for f in task.files], task.block)


@attrs.frozen
class _Lookup:
    """A lookup task: the entries of ``paths`` (runs) whose hash is one of ``wanted``."""

    paths: tuple[str, ...]
    wanted: tuple[np.ndarray, ...]


def _lookup(io: FileIO, task: _Lookup) -> list[tuple[np.ndarray, tuple[FileKey, ...]]]:
    return runs.lookup(io, list(zip(task.paths, task.wanted, strict=True)))


@attrs.frozen
class _Merge:
    """A merge task: the entries of partition ``[lo, hi]`` of ``inputs``, of ``keep`` files, into one run."""

    inputs: tuple[str, ...]
    lo: int
    hi: int
    keep: frozenset[FileKey]
    kind: str
    path: str
    block: int


def _merge(io: FileIO, task: _Merge) -> RunFile:
    parts = []
    files: dict[FileKey, int] = {}
    for path in task.inputs:
        entries, names = runs.read_range(io, path, task.lo, task.hi)
        remap = np.array([files.setdefault(f, len(files)) if f in task.keep else -1 for f in names] or [0], np.int64)
        targets = remap[entries["f"].astype(np.int64)] if len(entries) else np.empty(0, np.int64)
        entries = entries[targets >= 0].copy()
        entries["f"] = targets[targets >= 0]
        parts.append(entries)
    merged = runs.sort_entries(np.concatenate(parts)) if parts else np.empty(0, DTYPES[task.kind])
    used = distinct(merged["f"])  # files whose every entry was dropped leave the run's file list
    renumber = np.zeros(len(files) or 1, np.int64)
    renumber[used] = np.arange(len(used))
    merged["f"] = renumber[merged["f"].astype(np.int64)] if len(merged) else merged["f"]
    ordered = list(files)
    return runs.write_run(io, task.path, task.kind, merged, [ordered[i] for i in used], task.block)


@attrs.define
class PartitionedCounters:
    """What one index did since it started."""

    files_indexed: int = 0
    runs_written: int = 0
    runs_merged: int = 0
    lookups: int = 0
    runs_read: int = 0
    manifests_written: int = 0
    rebuilds: int = 0
    splits: int = 0


_SHARED: weakref.WeakValueDictionary[str, PartitionedIndex] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


class PartitionedIndex:
    """The partitioned key index of one table (module docstring). Used by one job at a time.

    Args:
        io: the table's FileIO.
        location: the index's folder (``<metadata>/iceberg-sink-key-index/partitioned``).
        runner: where tasks run (runner.py).
        partitions: partitions of a new index (a power of two is used: the next one up).
        block: entries per block of a run (the unit a lookup reads).
        fan_in: runs a partition holds before they are merged (module docstring).
        whole_entries: up to this many entries the index is merged as one key range, not by partition.
        partition_max_entries: a partition past this many entries splits them all in two.
    """

    def __init__(
        self,
        io: FileIO,
        location: str,
        runner: Runner | None = None,
        partitions: int = DEFAULT_PARTITIONS,
        block: int = DEFAULT_BLOCK,
        fan_in: int = DEFAULT_FAN_IN,
        whole_entries: int = DEFAULT_WHOLE_ENTRIES,
        partition_max_entries: int = DEFAULT_PARTITION_MAX_ENTRIES,
    ) -> None:
        self.io = io
        self.location = location.rstrip("/")
        self.runner: Runner = runner or LocalRunner()
        self.partitions = partitions
        self.block = block
        self.fan_in = max(2, fan_in)
        self.whole_entries = whole_entries
        self.partition_max_entries = max(1, partition_max_entries)
        self.counters = PartitionedCounters()
        self._manifests: dict[str, Manifest] = {}
        self._names: dict[str, str] = {}  # by key signature: the manifest the pointer names, as last seen
        self._writable = False  # check_writable() passed
        self.lock = threading.RLock()
        """Held by :meth:`match`: the committer and a background conversion may share the index."""

    @classmethod
    def shared(
        cls,
        io: FileIO,
        location: str,
        runner: Runner | None,
        partitions: int,
        partition_max_entries: int = DEFAULT_PARTITION_MAX_ENTRIES,
    ) -> PartitionedIndex:
        """The one index of ``location`` in this process (a new one if none is alive), with ``io``.

        A table's v3 committer and its conversion (or two jobs of one sink) each writing the index
        through an instance of their own would delete runs the other's manifest still names: each
        would then rebuild the index (right, but at a first checkpoint's cost).
        """
        with _SHARED_LOCK:
            index = _SHARED.get(location.rstrip("/"))
            if index is None:
                index = cls(io, location, runner, partitions, partition_max_entries=partition_max_entries)
                _SHARED[index.location] = index
            index.io = io
            return index

    def check_writable(self) -> None:
        """Fail before a commit when the index's folder refuses files (once per instance).

        Raises:
            InvalidSinkConfigError: a file could not be written there; says why and what to change.
        """
        if self._writable:
            return
        probe = f"{self.location}/write-check-{uuid.uuid4().hex}"
        try:
            with self.io.new_output(probe).create(overwrite=True) as stream:
                stream.write(b"iceberg-sink key index")
        except Exception as e:
            raise InvalidSinkConfigError(
                f"iceberg-sink.key-index.mode=partitioned: expected to write the key index under {self.location}, "
                f"received {type(e).__name__}: {e}. The index lives under the table's metadata location; on a "
                "store that takes only Iceberg's own files (S3 Tables, a SeaweedFS table bucket) set the table "
                "property write.metadata.path to an ordinary location, or use iceberg-sink.key-index.mode=driver"
            ) from e
        try:
            self.io.delete(probe)
        except Exception as e:  # an orphan, never an error
            logger.warning("cannot delete key index file %s (%s: %s)", probe, type(e).__name__, e)
        self._writable = True

    def folder(self, key: IndexKey) -> str:
        return f"{self.location}/{key.signature}"

    # ---- state -------------------------------------------------------------------------------

    def manifest(self, key: IndexKey) -> Manifest:
        """The index of ``key``: in memory, else the current one in storage, else an empty one."""
        held = self._manifests.get(key.signature)
        if held is None:
            held = self._load(key) or Manifest.empty(key, self.partitions, self.block)
            self._manifests[key.signature] = held
        return held

    def _load(self, key: IndexKey) -> Manifest | None:
        try:
            name, manifest = read_current(self.io, self.folder(key))
        except FileNotFoundError:
            return None
        except Exception as e:  # unreadable: rebuilt from the data files, never trusted
            logger.warning("key index of %s is rebuilt: %s: %s", self.folder(key), type(e).__name__, e)
            self.counters.rebuilds += 1
            return None
        if manifest.key != key:
            return None
        self._names[key.signature] = name
        return manifest

    def _save(self, manifest: Manifest, dropped: Sequence[str]) -> None:
        folder = self.folder(manifest.key)
        data = manifest.encode()
        name = f"manifest-{uuid.uuid4().hex}.json"
        for step, path, payload in (
            (_faults.INDEX_RUNS_WRITTEN, name, data),
            (_faults.INDEX_MANIFEST_WRITTEN, POINTER, json.dumps([name, zlib.crc32(data)]).encode()),
        ):
            _faults.hit(step, -1)  # a driver dying here leaves files no current manifest names: orphans
            try:
                with self.io.new_output(f"{folder}/{path}").create(overwrite=True) as stream:
                    stream.write(payload)
            except Exception as e:
                # The lookup's answer stands (it never depends on the stored manifest); the stored
                # index stays the previous one, whose runs are therefore kept, and a restart catches up.
                logger.warning("cannot save the key index manifest in %s (%s: %s)", folder, type(e).__name__, e)
                return
        previous = self._names.get(manifest.key.signature)  # the one this index wrote or read last
        self._names[manifest.key.signature] = name
        self.counters.manifests_written += 1
        runs.forget(dropped)
        for path in [*dropped, *([f"{folder}/{previous}"] if previous else [])]:
            try:
                self.io.delete(path)
            except Exception as e:  # an orphan, never an error
                logger.warning("cannot delete key index file %s (%s: %s)", path, type(e).__name__, e)

    # ---- the lookup --------------------------------------------------------------------------

    def match(
        self,
        schema: Schema,
        key: IndexKey,
        requests: Sequence[tuple[DataFileMeta, pa.Table]],
        mapping: NameMapping | None,
        live: Collection[str] | None = None,
    ) -> tuple[dict[str, np.ndarray], int]:
        """For each (data file, deleted keys) of ``requests``: the positions (int64, ascending) of its
        rows whose key is one of those keys, and how many data files had to be indexed first.

        ``live``: the path of every live data file of the head the caller resolves against; the manifest then
        forgets the files that are not, and merges drop their entries. The keys come from
        ``key_columns`` of the key ``key.ids`` projected through ``schema``.
        """
        with self.lock:
            try:
                return self._match(schema, key, requests, mapping, live)
            except (CorruptFileError, FileNotFoundError) as e:
                logger.warning("key index of %s is rebuilt: %s: %s", self.folder(key), type(e).__name__, e)
                self.counters.rebuilds += 1
                self._manifests[key.signature] = Manifest.empty(key, self.partitions, self.block)
                return self._match(schema, key, requests, mapping, live)

    def _match(
        self,
        schema: Schema,
        key: IndexKey,
        requests: Sequence[tuple[DataFileMeta, pa.Table]],
        mapping: NameMapping | None,
        live: Collection[str] | None,
    ) -> tuple[dict[str, np.ndarray], int]:
        manifest = self.manifest(key)
        before = manifest
        if live is not None:
            manifest = attrs.evolve(manifest, covered={f: None for f in manifest.covered if f[0] in live})
        uncovered = {file_key(m): m for m, _ in requests if file_key(m) not in manifest.covered}
        fresh: set[int] = set()
        if uncovered:
            built = self._catch_up(schema, key, list(uncovered.values()), mapping)
            if len(built) > 1:  # a large catch-up (a first build): its runs are merged together next
                fresh = set(range(len(manifest.runs), len(manifest.runs) + len(built)))
            manifest = manifest.with_runs(built, uncovered)
        found = self._find(manifest, key, requests)
        manifest = self._split(manifest)
        manifest, dropped = self._merge_partitions(manifest, fresh)
        if manifest != before:
            self._save(manifest, dropped)
        self._manifests[key.signature] = manifest
        return found, len(uncovered)

    def _catch_up(
        self, schema: Schema, key: IndexKey, files: list[DataFileMeta], mapping: NameMapping | None
    ) -> list[RunFile]:
        groups: list[list[DataFileMeta]] = [[]]
        rows = 0
        for f in sorted(files, key=lambda f: f.path):
            if groups[-1] and rows + f.record_count > ROWS_PER_TASK:
                groups.append([])
                rows = 0
            groups[-1].append(f)
            rows += f.record_count
        folder = self.folder(key)
        tasks = [
            _Build(tuple(g), schema, key, mapping, f"{folder}/runs/{uuid.uuid4().hex}.run", self.block) for g in groups
        ]
        weight = (
            sum(f.file_size_in_bytes for f in files) + sum(f.record_count for f in files) * DTYPES[key.kind].itemsize
        )
        built = self.runner.run(_build, tasks, self.io, folder, weight)
        self.counters.files_indexed += len(files)
        self.counters.runs_written += len(built)
        return built

    def _find(
        self, manifest: Manifest, key: IndexKey, requests: Sequence[tuple[DataFileMeta, pa.Table]]
    ) -> dict[str, np.ndarray]:
        # Requests usually share one table of deleted keys (a global delete reaches every file):
        # each table is hashed once.
        hashed: dict[int, np.ndarray] = {}
        for _, keys in requests:
            if id(keys) not in hashed:
                # A null never matches an integer key's rows (the field is required: files hold none).
                rows = keys.drop_null() if key.kind == INT else keys
                hashed[id(keys)] = runs.distinct_hashes(runs.key_hashes(rows, key.kind))
        result: dict[str, np.ndarray] = {m.path: np.empty(0, np.int64) for m, _ in requests}
        if not any(len(h) for h in hashed.values()):
            return result
        wanted = (
            next(iter(hashed.values()))
            if len(hashed) == 1
            else runs.distinct_hashes(np.concatenate(list(hashed.values())))
        )
        by_file = self._lookup_all(manifest, key, wanted)
        for meta, keys in requests:
            entries = by_file.get(file_key(meta))
            mine = hashed[id(keys)]
            if entries is None or not len(mine):
                continue
            if mine is not wanted:  # this file's deletes hold only some of the keys looked up
                if key.kind == DIGEST:
                    entries = entries[np.isin(runs.digests(entries), runs.digests(mine))]
                else:
                    entries = entries[np.isin(entries["s"], mine["s"])]
            result[meta.path] = np.union1d(result[meta.path], entries["p"].astype(np.int64))
        return result

    def _lookup_all(self, manifest: Manifest, key: IndexKey, wanted: np.ndarray) -> dict[FileKey, np.ndarray]:
        """The entries whose hash is one of ``wanted`` (sorted, distinct), by data file."""
        partition = manifest.partition_of(wanted["s"])
        serving: dict[int, list[int]] = {}
        for b, indexes in enumerate(manifest.slices):
            for i in indexes:
                serving.setdefault(i, []).append(b)
        paths, subsets, weight = [], [], 0
        width = DTYPES[key.kind].itemsize
        for i, parts in sorted(serving.items()):
            run = manifest.runs[i]
            subset = wanted[np.isin(partition, parts)]
            subset = subset[(subset["s"] >= np.uint64(run.lo)) & (subset["s"] <= np.uint64(run.hi))]
            if len(subset):
                paths.append(run.path)
                subsets.append(subset)
                weight += runs.expected_read_bytes(run.path, run.nbytes, len(subset), manifest.block * width)
        self.counters.lookups += 1
        self.counters.runs_read += len(paths)
        groups = max(1, min(len(paths), self.runner.slots(weight)))
        tasks = [_Lookup(tuple(paths[g::groups]), tuple(subsets[g::groups])) for g in range(groups) if paths]
        hits = [h for part in self.runner.run(_lookup, tasks, self.io, self.folder(key), weight) for h in part]
        ids: dict[FileKey, int] = {}
        parts_found, owners = [], []
        for entries, files in hits:
            remap = np.array([ids.setdefault(f, len(ids)) for f in files] or [0], np.int64)
            parts_found.append(entries)
            owners.append(remap[entries["f"].astype(np.int64)])
        if not parts_found:
            return {}
        found, owner = np.concatenate(parts_found), np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        found, owner = found[order], owner[order]
        bounds = np.flatnonzero(np.diff(owner)) + 1
        named = list(ids)
        return {
            named[int(chunk_owner[0])]: chunk
            for chunk, chunk_owner in zip(np.split(found, bounds), np.split(owner, bounds), strict=True)
            if len(chunk)
        }

    def _split(self, manifest: Manifest) -> Manifest:
        """``manifest`` split (module docstring) until no partition holds more than
        ``partition_max_entries`` entries, or it has ``MAX_BITS`` bits."""
        while manifest.bits < MAX_BITS and max(manifest.partition_entries()) > self.partition_max_entries:
            manifest = manifest.split()
            self.counters.splits += 1
        return manifest

    def _tier(self, indexes: Sequence[int], size: Callable[[int], float]) -> list[int]:
        """The runs to merge: the smallest two, and each next one while it is at most ``fan_in``
        times their sum (size-tiered: an entry is rewritten O(log n) times)."""
        by_size = sorted(indexes, key=size)
        group = by_size[:2]
        total = sum(size(i) for i in group)
        for i in by_size[2:]:
            if size(i) > self.fan_in * total:
                break
            group.append(i)
            total += size(i)
        return group

    def _merge_plan(self, manifest: Manifest, fresh: Collection[int] = ()) -> list[tuple[range, list[int]]]:
        """(partitions, runs) to merge: while the index is small, all of it is one key range (few
        files); past ``whole_entries`` each partition on its own, neighbours that merge the same runs
        together. ``fresh``: the runs of a catch-up that wrote several (each spanning every partition,
        each a lookup would read a block of per key); merged together, whatever their size."""
        if sum(r.entries for r in manifest.runs) <= self.whole_entries:
            everything = sorted({i for s in manifest.slices for i in s})
            if len(everything) <= self.fan_in:
                return []
            return [(range(manifest.partitions), self._tier(everything, lambda i: manifest.runs[i].entries))]
        # Neighbouring partitions that merge the same runs (runs a catch-up wrote span every
        # partition) merge in one task, up to a task's entries: one run written, not one each.
        plan: list[tuple[range, list[int]]] = []
        entries = 0.0
        for b, indexes in enumerate(manifest.slices):
            mine = [i for i in indexes if i in fresh]
            if len(mine) > 1:
                group = mine
            elif len(indexes) > self.fan_in:
                group = self._tier(indexes, manifest.slice_entries)
            else:
                continue
            size = sum(manifest.slice_entries(i) for i in group)
            last = plan[-1] if plan else None
            if last and last[0].stop == b and sorted(last[1]) == sorted(group) and entries + size <= ROWS_PER_TASK:
                plan[-1] = (range(last[0].start, b + 1), last[1])
                entries += size
            else:
                plan.append((range(b, b + 1), group))
                entries = size
        return plan

    def _merge_partitions(self, manifest: Manifest, fresh: Collection[int] = ()) -> tuple[Manifest, list[str]]:
        plan = self._merge_plan(manifest, fresh)
        if not plan:
            return manifest, []
        tasks = [
            _Merge(
                tuple(manifest.runs[i].path for i in group),
                manifest.bounds(parts[0])[0],
                manifest.bounds(parts[-1])[1],
                frozenset(manifest.covered),
                manifest.key.kind,
                f"{self.folder(manifest.key)}/runs/{uuid.uuid4().hex}.run",
                manifest.block,
            )
            for parts, group in plan
        ]
        width = DTYPES[manifest.key.kind].itemsize
        weight = sum(manifest.runs[i].entries for _, group in plan for i in group) * width
        merged = self.runner.run(_merge, tasks, self.io, self.folder(manifest.key), int(weight))
        self.counters.runs_merged += sum(len(group) for _, group in plan)
        self.counters.runs_written += len(merged)
        runs_now = list(manifest.runs)
        slices = [list(s) for s in manifest.slices]
        for (parts, group), run in zip(plan, merged, strict=True):
            spans = manifest.partition_of(np.array([run.lo, run.hi], np.uint64)) if run.entries else None
            for b in parts:
                slices[b] = [i for i in slices[b] if i not in group]
                if spans is not None and int(spans[0]) <= b <= int(spans[1]):
                    slices[b].append(len(runs_now))
            runs_now.append(run)
        manifest = attrs.evolve(manifest, runs=tuple(runs_now), slices=tuple(tuple(s) for s in slices))
        return manifest.compacted()  # merged runs, and empty new ones, serve no partition: dropped

    def stats(self, key: IndexKey) -> dict[str, int]:
        """Runs, entries and bytes of the index of ``key`` as it stands."""
        manifest = self.manifest(key)
        return {
            "partitions": manifest.partitions,
            "runs": len(manifest.runs),
            "entries": sum(r.entries for r in manifest.runs),
            "bytes": sum(r.nbytes for r in manifest.runs),
            "covered_files": len(manifest.covered),
            "covered_rows": sum(count for _, _, count in manifest.covered),
        }
