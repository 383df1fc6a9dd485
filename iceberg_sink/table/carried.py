"""The fields a routed table's rows carry, down into structs (routing.py, TableBinding.own_columns).

A routed stream has one schema, the union of its tables'; a struct column shared by name (a
Debezium ``after``, a JSON payload parsed by :func:`iceberg_sink.sources.readers.read_json`) holds every
table's nested fields, null in the other tables' rows. So a table's input in a batch is decided per
field path: a field is *carried* by a table when it holds a value in at least one of its rows.

- Fields are counted at their leaves: a top-level column or a struct field that is not itself a
  struct, reached through structs and through the elements of lists and the values of maps that
  are structs (path segments :data:`ELEMENT` and :data:`VALUE`). ``F.count(col("a.b"))`` counts
  the rows where ``a`` and ``a.b`` are both set; through a list, the rows where some element has
  the field set (``exists``). One grouped aggregation of every leaf finds every table's paths,
  whatever the number of tables. Lists and maps of other types, and map keys, are leaves.
- A struct is carried when one of its fields is; it then keeps only its carried fields, those the
  table already has and those a key or partition names (the same for the element struct of a
  list and the value struct of a map). A struct whose fields are all null in a table's rows (null
  itself or not), or a list or map of structs none of whose elements holds a value (empty lists
  included), is not added to a table that lacks it (such a row reads null there); a table that
  has it writes it as it comes.
- The writer (writer/multi.py) applies the same rule to the rows it receives: a value in a field
  the driver left out is refused, a null there is ignored.

Paths are tuples of names from the top-level column down (names may contain dots).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from pyiceberg.types import IcebergType, ListType, MapType, NestedField
from pyiceberg.types import StructType as IcebergStruct
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._sql import quoted

#: A field's path from its top-level column down.
Path = tuple[str, ...]
#: The path segment of a list's element and of a map's value (``payload.items[].sku``).
ELEMENT = "[]"
VALUE = "{}"
#: Paths as nested dicts: name -> the names below it (see each use for what an empty dict means).
_Tree = dict[str, "_Tree"]
#: A table's fields reached through structs (and the element and value structs of lists and maps,
#: under ELEMENT and VALUE): name -> the fields below it, an empty dict for a leaf (table_tree).
FieldTree = _Tree


def _struct_inside(t: T.DataType) -> tuple[str, T.StructType] | None:
    """The segment and struct of a list of structs or a map with struct values (None otherwise)."""
    if isinstance(t, T.ArrayType) and isinstance(t.elementType, T.StructType) and t.elementType.fields:
        return ELEMENT, t.elementType
    if isinstance(t, T.MapType) and isinstance(t.valueType, T.StructType) and t.valueType.fields:
        return VALUE, t.valueType
    return None


def leaf_paths(struct: T.StructType) -> Iterator[Path]:
    """The paths of ``struct``'s leaves: its fields that are not structs, reached through structs
    and through the element or value structs of lists and maps."""
    for f in struct.fields:
        inside = _struct_inside(f.dataType)
        if isinstance(f.dataType, T.StructType) and f.dataType.fields:
            for path in leaf_paths(f.dataType):
                yield (f.name, *path)
        elif inside is not None:
            for path in leaf_paths(inside[1]):
                yield (f.name, inside[0], *path)
        else:
            yield (f.name,)


def column_ref(path: Path) -> str:
    """``path`` (through structs only) as a Spark column reference, each name quoted."""
    return ".".join(quoted(name) for name in path)


def display(path: Path) -> str:
    """``path`` for messages: ``payload.items[].sku``."""
    return ".".join(path).replace(f".{ELEMENT}", ELEMENT).replace(f".{VALUE}", VALUE)


def count_column(path: Path) -> Column:
    """The aggregate counting the rows where the leaf at ``path`` holds a value."""
    if ELEMENT not in path and VALUE not in path:
        return F.count(F.col(column_ref(path)))
    return F.count(F.when(_present(F.col(column_ref(path[:1])), path[1:]), F.lit(1)))


def _present(column: Column, rest: Path) -> Column:
    if not rest:
        return column.isNotNull()
    if rest[0] == ELEMENT:
        return F.exists(column, lambda e: _present(e, rest[1:]))
    if rest[0] == VALUE:
        return F.exists(F.map_values(column), lambda v: _present(v, rest[1:]))
    return _present(column.getField(rest[0]), rest[1:])


def as_paths(carried: Iterable[str | Path]) -> frozenset[Path]:
    """``carried`` as paths: a plain name is a whole top-level column."""
    return frozenset((c,) if isinstance(c, str) else tuple(c) for c in carried)


def _tree(paths: Iterable[Path]) -> _Tree:
    """``paths`` as nested dicts; an empty dict below a name means the whole field."""
    root: _Tree = {}
    for path in sorted(set(paths), key=len):
        node = root
        for i, name in enumerate(path):
            child = node.get(name)
            if child is None:
                child = node[name] = {}
            elif not child and i < len(path) - 1:
                break  # a shorter path already keeps the whole field
            node = child
        else:
            node.clear()  # the whole field
    return root


def _type_tree(t: IcebergType) -> _Tree:
    if isinstance(t, IcebergStruct):
        return table_tree(t.fields)
    if isinstance(t, ListType) and isinstance(t.element_type, IcebergStruct):
        return {ELEMENT: table_tree(t.element_type.fields)}
    if isinstance(t, MapType) and isinstance(t.value_type, IcebergStruct):
        return {VALUE: table_tree(t.value_type.fields)}
    return {}


def table_tree(fields: Iterable[NestedField]) -> _Tree:
    """A table's fields reached through structs (and list element, map value structs) as nested
    dicts (a leaf: an empty dict)."""
    return {f.name: _type_tree(f.field_type) for f in fields}


def project(
    struct: T.StructType,
    carried: Collection[str | Path],
    table_fields: Iterable[NestedField] = (),
    required: Iterable[Path] = (),
) -> T.StructType:
    """The part of ``struct`` a routed table takes: the fields on a ``carried`` path, those the table
    has (``table_fields``, its schema's top-level fields) and those on a ``required`` path (key, op,
    order and partition source columns), each struct keeping only such fields; a struct none of
    whose fields is kept is left out (the writer fills in the fields of the table's: null)."""
    keep = _tree([*as_paths(carried), *required])
    projected = _project_struct(struct, keep, table_tree(table_fields))
    return projected if projected is not None else T.StructType([])


def _project_struct(struct: T.StructType, keep: _Tree | None, table: _Tree | None) -> T.StructType | None:
    fields = []
    for f in struct.fields:
        wanted = keep.get(f.name) if keep is not None else None
        have = table.get(f.name) if table is not None else None
        if wanted is None and have is None:
            continue
        t = _project_type(f.dataType, wanted, have)
        if t is not None:  # else none of its fields is carried, the table's or required: nothing to check
            fields.append(T.StructField(f.name, t, f.nullable, f.metadata))
    return T.StructType(fields) if fields else None


def _project_type(t: T.DataType, wanted: _Tree | None, have: _Tree | None) -> T.DataType | None:
    """``t`` with only the fields ``wanted`` (None: none, empty: all) or ``have`` (the table's)."""
    if wanted is not None and not wanted:
        return t  # the whole field
    if have is not None and not have:
        return t  # a leaf of the table (check_compatible judges the type)
    if isinstance(t, T.StructType):
        return _project_struct(t, wanted, have)
    inside = _struct_inside(t)
    if inside is None:
        return t
    segment, inner = inside
    projected = _project_struct(
        inner, wanted.get(segment) if wanted is not None else None, have.get(segment) if have is not None else None
    )
    if projected is None:
        return None
    if isinstance(t, T.ArrayType):
        return T.ArrayType(projected, t.containsNull)
    assert isinstance(t, T.MapType)
    return T.MapType(t.keyType, projected, t.valueContainsNull)
