"""Format v3 on a real REST catalog (SeaweedFS ``weed mini``), and DuckDB's deletion vectors.

The REST catalog receives the sink's v3 commits as table updates and requirements (``add-snapshot``
with the snapshot's ``first-row-id`` and ``added-rows``, ``upgrade-format-version``) and writes the
v3 metadata itself. SeaweedFS's table bucket only takes ``.parquet``, ``.orc`` and ``.avro`` objects
under ``data/`` (its Iceberg layout check refuses any ``.puffin`` with 403 Access Denied), so every
v3 table here writes its data files and DVs to an ordinary bucket through ``write.data.path``.

DuckDB 1.5.5 writes to the same tables through the same catalog (``tests/interop/duckdb_rest.py``):
its DELETE and UPDATE on a v3 table write deletion vectors, which the sink's next checkpoint reads and
merges into its own (one DV per data file), and DuckDB merges the sink's. Iceberg Java 1.9.2, the
newest Java and DuckDB read every step straight from S3, PyIceberg through the catalog.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.deletion_vectors import read_deletion_vector
from iceberg_sink.builder import IcebergSinkBuilder
from iceberg_sink.vocab.files import DataFileMeta
from tests.integration.seaweed import create_bucket, seaweed  # noqa: F401
from tests.integration.test_cdc import expected, frame
from tests.integration.test_s3_rest import special_partition_values_round_trip
from tests.integration.test_v3_cdc import delete_files
from tests.interop.duckdb_rest import CATALOG_ALIAS, duckdb_rest_execute
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize

NAMESPACE = "v3rest"
DATA_BUCKET = "v3data"
"""An ordinary bucket beside the catalog's table bucket, for data files and Puffin files."""


@pytest.fixture(scope="module")
def data_bucket(seaweed: dict[str, str]) -> str:  # noqa: F811
    return create_bucket(seaweed, DATA_BUCKET)


def builder(props: dict[str, str], table: str, format_version: int) -> IcebergSinkBuilder:
    return (
        IcebergSink.builder()
        .catalog("rest", **props)
        .table(f"{NAMESPACE}.{table}")
        .create_if_missing(
            properties={"write.data.path": f"s3://{DATA_BUCKET}/{NAMESPACE}/{table}/data"},
            format_version=format_version,
        )
        .cdc(op_column="op", key=["id"], order_by="lsn")
    )


def change(i: int, op: str, lsn: int, v: str | None = None) -> dict[str, Any]:
    return {"id": i, "region": "eu", "v": v if v is not None else f"v{i}", "n": i, "lsn": lsn, "op": op}


def write(
    spark: SparkSession, sink: IcebergSink, model: dict[int, dict[str, Any]], changes: list[dict[str, Any]]
) -> None:
    sink.write(frame(spark, changes, partitions=1))
    for c in changes:
        if c["op"] == "D":
            model.pop(c["id"], None)
        else:
            model[c["id"]] = {k: v for k, v in c.items() if k != "op"}


def reread(props: dict[str, str], identifier: str) -> Table:
    return load_catalog("check", **props).load_table(identifier)


def assert_every_reader_reads(
    props: dict[str, str], java_readers: tuple[JavaIcebergReader, ...], table: Table, model: dict[int, dict[str, Any]]
) -> None:
    """Both Javas and DuckDB (straight from S3) and PyIceberg (through the catalog) read the model."""
    want = expected(model)
    if table.format_version == 3:
        assert_row_ids_continue(table)
    assert_readers_agree(java_readers, table.metadata_location, want, ["id"], s3=props)
    assert normalize(table.scan().to_arrow(), ["id"]) == want


def assert_row_ids_continue(table: Table) -> None:
    """The catalog's v3 metadata, as it stored the commits of the sink and of DuckDB: each snapshot's
    ``first-row-id`` is where the previous one's ids ended, and ``next-row-id`` where the last's did."""
    snapshots = sorted((s for s in table.snapshots() if s.first_row_id is not None), key=lambda s: s.sequence_number)
    assert snapshots, "no snapshot with a first-row-id"
    for before, after in itertools.pairwise(snapshots):
        assert before.added_rows is not None
        assert after.first_row_id == before.first_row_id + before.added_rows, (before, after)
    last = snapshots[-1]
    assert last.added_rows is not None and table.metadata.next_row_id == last.first_row_id + last.added_rows


