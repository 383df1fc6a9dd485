"""The check every rewrite makes before it commits: the live files after it are the live files before
it, minus what it replaces, plus what it adds.

A rewrite (manifests regrouped, data files compacted, equality deletes converted) must not change
what a reader sees beyond the files it replaces. The new snapshot's manifests are read back, right
before the commit, and compared with the parent's live files: the same paths, each once, each with
its content (data, position or equality deletes) and, for a file that is carried over, the same
data sequence number (a carried-over file given a new one would let older deletes apply to it, or
newer ones stop applying). Any difference refuses the commit with :class:`MaintenanceRefusedError`;
nothing is committed and the manifests written for the attempt are deleted by the caller.
``SnapshotProducer.prepare`` calls :func:`check_rewrite` for every producer that replaces files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestFile

from iceberg_sink._iceberg.avro_read import fetch_entries
from iceberg_sink._iceberg.files import LiveFile
from iceberg_sink.errors import MaintenanceRefusedError
from iceberg_sink.vocab.files import DataFileMeta

_SHOWN = 3


def _examples(paths: Iterable[str]) -> str:
    listed = sorted(paths)
    shown = ", ".join(listed[:_SHOWN])
    return shown + (f" and {len(listed) - _SHOWN} more" if len(listed) > _SHOWN else "")


def check_rewrite(
    what: str,
    io: FileIO,
    before: Sequence[LiveFile],
    after: Sequence[ManifestFile],
    removed: Collection[str],
    added: Collection[DataFileMeta],
    format_version: int,
    carried: Callable[[ManifestFile], Iterable[ManifestEntry] | None] | None = None,
) -> None:
    """Refuse a rewrite whose manifests do not list exactly ``before - removed + added``.

    Args:
        what: names the rewrite in the error (``manifest rewrite of table db.t``).
        io: reads the new manifests.
        before: the live data and delete files of the snapshot the rewrite builds on.
        after: every manifest the new snapshot lists (the ones written for it are read back).
        removed: paths of the files the rewrite replaces (each must be live before).
        added: the files the rewrite adds (none may be live before).
        format_version: the table's; version 1 has no sequence numbers to compare.
        carried: the live entries of a manifest the parent snapshot lists too (manifest files are
            never changed, so the caller's read of the parent serves), or None for one to read here;
            every manifest written for the rewrite is read back from storage.

    Raises:
        MaintenanceRefusedError: the new snapshot would lose, duplicate, add or change a file other
            than the ones the rewrite replaces and adds.
    """
    previous = {f.meta.path: f for f in before}
    problems = []
    not_live = [p for p in removed if p not in previous]
    if not_live:
        problems.append(f"{len(not_live)} files it replaces are not live ({_examples(not_live)})")
    already = [f.path for f in added if f.path in previous]
    if already:
        problems.append(f"{len(already)} files it adds are already live ({_examples(already)})")
    sequenced = format_version >= 2
    expected = {
        p: (int(f.meta.content), f.data_sequence_number if sequenced else 0)
        for p, f in previous.items()
        if p not in removed
    }
    added_content = {f.path: int(f.content) for f in added}

    counts: Counter[str] = Counter()
    listed: dict[str, tuple[int, int]] = {}
    puffins = set()  # a Puffin file holds the deletion vectors of many data files, one entry each
    for manifest in after:
        known = carried(manifest) if carried is not None else None
        entries = known if known is not None else fetch_entries(io, manifest, discard_deleted=True)
        for entry in entries:
            path = entry.data_file.file_path
            counts[path] += 1
            if str(entry.data_file.file_format.value).upper() == "PUFFIN":
                puffins.add(path)
            listed[path] = (int(entry.data_file.content), int(entry.sequence_number or 0) if sequenced else 0)
    twice = [p for p, n in counts.items() if n > 1 and p not in puffins]
    if twice:
        problems.append(f"{len(twice)} files would be listed more than once ({_examples(twice)})")
    lost = [p for p in expected if p not in listed]
    if lost:
        problems.append(f"{len(lost)} live files would be dropped ({_examples(lost)})")
    missing = [p for p in added_content if p not in listed]
    if missing:
        problems.append(f"{len(missing)} files it adds would not be listed ({_examples(missing)})")
    unexpected = [p for p in listed if p not in expected and p not in added_content]
    if unexpected:
        problems.append(
            f"{len(unexpected)} files would be listed that it neither keeps nor adds ({_examples(unexpected)})"
        )
    changed = [
        p
        for p, (content, sequence) in expected.items()
        if p in listed and (listed[p][0] != content or listed[p][1] != sequence)
    ]
    changed += [p for p, content in added_content.items() if p in listed and listed[p][0] != content]
    if changed:
        problems.append(f"{len(changed)} files would change content or data sequence number ({_examples(changed)})")
    if problems:
        raise MaintenanceRefusedError(
            f"{what}: refused before committing, the new snapshot would not hold the live files of the one it "
            f"replaces minus {len(removed)} replaced plus {len(added)} added files: {'; '.join(problems)}. "
            "Nothing was committed."
        )
