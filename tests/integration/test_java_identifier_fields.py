"""Iceberg Java 1.6 to 1.9 refuses every merge-on-read ``DELETE``, ``UPDATE`` and ``MERGE`` on a table
with identifier fields (apache/iceberg #11709: "Cannot add fieldId 1 as an identifier field: field
does not exist"), and the upsert/CDC tables the sink creates have them. Reproduced here with the real
Iceberg Java 1.9.2 (Spark 3.5), with its two ways out, and checked fixed in the newest Iceberg Java:

- ``ALTER TABLE ... DROP IDENTIFIER FIELDS`` on an existing table, after which the sink keeps
  upserting by the key its builder names;
- ``create_if_missing(identifier_fields=False)``: the table is created without them, Java's
  row-level commands work, and the sink (restarted too) upserts into it by the builder's key.

Java commits through a JDBC catalog of its own (on its own SQLite file, registered from the sink's
table metadata), then the sink's catalog is pointed at Java's newest metadata file, as if Java had
committed to the same catalog (a SQLite catalog shared with a Java session would lock the sink out:
docs/troubleshooting.md#sqlite-catalog-locked).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidSinkConfigError
from iceberg_sink.builder import IcebergSinkBuilder
from tests.interop.readers import JavaIcebergReader, JavaReaderError, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

MERGE_ON_READ = {
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}
JAVA_BUG = "Cannot add fieldId 1 as an identifier field: field does not exist"
_RUNS = itertools.count()


def props(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "wh").mkdir(exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}


def builder(tmp_path: Path, format_version: int | None, identifier_fields: bool = True) -> IcebergSinkBuilder:
    return (
        IcebergSink.builder()
        .catalog("local", **props(tmp_path))
        .table("db.t")
        .create_if_missing(properties=MERGE_ON_READ, format_version=format_version, identifier_fields=identifier_fields)
        .upsert(key=["id"])
    )


def upsert(spark: SparkSession, sink: IcebergSink, tmp_path: Path, rows: dict[int, str]) -> None:
    df = spark.createDataFrame(sorted(rows.items()), "id long, v string")
    sink.write(df, checkpoint_location=str(tmp_path / "ckpt"))


def java_runs(java: JavaIcebergReader, tmp_path: Path, *statements: str) -> None:
    """Iceberg Java runs ``statements`` (``{t}``: the table) on the sink's table through a JDBC catalog
    of its own, then the sink's catalog points ``db.t`` at Java's newest metadata file. A statement
    Java refuses raises JavaReaderError and changes nothing."""
    catalog = load_catalog("local", **props(tmp_path))
    table = catalog.load_table("db.t")
    run = next(_RUNS)
    jdbc = java.catalog(tmp_path / f"java-wh-{run}", jdbc_uri=f"jdbc:sqlite:file:{tmp_path}/java-catalog-{run}.db")
    java.sql(f"CREATE NAMESPACE IF NOT EXISTS {jdbc}.db")
    java.sql(f"CALL {jdbc}.system.register_table(table => 'db.t', metadata_file => '{table.metadata_location}')")
    for statement in statements:
        java.sql(statement.format(t=f"{jdbc}.db.t"))
    newest = max(
        (Path(table.location().removeprefix("file://")) / "metadata").glob("*.metadata.json"),
        key=lambda p: p.stat().st_mtime_ns,
    )
    if newest.as_uri() != table.metadata_location:
        catalog.drop_table("db.t")
        catalog.register_table("db.t", newest.as_uri())


def assert_table(sink: IcebergSink, java: JavaIcebergReader, model: dict[int, str]) -> None:
    want = normalize(pa.Table.from_pylist([{"id": i, "v": v} for i, v in sorted(model.items())]), ["id"])
    location = sink.load_table().metadata_location
    assert normalize(java.read(location), ["id"]) == want
    assert normalize(duckdb_read(location), ["id"]) == want
    if sink.load_table().metadata.format_version == 3:  # PyIceberg 0.12 cannot read v2's equality deletes
        assert normalize(pyiceberg_read(location), ["id"]) == want


def identifier_fields(sink: IcebergSink) -> list[int]:
    return list(sink.load_table().schema().identifier_field_ids)


def test_java_19_refuses_row_level_commands_on_a_table_with_identifier_fields_until_they_are_dropped(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = builder(tmp_path, format_version=2).build()
    model = {1: "a", 2: "b", 3: "c"}
    upsert(spark, sink, tmp_path, model)
    assert identifier_fields(sink) == [1]
    with pytest.raises(JavaReaderError, match=JAVA_BUG):
        java_runs(java_reader, tmp_path, "DELETE FROM {t} WHERE id = 2")
    # The workaround for an existing table: drop its identifier fields; the sink's key is the builder's.
    java_runs(java_reader, tmp_path, "ALTER TABLE {t} DROP IDENTIFIER FIELDS id", "DELETE FROM {t} WHERE id = 2")
    del model[2]
    assert identifier_fields(sink) == []
    sink = builder(tmp_path, format_version=2).build()
    upsert(spark, sink, tmp_path, {3: "c2", 4: "d"})
    model |= {3: "c2", 4: "d"}
    assert_table(sink, java_reader, model)


def test_a_table_created_without_identifier_fields_takes_java_19s_row_level_commands_and_the_sinks_upserts(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = builder(tmp_path, format_version=2, identifier_fields=False).build()
    model = {1: "a", 2: "b", 3: "c", 4: "d"}
    upsert(spark, sink, tmp_path, model)
    table = sink.load_table()
    assert identifier_fields(sink) == [] and table.schema().find_field("id").required
    java_runs(
        java_reader,
        tmp_path,
        "DELETE FROM {t} WHERE id = 2",
        "UPDATE {t} SET v = 'c-java' WHERE id = 3",
        "MERGE INTO {t} USING (SELECT 4L AS id, 'd-java' AS v UNION ALL SELECT 5L, 'e-java') s ON {t}.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *",
    )
    del model[2]
    model |= {3: "c-java", 4: "d-java", 5: "e-java"}
    files = sink.load_table().inspect.delete_files().to_pylist()
    assert {f["content"] for f in files} == {1}  # Java's position deletes (merge-on-read), not a rewrite
    # The sink goes on after Java's commits, then again as a restarted driver (a new sink, same
    # checkpoint location): its upserts replace Java's rows by the builder's key.
    upsert(spark, sink, tmp_path, {3: "c2", 5: "e2", 6: "f"})
    model |= {3: "c2", 5: "e2", 6: "f"}
    restarted = builder(tmp_path, format_version=2, identifier_fields=False).build()
    upsert(spark, restarted, tmp_path, {1: "a2", 5: "e3"})
    model |= {1: "a2", 5: "e3"}
    assert identifier_fields(restarted) == []
    assert_table(restarted, java_reader, model)


def test_without_identifier_fields_the_key_must_come_from_the_builder(tmp_path: Path) -> None:
    def base() -> IcebergSinkBuilder:
        return IcebergSink.builder().catalog("local", **props(tmp_path)).table("db.t")

    for changes, received in [
        (base().create_if_missing(identifier_fields=False).upsert(), "received key=None, key_column=None"),
        (
            IcebergSink.builder()
            .catalog("local", **props(tmp_path))
            .route(table_column="tbl", namespace="db")
            .create_if_missing(identifier_fields=False)
            .upsert(key=["id"], key_column="pk"),
            "received key=['id'], key_column='pk'",
        ),
    ]:
        with pytest.raises(
            InvalidSinkConfigError, match=re.escape("expected .upsert/.cdc(key=[...]) without key_column")
        ) as e:
            changes.build()
        assert received in str(e.value)
    with pytest.raises(
        InvalidSinkConfigError, match=re.escape("identifier_fields): expected True or False, received 'no'")
    ):
        base().create_if_missing(identifier_fields="no").upsert(key=["id"]).build()  # type: ignore[arg-type]


def test_a_null_key_is_refused_as_a_null_key_on_a_table_without_identifier_fields(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Its key columns are required but not identifier fields: a row with a null key goes to the
    dead-letter table as the NullKeyError it is (as on a table with them), not as a required column."""
    sink = builder(tmp_path, format_version=None, identifier_fields=False).dead_letter("db.errors").build()
    upsert(spark, sink, tmp_path, {1: "a"})
    df = spark.createDataFrame([(None, "b"), (2, "c")], "id long, v string")
    sink.write(df, checkpoint_location=str(tmp_path / "ckpt"))
    errors = sink.load_table("db.errors").scan().to_arrow().to_pylist()
    assert [(e["error_class"], e["raw"]) for e in errors] == [("NullKeyError", '{"id":null,"v":"b"}')]
    assert sorted(r["id"] for r in sink.load_table().scan().to_arrow().to_pylist()) == [1, 2]


def test_the_newest_iceberg_java_runs_row_level_commands_on_the_sinks_default_tables(
    spark: SparkSession, java_newest_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Fixed in Iceberg Java after 1.9 (apache/iceberg #13435): the newest runs merge-on-read
    commands on a table with identifier fields, here the sink's default upsert table (v3)."""
    sink = builder(tmp_path, format_version=None).build()
    model: dict[int, Any] = {1: "a", 2: "b", 3: "c"}
    upsert(spark, sink, tmp_path, model)
    assert identifier_fields(sink) == [1] and sink.load_table().metadata.format_version == 3
    java_runs(java_newest_reader, tmp_path, "DELETE FROM {t} WHERE id = 2", "UPDATE {t} SET v = 'c-java' WHERE id = 3")
    del model[2]
    model[3] = "c-java"
    upsert(spark, sink, tmp_path, {1: "a2", 4: "d"})
    model |= {1: "a2", 4: "d"}
    assert identifier_fields(sink) == [1]
    assert_table(sink, java_newest_reader, model)
