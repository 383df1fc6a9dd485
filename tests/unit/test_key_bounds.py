"""The new-key proof's "changed since" rule (table/key_bounds.py) on real tables cut by snapshot expiry."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.expressions import EqualTo
from pyiceberg.table import Table

from iceberg_sink.table.key_bounds import data_added_since


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
