"""Upkeep a streaming table needs besides compaction: expire snapshots, remove orphan files, rewrite
manifests, convert equality deletes into position deletes (topology/conversion). Each is a
standalone job (API here, CLI in iceberg_sink/cli/maintenance_commands.py).

Expiring keeps, for every iceberg_sink job, its newest snapshot on each branch and the snapshot of its
highest checkpoint wherever it is (an earlier expiry may have cut the parent chain above it): the
committer finds a job's last checkpoint there, so expiring it would let a replayed micro-batch be
committed twice. Jobs
are recognised whatever snapshot-property-prefix they used (vocab/summary_keys.py).
Orphan removal lists the table location with the table's own FileIO settings, compares normalised
locations (``s3a://`` is ``s3://``, ``/x`` is ``file:///x``), and never deletes files younger than a
safety age, nor files a pending committable (a staged ``iceberg-sink-*.avro`` manifest) still lists.
It refuses to delete anything when the listing and the table's references disagree.

The key index entries the sink keeps in the table's metadata folder (``iceberg-sink-key-index/``,
keyindex/persisted.py) are referenced by no metadata: orphan removal keeps the entry of
every data file the table references and treats the others as orphans (same safety age), and expiry
deletes the entries of the data files it deletes. A partitioned key index (keyindex/partitioned.py)
keeps the files its current manifest names (its pointer, the manifest, its runs); its older
manifests and merged-away runs are orphans. Expiry leaves it alone: it keeps only entries whose data
file a commit names as live.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
from collections.abc import Callable, Iterable, Sequence

import attrs
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg import listing, manifests, producer, rewrites
from iceberg_sink._iceberg.retry import RetryPolicy, commit_with_retry
from iceberg_sink._iceberg.v3_metadata import v3_metadata_writes
from iceberg_sink.errors import InvalidSinkConfigError, MaintenanceRefusedError, UnsupportedTableError
from iceberg_sink.keyindex import manifest as partitioned_index
from iceberg_sink.keyindex.persisted import entry_name, index_location
from iceberg_sink.table.names import location_parts, normalise_location, walk_tables
from iceberg_sink.topology import arguments
from iceberg_sink.topology.conversion.job import ConversionResult
from iceberg_sink.topology.conversion.job import convert_equality_deletes as _convert
from iceberg_sink.vocab import summary_keys

logger = logging.getLogger(__name__)

MIN_ORPHAN_AGE = dt.timedelta(hours=1)
DEFAULT_ORPHAN_AGE = dt.timedelta(days=3)


@attrs.frozen
class ExpireResult:
    """Snapshots expired and files deleted because no remaining snapshot references them."""

    expired_snapshot_ids: tuple[int, ...]
    deleted_files: tuple[str, ...]


@attrs.frozen
class OrphanResult:
    """Files under the table location that nothing references (deleted unless dry run)."""

    orphan_files: tuple[str, ...]
    deleted: bool


def _ancestry(table: Table, head: Snapshot | None) -> list[Snapshot]:
    result = []
    while head is not None:
        result.append(head)
        head = table.metadata.snapshot_by_id(head.parent_snapshot_id) if head.parent_snapshot_id is not None else None
    return result


def protected_snapshots(table: Table, retain_last: int) -> set[int]:
    """Snapshots that must survive: ref heads, the newest ``retain_last`` of each branch, the newest
    snapshot of each iceberg_sink job on each branch, and each job's snapshot of its highest checkpoint."""
    protected = set()
    for ref in table.metadata.refs.values():
        protected.add(ref.snapshot_id)
        chain = _ancestry(table, table.metadata.snapshot_by_id(ref.snapshot_id))
        protected.update(s.snapshot_id for s in chain[:retain_last])
        seen_jobs: set[tuple[str, str]] = set()
        for snapshot in chain:
            if snapshot.summary is None:
                continue
            summary = snapshot.summary.additional_properties
            # Recognised whatever snapshot-property-prefix the job used (summary_keys records it).
            job = summary_keys.sink_job_of(summary)
            if job is not None and not summary_keys.is_ephemeral(summary) and job not in seen_jobs:
                seen_jobs.add(job)
                protected.add(snapshot.snapshot_id)
    # An earlier expiry may have cut a branch's parent chain (it removed a snapshot in the middle), so
    # the walk above stops short of older snapshots. The committer then takes the job's highest
    # checkpoint among all snapshots (committer.find_max_committed_checkpoint): keep that one for every
    # job, wherever it is.
    newest: dict[tuple[str, str], tuple[int, int, int]] = {}
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        job = summary_keys.sink_job_of(summary)
        if job is None or summary_keys.is_ephemeral(summary):
            continue
        checkpoint = summary_keys.JobKeys(job[0]).checkpoint_of(summary, job[1])
        rank = (checkpoint if checkpoint is not None else -1, snapshot.sequence_number or 0, snapshot.snapshot_id)
        if job not in newest or rank > newest[job]:
            newest[job] = rank
    protected.update(rank[2] for rank in newest.values())
    return protected


