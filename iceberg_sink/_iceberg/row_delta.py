"""The checkpoint's commit kind: :class:`RowDelta`, with :class:`SnapshotChanges`, the files it adds.

    RowDelta          appends data files and delete files (a checkpoint of the stream); with
                      ``truncate``, first removes every live file of the branch head

This is the commit the streaming path makes (committer/committer.py), apart from the ``replace``
snapshots of upkeep (``_iceberg/rewrites.py``, ``_iceberg/delete_rewrite.py``): it adds files and
removes only what a checkpoint takes over (a v3 table's replaced deletion vectors, a truncate's
whole branch head). Everything every commit must get right is in the base,
:class:`~iceberg_sink._iceberg.producer.SnapshotProducer` (``_iceberg/producer.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from iceberg_sink._iceberg import V3_CHANGES_REFUSAL
from iceberg_sink._iceberg.files import to_meta
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION, read_entries
from iceberg_sink._iceberg.position_deletes import referenced_data_file
from iceberg_sink._iceberg.producer import SnapshotProducer
from iceberg_sink.errors import UnsupportedTableError
from iceberg_sink.vocab.files import DataFileMeta


@attrs.frozen
class SnapshotChanges:
    """The files one checkpoint adds, grouped by content; ``truncate``: it also removes every data
    and delete file live on the branch head it is committed on (a source table truncate)."""

    data_files: tuple[DataFileMeta, ...] = ()
    delete_files: tuple[DataFileMeta, ...] = ()
    truncate: bool = False

    @property
    def operation(self) -> Operation:
        # Iceberg Java's BaseRowDelta: deletes only is a delete, both an overwrite; removing files
        # while adding rows is an overwrite, removing them alone a delete (Java's DeleteFiles).
        if self.truncate:
            return Operation.OVERWRITE if self.data_files else Operation.DELETE
        if self.delete_files and self.data_files:
            return Operation.OVERWRITE
        if self.delete_files:
            return Operation.DELETE
        return Operation.APPEND


class RowDelta(SnapshotProducer):
    """A checkpoint's snapshot: new data files and delete files on top of the branch head. On v3 the
    delete files are DVs only (committer/vectors.py); the live delete files they take over,
    ``replaced`` ((path, the one data file it applies to): the DVs they replace and the file-scoped
    position delete files of an upgraded v2 table whose positions they hold), are marked deleted, so
    each data file keeps at most one DV and nothing beside it."""

    def __init__(
        self,
        table: Table,
        branch: str,
        changes: SnapshotChanges,
        properties: Mapping[str, str],
        replaced: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        super().__init__(table, branch, properties)
        if changes.delete_files and table.metadata.format_version < 2:
            raise ValueError("delete files need format version 2; this table is version 1")
        v3 = table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION
        if v3 and any(
            f.file_format.upper() != "PUFFIN" or f.referenced_data_file is None for f in changes.delete_files
        ):
            raise UnsupportedTableError(
                f"a checkpoint with equality or position delete files on table {'.'.join(table.name())} of format "
                f"version {table.metadata.format_version}: expected format version 1 or 2 ({V3_CHANGES_REFUSAL})"
            )
        if replaced and not v3:
            raise ValueError("deletion vectors need format version 3")
        self._changes = changes
        self._replaced = replaced

    def operation(self) -> Operation:
        return self._changes.operation

    def manifests(self) -> list[ManifestFile]:
        new = self.write_manifests(self._changes.data_files, ManifestContent.DATA)
        new += self.write_manifests(self._changes.delete_files, ManifestContent.DELETES)
        if self.table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION and (
            self._replaced or self._changes.truncate
        ):
            return new + self._v3_parent_manifests()
        if not self._changes.truncate:
            return new + self.parent_manifests()
        # A truncate: every file live on the head this snapshot is built on is removed (the
        # commit's compare-and-swap on that head makes "every" exact).
        removed = [self.remove_manifest(m) for m in self.parent_manifests()]
        return new + [m for m in removed if m is not None]

    def _v3_parent_manifests(self) -> list[ManifestFile]:
        """The parent's manifests with the replaced delete files (a truncate: every live file) marked deleted,
        read as v3 so the entries kept keep their DV blob location and first row id."""
        result, found, everything = [], set(), self._changes.truncate
        for manifest in self.parent_manifests():
            if manifest.content != ManifestContent.DELETES and not everything:
                result.append(manifest)
                continue
            entries = read_entries(self.io, manifest)
            keys = [(e.data_file.file_path, referenced_data_file(to_meta(e.data_file))) for e in entries]
            if not everything and not self._replaced.intersection(keys):
                result.append(manifest)
                continue
            writer = self._writer(manifest.content, manifest.partition_spec_id)
            with writer:
                for entry, key in zip(entries, keys, strict=True):
                    if everything or key in self._replaced:
                        writer.delete(entry)
                        self._removed.append(to_meta(entry.data_file))
                        found.add(key)
                    else:
                        writer.existing(entry)
            result.append(writer.to_manifest_file())
        missing = self._replaced - found
        if missing:
            raise ValueError(f"delete files to replace are not live on the branch head: {sorted(missing)[:1]}")
        return result
