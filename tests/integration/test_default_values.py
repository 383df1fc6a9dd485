"""Format v3 default values: a column the input lacks gets its ``write-default``, as the spec says
("the write default for a field must be written if a field is not supplied to a write") and Iceberg
Java's writers do; a null the input holds stays null; rows written before a column was added read
its ``initial-default``, also after the sink's compaction rewrote their files.

The defaults are set by the newest Iceberg Java's ``UpdateSchema`` (Spark SQL cannot set them, and
PyIceberg 0.12 cannot commit to a v3 table by itself), or for the routed tables by PyIceberg's
``UpdateSchema`` committed through the sink's v3 metadata writer; every stage is read back by Iceberg
Java 1.9.2, the newest Iceberg Java, DuckDB and PyIceberg.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.types import IntegerType
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink
from iceberg_sink.topology.compaction import CompactionConfig
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

INITIAL_C, WRITE_C = 7, 9  # c's initial-default, and the write-default it is changed to
DAY = dt.date(2024, 2, 29)


def _readers_agree(java_readers: tuple[JavaIcebergReader, ...], location: str, want: list[dict[str, Any]]) -> None:
    assert_readers_agree(java_readers, location, want, ["id"])
    assert normalize(pyiceberg_read(location), ["id"]) == normalize(pa.Table.from_pylist(want), ["id"])


def _row(i: int, s: str, c: int | None, d: dt.date | None, r: str) -> dict[str, Any]:
    return {"id": i, "s": s, "c": c, "d": d, "r": r}


def test_missing_columns_take_their_write_default_and_old_rows_their_initial_default(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    java = java_readers[-1]
    warehouse = tmp_path / "java-warehouse"
    jw = java.catalog(warehouse)
    java.sql(
        f"CREATE TABLE {jw}.db.t (id bigint NOT NULL, s string) USING iceberg "
        "TBLPROPERTIES ('format-version'='3', 'write.delete.mode'='merge-on-read')"
    )
    java.sql(f"INSERT INTO {jw}.db.t VALUES (1, 'a'), (2, 'b')")
    java.column_default(f"{jw}.db.t", "c", "int", INITIAL_C)
    java.column_default(f"{jw}.db.t", "c", "int", WRITE_C, change=True)  # the initial-default stays 7
    java.column_default(f"{jw}.db.t", "d", "date", DAY.isoformat())
    java.column_default(f"{jw}.db.t", "r", "string", "dflt", required=True)
    metadata = max((warehouse / "db" / "t" / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:-14]))
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    catalog = load_catalog("t", **props)
    catalog.create_namespace("db")
    catalog.register_table("db.t", metadata.as_uri())
    fields = {f.name: f for f in catalog.load_table("db.t").schema().fields}
    assert (fields["c"].initial_default, fields["c"].write_default) == (INITIAL_C, WRITE_C)
    assert (fields["r"].required, fields["r"].write_default) == (True, "dflt")

    def frame(data: list[tuple[Any, ...]], ddl: str) -> Any:
        df = spark.createDataFrame(data, ddl)
        # Not null, as the table's id and r are (the data has no nulls there).
        df = df.withColumn("id", F.coalesce("id", F.lit(0).cast("bigint")))
        return df.withColumn("r", F.coalesce("r", F.lit("?"))) if "r" in df.columns else df

    appends = IcebergSink.builder().catalog("t", **props).table("db.t").build()
    # Neither c, d nor the required r supplied: all three take their write-defaults.
    appends.write(frame([(3, "c"), (4, "d")], "id long, s string"))
    # c supplied as null stays null; d and r supplied keep their values.
    appends.write(frame([(5, "e", None, dt.date(2020, 1, 1), "x")], "id long, s string, c int, d date, r string"))
    want = {
        1: _row(1, "a", INITIAL_C, DAY, "dflt"),
        2: _row(2, "b", INITIAL_C, DAY, "dflt"),
        3: _row(3, "c", WRITE_C, DAY, "dflt"),
        4: _row(4, "d", WRITE_C, DAY, "dflt"),
        5: _row(5, "e", None, dt.date(2020, 1, 1), "x"),
    }
    _readers_agree(java_readers, appends.load_table().metadata_location, list(want.values()))

    # An upsert of Java's row 1 and the sink's row 4, without c: the new rows take the write-default
    # (a deletion vector removes the old ones on this v3 table).
    upserts = IcebergSink.builder().catalog("t", **props).table("db.t").upsert(key=["id"]).build()
    upserts.write(frame([(1, "a2", "r1"), (4, "d2", "r4")], "id long, s string, r string"))
    want[1] = _row(1, "a2", WRITE_C, DAY, "r1")
    want[4] = _row(4, "d2", WRITE_C, DAY, "r4")
    _readers_agree(java_readers, upserts.load_table().metadata_location, list(want.values()))

    # Compaction rewrites Java's file (which has no c, d or r): its rows keep their initial-defaults,
    # now written into the new file.
    before = {t.file.file_path for t in upserts.load_table().scan().plan_files()}
    upserts.compact(spark, CompactionConfig(min_input_files=1, delete_file_threshold=1))
    table = upserts.load_table()
    after = {t.file.file_path for t in table.scan().plan_files()}
    assert after.isdisjoint(before), "every file was rewritten"
    _readers_agree(java_readers, table.metadata_location, list(want.values()))


def test_routed_tables_take_their_own_write_defaults(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path
) -> None:
    """A routed sink writes each table through its own schema: the table with a defaulted column
    gets the default in the rows the DataFrame sends it, the other table is unchanged. (The default
    is added with PyIceberg's UpdateSchema, committed through the sink's v3 metadata writer.)"""
    from iceberg_sink._iceberg.v3_metadata import v3_metadata_writes

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/cat.db", "warehouse": (tmp_path / "wh").as_uri()}
    sink = (
        IcebergSink.builder()
        .catalog("t", **props)
        .route(table_column="tbl", namespace="rd")
        .create_if_missing(format_version=3)
        .build()
    )
    ddl = "tbl string, id long, s string"
    sink.write(spark.createDataFrame([("a", 1, "x"), ("b", 2, "y")], ddl), str(tmp_path / "ck"))
    catalog = load_catalog("t", **props)
    with v3_metadata_writes():
        catalog.load_table("rd.a").update_schema().add_column("c", IntegerType(), default_value=5).commit()
    sink.write(spark.createDataFrame([("a", 3, "z"), ("b", 4, "w")], ddl), str(tmp_path / "ck"))
    a = catalog.load_table("rd.a")
    assert [f.name for f in a.schema().fields] == ["id", "s", "c"]
    want_a = [{"id": 1, "s": "x", "c": 5}, {"id": 3, "s": "z", "c": 5}]
    _readers_agree(java_readers, a.metadata_location, want_a)
    want_b = [{"id": 2, "s": "y"}, {"id": 4, "s": "w"}]
    _readers_agree(java_readers, catalog.load_table("rd.b").metadata_location, want_b)
