"""Sorted runs of the partitioned key index: (key hash, data file, row position), in table storage.

    data files' key columns ──▶ entries sorted by key hash ──▶ one run file (blocks + block index)
    lookup: wanted hashes ──▶ block index ──▶ read only the blocks they fall in ──▶ (file, position)

An *entry* says that row ``p`` of data file ``f`` had a given key when the file was written. Its
sort key ``s`` is a 64-bit hash of the key, and the partition (bucket) of an entry is the top bits
of ``s``, so a file sorted by ``s`` is partitioned by key range and by hash at once:

- **int** keys (one required top-level field of an integer-like type): ``s`` is the key through
  splitmix64's finalizer, a bijection of 64-bit integers, so ``s`` *is* the key (exact, no
  collision): 16 bytes per entry (``s`` u64, file ordinal u32, position u32);
- **digest** keys (strings, binary, UUIDs, decimals, several fields, nullable fields): the 128-bit
  BLAKE2b digest of the key's canonical bytes (``s`` its first half, ``t`` its second): 24 bytes per
  entry. Two keys match when their digests do; a false match needs a 128-bit BLAKE2b collision
  (expected once in about 2^64 keys; not constructible on purpose).

A run file, written once and never changed::

    MAGIC | header length (u32 LE) | header (JSON: version, kind, block, entries, data files)
          | first s of each block (u64 LE) | CRC-32 of each block (u32 LE)
          | CRC-32 of everything so far (u32 LE) | entries (packed structs, ascending s, then t)

A lookup reads the header once (cached: runs never change) and then only the blocks its keys can
fall in, adjacent blocks coalesced into one read; every block read is checked against its CRC. A
corrupt or missing run raises :class:`~iceberg_sink.errors.CorruptFileError` or ``FileNotFoundError``:
the index is then rebuilt from the data files (partitioned.py), never trusted.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO

from iceberg_sink.errors import CorruptFileError
from iceberg_sink.keyindex.keys import as_int64

MAGIC = b"ICEBERG-SINK-RUN\n"
VERSION = 1
INT = "int"
DIGEST = "digest"
DTYPES = {
    INT: np.dtype([("s", "<u8"), ("f", "<u4"), ("p", "<u4")]),
    DIGEST: np.dtype([("s", "<u8"), ("t", "<u8"), ("f", "<u4"), ("p", "<u4")]),
}
_U32 = struct.Struct("<I")
_FIRST_READ = 64 * 1024
MAX_POSITION = 2**32 - 1

FileKey = tuple[str, int, int]
"""A data file as an entry names it: (path, size in bytes, record count)."""


def mix(keys: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over int64 keys: a bijection onto uint64 that spreads any key range."""
    z = keys.astype(np.int64, copy=False).view(np.uint64).copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _canonical(column: pa.Array) -> list[bytes]:
    """Each value of ``column`` as bytes that differ whenever the values differ (null included)."""
    if isinstance(column, pa.ExtensionArray):
        column = column.storage
    t = column.type
    valid = np.asarray(column.is_valid())
    if as_int64(pa.array([], t)) is not None:  # integer-like: its int64 value
        ints = as_int64(column.fill_null(pa.scalar(0, pa.int64()).cast(t)) if column.null_count else column)
        assert ints is not None
        return [
            b"\x01" + int(v).to_bytes(8, "little", signed=True) if ok else b"\x00"
            for v, ok in zip(ints, valid, strict=True)
        ]
    values = column.to_pylist()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [
            b"\x00" if v is None else b"\x02" + len(b := v.encode("utf-8")).to_bytes(4, "little") + b for v in values
        ]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return [b"\x00" if v is None else b"\x03" + len(v).to_bytes(4, "little") + v for v in values]
    if pa.types.is_boolean(t):
        return [b"\x00" if v is None else (b"\x05" if v else b"\x04") for v in values]
    if pa.types.is_decimal(t):  # the scale is the type's: equal values print alike
        return [b"\x00" if v is None else b"\x06" + str(v).encode("ascii") + b"\x00" for v in values]
    raise TypeError(f"expected a key column of an integer-like, string, binary, boolean or decimal type, received {t}")


def supports(t: pa.DataType) -> bool:
    """Whether a key column of Arrow type ``t`` can be indexed (floating point keys cannot)."""
    if isinstance(t, pa.ExtensionType):
        t = t.storage_type
    probe = pa.array([], t)
    try:
        _canonical(probe)
    except (TypeError, pa.ArrowNotImplementedError):
        return False
    return True


def key_hashes(keys: pa.Table, kind: str) -> np.ndarray:
    """The ``s`` (and, for digest keys, ``t``) of each row of ``keys`` (columns of ``key_columns``)."""
    if kind == INT:
        values = as_int64(keys.column(0).combine_chunks())
        if values is None or keys.column(0).null_count:
            raise TypeError(f"expected one integer-like key column without nulls, received {keys.schema}")
        out = np.empty(keys.num_rows, np.dtype([("s", "<u8")]))
        out["s"] = mix(values)
        return out
    columns = [_canonical(c.combine_chunks()) for c in keys.columns]
    raw = (
        b"".join(hashlib.blake2b(b"".join(parts), digest_size=16).digest() for parts in zip(*columns, strict=True))
        if columns
        else b""
    )
    return np.frombuffer(raw, dtype=_PAIR).copy()


