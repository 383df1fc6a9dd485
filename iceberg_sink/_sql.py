"""Spark SQL text for the expressions the driver builds per batch.

Each PySpark ``Column`` operation (``F.col``, ``F.lit``, ``.cast``, ``|``...) is a Py4J round trip to
the JVM, and the change reduction, its refusals and the fail-fast check build hundreds of them for
every checkpoint. The same expression written as SQL text is parsed by the JVM in one call
(``F.expr``, ``DataFrame.where(str)``), into the same Catalyst expression. These helpers quote what
goes into that text.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import types as T


def ident(name: str) -> str:
    """One identifier (a column or field name, dots included) quoted: ``a.b`` names one column."""
    return "`" + name.replace("`", "``") + "`"


def path(name: str) -> str:
    """A column reference as ``F.col(name)`` reads it: dots select nested fields."""
    return ".".join(ident(p) for p in name.split("."))


def string(text: str) -> str:
    """A string literal (Spark's default parser: backslash escapes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def strings(values: Iterable[str]) -> str:
    """Comma-separated string literals (an ``IN (...)`` list)."""
    return ", ".join(string(v) for v in values)


def struct_type(struct: T.StructType) -> str:
    """A flat struct type as SQL text, field names quoted (``partition`` and ``offset`` are keywords)."""
    return "struct<" + ", ".join(f"{ident(f.name)}: {f.dataType.simpleString()}" for f in struct.fields) + ">"
