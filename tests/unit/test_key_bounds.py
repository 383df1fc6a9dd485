"""The new-key proof's "changed since" rule (table/key_bounds.py) on real tables cut by snapshot expiry."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table

from iceberg_sink.table.key_bounds import KeyBounds, KeyBoundsCache, data_added_since
from tests.helpers import count_key_bounds_reads


def _table(tmp_path: Path) -> Table:
    (tmp_path / "wh").mkdir()
    catalog = load_catalog(
        "unit", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri()
    )
    catalog.create_namespace("db")
    return catalog.create_table("db.t", schema=pa.schema([("id", pa.int64())]), properties={"format-version": "2"})


def test_a_parent_less_head_that_is_not_the_tables_first_snapshot_counts_as_changed(tmp_path: Path) -> None:
    """A proof made on the empty table (-1); then another writer appends rows, a snapshot adding none
    follows, and an expiry of the fresh snapshots leaves that one parent-less. Rows were added after
    the proof: the chain must not be taken for the branch's first snapshot."""
    table = _table(tmp_path)
    assert not data_added_since(table, table.current_snapshot(), -1)  # still empty
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    table.append(pa.table({"id": pa.array([100], pa.int64())}))
    table.delete(EqualTo("id", 100))  # drops that whole file: no rows added
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    assert int(head.summary.get("added-data-files") or "0") == 0
    older = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != head.snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()
    table = table.refresh()
    head = table.current_snapshot()
    assert head is not None and head.parent_snapshot_id is None and head.sequence_number == 3
    assert data_added_since(table, head, -1)


def test_the_tables_first_snapshot_is_the_end_of_its_chain(tmp_path: Path) -> None:
    table = _table(tmp_path)
    table.append(pa.table({"id": pa.array([1], pa.int64())}))
    first = table.current_snapshot()
    assert first is not None and first.sequence_number == 1
    assert data_added_since(table, first, -1)  # it added rows
    assert not data_added_since(table, first, first.snapshot_id)


def _two_column_table(tmp_path: Path) -> Table:
    (tmp_path / "wh").mkdir()
    catalog = load_catalog(
        "unit", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=(tmp_path / "wh").as_uri()
    )
    catalog.create_namespace("db")
    schema = pa.schema([("id", pa.int64()), ("k", pa.int64())])
    return catalog.create_table("db.t", schema=schema, properties={"format-version": "2"})


def test_the_bounds_cache_reads_each_live_manifest_once_per_key_and_forgets_dead_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One cache serves every job of a sink (each bounded write() is a job): a manifest is read once
    per key, only manifests the snapshot lists are kept, and another key reads them again."""
    reads = count_key_bounds_reads(monkeypatch)
    table = _two_column_table(tmp_path)
    rows = pa.table({"id": pa.array([5, 9], pa.int64()), "k": pa.array([-3, 70], pa.int64())})
    table.append(rows)
    cache = KeyBoundsCache()
    field_id, k_id = table.schema().find_field("id").field_id, table.schema().find_field("k").field_id
    first = cache.bounds(table, table.current_snapshot(), [field_id])
    assert len(reads) == 1 and not first.empty
    assert cache.bounds(table, table.current_snapshot(), [field_id]) == first and len(reads) == 1
    table.append(pa.table({"id": pa.array([100], pa.int64()), "k": pa.array([0], pa.int64())}))
    table = table.refresh()
    second = cache.bounds(table, table.current_snapshot(), [field_id])
    assert len(reads) == 2  # only the new manifest
    ((_, low, high),) = second.fields
    assert (low, high) == ((5).to_bytes(8, "little"), (100).to_bytes(8, "little"))
    # Another key: the same manifests hold other bounds, read again.
    by_k = cache.bounds(table, table.current_snapshot(), [k_id])
    ((_, low, high),) = by_k.fields
    assert (low, high) == ((-3).to_bytes(8, "little", signed=True), (70).to_bytes(8, "little"))
    assert len(reads) == 4
    # Manifests no longer listed (an overwrite drops every file) are forgotten.
    table.overwrite(pa.table({"id": pa.array([7], pa.int64()), "k": pa.array([1], pa.int64())}))
    table = table.refresh()
    listed = {m.manifest_path for m in table.current_snapshot().manifests(table.io)}  # type: ignore[union-attr]
    cache.bounds(table, table.current_snapshot(), [k_id])
    assert set(cache._by_manifest) <= listed


def test_a_snapshot_whose_metadata_an_expiry_deleted_proves_nothing(tmp_path: Path) -> None:
    """The snapshot a checkpoint loaded lost its manifest list and manifests (another writer moved the
    head, an expiry deleted them): the bounds read failed with FileNotFoundError and the batch with
    it. Now no key is proven new: every key gets its equality delete."""
    table = _table(tmp_path)
    table.append(pa.table({"id": pa.array([5, 9], pa.int64())}))
    loaded = table.current_snapshot()
    assert loaded is not None
    field_id = table.schema().find_field("id").field_id
    for manifest in loaded.manifests(table.io):
        Path(manifest.manifest_path.removeprefix("file://")).unlink()
    Path(loaded.manifest_list.removeprefix("file://")).unlink()
    proof = KeyBoundsCache().bounds(table, loaded, [field_id])
    assert proof == KeyBounds(snapshot_id=loaded.snapshot_id, empty=False, fields=((field_id, None, None),))
