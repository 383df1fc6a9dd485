"""Column expressions built as Spark SQL text in Python, turned into a Column in one Py4J call.

Each PySpark ``Column`` operation is a round trip to the JVM (and PySpark 4 records each call's
Python call site): the Debezium reader's conversions and checks took tens of them per column,
77,000 for the first batch of a 160-column table (13 s of the driver's time). :class:`Expr` offers
the part of ``Column``'s interface those builders use, and :data:`functions` (imported as ``F``) the
part of ``pyspark.sql.functions``; each renders its SQL text, fully parenthesised, and
:meth:`Expr.column` parses it once (``F.expr``) into the same Catalyst expression the Column calls
would have built: ``x.getField(n)`` is ``(x).`n``` (Spark's ``UnresolvedExtractValue``, as
``getField`` builds), a lambda is ``(x1, x2) -> body`` with variables named apart. Names and string
literals are written by :mod:`iceberg_sink._sql`, so names chosen by data (dots, backticks, quotes,
backslashes, ``${...}``, control characters) go through unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import types as T

from iceberg_sink._sql import SUBSTITUTED, UnsafeSqlText, column, field, ident, parse, quoted, string

_VARIABLES = itertools.count()


def sql_type(dtype: T.DataType | str, quote: Callable[[str], str] = ident) -> str:
    """``dtype`` as SQL type text: field names quoted, a struct field's NOT NULL kept (a type name
    given as text is used as is). A field name holding ``${`` cannot be written in SQL text (raises
    :class:`UnsafeSqlText`); inside a string (``from_json``'s schema) ``quote`` takes any name."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, T.StructType):
        fields = [
            f"{quote(f.name)}: {sql_type(f.dataType, quote)}{'' if f.nullable else ' NOT NULL'}" for f in dtype.fields
        ]
        return "struct<" + ", ".join(fields) + ">"
    if isinstance(dtype, T.ArrayType):
        return f"array<{sql_type(dtype.elementType, quote)}>"
    if isinstance(dtype, T.MapType):
        return f"map<{sql_type(dtype.keyType, quote)}, {sql_type(dtype.valueType, quote)}>"
    return dtype.simpleString()


def _schema_string(dtype: T.DataType) -> Expr:
    """``dtype`` as a DDL string (parsed by Spark's type parser, which substitutes nothing)."""
    return Expr(string(sql_type(dtype, quoted)))


def lit(value: Any) -> Expr:
    """A literal typed as ``F.lit`` types it (an int past 32 bits is a long, a float a double)."""
    if isinstance(value, Expr):
        return value
    if value is None:
        return Expr("NULL")
    if isinstance(value, bool):
        return Expr("true" if value else "false")
    if isinstance(value, int):
        text = str(value) if -(2**31) <= value < 2**31 else f"{value}L"
        return Expr(f"({text})" if value < 0 else text)
    if isinstance(value, float):
        if math.isnan(value):  # no literal: a cast (nullable, where F.lit's is not)
            return Expr("CAST('NaN' AS DOUBLE)")
        if math.isinf(value):  # no literal: a cast (nullable, where F.lit's is not)
            return Expr(f"CAST('{'' if value > 0 else '-'}Infinity' AS DOUBLE)")
        text = repr(value)  # 0.1, 1e-300, -0.0: a double literal with the D suffix
        return Expr(f"(-{text[1:]}D)" if text.startswith("-") else f"{text}D")
    if isinstance(value, str):
        return Expr(string(value))
    raise TypeError(f"no SQL literal for {value!r} ({type(value).__name__})")


class Expr:
    """An expression as SQL text; the operators and methods of ``Column`` that the builders use."""

    __slots__ = ("_sql", "name")
    __hash__ = None  # type: ignore[assignment]  # == builds an expression, as Column's does

    def __init__(self, sql: str, name: str | None = None) -> None:
        self._sql = sql
        self.name = name

    @property
    def sql(self) -> str:
        return self._sql

    def column(self) -> Column:
        """The expression as a Column (one Py4J call), named when it was aliased (a name holding ``${``,
        which SQL text cannot declare, by ``Column.alias``: a second call)."""
        if self.name is None:
            return parse(self.sql)
        if SUBSTITUTED in self.name:
            return parse(self.sql).alias(self.name)
        return parse(f"{self.sql} AS {ident(self.name)}")

    def _op(self, op: str, other: Any) -> Expr:
        return Expr(f"({self.sql} {op} {lit(other).sql})")

    def _rop(self, op: str, other: Any) -> Expr:
        return Expr(f"({lit(other).sql} {op} {self.sql})")

    def __and__(self, other: Any) -> Expr:
        return self._op("AND", other)

    def __or__(self, other: Any) -> Expr:
        return self._op("OR", other)

    def __invert__(self) -> Expr:
        return Expr(f"(NOT {self.sql})")

    def __eq__(self, other: Any) -> Expr:  # type: ignore[override]
        return self._op("=", other)

    def __ne__(self, other: Any) -> Expr:  # type: ignore[override]
        return self._op("!=", other)

    def __lt__(self, other: Any) -> Expr:
        return self._op("<", other)

    def __le__(self, other: Any) -> Expr:
        return self._op("<=", other)

    def __gt__(self, other: Any) -> Expr:
        return self._op(">", other)

    def __ge__(self, other: Any) -> Expr:
        return self._op(">=", other)

    def __add__(self, other: Any) -> Expr:
        return self._op("+", other)

    def __radd__(self, other: Any) -> Expr:
        return self._rop("+", other)

    def __sub__(self, other: Any) -> Expr:
        return self._op("-", other)

    def __rsub__(self, other: Any) -> Expr:
        return self._rop("-", other)

    def __mul__(self, other: Any) -> Expr:
        return self._op("*", other)

    def __rmul__(self, other: Any) -> Expr:
        return self._rop("*", other)

    def __truediv__(self, other: Any) -> Expr:
        return self._op("/", other)

    def __rtruediv__(self, other: Any) -> Expr:
        return self._rop("/", other)

    def __neg__(self) -> Expr:
        return Expr(f"(- {self.sql})")

    def __bool__(self) -> bool:
        raise ValueError("an Expr has no truth value: use & | ~ for and, or, not (as with Column)")

    def isNull(self) -> Expr:
        return Expr(f"({self.sql} IS NULL)")

    def isNotNull(self) -> Expr:
        return Expr(f"({self.sql} IS NOT NULL)")

    def isin(self, *values: Any) -> Expr:
        if not values:
            raise ValueError("isin() needs at least one value")
        return Expr(f"({self.sql} IN ({', '.join(lit(v).sql for v in values)}))")

    def getField(self, name: str) -> Expr:
        """A struct's field by name."""
        return Expr(field(self.sql, name))

    def getItem(self, key: str) -> Expr:
        """A map's value by its string key."""
        return Expr(f"{self.sql}[{string(key)}]")

    def cast(self, dtype: T.DataType | str) -> Expr:
        return self._cast("CAST", dtype)

    def try_cast(self, dtype: T.DataType | str) -> Expr:
        return self._cast("TRY_CAST", dtype)

    def _cast(self, kind: str, dtype: T.DataType | str) -> Expr:
        try:
            return Expr(f"{kind}({self.sql} AS {sql_type(dtype)})")
        except UnsafeSqlText:
            if self.sql != "NULL" or isinstance(dtype, str):
                raise
            # A null of a type whose text cannot be written (a field name holding ${): from_json of a
            # null string, its schema given as a string.
            return Expr(f"from_json(CAST(NULL AS STRING), {_schema_string(dtype).sql})")

    def alias(self, name: str) -> Expr:
        return Expr(self.sql, name)

    def substr(self, start: Any, length: Any) -> Expr:
        return _call("substr", self, start, length)

    def contains(self, other: Any) -> Expr:
        return _call("contains", self, other)

    def when(self, condition: Expr, value: Any) -> Expr:
        raise TypeError("when() follows functions.when(...), as with Column")

    def otherwise(self, value: Any) -> Expr:
        raise TypeError("otherwise() follows functions.when(...), as with Column")


class _Case(Expr):
    """``CASE WHEN ... END``, as ``F.when(...).when(...).otherwise(...)`` builds it."""

    __slots__ = ("_branches", "_else")

    def __init__(self, branches: tuple[tuple[Expr, Expr], ...], otherwise: Expr | None = None) -> None:
        super().__init__("")
        self._branches = branches
        self._else = otherwise

    @property
    def sql(self) -> str:
        whens = " ".join(f"WHEN {c.sql} THEN {v.sql}" for c, v in self._branches)
        rest = f" ELSE {self._else.sql}" if self._else is not None else ""
        return f"(CASE {whens}{rest} END)"

    def when(self, condition: Expr, value: Any) -> Expr:
        if self._else is not None:
            raise TypeError("when() after otherwise()")
        return _Case((*self._branches, (condition, lit(value))))

    def otherwise(self, value: Any) -> Expr:
        if self._else is not None:
            raise TypeError("otherwise() twice")
        return _Case(self._branches, lit(value))


def _call(name: str, *args: Any) -> Expr:
    return Expr(f"{name}({', '.join(lit(a).sql for a in args)})")


def _function(name: str) -> Callable[..., Expr]:
    """``name(arguments...)``, as a static method of :class:`functions`."""
    return staticmethod(lambda *args: _call(name, *args))  # type: ignore[return-value]


def _lambda(fn: Callable[..., Expr], arity: int) -> str:
    names = [f"__x{next(_VARIABLES)}" for _ in range(arity)]
    body = fn(*[Expr(n) for n in names])
    params = names[0] if arity == 1 else "(" + ", ".join(names) + ")"
    return f"{params} -> {body.sql}"


class functions:
    """The part of ``pyspark.sql.functions`` the builders use, as SQL text."""

    lit = staticmethod(lit)
    # Functions whose SQL form is the call itself, their arguments literals or expressions.
    coalesce, concat, array, get, map_values, sequence = map(
        _function, ("coalesce", "concat", "array", "get", "map_values", "sequence")
    )
    # No abs: Spark's abs of a decimal rounds to 34 digits (Scala's BigDecimal context).
    size, length, lower, hex, floor, greatest = map(_function, ("size", "length", "lower", "hex", "floor", "greatest"))
    conv, substring, try_add, try_multiply = map(_function, ("conv", "substring", "try_add", "try_multiply"))
    regexp_replace = _function("regexp_replace")
    try_element_at, date_add, make_dt_interval = map(_function, ("try_element_at", "date_add", "make_dt_interval"))

    @staticmethod
    def col(name: str) -> Expr:
        """One column by its exact name (no dots selecting fields)."""
        return Expr(column(name))

    @staticmethod
    def when(condition: Expr, value: Any) -> Expr:
        return _Case(((condition, lit(value)),))

    @staticmethod
    def struct(*fields: Expr) -> Expr:
        if any(f.name is None for f in fields):
            raise ValueError("struct() fields must be aliased (their names)")
        return Expr("named_struct(" + ", ".join(f"{string(str(f.name))}, {f.sql}" for f in fields) + ")")

    @staticmethod
    def from_json(value: Expr, schema: T.DataType) -> Expr:
        return _call("from_json", value, _schema_string(schema))

    @staticmethod
    def transform(array: Expr, fn: Callable[[Expr], Expr]) -> Expr:
        return Expr(f"transform({array.sql}, {_lambda(fn, 1)})")

    @staticmethod
    def filter(array: Expr, fn: Callable[[Expr], Expr]) -> Expr:
        return Expr(f"filter({array.sql}, {_lambda(fn, 1)})")

    @staticmethod
    def transform_values(value: Expr, fn: Callable[[Expr, Expr], Expr]) -> Expr:
        return Expr(f"transform_values({value.sql}, {_lambda(fn, 2)})")

    @staticmethod
    def zip_with(left: Expr, right: Expr, fn: Callable[[Expr, Expr], Expr]) -> Expr:
        return Expr(f"zip_with({left.sql}, {right.sql}, {_lambda(fn, 2)})")

    @staticmethod
    def map_zip_with(left: Expr, right: Expr, fn: Callable[[Expr, Expr, Expr], Expr]) -> Expr:
        return Expr(f"map_zip_with({left.sql}, {right.sql}, {_lambda(fn, 3)})")

    @staticmethod
    def aggregate(array: Expr, zero: Expr, fn: Callable[[Expr, Expr], Expr]) -> Expr:
        return Expr(f"aggregate({array.sql}, {zero.sql}, {_lambda(fn, 2)})")
