"""Parsed table metadata reused while a table's metadata location has not moved.

PyIceberg 0.12's SQL catalog reads and parses a table's whole metadata JSON on every
``load_table``, the one inside its own ``commit_table`` included. A sink loads its table several
times per checkpoint (to check it against the batch, after committing older checkpoints, in the
commit), and the metadata grows with every snapshot kept: at 10M rows with equality-delete
conversion after every commit (two snapshots per checkpoint), three parses were 60% of the
driver's time per checkpoint (py-spy), and the checkpoint grew slower as the table aged.

A metadata file never changes once written (every commit writes a new one, under a new name), so
metadata parsed from a location, or sent by the sink itself to the catalog as the new metadata of
that location, is that location's metadata for good. :func:`caching` makes a PyIceberg
``SqlCatalog`` keep the last such metadata per table: a load still asks the catalog database for
the table's current metadata location (so another writer's commit is seen at once), and parses the
file only when that location differs from the remembered one. One entry per table, the same object
the sink's table bindings hold; other catalogs (REST, Glue, Hive) are left as they are.

:func:`commit_on_base` commits a snapshot the sink prepared on a table it loaded as a
compare-and-swap on that table's metadata location, without the load PyIceberg's ``commit_table``
makes first (one SELECT and, without this cache, a metadata parse per commit: a routed checkpoint
commits every table it touches).
"""

from __future__ import annotations

import threading
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata
from sqlalchemy import update

# (catalog name, *identifier) -> (metadata location, parsed metadata); bounded by the tables seen.
_latest: dict[tuple[str, ...], tuple[str, TableMetadata]] = {}
_lock = threading.Lock()
_MAX_TABLES = 10_000


def remember(catalog: Catalog, identifier: tuple[str, ...], location: str, metadata: TableMetadata) -> None:
    """Keep ``metadata`` as the metadata at ``location`` of table ``identifier`` (only for a caching catalog)."""
    if not isinstance(catalog, _CachingSqlCatalog):
        return
    with _lock:
        if len(_latest) >= _MAX_TABLES:
            _latest.clear()
        _latest[(catalog.name, *identifier)] = (location, metadata)


def lookup(catalog: Catalog, identifier: tuple[str, ...], location: str) -> TableMetadata | None:
    """The metadata remembered for ``identifier`` if it is that of ``location``, else None."""
    with _lock:
        found = _latest.get((catalog.name, *identifier))
    return found[1] if found is not None and found[0] == location else None


class _CachingSqlCatalog(SqlCatalog):
    """PyIceberg's SQL catalog, parsing a table's metadata file only when its location moved."""

    def _convert_orm_to_iceberg(self, orm_table: Any) -> Table:
        location = orm_table.metadata_location
        namespace, name = orm_table.table_namespace, orm_table.table_name
        if not (location and namespace and name):
            return super()._convert_orm_to_iceberg(orm_table)  # its own errors for missing fields
        identifier = (*Catalog.identifier_to_tuple(namespace), name)
        metadata = lookup(self, identifier, location)
        if metadata is None:
            table = super()._convert_orm_to_iceberg(orm_table)
            remember(self, identifier, location, table.metadata)
            return table
        return Table(
            identifier=identifier,
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )


def commit_on_base(table: Table, requirements: tuple[Any, ...], updates: tuple[Any, ...]) -> CommitTableResponse | None:
    """Commit ``updates`` to ``table`` as it was loaded, if its catalog is a caching SQL catalog
    whose database reports updated rows (SQLite, PostgreSQL, MySQL); None otherwise (the caller
    uses the catalog's own ``commit_table``).

    PyIceberg's ``commit_table`` loads the table, checks ``requirements`` against it, applies
    ``updates``, writes the metadata file and swaps the table's metadata location from the loaded
    one to the new one in one UPDATE. Here ``table`` is the loaded table: the same checks and the
    same UPDATE, on the location ``table`` was loaded from. A commit by anyone since that load
    moved the location, the UPDATE changes no row and the commit fails as a conflict
    (:class:`CommitFailedException`: the sink loads the table again and prepares again), where
    PyIceberg would have applied the updates on the newer metadata when the requirements still
    held there. The sink's snapshot commits require their branch head anyway; only commits that
    race an unrelated change (a property set meanwhile) are retried once more.
    """
    catalog = table.catalog
    if not isinstance(catalog, _CachingSqlCatalog) or not catalog.engine.dialect.supports_sane_rowcount:
        return None
    identifier = table.name()
    staged = catalog._update_and_stage_table(table, identifier, requirements, updates)
    if staged.metadata == table.metadata:
        return CommitTableResponse(metadata=table.metadata, metadata_location=table.metadata_location)  # type: ignore[call-arg]
    catalog._write_metadata(metadata=staged.metadata, io=staged.io, metadata_path=staged.metadata_location)
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    # SQLAlchemy Core on one connection (the ORM session PyIceberg opens adds ~0.5 ms per commit).
    with catalog.engine.begin() as connection:
        statement = (
            update(IcebergTables)
            .where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == namespace,
                IcebergTables.table_name == name,
                IcebergTables.metadata_location == table.metadata_location,
            )
            .values(metadata_location=staged.metadata_location, previous_metadata_location=table.metadata_location)
        )
        if connection.execute(statement).rowcount < 1:  # rolled back as the block is left
            raise CommitFailedException(f"Table has been updated by another process: {namespace}.{name}")
    return CommitTableResponse(metadata=staged.metadata, metadata_location=staged.metadata_location)  # type: ignore[call-arg]


def caching(catalog: Catalog) -> Catalog:
    """``catalog`` itself, made to reuse parsed metadata if it is a plain PyIceberg ``SqlCatalog``
    (the class is swapped in place: the subclass adds no state of its own)."""
    if type(catalog) is SqlCatalog:
        catalog.__class__ = _CachingSqlCatalog
    return catalog
