"""The ``replace`` commit kinds of upkeep: snapshots that replace or regroup files, adding no rows.

    ReplaceProducer   the base of every ``replace`` snapshot that swaps files (``RewriteDeletes``, in
                      ``_iceberg/delete_rewrite.py``, subclasses it too)
    RewriteFiles      replaces data and delete files by new data files (compaction)
    RewriteManifests  regroups the live entries of a branch into fewer manifests (upkeep)

They are apart from the checkpoint's commit (``_iceberg/row_delta.py``) because they share what a
checkpoint never does: each sets ``rewrites``, so the base checks, right before the commit, that the
snapshot lists exactly the parent's live files minus the replaced ones plus the added ones
(``_iceberg/rewrite_check.py``). Everything every commit must get right is in the base,
:class:`~iceberg_sink._iceberg.producer.SnapshotProducer` (``_iceberg/producer.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from iceberg_sink._iceberg.entries import ManifestEntries
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION, read_entries
from iceberg_sink._iceberg.live_vectors import vector_target
from iceberg_sink._iceberg.manifests import has_live_files
from iceberg_sink._iceberg.producer import SnapshotProducer
from iceberg_sink.vocab.files import DataFileMeta


class ReplaceProducer(SnapshotProducer):
    """A ``replace`` snapshot of a branch that has one: ``removed_paths`` out, ``added`` files in,
    plus any Puffin file emptied by removing DVs entry by entry (``_emptied_puffins``, set by the
    subclass's ``manifests``). ``entries`` holds the manifests the caller already read."""

    rewrites = True

    def __init__(
        self,
        table: Table,
        branch: str,
        added: Sequence[DataFileMeta],
        removed_paths: frozenset[str],
        properties: Mapping[str, str],
        entries: ManifestEntries | None,
    ) -> None:
        super().__init__(table, branch, properties)
        self._entries = entries or ManifestEntries()
        if self.parent is None:
            raise ValueError(f"cannot rewrite files of branch {branch!r}: it has no snapshot")
        self._new = tuple(added)
        self._removed_paths = removed_paths
        self._emptied_puffins: frozenset[str] = frozenset()

    def replaced_paths(self) -> frozenset[str]:
        return self._removed_paths | self._emptied_puffins

    def added_files(self) -> tuple[DataFileMeta, ...]:
        return self._new

    def parent_entries(self) -> ManifestEntries:
        return self._entries

    def operation(self) -> Operation:
        return Operation.REPLACE


class RewriteFiles(ReplaceProducer):
    """A ``replace`` snapshot: ``removed_paths`` (data and delete files) out, ``added`` data files in.

    Added files carry ``data_sequence_number``, the sequence number of the snapshot the rewrite read,
    so equality deletes committed after that snapshot still apply to the rewritten rows. ``entries``
    holds the manifests the caller already read (its plan and validation), so none is read twice.
    """

    def __init__(
        self,
        table: Table,
        branch: str,
        added: Sequence[DataFileMeta],
        removed_paths: frozenset[str],
        data_sequence_number: int,
        properties: Mapping[str, str],
        entries: ManifestEntries | None = None,
    ) -> None:
        super().__init__(table, branch, added, removed_paths, properties, entries)
        # Format version 1 has no sequence numbers; entries inherit nothing there.
        self._sequence_number = data_sequence_number if table.metadata.format_version >= 2 else None

    def manifests(self) -> list[ManifestFile]:
        result = self.write_manifests(self._new, ManifestContent.DATA, self._sequence_number)
        # On v3 the carried-over manifests keep their first row ids; the new files' manifest and the
        # rewritten ones get fresh ranges from the manifest list, as Iceberg Java's rewrite gives them
        # (a v3 rewrite writes every row's _row_id into its new files: topology/compaction/rewriter.py).
        parents = self.all_parent_manifests()
        if self.table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION:
            return result + self._without_dangling_vectors(parents)
        for manifest in parents:
            rewritten = self.rewrite_manifest(manifest, self._removed_paths, self._entries)
            if rewritten is not None:
                result.append(rewritten)
            elif has_live_files(manifest):
                result.append(manifest)
        return result

    def _without_dangling_vectors(self, parents: list[ManifestFile]) -> list[ManifestFile]:
        """v3: the parent's manifests without the removed files, nor the deletion vectors of removed
        data files, which nothing could apply any more (Iceberg Java's ``MergingSnapshotProducer``
        drops such dangling DVs in the same commit)."""
        manifests, self._emptied_puffins = self.without_entries(
            parents,
            lambda f: f.file_path in self._removed_paths or vector_target(f) in self._removed_paths,
            self._removed_paths,
            self._entries,
        )
        return manifests


class RewriteManifests(SnapshotProducer):
    """A ``replace`` snapshot that only regroups the branch's live entries into fewer manifests.

    Entries keep their identity (snapshot id, data and file sequence numbers) as ``EXISTING``; no
    file is added or removed. It groups entries on its own terms, so commit-time merging is off.
    """

    merges_manifests = False
    rewrites = True

    def __init__(self, table: Table, branch: str, entries_per_manifest: int, properties: Mapping[str, str]) -> None:
        super().__init__(table, branch, properties)
        self._per_manifest = entries_per_manifest
        # On a v3 table each entry comes with its first row id (inherited ones written out), so the
        # regrouped manifests keep every row's id; the new manifests get fresh ones from the list.
        self._old = self.all_parent_manifests()
        self._groups: dict[tuple[int, int], list[ManifestEntry]] = {}
        for manifest in self._old:
            key = (int(manifest.content), manifest.partition_spec_id)
            self._groups.setdefault(key, []).extend(read_entries(self.io, manifest, discard_deleted=True))
        self._created = 0

    def worthwhile(self) -> bool:
        """Whether regrouping gives fewer manifests than the branch has now."""
        planned = sum(max(1, -(-len(e) // self._per_manifest)) for e in self._groups.values() if e)
        return self.parent is not None and planned < len(self._old)

    def operation(self) -> Operation:
        return Operation.REPLACE

    def manifests(self) -> list[ManifestFile]:
        result = []
        for (content, spec_id), entries in sorted(self._groups.items()):
            for start in range(0, len(entries), self._per_manifest):
                writer = self._writer(ManifestContent(content), spec_id)
                with writer:
                    for entry in entries[start : start + self._per_manifest]:
                        writer.existing(entry)
                result.append(writer.to_manifest_file())
        self._created = len(result)
        return result

    def extra_summary(self) -> dict[str, str]:
        return {"manifests-created": str(self._created), "manifests-replaced": str(len(self._old))}
