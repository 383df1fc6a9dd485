"""Two sinks on two branches of one table, and compaction on a branch.

A commit on one branch raises the table's last sequence number under the other branch's feet; each
stream must retry on fresh metadata (not crash-loop), keep its branch's retention settings, and each
branch must read back as its own model with Apache Iceberg Java and DuckDB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import CompactionConfig, IcebergSink
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

DDL = "id long, name string, score long"


def upsert_sink(lake: Path, branch: str) -> Any:
    return (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.people")
        .create_if_missing(partition_by=["bucket(2, id)"], format_version=2)  # PyIceberg adds a branch: not on v3
        .upsert(key=["id"])
        .branch(branch)
        .build()
    )


def test_two_sinks_on_two_branches_and_compaction_on_a_branch(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    main, audit = upsert_sink(lake, "main"), upsert_sink(lake, "audit")
    models: dict[str, dict[int, tuple[Any, ...]]] = {"main": {}, "audit": {}}

    def write(branch: str, rows: list[tuple[Any, ...]]) -> None:
        sink = main if branch == "main" else audit
        sink.write(spark.createDataFrame(rows, DDL), checkpoint_location=str(tmp_path / f"ckpt-{branch}"))
        for row in rows:
            models[branch][row[0]] = row

    write("main", [(i, f"m{i}", i) for i in range(10)])
    # The branch forks from main's head on its first commit.
    models["audit"] = dict(models["main"])
    table = main.load_table()
    head = table.metadata.current_snapshot_id
    assert head is not None
    with table.manage_snapshots() as manage:
        manage.create_branch(head, "audit", max_snapshot_age_ms=3_600_000, min_snapshots_to_keep=3)
    for round_ in range(3):
        # Interleaved: every commit on one branch makes the other's cached metadata stale.
        write("audit", [(i, f"a{round_}-{i}", 100 + i) for i in range(round_, 12, 3)])
        write("main", [(i, f"m{round_}-{i}" * 50, None) for i in range(round_ + 5, 15, 4)])
    result = audit.compact(spark, config=CompactionConfig(min_input_files=2, delete_file_threshold=1))
    assert result.snapshot_id is not None and result.rewritten_data_files > 0
    write("main", [(3, "after-compaction", 3)])

    table = main.load_table()
    ref = table.metadata.refs["audit"]
    assert (ref.max_snapshot_age_ms, ref.min_snapshots_to_keep) == (3_600_000, 3)
    sequence_numbers = [s.sequence_number for s in table.snapshots()]
    assert len(set(sequence_numbers)) == len(sequence_numbers)
    for branch, model in models.items():
        expected = normalize(
            pa.Table.from_pylist([dict(zip(["id", "name", "score"], r, strict=True)) for r in model.values()]), ["id"]
        )
        snapshot = table.snapshot_by_name(branch)
        assert snapshot is not None
        assert normalize(java_reader.read(table.metadata_location, branch=branch), ["id"]) == expected, branch
        assert normalize(duckdb_read(table.metadata_location, snapshot_id=snapshot.snapshot_id), ["id"]) == expected, (
            branch
        )
    # Compaction replaced files of the branch only: main's files are untouched by it.
    main_head = table.snapshot_by_name("main")
    assert main_head is not None and main_head.summary is not None
    assert main_head.summary.get("iceberg-sink.operation") != "compaction"
