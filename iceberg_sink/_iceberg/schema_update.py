"""Schema changes through PyIceberg's ``UpdateSchema``: preview (without committing) and commit.

Only additions of optional columns and type promotions are ever staged here (the sink's schema
evolution, table/evolution.py); PyIceberg itself refuses anything incompatible.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.types import IcebergType

from iceberg_sink._iceberg.v3_metadata import v3_metadata_writes

#: One change: (path from the top-level column, "add" or "widen", the new column's or new type).
SchemaChange = tuple[tuple[str, ...], str, IcebergType]


def _stage(table: Table, changes: Sequence[SchemaChange]) -> UpdateSchema:
    update = table.update_schema()
    for path, kind, field_type in changes:
        if kind == "add":
            update.add_column(path, field_type, required=False)
        else:
            update.update_column(path, field_type=field_type)
    return update


def preview(table: Table, changes: Sequence[SchemaChange]) -> Schema:
    """The schema ``table`` would have after ``changes``; nothing is committed."""
    return _stage(table, changes)._apply()


def commit(table: Table, changes: Sequence[SchemaChange]) -> None:
    """Commit ``changes`` on ``table`` as loaded (the catalog refuses it if the schema moved meanwhile).
    On a v3 table the metadata is written through ``v3_metadata.py`` (a schema change leaves row
    lineage as it is)."""
    with v3_metadata_writes():
        _stage(table, changes).commit()
