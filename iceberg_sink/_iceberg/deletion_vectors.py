"""Deletion vectors (format v3): a data file's deleted row positions as a ``deletion-vector-v1``
Puffin blob, written and read back.

The blob (puffin-spec.md, "deletion-vector-v1 blob type") is::

    length (4 bytes, big-endian: magic + vector)   magic D1 D3 39 64   vector   CRC-32 of magic + vector (4, big-endian)

and the vector is the "portable" 64-bit Roaring serialization: a bucket count (8 bytes,
little-endian), then per bucket, keys ascending, the 32-bit key (the high half of the positions,
4 bytes little-endian) and a standard 32-bit Roaring bitmap of the low halves (RoaringFormatSpec).
The 32-bit bitmaps come from ``pyroaring`` (CRoaring, the same library PyIceberg reads DVs with);
the framing around them is here. As Iceberg Java's ``BitmapPositionDeleteIndex`` does, bitmaps are
run-optimized before they are written; reading accepts array, bitmap and run containers and the
empty buckets Java writes for gaps (its ``RoaringPositionBitmap`` is a dense array of buckets).

Each Puffin file written here holds one blob per data file (side by side, or spaced apart:
:func:`spaced_gaps`), with the blob metadata Iceberg Java's
``BaseDVFileWriter`` writes (fields ``[_pos]``, snapshot id and sequence number -1 as the spec
requires, properties ``referenced-data-file`` and ``cardinality``). A :class:`DeletionVector` is what
a v3 delete manifest entry needs to reference one blob. Committing them (one DV per data file, a new
DV carrying the previous one's positions) is not done here.
"""

from __future__ import annotations

import array
import zlib
from collections.abc import Iterable, Mapping, Sequence

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyroaring import BitMap

from iceberg_sink._iceberg.position_deletes import sorted_positions
from iceberg_sink._iceberg.puffin import Blob, read_blob, write_puffin
from iceberg_sink.errors import CorruptFileError

BLOB_TYPE = "deletion-vector-v1"
ROW_POSITION_FIELD_ID = 2147483645
"""The reserved field id of ``_pos`` (Iceberg Java's ``MetadataColumns.ROW_POSITION``)."""
MAGIC = bytes((0xD1, 0xD3, 0x39, 0x64))
MAX_POSITION = ((2**31 - 2) << 32) | 0x80000000
"""The largest position Iceberg Java's ``RoaringPositionBitmap`` accepts (``MAX_POSITION``)."""
REFERENCED_DATA_FILE = "referenced-data-file"
CARDINALITY = "cardinality"
CREATED_BY = "iceberg-sink"

_MAX_KEY = 2**31 - 2  # Java refuses larger keys (its bucket array is indexed by a signed int)
_SERIAL_COOKIE_NO_RUNCONTAINER = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_CONTAINER_MAX = 4096
_BITSET_CONTAINER_BYTES = 8192


@attrs.frozen
class DeletionVector:
    """One written DV: the blob of ``referenced_data_file``'s deleted positions in a Puffin file.

    Attributes:
        path: the Puffin file (the delete file's ``file_path``; several DVs may share it).
        file_size_in_bytes: the Puffin file's size.
        referenced_data_file: the data file whose rows the DV deletes (its path as the table has it).
        content_offset: where the blob starts in the Puffin file.
        content_size_in_bytes: the blob's length.
        cardinality: how many positions it deletes (the delete file's ``record_count``).
    """

    path: str
    file_size_in_bytes: int
    referenced_data_file: str
    content_offset: int
    content_size_in_bytes: int
    cardinality: int


