"""Key index entries kept in table storage, so that a restarted driver finds them.

    KeyIndex reads a data file's keys ──▶ (background thread) <metadata>/iceberg-sink-key-index/<hash>.keys
    restart: KeyIndex misses a file ──▶ load its .keys file, verify ──▶ use it, or read the data file

A data file never changes once written, so the keys read from it stay right while it is live: an
entry written once serves every later driver of any job writing the table (the v3 committer and the
v2 conversion alike). One file per data file, named by a hash of the data file's path, in the folder
``iceberg-sink-key-index`` of the table's metadata location, written and read through the table's
own FileIO (so on S3 it is in the bucket). Its content::

    MAGIC | header length (u32 LE) | header (JSON) | payload | CRC-32 of header and payload (u32 LE)

The header names what the entry was built from: the data file's path, size and record count, the
schema id and key field ids it was projected with, the form (``sorted``: int64 keys then, when the
file is not in key order, the uint32 row positions; ``arrow``: the key columns as an Arrow IPC
stream) and the payload's part lengths. A file is used only when the magic, the lengths and the
checksum hold (else it is *corrupt*) and the header names exactly the live data file and key being
looked up (else it is a *mismatch*); otherwise the data file is read again and the entry rewritten.

Writes never slow or fail a commit: they run on one background thread per index, in order, for
entries just read from a data file and admitted to memory; a failure is logged and the entry is
simply rebuilt after the next restart. An entry whose data file leaves the branch head is deleted
by the index that held it; snapshot expiry deletes the entries of the data files it deletes, and
orphan removal keeps the entries of referenced data files and deletes the rest
(``topology/maintenance.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from iceberg_sink.errors import CorruptFileError
from iceberg_sink.keyindex.keys import ArrowKeys, IndexEntry, SortedKeys
from iceberg_sink.vocab.files import DataFileMeta

logger = logging.getLogger("iceberg_sink")

FOLDER = "iceberg-sink-key-index"
SUFFIX = ".keys"
MAGIC = b"ICEBERG-SINK-KEYS\n"
VERSION = 1
_U32 = struct.Struct("<I")


def index_location(table: Table) -> str:
    """The folder a table's persisted key index lives in: ``<metadata location>/iceberg-sink-key-index``."""
    return table.location_provider().new_metadata_location("x").rsplit("/", 1)[0] + "/" + FOLDER


def entry_name(data_path: str) -> str:
    """The file name of the entry of the data file ``data_path``."""
    return hashlib.sha256(data_path.encode("utf-8")).hexdigest()[:40] + SUFFIX


def is_index_file(location: str) -> bool:
    """Whether ``location`` is a persisted key index entry."""
    folder, _, name = location.rpartition("/")
    return folder.rsplit("/", 1)[-1] == FOLDER and name.endswith(SUFFIX)


@attrs.frozen
class EntryHeader:
    """What a persisted entry was built from (module docstring)."""

    data_path: str
    file_size: int
    record_count: int
    schema_id: int
    key_ids: tuple[int, ...]

    def matches(self, data: DataFileMeta, schema_id: int, key_ids: tuple[int, ...]) -> bool:
        return (self.data_path, self.file_size, self.record_count, self.schema_id, self.key_ids) == (
            data.path,
            data.file_size_in_bytes,
            data.record_count,
            schema_id,
            key_ids,
        )


def _payload(keys: SortedKeys | ArrowKeys) -> tuple[dict[str, Any], list[memoryview]]:
    if isinstance(keys, SortedKeys):
        parts = [np.ascontiguousarray(keys.keys, dtype="<i8").data.cast("B")]
        if keys.order is not None:
            parts.append(np.ascontiguousarray(keys.order, dtype="<u4").data.cast("B"))
        return {"form": "sorted", "parts": [len(p) for p in parts]}, parts
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, keys.rows.schema) as writer:
        writer.write_table(keys.rows)
    part = memoryview(sink.getvalue()).cast("B")
    return {"form": "arrow", "parts": [len(part)]}, [part]


def encode_parts(header: EntryHeader, entry: IndexEntry) -> list[bytes | memoryview]:
    """The bytes of a persisted entry, in order (the arrays are not copied)."""
    form, parts = _payload(entry.keys)
    head = json.dumps(
        {"version": VERSION, **attrs.asdict(header), "key_ids": list(header.key_ids), **form}, sort_keys=True
    ).encode("utf-8")
    crc = zlib.crc32(head)
    for p in parts:
        crc = zlib.crc32(p, crc)
    return [MAGIC, _U32.pack(len(head)), head, *parts, _U32.pack(crc)]


def encode(header: EntryHeader, entry: IndexEntry) -> bytes:
    """A persisted entry as one byte string."""
    return b"".join(bytes(p) for p in encode_parts(header, entry))


