"""The format version ``create_if_missing()`` gives a table when none is given (issue 42 item 13).

Upsert and CDC tables (Debezium's and routed ones too) are created at format v3, whose deletion
vectors PyIceberg reads: ``table.scan().to_arrow()`` works on them as they are, where a v2 table's
equality deletes make it raise. Append tables (a dead-letter table too) stay at v2, which more
engines read and write. An explicit ``format_version`` always wins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import DataFileContent, FileFormat
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink._iceberg.lineage import read_entries, read_manifests

DDL = "id long, v string, lsn long, op string"
# Three checkpoints: inserts; updates and deletes of rows of the first (and a key inserted then
# deleted in one batch); an update of a key updated before, a delete, a re-insert of a deleted key.
BATCHES = [
    [(1, "a", 1, "I"), (2, "b", 2, "I"), (3, "c", 3, "I"), (4, "d", 4, "I")],
    [(2, "b2", 5, "U"), (3, None, 6, "D"), (5, "e", 7, "I"), (5, None, 8, "D"), (1, "a2", 9, "U")],
    [(2, "b3", 10, "U"), (4, None, 11, "D"), (3, "c2", 12, "I")],
]
EXPECTED = [{"id": 1, "v": "a2"}, {"id": 2, "v": "b3"}, {"id": 3, "v": "c2"}]


def delete_files(table: Table) -> list[tuple[DataFileContent, FileFormat]]:
    """(content, format) of every live delete file of the table's current snapshot."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    version = table.metadata.format_version
    return [
        (entry.data_file.content, entry.data_file.file_format)
        for manifest in read_manifests(table.io, snapshot, version)
        for entry in read_entries(table.io, manifest, format_version=version)
        if entry.data_file.content != DataFileContent.DATA
    ]


def write_changes(spark: SparkSession, sink: IcebergSink, table: str | None = None, upsert: bool = False) -> None:
    for batch in BATCHES:
        rows = [r for r in batch if r[3] != "D"] if upsert else batch
        if table is not None:
            rows = [(table, *r) for r in rows]
        ddl = f"tbl string, {DDL}" if table is not None else DDL
        df = spark.createDataFrame(rows, ddl)
        sink.write(df.drop("op") if upsert else df)


def pyiceberg_rows(table: Table) -> list[dict[str, Any]]:
    return sorted(table.scan().to_arrow().select(["id", "v"]).to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize("mode", ["cdc", "upsert"])
def test_an_upsert_or_cdc_table_created_by_default_is_v3_and_pyiceberg_reads_it(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing()
    if mode == "cdc":
        sink = builder.cdc(op_column="op", key=["id"], order_by="lsn").build()
    else:
        sink = builder.upsert(key=["id"], order_by="lsn").build()
    assert sink.config.create is not None and sink.config.create.format_version == 3
    write_changes(spark, sink, upsert=mode == "upsert")
    table = sink.load_table()
    assert table.metadata.format_version == 3
    # Updates and deletes of earlier checkpoints' rows are deletion vectors, never equality deletes.
    deletes = delete_files(table)
    assert deletes and set(deletes) == {(DataFileContent.POSITION_DELETES, FileFormat.PUFFIN)}
    if mode == "cdc":
        assert pyiceberg_rows(table) == EXPECTED
    else:  # no deletes: key 3 keeps its first row until re-written, key 4 stays, key 5 is written
        assert pyiceberg_rows(table) == [
            {"id": 1, "v": "a2"},
            {"id": 2, "v": "b3"},
            {"id": 3, "v": "c2"},
            {"id": 4, "v": "d"},
            {"id": 5, "v": "e"},
        ]


def test_an_explicit_format_version_2_gives_a_v2_cdc_table_with_equality_deletes(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing(format_version=2)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    write_changes(spark, sink)
    table = sink.load_table()
    assert table.metadata.format_version == 2
    assert {content for content, _ in delete_files(table)} == {DataFileContent.EQUALITY_DELETES}
    # What the v3 default is for: PyIceberg 0.12 reads no equality deletes.
    with pytest.raises(ValueError, match="equality delete"):
        table.scan().to_arrow()
    sink.compact(spark)  # applies them
    assert pyiceberg_rows(sink.load_table()) == EXPECTED


def test_append_tables_stay_v2_by_default_and_take_an_explicit_version(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")
    for name, version, expected in (("db.plain", None, 2), ("db.v3", 3, 3), ("db.v1", 1, 1)):
        sink = IcebergSink.builder().embedded(tmp_path / "lake").table(name).create_if_missing(format_version=version)
        built = sink.build()
        built.write(df)
        table = built.load_table()
        assert table.metadata.format_version == expected, name
        assert pyiceberg_rows(table) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]


def test_routed_cdc_tables_are_v3_and_their_dead_letter_table_v2(spark: SparkSession, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    sink = (
        IcebergSink.builder()
        .embedded(lake)
        .route(table_column="tbl", namespace="r")
        .create_if_missing()
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .dead_letter("r.errors")
        .build()
    )
    write_changes(spark, sink, table="a")
    # One more batch: changes of a second table, and a refused row (a null key) for the dead letters.
    rows = [("b", 1, "x", 1, "I"), ("b", 2, "y", 2, "I"), ("a", None, "nokey", 13, "I")]
    sink.write(spark.createDataFrame(rows, f"tbl string, {DDL}"))
    sink.write(spark.createDataFrame([("b", 1, None, 3, "D")], f"tbl string, {DDL}"))
    a, b, errors = (sink.load_table(name) for name in ("r.a", "r.b", "r.errors"))
    assert (a.metadata.format_version, b.metadata.format_version, errors.metadata.format_version) == (3, 3, 2)
    assert pyiceberg_rows(a) == EXPECTED
    assert pyiceberg_rows(b) == [{"id": 2, "v": "y"}]
    refused = errors.scan().to_arrow().to_pylist()
    assert [(r["error_class"], json.loads(r["raw"])["v"]) for r in refused] == [("NullKeyError", "nokey")]

    # A routed append sink's tables stay v2.
    appends = IcebergSink.builder().embedded(lake).route(table_column="tbl", namespace="p").create_if_missing().build()
    appends.write(spark.createDataFrame([("c", 1, "x")], "tbl string, id long, v string"))
    assert appends.load_table("p.c").metadata.format_version == 2


def test_a_debezium_cdc_table_created_by_default_is_v3_and_pyiceberg_reads_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    def event(op: str, lsn: int, before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[str]:
        source = {"db": "inventory", "table": "customers", "lsn": lsn}
        return (json.dumps({"before": before, "after": after, "op": op, "source": source}),)

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("inventory.customers")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    sink.write(
        spark.createDataFrame(
            [event("c", 1, None, {"id": 1, "v": "a"}), event("c", 2, None, {"id": 2, "v": "b"})], "value string"
        )
    )
    sink.write(
        spark.createDataFrame(
            [event("u", 3, {"id": 1, "v": "a"}, {"id": 1, "v": "a2"}), event("d", 4, {"id": 2, "v": "b"}, None)],
            "value string",
        )
    )
    table = sink.load_table()
    assert table.metadata.format_version == 3
    assert pyiceberg_rows(table) == [{"id": 1, "v": "a2"}]
