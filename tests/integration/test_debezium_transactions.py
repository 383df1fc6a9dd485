"""``.debezium(transactions="consistent")``: every committed state is a transaction-consistent cut.

A randomized check (seeded): a shop's source database runs transactions over customers, orders and
order lines (an order with its lines and the customer's balance, a line's amount changed with its
order's total and the balance, an order deleted with its lines). Their Debezium events (with
``provide.transaction.metadata``: a ``transaction`` block per change event, ``BEGIN``/``END`` on the
transaction topic) reach the sink as Kafka delivers them: each topic in its own order, each
micro-batch ending anywhere in each topic, so a transaction's events are split over micro-batches
and a later transaction's can arrive before an earlier one's. After every micro-batch the tables
(read as a reader of the catalog would, every table at once) must equal the source after some
prefix of its transactions, never going back; at the end, the source. Without ``"consistent"`` the
same deliveries give states that are no such prefix (the check can fail). Kills at the carry's
steps, bounds, a bounded write without a checkpoint location, and readers other than ours (Iceberg
Java, DuckDB) on the final tables.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, _faults
from iceberg_sink.sources import kafka_offsets, transactions
from iceberg_sink.sources.kafka_offsets import parse_summary
from iceberg_sink.sources.transactions import Txn, decide
from tests.cdc_transactions import SCHEMA, TABLES, TX_TOPIC, Source, State, expected, rows_of, transaction_of
from tests.interop.readers import JavaIcebergReader, duckdb_read

pytestmark = pytest.mark.interop


# -- The sink and reading it back


def sink_for(catalog_props: dict[str, str], transactions: str = "consistent", **write_options: Any) -> IcebergSink:
    builder = (
        IcebergSink.builder()
        .catalog("default", **catalog_props)
        .route(table_column="source_table", namespace="shop")
        .debezium(value_column="value", transactions=transactions)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .create_if_missing()
    )
    for key, value in write_options.items():
        builder = builder.write_option(key, value)
    return builder.build()


def pointers(catalog_props: dict[str, str]) -> dict[str, str]:
    """Every table's metadata location in one query of the catalog: a consistent cut."""
    path = catalog_props["uri"].removeprefix("sqlite:///")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT table_name, metadata_location FROM iceberg_tables WHERE table_namespace = 'shop'"
        ).fetchall()
    return {name: location for name, location in rows}


def read_cut(catalog_props: dict[str, str]) -> State:
    from tests.interop.readers import pyiceberg_read

    state: State = {t: {} for t in TABLES}
    for table, location in pointers(catalog_props).items():
        state[table] = rows_of(table, pyiceberg_read(location).to_pylist())
    return state


def prefix_of(source: Source, state: State) -> int | None:
    """A number of source transactions ``state`` is the result of (two prefixes can end in equal
    states: an order placed, then cancelled), or None: no prefix."""
    return next((n for n, candidate in enumerate(source.states) if expected(candidate) == state), None)


def frame(spark: SparkSession, rows: list[tuple[str, str, str, int, int]]) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA)


def landed(source: Source, catalog_props: dict[str, str]) -> tuple[int, int | None]:
    """(the source transactions a transaction-consistent sink holds after the deliveries so far, the
    prefix of them the tables equal: that one when they equal it, else any, else None)."""
    want, state = source.complete_prefix(), read_cut(catalog_props)
    return want, want if expected(source.states[want]) == state else prefix_of(source, state)


def run_deliveries(
    spark: SparkSession, sink: IcebergSink, location: str, catalog_props: dict[str, str], source: Source, batches: int
) -> list[tuple[int, int | None]]:
    seen = []
    for rows in source.deliveries(batches):
        sink.write(frame(spark, rows), checkpoint_location=location)
        seen.append(landed(source, catalog_props))
    return seen


# -- The randomized check


