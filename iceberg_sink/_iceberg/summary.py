"""Snapshot summary totals (``total-*``), as Iceberg Java's ``SnapshotSummary`` keeps them."""

from __future__ import annotations

from collections.abc import Mapping

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
