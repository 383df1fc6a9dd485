"""Avro output files that build their writer and header schema once per schema, not once per file.

PyIceberg 0.12's ``AvroOutputFile`` resolves a writer tree for its record and file schemas and
converts the file schema to Avro JSON for the header on every file it opens. The sink writes two or
three small Avro files per table per checkpoint (a staged manifest, a manifest, the manifest list),
a routed checkpoint that for every table it touches, and the resolution and conversion (~0.3 ms per
file) cost more than writing a small file's entries. Both depend on the schemas only, and the
writers are stateless, so :class:`ReusingAvroOutputFile` keeps them per (file schema, record schema,
schema name) for the schema objects the sink keeps (``manifests._spec_data_file_type``,
PyIceberg's manifest-list schemas); a schema object built anew for each file is a new key, as
correct as before and no faster.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, TypeVar

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.file import (
    _SCHEMA_KEY,
    MAGIC,
    META_SCHEMA,
    SYNC_SIZE,
    AvroFileHeader,
    AvroOutputFile,
)
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.avro.writer import Writer
from pyiceberg.io import OutputFile
from pyiceberg.schema import Schema
from pyiceberg.typedef import EMPTY_DICT, StructProtocol
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

D = TypeVar("D", bound=StructProtocol)

# (id(file schema), id(record schema), schema name) -> (file schema, record schema, writer, header
# schema JSON). The entry holds the schemas, so their ids are not reused while it is kept.
_CACHE: dict[tuple[int, int, str], tuple[Schema, Schema | None, Writer, str]] = {}
_CACHE_MAX = 256
_lock = threading.Lock()
_META_WRITER = construct_writer(META_SCHEMA)


def _writer_and_header(file_schema: Schema, record_schema: Schema | None, schema_name: str) -> tuple[Writer, str]:
    key = (id(file_schema), id(record_schema), schema_name)
    with _lock:
        found = _CACHE.get(key)
    if found is not None and found[0] is file_schema and found[1] is record_schema:
        return found[2], found[3]
    writer = (
        construct_writer(file_schema=file_schema)
        if record_schema is None
        else resolve_writer(record_schema=record_schema, file_schema=file_schema)
    )
    header = json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name=schema_name))
    with _lock:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = (file_schema, record_schema, writer, header)
    return writer, header


class ReusingAvroOutputFile(AvroOutputFile[D]):
    """PyIceberg's Avro output file with its writer and header schema reused (module doc); the
    bytes written are the same."""

    def __init__(
        self,
        output_file: OutputFile,
        file_schema: Schema,
        schema_name: str,
        record_schema: Schema | None = None,
        metadata: dict[str, str] = EMPTY_DICT,
    ) -> None:
        self.output_file = output_file
        self.file_schema = file_schema
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer, self._header_schema = _writer_and_header(file_schema, record_schema, schema_name)
        self.metadata = metadata

    def _write_header(self) -> None:
        from pyiceberg.table import TableProperties

        codec_name = self.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
        codec_name = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec_name) or codec_name
        meta: dict[str, Any] = {**self.metadata, _SCHEMA_KEY: self._header_schema, AVRO_CODEC_KEY: codec_name}
        _META_WRITER.write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))