@attrs.frozen(eq=False)
class Vector:
    """A data file's deleted positions as a DV holds them: buckets of the positions' high 32 bits
    (ascending, none empty), each a 32-bit Roaring bitmap of their low halves.

    Adding positions to a DV read back (:meth:`union`) touches only the new positions, where going
    through a sorted array would decode, merge and re-encode every position the file has deleted:
    a checkpoint of random updates replaces the DV of most data files of the table.
    """

    buckets: tuple[tuple[int, BitMap], ...]

    @classmethod
    def of(cls, positions: Iterable[pa.Array | np.ndarray]) -> Vector:
        """The vector of ``positions`` (deduplicated; any order).

        Raises:
            ValueError: a position is negative or above :data:`MAX_POSITION`.
        """
        return cls(tuple(_buckets(sorted_positions(positions))))

    def __len__(self) -> int:
        return sum(len(bitmap) for _, bitmap in self.buckets)

    def positions(self) -> np.ndarray:
        """The positions, sorted int64."""
        chunks = [np.frombuffer(b.to_array(), dtype=np.uint32).astype(np.int64) + (k << 32) for k, b in self.buckets]
        return np.concatenate(chunks) if chunks else np.empty(0, np.int64)

    def union(self, positions: Iterable[pa.Array | np.ndarray]) -> Vector:
        """This vector with ``positions`` (any order, repeats allowed) deleted too; this one is unchanged.

        Raises:
            ValueError: a position is negative or above :data:`MAX_POSITION`.
        """
        merged = {key: bitmap for key, bitmap in self.buckets}
        for key, added in _buckets(sorted_positions(positions)):
            merged[key] = merged[key] | added if key in merged else added
        return Vector(tuple(sorted(merged.items(), key=lambda item: item[0])))


def _buckets(pos: np.ndarray) -> list[tuple[int, BitMap]]:
    """The buckets of sorted, distinct int64 positions."""
    if len(pos) and (pos[0] < 0 or pos[-1] > MAX_POSITION):
        bad = int(pos[0]) if pos[0] < 0 else int(pos[-1])
        raise ValueError(f"a deletion vector holds positions from 0 to {MAX_POSITION}, got {bad}")
    keys = pos >> 32
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1  # where a bucket ends and the next begins
    starts = np.concatenate(([0], cuts)) if len(pos) else cuts
    ends = np.append(cuts, len(pos)) if len(pos) else cuts
    return [
        (int(keys[start]), BitMap(array.array("I", (pos[start:end] & 0xFFFFFFFF).astype(np.uint32).tobytes())))
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True)
    ]


def serialize(positions: Iterable[pa.Array | np.ndarray] | Vector) -> bytes:
    """The ``deletion-vector-v1`` blob of ``positions`` (deduplicated; any order).

    Raises:
        ValueError: a position is negative or above :data:`MAX_POSITION`.
    """
    return _encode(positions if isinstance(positions, Vector) else Vector.of(positions))


def _encode(vector: Vector) -> bytes:
    """The blob of ``vector``."""
    parts = [len(vector.buckets).to_bytes(8, "little")]
    for key, bitmap in vector.buckets:
        # As Java does before writing: runs of deleted rows cost 4 bytes each. On a copy: the
        # vector's bitmaps may be another vector's too (union keeps the buckets it does not change).
        optimized = bitmap.copy()
        optimized.run_optimize()
        parts.append(key.to_bytes(4, "little"))
        parts.append(optimized.serialize())
    body = MAGIC + b"".join(parts)
    if len(body) > 2**31 - 1:
        raise ValueError(f"a deletion vector of {len(vector)} positions takes {len(body)} bytes, over the 2 GiB limit")
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def deserialize(blob: bytes, where: str = "deletion vector") -> np.ndarray:
    """The positions (sorted int64) of a ``deletion-vector-v1`` blob; ``where`` names it in errors.

    Raises:
        CorruptFileError: the length, magic or CRC-32 do not match, or the vector is malformed.
    """
    return deserialize_vector(blob, where).positions()


