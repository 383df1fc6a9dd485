"""The snapshot-producer base: every commit the sink makes is one subclass of :class:`SnapshotProducer`.

    RowDelta          appends data files and delete files (a checkpoint of the stream); with
                      ``truncate``, first removes every live file of the branch head; in
                      ``_iceberg/row_delta.py``
    RewriteFiles      replaces data and delete files by new data files (compaction); in
                      ``_iceberg/rewrites.py``
    RewriteDeletes    replaces delete files by equivalent delete files (equality deletes -> position
                      deletes or DVs); in ``_iceberg/delete_rewrite.py``
    RewriteManifests  regroups the live entries of a branch into fewer manifests (upkeep); in
                      ``_iceberg/rewrites.py``

The base class owns what every commit must get right, so no commit kind can get it wrong on its
own: the format-version dispatch of manifest writers, row lineage on v3 (the snapshot's first-row-id
and added-rows, carried-over manifests read with their first row ids: ``_iceberg/lineage.py``), the
refusal of commit kinds a format version cannot take, merging small manifests as Iceberg Java's
merging producers do (``_iceberg/merge.py``; the manifest rewrite, which regroups on its own terms,
opts out), the snapshot's sequence number and parent,
summary totals (never negative, never made up when the parent has none), the branch update (which
keeps the branch's retention settings), and the requirements that make the commit a
compare-and-swap on the branch head. The commit kinds live in their own modules, which import this
one (never the other way). :func:`commit_prepared` (``_iceberg/commit.py``, re-exported
here) sends a prepared snapshot.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable, Iterable, Mapping

import attrs
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
)

from iceberg_sink._iceberg import SUPPORTED_FORMAT_VERSIONS
from iceberg_sink._iceberg.commit import commit_metadata as commit_metadata
from iceberg_sink._iceberg.commit import commit_prepared as commit_prepared
from iceberg_sink._iceberg.commit import delete_dropped_metadata as delete_dropped_metadata
from iceberg_sink._iceberg.commit import is_stale_sequence_number as is_stale_sequence_number
from iceberg_sink._iceberg.entries import ManifestEntries, live_files
from iceberg_sink._iceberg.files import branch_head, delete_quietly, to_data_file, to_meta
from iceberg_sink._iceberg.lineage import (
    ROW_LINEAGE_FORMAT_VERSION,
    new_manifest_list_writer,
    read_entries,
    read_manifests,
    snapshot_row_range,
    table_next_row_id,
)
from iceberg_sink._iceberg.live_vectors import is_deletion_vector
from iceberg_sink._iceberg.manifests import has_live_files, new_manifest_writer
from iceberg_sink._iceberg.merge import ManifestMerger, MergeSettings
from iceberg_sink._iceberg.rewrite_check import check_rewrite
from iceberg_sink._iceberg.summary import summary_totals, with_dv_counts
from iceberg_sink.errors import UnsupportedTableError
from iceberg_sink.vocab.files import DataFileMeta


@attrs.frozen
class PreparedCommit:
    """A snapshot ready to commit, with the files written for it (deleted if it never lands), and the
    table (metadata) it was prepared on."""

    snapshot: Snapshot
    updates: tuple[object, ...]
    requirements: tuple[object, ...]
    written_files: tuple[str, ...]
    table: Table = attrs.field(eq=False, repr=False)


class SnapshotProducer(abc.ABC):
    """Builds one snapshot on top of a branch head. Subclasses say which manifests it lists.

    Args:
        table: the table as just loaded from the catalog (its metadata decides the parent, the
            sequence number and the compare-and-swap requirements).
        branch: the branch the snapshot is committed to (created on first commit, from main's head).
        properties: extra summary properties (job and checkpoint ids, hook properties, ...).
    """

    merges_manifests = True
    """Whether the listed manifests are merged per the table's ``commit.manifest*`` properties."""

    format_versions: tuple[int, ...] = SUPPORTED_FORMAT_VERSIONS
    """The format versions this commit kind is built for; others are refused before anything is
    written (with :attr:`refusal` saying why)."""

    refusal = ""

    rewrites = False
    """Whether the snapshot replaces files (or only regroups them): such a snapshot is checked, right
    before it is committed, to list exactly the parent's live files minus :meth:`replaced_paths` plus
    :meth:`added_files` (``_iceberg/rewrite_check.py``)."""

    def __init__(self, table: Table, branch: str, properties: Mapping[str, str]) -> None:
        metadata = table.metadata
        if metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(
                f"format version {metadata.format_version} is not supported (expected one of {SUPPORTED_FORMAT_VERSIONS})"
            )
        if metadata.format_version not in self.format_versions:
            raise UnsupportedTableError(
                f"{type(self).__name__} on table {'.'.join(table.name())} of format version {metadata.format_version}: "
                f"expected format version {' or '.join(map(str, self.format_versions))} ({self.refusal})"
            )
        self.table = table
        self.io: FileIO = table.io
        self.branch = branch
        self.properties = dict(properties)
        self.parent = branch_head(table, branch)
        self.snapshot_id = metadata.new_snapshot_id()
        self._commit_uuid = uuid.uuid4().hex
        self._written: list[str] = []
        self._added: list[DataFileMeta] = []
        self._removed: list[DataFileMeta] = []
        self._merge_settings = MergeSettings.from_properties(metadata.properties)
        self._merge_summary: dict[str, str] = {}

    # -- what subclasses provide -------------------------------------------------------------

    @abc.abstractmethod
    def operation(self) -> Operation:
        """The snapshot's operation (append, overwrite, delete, replace)."""

    @abc.abstractmethod
    def manifests(self) -> list[ManifestFile]:
        """Every manifest the new snapshot lists (new ones written with :meth:`write_manifests`)."""

    def extra_summary(self) -> dict[str, str]:
        """Summary properties of this commit kind besides the file counts."""
        return {}

    def replaced_paths(self) -> frozenset[str]:
        """The files a rewrite replaces (see :attr:`rewrites`)."""
        return frozenset()

    def added_files(self) -> tuple[DataFileMeta, ...]:
        """The files a rewrite adds (see :attr:`rewrites`)."""
        return ()

    def parent_entries(self) -> ManifestEntries:
        """The parent's manifests as already read by the caller (read again otherwise)."""
        return ManifestEntries()

    # -- helpers for subclasses --------------------------------------------------------------

    def parent_manifests(self) -> list[ManifestFile]:
        """The parent's manifests that still list live files (Iceberg Java drops the others)."""
        return [m for m in self.all_parent_manifests() if has_live_files(m)]

    def all_parent_manifests(self) -> list[ManifestFile]:
        """Every manifest the parent lists; on a v3 table with its ``first_row_id`` (``lineage.py``)."""
        if self.parent is None:
            return []
        return read_manifests(self.io, self.parent, self.table.metadata.format_version)

    def new_manifest_path(self) -> str:
        path = self.table.location_provider().new_metadata_location(f"{self._commit_uuid}-m{len(self._written)}.avro")
        self._written.append(path)
        return path

    def write_manifests(
        self, files: Iterable[DataFileMeta], content: ManifestContent, data_sequence_number: int | None = None
    ) -> list[ManifestFile]:
        """Manifests (one per partition spec) adding ``files`` in this snapshot.

        ``data_sequence_number`` None lets the entries inherit the snapshot's sequence number; a
        rewrite passes the sequence number of the snapshot it read.
        """
        metadata = self.table.metadata
        by_spec: dict[int, list[DataFileMeta]] = {}
        for meta in files:
            by_spec.setdefault(meta.spec_id, []).append(meta)
        result = []
        for spec_id, metas in sorted(by_spec.items()):
            writer = self._writer(content, spec_id)
            with writer:
                for meta in metas:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self.snapshot_id,
                            sequence_number=data_sequence_number,
                            file_sequence_number=None,
                            data_file=to_data_file(meta, metadata.format_version),
                        )
                    )
            self._added.extend(metas)
            result.append(writer.to_manifest_file())
        return result

    def rewrite_manifest(
        self, manifest: ManifestFile, removed_paths: frozenset[str], read: ManifestEntries | None = None
    ) -> ManifestFile | None:
        """``manifest`` with the entries of ``removed_paths`` marked deleted; None when it has none.
        ``read`` gives entries already read (else the manifest is read here)."""
        entries = (read or ManifestEntries()).live(self.io, manifest)
        if not any(e.data_file.file_path in removed_paths for e in entries):
            return None
        if self.table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION:
            # With their first row ids (PyIceberg's reads drop them), which the kept entries write
            # out: their rows keep their ids in the rewritten manifest.
            entries = read_entries(self.io, manifest)
        writer = self._writer(manifest.content, manifest.partition_spec_id)
        with writer:
            for entry in entries:
                if entry.data_file.file_path in removed_paths:
                    writer.delete(entry)
                    self._removed.append(to_meta(entry.data_file))
                else:
                    writer.existing(entry)
        return writer.to_manifest_file()

    def remove_manifest(self, manifest: ManifestFile) -> ManifestFile | None:
        """``manifest`` with every live entry marked deleted; None when it lists no live file."""
        read = ManifestEntries()  # reads the manifest once for both steps
        live = frozenset(e.data_file.file_path for e in read.live(self.io, manifest))
        return self.rewrite_manifest(manifest, live, read) if live else None

    def without_entries(
        self,
        parents: list[ManifestFile],
        goes: Callable[[DataFile], bool],
        removed_paths: frozenset[str],
        read: ManifestEntries,
    ) -> tuple[list[ManifestFile], frozenset[str]]:
        """v3: ``parents`` with the entries ``goes`` picks (and the files of ``removed_paths``)
        marked deleted, delete manifests read as v3 so the kept entries keep their DV blob location.
        One Puffin file can hold the DVs of many data files, each its own entry: entries go one by
        one. Also returns the Puffin files all of whose entries go (a rewrite replaces those)."""
        deletes = {m.manifest_path: read_entries(self.io, m) for m in parents if m.content == ManifestContent.DELETES}
        puffins = [e for entries in deletes.values() for e in entries if is_deletion_vector(e.data_file)]
        kept = {e.data_file.file_path for e in puffins if not goes(e.data_file)}
        emptied = frozenset(e.data_file.file_path for e in puffins if goes(e.data_file)) - kept
        result = []
        for manifest in parents:
            entries = deletes.get(manifest.manifest_path)
            rewritten: ManifestFile | None = None
            if entries is None or not any(goes(e.data_file) for e in entries):
                rewritten = self.rewrite_manifest(manifest, removed_paths, read)
            else:
                writer = self._writer(manifest.content, manifest.partition_spec_id)
                with writer:
                    for entry in entries:
                        if goes(entry.data_file):
                            writer.delete(entry)
                            self._removed.append(to_meta(entry.data_file))
                        else:
                            writer.existing(entry)
                rewritten = writer.to_manifest_file()
            if rewritten is not None:
                result.append(rewritten)
            elif has_live_files(manifest):
                result.append(manifest)
        return result, emptied

    def _writer(self, content: ManifestContent, spec_id: int) -> ManifestWriter:
        metadata = self.table.metadata
        return new_manifest_writer(
            metadata.format_version,
            content,
            metadata.specs()[spec_id],
            metadata.schema(),
            self.io.new_output(self.new_manifest_path()),
            self.snapshot_id,
        )

    # -- the template ------------------------------------------------------------------------

    def summary(self) -> Summary:
        metadata = self.table.metadata
        collector = SnapshotSummaryCollector()
        specs, schema = metadata.specs(), metadata.schema()
        for meta in self._added:
            collector.add_file(
                to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
            )
        for meta in self._removed:
            collector.remove_file(
                to_data_file(meta, metadata.format_version), schema=schema, partition_spec=specs[meta.spec_id]
            )
        changes = with_dv_counts(collector.build(), self._added, self._removed)
        previous = (
            self.parent.summary.additional_properties if self.parent is not None and self.parent.summary else None
        )
        if self.parent is not None and self.parent.summary is None:
            previous = {}  # a parent without a summary: no total can be known
        totals = summary_totals(previous, changes)
        return Summary(
            operation=self.operation(),
            **{**changes, **totals, **self._merge_summary, **self.extra_summary(), **self.properties},
        )

    def _merged(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        """``manifests`` with small ones merged (see ``_iceberg/merge.py``). A manifest this commit
        wrote and then merged away is deleted at once: no snapshot will ever list it."""
        if not self.merges_manifests or not self._merge_settings.enabled:
            return manifests
        merger = ManifestMerger(self.io, self.snapshot_id, self._merge_settings, self._writer)
        result = merger.merge(manifests)
        if merger.replaced:
            own = {m.manifest_path for m in merger.replaced} & set(self._written)
            delete_quietly(self.io, sorted(own))
            self._written = [p for p in self._written if p not in own]
            self._merge_summary = {
                "manifests-created": str(sum(1 for m in result if m.added_snapshot_id == self.snapshot_id)),
                "manifests-replaced": str(len(merger.replaced)),
                "manifests-kept": str(sum(1 for m in result if m.added_snapshot_id != self.snapshot_id)),
            }
        return result

    def _check_rewrite(self, manifests: list[ManifestFile]) -> None:
        """Refuse a rewrite that would change more than it replaces; the manifests written for it are
        deleted (nothing will ever list them)."""
        try:
            entries = self.parent_entries()
            data, deletes = live_files(self.table, self.parent, entries)
            parents = {m.manifest_path for m in self.parent.manifests(self.io)} if self.parent is not None else set()

            def carried(manifest: ManifestFile) -> list[ManifestEntry] | None:
                # A manifest of the parent's, listed as it was: its live entries are the ones read above.
                return entries.live(self.io, manifest) if manifest.manifest_path in parents else None

            check_rewrite(
                f"{self.operation().value} of branch {self.branch} of {self.table.name()} ({type(self).__name__})",
                self.io,
                data + deletes,
                manifests,
                self.replaced_paths(),
                self.added_files(),
                self.table.metadata.format_version,
                carried,
            )
        except BaseException:
            delete_quietly(self.io, self._written)
            self._written = []
            raise

    def prepare(self) -> PreparedCommit:
        """Write the manifests and the manifest list, and build the snapshot, the branch update and
        the requirements (same table, branch head still the parent)."""
        metadata = self.table.metadata
        manifests = self._merged(self.manifests())
        if self.rewrites:
            self._check_rewrite(manifests)
        summary = self.summary()
        sequence_number = metadata.next_sequence_number()
        manifest_list = self.table.location_provider().new_metadata_location(
            f"snap-{self.snapshot_id}-0-{self._commit_uuid}.avro"
        )
        self._written.append(manifest_list)
        parent_id = self.parent.snapshot_id if self.parent is not None else None
        # Row lineage (v3): the snapshot's first row id is the table's next one; the manifest list
        # assigns ids to the data manifests that have none, and added-rows is what it assigned.
        first_row_id = table_next_row_id(metadata) if metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION else None
        with new_manifest_list_writer(
            metadata.format_version,
            self.io.new_output(manifest_list),
            self.snapshot_id,
            parent_id,
            sequence_number,
            first_row_id,
        ) as list_writer:
            list_writer.add_manifests(manifests)
        snapshot = Snapshot(  # type: ignore[call-arg]  # pydantic aliases
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent_id,
            sequence_number=sequence_number,
            manifest_list=manifest_list,
            summary=summary,
            schema_id=metadata.current_schema_id,
            **snapshot_row_range(list_writer, first_row_id),
        )
        current_ref = metadata.refs.get(self.branch)
        # A branch keeps its retention settings across commits, as Iceberg Java's SnapshotProducer does.
        updates = (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(  # type: ignore[call-arg]
                snapshot_id=self.snapshot_id,
                ref_name=self.branch,
                type=SnapshotRefType.BRANCH,
                max_ref_age_ms=current_ref.max_ref_age_ms if current_ref else None,
                max_snapshot_age_ms=current_ref.max_snapshot_age_ms if current_ref else None,
                min_snapshots_to_keep=current_ref.min_snapshots_to_keep if current_ref else None,
            ),
        )
        if metadata.snapshots or self.branch == MAIN_BRANCH:
            ref_requirement = AssertRefSnapshotId(  # type: ignore[call-arg]
                ref=self.branch, snapshot_id=current_ref.snapshot_id if current_ref else None
            )
        else:
            # PyIceberg refuses "branch must not exist" on a table without snapshots. There, main
            # must still have none; and a snapshot committed meanwhile (on any branch) makes ours
            # carry a stale sequence number, which the catalog rejects: the attempt is retried.
            ref_requirement = AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=None)  # type: ignore[call-arg]
        requirements = (AssertTableUUID(uuid=metadata.table_uuid), ref_requirement)
        return PreparedCommit(
            snapshot=snapshot,
            updates=updates,
            requirements=requirements,
            written_files=tuple(self._written),
            table=self.table,
        )
