"""Manifests read through the shared reader trees (``_iceberg/avro_read.py``) hold exactly what
PyIceberg's own reading finds, for manifests of different partition specs read interleaved, and the
trees are kept one per distinct header schema, not per file, within their bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestContent, ManifestFile

from iceberg_sink._iceberg import avro_read
from iceberg_sink._iceberg.manifests import write_staged_manifest
from tests.unit.test_manifest_schemas import SCHEMA, SPECS, data_file


def _manifests(tmp_path: Path, rounds: int) -> list[tuple[str, ManifestFile]]:
    io = PyArrowFileIO()
    out = []
    for round_ in range(rounds):
        for name, spec in SPECS.items():
            files = [data_file(f"file://{tmp_path}/{name}-{round_}-{i}.parquet", name) for i in range(3)]
            path = f"file://{tmp_path}/{name}-{round_}.avro"
            staged = write_staged_manifest(io, path, spec, SCHEMA, files, False)
            # As a snapshot lists it: its entries inherit the snapshot id and sequence numbers.
            manifest = ManifestFile.from_args(
                manifest_path=staged.path,
                manifest_length=staged.length,
                partition_spec_id=staged.spec_id,
                content=ManifestContent.DATA,
                sequence_number=3 + round_,
                min_sequence_number=3,
                added_snapshot_id=7 + round_,
            )
            out.append((name, manifest))
    return out


def _fields(entries: list) -> list[tuple[object, ...]]:
    return [
        (
            e.status,
            e.snapshot_id,
            e.sequence_number,
            e.file_sequence_number,
            e.data_file.file_path,
            tuple(e.data_file.partition),
            e.data_file.record_count,
            e.data_file.file_size_in_bytes,
            e.data_file.split_offsets,
        )
        for e in entries
    ]


def test_entries_equal_pyicebergs_for_interleaved_specs_with_one_tree_per_header(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    avro_read._readers.clear()
    manifests = _manifests(tmp_path, rounds=2)
    for name, manifest in manifests:
        ours = avro_read.fetch_entries(io, manifest, discard_deleted=True)
        theirs = manifest.fetch_manifest_entry(io, discard_deleted=True)
        assert len(ours) == 3
        assert {e.snapshot_id for e in ours} == {manifest.added_snapshot_id}
        assert {e.sequence_number for e in ours} == {manifest.sequence_number}
        assert _fields(ours) == _fields(theirs), name
        assert [tuple(e.data_file.partition) for e in ours] == [tuple(e.data_file.partition) for e in theirs]
    # Four specs, four header schemas: the second round of files reused the first round's trees.
    assert avro_read.cached_readers() == len(SPECS)


def test_the_bound_evicts_the_least_recently_used_tree_and_reads_stay_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io = PyArrowFileIO()
    avro_read._readers.clear()
    monkeypatch.setattr(avro_read, "MAX_READERS", 2)
    for name, manifest in _manifests(tmp_path, rounds=2):
        ours = avro_read.fetch_entries(io, manifest, discard_deleted=False)
        assert _fields(ours) == _fields(manifest.fetch_manifest_entry(io, discard_deleted=False)), name
        assert avro_read.cached_readers() <= 2


@pytest.mark.parametrize("format_version", [1, 2])
def test_manifest_lists_read_as_pyiceberg_reads_them(tmp_path: Path, format_version: int) -> None:
    """``lineage.read_manifests`` reads v1 and v2 manifest lists (written by PyIceberg here) through
    the shared trees: the same manifests, field for field, as ``Snapshot.manifests``."""
    import pyarrow as pa

    from iceberg_sink._iceberg.lineage import read_manifests
    from iceberg_sink.table.catalog import CatalogConfig

    catalog = CatalogConfig.embedded(tmp_path / "lake").load()
    catalog.create_namespace("db")
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    table = catalog.create_table("db.t", schema=rows.schema, properties={"format-version": str(format_version)})
    for _ in range(3):
        table.append(rows)
    for snapshot in table.metadata.snapshots:
        ours = read_manifests(table.io, snapshot, format_version)
        theirs = snapshot.manifests(table.io)
        assert [tuple(m) for m in ours] == [tuple(m) for m in theirs]
        assert len(ours) >= 1
