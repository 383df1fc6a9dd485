"""The partitioned key index's state: which key it indexes, and its manifest.

A manifest (JSON) names the runs, which runs serve each partition, and the data files the runs
cover; the pointer ``current`` in the index's folder names the newest one with its CRC-32. Any
manifest is right about what it covers (partitioned.py says why), so a reader that finds none, or one
it cannot read, simply starts an empty index.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Collection, Mapping, Sequence

import attrs
import numpy as np
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    FixedType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_sink.errors import CorruptFileError
from iceberg_sink.keyindex.runs import DIGEST, INT, FileKey, RunFile
from iceberg_sink.vocab.files import DataFileMeta

logger = logging.getLogger("iceberg_sink")

FOLDER = "partitioned"
POINTER = "current"
MANIFEST_VERSION = 1
_INTS = (IntegerType, LongType, DateType, TimeType, TimestampType, TimestamptzType)
_DIGESTABLE = (*_INTS, StringType, BinaryType, FixedType, UUIDType, DecimalType, BooleanType)


@attrs.frozen
class IndexKey:
    """The key an index is built for: its field ids, its kind (runs.py) and a signature of the
    fields' types that changes when they do (an int promoted to long keeps it: same entries)."""

    ids: tuple[int, ...]
    kind: str
    signature: str

    @classmethod
    def of(cls, schema: Schema, ids: tuple[int, ...]) -> IndexKey | None:
        """The index key of ``ids`` in ``schema``, or None when it cannot be indexed (a floating point
        field, or a key nested in a list or map)."""
        fields = []
        for i in ids:
            try:
                field = schema.find_field(i)
            except ValueError:
                return None
            if not isinstance(field.field_type, _DIGESTABLE):
                return None
            kind_name = "long" if isinstance(field.field_type, IntegerType) else str(field.field_type)
            fields.append((i, kind_name, field.required, schema.accessor_for_field(i).inner is None))
        # One required top-level integer-like field is its own hash; anything else (nested: its
        # structs' nulls are part of the key) is digested.
        single = len(ids) == 1 and fields[0][2] and fields[0][3]
        kind = INT if single and isinstance(schema.find_field(ids[0]).field_type, _INTS) else DIGEST
        text = json.dumps([kind, fields])
        return cls(ids, kind, hashlib.sha256(text.encode()).hexdigest()[:16])


