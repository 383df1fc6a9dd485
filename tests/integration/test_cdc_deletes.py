"""Where equality deletes must reach: keys proven new that another writer adds before our commit,
and rows written under an older partition spec.

Every expected table is checked with Apache Iceberg Java (the reference for equality deletes) and
DuckDB. Races are real: another writer commits between our write and our commit, from a fault hook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, _faults
from tests.helpers import count_key_bounds_reads
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

DDL = "id long, region string, v string, op string"


def rows_of(table: Table) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The table as Java and as DuckDB read it."""
    return normalize(JAVA[0].read(table.metadata_location), ["id"]), normalize(
        duckdb_read(table.metadata_location), ["id"]
    )


JAVA: list[JavaIcebergReader] = []


@pytest.fixture(autouse=True)
def _java(java_reader: JavaIcebergReader) -> None:
    JAVA[:] = [java_reader]


def assert_table(table: Table, expected: list[tuple[int, str, str]]) -> None:
    want = [{"id": i, "region": r, "v": v} for i, r, v in sorted(expected)]
    java, duck = rows_of(table)
    assert java == want, "Iceberg Java"
    assert duck == want, "DuckDB"


def cdc_sink(tmp_path: Path, partition_by: list[str] | None = None, key: tuple[str, ...] = ("id",)) -> Any:
    builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t")
    if partition_by is not None:
        # v2: equality deletes are the subject, and PyIceberg (the other writer) cannot commit to v3.
        builder = builder.create_if_missing(partition_by=partition_by, format_version=2)
    return builder.cdc(op_column="op", key=list(key)).build()


def append_rows(table: Table, rows: list[tuple[int, str, str]]) -> None:
    """Another writer (plain PyIceberg append) commits rows, in the table's current spec."""
    table.refresh()
    arrow = table.schema().as_arrow()
    table.append(pa.Table.from_pylist([{"id": i, "region": r, "v": v} for i, r, v in rows], schema=arrow))


def racing(point: str, action: Callable[[], None]) -> Callable[[str, int], None]:
    fired: list[int] = []

    def handler(p: str, checkpoint: int) -> None:
        if p == point and not fired:
            fired.append(checkpoint)
            action()

    return handler


@pytest.mark.parametrize("op", ["D", "I", "U"])
def test_change_of_a_key_proven_new_survives_a_concurrent_insert_of_that_key(
    spark: SparkSession, tmp_path: Path, op: str
) -> None:
    """Key 50 is above the table's key bounds when our writers run (so its delete is conditional);
    another writer commits a row with key 50 before our commit: our change must win."""
    sink = cdc_sink(tmp_path, partition_by=[])
    sink.write(spark.createDataFrame([(1, "a", "old", "I")], DDL))
    table = sink.load_table()
    _faults.install(racing(_faults.AFTER_WRITE, lambda: append_rows(table, [(50, "a", "theirs")])))
    try:
        # 60 is new too and nobody races it; 1 is an ordinary update.
        sink.write(spark.createDataFrame([(50, "a", "ours", op), (60, "a", "ours", "I"), (1, "a", "new", "U")], DDL))
    finally:
        _faults.clear()
    expected = [(1, "a", "new"), (60, "a", "ours")] + ([] if op == "D" else [(50, "a", "ours")])
    assert_table(sink.load_table(), expected)


