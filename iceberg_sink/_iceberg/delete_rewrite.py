"""The ``replace`` snapshot that swaps delete files for equivalent ones (equality-delete conversion).

On format v2 it removes equality delete files (and the file-scoped position delete files merged into
the new ones) and adds file-scoped position delete files. On format v3, which forbids adding position
delete files, it adds deletion vectors instead and removes the live DVs they replace, entry by entry
(one Puffin file may hold the DVs of many data files), so each data file keeps at most one DV; data
manifests are carried over with their first row ids, so the snapshot assigns no row ids to rows that
already have them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyiceberg.manifest import DataFile, ManifestContent, ManifestFile
from pyiceberg.table import Table

from iceberg_sink._iceberg import V3_CHANGES_REFUSAL
from iceberg_sink._iceberg.entries import ManifestEntries
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION
from iceberg_sink._iceberg.live_vectors import vector_target
from iceberg_sink._iceberg.manifests import has_live_files
from iceberg_sink._iceberg.rewrites import ReplaceProducer
from iceberg_sink.errors import UnsupportedTableError
from iceberg_sink.vocab.files import DataFileMeta, FileContent


class RewriteDeletes(ReplaceProducer):
    """A ``replace`` snapshot that swaps delete files for equivalent ones: ``removed_paths`` (delete
    files) out, ``added`` delete files in, and on v3 the live DVs ``replaced_dvs`` ((Puffin path,
    data file)) out; data files are untouched.

    This is what converting equality deletes commits (topology/conversion/job.py). Iceberg Java
    labels a ``RewriteFiles`` that changes no rows ``replace``, and so does this class. The added
    files inherit the new snapshot's sequence number (as Java's ``RewriteFiles`` gives added delete
    files when none is set); the caller justifies why that is right for what it adds. ``entries``
    holds the manifests the caller already read (to validate the attempt), so none is read twice.
    """

    def __init__(
        self,
        table: Table,
        branch: str,
        added: Sequence[DataFileMeta],
        removed_paths: frozenset[str],
        properties: Mapping[str, str],
        entries: ManifestEntries | None = None,
        replaced_dvs: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        version = table.metadata.format_version
        if version < 2:
            raise ValueError("delete files need format version 2; this table is version 1")
        super().__init__(table, branch, added, removed_paths, properties, entries)
        if any(f.content == FileContent.DATA for f in added):
            raise ValueError("RewriteDeletes adds delete files only; received a data file")
        self._v3 = version >= ROW_LINEAGE_FORMAT_VERSION
        if self._v3 and any(f.file_format.upper() != "PUFFIN" or f.referenced_data_file is None for f in added):
            raise UnsupportedTableError(
                f"a rewrite adding equality or position delete files to table {'.'.join(table.name())} of format "
                f"version {version}: expected deletion vectors ({V3_CHANGES_REFUSAL})"
            )
        if replaced_dvs and not self._v3:
            raise ValueError("deletion vectors need format version 3")
        self._replaced_dvs = replaced_dvs

    def manifests(self) -> list[ManifestFile]:
        result = self.write_manifests(self._new, ManifestContent.DELETES)
        if self._v3:
            return result + self._v3_parents()
        assert self.parent is not None
        for manifest in self.parent.manifests(self.io):
            # Data manifests are carried over unread: only delete files are removed.
            rewritten = (
                self.rewrite_manifest(manifest, self._removed_paths, self._entries)
                if manifest.content == ManifestContent.DELETES
                else None
            )
            if rewritten is not None:
                result.append(rewritten)
            elif has_live_files(manifest):
                result.append(manifest)
        return result

    def _v3_parents(self) -> list[ManifestFile]:
        """The parent's manifests (with their first row ids) without the removed delete files and
        the replaced DVs."""

        def goes(f: DataFile) -> bool:
            return f.file_path in self._removed_paths or (f.file_path, vector_target(f)) in self._replaced_dvs

        manifests, self._emptied_puffins = self.without_entries(
            self.all_parent_manifests(), goes, self._removed_paths, self._entries
        )
        missing = self._replaced_dvs - {(e.path, e.referenced_data_file) for e in self._removed}
        if missing:
            raise ValueError(f"deletion vectors to replace are not live on the branch head: {sorted(missing)[:1]}")
        return manifests