def dvs_by_data_file(table: Table) -> dict[str, DataFileMeta]:
    """The live DVs of main's head by data file; every delete file is a DV and no data file has two."""
    deletes = [d for d, _ in delete_files(table)]
    assert all(d.file_format == "PUFFIN" for d in deletes), [d.path for d in deletes]
    twice = [f for f, n in Counter(d.referenced_data_file for d in deletes).items() if n > 1]
    assert not twice, f"data files with more than one DV: {twice}"
    return {str(d.referenced_data_file): d for d in deletes}


def positions(table: Table, dv: DataFileMeta) -> list[int]:
    assert dv.content_offset is not None and dv.content_size_in_bytes is not None
    return read_deletion_vector(
        table.io, dv.path, dv.content_offset, dv.content_size_in_bytes, dv.record_count
    ).tolist()


def test_duckdb_and_the_sink_merge_each_others_deletion_vectors_on_a_rest_catalog(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    data_bucket: str,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    """A v3 CDC table the sink created on the REST catalog: the sink and DuckDB take turns deleting
    rows of the same data file, each one's new DV carries the other's positions and replaces it, every
    reader reads the model after each turn; then the sink compacts it and every DV is gone."""
    identifier = f"{NAMESPACE}.turns"
    sink = builder(seaweed, "turns", 3).build()
    model: dict[int, dict[str, Any]] = {}
    write(spark, sink, model, [change(i, "I", i) for i in range(1, 11)])  # ids 1..10, positions 0..9
    table = reread(seaweed, identifier)
    assert table.format_version == 3 and table.metadata.next_row_id == 10
    [first] = table.inspect.files()["file_path"].to_pylist()
    assert first.startswith(f"s3://{data_bucket}/")

    # 1. The sink: update id 2, delete id 3 -> its DV on the first file.
    write(spark, sink, model, [change(2, "U", 11, "b2"), change(3, "D", 12)])
    table = reread(seaweed, identifier)
    assert positions(table, dvs_by_data_file(table)[first]) == [1, 2]
    assert_every_reader_reads(seaweed, java_readers, table, model)

    # 2. DuckDB deletes id 4 from the same file: its DV carries the sink's positions and replaces it.
    duck = f"{CATALOG_ALIAS}.{identifier}"
    assert duckdb_rest_execute(seaweed, [f"DELETE FROM {duck} WHERE id = 4"]) == [[(1,)]]
    model.pop(4)
    table = reread(seaweed, identifier)
    duck_dv = dvs_by_data_file(table)[first]
    assert duck_dv.path.endswith("-deletes.puffin"), duck_dv.path  # DuckDB's, not the sink's
    assert positions(table, duck_dv) == [1, 2, 3]
    assert_every_reader_reads(seaweed, java_readers, table, model)

    # 3. The sink again: update id 5, delete id 6 -> one DV holding DuckDB's positions and its own.
    write(spark, sink, model, [change(5, "U", 13, "e2"), change(6, "D", 14)])
    table = reread(seaweed, identifier)
    sink_dv = dvs_by_data_file(table)[first]
    assert sink_dv.path.endswith("-dv.puffin"), sink_dv.path
    assert positions(table, sink_dv) == [1, 2, 3, 4, 5]
    assert_every_reader_reads(seaweed, java_readers, table, model)

    # 4. DuckDB deletes id 7 and updates id 8 (a DV position plus a new data file), over the sink's DV.
    duckdb_rest_execute(seaweed, [f"DELETE FROM {duck} WHERE id = 7", f"UPDATE {duck} SET v = 'h2' WHERE id = 8"])
    model.pop(7)
    model[8] = {**model[8], "v": "h2"}
    table = reread(seaweed, identifier)
    assert positions(table, dvs_by_data_file(table)[first]) == [1, 2, 3, 4, 5, 6, 7]
    assert_every_reader_reads(seaweed, java_readers, table, model)

    # 5. The sink updates id 9 (in the first file) and id 8 (in DuckDB's file): DVs on both files.
    write(spark, sink, model, [change(9, "U", 15, "i2"), change(8, "U", 16, "h3")])
    table = reread(seaweed, identifier)
    dvs = dvs_by_data_file(table)
    assert positions(table, dvs[first]) == [1, 2, 3, 4, 5, 6, 7, 8]
    [duck_file] = [f for f in dvs if f != first]  # DuckDB's data file of id 8, position 0
    assert positions(table, dvs[duck_file]) == [0]
    assert_every_reader_reads(seaweed, java_readers, table, model)

    # 6. The sink compacts: DVs applied and dropped, rows unchanged for every reader.
    result = sink.compact(spark)
    assert result.snapshot_id is not None, result
    table = reread(seaweed, identifier)
    assert delete_files(table) == []
    assert_every_reader_reads(seaweed, java_readers, table, model)


def test_a_v2_rest_table_upgraded_to_v3_takes_dvs_and_compacts(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    data_bucket: str,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    """A v2 CDC table on the REST catalog (equality deletes) is upgraded to v3 by the sink; its next
    checkpoints write DVs beside the old equality deletes, DuckDB deletes too, and a compaction
    applies everything; every reader reads the model at each step."""
    identifier = f"{NAMESPACE}.upgraded"
    sink = builder(seaweed, "upgraded", 2).build()
    model: dict[int, dict[str, Any]] = {}
    write(spark, sink, model, [change(i, "I", i) for i in range(1, 7)])
    write(spark, sink, model, [change(2, "U", 7, "b2"), change(3, "D", 8)])
    table = reread(seaweed, identifier)
    assert table.format_version == 2 and any(d.equality_ids for d, _ in delete_files(table))
    assert_readers_agree(java_readers, table.metadata_location, expected(model), ["id"], s3=seaweed)

    upgraded = sink.upgrade_format_version(3)
    assert upgraded.format_version == 3
    table = reread(seaweed, identifier)
    assert table.format_version == 3 and table.metadata.next_row_id == 0
    assert_readers_agree(java_readers, table.metadata_location, expected(model), ["id"], s3=seaweed)

    write(spark, sink, model, [change(4, "U", 9, "d2"), change(5, "D", 10)])
    table = reread(seaweed, identifier)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.first_row_id == 0
    new_deletes = [d for d, seq in delete_files(table) if seq == snapshot.sequence_number]
    assert new_deletes and all(d.file_format == "PUFFIN" for d in new_deletes)
    assert_readers_agree(java_readers, table.metadata_location, expected(model), ["id"], s3=seaweed)

    duckdb_rest_execute(seaweed, [f"DELETE FROM {CATALOG_ALIAS}.{identifier} WHERE id = 6"])
    model.pop(6)
    table = reread(seaweed, identifier)
    assert_readers_agree(java_readers, table.metadata_location, expected(model), ["id"], s3=seaweed)

    sink.compact(spark)
    table = reread(seaweed, identifier)
    assert delete_files(table) == []
    assert_every_reader_reads(seaweed, java_readers, table, model)


def test_partition_values_with_url_special_characters_on_s3_v3(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    data_bucket: str,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    builder = (
        IcebergSink.builder()
        .catalog("rest", **seaweed)
        .table(f"{NAMESPACE}.special")
        .create_if_missing(
            partition_by=["p"],
            properties={"write.data.path": f"s3://{data_bucket}/{NAMESPACE}/special/data"},
            format_version=3,
        )
        .upsert(key=["id", "p"])
    )
    special_partition_values_round_trip(spark, seaweed, java_readers, builder, f"{NAMESPACE}.special")


def test_a_commit_on_another_branch_between_load_and_commit_is_a_lost_race_on_rest(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    data_bucket: str,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    """Issue 42, item 7: another branch's commit between the sink's load and its commit leaves the
    sink's snapshot with a stale sequence number and first row id. A SQL catalog refuses that with
    PyIceberg's ValueError, which the retry loop took for the lost race it is; a REST catalog answers
    HTTP 400 (BadRequestError), which failed the stream. Both are retried now, on the table as it is."""
    identifier = f"{NAMESPACE}.branches"
    armed: list[bool] = []

    def other_branch(summary: Any) -> dict[str, str]:
        if armed:  # once: another job commits to branch "audit" of the same table first
            armed.clear()
            audit = builder(seaweed, "branches", 3).branch("audit").build()
            write(spark, audit, {}, [change(100, "I", 100)])
        return {}

    sink = builder(seaweed, "branches", 3).pre_commit_hook(other_branch).build()
    model: dict[int, dict[str, Any]] = {}
    write(spark, sink, model, [change(i, "I", i) for i in range(1, 4)])
    armed.append(True)
    write(spark, sink, model, [change(2, "U", 11, "b2"), change(4, "I", 12)])
    table = reread(seaweed, identifier)
    assert sink.metrics().commit_conflict_retries >= 1
    assert_every_reader_reads(seaweed, java_readers, table, model)
    assert "audit" in table.metadata.refs
