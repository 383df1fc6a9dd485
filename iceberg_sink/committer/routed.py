"""What one checkpoint of a routed sink did across its tables (:class:`RoutedOutcome`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs
from pyiceberg.table.snapshots import Snapshot

from iceberg_sink.committer.committer import CommitOutcome


@attrs.frozen
class RoutedOutcome(CommitOutcome, Mapping[str, CommitOutcome | None]):
    """What one checkpoint of a routed sink did (``write()`` of a ``.route(...)`` sink returns it).

    A mapping of each table the checkpoint touched (``namespace.name``) to its own
    :class:`CommitOutcome` (``outcome["cdc.orders"].snapshot``; None for a table that needed no
    commit), and a :class:`CommitOutcome` of the checkpoint as a whole, so code written for a
    single-table sink keeps working:

    Attributes:
        checkpoint_id: the checkpoint (the same in every table).
        snapshot: the new snapshot when exactly one table got one; None otherwise. With several
            tables each has its own snapshot: see :attr:`snapshots`.
        already_committed: True when every table already held the checkpoint (a replay).
        attempts: commit attempts over all tables.
        pending: True when some table's commit is deferred (the catalog was unreachable): see
            :attr:`pending_tables`.
        data_files / delete_files: the files the checkpoint's snapshots added, over all tables.
        outcomes: the mapping itself, as a plain dict.
    """

    outcomes: Mapping[str, CommitOutcome | None] = attrs.field(factory=dict, kw_only=True, hash=False)

    @classmethod
    def of(cls, checkpoint_id: int, outcomes: Mapping[str, CommitOutcome | None]) -> RoutedOutcome:
        """The aggregate of the tables' outcomes of one checkpoint (in table name order)."""
        ordered = {table: outcomes[table] for table in sorted(outcomes)}
        done = [o for o in ordered.values() if o is not None]
        snapshots = [o.snapshot for o in done if o.snapshot is not None]
        return cls(
            checkpoint_id,
            snapshots[0] if len(snapshots) == 1 else None,
            already_committed=bool(done) and all(o.already_committed for o in done),
            attempts=sum(o.attempts for o in done),
            data_files=tuple(f for o in done for f in o.data_files),
            pending=any(o.pending for o in done),
            delete_files=tuple(f for o in done for f in o.delete_files),
            atomic=all(o.atomic for o in done),
            outcomes=ordered,
        )

    @property
    def snapshots(self) -> dict[str, Snapshot]:
        """The new snapshot of each table that got one (a replayed or deferred table has none)."""
        return {t: o.snapshot for t, o in self.outcomes.items() if o is not None and o.snapshot is not None}

    @property
    def pending_tables(self) -> list[str]:
        """The tables whose commit of this checkpoint is deferred (kept under the checkpoint location)."""
        return [t for t, o in self.outcomes.items() if o is not None and o.pending]

    def __getitem__(self, table: str) -> CommitOutcome | None:
        return self.outcomes[table]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)
