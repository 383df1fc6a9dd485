"""A maintenance commit whose answer is lost, followed by a catalog that stays down.

PostgreSQL applies the commit of a compaction (or an equality-delete conversion), then the
connection drops before the answer arrives and the server stops (tests/integration/postgres.py's
proxy): the job cannot know whether its snapshot landed. Whatever it raises, it must not delete the
files it wrote: the snapshot that landed names them. Once the server is back the table reads
exactly as the model says, in Apache Iceberg Java and DuckDB.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import CommitStateUnknownError, CompactionConfig, IcebergSink
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink.topology.compaction import compact
from iceberg_sink.topology.conversion import convert_equality_deletes
from iceberg_sink.vocab import summary_keys
from tests.integration.postgres import CommitCuttingProxy, PostgresServer, postgres, sql_catalog_properties  # noqa: F401
from tests.integration.test_cdc import apply, expected, frame, random_changes
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

QUICK = RetryPolicy(num_retries=2, min_wait_ms=20, max_wait_ms=100)


def _written_table(spark: SparkSession, props: dict[str, str], batches: int) -> dict[int, dict[str, Any]]:
    """A CDC table with several small data files and equality deletes per partition; its model."""
    sink = (
        IcebergSink.builder()
        .catalog("pg", **props)
        .table("db.users")
        .create_if_missing(partition_by=["region"], format_version=2)  # equality deletes to convert
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
        .build()
    )
    rng = random.Random(11)
    model: dict[int, dict[str, Any]] = {}
    lsn = 0
    for _ in range(batches):
        changes = random_changes(rng, model, lsn + 1000, 40, keys=25)
        lsn = max(c["lsn"] for c in changes)
        sink.write(frame(spark, changes))
        apply(model, changes)
    return model


def _maintenance(kind: str, spark: SparkSession) -> Callable[[Callable[[], Table]], object]:
    if kind == "compaction":
        return lambda load: compact(spark, load, CompactionConfig(min_input_files=2), retry=QUICK)
    return lambda load: convert_equality_deletes(load, retry=QUICK)


@pytest.mark.parametrize("kind", ["compaction", "conversion"])
def test_lost_answer_then_outage_keeps_the_files_of_a_landed_maintenance_commit(
    spark: SparkSession,
    postgres: PostgresServer,  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    kind: str,
) -> None:
    proxy = CommitCuttingProxy(postgres.port)
    props = sql_catalog_properties(postgres, "maint", tmp_path / "wh", port=proxy.port)
    direct = {**props, "uri": postgres.url("maint")}
    try:
        model = _written_table(spark, props, batches=4)
        before = load_catalog("pg", **direct).load_table("db.users")
        before_files = {f["file_path"] for f in before.inspect.files().to_pylist()}
        proxy.arm(postgres.stop)
        with pytest.raises(CommitStateUnknownError) as failure:
            _maintenance(kind, spark)(lambda: load_catalog("pg", **props).load_table("db.users"))
        assert proxy.cuts == 1
        message = str(failure.value)
        assert "outcome is unknown" in message and "kept" in message, message
    finally:
        if not postgres.running():
            postgres.start()
        proxy.close()
    table = load_catalog("pg", **direct).load_table("db.users")
    # The commit landed: the table's head is the maintenance snapshot, and every file it names exists.
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    operation = (
        summary_keys.OPERATION_COMPACTION if kind == "compaction" else summary_keys.OPERATION_CONVERT_EQUALITY_DELETES
    )
    assert head.summary[summary_keys.OPERATION_KEY] == operation
    files = {f["file_path"] for f in table.inspect.files().to_pylist()}
    assert files != before_files
    missing = [p for p in files if not Path(p.removeprefix("file:")).exists()]
    assert not missing, f"the landed snapshot names deleted files: {missing}"
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected(model)
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected(model)
