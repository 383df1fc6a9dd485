"""Schema evolution in flight (table/evolution.py) and the JSON payload reader (readers.py).

Every table is read back by Apache Iceberg Java and DuckDB and compared with a model: the rows
written so far, with null for the columns a row did not carry.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, SchemaMismatchError, _faults
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink.sources.readers import read_json
from iceberg_sink.table import evolution
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop


def check_readers(java_reader: JavaIcebergReader, table: Any, model: list[dict[str, Any]]) -> None:
    """Iceberg Java and DuckDB read exactly ``model`` (missing columns of a model row are null)."""
    java = normalize(java_reader.read(table.metadata_location), ["id"])
    duck = normalize(duckdb_read(table.metadata_location), ["id"])
    columns = [f.name for f in table.schema().fields]
    want = sorted(({c: row.get(c) for c in columns} for row in model), key=lambda r: r["id"])
    assert java == want
    assert duck == want


def json_files(folder: Path, batches: list[list[dict[str, Any]]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, docs in enumerate(batches):
        path = folder / f"batch-{i:03d}.json"
        path.write_text("".join(json.dumps({"value": json.dumps(d)}) + "\n" for d in docs))
        # Spark's file source takes files in modification-time order: one second apart.
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def with_address(row: dict[str, Any]) -> dict[str, Any]:
    """The model row as the table holds it: a nested struct with every field of its evolved type."""
    out = dict(row)
    if "address" in out and out["address"] is not None:
        out["address"] = {"city": out["address"].get("city"), "zip": out["address"].get("zip")}
    return out


def test_json_stream_adds_columns_and_nested_fields_mid_stream(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    batches: list[list[dict[str, Any]]] = [
        [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
        # Documents of one batch differ: the batch's union schema adds both columns at once.
        [{"id": 3, "name": "c", "email": "c@x"}, {"id": 4, "address": {"city": "Oslo"}}],
        # A nested field appears in a struct the table already has.
        [{"id": 5, "address": {"city": "Rome", "zip": "00100"}, "email": "e@x"}, {"id": 6, "name": "f"}],
    ]
    json_files(tmp_path / "src", batches)
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.people")
        .create_if_missing()
        .schema_evolution("add-columns")
        .map_batches(lambda b: read_json(b, "value"))
        .build()
    )
    stream = spark.readStream.schema("value string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "src"))
    query = sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination()
    table = sink.load_table()
    schema = table.schema()
    assert [f.name for f in schema.fields] == ["id", "name", "email", "address"]
    address = schema.find_field("address")
    assert not address.required and isinstance(address.field_type, StructType)
    assert [f.name for f in address.field_type.fields] == ["city", "zip"]
    assert all(not f.required for f in schema.fields)
    assert len(table.snapshots()) == 3
    # One schema per batch that changed it: the initial one, +email/address, +address.zip.
    assert len(table.schemas()) == 3
    check_readers(java_reader, table, [with_address(r) for b in batches for r in b])


def base_table(catalog: Catalog, name: str = "db.t") -> Any:
    catalog.create_namespace_if_not_exists("db")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "qty", IntegerType(), required=False),
        NestedField(3, "price", DecimalType(10, 2), required=False),
        NestedField(4, "score", FloatType(), required=False),
        NestedField(5, "label", StringType(), required=False),
        NestedField(6, "must", StringType(), required=True),
    )
    return catalog.create_table(name, schema)


def sink_for(catalog_props: dict[str, str], mode: str | None, table: str = "db.t") -> IcebergSink:
    builder = IcebergSink.builder().catalog("test", **catalog_props).table(table)
    if mode is not None:
        builder = builder.schema_evolution(mode)
    return builder.build()


BASE_DDL = "id long not null, qty int, price decimal(10,2), score float, label string, must string not null"


def strict(df: DataFrame) -> DataFrame:
    """``df`` with its columns the table requires made non-nullable (no null is in them)."""
    if "id" in df.columns:
        df = df.withColumn("id", F.coalesce(F.col("id").cast("long"), F.lit(0).cast("long")))
    if "must" in df.columns:
        df = df.withColumn("must", F.coalesce(F.col("must"), F.lit("")))
    return df


def base_rows(spark: SparkSession) -> DataFrame:
    return strict(
        spark.createDataFrame(
            [(1, 1, 1.5, 0.5, "x", "m")], "id long, qty int, price double, score double, label string, must string"
        ).select(
            F.col("id"),
            F.col("qty"),
            F.col("price").cast("decimal(10,2)").alias("price"),
            F.col("score").cast("float").alias("score"),
            F.col("label"),
            F.col("must"),
        )
    )


def test_widening_along_iceberg_promotions_only_in_add_and_widen(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    catalog: Catalog,
    catalog_props: dict[str, str],
    tmp_path: Path,
) -> None:
    base_table(catalog)
    sink_for(catalog_props, "add-columns").write(base_rows(spark))
    wide = strict(
        spark.createDataFrame(
            [(2, 2**40, "12345678901.25", 0.25, "y", "n", "new")],
            "id long, qty long, price string, score double, label string, must string, extra string",
        )
    ).withColumn("price", F.col("price").cast("decimal(14,2)"))
    before = catalog.load_table("db.t")
    # add-columns does not widen: the error names the table and every column, nothing changes.
    with pytest.raises(SchemaMismatchError) as info:
        sink_for(catalog_props, "add-columns").write(wide)
    text = str(info.value)
    assert "table db.t" in text
    for column in ("qty: the DataFrame's type long is wider than the table's int", "price:", "score:"):
        assert column in text
    after = catalog.load_table("db.t")
    assert after.metadata.current_schema_id == before.metadata.current_schema_id
    assert len(after.snapshots()) == 1

    sink_for(catalog_props, "add-and-widen").write(wide)
    table = catalog.load_table("db.t")
    schema = table.schema()
    assert schema.find_field("qty").field_type == LongType()
    assert schema.find_field("price").field_type == DecimalType(14, 2)
    assert schema.find_field("score").field_type == DoubleType()
    assert schema.find_field("extra").field_type == StringType() and not schema.find_field("extra").required
    # Field ids kept: the old files read through the promotion.
    assert [schema.find_field(c).field_id for c in ("id", "qty", "price", "score")] == [1, 2, 3, 4]
    from decimal import Decimal

    model = [
        {"id": 1, "qty": 1, "price": Decimal("1.50"), "score": 0.5, "label": "x", "must": "m", "extra": None},
        {
            "id": 2,
            "qty": 2**40,
            "price": Decimal("12345678901.25"),
            "score": 0.25,
            "label": "y",
            "must": "n",
            "extra": "new",
        },
    ]
    check_readers(java_reader, table, model)
    # A narrower batch afterwards is written as is (the writer casts int to long).
    sink_for(catalog_props, "add-and-widen").write(base_rows(spark).withColumn("id", F.lit(3).cast("long")))
    model.append({**model[0], "id": 3})
    check_readers(java_reader, catalog.load_table("db.t"), model)


@pytest.mark.parametrize(
    ("ddl", "expected"),
    [
        # string into an int column: no promotion exists
        ("id long, qty string, must string, extra string", "qty: table type int cannot take DataFrame type string"),
        # a decimal's scale never changes
        ("id long, price decimal(12,4), must string, extra string", "price: table type decimal(10, 2) cannot take"),
        # long into a string column
        ("id long, label long, must string, extra string", "label: table type string cannot take DataFrame type long"),
        # a required table column missing from the batch
        ("id long, qty int, extra string", "must: column is required in the table but missing from the DataFrame"),
        # a case-only clash is not a new column
        (
            "id long, must string, LABEL string, extra string",
            "LABEL: column is not in the table (the table has 'label'",
        ),
    ],
)
def test_illegal_changes_fail_before_anything_is_committed(
    spark: SparkSession, catalog: Catalog, catalog_props: dict[str, str], ddl: str, expected: str
) -> None:
    base_table(catalog)
    before = catalog.load_table("db.t")
    empty = spark.createDataFrame([], ddl)
    rows = [tuple(None for _ in empty.schema.fields)]
    df = strict(spark.createDataFrame(rows, ddl))
    with pytest.raises(SchemaMismatchError) as info:
        sink_for(catalog_props, "add-and-widen").write(df)
    text = str(info.value)
    assert "table db.t" in text
    assert expected in text
    after = catalog.load_table("db.t")
    # The legal part (column "extra") was not committed either: the table is unchanged.
    assert after.metadata.current_schema_id == before.metadata.current_schema_id
    assert after.schema() == before.schema()
    assert after.snapshots() == []


def test_new_required_column_is_refused(spark: SparkSession, catalog: Catalog, catalog_props: dict[str, str]) -> None:
    base_table(catalog)
    df = base_rows(spark).withColumn("flag", F.lit(True))  # a literal: not nullable in Spark
    assert not df.schema["flag"].nullable
    with pytest.raises(SchemaMismatchError, match=r"table db\.t[\s\S]*flag: new column is required"):
        sink_for(catalog_props, "add-columns").write(df)
    assert "flag" not in catalog.load_table("db.t").schema().column_names


def test_off_is_the_default_and_lists_extra_columns(
    spark: SparkSession, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    base_table(catalog)
    df = base_rows(spark).withColumn("extra", F.lit(None).cast("string"))
    for mode in (None, "off"):
        with pytest.raises(SchemaMismatchError, match="extra: column is not in the table"):
            sink_for(catalog_props, mode).write(df)
    assert "extra" not in catalog.load_table("db.t").schema().column_names
    with pytest.raises(InvalidSinkConfigError, match=r"iceberg-sink\.schema-evolution"):
        sink_for(catalog_props, "add-everything")


def test_json_batch_with_conflicting_types_names_the_column(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [
            (json.dumps({"id": 1, "v": 5}),),
            (json.dumps({"id": 2, "v": "five"}),),
            (json.dumps({"id": 3, "n": 1}),),
            (json.dumps({"id": 4, "n": 1.5}),),
        ],
        "value string",
    )
    with pytest.raises(InvalidInputError, match=r"v: is long in some documents, string in others"):
        read_json(df, "value")
    # An integer and a fractional number are both JSON numbers: double.
    parsed = read_json(df.where(F.col("value").contains('"n"')), "value")
    assert parsed.schema["n"].dataType.simpleString() == "double"
    with pytest.raises(InvalidInputError, match="expected a JSON object in every row"):
        read_json(spark.createDataFrame([("[1, 2]",)], "value string"), "value")


def test_crash_after_schema_change_replays_cleanly(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    catalog: Catalog,
    catalog_props: dict[str, str],
    tmp_path: Path,
) -> None:
    base_table(catalog)
    ckpt = str(tmp_path / "ckpt")
    first = base_rows(spark)
    sink_for(catalog_props, "add-columns").write(first, checkpoint_location=ckpt, checkpoint_id=0)
    second = base_rows(spark).withColumn("id", F.lit(2).cast("long")).withColumn("extra", F.lit("e").cast("string"))
    second = second.withColumn("extra", F.when(F.col("id") > 0, F.col("extra")))  # nullable

    def crash(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_SCHEMA_CHANGE:
            raise RuntimeError("driver lost after the schema change")

    _faults.install(crash)
    try:
        with pytest.raises(RuntimeError, match="driver lost"):
            sink_for(catalog_props, "add-columns").write(second, checkpoint_location=ckpt, checkpoint_id=1)
    finally:
        _faults.clear()
    table = catalog.load_table("db.t")
    assert "extra" in table.schema().column_names  # the change landed ...
    assert len(table.snapshots()) == 1  # ... the data did not
    schema_id = table.metadata.current_schema_id
    sink_for(catalog_props, "add-columns").write(second, checkpoint_location=ckpt, checkpoint_id=1)
    table = catalog.load_table("db.t")
    assert table.metadata.current_schema_id == schema_id  # re-applying found the column present
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1"]  # type: ignore[index]
    from decimal import Decimal

    row = {"qty": 1, "price": Decimal("1.50"), "score": 0.5, "label": "x", "must": "m"}
    check_readers(java_reader, table, [{"id": 1, **row}, {"id": 2, **row, "extra": "e"}])


def test_pending_checkpoint_of_an_older_schema_commits_after_the_change(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    catalog: Catalog,
    catalog_props: dict[str, str],
    tmp_path: Path,
) -> None:
    """A committable stored with schema 0 (its commit never sent) is committed, in order, after the
    next batch evolved the table: columns were only added, so the committer accepts it."""
    base_table(catalog)
    ckpt = str(tmp_path / "ckpt")

    def crash(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_MANIFESTS:
            raise RuntimeError("driver lost before the commit")

    _faults.install(crash)
    try:
        with pytest.raises(RuntimeError, match="driver lost"):
            sink_for(catalog_props, "add-and-widen").write(base_rows(spark), checkpoint_location=ckpt, checkpoint_id=0)
    finally:
        _faults.clear()
    old_schema = catalog.load_table("db.t").metadata.current_schema_id
    second = (
        base_rows(spark)
        .withColumn("id", F.lit(2).cast("long"))
        .withColumn("qty", F.lit(7).cast("long"))
        .withColumn("extra", F.when(F.col("id") > 0, F.lit("e")))
    )
    sink_for(catalog_props, "add-and-widen").write(second, checkpoint_location=ckpt, checkpoint_id=1)
    table = catalog.load_table("db.t")
    assert table.metadata.current_schema_id != old_schema
    snapshots = table.snapshots()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in snapshots] == ["0", "1"]  # type: ignore[index]
    assert snapshots[0].schema_id is not None
    from decimal import Decimal

    row = {"price": Decimal("1.50"), "score": 0.5, "label": "x", "must": "m"}
    check_readers(
        java_reader,
        table,
        [{"id": 1, "qty": 1, **row}, {"id": 2, "qty": 7, **row, "extra": "e"}],
    )


def test_concurrent_schema_change_is_retried_and_idempotent(
    spark: SparkSession, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    base_table(catalog)
    stale = catalog.load_table("db.t")
    # Another writer adds one of the two columns (same type) and then another one of its own.
    with catalog.load_table("db.t").update_schema() as update:
        update.add_column("a", StringType())
    with catalog.load_table("db.t").update_schema() as update:
        update.add_column("other", LongType())
    struct = (
        base_rows(spark)
        .withColumn("a", F.when(F.col("id") > 0, F.lit("x")))
        .withColumn("b", F.when(F.col("id") > 0, F.lit(1.5)))
        .schema
    )
    conflicts: list[str] = []
    with pytest.raises(CommitFailedException):
        # The stale table's own commit conflicts (what evolve() retries on).
        stale.update_schema().add_column("b", DoubleType()).commit()
    table = evolution.evolve(
        "db.t",
        stale,
        struct,
        evolution.ADD_COLUMNS,
        load_table=lambda: catalog.load_table("db.t"),
        retry=RetryPolicy(num_retries=3, min_wait_ms=1, max_wait_ms=2),
        sleep=lambda s: conflicts.append(f"slept {s}"),
    )
    assert table.schema().column_names[-3:] == ["a", "other", "b"]
    assert table.schema().find_field("a").field_id == catalog.load_table("db.t").schema().find_field("a").field_id
    assert conflicts  # the first attempt lost its race and was planned again
    again = evolution.evolve(
        "db.t", table, struct, evolution.ADD_COLUMNS, lambda: catalog.load_table("db.t"), RetryPolicy()
    )
    assert again.metadata.current_schema_id == table.metadata.current_schema_id
    # The same name with an incompatible type from another writer is a clear error.
    clash = struct.add("other", "string")
    with pytest.raises(SchemaMismatchError, match="other: table type long cannot take DataFrame type string"):
        evolution.evolve(
            "db.t", table, clash, evolution.ADD_AND_WIDEN, lambda: catalog.load_table("db.t"), RetryPolicy()
        )