@pytest.mark.parametrize("seed", [1, 2])
def test_every_committed_state_is_the_complete_prefix_of_the_source_transactions(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path, seed: int
) -> None:
    """After each micro-batch the tables hold exactly the transactions whose events and END have all
    arrived, up to the first that has not: never part of one, never one after a gap."""
    source = Source.run(seed, 30)
    sink = sink_for(catalog_props)
    seen = run_deliveries(spark, sink, str(tmp_path / "ck"), catalog_props, source, batches=6)
    assert all(want == got for want, got in seen), f"(complete prefix, the tables' prefix) per batch: {seen}"
    assert 0 < seen[0][0] < seen[-1][0] == len(source.states) - 1, seen


def test_a_stream_restarted_every_micro_batch_commits_the_complete_prefix(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    """The same through ``start()``: each delivery a new file of a file stream, each run of the query
    (``availableNow``) a restart on the same checkpoint location; the carry crosses the restarts."""
    source = Source.run(4, 20)
    incoming = tmp_path / "in"
    incoming.mkdir()
    names = ("key", "value", "topic", "partition", "offset")
    seen = []
    for n, rows in enumerate(source.deliveries(4)):
        lines = [json.dumps(dict(zip(names, row, strict=True))) for row in rows]
        (incoming / f"{n:03d}.json").write_text("\n".join(lines) + "\n")
        stream = spark.readStream.schema(SCHEMA).json(str(incoming))
        query = sink_for(catalog_props).start(stream, str(tmp_path / "ck"), trigger={"availableNow": True})
        query.awaitTermination()
        seen.append(landed(source, catalog_props))
    assert all(want == got for want, got in seen), seen
    assert seen[0][0] > 0 and seen[-1][0] == len(source.states) - 1, seen


def test_events_a_restarted_connector_sends_again_land_once_and_hold_nothing_back(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    """Kafka Connect re-sends what came after its last flushed offset: the re-sent transactions are
    complete again (an event counted once however often it arrives) and land again, whole; once
    everything arrived the tables equal the source and no event is held."""
    source = Source.run(9, 20)
    sink = sink_for(catalog_props)
    location = tmp_path / "ck"
    sink.write(frame(spark, source.deliver(0.5)), checkpoint_location=str(location))
    source.resend(first=5)
    for _ in range(3):
        source.transaction()
    for share in (0.5, 1.0):
        sink.write(frame(spark, source.deliver(share)), checkpoint_location=str(location))
    assert read_cut(catalog_props) == expected(source.states[-1])
    newest = max(int(f.stem) for f in (location / "iceberg_sink" / "carry").glob("*.json"))
    assert json.loads((location / "iceberg_sink" / "carry" / f"{newest}.json").read_text())["held"] == []


def test_without_consistent_the_same_deliveries_show_partial_transactions(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    """The check above can fail: without "consistent" a micro-batch commits what arrived, so the
    tables show parts of source transactions (states that are no prefix of them)."""
    source = Source.run(1, 30)
    sink = sink_for(catalog_props, transactions="ignore")
    seen = run_deliveries(spark, sink, str(tmp_path / "ck"), catalog_props, source, batches=6)
    assert any(got is None for _, got in seen), f"every state was a transaction prefix: {seen}"
    assert seen[-1] == (len(source.states) - 1,) * 2  # the end is the same: only the states between differ


# -- The decision's rules


def txn(id: str, position: int | None, expected: int | None, seen: int, since: int = 5, rows: int | None = None) -> Txn:
    return Txn(
        id=id, position=position, expected=expected, seen=seen, rows=rows if rows is not None else seen, since=since
    )


def test_decide_holds_everything_after_the_first_incomplete_transaction() -> None:
    txns = [
        txn("a", 1, 2, 2),
        txn("b", 3, None, 1),  # no END yet
        txn("c", 5, 1, 1),  # complete, but after b
        txn("z", None, None, 1),  # events only: its BEGIN is behind every placed one
    ]
    decision = decide(txns, 5, (), max_events=1000, max_batches=10)
    assert decision.held == ("b", "c", "z") and decision.forced == ()
    assert decision.held_rows == 3
    # duplicates count once: seen is distinct total_order values
    assert decide([txn("a", 1, 3, 2, rows=4)], 5, (), 1000, 10).held == ("a",)


def test_decide_lets_the_oldest_through_past_its_bounds() -> None:
    txns = [txn("a", 1, 5, 2, since=1), txn("b", 3, 1, 1, since=5)]
    by_age = decide(txns, 5, (), max_events=1000, max_batches=4)
    assert by_age.forced == ("a",) and by_age.held == () and by_age.released == ("a",)
    young = decide(txns, 4, (), max_events=1000, max_batches=4)
    assert young.held == ("a", "b") and young.forced == ()
    by_size = decide(txns, 5, (), max_events=2, max_batches=100)
    assert by_size.forced == ("a",)
    # a released transaction's late events pass
    assert decide([txn("a", None, None, 1)], 6, ("a",), 1000, 10).held == ()


def test_a_transaction_is_named_by_what_all_its_events_share(spark: SparkSession) -> None:
    """PostgreSQL's ids carry each event's LSN (``728:26386936`` BEGIN, ``728:26387232`` a change,
    ``728:26387800`` END: Debezium 3.6.1): the xid names the transaction. Other connectors' ids are the
    same for every event of a transaction and stay whole, colons and all."""
    ids = {
        "728:26386936": "728",
        "728:26387800": "728",
        "3E11FA47-71CA-11E1-9E33-C80AA9429562:23": "3E11FA47-71CA-11E1-9E33-C80AA9429562:23",
        "mysql-bin.000003:1234": "mysql-bin.000003:1234",
        "0-1-23": "0-1-23",
        "00000025:00000d08:0025": "00000025:00000d08:0025",
        "0a001b00c1d20000": "0a001b00c1d20000",
    }
    got = spark.createDataFrame([(i,) for i in ids], "id string").select(
        "id", transactions.transaction_key(F.col("id"))
    )
    assert {r[0]: r[1] for r in got.collect()} == ids


# -- Kills, replays, bounds, refusals


def test_a_crash_at_each_step_of_the_carry_neither_loses_nor_doubles_an_event(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    """A crash at each step of the carry in turn, one per checkpoint (its held rows written, their
    record made durable, the commit done), each checkpoint replayed by a new sink with the same input."""
    source = Source.run(7, 25)
    sink = sink_for(catalog_props)
    location = str(tmp_path / "ck")
    seen = []

    class Crash(Exception):
        pass

    points = {1: _faults.CARRY_ROWS_WRITTEN, 2: _faults.CARRY_RECORDED, 3: _faults.AFTER_COMMIT}
    crashed: list[tuple[str, int]] = []

    def crash(at: str, checkpoint_id: int) -> None:
        if points.get(checkpoint_id) == at and (at, checkpoint_id) not in crashed:
            crashed.append((at, checkpoint_id))
            raise Crash(at)

    _faults.install(crash)
    try:
        for n, rows in enumerate(source.deliveries(5)):
            try:
                sink.write(frame(spark, rows), checkpoint_location=location, checkpoint_id=n)
            except Crash:
                # The restart replays the checkpoint with the same input, as Spark replays a micro-batch.
                sink = sink_for(catalog_props)
                sink.write(frame(spark, rows), checkpoint_location=location, checkpoint_id=n)
            seen.append(landed(source, catalog_props))
    finally:
        _faults.clear()
    assert crashed == [(point, checkpoint) for checkpoint, point in points.items()]
    assert all(want == got for want, got in seen), seen
    assert seen[-1][0] == len(source.states) - 1


def test_a_transaction_past_the_bound_is_committed_in_parts_with_a_warning(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source.run(11, 3)
    # The END of the last transaction never arrives (a connector that lost it).
    source.events[TX_TOPIC].pop()
    sink = sink_for(catalog_props, **{"iceberg-sink.transactions.max-held-batches": 2})
    location = str(tmp_path / "ck")
    everything = [row for rows in source.deliveries(1) for row in rows]
    sink.write(frame(spark, everything), checkpoint_location=location)
    assert prefix_of(source, read_cut(catalog_props)) == 2
    sink.write(frame(spark, []), checkpoint_location=location)  # held for a second micro-batch
    assert prefix_of(source, read_cut(catalog_props)) == 2
    with caplog.at_level("WARNING", logger="iceberg_sink"):
        sink.write(frame(spark, []), checkpoint_location=location)
    assert prefix_of(source, read_cut(catalog_props)) == 3
    assert "let through incomplete" in caplog.text and "micro-batches): 3." in caplog.text


def test_a_bounded_write_without_a_checkpoint_location_refuses_an_incomplete_transaction(
    spark: SparkSession, catalog_props: dict[str, str]
) -> None:
    source = Source.run(5, 4)
    sink = sink_for(catalog_props)
    whole = [row for rows in source.deliveries(1) for row in rows]
    cut = [row for row in whole if not (row[2] == TX_TOPIC and row[4] == len(source.events[TX_TOPIC]) - 1)]
    with pytest.raises(InvalidInputError, match=r"incomplete source transaction.*checkpoint_location"):
        sink.write(frame(spark, cut))
    assert pointers(catalog_props) == {}  # nothing created, nothing committed
    sink.write(frame(spark, whole))  # whole transactions need no carry
    assert prefix_of(source, read_cut(catalog_props)) == 4


def test_consistent_needs_the_kafka_coordinates_and_one_transaction_partition(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    source = Source.run(3, 1)
    rows = [row for rows in source.deliveries(1) for row in rows]
    sink = sink_for(catalog_props)
    bare = frame(spark, rows).select("key", "value")
    with pytest.raises(InvalidInputError, match=r"'topic', 'partition' and 'offset'.*lacks"):
        sink.write(bare, checkpoint_location=str(tmp_path / "a"))
    split = [(k, v, t, 1 if t == TX_TOPIC and o == 1 else p, o) for k, v, t, p, o in rows]
    with pytest.raises(InvalidInputError, match="one Kafka partition"):
        sink.write(frame(spark, split), checkpoint_location=str(tmp_path / "b"))
    with pytest.raises(InvalidSinkConfigError, match=r"transactions=\.\.\.\): expected one of"):
        IcebergSink.builder().debezium(transactions="whole")


def test_the_carry_names_the_first_held_offset_of_each_partition_and_snapshots_stop_there(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path
) -> None:
    """A stream's snapshot names, per Kafka partition, an offset before which every event is in the
    tables (sources/kafka_offsets.py): a partition with a held event stops at that event."""
    source = Source.run(13, 6)
    last = source.events[TX_TOPIC].pop()  # the last transaction's END comes late
    location = tmp_path / "ck"
    rows = [row for rows in source.deliveries(1) for row in rows]
    sink_for(catalog_props).write(frame(spark, rows), checkpoint_location=str(location), checkpoint_id=0)
    assert prefix_of(source, read_cut(catalog_props)) == 5
    record = (location / "iceberg_sink" / "carry" / "0.json").read_bytes()
    held = transactions.held_offsets(record)
    first = {
        topic: min(o for o, e in enumerate(events) if transaction_of(e) == transaction_of(last))
        for topic, events in source.events.items()
        if any(transaction_of(e) == transaction_of(last) for e in events)
    }
    assert {t: dict(p) for t, p in held.items()} == {t: {0: o} for t, o in first.items()}
    log = b'v1\n{"batchWatermarkMs":0}\n' + json.dumps({t: {"0": 99} for t in source.events}).encode()
    named = parse_summary(kafka_offsets.summary_properties(log, held))
    assert named == {t: {0: first.get(t, 99)} for t in source.events}


def test_java_and_duckdb_read_the_consistent_tables_equal_the_source(
    spark: SparkSession, catalog_props: dict[str, str], tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    source = Source.run(21, 30)
    sink = sink_for(catalog_props)
    seen = run_deliveries(spark, sink, str(tmp_path / "ck"), catalog_props, source, batches=4)
    assert all(want == got for want, got in seen) and seen[-1][0] == len(source.states) - 1, seen
    want = expected(source.states[-1])
    for table, location in pointers(catalog_props).items():
        for read in (java_reader.read(location), duckdb_read(location)):
            assert rows_of(table, read.to_pylist()) == want[table], table