def expire_snapshots(
    load_table: Callable[[], Table],
    older_than: dt.datetime,
    retain_last: int = 1,
    delete_files: bool = True,
    dry_run: bool = False,
) -> ExpireResult:
    """Expire snapshots older than ``older_than`` except the protected ones; delete what they alone used.
    ``dry_run``: change and delete nothing, return what would be expired and deleted."""
    arguments.RETAIN_LAST.check(retain_last)
    if not isinstance(older_than, dt.datetime) or older_than.utcoffset() is None:
        raise InvalidSinkConfigError(f"older_than: expected a timezone-aware datetime, received {older_than!r}")
    table = load_table()
    cutoff = int(older_than.timestamp() * 1000)
    keep = protected_snapshots(table, retain_last)
    expired = [s.snapshot_id for s in table.metadata.snapshots if s.timestamp_ms < cutoff and s.snapshot_id not in keep]
    if not expired:
        return ExpireResult((), ())
    if dry_run:
        would = manifests.expiry_cleanup(table.io, table.metadata, expired_ids=set(expired))
        return ExpireResult(tuple(expired), tuple(sorted(would)))
    before = table.metadata  # the commit below replaces table.metadata
    with v3_metadata_writes():  # expiry leaves a v3 table's row lineage (next-row-id) as it is
        table.maintenance.expire_snapshots().by_ids(expired).commit()
    table = load_table()
    # What Iceberg Java's ExpireSnapshots deletes (ReachableFileCleanup): manifest lists, manifests and
    # data and delete files of the expired snapshots that no remaining snapshot has live. Metadata
    # files stay: they are the table's history log, removed by write.metadata.delete-after-commit.
    gone = sorted(manifests.expiry_cleanup(table.io, before, table.metadata))
    if delete_files:
        for path in gone:
            with contextlib.suppress(FileNotFoundError):
                table.io.delete(path)
        _delete_index_entries(table, gone)
    logger.info("expired %s snapshots of %s, deleted %s files", len(expired), table.name(), len(gone))
    return ExpireResult(tuple(expired), tuple(gone))


def _delete_index_entries(table: Table, deleted: Iterable[str]) -> None:
    """Delete the persisted key index entries of deleted data files. Most have none (a file never
    looked up, or persistence off): the index folder is listed once and only entries there are
    deleted, instead of one delete request per deleted data file."""
    folder = index_location(table)
    wanted = {entry_name(p) for p in deleted if not (_looks_like_metadata(p) or p.endswith(".puffin"))}
    if not wanted:
        return
    try:
        names = {f.location.rsplit("/", 1)[-1] for f in listing.list_files(table.io, folder)} & wanted
    except UnsupportedTableError:  # a FileIO that cannot list: ask for each entry
        names = wanted
    except Exception as e:  # the expiry itself is done: orphan removal takes the entries later
        logger.warning("cannot list the key index entries in %s (%s: %s)", folder, type(e).__name__, e)
        return
    for name in sorted(names):
        try:
            table.io.delete(f"{folder}/{name}")
        except FileNotFoundError:
            pass
        except Exception as e:  # left behind, orphan removal takes it later
            logger.warning("cannot delete the key index entry %s/%s (%s: %s)", folder, name, type(e).__name__, e)


def _is_staged_manifest(location: str) -> bool:
    name = location.rsplit("/", 1)[-1]
    return name.startswith("iceberg-sink-") and name.endswith(".avro")


