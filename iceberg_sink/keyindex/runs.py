"""Sorted runs of the partitioned key index: (key hash, data file, row position), in table storage.

    data files' key columns ──▶ entries sorted by key hash ──▶ one run file (blocks + block index)
    lookup: wanted hashes ──▶ block index ──▶ read only the blocks they fall in ──▶ (file, position)

An *entry* says that row ``p`` of data file ``f`` had a given key when the file was written. Its
sort key ``s`` is a 64-bit hash of the key, and the partition (bucket) of an entry is the top bits
of ``s``, so a file sorted by ``s`` is partitioned by key range and by hash at once:

- **int** keys (one required top-level field of an integer-like type): ``s`` is the key through
  splitmix64's finalizer, a bijection of 64-bit integers, so ``s`` *is* the key (exact, no
  collision);
- **digest** keys (strings, binary, UUIDs, decimals, several fields, nullable fields): the 128-bit
  BLAKE2b digest of the key's canonical bytes (``s`` its first half, ``t`` its second). Two keys
  match when their digests do; a false match needs a 128-bit BLAKE2b collision (expected once in
  about 2^64 keys; not constructible on purpose).

On disk the file ordinal and the row position share one location field, 4 bytes when they fit (up
to 4,096 files of 1M rows per run) and 8 otherwise: an entry is 12 bytes for an int key, 20 for a
digest (16 and 24 otherwise).

A run file, written once and never changed::

    MAGIC | header length (u32 LE) | header (JSON: version, kind, block, entries, data files)
          | first s of each block (u64 LE) | checksum of each block (u64 LE)
          | CRC-32 of everything so far (u32 LE) | entries (packed structs, ascending s, then t)

A lookup reads the header once (cached: runs never change) and then only the blocks its keys can
fall in, blocks less than a request's worth of bytes apart coalesced into one read, the reads of
every run at once (fetch.py); every block used is checked against
its checksum (the sum of its 32-bit words, each times its position in the block, modulo 2^64:
computed for many blocks at once, it catches any changed word and any two swapped unequal words). A
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
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO

from iceberg_sink._arrays import distinct
from iceberg_sink.errors import CorruptFileError
from iceberg_sink.keyindex import fetch
from iceberg_sink.keyindex.keys import as_int64

MAGIC = b"ICEBERG-SINK-RUN\n"
VERSION = 1
INT = "int"
DIGEST = "digest"
DTYPES = {
    INT: np.dtype([("s", "<u8"), ("f", "<u4"), ("p", "<u4")]),
    DIGEST: np.dtype([("s", "<u8"), ("t", "<u8"), ("f", "<u4"), ("p", "<u4")]),
}
"""Entries as lookups and merges see them; on disk, file and position share one location field."""


def disk_dtype(kind: str, wide: bool) -> np.dtype:
    """Entries as a run stores them: the hash, then ``f << pbits | p`` in 4 bytes, or 8 when wide."""
    fields = [("s", "<u8"), ("t", "<u8")] if kind == DIGEST else [("s", "<u8")]
    return np.dtype([*fields, ("l", "<u8" if wide else "<u4")])


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


def key_hashes(keys: pa.Table, kind: str) -> np.ndarray:
    """The ``s`` (and, for digest keys, ``t``) of each row of ``keys`` (columns of ``key_columns``)."""
    if kind == INT:
        values = as_int64(keys.column(0).combine_chunks())
        if values is None or keys.column(0).null_count:
            raise TypeError(f"expected one integer-like key column without nulls, received {keys.schema}")
        out = np.empty(keys.num_rows, np.dtype([("s", "<u8")]))
        out["s"] = mix(values)
        return out
    if keys.num_columns == 1:
        column = keys.column(0).combine_chunks()
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            # A key of one string column (UUIDs, hashes), with nulls or without: the value's UTF-8
            # bytes, told apart from every other form by BLAKE2b's personalisation (a third faster
            # than the canonical bytes).
            blake = hashlib.blake2b
            values = column.cast(pa.large_binary()).to_pylist()
            raw = b"".join(
                [
                    _NULL_STRING if v is None else blake(v, digest_size=16, person=b"iceberg-sink-str").digest()
                    for v in values
                ]
            )
            return np.frombuffer(raw, dtype=_PAIR).copy()
    columns = [_canonical(c.combine_chunks()) for c in keys.columns]
    raw = (
        b"".join(hashlib.blake2b(b"".join(parts), digest_size=16).digest() for parts in zip(*columns, strict=True))
        if columns
        else b""
    )
    return np.frombuffer(raw, dtype=_PAIR).copy()


_PAIR = np.dtype([("s", "<u8"), ("t", "<u8")])
_NULL_STRING = hashlib.blake2b(b"", digest_size=16, person=b"iceberg-sink-nul").digest()


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
    """The distinct rows of ``hashes`` (``s``, or ``s`` and ``t``), sorted by ``s`` then ``t``."""
    if "t" not in (hashes.dtype.names or ()):
        values = distinct(hashes["s"])
        out = np.empty(len(values), hashes.dtype)
        out["s"] = values
        return out
    unique = np.unique(digests(hashes))
    pairs = np.frombuffer(unique.tobytes(), dtype=_PAIR) if len(unique) else np.empty(0, _PAIR)
    return pairs[np.lexsort((pairs["t"], pairs["s"]))]


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
    sums: np.ndarray
    data_offset: int
    pbits: int
    wide: bool

    @property
    def dtype(self) -> np.dtype:
        return disk_dtype(self.kind, self.wide)


def write_run(io: FileIO, path: str, kind: str, entries: np.ndarray, files: Sequence[FileKey], block: int) -> RunFile:
    """Write ``entries`` (sorted by :func:`sort_entries`, file ordinals into ``files``) as one run.
    File ordinal and position are packed into 4 bytes when they fit (12 bytes per long key), else 8."""
    n = len(entries)
    pbits = max(1, max((count - 1 for _, _, count in files), default=1).bit_length())
    fbits = max(1, (len(files) - 1).bit_length())
    wide = pbits + fbits > 32
    dtype = disk_dtype(kind, wide)
    packed = np.empty(n, dtype)
    for name in dtype.names or ():
        if name != "l":
            packed[name] = entries[name]
    packed["l"] = (entries["f"].astype(np.uint64) << np.uint64(pbits)) | entries["p"].astype(np.uint64)
    starts = np.arange(0, n, block)
    firsts = np.ascontiguousarray(packed["s"][starts], dtype="<u8")
    raw = packed.tobytes()
    counts = np.minimum(starts + block, n) - starts
    sums = _block_sums(raw, counts * (dtype.itemsize // 4))
    head = json.dumps(
        {
            "version": VERSION,
            "kind": kind,
            "block": block,
            "entries": n,
            "pbits": pbits,
            "wide": wide,
            "files": [list(f) for f in files],
        },
        separators=(",", ":"),
    ).encode("utf-8")
    prefix = b"".join([MAGIC, _U32.pack(len(head)), head, firsts.tobytes(), sums.astype("<u8").tobytes()])
    prefix += _U32.pack(zlib.crc32(prefix))
    with io.new_output(path).create(overwrite=True) as stream:
        stream.write(prefix)
        stream.write(raw)
    lo = int(packed["s"][0]) if n else 0
    hi = int(packed["s"][-1]) if n else 0
    return RunFile(path, n, len(prefix) + len(raw), lo, hi)


class _Cache:
    """Values of immutable runs read in this process (their headers, or all their entries), by path,
    within a byte bound: least recently used first out."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str) -> Any:
        with self._lock:
            item = self._items.get(path)
            if item is None:
                return None
            self._items.move_to_end(path)
            return item[0]

    def put(self, path: str, value: Any, size: int) -> None:
        with self._lock:
            if path in self._items or size > self.max_bytes:
                return
            self._items[path] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self._bytes -= old

    def __contains__(self, path: str) -> bool:
        with self._lock:
            return path in self._items

    def discard(self, paths: Sequence[str]) -> None:
        with self._lock:
            for path in paths:
                item = self._items.pop(path, None)
                if item is not None:
                    self._bytes -= item[1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


HEADERS = _Cache(64 * 1024 * 1024)
ENTRIES = _Cache(64 * 1024 * 1024)
"""Runs a lookup needed most blocks of are kept whole (a small index is then looked up in memory, as
the driver index is; a large one is read block by block): a bound, not a share of the table."""


def forget(paths: Sequence[str]) -> None:
    """Drop deleted runs from this process's caches."""
    HEADERS.discard(paths)
    ENTRIES.discard(paths)


def read_header(io: FileIO, path: str) -> RunHeader:
    """The header of the run at ``path`` (cached).

    Raises:
        CorruptFileError: not an intact run of a known version.
        FileNotFoundError: no file there.
    """
    cached: RunHeader | None = HEADERS.get(path)
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
            pbits, wide = int(head["pbits"]), bool(head["wide"])
            files = tuple((str(p), int(size), int(count)) for p, size, count in head["files"])
        except (KeyError, TypeError, ValueError) as e:
            raise corrupt(f"unreadable header ({type(e).__name__}: {e})") from e
        if version != VERSION or kind not in DTYPES or block < 1:
            raise corrupt(f"expected version {VERSION} of kind int or digest, received {version!r} {kind!r}")
        blocks = -(-entries // block)
        end = fixed + head_len + 16 * blocks + _U32.size
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
    sums = np.frombuffer(data, dtype="<u8", count=blocks, offset=at + 8 * blocks).copy()
    header = RunHeader(kind, block, entries, files, firsts, sums, end, pbits, wide)
    HEADERS.put(path, header, header.firsts.nbytes + header.sums.nbytes + 200 * len(header.files))
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


# A block of at most this many words has every checksum below 2^53 (width (width + 1) / 2 times a
# word's 2^32 - 1): float64 holds it, and every partial sum, exactly.
_EXACT_WIDTH = 2047


def _block_sums(data: bytes, lengths: np.ndarray) -> np.ndarray:
    """The checksum of each block of ``data``, blocks of ``lengths`` 32-bit words one after another:
    each word times its position in its block, summed modulo 2^64 (one numpy pass for them all).

    Blocks of at most ``_EXACT_WIDTH`` words never reach 2^64: their sums are taken in float64, exact
    below 2^53, as one matrix-vector product (4-9x the uint64 arithmetic's speed: the whole index's
    check on the first lookup after a restart, a steady lookup's blocks)."""
    if not len(lengths):
        return np.empty(0, np.uint64)
    words = np.frombuffer(data, dtype="<u4")
    width = int(lengths[0])
    full = len(lengths) - int(lengths[-1] != width)
    if (lengths[:full] == width).all() and int(lengths[full:].sum()) < width:
        # Every block but perhaps the last is full (a run's blocks, in order): one 2-D pass.
        weights = np.arange(1, width + 1, dtype=np.uint64)
        blocks = words[: full * width].reshape(full, width)
        sums: np.ndarray = (
            np.dot(blocks.astype(np.float64), weights.astype(np.float64)).astype(np.uint64)
            if width <= _EXACT_WIDTH
            else (blocks.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        )
        if full == len(lengths):
            return sums
        tail = words[full * width :].astype(np.uint64)
        last: np.ndarray = np.append(sums, (tail * weights[: len(tail)]).sum(dtype=np.uint64))
        return last
    wide = words.astype(np.uint64)
    starts = np.cumsum(lengths) - lengths
    weights = np.arange(len(wide), dtype=np.uint64) - np.repeat(starts, lengths).astype(np.uint64) + np.uint64(1)
    return np.add.reduceat(wide * weights, starts)


def expected_read_bytes(path: str, nbytes: int, keys: int, block_bytes: int) -> int:
    """About the bytes a lookup of ``keys`` distinct hashes reads from the run at ``path`` of ``nbytes``
    (``block_bytes`` a block): what decides whether the lookup fits the driver (partitioned.py).

    Hashes are uniform, so the blocks the keys fall in are about ``m = nbytes / keys`` bytes apart,
    the gaps close to exponential; :func:`_groups` reads a gap shorter than a request's worth ``r``
    along with its blocks. Each key then costs its block plus the expected gap it brings along,
    ``E[X; X < r] = m (1 - e^(-r/m) (1 + r/m))``: keys far apart read a block each; keys closer than a
    request's worth read the whole run (a first lookup against the large runs of a first build, or a
    30M-row index's steady lookup on object storage), which a count of blocks alone took for a few MB.
    A run this process holds whole (``ENTRIES``) reads nothing: a large index's newest runs, which
    span every partition and which every lookup needs, would otherwise send a lookup the driver does
    from memory to a Spark job."""
    if keys <= 0 or nbytes <= 0 or path in ENTRIES:
        return 0
    mean = nbytes / keys
    ratio = fetch.request_bytes(path) / mean
    gap = mean * (1.0 - float(np.exp(-ratio)) * (1.0 + ratio))
    return min(nbytes, int(keys * (block_bytes + gap)))


def _groups(path: str, header: RunHeader, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """``blocks`` (ascending) cut where two are a request's worth of bytes or more apart
    (:func:`fetch.request_bytes`): the first and last block of each piece, and its byte range (one
    read each)."""
    width = header.dtype.itemsize
    gap = max(1, fetch.request_bytes(path) // (header.block * width))
    cut = np.flatnonzero(np.diff(blocks) > gap) + 1
    first = blocks[np.concatenate(([0], cut))].astype(np.int64)
    last = blocks[np.concatenate((cut - 1, [len(blocks) - 1]))].astype(np.int64)
    start = first * header.block
    stop = np.minimum((last + 1) * header.block, header.entries)
    spans = list(zip((header.data_offset + start * width).tolist(), ((stop - start) * width).tolist(), strict=True))
    return first, last, spans


def _decode(
    path: str, header: RunHeader, blocks: np.ndarray, first: np.ndarray, last: np.ndarray, chunks: list[bytes]
) -> np.ndarray:
    """The entries of ``blocks`` from the bytes read for the pieces ``first``..``last`` (``_groups``),
    each block checked against its checksum, as stored (``header.dtype``: :func:`_unpack` splits the
    location; a lookup unpacks only its hits)."""
    dtype = header.dtype
    width = dtype.itemsize
    read = _ranges(first, last - first + 1)  # every block read
    counts = np.minimum((read + 1) * header.block, header.entries) - read * header.block
    data = b"".join(chunks)
    if len(data) != int(counts.sum()) * width:
        raise CorruptFileError(
            f"key index run {path}: expected {int(counts.sum()) * width} bytes of blocks, received {len(data)}; "
            "the index is rebuilt from the data files"
        )
    entries = np.frombuffer(data, dtype=dtype)
    if len(read) != len(blocks):  # blocks between wanted ones came with the same request: left out, unchecked
        used = np.isin(read, blocks, assume_unique=True)
        entries, read, counts = entries[np.repeat(used, counts)], read[used], counts[used]
    bad = np.flatnonzero(_block_sums(entries.tobytes(), counts * (width // 4)) != header.sums[read])
    if len(bad):
        raise CorruptFileError(
            f"key index run {path}: block {int(read[bad[0]])} checksum mismatch; the index is rebuilt from the data files"
        )
    return entries


def read_blocks(io: FileIO, path: str, header: RunHeader, blocks: np.ndarray) -> np.ndarray:
    """The entries of ``blocks`` (ascending block indexes) of a run, each block checked against its
    checksum; blocks less than a request's worth of bytes apart are read in one request."""
    if not len(blocks):
        return _unpack(np.empty(0, header.dtype), header)
    first, last, spans = _groups(path, header, blocks)
    (chunks,) = fetch.read_ranges(io, [(path, spans)])
    return _unpack(_decode(path, header, blocks, first, last, chunks), header)


def _unpack(packed: np.ndarray, header: RunHeader) -> np.ndarray:
    out = np.empty(len(packed), DTYPES[header.kind])
    out["s"] = packed["s"]
    if header.kind == DIGEST:
        out["t"] = packed["t"]
    location = packed["l"].astype(np.uint64)
    out["f"] = location >> np.uint64(header.pbits)
    out["p"] = location & np.uint64((1 << header.pbits) - 1)
    return out


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, a + n) for a, n in zip(starts, counts)])``, vectorized."""
    total = int(counts.sum())
    if not total:
        return np.empty(0, np.int64)
    begins = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return begins + np.arange(total)


def lookup(io: FileIO, items: Sequence[tuple[str, np.ndarray]]) -> list[tuple[np.ndarray, tuple[FileKey, ...]]]:
    """For each ``(path, wanted)`` of ``items``: the entries of the run at ``path`` whose hash is one
    of ``wanted`` (distinct, sorted by :func:`distinct_hashes`; fields ``s`` and, for digest keys,
    ``t``), with the run's data files (the entries' ``f`` index them). The blocks of every run are
    read at once (fetch.py). A run a quarter of whose blocks are needed is read whole and kept in this
    process's cache (``ENTRIES``, as stored: only a lookup's hits are unpacked, so a restart's first
    lookup, which reads a small index whole, does not unpack every entry) when it takes at most half
    of it."""
    headers = fetch.each(lambda item: read_header(io, item[0]), items, fetch.overlapped(p for p, _ in items))
    found: list[np.ndarray | None] = [ENTRIES.get(path) for path, _ in items]
    plans = []  # (item, the blocks to read, kept whole)
    for i, ((path, wanted), header) in enumerate(zip(items, headers, strict=True)):
        if found[i] is not None:
            continue
        blocks = _blocks_for(header.firsts, wanted["s"])
        # A run a lookup needs a quarter of the blocks of is read nearly whole anyway (the ranges
        # between its blocks coalesce): it is decoded whole and kept, if at most half the cache. In a
        # large index these are the runs of the last checkpoints, which span every partition and
        # which every lookup reads again until a merge replaces them.
        whole = 4 * len(blocks) >= len(header.firsts)
        whole = whole and 2 * header.entries * header.dtype.itemsize <= ENTRIES.max_bytes
        if whole:
            blocks = np.arange(len(header.firsts))
        if not len(blocks):
            found[i] = np.empty(0, header.dtype)
            continue
        plans.append((i, blocks, whole, *_groups(path, header, blocks)))
    chunks = fetch.read_ranges(io, [(items[i][0], spans) for i, _, _, _, _, spans in plans])
    for (i, blocks, whole, first, last, _), read in zip(plans, chunks, strict=True):
        path, header = items[i][0], headers[i]
        found[i] = _decode(path, header, blocks, first, last, read)
        if whole:
            ENTRIES.put(path, found[i], header.entries * header.dtype.itemsize)
    out = []
    for (_, wanted), header, entries in zip(items, headers, found, strict=True):
        assert entries is not None
        # Both sides are sorted by s: two binary searches per wanted key give its entries.
        low = np.searchsorted(entries["s"], wanted["s"], side="left")
        high = np.searchsorted(entries["s"], wanted["s"], side="right")
        counts = high - low
        hits = entries[_ranges(low, counts)]
        if header.kind == DIGEST and len(hits):
            hits = hits[hits["t"] == np.repeat(wanted["t"], counts)]
        out.append((_unpack(hits, header), header.files))
    return out


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
