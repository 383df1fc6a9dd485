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

Both run their SQL as SQLAlchemy Core statements built once (bound parameters, so SQLAlchemy
compiles and caches each once), where PyIceberg opens an ORM session and builds and compiles its
statement on every call: per routed table and checkpoint that was ~0.5 ms of ~5 ms. A commit also
skips PyIceberg's deep copy of the whole new metadata (``update_table_metadata`` ends with
``model_copy(deep=True)``; it grows with the snapshots kept): every update PyIceberg or the sink
applies builds new lists and dicts (copy on write) and nothing in the sink changes a metadata object
in place (this cache already hands one parsed metadata to every load of its location).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.serializers import Compressor
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import _apply_table_update, _TableMetadataUpdateContext, _update_table_metadata_log
from pyiceberg.utils.config import Config
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy import bindparam, select, update

from iceberg_sink import _faults
from iceberg_sink._iceberg.files import delete_quietly

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


# PyIceberg's table lookup (``SqlCatalog.load_table``) as a Core statement: the row of (catalog,
# namespace, name), with PyIceberg's own ``_iceberg_type_filter`` (no views on a v1 catalog schema)
# added once per catalog schema version (:func:`_load_statement`).
_LOAD = select(IcebergTables.metadata_location, IcebergTables.table_namespace, IcebergTables.table_name).where(
    IcebergTables.catalog_name == bindparam("b_catalog"),
    IcebergTables.table_namespace == bindparam("b_namespace"),
    IcebergTables.table_name == bindparam("b_name"),
)
_LOADS: dict[str, Any] = {}  # catalog schema version -> the lookup statement
# The compare-and-swap of a table's metadata location (PyIceberg's commit_table UPDATE).
_SWAP = (
    update(IcebergTables)
    .where(
        IcebergTables.catalog_name == bindparam("b_catalog"),
        IcebergTables.table_namespace == bindparam("b_namespace"),
        IcebergTables.table_name == bindparam("b_name"),
        IcebergTables.metadata_location == bindparam("b_base"),
    )
    .values(metadata_location=bindparam("b_new"), previous_metadata_location=bindparam("b_base"))
)


class _CachingSqlCatalog(SqlCatalog):
    """PyIceberg's SQL catalog, parsing a table's metadata file only when its location moved."""

    def load_table(self, identifier: str | tuple[str, ...]) -> Table:
        """PyIceberg's ``load_table`` (same lookup, same errors) without its ORM session."""
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        name = Catalog.table_name_from(identifier)
        statement = _load_statement(self)
        with self.engine.connect() as connection:
            row = connection.execute(
                statement, {"b_catalog": self.name, "b_namespace": namespace, "b_name": name}
            ).first()
        if row is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        return self._convert_orm_to_iceberg(row)

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


def _load_statement(catalog: _CachingSqlCatalog) -> Any:
    """The lookup statement for ``catalog``'s schema version, built on first use (statements are
    immutable; SQLAlchemy compiles and caches one per statement shape)."""
    version = str(catalog._schema_version)
    statement = _LOADS.get(version)
    if statement is None:
        type_filter = catalog._iceberg_type_filter()
        statement = _LOADS[version] = _LOAD if type_filter is None else _LOAD.where(type_filter)
    return statement


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
    if not commits_together(table.catalog):
        return None
    return commit_together([(table, requirements, updates)])[0]


def commits_together(catalog: Catalog) -> bool:
    """Whether :func:`commit_together` can commit tables of ``catalog``: a caching SQL catalog whose
    database reports updated rows (SQLite, PostgreSQL, MySQL)."""
    return isinstance(catalog, _CachingSqlCatalog) and bool(catalog.engine.dialect.supports_sane_rowcount)


