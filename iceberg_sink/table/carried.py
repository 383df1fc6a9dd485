"""The fields a routed table's rows carry, down into structs (routing.py, SinkJob.own_columns).

A routed stream has one schema, the union of its tables'; a struct column shared by name (a
Debezium ``after``, a JSON payload parsed by :func:`iceberg_sink.readers.read_json`) holds every
table's nested fields, null in the other tables' rows. So a table's input in a batch is decided per
field path: a field is *carried* by a table when it holds a value in at least one of its rows.

- Fields are counted at their leaves: a top-level column or a struct field that is not itself a
  struct (lists and maps are leaves: a list or map column is carried or not as a whole, with its
  element/key/value type as the batch has it). ``F.count(col("a.b"))`` counts the rows where
  ``a`` and ``a.b`` are both set, so one grouped aggregation of every leaf finds every table's
  paths, whatever the number of tables.
- A struct is carried when one of its fields is; it then keeps only its carried fields, those the
  table already has and those a key or partition names. A struct whose fields are all null in a
  table's rows (null itself or not) is not added to a table that lacks it; a table that has it
  writes it as it comes.
- The writer (writer/multi.py) applies the same rule to the rows it receives: a value in a field
  the driver left out is refused, a null there is ignored.

Paths are tuples of names from the top-level column down (names may contain dots).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from pyiceberg.types import IcebergType, NestedField
from pyiceberg.types import StructType as IcebergStruct
from pyspark.sql import types as T

#: A field's path from its top-level column down.
Path = tuple[str, ...]
#: Paths as nested dicts: name -> the names below it (see each use for what an empty dict means).
_Tree = dict[str, "_Tree"]


def leaf_paths(struct: T.StructType) -> Iterator[Path]:
    """The paths of ``struct``'s leaves: its fields that are not structs, reached through structs."""
    for f in struct.fields:
        if isinstance(f.dataType, T.StructType) and f.dataType.fields:
            for path in leaf_paths(f.dataType):
                yield (f.name, *path)
        else:
            yield (f.name,)


def column_ref(path: Path) -> str:
    """``path`` as a Spark column reference (each name quoted): ``F.col(column_ref(path))``."""
    return ".".join("`" + name.replace("`", "``") + "`" for name in path)


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


def _table_tree(fields: Iterable[NestedField]) -> _Tree:
    """The table's fields reached through structs as nested dicts (a leaf: an empty dict)."""
    tree: _Tree = {}
    for f in fields:
        t: IcebergType = f.field_type
        tree[f.name] = _table_tree(t.fields) if isinstance(t, IcebergStruct) else {}
    return tree


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
    return _project(struct, keep, _table_tree(table_fields))


def _project(struct: T.StructType, keep: _Tree, table: _Tree) -> T.StructType:
    fields = []
    for f in struct.fields:
        wanted, have = keep.get(f.name), table.get(f.name)
        if wanted is None and have is None:
            continue
        if (wanted is not None and not wanted) or not isinstance(f.dataType, T.StructType):
            fields.append(f)  # the whole field: carried as a whole, or not a struct
            continue
        inner = _project(f.dataType, wanted or {}, have or {})
        if inner.fields:  # else none of its fields is carried, the table's or required: nothing to check
            fields.append(T.StructField(f.name, inner, f.nullable, f.metadata))
    return T.StructType(fields)