_PAIR = np.dtype([("s", "<u8"), ("t", "<u8")])


def digests(entries: np.ndarray) -> np.ndarray:
    """The 128-bit digests (``s``, ``t``) of ``entries`` as one comparable value each (void16)."""
    out = np.empty(len(entries), _PAIR)
    out["s"], out["t"] = entries["s"], entries["t"]
    return out.view("V16")


def sort_entries(entries: np.ndarray) -> np.ndarray:
    """``entries`` in run order (ascending ``s``, then ``t``)."""
    if "t" in (entries.dtype.names or ()):
        return entries[np.lexsort((entries["t"], entries["s"]))]
    return entries[np.argsort(entries["s"], kind="stable")]


def distinct_hashes(hashes: np.ndarray) -> np.ndarray:
    """The distinct rows of ``hashes`` (``s`` or ``s``, ``t``), sorted."""
    return np.unique(hashes)


@attrs.frozen
class RunFile:
    """A run as the index's manifest records it."""

    path: str
    entries: int
    nbytes: int
    lo: int
    """The smallest ``s``."""
    hi: int
    """The largest ``s``."""


@attrs.frozen(eq=False)
class RunHeader:
    kind: str
    block: int
    entries: int
    files: tuple[FileKey, ...]
    firsts: np.ndarray
    crcs: np.ndarray
    data_offset: int


def write_run(io: FileIO, path: str, kind: str, entries: np.ndarray, files: Sequence[FileKey], block: int) -> RunFile:
    """Write ``entries`` (sorted by :func:`sort_entries`, file ordinals into ``files``) as one run."""
    dtype = DTYPES[kind]
    entries = np.ascontiguousarray(entries.astype(dtype, copy=False))
    n = len(entries)
    starts = np.arange(0, n, block)
    firsts = np.ascontiguousarray(entries["s"][starts], dtype="<u8")
    raw = entries.view(np.uint8).reshape(-1) if n else np.empty(0, np.uint8)
    width = dtype.itemsize
    crcs = np.array([zlib.crc32(raw[i * width : (i + block) * width].data) for i in starts], dtype="<u4")
    head = json.dumps(
        {"version": VERSION, "kind": kind, "block": block, "entries": n, "files": [list(f) for f in files]},
        separators=(",", ":"),
    ).encode("utf-8")
    prefix = b"".join([MAGIC, _U32.pack(len(head)), head, firsts.tobytes(), crcs.tobytes()])
    prefix += _U32.pack(zlib.crc32(prefix))
    with io.new_output(path).create(overwrite=True) as stream:
        stream.write(prefix)
        stream.write(raw.tobytes())
    lo = int(entries["s"][0]) if n else 0
    hi = int(entries["s"][-1]) if n else 0
    return RunFile(path, n, len(prefix) + len(raw), lo, hi)


