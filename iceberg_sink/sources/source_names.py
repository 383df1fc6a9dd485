"""The routed table name of a Debezium source table: the rule as a Spark expression and its Python twin.

A Debezium event names its source table in ``source``: ``db``, ``schema`` (null for MySQL and
MariaDB) and ``table``. ``.debezium(...)`` with ``.route(table_column="source_table", namespace=...)``
writes each source table to the Iceberg table this rule names, in the route's namespace:

- **the default** (``table_fields=None``): the table's own name when its schema is the database's
  default one (PostgreSQL's ``public``, SQL Server's ``dbo``) or has none (MySQL, MariaDB); otherwise
  ``<schema>__<table>`` (two underscores). PostgreSQL's ``shop.public.customers`` becomes
  ``shop.customers`` with ``namespace="shop"``, ``shop.sales.orders`` becomes ``shop.sales__orders``:
  the names a user would pick, plain lower-case identifiers every engine shows unquoted. The database
  is left out: one connector reads one database (PostgreSQL always; MySQL's connector can read
  several: see below).
- ``table_fields=(...)``: those ``source`` fields; one is used as is, several are joined with
  ``_s_`` after doubling every ``_`` of each (``inventory``, ``public``, ``order_items`` give
  ``inventory_s_public_s_order__items``): the default of the release before this one was
  ``("db", "schema", "table")``.

Two sources never write one table: a batch whose events of two sources map to one name refuses them
(sources/debezium.py), and a routed job records each table's source in its checkpoint
(:meth:`iceberg_sink.committer.store.CheckpointStore.record_sources`) and refuses another source's
events for it later (job/routing.py). With MySQL's connector reading several databases whose tables
share names, give the database a place in the name: ``table_fields=("db", "table")``.

A source is identified by :func:`identity`: ``db.schema.table`` with an empty part for a missing
field, the text the refusals name.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

#: Schemas whose tables keep their own name under the default rule.
DEFAULT_SCHEMAS = ("public", "dbo")
#: What joins a schema and a table of another schema under the default rule.
SCHEMA_SEPARATOR = "__"
#: What joins several ``table_fields`` (each with its ``_`` doubled).
FIELD_SEPARATOR = "_s_"
#: The ``source`` fields identifying a source table.
IDENTITY_FIELDS = ("db", "schema", "table")


def name_column(fields: dict[str, Column], table_fields: Sequence[str] | None) -> Column:
    """The routed table name (without namespace) of an event, from its ``source`` fields ``fields``
    (a Column per field name, null when missing)."""
    if table_fields is None:
        schema, table = fields["schema"], fields["table"]
        own = schema.isNull() | schema.isin(*DEFAULT_SCHEMAS)
        return F.when(own, table).otherwise(F.concat(schema, F.lit(SCHEMA_SEPARATOR), table))
    parts = [fields[f] for f in table_fields]
    if len(parts) == 1:
        return parts[0]
    return F.concat_ws(FIELD_SEPARATOR, *[F.regexp_replace(p, "_", "__") for p in parts])


def identity_column(fields: dict[str, Column]) -> Column:
    """The source's identity (:func:`identity`) as a Column."""
    return F.concat_ws(".", *[F.coalesce(fields[f], F.lit("")) for f in IDENTITY_FIELDS])


def identity(db: str | None, schema: str | None, table: str | None) -> str:
    """``db.schema.table``, an empty part for a missing field."""
    return ".".join(p or "" for p in (db, schema, table))


def name_of(source: str, table_fields: Sequence[str] | None) -> str | None:
    """The Python twin of :func:`name_column` for a source :func:`identity`; None when the identity
    cannot be split back into its fields (a part holding a dot) or the rule names no table."""
    parts = source.split(".")
    if len(parts) != len(IDENTITY_FIELDS):
        return None
    fields = {f: (p or None) for f, p in zip(IDENTITY_FIELDS, parts, strict=True)}
    if table_fields is None:
        schema, table = fields["schema"], fields["table"]
        if table is None:
            return None
        return table if schema is None or schema in DEFAULT_SCHEMAS else f"{schema}{SCHEMA_SEPARATOR}{table}"
    values = [fields.get(f) for f in table_fields]
    if len(values) == 1:
        return values[0]
    present = [v.replace("_", "__") for v in values if v is not None]
    return FIELD_SEPARATOR.join(present) or None


def earlier_default_source(name: str) -> str | None:
    """The source :func:`identity` a table name of the previous release's default rule
    (``table_fields=("db", "schema", "table")``: ``shop_s_public_s_customers``) was made from, or
    None when ``name`` is not such a name. Read left to right: ``__`` is one ``_``, ``_s_`` ends a
    part, any other ``_`` means the name was not made by that rule. Two parts are a source without
    schema (MySQL: db and table)."""
    parts, part, i = [], [], 0
    while i < len(name):
        if name.startswith("__", i):
            part.append("_")
            i += 2
        elif name.startswith(FIELD_SEPARATOR, i):
            parts.append("".join(part))
            part = []
            i += len(FIELD_SEPARATOR)
        elif name[i] == "_":
            return None
        else:
            part.append(name[i])
            i += 1
    parts.append("".join(part))
    if any(not p or "." in p for p in parts):
        return None
    if len(parts) == 3:
        return identity(*parts)
    if len(parts) == 2:
        return identity(parts[0], None, parts[1])
    return None
