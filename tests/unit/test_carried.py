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


def test_leaf_paths_go_through_structs_and_column_refs_quote_each_name() -> None:
    assert list(leaf_paths(UNION)) == [
        ("id",),
        ("p", "name"),
        ("p", "x.y"),
        ("p", "addr", "city"),
        ("p", "addr", "zip"),
        ("p", "tags", "[]", "t"),  # through the element struct of a list
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
    assert names(project(UNION, {("p", "tags", "[]", "t")}, table)) == ["id", "p", "p.x.y", "p.tags"]
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


def test_lists_and_maps_of_structs_are_counted_and_projected_through_their_element_and_value() -> None:
    from pyiceberg.types import ListType, MapType

    item = T.StructType([T.StructField("sku", S), T.StructField("qty", T.LongType())])
    union = T.StructType(
        [
            T.StructField("items", T.ArrayType(item)),
            T.StructField("m", T.MapType(S, item)),
            T.StructField("plain", T.ArrayType(S)),
        ]
    )
    assert list(leaf_paths(union)) == [
        ("items", "[]", "sku"),
        ("items", "[]", "qty"),
        ("m", "{}", "sku"),
        ("m", "{}", "qty"),
        ("plain",),
    ]
    assert project(union, {("items", "[]", "qty"), ("m", "{}", "sku")}).simpleString() == (
        "struct<items:array<struct<qty:bigint>>,m:map<string,struct<sku:string>>>"
    )
    # The element fields the table has are kept too; nothing carried below a list: left out.
    element = StructType(NestedField(3, "sku", StringType(), required=False))
    table = [NestedField(1, "items", ListType(2, element, element_required=False), required=False)]
    assert project(union, {("plain",)}, table).simpleString() == (
        "struct<items:array<struct<sku:string>>,plain:array<string>>"
    )
    map_table = [NestedField(1, "m", MapType(2, StringType(), 3, element, value_required=False), required=False)]
    assert project(union, set(), map_table).simpleString() == "struct<m:map<string,struct<sku:string>>>"