def commit_together(
    commits: list[tuple[Table, tuple[Any, ...], tuple[Any, ...]]],
) -> list[CommitTableResponse]:
    """Commit each ``(table, requirements, updates)``, every table as it was loaded, in one database
    transaction of their catalog: every table's metadata location swapped from the loaded one to its
    new one, or none (one compare-and-swap per table, the UPDATE of :func:`commit_on_base`). The
    tables' catalog must be one for which :func:`commits_together` holds, and the same for all.

    Iceberg Java's ``JdbcCatalog`` and PyIceberg's ``SqlCatalog`` read a table's pointer from the
    same row, so a reader of any of them sees the tables before the transaction or after it.

    Raises:
        CommitFailedException: a table's requirements fail, or its location moved since it was
            loaded (naming it); nothing was committed, and no metadata file written for it is kept.
        Any error of the database (lost connection, SQLite's "database is locked"): the outcome is
            the database's, for all of the tables at once (a transaction whose COMMIT did not
            answer may have landed); the metadata files written are kept.
    """
    catalog = commits[0][0].catalog
    if not isinstance(catalog, _CachingSqlCatalog) or any(t.catalog is not catalog for t, _, _ in commits):
        raise ValueError("commit_together: every table must be of one caching SQL catalog")
    staged: list[tuple[dict[str, str], str, TableMetadata, FileIO] | None] = []
    responses: list[CommitTableResponse] = []
    try:
        for table, requirements, updates in commits:
            for requirement in requirements:
                requirement.validate(table.metadata)
            metadata = _updated(table.metadata, updates, table.metadata_location)
            if metadata == table.metadata:
                staged.append(None)
                unchanged = CommitTableResponse(metadata=table.metadata, metadata_location=table.metadata_location)  # type: ignore[call-arg]
                responses.append(unchanged)
                continue
            # The next metadata file, named as PyIceberg's _update_and_stage_table names it.
            version = catalog._parse_metadata_version(table.metadata_location) + 1
            provider = load_location_provider(metadata.location, metadata.properties)
            location = provider.new_table_metadata_file_location(version)
            io = catalog._load_file_io(properties=metadata.properties, location=location)
            _write_metadata(metadata, io, location)
            identifier = table.name()
            parameters = {
                "b_catalog": catalog.name,
                "b_namespace": Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
                "b_name": Catalog.table_name_from(identifier),
                "b_base": table.metadata_location,
                "b_new": location,
            }
            staged.append((parameters, location, metadata, io))
            responses.append(CommitTableResponse(metadata=metadata, metadata_location=location))  # type: ignore[call-arg]
        swaps = [s for s in staged if s is not None]
        if swaps:
            with catalog.engine.begin() as connection:
                for n, (parameters, _, _, _) in enumerate(swaps):
                    if n == 1:
                        _faults.hit(_faults.BETWEEN_TABLE_SWAPS, -1)
                    if connection.execute(_SWAP, parameters).rowcount < 1:  # rolled back as the block is left
                        raise CommitFailedException(
                            "Table has been updated by another process: "
                            f"{parameters['b_namespace']}.{parameters['b_name']}"
                        )
    except (CommitFailedException, ValueError):
        # Certainly not committed (a failed requirement, a lost compare-and-swap rolled back): the
        # metadata files written for it are nobody's.
        for written in staged:
            if written is not None:
                delete_quietly(written[3], [written[1]])
        raise
    if len(swaps) > 1:
        _faults.hit(_faults.TRANSACTION_COMMITTED, -1)
    return responses


def _updated(base: TableMetadata, updates: tuple[Any, ...], base_location: str) -> TableMetadata:
    """PyIceberg's ``update_table_metadata`` for a loaded table, without its final deep copy (module doc)."""
    context = _TableMetadataUpdateContext()
    metadata = base
    for table_update in updates:
        metadata = _apply_table_update(table_update, metadata, context)
    if context.has_changes():
        metadata = _update_table_metadata_log(metadata, base_location, base.last_updated_ms)
        if base.last_updated_ms == metadata.last_updated_ms:
            metadata = metadata.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    metadata.spec().check_compatible(metadata.schema())
    metadata.sort_order().check_compatible(metadata.schema())
    return metadata


_exclude_none: bool | None = None


def _write_metadata(metadata: TableMetadata, io: FileIO, location: str) -> None:
    """PyIceberg's ``ToOutputFile.table_metadata``, its configuration read once per process instead of
    once per file (``Config()`` reads the configuration file and the environment)."""
    global _exclude_none
    if _exclude_none is None:
        # None values are written only for `legacy-current-snapshot-id` (a None current-snapshot-id as -1).
        _exclude_none = not Config().get_bool("legacy-current-snapshot-id")
    content = metadata.model_dump_json(exclude_none=_exclude_none).encode("utf-8")
    with io.new_output(location).create(overwrite=False) as stream:
        stream.write(Compressor.get_compressor(location).bytes_compressor()(content))


def caching(catalog: Catalog) -> Catalog:
    """``catalog`` itself, made to reuse parsed metadata if it is a plain PyIceberg ``SqlCatalog``
    (the class is swapped in place: the subclass adds no state of its own)."""
    if type(catalog) is SqlCatalog:
        catalog.__class__ = _CachingSqlCatalog
    return catalog
