"""Snapshot producers: every commit kind the sink makes (append / row delta, rewrite files, rewrite
manifests) is prepared here and sent to the catalog as one compare-and-swap."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
)

from iceberg_sink._iceberg import SUPPORTED_FORMAT_VERSIONS
from iceberg_sink._iceberg.files import branch_head, to_data_file, to_meta
from iceberg_sink._iceberg.manifests import (
    _DeleteManifestWriterV2,
    _has_live_files,
    _ManifestWriterV2,
    _new_manifest_path,
)
from iceberg_sink.writer.result import DataFileMeta


@attrs.frozen
class SnapshotChanges:
    """The files one snapshot adds, grouped by content."""

    data_files: tuple[DataFileMeta, ...] = ()
    delete_files: tuple[DataFileMeta, ...] = ()

    @property
    def operation(self) -> Operation:
        if self.delete_files and self.data_files:
            return Operation.OVERWRITE
        if self.delete_files:
            return Operation.DELETE
        return Operation.APPEND


def _write_manifests(
    table: Table,
    io: FileIO,
    snapshot_id: int,
    commit_uuid: str,
    files: Iterable[DataFileMeta],
    deletes: bool,
    written: list[str],
) -> list[ManifestFile]:
    metadata = table.metadata
    by_spec: dict[int, list[DataFileMeta]] = {}
    for meta in files:
        by_spec.setdefault(meta.spec_id, []).append(meta)
    result = []
    for spec_id, metas in sorted(by_spec.items()):
        path = _new_manifest_path(table, commit_uuid, len(written))
        written.append(path)
        spec = metadata.specs()[spec_id]
        writer: ManifestWriter
        if deletes:
            writer = _DeleteManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
        else:
            writer = (
                _ManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
                if metadata.format_version == 2
                else write_manifest(1, spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
            )
        with writer:
            for meta in metas:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=None,
                        data_file=to_data_file(meta, metadata.format_version),
                    )
                )
        result.append(writer.to_manifest_file())
    return result


@attrs.frozen
class PreparedCommit:
    """A snapshot ready to commit, with the files written for it (deleted if it never lands)."""

    snapshot: Snapshot
    updates: tuple[Any, ...]
    requirements: tuple[Any, ...]
    written_files: tuple[str, ...]


def _finish(
    table: Table,
    io: FileIO,
    branch: str,
    parent: Snapshot | None,
    snapshot_id: int,
    commit_uuid: str,
    manifests: list[ManifestFile],
    summary: Summary,
    written: list[str],
) -> PreparedCommit:
    """Write the manifest list and build the snapshot, ref update and the commit's requirements: the
    table is the same one and the branch head is still ``parent`` (compare-and-swap)."""
    metadata = table.metadata
    sequence_number = metadata.next_sequence_number()
    manifest_list = table.location_provider().new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    written.append(manifest_list)
    parent_id = parent.snapshot_id if parent is not None else None
    with write_manifest_list(
        format_version=metadata.format_version,
        output_file=io.new_output(manifest_list),
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        avro_compression="deflate",
    ) as list_writer:
        list_writer.add_manifests(manifests)
    snapshot = Snapshot(  # type: ignore[call-arg]  # pydantic aliases
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        manifest_list=manifest_list,
        summary=summary,
        schema_id=metadata.current_schema_id,
    )
    current_ref = metadata.refs.get(branch)
    updates = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(  # type: ignore[call-arg]
            snapshot_id=snapshot_id, parent_snapshot_id=parent_id, ref_name=branch, type=SnapshotRefType.BRANCH
        ),
    )
    requirements = (
        AssertTableUUID(uuid=metadata.table_uuid),
        AssertRefSnapshotId(ref=branch, snapshot_id=current_ref.snapshot_id if current_ref else None),  # type: ignore[call-arg]
    )
    return PreparedCommit(snapshot=snapshot, updates=updates, requirements=requirements, written_files=tuple(written))


def prepare_commit(
    table: Table,
    io: FileIO,
    branch: str,
    changes: SnapshotChanges,
    snapshot_properties: Mapping[str, str],
) -> PreparedCommit:
    """Write the manifests and manifest list of one snapshot on top of ``branch``'s head."""
    metadata = table.metadata
    if metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise ValueError(f"format version {metadata.format_version} is not supported")
    parent = branch_head(table, branch)
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4().hex
    written: list[str] = []
    new_manifests = _write_manifests(table, io, snapshot_id, commit_uuid, changes.data_files, False, written)
    new_manifests += _write_manifests(table, io, snapshot_id, commit_uuid, changes.delete_files, True, written)
    existing = [m for m in parent.manifests(io) if _has_live_files(m)] if parent is not None else []
    collector = SnapshotSummaryCollector()
    schema = metadata.schema()
    specs = metadata.specs()
    for meta in (*changes.data_files, *changes.delete_files):
        collector.add_file(
            to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
        )
    summary = update_snapshot_summaries(
        Summary(operation=changes.operation, **collector.build(), **snapshot_properties),
        previous_summary=parent.summary if parent is not None else None,
    )
    return _finish(table, io, branch, parent, snapshot_id, commit_uuid, new_manifests + existing, summary, written)


