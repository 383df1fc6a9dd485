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

Upgrading a v2 table to v3 is the same update, which PyIceberg's catalogs refuse when they apply it
(``SUPPORTED_TABLE_FORMAT_VERSION`` is 2). :class:`UpgradeToV3` is that update (a REST catalog
receives the same ``upgrade-format-version`` JSON), applied here as Iceberg Java's
``TableMetadata.Builder.upgradeFormatVersion`` does: the format version changes and nothing else; the
table's ``next-row-id`` starts at 0 (a v2 table's, in Java's model). Existing snapshots keep no
``first-row-id``; the next snapshot's v3 manifest list gives every data manifest without one (all the
v2 ones) a range of ids (``_iceberg/lineage.py``), so existing rows get ids from then on.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.update import UpgradeFormatVersionUpdate, _apply_table_update, _TableMetadataUpdateContext
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


UPGRADABLE_FORMAT_VERSIONS = (2,)
"""The format versions :class:`UpgradeToV3` upgrades from (v1 tables first go to v2, which has the
sequence numbers a v3 manifest list needs)."""


class UpgradeToV3(UpgradeFormatVersionUpdate):
    """``upgrade-format-version`` to 3, which PyIceberg's catalogs would refuse (module doc)."""

    def __init__(self) -> None:
        super().__init__(format_version=3)  # type: ignore[call-arg]  # pydantic alias


@_apply_table_update.register(UpgradeToV3)
def _upgrade_to_v3(
    update: UpgradeToV3, base_metadata: TableMetadata, context: _TableMetadataUpdateContext
) -> TableMetadata:
    if base_metadata.format_version == 3:
        return base_metadata  # another upgrade won the race: nothing to do, as Java does
    if base_metadata.format_version not in UPGRADABLE_FORMAT_VERSIONS:
        raise ValueError(
            f"cannot upgrade a format v{base_metadata.format_version} table to v3; expected format version "
            f"{' or '.join(map(str, UPGRADABLE_FORMAT_VERSIONS))} (upgrade it to v2 first)"
        )
    fields = {**dict(base_metadata), "format_version": 3, "next_row_id": INITIAL_ROW_ID}
    context.add_update(update)
    return TableMetadataV3.model_construct(**fields)
