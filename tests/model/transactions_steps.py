"""The model check's transaction-consistent CDC job (issue 44): whole source transactions only.

Kept out of harness.py (other engineers edit it): the harness calls :func:`maybe_step` between steps,
with a generator of its own (so every seed's sequence of the other operations is kept); skip it with
``ICEBERG_SINK_MODEL_SKIP=consistent_transactions``.

A shop database (tests/cdc_transactions.py: customers, orders, lines; orders placed, amended and
cancelled with their lines and the customer's balance) runs a few transactions per step, and their
Debezium events (transaction blocks, BEGIN/END on the transaction topic) reach a routed sink with
``.debezium(transactions="consistent")`` as Kafka delivers them: each topic at its own pace. Some
steps the driver dies at one of the carry's points or after the commit (an exception at the fault
point), and the micro-batch is replayed with the same input, as Spark replays it. After every step
the tables, one consistent cut of the catalog, must equal the source after exactly the transactions
whose events and END have all arrived, up to the first that has not; read by DuckDB every step and
by Iceberg Java every other step (on average).
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

from iceberg_sink import IcebergSink, _faults
from tests.cdc_transactions import SCHEMA, TABLES, Source, State, expected, rows_of
from tests.interop.readers import duckdb_read

TRANSACTIONS = "consistent_transactions"
EVERY = 0.15
NAMESPACE = "tx"
CRASH_POINTS = (_faults.CARRY_ROWS_WRITTEN, _faults.CARRY_RECORDED, _faults.AFTER_MANIFESTS, _faults.AFTER_COMMIT)


class _Crash(Exception):
    """The driver dying at a fault point."""


class TransactionsJob:
    """The job's source, deliveries and sink; one per World."""

    def __init__(self, seed: int, catalog_props: dict[str, str], root: Path, created_format: int) -> None:
        self.rng = random.Random(f"transactions-{seed}")
        self.source = Source(self.rng.randrange(2**32))
        self.catalog_props = catalog_props
        self.created_format = created_format
        self.checkpoint = str(root / "ckpt-transactions")
        self.next_checkpoint = 0

    def sink(self) -> IcebergSink:
        return (
            IcebergSink.builder()
            .catalog("model", **self.catalog_props)
            .route(table_column="source_table", namespace=NAMESPACE)
            .debezium(value_column="value", transactions="consistent")
            .cdc(op_column="op", key=["id"], order_by="lsn")
            .create_if_missing(format_version=self.created_format)
            .build()
        )

    def step(self, world: Any, crash: str | None = "draw") -> None:
        """One micro-batch (dying first at ``crash``, or at a point drawn 30% of the time); checks the
        tables against the source (raises world.fail(...) on a mismatch)."""
        rng = self.rng
        for _ in range(rng.randrange(0, 6)):
            self.source.transaction()
        rows = self.source.deliver(rng.choice([0.3, 0.6, 1.0]))
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        point = (rng.choice(CRASH_POINTS) if rng.random() < 0.3 else None) if crash == "draw" else crash
        world.log(
            f"{TRANSACTIONS}: checkpoint {checkpoint_id}, {len(rows)} events, "
            f"{len(self.source.states) - 1} source transactions, crash at {point}"
        )
        df = world.spark.createDataFrame(rows, SCHEMA).repartition(rng.choice([1, 2]))

        def crash(at: str, checkpoint: int) -> None:
            if at == point and checkpoint == checkpoint_id:
                raise _Crash(at)

        if point is not None:
            _faults.install(crash)
            try:
                self.sink().write(df, checkpoint_location=self.checkpoint, checkpoint_id=checkpoint_id)
            except _Crash:
                pass
            else:  # every micro-batch passes the carry's points; a commit's only when it lets events through
                if point in (_faults.CARRY_ROWS_WRITTEN, _faults.CARRY_RECORDED):
                    raise world.fail(f"{TRANSACTIONS}: no crash at {point} for checkpoint {checkpoint_id}")
            finally:
                _faults.clear()
        # The restart: the same micro-batch again (the first run, without a crash).
        self.sink().write(df, checkpoint_location=self.checkpoint, checkpoint_id=checkpoint_id)
        self.verify(world, java=rng.random() < 0.5)

    def pointers(self) -> dict[str, str]:
        """Every table's metadata location in one query of the catalog: a consistent cut."""
        path = self.catalog_props["uri"].removeprefix("sqlite:///")
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            found = db.execute(
                "SELECT table_name, metadata_location FROM iceberg_tables WHERE table_namespace = ?", [NAMESPACE]
            ).fetchall()
        return dict(found)

    def verify(self, world: Any, java: bool) -> None:
        want_n = self.source.complete_prefix()
        want = expected(self.source.states[want_n])
        cut = self.pointers()
        readers: list[tuple[str, Any]] = [("DuckDB", duckdb_read)]
        if java:
            readers.append(("Iceberg Java", world.java.read))
        for reader, read in readers:
            got: State = {t: {} for t in TABLES}
            for table, location in cut.items():
                got[table] = rows_of(table, read(location).to_pylist())
            if got != want:
                wrong = [t for t in TABLES if got[t] != want[t]]
                raise world.fail(
                    f"{TRANSACTIONS}: the tables read by {reader} are not the source after its first {want_n} "
                    f"transactions (the complete prefix); tables differing: {wrong}\n  got  "
                    f"{ {t: got[t] for t in wrong} }\n  want { {t: want[t] for t in wrong} }"
                )


def maybe_step(world: Any) -> None:
    """Called by the harness between steps: run the job with probability EVERY."""
    job = getattr(world, "_transactions_job", None)
    if job is None:
        job = TransactionsJob(world.seed, world.catalog_props, Path(world.root), world.created_format)
        world._transactions_job = job
    if job.rng.random() < EVERY:
        job.step(world)
