"""Snapshot summary totals (``total-*``), as Iceberg Java's ``SnapshotSummary`` keeps them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from iceberg_sink.vocab.files import DataFileMeta

# (total, added, removed) summary keys, as Iceberg Java's SnapshotSummary keeps them.
_TOTALS = (
    ("total-data-files", "added-data-files", "deleted-data-files"),
    ("total-delete-files", "added-delete-files", "removed-delete-files"),
    ("total-records", "added-records", "deleted-records"),
    ("total-files-size", "added-files-size", "removed-files-size"),
    ("total-position-deletes", "added-position-deletes", "removed-position-deletes"),
    ("total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"),
)


def summary_totals(previous: Mapping[str, str] | None, changes: Mapping[str, str]) -> dict[str, str]:
    """The ``total-*`` keys of a new snapshot from its parent's summary and its own changes.

    As Iceberg Java does: a branch's first snapshot starts from zero; a total the parent does not
    carry is left out (it cannot be known, so it is not made up); a total that would go negative
    (a parent summary that was wrong) is left out rather than reported.
    """
    result = {}
    for total, added, removed in _TOTALS:
        try:
            base = 0 if previous is None else int(previous[total])
            value = base + int(changes.get(added, "0")) - int(changes.get(removed, "0"))
        except (KeyError, ValueError):
            continue
        if value >= 0:
            result[total] = str(value)
    return result


def with_dv_counts(
    changes: Mapping[str, str], added: Sequence[DataFileMeta], removed: Sequence[DataFileMeta]
) -> dict[str, str]:
    """``changes`` (PyIceberg's collector, which counts a DV as a position delete file) as Iceberg Java's
    ``SnapshotSummary`` counts deletion vectors: ``added-dvs``/``removed-dvs`` instead of position delete
    files, still delete files and position deletes, and a DV's size its blob's, not its Puffin file's."""
    result = dict(changes)
    for files, dvs_key, pos_key, size_key in (
        (added, "added-dvs", "added-position-delete-files", "added-files-size"),
        (removed, "removed-dvs", "removed-position-delete-files", "removed-files-size"),
    ):
        dvs = [f for f in files if f.is_dv]
        if not dvs:
            continue
        result[dvs_key] = str(len(dvs))
        left = int(result.get(pos_key, "0")) - len(dvs)
        if left > 0:
            result[pos_key] = str(left)
        else:
            result.pop(pos_key, None)
        if size_key in result:
            extra = sum(f.file_size_in_bytes - (f.content_size_in_bytes or 0) for f in dvs)
            result[size_key] = str(int(result[size_key]) - extra)
    return result
