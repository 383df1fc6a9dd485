"""Identifiers that come from data (issue 18, part 1): routed table names, table arguments and column
names go through one rule (iceberg_sink/table/names.py). A refused name fails its batch with the
table named before anything is created or committed, and never wedges the tables already written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, SchemaMismatchError
from iceberg_sink.cli import EXIT_USAGE, main
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

DDL = "tbl string, id long, v string"


def rows(spark: SparkSession, data: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(data, DDL)


def files_under(root: Path) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs}


def state(catalog: Catalog) -> dict[str, tuple[int | None, str]]:
    """Every table of the catalog with its current snapshot and metadata location."""
    out = {}
    for ns in catalog.list_namespaces():
        for ident in catalog.list_tables(ns):
            table = catalog.load_table(ident)
            snap = table.current_snapshot()
            out[".".join(ident)] = (snap.snapshot_id if snap else None, table.metadata_location)
    return out


def check_readers(java: JavaIcebergReader, catalog: Catalog, name: str, expected: list[dict[str, Any]]) -> None:
    location = catalog.load_table(name).metadata_location
    want = normalize(pa.Table.from_pylist(expected, schema=pa.schema([("id", pa.int64()), ("v", pa.string())])), ["id"])
    assert normalize(java.read(location), ["id"]) == want, f"{name}: Iceberg Java"
    assert normalize(duckdb_read(location), ["id"]) == want, f"{name}: DuckDB"


# Each hostile name, and what the refusal must say about it.
HOSTILE = [
    ("x\ny", r"routed table 'cdc\.x\\ny' holds a control character"),
    ("x\ty", r"routed table 'cdc\.x\\ty' holds a control character"),
    ("x\ry", r"routed table 'cdc\.x\\ry' holds a control character"),
    ("a\x00b", r"routed table 'cdc\.a\\0b' holds a control character"),
    ("a#b", r"routed table 'cdc\.a#b' holds other characters or empty parts"),
    ("a?b", r"routed table 'cdc\.a\?b' holds other characters or empty parts"),
    ("a%2Fb", r"routed table 'cdc\.a%2Fb' holds other characters"),
    ("a b", r"routed table 'cdc\.a b' holds other characters"),
    ("cdc..x", r"routed table 'cdc\.\.x' holds other characters or empty parts"),
    ("a" * 300, r"routed table 'cdc\.a+\.\.\.' is too long: the namespace may have at most 100"),
    ("cdc.xy.v2", r"routed table 'cdc\.xy\.v2' is outside what this route may write \(namespace 'cdc'\)"),
    ("prod.payments", r"routed table 'prod\.payments' is outside what this route may write"),
]


def test_hostile_routed_names_are_refused_and_nothing_is_wedged(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    def sink() -> IcebergSink:
        built: IcebergSink = (
            IcebergSink.builder()
            .catalog("test", **catalog_props)
            .route(table_column="tbl", namespace="cdc")
            .create_if_missing()
            .build()
        )
        return built

    catalog.create_namespace("prod")
    catalog.create_table("prod.payments", Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType())))
    ckpt = str(tmp_path / "ckpt")
    warehouse = Path(catalog_props["warehouse"].removeprefix("file://"))
    routed = sink()
    routed.write(rows(spark, [("xy", 1, "a"), ("good", 2, "b")]), checkpoint_location=ckpt)
    before, files = state(catalog), files_under(warehouse)
    for i, (name, message) in enumerate(HOSTILE):
        with pytest.raises(InvalidInputError, match=message) as raised:
            routed.write(rows(spark, [("good", 10 + i, "c"), (name, 100 + i, "x")]), checkpoint_location=ckpt)
        assert "\n" not in str(raised.value).split(" (event: ")[0]  # one line, the name escaped
        # Nothing was created, committed or written, for any table.
        assert state(catalog) == before, name
        assert files_under(warehouse) == files, name
    # The stream goes on (a restarted driver too): the refused rows wedged nothing.
    routed.write(rows(spark, [("xy", 3, "c"), ("good", 4, "d")]), checkpoint_location=ckpt)
    sink().write(rows(spark, [("good", 5, "e")]), checkpoint_location=ckpt)
    assert sorted(".".join(t) for t in catalog.list_tables("cdc")) == ["cdc.good", "cdc.xy"]
    check_readers(java_reader, catalog, "cdc.xy", [{"id": 1, "v": "a"}, {"id": 3, "v": "c"}])
    check_readers(java_reader, catalog, "cdc.good", [{"id": 2, "v": "b"}, {"id": 4, "v": "d"}, {"id": 5, "v": "e"}])
    assert catalog.load_table("prod.payments").current_snapshot() is None


def test_allow_lists_the_tables_a_route_may_write(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, java_reader: JavaIcebergReader
) -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"route: expected namespace= .* or allow=\[\.\.\.\]"):
        IcebergSink.builder().catalog("test", **catalog_props).route(table_column="tbl").build()
    with pytest.raises(InvalidSinkConfigError, match=r"route\(allow\): entry 'cdc\.a#\*'"):
        IcebergSink.builder().catalog("test", **catalog_props).route(table_column="tbl", allow=["cdc.a#*"]).build()
    with pytest.raises(InvalidSinkConfigError, match=r"route\(namespace\): expected a namespace"):
        IcebergSink.builder().catalog("test", **catalog_props).route(table_column="tbl", namespace="c\nd").build()
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="cdc", allow=["orders_*", "audit.log"])
        .create_if_missing()
        .build()
    )
    sink.write(rows(spark, [("orders_eu", 1, "a"), ("audit.log", 2, "b"), ("cdc.orders_us", 3, "c")]))
    for name in ("cdc.other", "audit.other", "cdc.orders_eu.v2"):
        with pytest.raises(InvalidInputError, match=rf"routed table '{name}' is outside what this route may write"):
            sink.write(rows(spark, [("orders_eu", 9, "z"), (name, 4, "d")]))
    assert sorted(".".join(t) for ns in ("cdc", "audit") for t in catalog.list_tables(ns)) == [
        "audit.log",
        "cdc.orders_eu",
        "cdc.orders_us",
    ]
    check_readers(java_reader, catalog, "cdc.orders_eu", [{"id": 1, "v": "a"}])
    check_readers(java_reader, catalog, "audit.log", [{"id": 2, "v": "b"}])


def test_route_function_names_are_checked_too(spark: SparkSession, catalog_props: dict[str, str]) -> None:
    sink = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(lambda row: f"t#{row['id']}", namespace="cdc")
        .create_if_missing()
        .build()
    )
    with pytest.raises(InvalidInputError, match=r"routed table 'cdc\.t#1' holds other characters"):
        sink.write(spark.createDataFrame([(1, "a")], "id long, v string"))


def test_single_table_and_cli_names_follow_the_rule(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    good = IcebergSink.builder().embedded(lake).table("cdc.xy").create_if_missing().build()
    good.write(spark.createDataFrame([(1, "a")], "id long, v string"))
    for name in ("cdc.x\ny", "cdc.a#b", "cdc.a?b", "cdc.a\x00b", "cdc." + "a" * 300, "cdc.a/b"):
        with pytest.raises(InvalidSinkConfigError, match=r"table: table name .* (holds|is too long)"):
            IcebergSink.builder().embedded(lake).table(name).create_if_missing().build()
    # remove-orphans (and every command taking a table) refuses the name before looking it up: such
    # a table can no longer be created, so its location cannot alias another table's folder.
    files = files_under(lake / "warehouse")
    assert main(["remove-orphans", "cdc.x\ny", "--embedded", str(lake)]) == EXIT_USAGE
    assert main(["inspect", "--table", "cdc.a#b", "--embedded", str(lake)]) == EXIT_USAGE
    assert files_under(lake / "warehouse") == files


COLUMN_CASES = [
    # (what, DDL of the input, builder changes, message)
    ("dot", "id long, `a.b` string", {}, r"'a\.b': a column or field name may not hold '\.' or '`'"),
    ("backtick", "id long, `a``b` string", {}, r"'a`b': a column or field name may not hold"),
    ("nested", "id long, s struct<`x.y`: long>", {}, r"'s\.x\.y': a column or field name may not hold"),
    ("key", "`k.x` long, v string", {"upsert": ["k.x"]}, r"'k\.x': a column or field name may not hold"),
    ("partition", "id long, `p.q` string", {"partition_by": ["p.q"]}, r"'p\.q': a column or field name"),
    ("_file", "id long, _file string", {}, r"'_file': the name of an Iceberg metadata column"),
    ("_POS", "id long, _POS long", {}, r"'_POS': the name of an Iceberg metadata column"),
    ("_row_id", "id long, _row_id long", {}, r"'_row_id': the name of an Iceberg metadata column"),
    ("_seq", "id long, _last_updated_sequence_number long", {}, r"metadata column"),
]


@pytest.mark.parametrize(("what", "ddl", "extra", "message"), COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_bad_column_names_are_refused_before_the_table_is_created(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog, what: str, ddl: str, extra: dict, message: str
) -> None:
    builder = IcebergSink.builder().catalog("test", **catalog_props).table("db.t")
    if "partition_by" in extra:
        builder = builder.create_if_missing(partition_by=extra["partition_by"])
    else:
        builder = builder.create_if_missing()
    if "upsert" in extra:
        builder = builder.upsert(key=extra["upsert"])
    try:
        sink = builder.build()
    except InvalidSinkConfigError as e:  # the builder may already see a bad partition source
        assert "p.q" in str(e) or "k.x" in str(e), e
        return
    with pytest.raises(SchemaMismatchError, match=message):
        sink.write(spark.createDataFrame([], ddl))
    assert not catalog.table_exists("db.t")


def test_bad_column_names_commit_no_schema_change_and_fail_routed_batches(
    spark: SparkSession, catalog_props: dict[str, str], catalog: Catalog
) -> None:
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", Schema(NestedField(1, "id", LongType())), properties={"format-version": "2"})
    evolving = IcebergSink.builder().catalog("test", **catalog_props).table("db.t").schema_evolution("add-columns")
    with pytest.raises(SchemaMismatchError, match=r"'a\.b': a column or field name may not hold"):
        evolving.build().write(spark.createDataFrame([(1, "x")], "id long, `a.b` string"))
    reloaded = catalog.load_table("db.t")
    assert reloaded.schema() == table.schema() and reloaded.metadata_location == table.metadata_location
    routed = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(table_column="tbl", namespace="cdc")
        .create_if_missing()
        .schema_evolution("add-columns")
        .build()
    )
    with pytest.raises(SchemaMismatchError, match=r"'a\.b': a column or field name may not hold"):
        routed.write(spark.createDataFrame([("t", 1, "x")], "tbl string, id long, `a.b` string"))
    assert not catalog.namespace_exists("cdc") or not catalog.list_tables("cdc")
    # Routed by a function, every column goes into the function's row: a backtick in a name must be
    # the column rule's clear refusal, not Spark's syntax error on a badly quoted reference.
    by_fn = (
        IcebergSink.builder()
        .catalog("test", **catalog_props)
        .route(lambda r: "f", namespace="cdc")
        .create_if_missing()
        .build()
    )
    with pytest.raises(SchemaMismatchError, match=r"'a`b': a column or field name may not hold"):
        by_fn.write(spark.createDataFrame([(1, "x")], "id long, `a``b` string"))
    assert not catalog.namespace_exists("cdc") or not catalog.list_tables("cdc")
