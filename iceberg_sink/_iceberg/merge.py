"""Merging small manifests on commit, as Iceberg Java's merge-append (ManifestMergeManager) does.

Every commit lists its new manifests first, then the parent's. Without merging, a stream that commits
once per checkpoint lists one more manifest per checkpoint, and every commit, scan and planning step
reads them all. On each commit, the manifests of one content (data or deletes) and one partition
spec are bin-packed from the end of the list to ``commit.manifest.target-size-bytes``, so the old,
full manifests stay as they are and the newest ones fill up a bin; a bin of several manifests is
rewritten as one. The bin holding the first manifest of the list (the new one of this commit) is
merged only once it holds ``commit.manifest.min-count-to-merge`` manifests: most commits merge
nothing and write one small manifest, and every so many commits fold the small ones into one.

Merged entries keep their identity: an entry added by this snapshot stays ADDED; every other live
entry becomes EXISTING with its own snapshot id, data sequence number and file sequence number (and,
on a v3 table, its first row id, written out when it was inherited: ``_iceberg/lineage.py``); an
entry this snapshot deleted stays DELETED, and entries deleted by earlier snapshots are dropped.
Manifests replaced by a merge stay in storage (older snapshots list them; snapshot expiry removes
them), except those written by this commit itself, which nothing else lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus, ManifestFile, ManifestWriter

from iceberg_sink import options
from iceberg_sink._iceberg.lineage import read_entries


@attrs.frozen
class MergeSettings:
    """The table properties that govern merging (Iceberg Java's names and defaults)."""

    enabled: bool = options.MANIFEST_MERGE_ENABLED.default
    min_count_to_merge: int = options.MANIFEST_MIN_COUNT_TO_MERGE.default
    target_size_bytes: int = options.MANIFEST_TARGET_SIZE_BYTES.default

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> MergeSettings:
        """Read from table properties; a malformed value raises InvalidSinkConfigError naming it."""
        return cls(
            enabled=bool(options.MANIFEST_MERGE_ENABLED.from_properties(properties)),
            min_count_to_merge=int(options.MANIFEST_MIN_COUNT_TO_MERGE.from_properties(properties)),
            target_size_bytes=int(options.MANIFEST_TARGET_SIZE_BYTES.from_properties(properties)),
        )


def pack_end(items: Sequence[ManifestFile], target_size_bytes: int) -> list[list[ManifestFile]]:
    """Bins of consecutive manifests, filled greedily from the end, each at most ``target_size_bytes``
    (a larger manifest is a bin of its own). Order is kept. Iceberg Java's ``ListPacker.packEnd``
    with a look-back of one: the under-filled bin is the first, so it is merged next time."""
    bins: list[list[ManifestFile]] = []
    current: list[ManifestFile] = []
    weight = 0
    for manifest in reversed(items):
        length = manifest.manifest_length
        if current and weight + length > target_size_bytes:
            bins.append(current)
            current, weight = [], 0
        current.append(manifest)
        weight += length
    if current:
        bins.append(current)
    return [list(reversed(b)) for b in reversed(bins)]


NewWriter = Callable[[ManifestContent, int], ManifestWriter]


@attrs.define
class ManifestMerger:
    """Merges the manifests one snapshot lists; see the module docstring.

    Args:
        io: reads the manifests.
        snapshot_id: the snapshot being produced (its ADDED and DELETED entries keep their status).
        settings: the table's merge properties.
        new_writer: a manifest writer for (content, spec id), owned by the snapshot producer.
    """

    io: FileIO
    snapshot_id: int
    settings: MergeSettings
    new_writer: NewWriter
    replaced: list[ManifestFile] = attrs.field(factory=list, init=False)
    created: list[ManifestFile] = attrs.field(factory=list, init=False)

    def merge(self, manifests: Sequence[ManifestFile]) -> list[ManifestFile]:
        """The manifests to list instead of ``manifests``: data manifests first, then delete
        manifests, each grouped by partition spec (newest spec first, as Iceberg Java orders them)."""
        if not self.settings.enabled or not manifests:
            return list(manifests)
        result: list[ManifestFile] = []
        for content in (ManifestContent.DATA, ManifestContent.DELETES):
            of_content = [m for m in manifests if m.content == content]
            if not of_content:
                continue
            first = of_content[0]
            by_spec: dict[int, list[ManifestFile]] = {}
            for manifest in of_content:
                by_spec.setdefault(manifest.partition_spec_id, []).append(manifest)
            for spec_id in sorted(by_spec, reverse=True):
                for bin_ in pack_end(by_spec[spec_id], self.settings.target_size_bytes):
                    # Only the bin with this commit's own manifest waits for the minimum count, so a
                    # large new manifest never keeps older small ones from merging.
                    if len(bin_) == 1 or (first in bin_ and len(bin_) < self.settings.min_count_to_merge):
                        result.extend(bin_)
                    else:
                        result.append(self._merge_bin(content, spec_id, bin_))
        return result

    def _merge_bin(self, content: ManifestContent, spec_id: int, bin_: Sequence[ManifestFile]) -> ManifestFile:
        writer = self.new_writer(content, spec_id)
        with writer:
            for manifest in bin_:
                for entry in read_entries(self.io, manifest, discard_deleted=False):
                    if entry.status == ManifestEntryStatus.DELETED:
                        # Deletes of earlier snapshots are history; only this snapshot's are kept.
                        if entry.snapshot_id == self.snapshot_id:
                            writer.delete(entry)
                    elif entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == self.snapshot_id:
                        writer.add(entry)
                    else:
                        writer.existing(entry)
        merged = writer.to_manifest_file()
        self.replaced.extend(bin_)
        self.created.append(merged)
        return merged
