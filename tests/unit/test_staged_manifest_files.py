"""A staged manifest's files as the object that wrote it keeps them (``StagedManifest.files``,
``_iceberg/manifests.py``) are the files a read of the manifest returns, for every partition value
type a table can have, full column statistics, and delete files; a staged manifest read back from
its JSON (a committable after a failure or restart) reads the file; double values keep every bit
through staging and commit."""

from __future__ import annotations

import decimal
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from iceberg_sink._iceberg import manifests
from iceberg_sink.vocab.files import DataFileMeta, FileContent

TYPES: list[tuple[Any, Any]] = [
    (BooleanType(), True),
    (IntegerType(), -7),
    (LongType(), 2**40),
    (FloatType(), 0.1),  # not a float32: a read gives 0.10000000149011612
    (DoubleType(), 0.1),
    (DecimalType(10, 3), decimal.Decimal("12.345")),
    (DateType(), 20_419),  # partition values as the writers give them: days, microseconds
    (TimeType(), 45_001_000_005),
    (TimestampType(), 1_795_000_000_000_005),
    (TimestamptzType(), -5),
    (StringType(), "a.b/c?d=%20é\x01"),
    (UUIDType(), uuid.UUID("12345678-1234-5678-1234-567812345678")),
    (FixedType(3), b"\x00\x01\xff"),
    (BinaryType(), b"\x00bin"),
]


def _meta(path: str, spec_id: int, value: Any, content: FileContent = FileContent.DATA) -> DataFileMeta:
    return DataFileMeta(
        content=content,
        path=path,
        spec_id=spec_id,
        partition=(value,),
        record_count=3,
        file_size_in_bytes=100,
        column_sizes={1: 10, 2: 20},
        value_counts={1: 3, 2: 3},
        null_value_counts={1: 0, 2: 1},
        nan_value_counts={},
        lower_bounds={1: b"\x01\x00\x00\x00\x00\x00\x00\x00"},
        upper_bounds={1: b"\x09\x00\x00\x00\x00\x00\x00\x00"},
        split_offsets=[4],
        equality_ids=(1,) if content == FileContent.EQUALITY_DELETES else None,
    )


@pytest.mark.parametrize(("field_type", "value"), TYPES, ids=[str(t) for t, _ in TYPES])
def test_remembered_files_are_what_a_read_returns(tmp_path: Path, field_type: Any, value: Any) -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "p", field_type))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"), spec_id=3)
    io = PyArrowFileIO()
    for deletes, content in ((False, FileContent.DATA), (True, FileContent.EQUALITY_DELETES)):
        files = [_meta(f"file://{tmp_path}/f{i}.parquet", 3, value, content) for i in range(3)]
        path = f"file://{tmp_path}/staged-{int(deletes)}.avro"
        staged = manifests.write_staged_manifest(io, path, spec, schema, files, deletes=deletes)
        kept = manifests.read_staged_manifest(io, staged)
        read = manifests.read_staged_manifest(io, manifests.StagedManifest.from_json(staged.to_json()))
        assert kept == read
        assert len(read) == 3
        # Kept for every type but float, whose partition value the manifest holds in single precision.
        assert (staged.files is None) == isinstance(field_type, FloatType)


def test_the_committable_just_staged_reads_nothing_a_stored_one_reads_the_file(tmp_path: Path) -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "p", LongType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"), spec_id=0)
    io = PyArrowFileIO()
    path = tmp_path / "staged.avro"
    files = [_meta(f"file://{tmp_path}/f{i}.parquet", 0, i) for i in range(2)]
    staged = manifests.write_staged_manifest(io, str(path), spec, schema, files, deletes=False)
    path.unlink()
    assert [f.path for f in manifests.read_staged_manifest(io, staged)] == [f.path for f in files]
    stored = manifests.StagedManifest.from_json(staged.to_json())  # as a committable is read back
    assert stored == staged and stored.files is None
    with pytest.raises(FileNotFoundError):
        manifests.read_staged_manifest(io, stored)


@pytest.mark.parametrize("value", [0.1, 3.141592653589793, 1e308, 5e-324, -0.0])
def test_a_double_partition_value_survives_staging_and_commit_exactly(tmp_path: Path, value: float) -> None:
    """PyIceberg 0.12's Cython decoder reads doubles in single precision (``_iceberg/avro_read.py``):
    a staged double partition value read back, and the manifest a commit writes from it, keep every
    bit (checked in the manifest's bytes, not only through our reader)."""
    from iceberg_sink._iceberg import producer, row_delta
    from iceberg_sink._iceberg.avro_read import fetch_entries
    from iceberg_sink.table.catalog import CatalogConfig

    catalog = CatalogConfig.embedded(tmp_path / "lake").load()
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "p", DoubleType()))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"), spec_id=0)
    table = catalog.create_table("db.t", schema=schema, partition_spec=spec, properties={"format-version": "2"})
    staged_path = table.location_provider().new_metadata_location("staged.avro")
    files = [_meta(f"{table.location()}/data/f.parquet", 0, value)]
    staged = manifests.write_staged_manifest(table.io, staged_path, table.spec(), table.schema(), files, False)
    read = manifests.read_staged_manifest(table.io, manifests.StagedManifest.from_json(staged.to_json()))  # a restart
    assert struct.pack("<d", read[0].partition[0]) == struct.pack("<d", value)
    changes = row_delta.SnapshotChanges(tuple(read), ())
    committed = producer.commit_prepared(table, row_delta.RowDelta(table, "main", changes, {}).prepare())
    snapshot = committed.current_snapshot()
    assert snapshot is not None
    (manifest,) = snapshot.manifests(committed.io)
    (entry,) = fetch_entries(committed.io, manifest)
    assert struct.pack("<d", entry.data_file.partition[0]) == struct.pack("<d", value)
    # The committed manifest's bytes hold the eight bytes of the value (its blocks are deflated).
    raw = Path(manifest.manifest_path.removeprefix("file://")).read_bytes()
    assert _inflated_blocks_contain(raw, struct.pack("<d", value))


def _inflated_blocks_contain(raw: bytes, needle: bytes) -> bool:
    """Whether a deflate-coded Avro file's data, inflated from any offset that starts a raw deflate
    stream, contains ``needle``: a check on the bytes that needs no Avro reader."""
    for start in range(len(raw)):
        try:
            data = zlib.decompressobj(-15).decompress(raw[start:])
        except zlib.error:
            continue
        if len(data) > 100 and needle in data:
            return True
    return False