def deserialize_vector(blob: bytes, where: str = "deletion vector") -> Vector:
    """The :class:`Vector` of a ``deletion-vector-v1`` blob; ``where`` names it in errors.

    Raises:
        CorruptFileError: the length, magic or CRC-32 do not match, or the vector is malformed.
    """
    if len(blob) < 4 + len(MAGIC) + 8 + 4:
        raise CorruptFileError(f"{where}: {len(blob)} bytes is too short for a deletion vector blob")
    length = int.from_bytes(blob[:4], "big")
    if length != len(blob) - 8:
        raise CorruptFileError(
            f"{where}: the blob says it holds {length} bytes of vector and magic, it holds {len(blob) - 8}"
        )
    body = blob[4 : 4 + length]
    if body[: len(MAGIC)] != MAGIC:
        raise CorruptFileError(f"{where}: expected the deletion vector magic {MAGIC.hex()}, got {body[:4].hex()}")
    crc = int.from_bytes(blob[4 + length :], "big")
    if zlib.crc32(body) != crc:
        raise CorruptFileError(
            f"{where}: CRC-32 mismatch (stored {crc:08x}, computed {zlib.crc32(body):08x}): the blob is corrupted"
        )
    return _read_vector(memoryview(body)[len(MAGIC) :], where)


def _read_vector(vector: memoryview, where: str) -> Vector:
    count = int.from_bytes(vector[:8], "little")
    offset = 8
    last_key = -1
    buckets: list[tuple[int, BitMap]] = []
    for _ in range(count):
        if offset + 4 > len(vector):
            raise CorruptFileError(f"{where}: the vector ends before its {count} buckets")
        key = int.from_bytes(vector[offset : offset + 4], "little")
        offset += 4
        if key <= last_key or key > _MAX_KEY:
            raise CorruptFileError(f"{where}: bucket key {key} after {last_key} (keys ascend, at most {_MAX_KEY})")
        last_key = key
        size = _bitmap_size(vector, offset, where)
        try:
            bitmap = BitMap.deserialize(bytes(vector[offset : offset + size]))
        except ValueError as exc:
            raise CorruptFileError(f"{where}: bucket {key} is not a valid Roaring bitmap: {exc}") from exc
        offset += size
        if len(bitmap):  # Java writes an empty bucket for each gap below its last key
            buckets.append((key, bitmap))
    if offset != len(vector):
        raise CorruptFileError(f"{where}: {len(vector) - offset} bytes follow the vector's {count} buckets")
    return Vector(tuple(buckets))