def commit_prepared(table: Table, prepared: PreparedCommit) -> Table:
    """Send one prepared snapshot to the catalog; returns the table as of the new metadata.

    Raises PyIceberg's CommitFailedException (another writer moved the branch: refresh and retry)
    or CommitStateUnknownException (may or may not have landed).
    """
    response = table.catalog.commit_table(table, prepared.requirements, prepared.updates)
    return Table(
        identifier=table.name(),
        metadata=response.metadata,
        metadata_location=response.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )


def _replace_summary(
    table: Table, parent: Snapshot | None, added: Sequence[DataFileMeta], removed: Sequence[DataFileMeta]
) -> Summary:
    """Summary of a ``replace`` snapshot (PyIceberg's summary update refuses that operation)."""
    metadata = table.metadata
    collector = SnapshotSummaryCollector()
    specs, schema = metadata.specs(), metadata.schema()
    for meta in added:
        collector.add_file(
            to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
        )
    for meta in removed:
        collector.remove_file(
            to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
        )
    props = collector.build()
    previous = dict(parent.summary.additional_properties) if parent is not None and parent.summary else {}

    def total(key: str, plus: str, minus: str) -> str:
        return str(int(previous.get(key, "0")) + int(props.get(plus, "0")) - int(props.get(minus, "0")))

    props.update(
        {
            "total-data-files": total("total-data-files", "added-data-files", "deleted-data-files"),
            "total-delete-files": total("total-delete-files", "added-delete-files", "removed-delete-files"),
            "total-records": total("total-records", "added-records", "deleted-records"),
            "total-files-size": total("total-files-size", "added-files-size", "removed-files-size"),
            "total-position-deletes": total(
                "total-position-deletes", "added-position-deletes", "removed-position-deletes"
            ),
            "total-equality-deletes": total(
                "total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"
            ),
        }
    )
    return Summary(operation=Operation.REPLACE, **props)


