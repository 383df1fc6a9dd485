"""Reading Avro manifests and manifest lists without re-deriving their reader for every file.

PyIceberg's ``AvroFile.__enter__`` converts the file's Avro schema (its header's ``avro.schema``
JSON) to an Iceberg schema and resolves a reader tree against the read schema, for every file it
opens. Every manifest of one table and partition spec carries the same header schema, so that work
is the same each time, and it was most of the cost of opening one: a profile of a CDC stream's
driver (100 checkpoints, 1M rows) spent 22% of its time there, more than in the catalog commit.

:class:`CachedAvroFile` is ``AvroFile`` with that step looked up by (header schema text, read schema,
read types, read enums), at most :data:`MAX_READERS` entries, least recently used first out. The
reader trees hold no state of a read (each ``read`` takes the decoder and builds a new struct), so
one tree serves every file and thread. :func:`fetch_entries` is PyIceberg 0.12's
``ManifestFile.fetch_manifest_entry`` on it; every manifest whose entries this package reads goes
through it or through :class:`CachedAvroFile`, and so does every manifest list a commit reads
(``lineage.read_manifests``; PyIceberg's ``Snapshot.manifests`` reads a list with a new reader on
every call). Leans on ``AvroFile``'s internals (``_read_header``, its attributes,
``_inherit_from_manifest``): PyIceberg is pinned, and tests/unit/test_avro_read.py compares the
entries with PyIceberg's own reading.

The trees read a ``double`` exactly. PyIceberg 0.12's Cython decoder (the one ``new_decoder`` gives
when its extension is built, as in the wheels) returns ``read_double`` as a C ``float``: every double
it reads is rounded to single precision (apache/iceberg-python#3808, fixed after 0.12). In a
manifest that is an identity partition value of a ``double`` column: read back and written again
(a committed checkpoint, a compaction carrying entries over) it would change 0.1 into
0.10000000149011612, and a reader filtering on 0.1 would skip the file. :class:`ExactDoubleReader`
unpacks the eight bytes itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, TypeVar

from pyiceberg.avro import STRUCT_DOUBLE
from pyiceberg.avro.decoder import BinaryDecoder, new_decoder
from pyiceberg.avro.file import META_SCHEMA, AvroFile, AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import ReadSchemaResolver, SchemaPartnerAccessor, construct_reader
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    _inherit_from_manifest,
)
from pyiceberg.schema import Schema, visit_with_partner
from pyiceberg.typedef import EMPTY_DICT, StructProtocol
from pyiceberg.types import DoubleType, IcebergType

# Distinct (header schema, read schema, types, enums) combinations kept: one per partition spec,
# content and format version a table has, times the tables a driver commits to.
MAX_READERS = 256
_SCHEMA_KEY = "avro.schema"

D = TypeVar("D", bound=StructProtocol)

_readers: OrderedDict[tuple[Any, ...], tuple[Any, Any, Any, Any]] = OrderedDict()
_lock = threading.Lock()


class ExactDoubleReader(Reader):
    """A ``double`` as the eight little-endian bytes say (see the module doc)."""

    def read(self, decoder: BinaryDecoder) -> float:
        value: float = STRUCT_DOUBLE.unpack(decoder.read(8))[0]
        return value

    def skip(self, decoder: BinaryDecoder) -> None:
        decoder.skip(8)


class _Resolver(ReadSchemaResolver):
    """PyIceberg's read-schema resolution, with :class:`ExactDoubleReader` for doubles."""

    def visit_double(self, double_type: DoubleType, partner: IcebergType | None) -> Reader:
        return ExactDoubleReader()  # type: ignore[no-untyped-call]  # PyIceberg's Singleton


def resolve_reader(
    file_schema: Schema | IcebergType,
    read_schema: Schema | IcebergType,
    read_types: Any = EMPTY_DICT,
    read_enums: Any = EMPTY_DICT,
) -> Reader:
    """PyIceberg's ``resolve_reader``, reading doubles exactly."""
    resolver = _Resolver(read_types, read_enums)
    reader: Reader = visit_with_partner(file_schema, read_schema, resolver, SchemaPartnerAccessor())  # type: ignore[arg-type,misc]
    return reader


_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})


class CachedAvroFile(AvroFile[D]):
    """``AvroFile`` whose schema conversion and reader resolution are shared between files."""

    def __enter__(self) -> CachedAvroFile[D]:
        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = _HEADER_READER.read(self.decoder)  # AvroFile._read_header builds this reader per file
        text = self.header.meta.get(_SCHEMA_KEY)
        key = (
            text,
            id(self.read_schema),
            tuple(sorted(self.read_types.items())),
            tuple(sorted(self.read_enums.items())),
        )
        with _lock:
            cached = _readers.get(key) if text is not None else None
            if cached is not None and cached[0] is self.read_schema:
                _readers.move_to_end(key)
            else:
                cached = None
        if cached is None:
            schema = self.header.get_schema()  # raises for a file without a schema, as AvroFile does
            read_schema = self.read_schema or schema
            reader = resolve_reader(schema, read_schema, self.read_types, self.read_enums)
            # The read schema itself is kept so that its id() cannot be reused by another object.
            cached = (self.read_schema, schema, read_schema, reader)
            with _lock:
                _readers[key] = cached
                while len(_readers) > MAX_READERS:
                    _readers.popitem(last=False)
        _, self.schema, self.read_schema, self.reader = cached
        return self


def fetch_entries(io: FileIO, manifest: ManifestFile, discard_deleted: bool = True) -> list[ManifestEntry]:
    """``manifest``'s entries with inherited snapshot ids and sequence numbers: PyIceberg's
    ``ManifestFile.fetch_manifest_entry`` with a shared reader."""
    with CachedAvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        return [
            _inherit_from_manifest(entry, manifest)
            for entry in reader
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED
        ]


def cached_readers() -> int:
    """How many reader trees are kept (for tests)."""
    with _lock:
        return len(_readers)