@attrs.frozen
class Manifest:
    """One version of an index (module docstring). ``slices[b]``: indexes into ``runs`` of the runs
    that serve partition ``b``."""

    key: IndexKey
    bits: int
    block: int
    runs: tuple[RunFile, ...] = ()
    slices: tuple[tuple[int, ...], ...] = ()
    covered: Mapping[FileKey, None] = attrs.field(factory=dict)

    @classmethod
    def empty(cls, key: IndexKey, partitions: int, block: int) -> Manifest:
        bits = max(0, (partitions - 1).bit_length())
        return cls(key, bits, block, (), tuple(() for _ in range(1 << bits)), {})

    @property
    def partitions(self) -> int:
        return 1 << self.bits

    def bounds(self, b: int) -> tuple[int, int]:
        """The smallest and largest hash of partition ``b``."""
        shift = 64 - self.bits
        return (b << shift) if self.bits else 0, (((b + 1) << shift) - 1) if self.bits else 2**64 - 1

    def partition_of(self, s: np.ndarray) -> np.ndarray:
        return (s >> np.uint64(64 - self.bits)).astype(np.int64) if self.bits else np.zeros(len(s), np.int64)

    def with_runs(self, new: Sequence[RunFile], covered: Collection[FileKey]) -> Manifest:
        """This manifest plus runs ``new`` (each serving every partition its hashes span)."""
        added = range(len(self.runs), len(self.runs) + len(new))
        slices = [list(s) for s in self.slices]
        for index, run in zip(added, new, strict=True):
            if not run.entries:
                continue
            first, last = self.partition_of(np.array([run.lo, run.hi], np.uint64))
            for b in range(int(first), int(last) + 1):
                slices[b].append(index)
        return attrs.evolve(
            self,
            runs=(*self.runs, *new),
            slices=tuple(tuple(s) for s in slices),
            covered={**self.covered, **dict.fromkeys(covered)},
        )

    def slice_entries(self, index: int) -> float:
        """About how many entries of run ``index`` each partition it spans holds."""
        run = self.runs[index]
        first, last = self.partition_of(np.array([run.lo, run.hi], np.uint64))
        return run.entries / (int(last) - int(first) + 1)

    def partition_entries(self) -> list[float]:
        """About how many entries each partition holds (its runs' shares)."""
        shares = [self.slice_entries(i) if r.entries else 0.0 for i, r in enumerate(self.runs)]
        return [sum(shares[i] for i in s) for s in self.slices]

    def split(self) -> Manifest:
        """This manifest with twice the partitions (one more bit of the hash): each half of a
        partition is served by those of its runs whose hashes reach into it. No run is rewritten: a
        run that served one partition serves both halves until merges rewrite it half by half."""
        halves = attrs.evolve(self, bits=self.bits + 1, slices=())
        slices = []
        for b, indexes in enumerate(self.slices):
            for half in (2 * b, 2 * b + 1):
                lo, hi = halves.bounds(half)
                slices.append(tuple(i for i in indexes if self.runs[i].lo <= hi and self.runs[i].hi >= lo))
        return attrs.evolve(halves, slices=tuple(slices))

    def compacted(self) -> tuple[Manifest, list[str]]:
        """The manifest without runs no partition uses, and those runs' paths."""
        used = sorted({i for s in self.slices for i in s})
        renumber = {old: new for new, old in enumerate(used)}
        dropped = [r.path for i, r in enumerate(self.runs) if i not in renumber]
        return (
            attrs.evolve(
                self,
                runs=tuple(self.runs[i] for i in used),
                slices=tuple(tuple(renumber[i] for i in s) for s in self.slices),
            ),
            dropped,
        )

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": MANIFEST_VERSION,
                "key": {"ids": list(self.key.ids), "kind": self.key.kind, "signature": self.key.signature},
                "bits": self.bits,
                "block": self.block,
                "runs": [[r.path, r.entries, r.nbytes, r.lo, r.hi] for r in self.runs],
                "slices": [list(s) for s in self.slices],
                "covered": [list(f) for f in self.covered],
            },
            separators=(",", ":"),
        ).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes, location: str) -> Manifest:
        try:
            head = json.loads(data)
            if head["version"] != MANIFEST_VERSION:
                raise ValueError(f"expected version {MANIFEST_VERSION}, received {head['version']!r}")
            key = IndexKey(
                tuple(int(i) for i in head["key"]["ids"]), str(head["key"]["kind"]), str(head["key"]["signature"])
            )
            manifest = cls(
                key,
                int(head["bits"]),
                int(head["block"]),
                tuple(RunFile(str(p), int(n), int(b), int(lo), int(hi)) for p, n, b, lo, hi in head["runs"]),
                tuple(tuple(int(i) for i in s) for s in head["slices"]),
                {(str(p), int(size), int(count)): None for p, size, count in head["covered"]},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFileError(f"key index manifest {location}: unreadable ({type(e).__name__}: {e})") from e
        if len(manifest.slices) != manifest.partitions or any(
            i >= len(manifest.runs) for s in manifest.slices for i in s
        ):
            raise CorruptFileError(f"key index manifest {location}: partitions and runs do not agree")
        return manifest


def is_pointer(location: str) -> bool:
    """Whether ``location`` is the ``current`` pointer of a partitioned index."""
    parts = location.rstrip("/").rsplit("/", 3)
    return len(parts) == 4 and parts[1] == FOLDER and parts[3] == POINTER


def read_current(io: FileIO, folder: str) -> tuple[str, Manifest]:
    """The name and content of the manifest the pointer of the index in ``folder`` names.

    Raises:
        FileNotFoundError: no pointer (no index yet) or no manifest where it points.
        CorruptFileError: a pointer or manifest that does not parse or fails its CRC-32.
    """
    pointer = f"{folder}/{POINTER}"
    with io.new_input(pointer).open(seekable=False) as stream:
        text = stream.read()
    try:
        name, crc = json.loads(text)
    except (ValueError, TypeError) as e:
        raise CorruptFileError(f"key index pointer {pointer}: unreadable ({type(e).__name__}: {e})") from e
    location = f"{folder}/{name}"
    with io.new_input(location).open(seekable=False) as stream:
        data = stream.read()
    if zlib.crc32(data) != int(crc):
        raise CorruptFileError(f"key index manifest {location}: checksum mismatch")
    return str(name), Manifest.decode(data, location)


def current_files(io: FileIO, pointer: str, listed: Collection[str]) -> set[str]:
    """The files the index of ``pointer`` uses now: the pointer, its manifest and the manifest's runs
    (what orphan removal keeps; its older manifests and merged-away runs are orphans). An unreadable
    pointer or manifest keeps every file of ``listed`` in that index's folder (nothing is guessed)."""
    folder = pointer.rsplit("/", 1)[0]
    try:
        name, manifest = read_current(io, folder)
    except Exception as e:
        logger.warning("key index %s unreadable (%s: %s): all its files are kept", folder, type(e).__name__, e)
        return {f for f in listed if f.startswith(folder + "/")}
    return {pointer, f"{folder}/{name}", *(r.path for r in manifest.runs)}


def file_key(meta: DataFileMeta) -> FileKey:
    return (meta.path, meta.file_size_in_bytes, meta.record_count)
