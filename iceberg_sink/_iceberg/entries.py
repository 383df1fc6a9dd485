"""A snapshot's live files with their sequence numbers, each manifest read once.

Above lineage.py: a v3 table's delete manifests are read with their deletion vectors' blob
locations (``lineage.read_entries``), which files.py, below it, cannot ask for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink._iceberg.files import LiveFile, to_meta
from iceberg_sink._iceberg.lineage import read_entries

if TYPE_CHECKING:  # writer tasks import the format layer: pyiceberg.table costs them ~0.4 s
    from pyiceberg.table import Table


class ManifestEntries:
    """The live entries of manifests, each manifest read once.

    A manifest never changes once written, so a job that reads a branch head several times (its
    plan, then the head of every commit attempt, then the manifests its commit rewrites) keeps one of
    these and reads each manifest file once; one kept across runs (a post-commit trigger's) reads only
    the manifests committed since. Entries are shared, never modified (PyIceberg's manifest writers
    copy the entries they are given). :meth:`keep` decides what outlives :meth:`retain` (memory).
    """

    ENTRY_BYTES = 6144
    """About what one kept entry costs in memory (PyIceberg's DataFile and the LiveFile made of it, measured
    ~5.5 KB with a handful of columns)."""

    def __init__(self) -> None:
        self._kept: dict[str, _ReadManifest] = {}
        self._run: dict[str, _ReadManifest] = {}

    def _read(self, io: FileIO, manifest: ManifestFile, format_version: int | None = None) -> _ReadManifest:
        path = manifest.manifest_path
        read = self._kept.get(path)
        if read is None:
            read = self._run.get(path)
        if read is None:
            # A v3 table's delete manifests keep their DVs' blob locations (lineage.read_entries).
            read = _ReadManifest(read_entries(io, manifest, discard_deleted=True, format_version=format_version))
            (self._kept if self.keep(len(read.entries)) else self._run)[path] = read
        return read

    def live(self, io: FileIO, manifest: ManifestFile) -> list[ManifestEntry]:
        """The entries of ``manifest`` that are not deleted, with inherited sequence numbers."""
        return self._read(io, manifest).entries

    def live_files(self, io: FileIO, manifest: ManifestFile, format_version: int | None = None) -> list[LiveFile]:
        """The entries of ``manifest`` (of a table of ``format_version``) that are not deleted, as LiveFiles."""
        read = self._read(io, manifest, format_version)
        if read.files is None:
            path = manifest.manifest_path
            read.files = [LiveFile(to_meta(e.data_file), int(e.sequence_number or 0), path) for e in read.entries]
        return read.files

    def keep(self, count: int) -> bool:
        """Whether ``count`` entries read now may be kept past :meth:`retain` (subclasses bound it)."""
        return True

    def retain(self, manifest_paths: Iterable[str]) -> int:
        """Forget every manifest but ``manifest_paths`` (and what :meth:`keep` refused); returns how
        many kept entries were dropped."""
        wanted = set(manifest_paths)
        self._run.clear()
        dropped = [p for p in self._kept if p not in wanted]
        return sum(len(self._kept.pop(p).entries) for p in dropped)


@attrs.define
class _ReadManifest:
    entries: list[ManifestEntry]
    files: list[LiveFile] | None = None


def live_files(
    table: Table, snapshot: Snapshot | None, entries: ManifestEntries | None = None
) -> tuple[list[LiveFile], list[LiveFile]]:
    """The live data files and delete files of ``snapshot`` (manifests read through ``entries``
    when given)."""
    if snapshot is None:
        return [], []
    entries = entries or ManifestEntries()
    data: list[LiveFile] = []
    deletes: list[LiveFile] = []
    for manifest in snapshot.manifests(table.io):
        target = data if manifest.content == ManifestContent.DATA else deletes
        target.extend(entries.live_files(table.io, manifest, table.metadata.format_version))
    return data, deletes