def select_orphans(
    listed: Sequence[listing.ListedFile],
    referenced: Iterable[str],
    pending: Iterable[str],
    cutoff: dt.datetime,
    what: str,
) -> list[listing.ListedFile]:
    """The listed files that are orphans: referenced by neither the table nor a pending committable,
    and last modified before ``cutoff``. Locations are compared normalised (:func:`location_parts`).

    Args:
        listed: files found under the table location.
        referenced: every location the table's metadata references.
        pending: staged manifests of pending committables and the files they list.
        cutoff: files modified at or after it are kept (a file without a time is kept too).
        what: names the job in errors.

    Raises:
        MaintenanceRefusedError: files were listed but none is referenced by the table, or a listed
            file's path is referenced under another scheme or authority: the listing and the metadata
            spell locations differently, and every file would look orphaned.
    """
    table_refs = {normalise_location(p) for p in referenced}
    # Pending files do not count as evidence that the listing matches the metadata: staged manifests
    # are found by the listing itself.
    if listed and not any(normalise_location(f.location) in table_refs for f in listed):
        raise MaintenanceRefusedError(
            f"{what}: listed {len(listed)} files and none of them is referenced by the table (for example "
            f"{listed[0].location!r}); the listing and the table's metadata seem to spell locations "
            "differently, so nothing was deleted"
        )
    keep = table_refs | {normalise_location(p) for p in pending}
    by_path: dict[str, set[tuple[str, str]]] = {}
    for ref in keep:
        scheme, authority, path = location_parts(ref)
        by_path.setdefault(path, set()).add((scheme, authority))
    orphans = []
    for file in listed:
        if normalise_location(file.location) in keep or file.location.rsplit("/", 1)[-1] == "version-hint.text":
            continue
        scheme, authority, path = location_parts(file.location)
        if by_path.get(path, set()) - {(scheme, authority)}:
            raise MaintenanceRefusedError(
                f"{what}: listed {file.location!r}, whose path the table references under another scheme or "
                "authority; nothing was deleted"
            )
        # A store that gives no modification time gives no proof of age: the file is kept.
        if file.mtime is None or file.mtime >= cutoff:
            continue
        orphans.append(file)
    return orphans


def _contains(outer: str, inner: str) -> bool:
    """Whether location ``inner`` is ``outer`` or under it (normalised, whole path segments)."""
    return normalise_location(inner.rstrip("/") + "/").startswith(normalise_location(outer.rstrip("/") + "/"))


def refuse_shared_location(table: Table, what: str) -> None:
    """Refuse orphan removal when the table's location is, or contains, the catalog's warehouse root
    or another table's location: every file of the other tables would look orphaned.

    The catalog's tables are listed and loaded to know their locations; a catalog that cannot list
    them refuses too (the check cannot be made).

    Raises:
        MaintenanceRefusedError: the location is shared, or the catalog's tables cannot be listed.
    """
    location = table.location()
    catalog = table.catalog
    warehouse = catalog.properties.get("warehouse")
    if warehouse and _contains(location, warehouse):
        raise MaintenanceRefusedError(
            f"{what}: the table's location is {'the' if _contains(warehouse, location) else 'above the'} catalog's "
            f"warehouse root {warehouse}, so the files of every other table would look orphaned; nothing was "
            "deleted. Give the table a location of its own"
        )
    own = tuple(table.name())
    try:
        identifiers = walk_tables(catalog, None, strict=True)
    except Exception as e:
        raise MaintenanceRefusedError(
            f"{what}: cannot list the catalog's tables ({type(e).__name__}) to check that no other table's files lie "
            "under this table's location; nothing was deleted"
        ) from None
    for identifier in identifiers:
        if identifier in (own, own[1:]):  # own[1:]: PyIceberg versions that name the catalog first
            continue
        try:
            other = catalog.load_table(identifier).location()
        except NoSuchTableError:
            continue  # dropped meanwhile
        except Exception as e:
            raise MaintenanceRefusedError(
                f"{what}: cannot load table {'.'.join(identifier)} ({type(e).__name__}) to check that its files do not "
                "lie under this table's location; nothing was deleted"
            ) from None
        if _contains(location, other):
            raise MaintenanceRefusedError(
                f"{what}: the location of table {'.'.join(identifier)} ({other}) is "
                f"{'the same as' if _contains(other, location) else 'under'} this table's location, so its files "
                "would look orphaned; nothing was deleted. Give each table a location of its own"
            )