def test_delete_only_checkpoint_of_a_key_proven_new_survives_a_concurrent_insert(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A checkpoint whose only change is the delete of a provably new key still commits it."""
    sink = cdc_sink(tmp_path, partition_by=[])
    sink.write(spark.createDataFrame([(1, "a", "old", "I")], DDL))
    table = sink.load_table()
    _faults.install(racing(_faults.AFTER_WRITE, lambda: append_rows(table, [(50, "a", "theirs")])))
    try:
        sink.write(spark.createDataFrame([(50, "a", None, "D")], DDL))
    finally:
        _faults.clear()
    assert_table(sink.load_table(), [(1, "a", "old")])


def test_conditional_deletes_are_dropped_when_the_proof_holds(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a race, keys proven new cost no delete file in the table, and their conditional
    delete files are removed from storage. The proofs' key bounds are read from each data manifest
    once per sink, not once per write() (each write is a job of its own)."""
    reads = count_key_bounds_reads(monkeypatch)
    sink = cdc_sink(tmp_path, partition_by=[])
    sink.write(spark.createDataFrame([(1, "a", "old", "I")], DDL))
    sink.write(spark.createDataFrame([(50, "a", None, "D"), (60, "a", "x", "I")], DDL))
    assert reads and len(reads) == len(set(reads)), reads
    table = sink.load_table()
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary.operation.value == "append"
    assert "added-delete-files" not in summary.additional_properties
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert not list(data_dir.rglob("*-eq-deletes*.parquet"))
    assert_table(table, [(1, "a", "old"), (60, "a", "x")])
    # A checkpoint that only deletes keys that provably do not exist commits no snapshot at all.
    snapshots = len(table.snapshots())
    sink.write(spark.createDataFrame([(70, "a", None, "D")], DDL))
    assert len(reads) == len(set(reads)), reads  # no manifest read twice across the three writes
    table = sink.load_table()
    assert len(table.snapshots()) == snapshots
    assert not list(data_dir.rglob("*-eq-deletes*.parquet"))
    assert_table(table, [(1, "a", "old"), (60, "a", "x")])


def test_crash_after_a_checkpoint_that_needed_no_snapshot_replays_cleanly(spark: SparkSession, tmp_path: Path) -> None:
    """A checkpoint that only deletes keys proven new commits nothing; a crash before its committable
    is removed must not leave a committable whose staged manifests are gone (the replay failed with
    "staged manifest is missing"): its files are deleted only once the committable is."""
    sink = cdc_sink(tmp_path, partition_by=[])
    location = str(tmp_path / "ck")
    sink.write(spark.createDataFrame([(1, "a", "old", "I")], DDL), checkpoint_location=location)

    class Crash(Exception):
        pass

    def crash(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_COMMIT and checkpoint_id == 1:
            raise Crash(point)

    df = spark.createDataFrame([(70, "a", None, "D")], DDL)
    _faults.install(crash)
    try:
        with pytest.raises(Crash):
            sink.write(df, checkpoint_location=location, checkpoint_id=1)
    finally:
        _faults.clear()
    restarted = cdc_sink(tmp_path, partition_by=[])
    outcome = restarted.write(df, checkpoint_location=location, checkpoint_id=1)
    assert outcome is not None and outcome.snapshot is None
    table = restarted.load_table()
    assert len(table.snapshots()) == 1
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    assert not list(metadata_dir.glob("iceberg-sink-*-000001-*.avro"))  # staged manifests removed after all
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert not list(data_dir.rglob("*-eq-deletes*.parquet"))
    assert_table(table, [(1, "a", "old")])


# -- partition spec evolution ------------------------------------------------------------------


def seed(spark: SparkSession, sink: Any) -> None:
    sink.write(spark.createDataFrame([(i, "eu" if i % 2 else "us", f"v{i}", "I") for i in range(1, 11)], DDL))


def changes(spark: SparkSession, sink: Any) -> None:
    """Update 3, delete 4, update-then-delete nothing else: all keys inside the key bounds."""
    sink.write(spark.createDataFrame([(3, "eu", "changed", "U"), (4, "us", None, "D"), (7, "eu", "seven", "U")], DDL))


def after_changes() -> list[tuple[int, str, str]]:
    rows = {i: (i, "eu" if i % 2 else "us", f"v{i}") for i in range(1, 11)}
    rows[3] = (3, "eu", "changed")
    rows[7] = (7, "eu", "seven")
    del rows[4]
    return list(rows.values())


def test_upsert_after_unpartitioned_to_partitioned_reaches_old_rows(spark: SparkSession, tmp_path: Path) -> None:
    sink = cdc_sink(tmp_path, partition_by=[])
    seed(spark, sink)
    with sink.load_table().update_spec() as spec:
        spec.add_field("id", BucketTransform(4), "id_bucket")
    changes(spark, sink)
    assert_table(sink.load_table(), after_changes())
    # The table now has an unpartitioned spec (added, not the default): a later checkpoint reuses it.
    specs_before = len(sink.load_table().metadata.partition_specs)
    sink.write(spark.createDataFrame([(9, "eu", "nine", "U")], DDL))
    expected = [r if r[0] != 9 else (9, "eu", "nine") for r in after_changes()]
    table = sink.load_table()
    assert_table(table, expected)
    assert len(table.metadata.partition_specs) == specs_before
    assert table.spec().fields, "the unpartitioned spec must not become the default"


def test_upsert_after_partitioning_changes_reaches_old_rows(spark: SparkSession, tmp_path: Path) -> None:
    sink = cdc_sink(tmp_path, partition_by=["region"], key=("id", "region"))
    seed(spark, sink)
    with sink.load_table().update_spec() as spec:
        spec.remove_field("region")
        spec.add_field("id", BucketTransform(4), "id_bucket")
    changes(spark, sink)
    assert_table(sink.load_table(), after_changes())


def test_upsert_after_partitioned_to_unpartitioned_reaches_old_rows(spark: SparkSession, tmp_path: Path) -> None:
    sink = cdc_sink(tmp_path, partition_by=["region"], key=("id", "region"))
    seed(spark, sink)
    with sink.load_table().update_spec() as spec:
        spec.remove_field("region")
    changes(spark, sink)
    assert_table(sink.load_table(), after_changes())


def test_spec_evolved_and_rows_added_between_write_and_commit(spark: SparkSession, tmp_path: Path) -> None:
    """Our deletes were written in spec 0; before our commit the spec changes and another writer
    adds a row with one of our keys in the new spec: the commit-time re-check must make our deletes
    reach it."""
    sink = cdc_sink(tmp_path, partition_by=["region"], key=("id", "region"))
    seed(spark, sink)
    table = sink.load_table()

    def evolve_and_append() -> None:
        with table.update_spec() as spec:
            spec.add_field("id", BucketTransform(4), "id_bucket")
        append_rows(table, [(3, "eu", "theirs")])

    _faults.install(racing(_faults.AFTER_MANIFESTS, evolve_and_append))
    try:
        changes(spark, sink)
    finally:
        _faults.clear()
    assert_table(sink.load_table(), after_changes())
