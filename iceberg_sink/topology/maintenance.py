"""Upkeep a streaming table needs besides compaction: expire snapshots, remove orphan files, rewrite
manifests. Each is a standalone job (API here, CLI in iceberg_sink/cli.py).

Expiring keeps, for every iceberg_sink job, its newest snapshot on each branch: the committer finds a
job's last checkpoint there, so expiring it would let a replayed micro-batch be committed twice.
Orphan removal never deletes files younger than a safety age, nor files a pending committable
(a staged ``iceberg-sink-*.avro`` manifest) still lists.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable

import attrs
import pyarrow.fs as pafs
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg import manifests, producer
from iceberg_sink.committer import summary_keys
from iceberg_sink.errors import InvalidSinkConfigError

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
    """Snapshots that must survive: ref heads, the newest ``retain_last`` of each branch, and the newest
    snapshot of each iceberg_sink job on each branch."""
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
    return protected


def expire_snapshots(
    load_table: Callable[[], Table], older_than: dt.datetime, retain_last: int = 1, delete_files: bool = True
) -> ExpireResult:
    """Expire snapshots older than ``older_than`` except the protected ones; delete what they alone used."""
    if retain_last < 1:
        raise InvalidSinkConfigError(f"retain_last: expected at least 1, received {retain_last}")
    table = load_table()
    cutoff = int(older_than.timestamp() * 1000)
    keep = protected_snapshots(table, retain_last)
    expired = [s.snapshot_id for s in table.metadata.snapshots if s.timestamp_ms < cutoff and s.snapshot_id not in keep]
    if not expired:
        return ExpireResult((), ())
    before = manifests.reachable_files(table)
    table.maintenance.expire_snapshots().by_ids(expired).commit()
    table = load_table()
    after = manifests.reachable_files(table)
    # Metadata files stay: they are the table's history log, removed by write.metadata.delete-after-commit.
    gone = sorted(p for p in before - after if not p.endswith(".metadata.json"))
    if delete_files:
        for path in gone:
            with contextlib.suppress(FileNotFoundError):
                table.io.delete(path)
    logger.info("expired %s snapshots of %s, deleted %s files", len(expired), table.name(), len(gone))
    return ExpireResult(tuple(expired), tuple(gone))


def _normalise(path: str) -> str:
    return path.removeprefix("file://").removeprefix("file:")


def remove_orphan_files(
    load_table: Callable[[], Table], older_than: dt.timedelta = DEFAULT_ORPHAN_AGE, dry_run: bool = False
) -> OrphanResult:
    """Delete files under the table location that no snapshot, metadata file or pending committable
    references and that are older than ``older_than`` (at least an hour: a running write's files are
    not referenced yet)."""
    if older_than < MIN_ORPHAN_AGE:
        raise InvalidSinkConfigError(
            f"older_than: expected at least {MIN_ORPHAN_AGE} (files of writes in flight are not referenced yet), "
            f"received {older_than}"
        )
    table = load_table()
    io = table.io
    location = table.location()
    fs, root = pafs.FileSystem.from_uri(location) if "://" in location else (pafs.LocalFileSystem(), location)
    referenced = {_normalise(p) for p in manifests.reachable_files(table)}
    infos = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File]
    # Staged manifests of pending committables, and the files they list, belong to checkpoints that
    # will still be committed.
    for info in infos:
        if info.base_name.startswith("iceberg-sink-") and info.base_name.endswith(".avro"):
            uri = location.rstrip("/") + "/" + info.path[len(root.rstrip("/")) + 1 :]
            referenced.add(_normalise(info.path))
            try:
                referenced.update(_normalise(p) for p in manifests.staged_manifest_files(io, uri))
            except Exception:
                logger.warning("could not read staged manifest %s; keeping it", info.path)
    cutoff = dt.datetime.now(dt.UTC) - older_than
    orphans = []
    for info in infos:
        if _normalise(info.path) in referenced or info.base_name == "version-hint.text":
            continue
        if info.mtime is not None and info.mtime.replace(tzinfo=info.mtime.tzinfo or dt.UTC) >= cutoff:
            continue
        orphans.append(info.path)
    if not dry_run:
        for path in orphans:
            fs.delete_file(path)
    logger.info("%s %s orphan files of %s", "found" if dry_run else "deleted", len(orphans), table.name())
    return OrphanResult(tuple(sorted(orphans)), deleted=not dry_run)


def rewrite_manifests(
    load_table: Callable[[], Table], branch: str = "main", entries_per_manifest: int = 10_000
) -> int | None:
    """Merge the branch's manifests into as few as ``entries_per_manifest`` allows; returns the new
    snapshot id, or None when the manifests were already compact."""
    table = load_table()
    prepared = producer.prepare_manifest_rewrite(
        table,
        table.io,
        branch,
        entries_per_manifest,
        {summary_keys.OPERATION_KEY: summary_keys.OPERATION_REWRITE_MANIFESTS},
    )
    if prepared is None:
        return None
    producer.commit_prepared(table, prepared)
    return prepared.snapshot.snapshot_id
