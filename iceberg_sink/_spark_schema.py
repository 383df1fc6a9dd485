"""A DataFrame's schema as the driver asks for it in every micro-batch, without Spark's JSON of it.

PySpark's ``DataFrame.schema`` (and ``columns``, which reads it) asks the JVM for the schema rendered
as JSON, once per DataFrame object, and Spark renders it slowly: about 43 ms for 160 columns on a
2-core machine. A micro-batch's road builds about ten DataFrames whose columns the sink needs (the
reader's, the refusals', the reduction's, the distribution's, the writers'), and each is new: 0.4 s
of a 1.5 s steady micro-batch of a 160-column Debezium table went to those renderings. They are
nearly always schemas the driver has rendered before (the same steps over the same columns, batch
after batch).

:func:`schema_of` asks the JVM instead whether the schema equals one it rendered before (its
``hashCode``, then ``StructType.equals`` on the candidates: names, types, nullability and metadata
field by field, so the answer is exact), two Py4J calls; a schema not seen before is rendered as
PySpark renders it and kept (the last :data:`KEPT` per SparkContext). The DataFrame's own cache is
given the answer, so PySpark's own later reads of it (``columns`` inside ``mapInArrow``) render
nothing either. This is the one module that leans on PySpark's private attributes for it
(``_jdf``, the cached ``schema`` of 4.x, ``_schema`` of 3.5).

:func:`built` keeps the other thing a micro-batch would otherwise make again: the Columns the driver
builds through Py4J for the same schema batch after batch (the Debezium reader's, the route's, a
routed batch's planning aggregates).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import cached_property
from typing import Any

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

#: How many rendered schemas are kept per SparkContext (the oldest seen is forgotten first).
KEPT = 64


class _Rendered:
    """The schemas rendered on one SparkContext: the JVM's StructType beside PySpark's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_hash: OrderedDict[int, list[tuple[Any, StructType]]] = OrderedDict()

    def find(self, jschema: Any, code: int) -> StructType | None:
        with self.lock:
            candidates = list(self.by_hash.get(code, ()))
        for known, schema in candidates:
            if known.equals(jschema):
                with self.lock:
                    if code in self.by_hash:
                        self.by_hash.move_to_end(code)
                return schema
        return None

    def keep(self, jschema: Any, code: int, schema: StructType) -> None:
        with self.lock:
            self.by_hash.setdefault(code, []).append((jschema, schema))
            self.by_hash.move_to_end(code)
            while len(self.by_hash) > KEPT:
                self.by_hash.popitem(last=False)


_RENDERED: weakref.WeakKeyDictionary[SparkContext, _Rendered] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _rendered(context: SparkContext) -> _Rendered:
    with _LOCK:
        found = _RENDERED.get(context)
        if found is None:
            found = _RENDERED[context] = _Rendered()
        return found


def schema_of(df: DataFrame) -> StructType:
    """``df.schema``, rendered by Spark only when no DataFrame of this SparkContext had it before.

    The answer is a StructType of its own (a copy of the kept one), so a caller that adds a field to
    it changes no other DataFrame's schema."""
    own = _own(df)
    if own is not None:
        return own
    jschema = df._jdf.schema()
    code = int(jschema.hashCode())
    rendered = _rendered(df.sparkSession.sparkContext)
    kept = rendered.find(jschema, code)
    if kept is None:
        kept = df.schema  # rendered as PySpark renders it; df's own cache is given a copy below
        rendered.keep(jschema, code, kept)
    schema = StructType(list(kept.fields))
    _give(df, schema)
    return schema


def columns_of(df: DataFrame) -> list[str]:
    """``df.columns``, through :func:`schema_of`."""
    return schema_of(df).fieldNames()


def _cached_property(df: DataFrame) -> bool:
    """Whether ``df``'s class caches its schema as a cached property (PySpark 4), not in ``_schema`` (3.5)."""
    return isinstance(type(df).__dict__.get("schema"), cached_property)


def _own(df: DataFrame) -> StructType | None:
    """The schema PySpark already holds for ``df``, if it rendered one."""
    found = df.__dict__.get("schema") if _cached_property(df) else getattr(df, "_schema", None)
    return found if isinstance(found, StructType) else None


def _give(df: DataFrame, schema: StructType) -> None:
    """Put ``schema`` in ``df``'s own cache."""
    if _cached_property(df):
        df.__dict__["schema"] = schema
    elif hasattr(df, "_schema"):
        df._schema = schema


# -- Columns built once per Spark context (the sources' readers, the route, the reduction)

_BUILT: OrderedDict[tuple[Any, ...], tuple[weakref.ref[SparkContext], Any]] = OrderedDict()
_BUILT_LIMIT = 32
_BUILT_LOCK = threading.Lock()


def built(spark: SparkSession, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
    """``build()`` (Columns), made once per Spark context and ``key`` and reused by later batches.

    A row image's conversions and checks are Column expressions built through Py4J, tens of round
    trips per column and more per nested field (PySpark 4 also records each call's Python call site):
    about 118,000 for a batch of an 80-column table, which took 10 s of the driver's time whatever
    the batch's size. Columns are unresolved expressions naming columns, so the same ones serve every
    batch with the same schema parts, in any session of the JVM: keyed by the Spark context, since
    ``foreachBatch`` hands each micro-batch a session object of its own. The most recent 32 keys are
    kept; an entry of a stopped context is not used (its Py4J objects belong to a gone JVM)."""
    context = spark.sparkContext
    full = (id(context), *key)
    with _BUILT_LOCK:
        entry = _BUILT.get(full)
        if entry is not None and entry[0]() is context:
            _BUILT.move_to_end(full)
            return entry[1]
    value = build()
    with _BUILT_LOCK:
        _BUILT[full] = (weakref.ref(context), value)
        while len(_BUILT) > _BUILT_LIMIT:
            _BUILT.popitem(last=False)
    return value