class _Headers:
    """Run headers read in this process, by path (runs never change), within a byte bound."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, RunHeader] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str) -> RunHeader | None:
        with self._lock:
            header = self._items.get(path)
            if header is not None:
                self._items.move_to_end(path)
            return header

    def put(self, path: str, header: RunHeader) -> None:
        size = header.firsts.nbytes + header.crcs.nbytes + 200 * len(header.files)
        with self._lock:
            if path in self._items:
                return
            self._items[path] = header
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.firsts.nbytes + old.crcs.nbytes + 200 * len(old.files)


HEADERS = _Headers()


def read_header(io: FileIO, path: str) -> RunHeader:
    """The header of the run at ``path`` (cached).

    Raises:
        CorruptFileError: not an intact run of a known version.
        FileNotFoundError: no file there.
    """
    cached = HEADERS.get(path)
    if cached is not None:
        return cached

    def corrupt(why: str) -> CorruptFileError:
        return CorruptFileError(f"key index run {path}: {why}; the index is rebuilt from the data files")

    with io.new_input(path).open(seekable=True) as stream:
        data = stream.read(_FIRST_READ)
        fixed = len(MAGIC) + _U32.size
        if len(data) < fixed or not data.startswith(MAGIC):
            raise corrupt(f"expected a file starting with {MAGIC!r}, received {data[: len(MAGIC)]!r}")
        (head_len,) = _U32.unpack_from(data, len(MAGIC))
        try:
            head = json.loads(bytes(data[fixed : fixed + head_len])) if fixed + head_len <= len(data) else None
        except ValueError:
            head = None
        if head is None:
            stream.seek(0)
            data = stream.read(fixed + head_len)
            try:
                head = json.loads(bytes(data[fixed : fixed + head_len]))
            except ValueError as e:
                raise corrupt(f"unreadable header ({e})") from e
        try:
            version, kind, block, entries = head["version"], head["kind"], int(head["block"]), int(head["entries"])
            files = tuple((str(p), int(size), int(count)) for p, size, count in head["files"])
        except (KeyError, TypeError, ValueError) as e:
            raise corrupt(f"unreadable header ({type(e).__name__}: {e})") from e
        if version != VERSION or kind not in DTYPES or block < 1:
            raise corrupt(f"expected version {VERSION} of kind int or digest, received {version!r} {kind!r}")
        blocks = -(-entries // block)
        end = fixed + head_len + 12 * blocks + _U32.size
        if len(data) < end:
            stream.seek(len(data))
            data = bytes(data) + stream.read(end - len(data))
    if len(data) < end:
        raise corrupt(f"expected a header and block index of {end} bytes, received {len(data)}")
    (crc,) = _U32.unpack_from(data, end - _U32.size)
    if zlib.crc32(memoryview(data)[: end - _U32.size]) != crc:
        raise corrupt("header checksum mismatch")
    at = fixed + head_len
    firsts = np.frombuffer(data, dtype="<u8", count=blocks, offset=at).copy()
    crcs = np.frombuffer(data, dtype="<u4", count=blocks, offset=at + 8 * blocks).copy()
    header = RunHeader(kind, block, entries, files, firsts, crcs, end)
    HEADERS.put(path, header)
    return header


def _blocks_for(firsts: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Indexes of the blocks that can hold an entry whose ``s`` is one of ``s`` (sorted)."""
    if not len(firsts) or not len(s):
        return np.empty(0, np.int64)
    # Equal s can run over a block boundary: from the block before the first block starting at s,
    # to the last block starting at or before s.
    low = np.maximum(np.searchsorted(firsts, s, side="left") - 1, 0)
    high = np.searchsorted(firsts, s, side="right") - 1
    keep = high >= 0
    low, high = low[keep], high[keep]
    marks = np.zeros(len(firsts) + 1, np.int64)
    np.add.at(marks, low, 1)
    np.add.at(marks, high + 1, -1)
    return np.flatnonzero(np.cumsum(marks)[:-1] > 0)


def read_blocks(io: FileIO, path: str, header: RunHeader, blocks: np.ndarray, gap: int = 4) -> np.ndarray:
    """The entries of ``blocks`` (ascending block indexes) of a run, each block checked against its
    CRC; blocks at most ``gap`` apart are read in one request."""
    dtype = DTYPES[header.kind]
    width = dtype.itemsize
    if not len(blocks):
        return np.empty(0, dtype)
    breaks = np.flatnonzero(np.diff(blocks) > gap + 1) + 1
    parts: list[np.ndarray] = []
    with io.new_input(path).open(seekable=True) as stream:
        for group in np.split(blocks, breaks):
            first, last = int(group[0]), int(group[-1])
            start = first * header.block
            stop = min((last + 1) * header.block, header.entries)
            stream.seek(header.data_offset + start * width)
            raw = stream.read((stop - start) * width)
            if len(raw) != (stop - start) * width:
                raise CorruptFileError(
                    f"key index run {path}: expected {(stop - start) * width} bytes at entry {start}, "
                    f"received {len(raw)}; the index is rebuilt from the data files"
                )
            view = memoryview(raw)
            for b in group:
                lo = (int(b) * header.block - start) * width
                hi = (min((int(b) + 1) * header.block, header.entries) - start) * width
                if zlib.crc32(view[lo:hi]) != int(header.crcs[b]):
                    raise CorruptFileError(
                        f"key index run {path}: block {int(b)} checksum mismatch; the index is rebuilt from the data files"
                    )
                parts.append(np.frombuffer(raw, dtype=dtype, count=(hi - lo) // width, offset=lo))
    return np.concatenate(parts)


def lookup(io: FileIO, path: str, wanted: np.ndarray) -> tuple[np.ndarray, tuple[FileKey, ...]]:
    """The entries of the run at ``path`` whose hash is one of ``wanted`` (distinct, sorted; fields
    ``s`` and, for digest keys, ``t``), with the run's data files (the entries' ``f`` index them)."""
    header = read_header(io, path)
    found = read_blocks(io, path, header, _blocks_for(header.firsts, wanted["s"]))
    found = found[np.isin(found["s"], wanted["s"])]
    if header.kind == DIGEST and len(found):
        found = found[np.isin(digests(found), digests(wanted))]
    return found, header.files


def read_range(io: FileIO, path: str, lo: int, hi: int) -> tuple[np.ndarray, tuple[FileKey, ...]]:
    """Every entry of the run at ``path`` with ``lo <= s <= hi``, and the run's data files."""
    header = read_header(io, path)
    bounds = np.array([lo, hi], dtype=np.uint64)
    first = max(int(np.searchsorted(header.firsts, bounds[0], side="left")) - 1, 0)
    last = int(np.searchsorted(header.firsts, bounds[1], side="right")) - 1
    if last < first:
        return np.empty(0, DTYPES[header.kind]), header.files
    found = read_blocks(io, path, header, np.arange(first, last + 1))
    return found[(found["s"] >= bounds[0]) & (found["s"] <= bounds[1])], header.files
