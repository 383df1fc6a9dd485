"""Key bounds of a table: the proof that a key is new.

A row whose key column value lies outside ``[min, max]`` of that column over every live data file
cannot match an existing row, so its equality delete is only needed if another writer adds the key
before the checkpoint commits: writers put such deletes in conditional delete files. Bounds come from the data
files' column metrics in the manifests (truncated string bounds are still conservative: lower bounds
are prefixes, upper bounds are rounded up, and a missing bound means "unbounded"). Manifests never
change, so bounds are cached per manifest and a checkpoint reads only manifests it has not seen.

The proof holds for the snapshot it was computed on. The committer re-checks at commit time that no
snapshot added data files since (:func:`data_added_since`); if one did, it commits the conditional
deletes with the checkpoint, otherwise it drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import PrimitiveType

from iceberg_sink._iceberg.avro_read import fetch_entries

_UNBOUNDED = object()


@attrs.frozen
class KeyBounds:
    """Serialized [lower, upper] per key field id over all live data files of ``snapshot_id``.

    ``empty`` means the snapshot has no data rows at all (every key is new). A field whose bounds are
    None cannot prove anything.
    """

    snapshot_id: int
    empty: bool
    fields: tuple[tuple[int, bytes | None, bytes | None], ...]


class KeyBoundsCache:
    """Per-manifest key bounds, reused across checkpoints of one job and across the jobs of one sink
    (each bounded ``write()`` is a job of its own: without the cache it read every data manifest of
    the table again). Manifests are immutable, so a path's bounds never change; they are kept per
    key (``key_field_ids``, or the ids given to :meth:`bounds`), and only for manifests the last
    snapshot asked about listed, so the cache holds at most the table's live data manifests."""

    def __init__(self, key_field_ids: Sequence[int] = ()) -> None:
        self._ids = tuple(key_field_ids)
        self._by_manifest: dict[str, dict[int, tuple[Any, Any]] | None] = {}

    def _manifest_bounds(self, table: Table, manifest: Any) -> dict[int, tuple[Any, Any]] | None:
        """(lower, upper) per field as (value, serialized); None for a manifest without rows."""
        schema = table.schema()
        result: dict[int, tuple[Any, Any]] = {}
        rows = 0
        for entry in fetch_entries(table.io, manifest, discard_deleted=True):
            file = entry.data_file
            rows += file.record_count
            for field_id in self._ids:
                lower = (file.lower_bounds or {}).get(field_id)
                upper = (file.upper_bounds or {}).get(field_id)
                current = result.get(field_id)
                if lower is None or upper is None or current == (_UNBOUNDED, _UNBOUNDED):
                    result[field_id] = (_UNBOUNDED, _UNBOUNDED)
                    continue
                field_type = schema.find_field(field_id).field_type
                assert isinstance(field_type, PrimitiveType)
                lo, hi = from_bytes(field_type, lower), from_bytes(field_type, upper)
                if current is None:
                    result[field_id] = ((lo, lower), (hi, upper))
                else:
                    (clo, clow), (chi, chigh) = current
                    result[field_id] = (min((clo, clow), (lo, lower)), max((chi, chigh), (hi, upper)))
        return result if rows else None

    def bounds(self, table: Table, snapshot: Snapshot | None, key_field_ids: Sequence[int] | None = None) -> KeyBounds:
        """The key bounds over ``snapshot``'s live data files, for ``key_field_ids`` (default: the
        ids the cache was made with)."""
        if key_field_ids is not None and tuple(key_field_ids) != self._ids:  # another key: other columns
            self._ids, self._by_manifest = tuple(key_field_ids), {}
        if snapshot is None:
            return KeyBounds(snapshot_id=-1, empty=True, fields=())
        try:
            return self._bounds(table, snapshot)
        except FileNotFoundError:
            # A manifest list or manifest of the snapshot as loaded is gone: another writer moved the
            # head and a snapshot expiry deleted the old head's metadata. No proof then: every key of
            # the checkpoint gets its equality delete (always right; the proof only saves deletes).
            self._by_manifest = {}
            return KeyBounds(
                snapshot_id=snapshot.snapshot_id, empty=False, fields=tuple((f, None, None) for f in self._ids)
            )

    def _bounds(self, table: Table, snapshot: Snapshot) -> KeyBounds:
        merged: dict[int, Any] = {}
        any_rows = False
        live: dict[str, dict[int, tuple[Any, Any]] | None] = {}
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA:
                continue
            path = manifest.manifest_path
            if path not in live:
                live[path] = (
                    self._by_manifest[path] if path in self._by_manifest else self._manifest_bounds(table, manifest)
                )
            bounds = live[path]
            if bounds is None:
                continue
            any_rows = True
            for field_id, value in bounds.items():
                current = merged.get(field_id)
                if value == (_UNBOUNDED, _UNBOUNDED) or current == (_UNBOUNDED, _UNBOUNDED):
                    merged[field_id] = (_UNBOUNDED, _UNBOUNDED)
                elif current is None:
                    merged[field_id] = value
                else:
                    merged[field_id] = (min(current[0], value[0]), max(current[1], value[1]))
        self._by_manifest = live
        fields = tuple(
            (f, None, None) if merged.get(f, (_UNBOUNDED,))[0] is _UNBOUNDED else (f, merged[f][0][1], merged[f][1][1])
            for f in self._ids
        )
        return KeyBounds(snapshot_id=snapshot.snapshot_id, empty=not any_rows, fields=fields)


def data_added_since(table: Table, head: Snapshot | None, proof_snapshot_id: int) -> bool:
    """Whether any snapshot after ``proof_snapshot_id`` (up to ``head``) may have added rows.

    Compactions (``replace``) only move existing rows. A chain that does not reach the proof snapshot
    (expired meanwhile) counts as changed; so does, for a proof made on an empty branch
    (``proof_snapshot_id`` -1), a chain ending in a parent-less snapshot that is not the table's
    first: an expiry cut its parents, which may have added rows.
    """
    snapshot = head
    while snapshot is not None and snapshot.snapshot_id != proof_snapshot_id:
        summary = snapshot.summary
        adds_rows = summary is None or int(summary.get("added-data-files") or "0") > 0
        if adds_rows and (summary is None or summary.operation.value != "replace"):
            return True
        if snapshot.parent_snapshot_id is None:
            # The end of the chain: the branch's first snapshot only if it is the table's very first
            # (sequence number 1); any other parent-less snapshot had ancestors that an expiry cut
            # away, and they may have added rows after a proof made on an empty branch.
            return proof_snapshot_id != -1 or not _first_of_table(snapshot)
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
        if snapshot is None:
            return True
    return False


def _first_of_table(snapshot: Snapshot) -> bool:
    """Whether ``snapshot`` is the first the table ever committed (format v2+: sequence number 1).
    Unknown (v1: no sequence numbers) counts as not: the conservative answer."""
    return snapshot.sequence_number == 1
