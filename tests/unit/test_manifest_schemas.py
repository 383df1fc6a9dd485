"""Manifest entry schemas are built once per partition type and format version and reused: manifests
of tables with different partition specs, written interleaved (as a routed checkpoint stages and
commits its tables), each carry their own partition type and read back with their own values."""

from __future__ import annotations

from pathlib import Path

from pyiceberg.avro.file import AvroFile
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

from iceberg_sink._iceberg.manifests import read_staged_manifest, write_staged_manifest
from iceberg_sink.vocab.files import DataFileMeta, FileContent

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()))
SPECS = {
    "unpartitioned": UNPARTITIONED_PARTITION_SPEC,
    "by_id": PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "id"), spec_id=1),
    "by_bucket": PartitionSpec(PartitionField(1, 1000, BucketTransform(8), "id"), spec_id=2),
    "by_name": PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "id"), spec_id=3),  # same name, other type
}
VALUES: dict[str, tuple[object, ...]] = {
    "unpartitioned": (),
    "by_id": (2**40,),
    "by_bucket": (5,),
    "by_name": ("a.b/c?\x01",),
}


def data_file(path: str, name: str) -> DataFileMeta:
    return DataFileMeta(
        content=FileContent.DATA,
        path=path,
        spec_id=SPECS[name].spec_id,
        partition=VALUES[name],
        record_count=3,
        file_size_in_bytes=100,
        column_sizes={},
        value_counts={},
        null_value_counts={},
        nan_value_counts={},
        lower_bounds={},
        upper_bounds={},
        split_offsets=[4],
    )


def test_interleaved_manifests_of_different_specs_keep_their_own_partition_types(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    staged = {}
    for round_ in range(2):  # the second round is served from the cache
        for name, spec in SPECS.items():
            path = f"file://{tmp_path}/{name}-{round_}.avro"
            staged[(name, round_)] = write_staged_manifest(
                io, path, spec, SCHEMA, [data_file(f"file://{tmp_path}/{name}.parquet", name)], False
            )
    for (name, round_), manifest in staged.items():
        [read] = read_staged_manifest(io, manifest)
        assert tuple(read.partition) == VALUES[name], (name, round_)
        with AvroFile[object](io.new_input(manifest.path)) as avro:
            data_file_type = avro.schema.find_field("data_file").field_type
        assert isinstance(data_file_type, StructType)
        partition = data_file_type.field_by_name("partition")
        assert partition is not None and isinstance(partition.field_type, StructType)
        types = [f.field_type for f in partition.field_type.fields]
        expected = {"unpartitioned": [], "by_id": [LongType()], "by_bucket": [IntegerType()], "by_name": [StringType()]}
        assert types == expected[name], (name, round_, types)
