"""Writing format v3 table metadata files, which PyIceberg 0.12 refuses.

PyIceberg 0.12 parses v3 metadata (``TableMetadataV3``, with ``next-row-id``) but its
``model_dump_json`` raises ``NotImplementedError`` (iceberg-python #1551), so no catalog that writes
metadata files itself (SQL, Glue, Hive, ...) can create or commit to a v3 table through it. The
sink builds every v3 snapshot itself (row lineage included: ``_iceberg/lineage.py``), so it only
needs the JSON written. :func:`v3_metadata_writes` allows that for the metadata the current thread
commits inside it; everywhere else (another thread, PyIceberg's own writers used by an application
beside the sink) PyIceberg's refusal stands.

Two gaps of PyIceberg's v3 model are filled when writing:

- a new table's ``next-row-id`` is None in PyIceberg (``new_table_metadata``); the spec requires it
  and starts it at 0 (Iceberg Java's ``TableMetadata.INITIAL_ROW_ID``). A table with snapshots and
  no ``next-row-id`` cannot be repaired here and is refused.
- its staged creation (``create_table_transaction``) replays ``UpgradeFormatVersionUpdate(3)``,
  which PyIceberg refuses; the sink creates v3 tables directly instead (``table/catalog.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from pyiceberg.table.metadata import TableMetadataV3
from pyiceberg.typedef import IcebergBaseModel

INITIAL_ROW_ID = 0
"""The ``next-row-id`` of a v3 table without snapshots (the spec; Java's INITIAL_ROW_ID)."""

_WRITING = contextvars.ContextVar("iceberg_sink_v3_metadata_writes", default=False)
_REFUSING = TableMetadataV3.model_dump_json


def _model_dump_json(
    self: TableMetadataV3, exclude_none: bool = True, exclude: Any | None = None, by_alias: bool = True, **kwargs: Any
) -> str:
    if not _WRITING.get():
        return _REFUSING(self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs)
    if self.next_row_id is None:
        if self.snapshots:
            raise ValueError(
                f"format v3 table metadata with {len(self.snapshots)} snapshots has no next-row-id; "
                "expected one (the spec requires it): the table's row lineage cannot be continued"
            )
        self = self.model_copy(update={"next_row_id": INITIAL_ROW_ID})
    return IcebergBaseModel.model_dump_json(
        self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs
    )


TableMetadataV3.model_dump_json = _model_dump_json  # type: ignore[method-assign]


@contextlib.contextmanager
def v3_metadata_writes() -> Iterator[None]:
    """Let the current thread write format v3 metadata files while inside (see the module doc)."""
    token = _WRITING.set(True)
    try:
        yield
    finally:
        _WRITING.reset(token)
