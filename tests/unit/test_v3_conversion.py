"""Equality-delete conversion on a format v3 table: the equality deletes a v2 CDC table kept through
its upgrade become deletion vectors (real task writers, aggregator, committer, SQLite catalog;
PyIceberg 0.12 reads the result, which it cannot while an equality delete is live; no Spark).

The scenario: v2 checkpoints with equality deletes, a v2 conversion (a file-scoped position delete
file), another v2 equality delete, the upgrade, a v3 checkpoint (a DV), then the v3 conversion,
with another v3 checkpoint committing a DV on the conversion's data file between its plan and its
commit. tests/integration/test_v3_conversion.py reads the same kind of table with both Iceberg
Javas, DuckDB and PyIceberg.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import Table

from iceberg_sink import UnsupportedTableError
from iceberg_sink._iceberg.delete_rewrite import RewriteDeletes
from iceberg_sink._iceberg.deletion_vectors import read_deletion_vector
from iceberg_sink._iceberg.position_deletes import read_positions
from iceberg_sink.table.catalog import create_table
from iceberg_sink.table.versions import upgrade_format_version
from iceberg_sink.topology.conversion.job import convert_equality_deletes
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from tests.helpers import LosingCatalog, write_batches, writer_spec
from tests.unit.test_v3_upserts import SCHEMA, committable, committer, live_deletes, rows_in

Rows = list[tuple[int, str | None, str]]


@pytest.fixture
def catalog(tmp_path: Path) -> LosingCatalog:
    (tmp_path / "wh").mkdir()
    cat = LosingCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())
    create_table(cat, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "2"})
    return cat


def positions(table: Table, meta: DataFileMeta, data_file: str) -> list[int]:
    """The positions of ``data_file`` that the DV or position delete file ``meta`` deletes."""
    if meta.is_dv:
        assert meta.content_offset is not None and meta.content_size_in_bytes is not None
        found = read_deletion_vector(table.io, meta.path, meta.content_offset, meta.content_size_in_bytes)
    else:
        found = np.asarray(read_positions(table.io, meta.path, data_file))
    return sorted(int(p) for p in found)


def racing(load: Callable[[], Table], before_commit: Callable[[], None]) -> Callable[[], Table]:
    """A table loader that lets another writer commit before the second load (the commit's)."""
    calls = {"n": 0}

    def loader() -> Table:
        calls["n"] += 1
        if calls["n"] == 2:
            before_commit()
        return load()

    return loader


def test_a_v2_tables_equality_deletes_become_deletion_vectors_after_the_upgrade(catalog: LosingCatalog) -> None:
    load = lambda: catalog.load_table("db.t")  # noqa: E731
    c = committer(catalog)
    model: dict[int, str | None] = {}

    def commit(checkpoint: int, rows: Rows) -> None:
        c.commit(committable(load(), checkpoint, rows))
        for key, value, op in rows:
            if op == "D":
                model.pop(key, None)
            else:
                model[key] = value

    commit(0, [(i, f"v{i}", "I") for i in range(1, 7)])  # data file F: keys 1..6 at positions 0..5
    [data_file] = [f["file_path"] for f in load().inspect.files().to_pylist() if f["content"] == 0]
    commit(1, [(2, "b", "U"), (3, None, "D")])  # an equality delete of keys 2 and 3
    assert convert_equality_deletes(load).added_position_delete_files == 1  # v2: F's rows 1, 2 by position
    commit(2, [(6, None, "D")])  # a v2 equality delete again: F's row 5
    table = upgrade_format_version(load, 3)
    [position_file] = [d for d in live_deletes(table) if d.content == FileContent.POSITION_DELETES]
    assert positions(table, position_file, data_file) == [1, 2]
    commit(3, [(2, "b2", "U")])  # v3: a DV on checkpoint 1's file; the equality delete stays
    with pytest.raises(ValueError, match="equality delete"):
        rows_in(load())  # PyIceberg reads no equality delete
    before = load()
    assert before.current_snapshot().summary["total-equality-deletes"] == "1"  # type: ignore[union-attr]

    # Between the plan and the commit, a checkpoint deletes row 3 (key 4) of F with a DV of its own
    # (holding F's position delete file's rows 1 and 2, and removing that file-scoped file, as Iceberg
    # Java's DV writer does): the plan is invalidated, and planned again.
    next_row_id = []

    def other_writer() -> None:
        commit(4, [(4, "d2", "U")])
        checkpoint = load().current_snapshot()
        assert checkpoint is not None and checkpoint.summary is not None
        assert checkpoint.summary["removed-position-delete-files"] == "1"
        assert position_file.path not in {d.path for d in live_deletes(load())}
        next_row_id.append(load().metadata.next_row_id)

    result = convert_equality_deletes(racing(load, other_writer))
    table = load()
    assert result.snapshot_id is not None and result.replans == 1
    assert (result.removed_equality_delete_files, result.added_dvs, result.replaced_dvs) == (1, 1, 1)
    assert (result.added_position_delete_files, result.dv_positions) == (0, 4)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == result.snapshot_id and snapshot.summary is not None
    assert snapshot.summary.operation.value == "replace"
    assert (snapshot.summary["added-dvs"], snapshot.summary["removed-dvs"]) == ("1", "1")
    assert snapshot.summary["total-equality-deletes"] == "0"
    # Row lineage: a snapshot that only swaps delete files adds no row and moves no row id.
    assert snapshot.added_rows == 0 and [table.metadata.next_row_id] == next_row_id

    assert rows_in(table) == model == {1: "v1", 2: "b2", 4: "d2", 5: "v5"}
    deletes = live_deletes(table)
    assert not [d for d in deletes if d.content == FileContent.EQUALITY_DELETES]
    dvs = [d for d in deletes if d.is_dv]
    assert len({d.referenced_data_file for d in dvs}) == len(dvs)  # at most one DV per data file
    [dv] = [d for d in dvs if d.referenced_data_file == data_file]
    # The position delete file's rows (1, 2), the racing DV's (3) and the equality delete's (5).
    assert positions(table, dv, data_file) == [1, 2, 3, 5]
    # DVs only: the v2 position delete file went with the racing checkpoint's DV; none was added.
    assert [d.path for d in deletes if not d.is_dv] == []
    assert convert_equality_deletes(load).snapshot_id is None  # nothing left to convert


def test_the_conversion_retires_the_file_scoped_position_delete_files_its_dvs_take_over(
    catalog: LosingCatalog,
) -> None:
    """An upgraded v2 table's file-scoped position delete file (a v2 conversion's) goes in the
    snapshot whose DV takes over its positions, here the v3 conversion's; readers see the same rows."""
    load = lambda: catalog.load_table("db.t")  # noqa: E731
    c = committer(catalog)
    c.commit(committable(load(), 0, [(i, f"v{i}", "I") for i in range(1, 5)]))  # F: keys 1..4
    [data_file] = [f["file_path"] for f in load().inspect.files().to_pylist() if f["content"] == 0]
    c.commit(committable(load(), 1, [(2, None, "D")]))
    assert convert_equality_deletes(load).added_position_delete_files == 1  # v2: F's row 1 by position
    c.commit(committable(load(), 2, [(4, None, "D")]))  # a v2 equality delete: F's row 3
    table = upgrade_format_version(load, 3)
    [position_file] = [d for d in live_deletes(table) if d.content == FileContent.POSITION_DELETES]

    result = convert_equality_deletes(load)
    table = load()
    assert (result.added_dvs, result.replaced_dvs, result.removed_position_delete_files) == (1, 0, 1)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert (snapshot.summary["added-dvs"], snapshot.summary["removed-position-delete-files"]) == ("1", "1")
    [dv] = live_deletes(table)
    assert dv.is_dv and dv.referenced_data_file == data_file and position_file.path != dv.path
    assert positions(table, dv, data_file) == [1, 3]
    assert rows_in(table) == {1: "v1", 3: "v3"}


def test_a_v3_rewrite_of_deletes_refuses_equality_and_position_delete_files(catalog: LosingCatalog) -> None:
    table = upgrade_format_version(lambda: catalog.load_table("db.t"), 3)
    c = committer(catalog)
    c.commit(committable(table, 0, [(1, "a", "I")]))
    table = catalog.load_table("db.t")
    spec = writer_spec(table, checkpoint_id=5, equality_field_ids=(1,), op_column="op")
    deletes = write_batches(spec, pa.table({"id": pa.array([1], pa.int64()), "v": ["y"], "op": ["U"]}))
    with pytest.raises(UnsupportedTableError, match=r"expected deletion vectors.*deletion vectors only"):
        RewriteDeletes(table, "main", deletes.delete_files, frozenset(), {})