def decode(data: bytes, location: str = "<bytes>") -> tuple[EntryHeader, IndexEntry]:
    """The header and entry of a persisted entry.

    Raises:
        CorruptFileError: the bytes are not a whole, intact entry of a known version.
    """

    def corrupt(why: str) -> CorruptFileError:
        return CorruptFileError(f"key index entry {location}: {why}; the data file's keys are read again")

    fixed = len(MAGIC) + 2 * _U32.size
    if len(data) < fixed or not data.startswith(MAGIC):
        raise corrupt(f"expected a file starting with {MAGIC!r}, received {data[: len(MAGIC)]!r}")
    (head_len,) = _U32.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _U32.size
    if start + head_len + _U32.size > len(data):
        raise corrupt(f"header of {head_len} bytes runs past the end of the {len(data)}-byte file")
    (crc,) = _U32.unpack_from(data, len(data) - _U32.size)
    body = memoryview(data)[start : len(data) - _U32.size]
    if zlib.crc32(body) != crc:
        raise corrupt("checksum mismatch")
    try:
        head = json.loads(bytes(body[:head_len]))
        header = EntryHeader(
            str(head["data_path"]),
            int(head["file_size"]),
            int(head["record_count"]),
            int(head["schema_id"]),
            tuple(int(i) for i in head["key_ids"]),
        )
        version, form, sizes = head["version"], head["form"], [int(n) for n in head["parts"]]
    except (ValueError, KeyError, TypeError) as e:
        raise corrupt(f"unreadable header ({type(e).__name__}: {e})") from e
    if version != VERSION:
        raise corrupt(f"expected format version {VERSION}, received {version!r}")
    if head_len + sum(sizes) != len(body):
        raise corrupt(f"expected a payload of {sum(sizes)} bytes, received {len(body) - head_len}")
    offset, parts = head_len, []
    for size in sizes:
        parts.append(body[offset : offset + size])
        offset += size
    n = header.record_count
    keys: SortedKeys | ArrowKeys
    if form == "sorted" and len(parts) in (1, 2) and sizes[0] == 8 * n and (len(parts) == 1 or sizes[1] == 4 * n):
        order = np.frombuffer(parts[1], dtype="<u4") if len(parts) == 2 else None
        keys = SortedKeys(np.frombuffer(parts[0], dtype="<i8"), order)
    elif form == "arrow" and len(parts) == 1:
        rows = pa.ipc.open_stream(pa.py_buffer(parts[0])).read_all()
        if rows.num_rows != n:
            raise corrupt(f"expected {n} rows, received {rows.num_rows}")
        keys = ArrowKeys(rows)
    else:
        raise corrupt(f"form {form!r} with parts {sizes} does not hold {n} rows")
    return header, IndexEntry(header.file_size, header.record_count, keys)


@attrs.define
class PersistCounters:
    """What one index did with its persisted entries since it started."""

    loaded: int = 0
    missing: int = 0
    corrupt: int = 0
    mismatched: int = 0
    written: int = 0
    write_failures: int = 0
    deleted: int = 0


class PersistedKeys:
    """The entries of one table's key index in its storage (module docstring).

    Loads are synchronous (the caller needs the keys now); writes and deletes run in order on one
    background thread and only log their failures.
    """

    def __init__(self, io: FileIO, location: str) -> None:
        self.io = io
        self.location = location.rstrip("/")
        self.counters = PersistCounters()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="iceberg-sink-key-index")
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()

    def path_of(self, data_path: str) -> str:
        """Where the entry of ``data_path`` is kept."""
        return f"{self.location}/{entry_name(data_path)}"

    def load(self, data: DataFileMeta, schema_id: int, key_ids: tuple[int, ...]) -> IndexEntry | None:
        """The persisted entry of ``data`` for the key ``key_ids``, or None when there is none that
        is intact and names this very file and key (the caller reads the data file instead)."""
        location = self.path_of(data.path)
        try:
            with self.io.new_input(location).open(seekable=False) as stream:
                raw = stream.read()
        except FileNotFoundError:
            self.counters.missing += 1
            return None
        except Exception as e:  # an unreachable store costs a rebuild, never a commit
            self.counters.missing += 1
            logger.warning(
                "cannot read key index entry %s (%s: %s); reading the data file", location, type(e).__name__, e
            )
            return None
        try:
            header, entry = decode(raw, location)
        except Exception as e:  # CorruptFileError, or an Arrow stream that does not parse
            self.counters.corrupt += 1
            logger.warning("%s", e if isinstance(e, CorruptFileError) else f"key index entry {location}: {e}")
            return None
        if not header.matches(data, schema_id, key_ids):
            self.counters.mismatched += 1
            return None
        self.counters.loaded += 1
        return entry

    def save(self, data: DataFileMeta, schema_id: int, key_ids: tuple[int, ...], entry: IndexEntry) -> None:
        """Write the entry of ``data`` in the background (replacing any older one)."""
        header = EntryHeader(data.path, data.file_size_in_bytes, data.record_count, schema_id, key_ids)
        self._submit(lambda: self._write(header, entry))

    def forget(self, data_path: str) -> None:
        """Delete the entry of ``data_path`` (no longer live) in the background."""
        self._submit(lambda: self._delete(data_path))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the writes and deletes submitted so far are done (they never raise)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result(timeout)

    def _submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(work))

    def _write(self, header: EntryHeader, entry: IndexEntry) -> None:
        location = self.path_of(header.data_path)
        try:
            with self.io.new_output(location).create(overwrite=True) as stream:
                for part in encode_parts(header, entry):
                    stream.write(cast(bytes, part))  # Arrow streams take any buffer: no copy of the keys
            self.counters.written += 1
        except Exception as e:
            self.counters.write_failures += 1
            logger.warning(
                "cannot write key index entry %s (%s: %s); it is rebuilt from the data file after a restart",
                location,
                type(e).__name__,
                e,
            )

    def _delete(self, data_path: str) -> None:
        location = self.path_of(data_path)
        try:
            self.io.delete(location)
            self.counters.deleted += 1
        except FileNotFoundError:
            pass
        except Exception as e:
            logger.warning("cannot delete key index entry %s (%s: %s)", location, type(e).__name__, e)
