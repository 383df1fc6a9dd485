"""Data files without Iceberg field ids: added by ``add_files`` (PyIceberg's, Spark's procedure) or a
migration from Hive or plain Parquet. Readers match their columns through the table's name mapping
(``schema.name-mapping.default``), which keeps a column's old names when it is renamed.

The sink read such files by field id only: compaction failed in its Spark tasks ("Parquet file does
not have field-ids and the Iceberg table does not have 'schema.name-mapping.default' defined",
though the table had one), every v3 upsert failed (its deletes are resolved through the key index,
which reads the added file's keys), and so did TOAST lookups. Now every read of a file's rows goes
through the table's mapping (``_iceberg/projection.read_projected``). Here the key and a value column
are renamed after the files were added, so a read by the current names would find nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.table.lookup import stored_rows
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read


@pytest.mark.parametrize("format_version", [2, 3])
def test_files_without_field_ids_are_read_through_the_name_mapping(
    spark: SparkSession, tmp_path: Path, java_readers: list[JavaIcebergReader], format_version: int
) -> None:
    lake = tmp_path / "lake"
    catalog = IcebergSink.builder().embedded(lake).table("db.t").create_if_missing().build().config.catalog.load()
    catalog.create_namespace("db")
    table = catalog.create_table(
        "db.t",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "v", StringType()),
            NestedField(3, "note", StringType()),
            identifier_field_ids=[1],
        ),
        properties={"format-version": "2"},
    )
    migrated = tmp_path / "migrated.parquet"  # a plain Parquet file: no field ids
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string()), ("note", pa.string())])
    pq.write_table(
        pa.table({"id": [1, 2, 3, 4], "v": ["a", "b", "c", "d"], "note": ["n1", None, "n3", "n4"]}, schema), migrated
    )
    table.add_files([str(migrated)])
    assert "schema.name-mapping.default" in catalog.load_table("db.t").properties
    with catalog.load_table("db.t").update_schema() as update:  # the mapping keeps the old names
        update.rename_column("id", "key_id")
        update.rename_column("v", "value")

    sink = IcebergSink.builder().embedded(lake).table("db.t").upsert(key=["key_id"]).build()
    if format_version == 3:
        sink.upgrade_format_version(3)
    model = {1: ("a", "n1"), 2: ("b", None), 3: ("c", "n3"), 4: ("d", "n4")}
    # Updates of migrated rows: v3 resolves them through the key index, which reads the migrated file.
    sink.write(spark.createDataFrame([(2, "B", "m2"), (5, "e", None)], "key_id long, value string, note string"))
    model.update({2: ("B", "m2"), 5: ("e", None)})
    sink.write(spark.createDataFrame([(3, "C", "m3")], "key_id long, value string, note string"))
    model[3] = ("C", "m3")

    def live() -> list[dict[str, object]]:
        return [{"key_id": k, "value": v, "note": n} for k, (v, n) in model.items()]

    table = sink.load_table()
    assert_readers_agree(java_readers, table.metadata_location, live(), ["key_id"])
    # The stored values a TOAST lookup reads, from the migrated file for keys 1 and 4.
    rows, _ = stored_rows(table, "main", ["key_id"], [(1,), (4,), (2,)], ["value", "note"])
    assert sorted(rows) == [(1, "a", "n1"), (2, "B", "m2"), (4, "d", "n4")]

    result = sink.compact(spark)
    assert result.committed_groups >= 1 and result.rewritten_data_files >= 2, result
    table = sink.load_table()
    assert_readers_agree(java_readers, table.metadata_location, live(), ["key_id"])
    if format_version == 3:  # PyIceberg reads DVs, not equality deletes
        assert normalize(pyiceberg_read(table.metadata_location), ["key_id"]) == normalize(
            pa.Table.from_pylist(live()), ["key_id"]
        )
