"""The fields of a shared struct a routed table takes (table/carried.py): its rows' leaves, the
table's own fields and the key/partition paths, down into structs."""

from __future__ import annotations

from pyiceberg.types import LongType, NestedField, StringType, StructType
from pyspark.sql import types as T

from iceberg_sink.table.carried import column_ref, leaf_paths, project

S = T.StringType()
ADDR = T.StructType([T.StructField("city", S), T.StructField("zip", S)])
TAGS = T.ArrayType(T.StructType([T.StructField("t", S)]))
P = T.StructType([T.StructField("name", S), T.StructField("x.y", T.LongType()), T.StructField("addr", ADDR)])
UNION = T.StructType([T.StructField("id", T.LongType()), T.StructField("p", P.add("tags", TAGS))])


def names(struct: T.StructType) -> list[str]:
    out = []
    for f in struct.fields:
        out.append(f.name)
        if isinstance(f.dataType, T.StructType):
            out += [f"{f.name}.{n}" for n in names(f.dataType)]
    return out


def test_leaf_paths_go_through_structs_only_and_column_refs_quote_each_name() -> None:
    assert list(leaf_paths(UNION)) == [
        ("id",),
        ("p", "name"),
        ("p", "x.y"),
        ("p", "addr", "city"),
        ("p", "addr", "zip"),
        ("p", "tags"),  # a list of structs is one leaf: carried whole
    ]
    assert column_ref(("p", "x.y")) == "`p`.`x.y`"
    assert column_ref(("a`b",)) == "`a``b`"


def test_a_table_takes_its_carried_paths_its_own_fields_and_the_required_ones() -> None:
    assert names(project(UNION, {("id",), ("p", "addr", "city")})) == ["id", "p", "p.addr", "p.addr.city"]
    # Plain names (top-level columns) are whole columns.
    assert names(project(UNION, {"p"})) == names(T.StructType([UNION["p"]]))
    table = [
        NestedField(1, "id", LongType()),
        NestedField(2, "p", StructType(NestedField(3, "x.y", LongType(), required=False)), required=False),
    ]
    assert names(project(UNION, {("p", "tags")}, table)) == ["id", "p", "p.x.y", "p.tags"]
    assert names(project(UNION, set(), table, required=[("p", "addr", "zip")])) == [
        "id",
        "p",
        "p.x.y",
        "p.addr",
        "p.addr.zip",
    ]
    # A struct the table has with none of its fields in the input, other tables' only: left out (the
    # writer fills the table's fields in with null).
    other = [NestedField(2, "p", StructType(NestedField(3, "gone", StringType(), required=False)), required=False)]
    assert names(project(UNION, set(), other)) == []
    assert names(project(UNION, {("p", "name")}, other)) == ["p", "p.name"]
