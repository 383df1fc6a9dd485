"""Avro files written with the reused writer and header schema (``_iceberg/avro_write.py``) are the
bytes PyIceberg's own ``AvroOutputFile`` writes (same sync marker), for manifests of different
partition specs and for manifest lists of each format version, written interleaved; one writer is
kept per schema object, not per file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)

from iceberg_sink._iceberg import avro_write
from iceberg_sink._iceberg.files import to_data_file
from iceberg_sink._iceberg.manifests import _spec_data_file_type, as_v3_manifest
from tests.unit.test_manifest_schemas import SCHEMA, SPECS, data_file

SYNC = bytes(range(16))


def _write(cls: Any, path: Path, file_schema: Any, record_schema: Any, name: str, records: list[Any]) -> bytes:
    out = cls(
        output_file=PyArrowFileIO().new_output(str(path)),
        file_schema=file_schema,
        schema_name=name,
        record_schema=record_schema,
        metadata={"format-version": "2", "avro.codec": "deflate"},
    )
    out.sync_bytes = SYNC
    with out:
        out.write_block(records)
    return path.read_bytes()


def test_manifests_and_manifest_lists_are_pyiceberg_s_bytes(tmp_path: Path) -> None:
    avro_write._CACHE.clear()
    for round_ in range(2):
        for name, spec in SPECS.items():
            schema = _spec_data_file_type(spec.partition_type(SCHEMA), 2)
            entries = [
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=None,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=to_data_file(data_file(f"file://{tmp_path}/{name}-{i}.parquet", name), 2),
                )
                for i in range(3)
            ]
            args = (schema, schema, "manifest_entry", entries)
            ours = _write(avro_write.ReusingAvroOutputFile, tmp_path / f"ours-{name}-{round_}.avro", *args)
            theirs = _write(AvroOutputFile, tmp_path / f"theirs-{name}-{round_}.avro", *args)
            assert ours == theirs, name
        for version in (1, 2, 3):
            manifest = ManifestFile.from_args(
                manifest_path=f"file://{tmp_path}/m-{version}.avro",
                manifest_length=100,
                partition_spec_id=0,
                content=ManifestContent.DATA,
                sequence_number=4,
                min_sequence_number=4,
                added_snapshot_id=9,
                added_files_count=1,
                existing_files_count=0,
                deleted_files_count=0,
                added_rows_count=10,
                existing_rows_count=0,
                deleted_rows_count=0,
            )
            read = DEFAULT_READ_VERSION if version < 3 else 3
            record = manifest if version < 3 else as_v3_manifest(manifest, 1000)
            args = (MANIFEST_LIST_FILE_SCHEMAS[version], MANIFEST_LIST_FILE_SCHEMAS[read], "manifest_file", [record])
            ours = _write(avro_write.ReusingAvroOutputFile, tmp_path / f"ours-list-{version}-{round_}.avro", *args)
            theirs = _write(AvroOutputFile, tmp_path / f"theirs-list-{version}-{round_}.avro", *args)
            assert ours == theirs, version
    # One writer per (file schema, record schema, name) seen, not one per file written.
    assert len(avro_write._CACHE) == len(SPECS) + 3


def test_a_schema_object_built_anew_is_a_new_entry_never_another_schema_s_writer(tmp_path: Path) -> None:
    avro_write._CACHE.clear()
    spec = next(iter(SPECS.values()))
    first = _spec_data_file_type(spec.partition_type(SCHEMA), 2)
    writer, header = avro_write._writer_and_header(first, first, "manifest_entry")
    again = avro_write._writer_and_header(first, first, "manifest_entry")
    assert again[0] is writer and again[1] == header
    other = MANIFEST_LIST_FILE_SCHEMAS[2]
    assert avro_write._writer_and_header(other, other, "manifest_file")[0] is not writer