def prepare_rewrite(
    table: Table,
    io: FileIO,
    branch: str,
    added: Sequence[DataFileMeta],
    removed_paths: frozenset[str],
    data_sequence_number: int,
    snapshot_properties: Mapping[str, str],
) -> PreparedCommit:
    """A ``replace`` snapshot: ``removed_paths`` (data and delete files) out, ``added`` in.

    Added data files carry ``data_sequence_number`` (the sequence number of the snapshot the rewrite
    read), so equality deletes committed after that snapshot still apply to the rewritten rows.
    """
    metadata = table.metadata
    parent = branch_head(table, branch)
    if parent is None:
        raise ValueError("cannot rewrite files of a branch without snapshots")
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4().hex
    written: list[str] = []
    manifests: list[ManifestFile] = []
    removed: list[DataFileMeta] = []

    by_spec: dict[int, list[DataFileMeta]] = {}
    for meta in added:
        by_spec.setdefault(meta.spec_id, []).append(meta)
    for spec_id, metas in sorted(by_spec.items()):
        path = _new_manifest_path(table, commit_uuid, len(written))
        written.append(path)
        writer = _ManifestWriterV2(
            metadata.specs()[spec_id], metadata.schema(), io.new_output(path), snapshot_id, "deflate"
        )
        with writer:
            for meta in metas:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED,
                        snapshot_id=snapshot_id,
                        sequence_number=data_sequence_number,
                        file_sequence_number=None,
                        data_file=to_data_file(meta, metadata.format_version),
                    )
                )
        manifests.append(writer.to_manifest_file())

    for manifest in parent.manifests(io):
        entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
        hits = [e for e in entries if e.data_file.file_path in removed_paths]
        if not hits:
            if _has_live_files(manifest):
                manifests.append(manifest)
            continue
        path = _new_manifest_path(table, commit_uuid, len(written))
        written.append(path)
        spec = metadata.specs()[manifest.partition_spec_id]
        rewritten: ManifestWriter = (
            _DeleteManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
            if manifest.content == ManifestContent.DELETES
            else _ManifestWriterV2(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
        )
        with rewritten:
            for entry in entries:
                if entry.data_file.file_path in removed_paths:
                    rewritten.delete(entry)
                    removed.append(to_meta(entry.data_file))
                else:
                    rewritten.existing(entry)
        manifests.append(rewritten.to_manifest_file())

    summary = _replace_summary(table, parent, added, removed)
    summary = Summary(operation=summary.operation, **{**summary.additional_properties, **snapshot_properties})
    return _finish(table, io, branch, parent, snapshot_id, commit_uuid, manifests, summary, written)


def prepare_manifest_rewrite(
    table: Table, io: FileIO, branch: str, entries_per_manifest: int, snapshot_properties: Mapping[str, str]
) -> PreparedCommit | None:
    """A ``replace`` snapshot that only regroups the branch's live entries into fewer manifests.

    Entries keep their status-independent identity (snapshot id, data and file sequence numbers) as
    ``EXISTING``; no file is added or removed. None when there is nothing to merge.
    """
    metadata = table.metadata
    parent = branch_head(table, branch)
    if parent is None:
        return None
    old = parent.manifests(io)
    groups: dict[tuple[int, int], list[ManifestEntry]] = {}
    for manifest in old:
        key = (int(manifest.content), manifest.partition_spec_id)
        groups.setdefault(key, []).extend(manifest.fetch_manifest_entry(io, discard_deleted=True))
    planned = sum(max(1, -(-len(e) // entries_per_manifest)) for e in groups.values() if e)
    if planned >= len(old):
        return None
    snapshot_id = metadata.new_snapshot_id()
    commit_uuid = uuid.uuid4().hex
    written: list[str] = []
    manifests: list[ManifestFile] = []
    for (content, spec_id), entries in sorted(groups.items()):
        for start in range(0, len(entries), entries_per_manifest):
            path = _new_manifest_path(table, commit_uuid, len(written))
            written.append(path)
            spec = metadata.specs()[spec_id]
            cls = _DeleteManifestWriterV2 if content == int(ManifestContent.DELETES) else _ManifestWriterV2
            writer: ManifestWriter = (
                cls(spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
                if metadata.format_version >= 2
                else write_manifest(1, spec, metadata.schema(), io.new_output(path), snapshot_id, "deflate")
            )
            with writer:
                for entry in entries[start : start + entries_per_manifest]:
                    writer.existing(entry)
            manifests.append(writer.to_manifest_file())
    previous = dict(parent.summary.additional_properties) if parent.summary else {}
    totals = {k: v for k, v in previous.items() if k.startswith("total-")}
    summary = Summary(
        operation=Operation.REPLACE,
        **totals,
        **{"manifests-created": str(len(manifests)), "manifests-replaced": str(len(old))},
        **snapshot_properties,
    )
    return _finish(table, io, branch, parent, snapshot_id, commit_uuid, manifests, summary, written)
