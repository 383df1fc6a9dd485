"""Sending a prepared snapshot (or any metadata update the sink builds) to the catalog.

:func:`commit_prepared` sends what a ``SnapshotProducer`` (``_iceberg/producer.py``) prepared and turns
PyIceberg's complaint about a stale sequence number or first row id (another branch committed
meanwhile, or the table was upgraded to v3), and a REST catalog's HTTP 400 on a table that moved on
meanwhile, into the retryable :class:`CommitFailedException`;
:func:`commit_metadata` is the one place that calls the catalog's ``commit_table`` (inside
``v3_metadata_writes``) and deletes the metadata files the catalog dropped from its log;
:func:`commit_prepared_together` sends several tables' snapshots at once (one SQL transaction, one REST request).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import BadRequestError, CommitFailedException
from pyiceberg.io import FileIO
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.properties import property_as_bool

from iceberg_sink._iceberg import rest_transactions
from iceberg_sink._iceberg.files import delete_quietly
from iceberg_sink._iceberg.v3_metadata import v3_metadata_writes

if TYPE_CHECKING:
    from iceberg_sink._iceberg.producer import PreparedCommit


def is_stale_sequence_number(error: ValueError) -> bool:
    """PyIceberg's catalogs check a new snapshot's sequence number (v2) or first row id (v3) against
    the table's when applying the commit; another branch committing meanwhile makes ours stale.
    Refreshing and preparing again fixes it, so it is a retryable conflict (pinned wording of
    pyiceberg 0.12; Iceberg Java's RetryableValidationException covers the same two checks)."""
    text = str(error)
    return (
        "Cannot add snapshot with sequence number" in text
        or "first row id smaller than the table" in text
        # Prepared on v2 metadata, committed after an upgrade to v3: prepared again, it gets its ids.
        or "Cannot add snapshot without first row id" in text
    )


def commit_prepared(table: Table, prepared: PreparedCommit) -> Table:
    """Send one prepared snapshot to the catalog; returns the table as of the new metadata.

    Raises:
        CommitFailedException: the branch head moved or the sequence number went stale (another
            writer committed, on this or another branch): refresh, prepare again, retry.
        CommitStateUnknownException: the commit may or may not have landed.
    """
    with races_lost_as_conflicts([table]):
        return commit_metadata(table, prepared.requirements, prepared.updates, on_base=True)


@contextmanager
def races_lost_as_conflicts(tables: Sequence[Table]) -> Iterator[None]:
    """Turn a catalog's refusal that is a lost race into the retryable ``CommitFailedException``, for
    a commit of ``tables`` (as loaded): PyIceberg's stale sequence number or first row id (another
    branch committed meanwhile), or a REST catalog's HTTP 400 on a table that moved on."""
    try:
        yield
    except ValueError as e:
        if is_stale_sequence_number(e):
            raise CommitFailedException(f"stale sequence number, another writer committed meanwhile: {e}") from e
        raise
    except BadRequestError as e:
        # A REST catalog checks the same and answers HTTP 400 in words of its own (SeaweedFS: "can't
        # add snapshot with sequence number 2, must be > than last sequence number 2"). Not pinned
        # to any wording: when a table moved on since it was loaded, the refusal is the lost race,
        # retried on the table as it is; otherwise it is a refusal, raised.
        if any(moved_since(t) for t in tables):
            raise CommitFailedException(f"the catalog refused a commit on a table that moved on meanwhile: {e}") from e
        raise


def moved_since(table: Table) -> bool:
    """Whether the catalog's table has sequence numbers or row ids past ``table``'s (another writer
    committed, on any branch); False when it cannot be loaded."""
    try:
        now = table.catalog.load_table(table.name()).metadata
    except Exception:
        return False
    before = table.metadata

    def mark(metadata: TableMetadata) -> tuple[int, int]:  # v1 has neither: (0, 0)
        return (getattr(metadata, "last_sequence_number", 0) or 0, getattr(metadata, "next_row_id", None) or 0)

    return any(a > b for a, b in zip(mark(now), mark(before), strict=True))


def commit_metadata(
    table: Table, requirements: tuple[object, ...], updates: tuple[object, ...], on_base: bool = False
) -> Table:
    """One metadata commit through the table's catalog; returns the table as of the new metadata.

    ``on_base``: the updates were prepared on ``table`` as loaded and must land on exactly that
    metadata (a snapshot, whose requirements name the branch head it was built on): a SQL catalog
    then commits without loading the table again (``metadata_cache.commit_on_base``).

    The catalog trims the metadata log to ``write.metadata.previous-versions-max``; with
    ``write.metadata.delete-after-commit.enabled`` the metadata files it dropped are deleted here,
    as Iceberg Java's catalogs and PyIceberg's own transactions do after a commit.
    """
    from iceberg_sink._iceberg import metadata_cache  # imports PyIceberg's SQL catalog (SQLAlchemy)

    with v3_metadata_writes():  # the sink built this commit (its v3 snapshots carry row lineage)
        response = metadata_cache.commit_on_base(table, requirements, updates) if on_base else None
        if response is None:
            response = table.catalog.commit_table(table, requirements, updates)  # type: ignore[arg-type]
    return _landed(table, response.metadata_location, response.metadata)


def commits_together(catalog: Catalog) -> bool:
    """Whether :func:`commit_prepared_together` can commit several tables of ``catalog`` at once: a SQL
    catalog (one database transaction) or a REST catalog serving ``transactions/commit``."""
    from iceberg_sink._iceberg import metadata_cache  # imports PyIceberg's SQL catalog (SQLAlchemy)

    return metadata_cache.commits_together(catalog) or rest_transactions.supports_transactions(catalog)


def commit_prepared_together(commits: list[tuple[Table, PreparedCommit]]) -> list[Table]:
    """Send prepared snapshots of several tables of one catalog at once: in one database transaction
    of a SQL catalog (``metadata_cache.commit_together``), or in one ``transactions/commit`` request
    of a REST catalog (``rest_transactions``): all land or none does. Returns each table as of its
    new metadata, in ``commits`` order.

    Raises:
        CommitFailedException: some table's head moved (or its sequence number went stale) since it
            was loaded; nothing was committed: every table is loaded and prepared again.
        Any error of the database or the server: the outcome is unknown, for every table alike.
    """
    from iceberg_sink._iceberg import metadata_cache  # imports PyIceberg's SQL catalog (SQLAlchemy)

    sent = [(t, p.requirements, p.updates) for t, p in commits]
    with races_lost_as_conflicts([t for t, _ in commits]), v3_metadata_writes():
        if metadata_cache.commits_together(commits[0][0].catalog):
            responses = metadata_cache.commit_together(sent)
        else:
            responses = rest_transactions.commit_together(sent)
    return [
        _landed(table, response.metadata_location, response.metadata)
        for (table, _), response in zip(commits, responses, strict=True)
    ]


def _landed(table: Table, location: str, metadata: TableMetadata) -> Table:
    """``table`` as of the metadata a commit just landed (``metadata`` at ``location``)."""
    from iceberg_sink._iceberg import metadata_cache

    delete_dropped_metadata(table.io, table.metadata, metadata)
    # The next load of this location reuses the metadata sent (a SQL catalog then reads no file).
    metadata_cache.remember(table.catalog, table.name(), location, metadata)
    return Table(
        identifier=table.name(), metadata=metadata, metadata_location=location, io=table.io, catalog=table.catalog
    )


def delete_dropped_metadata(io: FileIO, base: TableMetadata, committed: TableMetadata) -> None:
    """Delete the metadata files ``base`` logged that the committed metadata's log no longer holds,
    when the committed table has ``write.metadata.delete-after-commit.enabled`` (Iceberg Java's
    ``CatalogUtil.deleteRemovedMetadataFiles``). A failed delete leaves an orphan, never an error:
    the commit has landed."""
    if not property_as_bool(
        committed.properties,
        TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED,
        TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED_DEFAULT,
    ):
        return
    kept = {entry.metadata_file for entry in committed.metadata_log}
    dropped = sorted({entry.metadata_file for entry in base.metadata_log} - kept)
    delete_quietly(io, dropped)
