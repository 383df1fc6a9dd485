"""The types of Debezium row images without a schema part, settled per batch, and the events that do not fit them.

Without a schema part (the connector's ``schemas.enable=false``) an event's only types are its
JSON's, inferred per batch as :func:`iceberg_sink.sources.readers.read_json` infers them. A field
whose values are of several kinds (a number in most events and a string in one) used to fail the
whole batch ("conflicting types"), dead-letter table or not. :func:`settle` gives every field one
column type instead, and refuses the events whose value does not fit it:

1. **the table's type**, when the sink reads the batch for a table that exists and has the column
   (``job/reading.py`` hands its schema over: :func:`writing_table`), or the type the batch's schema
   parts declare for it (a batch mixing events with and without one). Only where JSON tells the kinds
   of values apart: numbers, strings, booleans, objects (struct and map columns) and arrays. An
   integral column keeps the batch's ``long`` (schema evolution may widen the column to it); a date,
   timestamp, binary or other column keeps the batch's inferred type, as before;
2. else **the kind most of the batch's row images of its source table give it** (ties: the kind seen
   first). Counted in one more Spark job over the batch's images, run only for a batch whose values
   disagree. Source tables whose values settle on types no single column holds (a routed batch) still
   fail the batch, naming the field.

An event holding a value of another kind (``"id": "5002"`` among long ids, ``"qty": "lots"``, the
TOAST placeholder string in a long column, a number where a string is expected, ...) is refused,
naming the field, the value received, the type expected and where that type comes from; the rest of
the batch is written. The check is a Python function over the images of the events without a schema
part, added only to a batch where some value may not fit: a batch whose values agree with each other
and with the table pays nothing more than the inference.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import attrs
from pyiceberg import types as ice
from pyiceberg.schema import Schema
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._sql import named
from iceberg_sink.errors import InvalidInputError
from iceberg_sink.sources.readers import (
    NULL_KIND,
    Kind,
    family_of,
    is_typed,
    kind_of,
    kind_type,
    members,
    merge_kinds,
    union_types,
)
from iceberg_sink.writer.task_start import task_start

#: Where a field's expected type comes from, as a refusal says it.
TABLE = "the type of the table's column"
DECLARED = "its type in the schema parts of this batch's events"
MAJORITY = "the type most of this batch's events give it"
SETTLED = "the type this batch's events settle on"

# A path into a row image: field names, None for an array's elements.
Path = tuple[str | None, ...]
_SOURCE = "__iceberg_sink_bare_source"
_TEXT = "__iceberg_sink_bare_image"
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_SHOWN = 100

_TABLE_TYPES: ContextVar[T.StructType | None] = ContextVar("iceberg_sink_table_types", default=None)


# -- the table the sink writes


@contextmanager
def writing_table(schema: Schema | None) -> Iterator[None]:
    """While the sink reads a batch for a table of ``schema`` (None: no such table yet): readers
    called meanwhile (a ``map_batches`` function's :func:`iceberg_sink.sources.debezium.read_envelope`)
    settle the types of events without a schema part on its columns' (:func:`table_types`)."""
    token = _TABLE_TYPES.set(_checked_struct(schema) if schema is not None else None)
    try:
        yield
    finally:
        _TABLE_TYPES.reset(token)


def table_types() -> T.StructType | None:
    """The columns of the table the sink is reading a batch for whose JSON kind a value must have
    (:func:`writing_table`), as Spark types; None outside such a read."""
    return _TABLE_TYPES.get()


def _checked_struct(schema: Schema) -> T.StructType:
    fields = [(f.name, _checked_type(f.field_type)) for f in schema.fields]
    return T.StructType([T.StructField(name, t) for name, t in fields if t is not None])


def _checked_type(t: ice.IcebergType) -> T.DataType | None:
    """The Spark type of an Iceberg type whose JSON values are told apart by their kind; None for the others."""
    simple: dict[type, T.DataType] = {
        ice.IntegerType: T.IntegerType(),
        ice.LongType: T.LongType(),
        ice.FloatType: T.FloatType(),
        ice.DoubleType: T.DoubleType(),
        ice.StringType: T.StringType(),
        ice.BooleanType: T.BooleanType(),
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, ice.DecimalType):
        return T.DecimalType(t.precision, t.scale)
    if isinstance(t, ice.StructType):
        fields = [(f.name, _checked_type(f.field_type)) for f in t.fields]
        return T.StructType([T.StructField(name, ft) for name, ft in fields if ft is not None])
    if isinstance(t, ice.ListType):
        element = _checked_type(t.element_type)
        return T.ArrayType(element) if element is not None else None
    if isinstance(t, ice.MapType) and isinstance(t.key_type, ice.StringType):
        value = _checked_type(t.value_type)
        return T.MapType(T.StringType(), value) if value is not None else None
    return None


def _family(dtype: T.DataType | None) -> str | None:
    """The JSON kind (:func:`iceberg_sink.sources.readers.family_of`) a value of ``dtype`` must have; None: unchecked."""
    if isinstance(dtype, (*_INTEGRAL, T.FloatType, T.DoubleType, T.DecimalType)):
        return "number"
    if isinstance(dtype, T.StringType):
        return "string"
    if isinstance(dtype, T.BooleanType):
        return "boolean"
    if isinstance(dtype, T.StructType) or (isinstance(dtype, T.MapType) and isinstance(dtype.keyType, T.StringType)):
        return "object"
    if isinstance(dtype, T.ArrayType):
        return "array"
    return None


# -- settling a batch's types


def _display(path: Path) -> str:
    return ".".join("element" if p is None else p for p in path)


class _Settling:
    """One source table's kinds settled on column types: the known types where given, else the
    majority's (``counts``: (source, path) -> images per kind family; a missing count is recorded
    in ``needed``, the first kind seen standing in)."""

    def __init__(
        self,
        source: str | None,
        origins: Mapping[str, str],
        counts: Mapping[tuple[str | None, Path], Mapping[str, int]],
    ) -> None:
        self.source = source
        self.origins = origins
        self.counts = counts
        self.needed: set[Path] = set()
        self.why: dict[str, str] = {}
        self.may_misfit = False

    def type_of(self, kind: Kind, known: T.DataType | None, path: Path) -> T.DataType:
        family = _family(known)
        if kind == NULL_KIND:  # an array of nulls only
            return known if known is not None else T.StringType()
        if kind[0] == "conflict" or (family is not None and family != family_of(kind)):
            self.may_misfit = True
            found = dict(members(kind))
            if family is not None:
                self.why[_display(path)] = self.origins.get(str(path[0]), TABLE)
                return self.type_of(found[family], known, path) if family in found else known  # type: ignore[return-value]
            self.why[_display(path)] = MAJORITY
            return self.type_of(found[self._majority(path, [f for f, _ in members(kind)])], None, path)
        tag = kind[0]
        if tag == "struct":
            if isinstance(known, T.MapType):
                self.may_misfit = True  # the objects' values are checked against the map's
                return known
            inner = {f.name: f.dataType for f in known.fields} if isinstance(known, T.StructType) else {}
            return T.StructType(
                [
                    T.StructField(name, self.type_of(k, inner.get(name), (*path, name)))
                    for name, k in kind[1]
                    if is_typed(k)
                ]
            )
        if tag == "array":
            element = known.elementType if isinstance(known, T.ArrayType) else None
            return T.ArrayType(self.type_of(kind[1], element, (*path, None)))
        if known is None:
            return kind_type(kind, _display(path), [])
        if isinstance(known, _INTEGRAL):
            if tag == "long":  # an integral column keeps the batch's long: schema evolution may widen it
                return T.LongType()
            self.may_misfit = True  # a fractional number where an integer is expected
            self.why[_display(path)] = self.origins.get(str(path[0]), TABLE)
        return known

    def _majority(self, path: Path, families: list[str]) -> str:
        counted = self.counts.get((self.source, path))
        if counted is None:
            self.needed.add(path)
            return families[0]
        return max(families, key=lambda f: (counted.get(f, 0), -families.index(f)))


@attrs.frozen
class Settled:
    """The column types of a batch's events without a schema part, and how to find the misfits."""

    schema: T.StructType
    may_misfit: bool
    why: tuple[tuple[str, str], ...]

    def reason(self, target: T.StructType, image: Column) -> Column | None:
        """Why the event whose row image (JSON text) is ``image`` does not fit ``target`` (the
        batch's row type, this schema merged with the schema parts'), null when it fits; None when
        no value of the batch can misfit."""
        if not self.may_misfit:
            return None
        return F.udf(Misfits(target, self.why), T.StringType(), useArrow=True)(image)


def settle(bare: DataFrame, after: str, before: str, source: Column | None, declared: T.StructType | None) -> Settled:
    """Settle the types of the row images (columns ``after`` and ``before``, JSON text) of the events
    ``bare`` (those without a schema part), per source table (``source``: its name; None: one) on
    the table's types (:func:`table_types`) and the ``declared`` ones (the batch's schema parts).

    Raises:
        InvalidInputError: source tables whose values settle on types no single column holds.
    """
    images = bare.select(
        (source if source is not None else F.lit(None).cast("string")).alias(_SOURCE),
        F.explode(F.array(named(after), named(before))).alias(_TEXT),
    ).where(F.json_object_keys(F.col(_TEXT)).isNotNull())
    kinds: dict[str | None, Kind] = {}
    for part in images.rdd.mapPartitions(_kinds_by_source).collect():
        for name, kind in part.items():
            kinds[name] = merge_kinds(kinds.get(name, ("struct", ())), kind)
    known, origins = _known(declared)
    counts: dict[tuple[str | None, Path], dict[str, int]] = {}
    settlings = [_Settling(name, origins, counts) for name in kinds]
    types = [s.type_of(kinds[s.source], known, ()) for s in settlings]
    wanted = {s.source: sorted(s.needed, key=_display) for s in settlings if s.needed}
    if wanted:  # values of several kinds, no known type: count the images of each kind
        for counted in images.rdd.mapPartitions(_Counter(wanted)).collect():
            for key, by_family in counted.items():
                total = counts.setdefault(key, {})
                for family, n in by_family.items():
                    total[family] = total.get(family, 0) + n
        settlings = [_Settling(name, origins, counts) for name in kinds]
        types = [s.type_of(kinds[s.source], known, ()) for s in settlings]
    merged: T.DataType = T.StructType([])
    problems: list[str] = []
    for t in types:
        merged = union_types(merged, t, "", problems)
    if problems:
        raise InvalidInputError(
            "Debezium row images ('after'/'before') of this batch's source tables settle on types no single column "
            "holds (only Iceberg's promotions int->long, float->double and wider decimals are merged): "
            + "; ".join(problems)
        )
    assert isinstance(merged, T.StructType)
    why: dict[str, str] = {}
    for s in settlings:
        why.update(s.why)
    return Settled(merged, any(s.may_misfit for s in settlings), tuple(sorted(why.items())))


def _known(declared: T.StructType | None) -> tuple[T.StructType | None, dict[str, str]]:
    """The known types of the top-level fields (the schema parts' over the table's) and where each comes from."""
    fields: dict[str, T.StructField] = {}
    origins: dict[str, str] = {}
    for struct, origin in ((table_types(), TABLE), (declared, DECLARED)):
        for f in struct.fields if struct is not None else ():
            fields[f.name] = f
            origins[f.name] = origin
    return (T.StructType(list(fields.values())) if fields else None), origins


def _kinds_by_source(rows: Iterable[Any]) -> Iterator[dict[str | None, Kind]]:
    """One partition's row images merged into one kind per source table."""
    task_start()
    merged: dict[str | None, Kind] = {}
    for source, text in rows:
        value = _document(text)
        if value is not None:
            merged[source] = merge_kinds(merged.get(source, ("struct", ())), kind_of(value))
    yield merged


def _document(text: str | None) -> dict[str, Any] | None:
    """The JSON object ``text`` holds; None for anything else (refused by the envelope's checks)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _json_family(value: Any) -> str:
    """:func:`iceberg_sink.sources.readers.family_of` the kind of a (non-null) JSON value, without building the kind."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def _values_at(document: Any, path: Path) -> list[Any]:
    values = [document]
    for part in path:
        if part is None:
            values = [item for v in values if isinstance(v, list) for item in v]
        else:
            values = [v[part] for v in values if isinstance(v, dict) and part in v]
    return values


@attrs.frozen
class _Counter:
    """A partition's images of each kind family at the ``wanted`` paths of each source table (an
    image counts once per family it holds there)."""

    wanted: Mapping[str | None, list[Path]]

    def __call__(self, rows: Iterable[Any]) -> Iterator[dict[tuple[str | None, Path], dict[str, int]]]:
        task_start()
        counts: dict[tuple[str | None, Path], dict[str, int]] = {}
        for source, text in rows:
            paths = self.wanted.get(source)
            document = _document(text) if paths else None
            if document is None:
                continue
            for path in paths or ():
                families = {_json_family(v) for v in _values_at(document, path) if v is not None}
                counted = counts.setdefault((source, path), {})
                for family in families:
                    counted[family] = counted.get(family, 0) + 1
        yield counts


# -- the events that do not fit


@attrs.frozen
class Misfits:
    """Why a row image (JSON text) does not fit ``target``: its first field, in the type's order,
    whose value is of another JSON kind than the field's type takes; None when it fits. ``why``:
    where a field's type comes from, by path (:data:`TABLE`, :data:`DECLARED`, :data:`MAJORITY`)."""

    target: T.StructType
    why: tuple[tuple[str, str], ...]

    def __call__(self, text: str | None) -> str | None:
        document = _document(text)
        return None if document is None else self._first(document, self.target, "")

    def _first(self, value: Any, dtype: T.DataType, path: str) -> str | None:
        if value is None:
            return None
        family = _family(dtype)
        if family is None:
            return None  # a date, timestamp, binary ...: read (and refused) by its own rules
        fraction = isinstance(value, float) and isinstance(dtype, _INTEGRAL)
        if _json_family(value) != family or fraction:
            return self._message(value, dtype, path)
        if isinstance(dtype, T.StructType):
            for f in dtype.fields:
                found = self._first(value.get(f.name), f.dataType, f"{path}.{f.name}" if path else f.name)
                if found is not None:
                    return found
        elif isinstance(dtype, T.MapType):
            for item in value.values():
                found = self._first(item, dtype.valueType, f"{path}.value")
                if found is not None:
                    return found
        elif isinstance(dtype, T.ArrayType):
            for item in value:
                found = self._first(item, dtype.elementType, f"{path}.element")
                if found is not None:
                    return found
        return None

    def _message(self, value: Any, dtype: T.DataType, path: str) -> str:
        why = dict(self.why).get(path, SETTLED)
        return f"field '{path}' holds {_shown(value)}, which does not fit {_label(dtype)}, {why}"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return f"the JSON {_json_family(value)} {text}"


def _label(dtype: T.DataType) -> str:
    if isinstance(dtype, T.StructType):
        return "an object (struct)"
    if isinstance(dtype, T.MapType):
        return "an object (map)"
    if isinstance(dtype, T.ArrayType):
        return "an array"
    if isinstance(dtype, T.IntegerType):
        return "int"
    if isinstance(dtype, T.DecimalType):
        return dtype.simpleString()
    return dtype.typeName()
