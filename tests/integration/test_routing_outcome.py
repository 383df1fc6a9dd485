"""What a routed ``write()`` returns: a RoutedOutcome mapping each table to its CommitOutcome and
answering the CommitOutcome questions for the checkpoint as a whole; a single-table sink's write()
still returns a plain CommitOutcome. Tables read back by Iceberg Java and DuckDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyspark.sql import SparkSession

from iceberg_sink import CommitOutcome, IcebergSink, RoutedOutcome
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

DDL = "tbl string, id long, v string"


def test_a_routed_write_returns_every_tables_outcome_and_their_aggregate(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="db")
        .create_if_missing(partition_by=["bucket(2, id)"])
        .build()
    )
    ckpt = str(tmp_path / "ck")
    first = [("a", i, f"a{i}") for i in range(6)] + [("b", i, f"b{i}") for i in range(3)]
    outcome = sink.write(spark.createDataFrame(first, DDL).repartition(2), checkpoint_location=ckpt)

    assert isinstance(outcome, RoutedOutcome) and isinstance(outcome, CommitOutcome)
    assert list(outcome) == ["db.a", "db.b"] and dict(outcome) == sink.last_write_outcomes()
    tables = {name: catalog.load_table(name) for name in outcome}  # type: ignore[attr-defined]
    per_table = {name: o for name, o in outcome.items() if o is not None}
    assert set(per_table) == {"db.a", "db.b"}
    for name, table in tables.items():
        snapshot = per_table[name].snapshot
        assert snapshot is not None and table.current_snapshot().snapshot_id == snapshot.snapshot_id
        assert outcome.snapshots[name].snapshot_id == snapshot.snapshot_id
    # The checkpoint as a whole: two new snapshots (so no single one), every table's files.
    assert outcome.checkpoint_id == 0 and outcome.snapshot is None
    assert not outcome.already_committed and not outcome.pending and outcome.pending_tables == []
    assert outcome.attempts == sum(o.attempts for o in per_table.values()) >= 2
    added = sum(int(t.current_snapshot().summary["added-data-files"]) for t in tables.values())  # type: ignore[index]
    assert len(outcome.data_files) == added and outcome.delete_files == ()
    assert sum(f.record_count for f in outcome.data_files) == len(first)

    # A replay of checkpoint 0 (a rerun after a crash): every table already holds it, nothing new.
    again = sink.write(spark.createDataFrame(first, DDL), checkpoint_location=ckpt, checkpoint_id=0)
    assert isinstance(again, RoutedOutcome) and again.already_committed and again.snapshots == {}
    assert again.snapshot is None and again.data_files == () and list(again) == ["db.a", "db.b"]

    # One table touched: the checkpoint's snapshot is that table's, as for a single-table sink.
    second = [("b", 10 + i, "x") for i in range(2)]
    one = sink.write(spark.createDataFrame(second, DDL), checkpoint_location=ckpt)
    assert isinstance(one, RoutedOutcome) and list(one) == ["db.b"] and one.checkpoint_id == 1
    head = catalog.load_table("db.b").current_snapshot()  # type: ignore[attr-defined]
    assert one.snapshot is not None and one.snapshot.snapshot_id == head.snapshot_id

    # An empty DataFrame touches no table: None, as for a single-table sink.
    assert sink.write(spark.createDataFrame([], DDL), checkpoint_location=ckpt) is None

    rows: dict[str, list[dict[str, Any]]] = {"db.a": [], "db.b": []}
    for t, i, v in first + second:
        rows[f"db.{t}"].append({"id": i, "v": v})
    for name, want in rows.items():
        table = catalog.load_table(name)  # type: ignore[attr-defined]
        want = sorted(want, key=lambda r: r["id"])
        assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
        assert normalize(duckdb_read(table.metadata_location), ["id"]) == want


def test_a_single_table_write_still_returns_a_plain_commit_outcome(
    spark: SparkSession, catalog_props: dict[str, str]
) -> None:
    sink = IcebergSink.builder().catalog("test", **catalog_props).table("db.t").create_if_missing().build()
    outcome = sink.write(spark.createDataFrame([(1, "x")], "id long, v string"))
    assert type(outcome) is CommitOutcome and outcome.snapshot is not None
    assert outcome.snapshot.snapshot_id == sink.load_table().current_snapshot().snapshot_id  # type: ignore[union-attr]
