"""Upgrading a format v2 table to v3 (no Spark): the metadata Iceberg Java's ``upgradeFormatVersion``
writes, row ids for the existing rows from the next snapshot on, a commit prepared on v2 metadata
retried, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink import IcebergSink, InvalidSinkConfigError, UnsupportedTableError
from iceberg_sink._iceberg import producer, row_delta
from iceberg_sink._iceberg.lineage import read_entries, read_manifests
from iceberg_sink._iceberg.manifests import data_file_first_row_id
from iceberg_sink.cli import EXIT_OK, EXIT_USAGE, main
from iceberg_sink.table.catalog import CatalogConfig, create_table
from iceberg_sink.table.versions import upgrade_format_version
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()), identifier_field_ids=[1]
)


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    (tmp_path / "wh").mkdir()
    return SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=(tmp_path / "wh").as_uri())


def _table(catalog: SqlCatalog, version: int = 2) -> Table:
    return create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": str(version)})


def _prepare_append(table: Table, ids: list[int], checkpoint: int) -> producer.PreparedCommit:
    batch = pa.table({"id": pa.array(ids, pa.int64()), "v": ["x"] * len(ids)})
    result = write_batches(writer_spec(table, checkpoint_id=checkpoint), batch)
    return row_delta.RowDelta(table, "main", row_delta.SnapshotChanges(data_files=result.data_files), {}).prepare()


def _append(table: Table, ids: list[int], checkpoint: int) -> Table:
    return producer.commit_prepared(table, _prepare_append(table, ids, checkpoint))


def _metadata_json(table: Table) -> dict[str, Any]:
    return json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())


def _first_row_ids(table: Table) -> list[int | None]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    ids = [
        data_file_first_row_id(e.data_file)
        for m in read_manifests(table.io, snapshot, 3)
        for e in read_entries(table.io, m)
    ]
    return sorted(ids, key=lambda i: -1 if i is None else i)


def test_the_upgrade_writes_what_java_does_and_existing_rows_get_ids_from_the_next_snapshot(
    catalog: SqlCatalog,
) -> None:
    table = _append(_append(_table(catalog), [1, 2, 3], 0), [4, 5], 1)
    v2_snapshots = _metadata_json(table)["snapshots"]
    table = upgrade_format_version(lambda: catalog.load_table("db.t"), 3)
    written = _metadata_json(table)
    assert (written["format-version"], written["next-row-id"]) == (3, 0)
    # Only the format version changed: the snapshots are v2's (no first-row-id), nothing else moved.
    assert written["snapshots"] == v2_snapshots and "first-row-id" not in written["snapshots"][-1]
    assert written["current-snapshot-id"] == v2_snapshots[-1]["snapshot-id"]
    loaded = catalog.load_table("db.t")
    assert loaded.metadata.format_version == 3 and loaded.metadata.next_row_id == 0
    assert _first_row_ids(loaded) == [None, None]  # v2 manifests carry none yet
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5]

    # The first v3 snapshot lists the two v2 manifests with ids (room for their existing rows) and its own.
    table = _append(loaded, [6], 2)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert (snapshot.first_row_id, snapshot.added_rows, table.metadata.next_row_id) == (0, 6, 6)
    # Listed in order: the new manifest (1 row) takes 0, then the v2 ones, newest first: [4, 5] and [1, 2, 3].
    assert _first_row_ids(table) == [0, 1, 3]
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4, 5, 6]
    # Upgrading again changes nothing.
    assert upgrade_format_version(lambda: catalog.load_table("db.t"), 3).metadata_location == table.metadata_location


def test_a_commit_prepared_before_the_upgrade_is_a_retryable_conflict(catalog: SqlCatalog) -> None:
    table = _append(_table(catalog), [1], 0)
    stale = _prepare_append(table, [2], 1)  # a v2 snapshot: no first-row-id
    upgrade_format_version(lambda: catalog.load_table("db.t"), 3)
    with pytest.raises(CommitFailedException, match="without first row id"):
        producer.commit_prepared(table, stale)
    table = _append(catalog.load_table("db.t"), [2], 1)  # prepared again on v3: it lands, with ids
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.first_row_id == 0 and table.metadata.next_row_id == 2


def test_the_upgrade_refuses_what_it_cannot_do_before_committing(tmp_path: Path, catalog: SqlCatalog) -> None:
    v1 = create_table(catalog, "db.v1", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "1"})
    with pytest.raises(UnsupportedTableError, match=r"expected format version 2, received 1 \(upgrade it to 2 first\)"):
        upgrade_format_version(lambda: v1, 3)
    _table(catalog)
    with pytest.raises(InvalidSinkConfigError, match=r"expected format version 3, received 4"):
        upgrade_format_version(lambda: catalog.load_table("db.t"), 4)
    uri, warehouse = f"sqlite:///{tmp_path}/c.db", (tmp_path / "wh").as_uri()
    # A sink configured for every kind of work upgrades: v3 takes upserts, conversion and compaction.
    builder = IcebergSink.builder().catalog("t", type="sql", uri=uri, warehouse=warehouse).table("db.t")
    sink = builder.upsert(key=["id"]).convert_equality_deletes(every_n_commits=1).compaction(every_n_commits=2).build()
    assert sink.upgrade_format_version().metadata.format_version == 3


def test_the_cli_upgrades_once_and_refuses_a_v1_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = CatalogConfig.embedded(tmp_path).load()
    catalog.create_namespace("db")
    create_table(catalog, "db.t", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "2"})
    create_table(catalog, "db.old", SCHEMA, UNPARTITIONED_PARTITION_SPEC, {"format-version": "1"})
    outputs = []
    for table in ("db.t", "db.t", "db.old"):
        code = main(["upgrade-format-version", table, "--embedded", str(tmp_path), "--json"])
        outputs.append((code, json.loads(capsys.readouterr().out)))
    assert [(code, doc.get("format_version_before"), doc.get("format_version")) for code, doc in outputs] == [
        (EXIT_OK, 2, 3),
        (EXIT_OK, 3, 3),
        (EXIT_USAGE, None, None),
    ]
    assert "upgrade it to 2 first" in outputs[2][1]["error"]["message"]
    assert catalog.load_table("db.t").metadata.format_version == 3
    assert catalog.load_table("db.old").metadata.format_version == 1