_MANIFEST_NAME = re.compile(r"-m\d+\.avro$")


def _looks_like_metadata(location: str) -> bool:
    """Whether a file is an Iceberg metadata file: a metadata JSON, a manifest list, a manifest (or
    any Avro file in a ``metadata`` folder)."""
    folder, _, name = location.rstrip("/").rpartition("/")
    if name.endswith((".metadata.json", ".metadata.json.gz", ".gz.metadata.json")):
        return True
    if not name.endswith(".avro"):
        return False
    return name.startswith("snap-") or bool(_MANIFEST_NAME.search(name)) or folder.rsplit("/", 1)[-1] == "metadata"


def _table_uuid_of(io: FileIO, location: str) -> str | None:
    """The ``table-uuid`` a metadata JSON file names, or None when it cannot be read."""
    try:
        return str(FromInputFile.table_metadata(io.new_input(location)).table_uuid)
    except Exception:
        return None


def refuse_foreign_metadata(
    table: Table, listed: Sequence[listing.ListedFile], kept: Iterable[str], metadata_dir: str, what: str
) -> None:
    """Refuse orphan removal when the listing holds a metadata file that is not this table's: another
    table's files lie under this table's location.

    An unreferenced metadata file is this table's (a commit that crashed, a metadata file dropped from
    the metadata log) only when it lies in this table's metadata folder and, for a metadata JSON,
    names this table's UUID.

    Raises:
        MaintenanceRefusedError: naming the first such files.
    """
    keep = {normalise_location(p) for p in kept}
    own_dir = normalise_location(metadata_dir.rstrip("/"))
    uuid = str(table.metadata.table_uuid)
    foreign = []
    for file in listed:
        if normalise_location(file.location) in keep or not _looks_like_metadata(file.location):
            continue
        in_own_dir = normalise_location(file.location).rsplit("/", 1)[0] == own_dir
        if not in_own_dir or (file.location.endswith("json") and _table_uuid_of(table.io, file.location) != uuid):
            foreign.append(file.location)
    if foreign:
        shown = ", ".join(sorted(foreign)[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise MaintenanceRefusedError(
            f"{what}: the listing holds {len(foreign)} Iceberg metadata files that are not in this table's history "
            f"({shown}): another table's files lie under this table's location; nothing was deleted"
        )


def remove_orphan_files(
    load_table: Callable[[], Table],
    older_than: dt.timedelta = DEFAULT_ORPHAN_AGE,
    dry_run: bool = False,
    *,
    now: dt.datetime | None = None,
) -> OrphanResult:
    """Delete files under the table location that no snapshot, metadata file or pending committable
    references and that are older than ``older_than``.

    Files are listed with the table's own FileIO settings (endpoint, credentials, region, path
    style) and compared with the table's references by normalised location (see
    :func:`location_parts`). Nothing is deleted, and :class:`MaintenanceRefusedError` is raised, when
    the listing and the references disagree: files listed but none of them referenced, a listed file
    whose path is referenced under another scheme or authority, or a staged manifest that cannot be
    read (the files it lists could not be protected).

    Args:
        load_table: loads the table.
        older_than: minimum age of a deleted file, at least an hour: a running write's files are not
            referenced yet.
        dry_run: only report the orphans.
        now: the instant ages are measured from (default: the system clock, UTC).

    Returns:
        The orphans found, and whether they were deleted.
    """
    if not isinstance(older_than, dt.timedelta):
        raise InvalidSinkConfigError(f"older_than: expected a datetime.timedelta, received {older_than!r}")
    if older_than < MIN_ORPHAN_AGE or arguments.ORPHAN_OLDER_THAN_HOURS.problem(older_than / dt.timedelta(hours=1)):
        raise InvalidSinkConfigError(
            f"older_than: expected at least {MIN_ORPHAN_AGE} (files of writes in flight are not referenced yet) and "
            f"at most {dt.timedelta(hours=arguments.HOURS_MAX)}, received {older_than}"
        )
    if now is not None and now.utcoffset() is None:
        raise InvalidSinkConfigError(f"now: expected a timezone-aware datetime, received the naive {now.isoformat()}")
    table = load_table()
    io = table.io
    location = table.location()
    listed = listing.list_files(io, location)
    referenced = manifests.reachable_files(table)
    # Staged manifests of pending committables, and the files they list, belong to checkpoints that
    # will still be committed. They live in the metadata folder, which write.metadata.path may place
    # outside the table location: list it too, for staged manifests only.
    metadata_dir = table.location_provider().new_metadata_location("x").rsplit("/", 1)[0]
    staged = [f.location for f in listed if _is_staged_manifest(f.location)]
    if not normalise_location(metadata_dir + "/").startswith(normalise_location(location.rstrip("/") + "/")):
        staged += [f.location for f in listing.list_files(io, metadata_dir) if _is_staged_manifest(f.location)]
    # The key index entry of each referenced data file is kept like the file (others are orphans).
    folder = index_location(table)
    pending = set(staged) | {f"{folder}/{entry_name(p)}" for p in referenced}
    # A partitioned key index keeps its current manifest and runs; older ones are orphans.
    names = [f.location for f in listed]
    for pointer in filter(partitioned_index.is_pointer, names):
        pending |= partitioned_index.current_files(io, pointer, names)
    for manifest in staged:
        try:
            pending.update(manifests.staged_manifest_files(io, manifest))
        except Exception as e:
            raise MaintenanceRefusedError(
                f"remove-orphans on {table.name()}: cannot read the staged manifest {manifest} ({type(e).__name__}: "
                f"{e}), so the files of its pending checkpoint cannot be protected; nothing was deleted. Commit the "
                "pending checkpoint, or delete this manifest if no committable under a checkpoint location names it"
            ) from e
    what = f"remove-orphans on {table.name()} ({location})"
    refuse_shared_location(table, what)
    refuse_foreign_metadata(table, listed, referenced | pending, metadata_dir, what)
    cutoff = (now if now is not None else dt.datetime.now(dt.UTC)) - older_than
    orphans = select_orphans(listed, referenced, pending, cutoff, what)
    if not dry_run:
        listing.delete_listed(io, location, orphans)
    logger.info("%s %s orphan files of %s", "found" if dry_run else "deleted", len(orphans), table.name())
    return OrphanResult(tuple(sorted(f.location for f in orphans)), deleted=not dry_run)


def rewrite_manifests(
    load_table: Callable[[], Table],
    branch: str = "main",
    entries_per_manifest: int = 10_000,
    retry: RetryPolicy | None = None,
) -> int | None:
    """Merge the branch's manifests into as few as ``entries_per_manifest`` allows; returns the new
    snapshot id, or None when the manifests were already compact. A stream committing meanwhile
    makes the attempt retry on the new head (nothing it committed is dropped).

    Raises:
        InvalidSinkConfigError: ``entries_per_manifest`` is not an integer of at least 1.
        MaintenanceRefusedError: the rewritten manifests would not list exactly the live files of the
            branch head (nothing was committed; see ``_iceberg/rewrite_check.py``).
    """
    arguments.ENTRIES_PER_MANIFEST.check(entries_per_manifest)

    def prepare(table: Table) -> producer.PreparedCommit | None:
        rewrite = rewrites.RewriteManifests(
            table, branch, entries_per_manifest, {summary_keys.OPERATION_KEY: summary_keys.OPERATION_REWRITE_MANIFESTS}
        )
        return rewrite.prepare() if rewrite.worthwhile() else None

    outcome = commit_with_retry(f"manifest rewrite of branch {branch}", load_table, prepare, retry or RetryPolicy())
    return outcome.snapshot.snapshot_id if outcome.snapshot is not None else None


def convert_equality_deletes(
    load_table: Callable[[], Table], branch: str = "main", max_replans: int = 3, retry: RetryPolicy | None = None
) -> ConversionResult:
    """Convert the live equality deletes of ``branch`` into file-scoped position deletes, once.

    Safe beside running streams and compactions: the commit validates against the branch head and
    plans again when a concurrent commit invalidated it (topology/conversion/job.py).

    Args:
        load_table: returns the table as the catalog has it now.
        branch: the branch to convert.
        max_replans: plans discarded on conflict before giving up (nothing committed, not an error).
        retry: backoff when the branch head moves under the commit.
    """
    return _convert(load_table, branch=branch, retry=retry, max_replans=max_replans)
