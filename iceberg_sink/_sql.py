"""Spark SQL text for the expressions the driver builds per batch.

Each PySpark ``Column`` operation (``F.col``, ``F.lit``, ``.cast``, ``|``...) is a Py4J round trip to
the JVM, and the change reduction, its refusals and the fail-fast check build hundreds of them for
every checkpoint. The same expression written as SQL text is parsed by the JVM in one call
(``F.expr``, ``DataFrame.where(str)``), into the same Catalyst expression. These helpers put names
and strings chosen by data into that text so that Spark reads them back as they were written:

- Spark replaces ``${...}`` in SQL text before parsing it (``spark.sql.variable.substitute``, on by
  default), inside quotes and backticks too: ```price_${currency}``` reads as ```price_``` (another
  column) and ``'${env:HOME}'`` as the driver's home directory. So no text made here holds ``${``;
  :func:`parse` checks that for every expression the sink hands to Spark.
- A string literal's backslashes are escapes by default and kept as written under
  ``spark.sql.parser.escapedStringLiterals=true``: a string holding a quote, a backslash or a dollar
  sign is written as ``concat`` of plain literals and ``chr(...)``, which reads the same either way.
- A column whose name holds ``${`` is referenced as ``IDENTIFIER(<that string>)`` (Spark 3.5+).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

SUBSTITUTED = "${"
_SPECIAL = re.compile(r"(['\\$])")
_CHR = {"'": "chr(39)", "\\": "chr(92)", "$": "chr(36)"}


class UnsafeSqlText(ValueError):
    """SQL text that Spark would not read as written (it holds ``${``): a bug in the text's builder."""


def parse(text: str) -> Column:
    """``F.expr(text)``, once the text is checked to hold no ``${`` (see the module's docstring)."""
    return F.expr(checked(text))


def where(df: DataFrame, text: str) -> DataFrame:
    """``df.where(text)``, once the text is checked to hold no ``${``."""
    return df.where(checked(text))


def checked(text: str) -> str:
    """``text``, once it is checked to hold no ``${`` (:class:`UnsafeSqlText` if it does)."""
    if SUBSTITUTED in text:
        raise UnsafeSqlText(f"SQL text holds '{SUBSTITUTED}', which Spark would substitute: {text[:200]!r}")
    return text


def string(text: str) -> str:
    """A string that Spark reads as ``text`` under either literal-parsing mode: a literal, or (for a
    quote, a backslash or a dollar sign) ``concat`` of literals and ``chr(...)``, foldable as a literal
    is (``named_struct``'s names and ``from_json``'s schema take it; a struct field lookup does not:
    :func:`field`)."""
    if not _SPECIAL.search(text):
        return f"'{text}'"
    pieces = [_CHR.get(p) or f"'{p}'" for p in _SPECIAL.split(text) if p]
    return pieces[0] if len(pieces) == 1 else "concat(" + ", ".join(pieces) + ")"


def strings(values: Iterable[str]) -> str:
    """Comma-separated strings (an ``IN (...)`` list)."""
    return ", ".join(string(v) for v in values)


def ident(name: str) -> str:
    """One identifier quoted (dots included: ``a.b`` names one column), where a name is declared: an
    alias, a struct field in type text. A name holding ``${`` has no such text (:class:`UnsafeSqlText`):
    its callers declare it otherwise (``named_struct``, ``Column.alias``)."""
    if SUBSTITUTED in name:
        raise UnsafeSqlText(f"the name {name!r} holds '{SUBSTITUTED}': it cannot be written as SQL text")
    return quoted(name)


def quoted(name: str) -> str:
    """``name`` in backticks, a backtick doubled; no check for ``${`` (for text Spark's substituting
    parser never reads: a DDL string, ``F.col``'s attribute name, inside :func:`string`)."""
    return "`" + name.replace("`", "``") + "`"


def column(name: str) -> str:
    """A reference to the column named exactly ``name`` (dots are part of it)."""
    return _reference([name])


def named(name: str) -> Column:
    """The top-level column named exactly ``name``, as a Column: ``F.col(name)`` reads dots as nested
    fields (``my.value``: field ``value`` of a struct ``my``, or an error) and backticks as quoting.
    Every column the caller names as a column of the DataFrame (checked against ``df.columns``) is
    referenced through this or :func:`column`."""
    return F.col(quoted(name))


def path(name: str) -> str:
    """A column reference as ``F.col(name)`` reads it: dots select nested fields."""
    return _reference(name.split("."))


def path_column(name: str) -> Column:
    """:func:`path` as a Column (dots select nested fields; each part quoted as written)."""
    return F.col(".".join(quoted(p) for p in name.split(".")))


def _reference(parts: list[str]) -> str:
    text = ".".join(quoted(p) for p in parts)
    return f"IDENTIFIER({string(text)})" if SUBSTITUTED in text else text


def row_struct(names: Sequence[str]) -> str:
    """SQL text of a struct of the columns ``names``, each field named as its column: ``struct(...)``,
    whose fields take their columns' names, half the text Spark parses and analyses for a wide row
    of ``named_struct('name', `name`, ...)`` (a 160-column row: 6 against 13 ms); ``named_struct`` where
    a name holds ``${`` (its reference, ``IDENTIFIER(...)``, would name its field ``colN``)."""
    if any(SUBSTITUTED in n for n in names):
        return "named_struct(" + ", ".join(f"{string(n)}, {column(n)}" for n in names) + ")"
    return "struct(" + ", ".join(column(n) for n in names) + ")"


def field(sql: str, name: str) -> str:
    """Struct field ``name`` of the expression ``sql`` (``Column.getField``): ``(x).`name```, or, for a
    name holding ``${``, ``x['name']`` with the dollar sign as the escape ``\\u0024`` (a lookup needs a
    literal; under ``escapedStringLiterals=true`` that name is then not found, and the batch fails
    before anything is committed)."""
    if SUBSTITUTED not in name:
        return f"({sql}).{ident(name)}"
    escaped = name.replace("\\", "\\\\").replace("'", "\\'").replace("$", "\\u0024")
    return f"{sql}['{escaped}']"


def struct_type(struct: T.StructType) -> str:
    """A flat struct type as SQL text, field names quoted (``partition`` and ``offset`` are keywords)."""
    return "struct<" + ", ".join(f"{ident(f.name)}: {f.dataType.simpleString()}" for f in struct.fields) + ">"


def valid_utf8(name: str, spark_version: str) -> Column:
    """Whether the string column ``name`` holds valid UTF-8 (null for null): Spark strings may hold
    any bytes, Iceberg strings may not. Spark 4 has ``is_valid_utf8``; on 3.5 a string is valid when
    its bytes equal their re-encoding (each invalid sequence becomes U+FFFD there)."""
    if int(spark_version.split(".")[0]) >= 4:
        return parse(f"is_valid_utf8({column(name)})")
    return parse(f"CAST({column(name)} AS BINARY) = encode({column(name)}, 'UTF-8')")