def _bitmap_size(buf: memoryview, start: int, where: str) -> int:
    """The length of the portable 32-bit Roaring bitmap at ``start``, read from its headers."""

    def u16(at: int) -> int:
        return int.from_bytes(buf[at : at + 2], "little")

    def need(end: int) -> None:
        if end > len(buf):
            raise CorruptFileError(f"{where}: a Roaring bitmap at byte {start} runs past the vector's end")

    need(start + 4)
    cookie = int.from_bytes(buf[start : start + 4], "little")
    pos = start + 4
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        containers = (cookie >> 16) + 1
        need(pos + (containers + 7) // 8)
        run_flags = bytes(buf[pos : pos + (containers + 7) // 8])
        pos += len(run_flags)
        has_offsets = containers >= _NO_OFFSET_THRESHOLD
    elif cookie == _SERIAL_COOKIE_NO_RUNCONTAINER:
        need(pos + 4)
        containers = int.from_bytes(buf[pos : pos + 4], "little")
        pos += 4
        run_flags = b""
        has_offsets = True
    else:
        raise CorruptFileError(f"{where}: no Roaring bitmap cookie at byte {start} (got {cookie})")
    need(pos + 4 * containers)
    cardinalities = np.frombuffer(buf[pos : pos + 4 * containers], dtype="<u2")[1::2].astype(np.int64) + 1
    pos += 4 * containers + (4 * containers if has_offsets else 0)
    for i, cardinality in enumerate(cardinalities.tolist()):
        if run_flags and run_flags[i // 8] >> (i % 8) & 1:
            need(pos + 2)
            pos += 2 + 4 * u16(pos)
        elif cardinality > _ARRAY_CONTAINER_MAX:
            pos += _BITSET_CONTAINER_BYTES
        else:
            pos += 2 * cardinality
    need(pos)
    return pos - start


def spaced_gaps(lengths: Sequence[int]) -> list[int]:
    """Zero bytes to write after each of the blobs of ``lengths`` (in file order) so that no reader
    that widens a read up to the next range it has cached can cover another blob with it: one
    byte more than the blob after every blob but the last.

    DuckDB's iceberg extension 1.5.x reads a DV through its external file cache, which widens a read
    of n bytes up to the next range it has cached when that one starts at most n bytes (and at most
    1 MiB) after the read's end (``ShouldExpandToFillGap``); a later read that falls inside a
    widened range is served from it, and the extension takes the start of that range as the blob.
    Packed blobs side by side therefore let a DV's read cover the next DV, which is then read as
    the first (docs/format-v3.md). With more than n zero bytes after a blob of n bytes, the next
    cached range after it is always further than its read may widen; the last blob's read may widen
    to the footer, which holds no blob."""
    return [n + 1 for n in lengths[:-1]] + [0] * min(1, len(lengths))


def write_deletion_vectors(
    io: FileIO,
    path: str,
    positions_by_file: Mapping[str, Iterable[pa.Array | np.ndarray] | Vector],
    spaced: bool = False,
) -> tuple[DeletionVector, ...]:
    """Write the Puffin file ``path`` with one DV per data file of ``positions_by_file`` (its
    positions, or its :class:`Vector`).

    The keys are data file paths exactly as the table's manifests hold them; the DVs come back in
    the order of the blobs in the file (data file paths sorted). A DV replacing an earlier one of
    the same data file must already carry that one's positions (read them with
    :func:`read_deletion_vector`, or :func:`read_vector` and :meth:`Vector.union`). ``spaced``:
    blobs apart by :func:`spaced_gaps`, so that every reader checked reads a file of many DVs right.

    Raises:
        ValueError: no data file, a data file without a position, or a position out of range.
    """
    if not positions_by_file:
        raise ValueError(f"no deletion vector to write to {path}")
    blobs = []
    for data_file in sorted(positions_by_file):
        given = positions_by_file[data_file]
        vector = given if isinstance(given, Vector) else Vector.of(given)
        cardinality = len(vector)
        if not cardinality:
            raise ValueError(f"no position to delete in {data_file}")
        blobs.append(
            Blob(
                type=BLOB_TYPE,
                fields=(ROW_POSITION_FIELD_ID,),
                data=_encode(vector),
                properties={REFERENCED_DATA_FILE: data_file, CARDINALITY: str(cardinality)},
            )
        )
    gaps = spaced_gaps([len(b.data) for b in blobs]) if spaced else ()
    written = write_puffin(io, path, blobs, created_by=CREATED_BY, gaps=gaps)
    return tuple(
        DeletionVector(
            path=written.path,
            file_size_in_bytes=written.file_size_in_bytes,
            referenced_data_file=str(blob.property(REFERENCED_DATA_FILE)),
            content_offset=blob.offset,
            content_size_in_bytes=blob.length,
            cardinality=int(str(blob.property(CARDINALITY))),
        )
        for blob in written.blobs
    )


def read_deletion_vector(
    io: FileIO, path: str, content_offset: int, content_size_in_bytes: int, cardinality: int | None = None
) -> np.ndarray:
    """The positions (sorted int64) of the DV at ``content_offset`` in the Puffin file ``path``.

    Reads only the blob, as Iceberg Java does (the manifest entry locates it; the footer is not
    needed). With ``cardinality`` (the delete file's ``record_count``) the count is checked too.

    Raises:
        CorruptFileError: the blob is corrupted or holds another number of positions.
    """
    return read_vector(io, path, content_offset, content_size_in_bytes, cardinality).positions()


def read_vector(
    io: FileIO, path: str, content_offset: int, content_size_in_bytes: int, cardinality: int | None = None
) -> Vector:
    """The :class:`Vector` of the DV at ``content_offset`` in the Puffin file ``path``, read and checked
    as :func:`read_deletion_vector` does.

    Raises:
        CorruptFileError: the blob is corrupted or holds another number of positions.
    """
    where = f"deletion vector at {path}@{content_offset}"
    vector = deserialize_vector(read_blob(io, path, content_offset, content_size_in_bytes), where)
    if cardinality is not None and len(vector) != cardinality:
        raise CorruptFileError(f"{where}: holds {len(vector)} positions, its manifest entry says {cardinality}")
    return vector
