"""The one rule for table names, column names and table locations (iceberg_sink/table/names.py),
and the Spark twin of the name rule that refuses a routed row: both accept exactly the same names."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink import IcebergSink
from iceberg_sink.errors import InvalidSinkConfigError, SchemaMismatchError
from iceberg_sink.table import catalog as catalogs
from iceberg_sink.table import names
from iceberg_sink.table.partitioning import build_spec

HOSTILE = [
    "cdc.x\ny",
    "cdc.x\ty",
    "cdc.x\ry",
    "cdc.x\x00y",
    "cdc.x\x7fy",
    "cdc.a#b",
    "cdc.a?b",
    "cdc.a%2Fb",
    "cdc.a/b",
    "cdc.a\\b",
    "cdc.a b",
    "cdc.a:b",
    "cdc.é",
    "cdc.",
    ".x",
    "cdc..x",
    "x",
    "",
    "cdc.-x",
    "cdc.x\n",  # Java's and Python's '$' would accept a trailing newline
    "cdc." + "a" * (names.MAX_TABLE_CHARS + 1),
    "n" * (names.MAX_NAMESPACE_CHARS + 1) + ".t",
    "cdc." + "a" * 300,
]
GOOD = [
    "cdc.x",
    "cdc.orders_2024",
    "a.b.c",
    "CDC.Orders-v2",
    "cdc." + "a" * names.MAX_TABLE_CHARS,
    "n" * names.MAX_NAMESPACE_CHARS + ".t",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_table_names_are_refused(name: str) -> None:
    problem = names.table_name_problem(name)
    assert problem is not None
    assert "\n" not in problem and "\x00" not in problem  # one line, control characters escaped
    with pytest.raises(InvalidSinkConfigError, match="table name"):
        names.check_table_name(name)


@pytest.mark.parametrize("name", GOOD)
def test_good_table_names_pass(name: str) -> None:
    assert names.table_name_problem(name) is None
    assert names.check_table_name(name) == name


def test_longest_name_fits_a_file_name() -> None:
    # The checkpoint folder of a routed table is named by the whole name (committer/store.py).
    longest = "n" * names.MAX_NAMESPACE_CHARS + "." + "t" * names.MAX_TABLE_CHARS
    assert names.table_name_problem(longest) is None
    assert len(longest.encode()) <= 255


def _refusals(
    spark: SparkSession,
    values: list[str | None],
    namespace: str | None,
    allow: tuple[str, ...],
    known: frozenset[str] = frozenset(),
) -> list:
    df = spark.createDataFrame([(v,) for v in values], "n string")
    rows = df.select(names.table_name_refusal(F.col("n"), namespace, allow, known).alias("r")).collect()
    return [r["r"] for r in rows]


def test_spark_twin_refuses_what_python_refuses(spark: SparkSession) -> None:
    values = HOSTILE + GOOD
    reasons = _refusals(spark, values, None, ("*.*", "a.b.*", "n*.*"))
    for value, reason in zip(values, reasons, strict=True):
        assert (reason is None) == (names.table_name_problem(value) is None), (value, reason)
        if reason is not None:
            assert "\n" not in reason and "\x00" not in reason
    assert _refusals(spark, [None], "cdc", ()) == ["a row names no table (the route gave null)"]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab_-.#?%/ \n\t\r\x00Z9é"), max_size=12), min_size=1, max_size=20))
def test_spark_twin_agrees_on_random_names(spark: SparkSession, values: list[str]) -> None:
    reasons = _refusals(spark, values, None, ("*.*", "*.*.*", "*.*.*.*"))
    for value, reason in zip(values, reasons, strict=True):
        python = names.table_name_problem(value) is None and names.allowed(value, None, ("*.*", "*.*.*", "*.*.*.*"))
        assert (reason is None) == python, (value, reason)


def test_known_names_never_admit_a_name_the_rule_refuses(spark: SparkSession) -> None:
    """Names a routed job already accepted skip the per-row rule (a set lookup): only names the
    Python twin accepts for the route get in, so every row is still accepted or refused as without
    them, hostile names, names outside the namespace, nulls and near-misses of known names included."""
    candidates = [*HOSTILE, *GOOD, "cdc.orders", "prod.payments", "cdc.orders.v2"]
    for namespace, allow in (("cdc", ()), (None, ("*.*", "a.b.*", "n*.*")), ("cdc", ("orders", "audit.*"))):
        known = names.known_names(candidates, namespace, allow)
        assert known == {
            c for c in candidates if names.table_name_problem(c) is None and names.allowed(c, namespace, allow)
        }
        values: list[str | None] = [*candidates, None, "cdc.orders ", "CDC.ORDERS", "cdc.orders\n", "cdc.x\x00"]
        assert _refusals(spark, values, namespace, allow, known) == _refusals(spark, values, namespace, allow)
    # The set given to Spark is bounded; names beyond it are checked by the rule.
    many = [f"cdc.t{i}" for i in range(names.KNOWN_NAMES_MAX + 10)]
    assert len(names.known_names(many, "cdc", ())) == names.KNOWN_NAMES_MAX


def test_confinement_to_the_namespace_and_allow_lists(spark: SparkSession) -> None:
    values = ["cdc.orders", "prod.payments", "cdc.orders.v2", "cdcx.orders", "audit.orders_1", "audit.orders_10"]
    by_namespace = _refusals(spark, values, "cdc", ())
    assert [r is None for r in by_namespace] == [True, False, False, False, False, False]
    assert "routed table 'prod.payments' is outside what this route may write (namespace 'cdc')" in by_namespace[1]
    allow = ("orders", "audit.orders_?")
    by_allow = _refusals(spark, values, "cdc", allow)
    assert [r is None for r in by_allow] == [True, False, False, False, True, False]
    for value, reason in zip(values, by_allow, strict=True):
        assert (reason is None) == names.allowed(value, "cdc", allow)
    assert [names.allowed(v, "cdc", ()) for v in values] == [r is None for r in by_namespace]
    # '*' stays within one part: "cdc.*" is not "cdc.orders.v2".
    assert names.allowed("cdc.orders", None, ("cdc.*",)) and not names.allowed("cdc.orders.v2", None, ("cdc.*",))


@pytest.mark.parametrize("entry", ["cdc.a#*", "x\ny", "", "cdc..*", 3])
def test_bad_allow_entries_are_refused(entry: object) -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"route\(allow\)"):
        names.allow_pattern(entry, "cdc")  # type: ignore[arg-type]


def test_column_names_with_dots_backticks_or_metadata_names_are_refused() -> None:
    struct = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("a.b", T.StringType()),
            T.StructField("c`d", T.StringType()),
            T.StructField("_FILE", T.StringType()),
            T.StructField("_last_updated_sequence_number", T.LongType()),
            T.StructField("s", T.StructType([T.StructField("x.y", T.LongType()), T.StructField("_pos", T.LongType())])),
            T.StructField("l", T.ArrayType(T.StructType([T.StructField("p`q", T.LongType())]))),
            T.StructField("m", T.MapType(T.StringType(), T.StructType([T.StructField("k.v", T.LongType())]))),
        ]
    )
    problems = names.column_problems(struct)
    text = "\n".join(problems)
    for path in ("'a.b'", "'c`d'", "'_FILE'", "'_last_updated_sequence_number'", "'s.x.y'", "'l.p`q'", "'m.k.v'"):
        assert path in text, path
    assert "s._pos" not in text  # metadata names are reserved at the top level only
    with pytest.raises(SchemaMismatchError, match="a column or field name may not hold"):
        names.check_columns("cdc.t", struct)
    names.check_columns("cdc.t", T.StructType([T.StructField("id", T.LongType()), T.StructField("_x", T.LongType())]))


@pytest.mark.parametrize(
    "location",
    ["file:///wh/cdc/x\ny", "file:///wh/cdc/a#b", "s3://b/cdc/a?b", "file:///wh/cdc/\x00"],
)
def test_locations_that_differ_from_their_folder_are_refused(location: str) -> None:
    assert names.location_problem(location) is not None
    assert names.location_problem("file:///wh/cdc/x") is None
    assert names.location_problem("file:///home/John%20Doe/wh/cdc/x") is None  # Path.as_uri() of a folder


SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def _catalog(tmp_path: Path) -> tuple[Catalog, Path]:
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": warehouse.as_uri()}
    return load_catalog("t", **props), warehouse


def _create(catalog: Catalog, name: str) -> None:
    catalogs.create_table(catalog, name, SCHEMA, build_spec((), SCHEMA), {"format-version": "2"})


def test_a_new_table_inside_another_tables_location_is_refused(tmp_path: Path) -> None:
    catalog, warehouse = _catalog(tmp_path)
    catalog.create_namespace("cdc")
    # Another tool created a table whose location is the namespace's folder itself.
    catalog.create_table("cdc.everything", SCHEMA, location=(warehouse / "cdc").as_uri())
    with pytest.raises(InvalidSinkConfigError, match=r"inside the location .* of table cdc\.everything"):
        _create(catalog, "cdc.orders")
    assert not catalog.table_exists("cdc.orders")  # nothing registered


def test_a_new_table_that_would_contain_another_is_refused(tmp_path: Path) -> None:
    catalog, warehouse = _catalog(tmp_path)
    catalog.create_namespace("cdc")
    catalog.create_table("cdc.inner", SCHEMA, location=(warehouse / "cdc" / "outer" / "x").as_uri())
    with pytest.raises(InvalidSinkConfigError, match=r"a parent of the location .* of table cdc\.inner"):
        _create(catalog, "cdc.outer")
    _create(catalog, "cdc.other")  # unrelated tables are created as before
    assert catalog.load_table("cdc.other").location().endswith("/cdc/other")


def test_same_location_ignoring_case_is_refused(tmp_path: Path) -> None:
    catalog, _ = _catalog(tmp_path)
    _create(catalog, "cdc.Orders")
    with pytest.raises(InvalidSinkConfigError, match=r"the same as or inside"):
        _create(catalog, "cdc.orders")


def test_a_table_outside_its_namespace_location_is_refused(tmp_path: Path) -> None:
    catalog, warehouse = _catalog(tmp_path)
    catalog.create_namespace("cdc", {"location": f"file://{warehouse}/cdc#x"})
    with pytest.raises(InvalidSinkConfigError, match=r"holds a control character, '\?' or '#'"):
        _create(catalog, "cdc.orders")
    assert not catalog.table_exists("cdc.orders")


def test_create_and_load_refuse_bad_names_before_touching_the_catalog(tmp_path: Path) -> None:
    catalog, _ = _catalog(tmp_path)
    with pytest.raises(InvalidSinkConfigError, match="control character"):
        _create(catalog, "cdc.x\ny")
    with pytest.raises(InvalidSinkConfigError, match="control character"):
        catalogs.load_table(catalog, "cdc.x\ny")
    assert catalog.list_namespaces() == []
    tbl = pa.table({"id": pa.array([1], pa.int64())})
    _create(catalog, "cdc.ok")
    catalog.load_table("cdc.ok").append(tbl)
    assert catalogs.load_table(catalog, "cdc.ok") is not None


def test_walk_tables_lists_nested_namespaces_and_descends_only_where_asked(tmp_path: Path) -> None:
    """The one walk over a catalog's tables (the location-overlap check and orphan removal's
    shared-location check both use it)."""
    catalog, _ = _catalog(tmp_path)
    for ns in ("a", "a.b", "a.b.c", "z"):
        catalog.create_namespace(ns)
    for name in ("a.t1", "a.b.t2", "a.b.c.t3", "z.t4"):
        catalog.create_table(name, SCHEMA)
    every = sorted(names.walk_tables(catalog, None, strict=True))
    assert every == [("a", "b", "c", "t3"), ("a", "b", "t2"), ("a", "t1"), ("z", "t4")]
    shallow = names.walk_tables(catalog, [("a",), ("a", "b")], descend=lambda ns: False, strict=True)
    assert sorted(shallow) == [("a", "b", "t2"), ("a", "t1")]
    assert names.walk_tables(catalog, [("gone",)], strict=True) == []  # a namespace not there holds no table


@pytest.mark.parametrize("spelling", ["file:{path}", "{path}", "FILE://{path}"])
def test_a_table_inside_another_is_refused_whatever_the_spelling_of_the_others_location(
    tmp_path: Path, spelling: str
) -> None:
    """Another tool (Iceberg Java spells local locations ``file:/wh/...``) created a table at the
    namespace's folder; the sink's new table would be ``file:///wh/cdc/orders``, inside it. Compared as
    strings the two spellings never nest, and the table was created."""
    catalog, warehouse = _catalog(tmp_path)
    catalog.create_namespace("cdc")
    catalog.create_table("cdc.everything", SCHEMA, location=spelling.format(path=warehouse / "cdc"))
    with pytest.raises(InvalidSinkConfigError, match=r"inside the location .* of table cdc\.everything"):
        _create(catalog, "cdc.orders")
    assert not catalog.table_exists("cdc.orders")


def test_a_file_location_naming_a_host_is_refused() -> None:
    # PyIceberg writes file://localhost/wh/x to the relative folder localhost/wh/x.
    assert "names a host ('localhost')" in str(names.location_problem("file://localhost/wh/cdc/x"))
    assert names.location_problem("file:/wh/cdc/x") is None


def test_an_existing_table_whose_location_is_cut_is_refused_when_loaded(tmp_path: Path) -> None:
    """Another tool created a table at ``.../t#1``: PyIceberg writes its files under ``.../t``."""
    catalog, warehouse = _catalog(tmp_path)
    catalog.create_namespace("cdc")
    catalog.create_table("cdc.t", SCHEMA, location=f"file://{warehouse}/t#1")
    with pytest.raises(InvalidSinkConfigError, match=r"table cdc\.t: location .* holds a control character"):
        catalogs.load_table(catalog, "cdc.t")


def test_the_builder_refuses_such_a_table_before_anything_is_written(tmp_path: Path) -> None:
    catalog, warehouse = _catalog(tmp_path)
    catalog.create_namespace("cdc")
    catalog.create_table("cdc.t", SCHEMA, location=f"file://{warehouse}/t?x=1")
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'c.db'}", "warehouse": warehouse.as_uri()}
    with pytest.raises(InvalidSinkConfigError, match=r"^table cdc\.t: location .*'\?' or '#'.*; refused"):
        IcebergSink.builder().catalog("t", **props).table("cdc.t").build()
