"""Puffin files: blobs with a JSON footer that describes them (Iceberg's puffin-spec.md).

    Magic Blob1 ... BlobN Footer
    Footer = Magic FooterPayload FooterPayloadSize(int32 LE) Flags(4 bytes) Magic

PyIceberg 0.12 reads Puffin files (``pyiceberg.table.puffin``) but cannot write them; format v3
keeps deletion vectors in them (deletion_vectors.py). Only what deletion vectors need is written
here: uncompressed blobs and an uncompressed footer. Reading accepts what any writer may produce
except compression (a ``deletion-vector-v1`` blob is never compressed; a compressed footer is
refused with a clear error).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from pyiceberg.io import FileIO

from iceberg_sink.errors import CorruptFileError

MAGIC = b"PFA1"
_FOOTER_TRAILER_SIZE = 12  # FooterPayloadSize + Flags + Magic
_FLAG_FOOTER_COMPRESSED = 0x01


def _str_map(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in dict(value).items()))


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen
class Blob:
    """A blob to write: its type, the field ids it was computed for, its bytes and properties."""

    type: str
    fields: tuple[int, ...] = attrs.field(converter=_int_tuple)
    data: bytes
    properties: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_str_map)
    snapshot_id: int = -1
    sequence_number: int = -1


@attrs.frozen
class BlobMetadata:
    """One entry of a Puffin footer: where a blob lies in the file and what it is."""

    type: str
    fields: tuple[int, ...] = attrs.field(converter=_int_tuple)
    snapshot_id: int
    sequence_number: int
    offset: int
    length: int
    compression_codec: str | None = None
    properties: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_str_map)

    def property(self, key: str) -> str | None:
        """The blob property ``key``, or None."""
        return dict(self.properties).get(key)

    def to_json(self) -> dict[str, Any]:
        """The footer's JSON form (puffin-spec.md ``BlobMetadata``); no codec key when uncompressed."""
        out: dict[str, Any] = {
            "type": self.type,
            "fields": list(self.fields),
            "snapshot-id": self.snapshot_id,
            "sequence-number": self.sequence_number,
            "offset": self.offset,
            "length": self.length,
        }
        if self.compression_codec is not None:
            out["compression-codec"] = self.compression_codec
        if self.properties:
            out["properties"] = dict(self.properties)
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> BlobMetadata:
        """Parse one footer entry; raises KeyError/TypeError/ValueError when a required key is bad."""
        return cls(
            type=str(value["type"]),
            fields=tuple(int(f) for f in value["fields"]),
            snapshot_id=int(value["snapshot-id"]),
            sequence_number=int(value["sequence-number"]),
            offset=int(value["offset"]),
            length=int(value["length"]),
            compression_codec=value.get("compression-codec"),
            properties={str(k): str(v) for k, v in dict(value.get("properties") or {}).items()},
        )


@attrs.frozen
class PuffinFile:
    """A written Puffin file: its location, its size and its blobs, in file order."""

    path: str
    file_size_in_bytes: int
    blobs: tuple[BlobMetadata, ...]


def write_puffin(io: FileIO, path: str, blobs: Sequence[Blob], created_by: str, gaps: Sequence[int] = ()) -> PuffinFile:
    """Write the Puffin file ``path`` (it must not exist) holding ``blobs`` in order, uncompressed.

    ``created_by`` goes to the footer's ``created-by`` property, as the spec recommends. ``gaps``
    (one per blob, or none): zero bytes written after each blob, which no footer entry covers;
    readers find every blob by its offset and length, as the spec's footer gives them.

    Raises:
        ValueError: ``gaps`` given with another length than ``blobs``, or holding a negative number.
    """
    if gaps and (len(gaps) != len(blobs) or min(gaps) < 0):
        raise ValueError(f"Puffin gaps: expected {len(blobs)} counts of zero bytes >= 0, received {list(gaps)}")
    after = list(gaps) or [0] * len(blobs)
    metadata: list[BlobMetadata] = []
    offset = len(MAGIC)
    for blob, gap in zip(blobs, after, strict=True):
        metadata.append(
            BlobMetadata(
                type=blob.type,
                fields=blob.fields,
                snapshot_id=blob.snapshot_id,
                sequence_number=blob.sequence_number,
                offset=offset,
                length=len(blob.data),
                properties=blob.properties,
            )
        )
        offset += len(blob.data) + gap
    payload = json.dumps(
        {"blobs": [m.to_json() for m in metadata], "properties": {"created-by": created_by}},
        separators=(",", ":"),
    ).encode("utf-8")
    footer = MAGIC + payload + len(payload).to_bytes(4, "little", signed=True) + bytes(4) + MAGIC
    stream = io.new_output(path).create(overwrite=False)
    try:
        stream.write(MAGIC)
        for blob, gap in zip(blobs, after, strict=True):
            stream.write(blob.data)
            if gap:
                stream.write(bytes(gap))
        stream.write(footer)
    finally:
        stream.close()
    return PuffinFile(path=path, file_size_in_bytes=offset + len(footer), blobs=tuple(metadata))


def read_footer(io: FileIO, path: str) -> tuple[BlobMetadata, ...]:
    """The blobs described by the footer of the Puffin file ``path``.

    Raises:
        CorruptFileError: the file is not a Puffin file (magic), its footer is compressed (not
            supported) or its footer JSON is malformed.
    """
    input_file = io.new_input(path)
    size = len(input_file)
    with input_file.open(seekable=True) as stream:
        if size < len(MAGIC) + len(MAGIC) + _FOOTER_TRAILER_SIZE:
            raise CorruptFileError(f"{path}: {size} bytes is too short for a Puffin file")
        stream.seek(0)
        head = stream.read(len(MAGIC))
        stream.seek(size - _FOOTER_TRAILER_SIZE)
        trailer = stream.read(_FOOTER_TRAILER_SIZE)
        payload_size = int.from_bytes(trailer[:4], "little", signed=True)
        flags = trailer[4:8]
        if head != MAGIC or trailer[8:] != MAGIC:
            raise CorruptFileError(
                f"{path}: not a Puffin file (expected magic {MAGIC!r}, got {head!r}/{trailer[8:]!r})"
            )
        footer_start = size - _FOOTER_TRAILER_SIZE - payload_size - len(MAGIC)
        if payload_size < 0 or footer_start < len(MAGIC):
            raise CorruptFileError(f"{path}: footer payload size {payload_size} does not fit a {size}-byte file")
        if flags[0] & _FLAG_FOOTER_COMPRESSED:
            raise CorruptFileError(f"{path}: the Puffin footer is compressed (LZ4), which is not supported")
        stream.seek(footer_start)
        footer = stream.read(len(MAGIC) + payload_size)
    if footer[: len(MAGIC)] != MAGIC:
        raise CorruptFileError(f"{path}: no magic {MAGIC!r} at the start of the Puffin footer")
    try:
        parsed = json.loads(footer[len(MAGIC) :].decode("utf-8"))
        return tuple(BlobMetadata.from_json(b) for b in parsed["blobs"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptFileError(f"{path}: malformed Puffin footer: {exc}") from exc


def read_blob(io: FileIO, path: str, offset: int, length: int) -> bytes:
    """The ``length`` bytes at ``offset`` of the file ``path`` (one blob, read without the footer).

    Raises:
        CorruptFileError: the file ends before ``offset + length``.
    """
    with io.new_input(path).open(seekable=True) as stream:
        stream.seek(offset)
        data = stream.read(length)
    if len(data) != length:
        raise CorruptFileError(
            f"{path}: expected a {length}-byte blob at offset {offset}, the file holds {len(data)} bytes there"
        )
    return data
