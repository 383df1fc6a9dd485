"""Compaction racing the equality-delete conversion in one partition: the compaction's commit
conflicts only with the groups whose rewritten files the conversion's new position deletes name
(Iceberg Java's per-data-file ``validateNoNewDeletesForDataFiles``), and a compaction that rewrote
nothing is not counted as one that succeeded.

Every table is read back by Apache Iceberg Java and DuckDB and compared with a model of the changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink.topology.compaction import CompactionConfig, compact
from iceberg_sink.topology.conversion import convert_equality_deletes
from tests.integration.test_cdc import apply, frame
from tests.integration.test_conversion import cdc_sink, check_reads, files_by_content, racing
from tests.interop.readers import JavaIcebergReader

pytestmark = pytest.mark.interop

BIG_KEYS = range(0, 400)  # one large data file: no compaction candidate
SMALL_KEYS = (range(1000, 1003), range(1003, 1006), range(1006, 1009))  # three small files: one group


def row(key: int, lsn: int, op: str) -> dict[str, Any]:
    return {"id": key, "region": "r0", "v": f"v{lsn}", "n": key, "lsn": lsn, "op": op}


def setup(spark: SparkSession, tmp_path: Path) -> tuple[Any, dict[int, dict[str, Any]], dict[str, str]]:
    """An unpartitioned CDC table: one large file (keys 0-399), three small ones; the large file's path."""
    sink = cdc_sink(tmp_path, []).build()
    model: dict[int, dict[str, Any]] = {}
    lsn = 0
    for keys in (BIG_KEYS, *SMALL_KEYS):
        changes = [row(k, lsn + i + 1, "I") for i, k in enumerate(keys)]
        lsn += len(changes)
        sink.write(frame(spark, changes, partitions=1))
        apply(model, changes)
    data = files_by_content(sink.load_table())[0]
    paths = {f["file_path"]: f["file_size_in_bytes"] for f in data}
    assert len(paths) == 4
    return sink, model, paths


def config(paths: dict[str, str], **overrides: Any) -> CompactionConfig:
    sizes = sorted(int(s) for s in paths.values())
    # Small files below, the large one above the minimum; deletes alone make no file a candidate.
    return CompactionConfig(min_file_size_bytes=sizes[-1] - 1, delete_file_threshold=1000, **overrides)


def update_then_convert(spark: SparkSession, sink: Any, model: dict[int, dict[str, Any]], keys: list[int]) -> Any:
    lsn = max(r["lsn"] for r in model.values()) + 1
    changes = [row(k, lsn + i, "U") for i, k in enumerate(keys)]
    sink.write(frame(spark, changes, partitions=1))
    apply(model, changes)
    return convert_equality_deletes(sink.load_table)


def test_conversion_naming_another_file_of_the_partition_does_not_drop_the_group(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink, model, paths = setup(spark, tmp_path)
    done: dict[str, Any] = {}

    def meanwhile() -> None:
        # Updates rows of the large file only; the conversion names it in a file-scoped delete.
        done["conversion"] = update_then_convert(spark, sink, model, [1, 2, 3])

    result = compact(spark, racing(sink.load_table, meanwhile), config(paths))
    table = sink.load_table()
    positions = files_by_content(table)[1]
    assert done["conversion"].snapshot_id is not None and len(positions) == 1
    assert result.snapshot_id == table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    assert (result.planned_groups, result.committed_groups, result.dropped_groups) == (1, 1, 0)
    assert result.rewritten_data_files == 3 and result.replans == 0
    check_reads(java_reader, table, model)


@pytest.mark.parametrize("max_replans", [0, 1])
def test_conversion_naming_a_rewritten_file_drops_the_group(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, max_replans: int
) -> None:
    sink, model, paths = setup(spark, tmp_path)
    done: dict[str, Any] = {}

    def meanwhile() -> None:
        # Updates a row of the second small file: the new position delete names a rewritten file.
        done["conversion"] = update_then_convert(spark, sink, model, [1004])

    result = compact(spark, racing(sink.load_table, meanwhile), config(paths, max_replans=max_replans))
    table = sink.load_table()
    assert done["conversion"].snapshot_id is not None
    check_reads(java_reader, table, model)
    if max_replans == 0:
        assert result.snapshot_id is None and (result.planned_groups, result.dropped_groups) == (1, 1)
        assert result.replans == 0 and len(files_by_content(table)[0]) == 5
    else:
        # Planned again on the new head: the position delete is applied and removed by the rewrite.
        assert result.snapshot_id == table.current_snapshot().snapshot_id  # type: ignore[union-attr]
        assert result.replans == 1 and result.committed_groups == 1 and result.dropped_groups == 1
        assert not files_by_content(table)[1]
