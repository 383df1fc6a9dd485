"""RoutedOutcome: each table's CommitOutcome by name, and the CommitOutcome questions answered for
the checkpoint as a whole (the integration test tests/integration/test_routing_outcome.py writes)."""

from __future__ import annotations

from pyiceberg.table.snapshots import Snapshot

from iceberg_sink import CommitOutcome, RoutedOutcome


def snap(n: int) -> Snapshot:
    return Snapshot(snapshot_id=n, timestamp_ms=n, manifest_list=f"snap-{n}.avro")


def test_tables_in_name_order_and_the_aggregate_answers() -> None:
    new = CommitOutcome(4, snap(1), already_committed=False, attempts=2)
    replayed = CommitOutcome(4, None, already_committed=True, attempts=0)
    deferred = CommitOutcome(4, None, already_committed=False, attempts=0, pending=True)
    outcome = RoutedOutcome.of(4, {"db.c": deferred, "db.a": new, "db.b": replayed, "db.d": None})
    assert list(outcome) == ["db.a", "db.b", "db.c", "db.d"] and outcome["db.c"] is deferred
    assert len(outcome) == 4 and "db.d" in outcome and outcome.get("db.x") is None
    assert outcome.checkpoint_id == 4 and outcome.attempts == 2
    assert outcome.snapshot == snap(1) and outcome.snapshots == {"db.a": snap(1)}  # the only new one
    assert outcome.pending and outcome.pending_tables == ["db.c"]
    assert not outcome.already_committed  # db.a was written now
    assert isinstance(outcome, CommitOutcome)


def test_several_snapshots_have_no_single_one_and_a_replay_is_already_committed() -> None:
    two = RoutedOutcome.of(
        0,
        {
            "db.a": CommitOutcome(0, snap(1), already_committed=False, attempts=1),
            "db.b": CommitOutcome(0, snap(2), already_committed=False, attempts=1),
        },
    )
    assert two.snapshot is None and set(two.snapshots) == {"db.a", "db.b"} and not two.pending
    replay = RoutedOutcome.of(
        0, {t: CommitOutcome(0, None, already_committed=True, attempts=0) for t in ("x.a", "x.b")}
    )
    assert replay.already_committed and replay.snapshot is None and replay.snapshots == {}
    assert not RoutedOutcome.of(0, {"x.a": None}).already_committed  # no table committed anything
