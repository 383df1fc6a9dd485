"""Named points in the checkpoint flow where tests inject failures (a SIGKILL of the driver).

Production code only calls :func:`hit`; with no handler installed it does nothing. In the order a
checkpoint passes them:

- :data:`BATCH_START`: a micro-batch reached the sink (Spark recorded every earlier batch).
- :data:`CARRY_ROWS_WRITTEN`: with ``.debezium(transactions="consistent")``, the events this
  checkpoint holds back are written (sources/transactions.py), their record not yet.
- :data:`CARRY_RECORDED`: the carry record is written (what the checkpoint holds is decided for good).
- :data:`AFTER_SCHEMA_CHANGE`: schema evolution (table/evolution.py) committed a schema change this
  batch needs; nothing of the batch is written yet (hit only when the schema changed).
- :data:`BEFORE_WRITE`: the table is checked and older committables are committed; writer tasks start
  next (tests kill the driver while those tasks run by watching the table's data folder from here).
- :data:`AFTER_WRITE`: writer tasks finished, nothing staged yet.
- :data:`AFTER_STAGE`: DeltaManifests staged in the table's metadata folder, committable not persisted.
- :data:`AFTER_MANIFESTS`: committable persisted under the checkpoint location, no commit sent.
- :data:`BEFORE_COMMIT_PREPARE`: a commit attempt loaded the table and is about to prepare its
  snapshot on it (each attempt; tests stall one committer here while another commits).
- :data:`BEFORE_COMMIT_SEND`: a prepared snapshot is about to be sent to the catalog (each attempt).
- :data:`BETWEEN_TABLE_SWAPS`: an atomic commit of several tables (job/together.py) has swapped the
  first table's metadata location inside its database transaction and not the others' yet (hit
  once per transaction; the checkpoint id passed is -1).
- :data:`TRANSACTION_COMMITTED`: that transaction committed (every table swapped); no table's commit
  has seen the answer yet (checkpoint id -1; a handler raising a connection error here is an answer
  lost after the commit landed).
- :data:`COMMIT_SENT`: the catalog applied the commit; the driver has not looked at the result yet.
- :data:`AFTER_COMMIT`: snapshot committed and staged manifests removed; committable not yet removed,
  Spark not told.

The three commit-attempt points are hit from ``_iceberg/retry.py`` for checkpoint commits only.

- :data:`BEFORE_LOOKUP`: a batch with unchanged TOASTed columns is about to read stored values from
  the table as its checkpoint loaded it (topology/toast.py; tests let another writer replace and
  expire that table's files here).

The partitioned key index (keyindex/partitioned.py), inside a v3 commit or a v2 conversion, with
checkpoint id -1 (the index knows no checkpoint):

- :data:`INDEX_RUNS_WRITTEN`: a lookup wrote new runs (catch-up, merges) that no stored manifest
  names yet.
- :data:`INDEX_MANIFEST_WRITTEN`: the new manifest is written; the ``current`` pointer still names
  the one before.

Post-commit maintenance (topology/background.py) has one more, outside the checkpoint flow:

- :data:`MAINTENANCE_START`: a compaction or equality-delete conversion holds its table's
  maintenance lock and is about to run (on its own thread when in the background); the checkpoint
  id passed is -1.
- :data:`MAINTENANCE_COMMIT_SENT`: the catalog applied a commit that holds no checkpoint (compaction,
  conversion, manifest rewrite); hit inside the commit's error handling, so a handler raising a
  connection error there is an answer lost after the commit landed (checkpoint id -1).
"""

from __future__ import annotations

from collections.abc import Callable

BATCH_START = "batch-start"
CARRY_ROWS_WRITTEN = "carry-rows-written"
CARRY_RECORDED = "carry-recorded"
AFTER_SCHEMA_CHANGE = "after-schema-change"
BEFORE_WRITE = "before-write"
AFTER_WRITE = "after-write"
AFTER_STAGE = "after-stage"
AFTER_MANIFESTS = "after-manifests"
BEFORE_COMMIT_PREPARE = "before-commit-prepare"
BEFORE_COMMIT_SEND = "before-commit-send"
BETWEEN_TABLE_SWAPS = "between-table-swaps"
TRANSACTION_COMMITTED = "transaction-committed"
COMMIT_SENT = "commit-sent"
AFTER_COMMIT = "after-commit"
BEFORE_LOOKUP = "before-lookup"
INDEX_RUNS_WRITTEN = "index-runs-written"
INDEX_MANIFEST_WRITTEN = "index-manifest-written"
MAINTENANCE_START = "maintenance-start"
MAINTENANCE_COMMIT_SENT = "maintenance-commit-sent"

_handlers: list[Callable[[str, int], None]] = []


def install(handler: Callable[[str, int], None]) -> None:
    _handlers.append(handler)


def clear() -> None:
    _handlers.clear()


def hit(point: str, checkpoint_id: int) -> None:
    for handler in list(_handlers):
        handler(point, checkpoint_id)
