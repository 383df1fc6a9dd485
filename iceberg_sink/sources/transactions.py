"""Transaction-consistent CDC: only whole source transactions reach a checkpoint, in commit order.

With Debezium's ``provide.transaction.metadata=true`` every change event carries ``transaction:
{id, total_order, data_collection_order}``, and the connector writes a ``BEGIN`` and an ``END`` event
per transaction to its transaction topic (``<topic.prefix>.transaction``); an ``END`` carries the
transaction's ``event_count``. ``.debezium(..., transactions="consistent")`` runs :func:`consistent_cut`
on each micro-batch before reading its envelopes:

1. **Input**: the micro-batch's events plus the events the previous micro-batch held back (its
   *carry*, read from the checkpoint location).
2. **Order**: a transaction's place is the offset of its first boundary event in the transaction
   topic (one partition: Debezium writes it in commit order). A transaction whose events arrived but
   none of whose boundary events did comes after every placed one (its ``BEGIN`` is behind theirs).
   A transaction is named by its id (:func:`transaction_key`: PostgreSQL's ``<xid>:<lsn>`` carries
   each event's own LSN, so its xid alone).
3. **Complete prefix**: a transaction is complete when its ``END`` was read and the distinct
   ``total_order`` values of its events read so far reach the ``END``'s ``event_count`` (duplicates
   from a restarted connector count once). The longest prefix of complete transactions goes on to
   the sink; every later transaction is held back, even a complete one, because Kafka's partitions
   can deliver a later transaction's events before an earlier one's, and committing the later one
   first would apply an older change of a key after a newer one. Events without a transaction block
   (snapshot reads, heartbeats, schema changes) pass.
4. **Durable carry**: the held events (as received: every column, their Kafka coordinates) are
   written to ``<checkpoint>/iceberg_sink/carry/<N>/`` (Parquet, by Spark) and then
   ``<checkpoint>/iceberg_sink/carry/<N>.json`` names the held transactions: the JSON is the commit
   point, written before any committable of checkpoint N. Carry N is a function of batch N and carry
   N-1; a replay of checkpoint N (Spark runs the same offsets again after a crash) finds
   ``<N>.json`` and holds exactly what the first run held, so a kill at any point neither loses nor
   doubles an event. The held events of carries older than the one a micro-batch reads are removed
   by it (their records a hundred checkpoints later). A checkpoint's snapshot names, for each Kafka
   partition, the offset of the first event it held back where it held one (sources/kafka_offsets.py).
5. **Bounded**: when the held events exceed ``iceberg-sink.transactions.max-held-events``, or the
   first held transaction has waited ``iceberg-sink.transactions.max-held-batches`` micro-batches (a
   huge bulk load, a lost ``END``, a table of the connector not subscribed), that transaction is let
   through as far as it arrived, with a warning: it is then committed in parts, and its later events
   pass as they come (its id is remembered, the last 10,000 of them).

A bounded ``write()`` without a checkpoint location has nowhere to carry to: a write holding an
incomplete transaction is refused, naming it, before anything is written.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator, Mapping, Sequence

import attrs
import pyarrow.fs as pafs
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from iceberg_sink import _faults
from iceberg_sink._spark_schema import columns_of, schema_of
from iceberg_sink.committer.store import CARRY_DIR, checkpoint_filesystem, read_if_present, write_atomically
from iceberg_sink.errors import InvalidInputError, InvalidSinkConfigError

logger = logging.getLogger("iceberg_sink")

#: ``.debezium(transactions=...)``: ``"ignore"`` (default: events as they come, a source transaction may
#: span checkpoints) or ``"consistent"`` (whole transactions per checkpoint, this module).
TRANSACTION_MODES = ("ignore", "consistent")

TXN = "__iceberg_sink_txn"
SINCE = "__iceberg_sink_txn_since"
_BOUNDARY = "__iceberg_sink_txn_boundary"
_ORDER = "__iceberg_sink_txn_order"
_COUNT = "__iceberg_sink_txn_count"
INTERNAL = (TXN, SINCE)

RELEASED_KEPT = 10_000
#: Carry records kept behind the newest (Spark keeps as many offset log entries: ``minBatchesToRetain``).
RECORDS_KEPT = 100


@attrs.frozen
class CarryPlace:
    """Where and for which checkpoint a micro-batch's held events are carried.

    Attributes:
        location: the checkpoint location (Spark's path spelling).
        checkpoint_id: the checkpoint the micro-batch becomes.
        temporary: a bounded write's own temporary location: nothing can be carried from it.
        max_events: ``iceberg-sink.transactions.max-held-events``.
        max_batches: ``iceberg-sink.transactions.max-held-batches``.
    """

    location: str
    checkpoint_id: int
    temporary: bool
    max_events: int
    max_batches: int


_PLACE: contextvars.ContextVar[CarryPlace | None] = contextvars.ContextVar("iceberg_sink_carry_place", default=None)


@contextlib.contextmanager
def carrying(place: CarryPlace | None) -> Iterator[None]:
    """Run a micro-batch's ``map_batches`` functions knowing where its held events go (job/reading.py)."""
    token = _PLACE.set(place)
    try:
        yield
    finally:
        _PLACE.reset(token)


# -- The decision (pure Python: what a checkpoint passes and holds)


@attrs.frozen
class Txn:
    """One source transaction as far as a micro-batch (with its carry) has read it.

    Attributes:
        id: Debezium's transaction id.
        position: offset of its first boundary event read in the transaction topic; None: none read.
        expected: its ``END``'s ``event_count``; None: no ``END`` read.
        seen: distinct ``total_order`` values of its change events read.
        rows: its events read (boundary events and duplicates included).
        since: the first checkpoint that held one of them (the current one for events read now).
    """

    id: str
    position: int | None
    expected: int | None
    seen: int
    rows: int
    since: int

    @property
    def complete(self) -> bool:
        return self.expected is not None and self.seen >= self.expected


@attrs.frozen
class Decision:
    """What checkpoint N passes on: everything but ``held``; ``forced``: transactions let through
    incomplete now (bounds); ``released``: every id let through incomplete so far (kept, newest last)."""

    held: tuple[str, ...]
    forced: tuple[str, ...]
    released: tuple[str, ...]
    held_rows: int


def decide(
    txns: Sequence[Txn], checkpoint_id: int, released: Sequence[str], max_events: int, max_batches: int
) -> Decision:
    """The complete prefix of ``txns`` in commit order passes; the rest is held, as far as the bounds allow."""
    gone = set(released)
    placed = sorted((t for t in txns if t.position is not None and t.id not in gone), key=lambda t: (t.position, t.id))
    unplaced = sorted((t for t in txns if t.position is None and t.id not in gone), key=lambda t: (t.since, t.id))
    order = placed + unplaced
    forced: list[str] = []
    while True:
        first = next((i for i, t in enumerate(order) if not t.complete and t.id not in forced), len(order))
        held = order[first:]
        rows = sum(t.rows for t in held)
        if not held or (rows <= max_events and held[0].since > checkpoint_id - max_batches):
            break
        forced.append(held[0].id)
    kept = [r for r in released if r not in forced] + forced
    return Decision(
        held=tuple(t.id for t in held),
        forced=tuple(forced),
        released=tuple(kept[-RELEASED_KEPT:]),
        held_rows=rows,
    )


# -- The carry files


@attrs.frozen
class Carry:
    """One checkpoint's carry record (``carry/<N>.json``)."""

    checkpoint_id: int
    held: tuple[str, ...]
    held_rows: int
    released: tuple[str, ...]
    low_offsets: Mapping[str, Mapping[int, int]]  # topic -> partition -> smallest held offset

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "checkpoint_id": self.checkpoint_id,
                "held": list(self.held),
                "held_rows": self.held_rows,
                "released": list(self.released),
                "low_offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.low_offsets.items()},
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Carry:
        try:
            doc = json.loads(data)
            return cls(
                checkpoint_id=int(doc["checkpoint_id"]),
                held=tuple(str(t) for t in doc["held"]),
                held_rows=int(doc["held_rows"]),
                released=tuple(str(t) for t in doc["released"]),
                low_offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in doc["low_offsets"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidSinkConfigError(
                f"transaction carry {where}: expected the JSON record the sink writes, received {data[:200]!r} ({e})"
            ) from e


class CarryStore:
    """The carries of one checkpoint location: ``carry/<N>.json`` records and ``carry/<N>/`` Parquet."""

    def __init__(self, location: str) -> None:
        self._fs, root = checkpoint_filesystem(location)
        self._root = root.rstrip("/") + "/" + CARRY_DIR
        self._spark_root = location.rstrip("/") + "/" + CARRY_DIR

    def rows_path(self, checkpoint_id: int) -> str:
        """Where Spark keeps checkpoint ``checkpoint_id``'s held events (the location as Spark spells it)."""
        return f"{self._spark_root}/{checkpoint_id}"

    def listing(self) -> tuple[list[int], list[int]]:
        """The checkpoints with a carry record, and those with held events (folders), sorted: one listing."""
        records, rows = [], []
        for info in self._fs.get_file_info(pafs.FileSelector(self._root, allow_not_found=True)):
            name = info.base_name
            if info.type == pafs.FileType.File and name.endswith(".json") and name[:-5].isdigit():
                records.append(int(name[:-5]))
            elif info.type == pafs.FileType.Directory and name.isdigit():
                rows.append(int(name))
        return sorted(records), sorted(rows)

    def read(self, checkpoint_id: int) -> Carry | None:
        path = f"{self._root}/{checkpoint_id}.json"
        data = read_if_present(self._fs, path)
        return Carry.from_json(data, path) if data is not None else None

    def write(self, carry: Carry) -> None:
        """Record checkpoint N's carry (after its rows are written): the commit point of the carry."""
        self._fs.create_dir(self._root, recursive=True)
        write_atomically(self._fs, f"{self._root}/{carry.checkpoint_id}.json", carry.to_json())

    def remove_before(self, checkpoint_id: int, records: list[int], rows: list[int]) -> None:
        """Forget the held events of carries older than ``checkpoint_id`` (the one a micro-batch reads);
        their records (small) stay for :data:`RECORDS_KEPT` more checkpoints, for a commit left pending
        that names its Kafka offsets (sources/kafka_offsets.py). ``records``, ``rows``: :meth:`listing`."""
        for old in rows:
            if old < checkpoint_id:
                self._fs.delete_dir(f"{self._root}/{old}")
        for old in records:
            if old < checkpoint_id - RECORDS_KEPT:
                self._fs.delete_file(f"{self._root}/{old}.json")

    def next_id(self, proposed: int) -> int:
        """``proposed``, or one past the newest carry: a bounded write that held every event committed
        nothing, and the next write must not take its checkpoint id (and its carry) again."""
        records, _ = self.listing()
        return max(proposed, records[-1] + 1) if records else proposed


def held_offsets(record: bytes | None) -> Mapping[str, Mapping[int, int]]:
    """``{topic: {partition: smallest offset}}`` of the events a checkpoint held back, from its carry
    record (``CheckpointStore.carry_record``; None: no carry): sources/kafka_offsets.py records no
    partition past them."""
    return Carry.from_json(record, "record").low_offsets if record is not None else {}


# -- The micro-batch


def _field(value: Column, path: str) -> Column:
    """``path`` of a Debezium event's payload, with (``$.payload.<path>``) or without a schema part."""
    return F.coalesce(F.get_json_object(value, f"$.payload.{path}"), F.get_json_object(value, f"$.{path}"))


def transaction_key(transaction_id: Column) -> Column:
    """The key of a Debezium transaction id, the same for its BEGIN, END and change events.

    PostgreSQL's connector writes ``<xid>:<lsn>`` with the LSN of the event at hand (the BEGIN's, each
    change's, the commit's), so only the xid names the transaction; the other connectors' ids
    (MySQL's GTID ``<uuid>:<n>`` or ``<file>:<pos>``, MariaDB's ``<domain>-<server>-<n>``, SQL Server's
    LSN ``<hex>:<hex>:<hex>``, Oracle's hex) are the same for all of a transaction's events, and are
    taken whole: only an id of two decimal numbers is cut at its colon."""
    return F.when(transaction_id.rlike(r"^[0-9]+:[0-9]+$"), F.substring_index(transaction_id, ":", 1)).otherwise(
        transaction_id
    )


def _annotated(df: DataFrame, value_column: str) -> DataFrame:
    value = F.col(value_column).cast("string")
    boundary = (
        _field(value, "status").isin("BEGIN", "END") & _field(value, "id").isNotNull() & _field(value, "op").isNull()
    )
    return df.select(
        "*",
        transaction_key(F.coalesce(_field(value, "transaction.id"), F.when(boundary, _field(value, "id")))).alias(TXN),
        F.when(boundary, _field(value, "status")).alias(_BOUNDARY),
        _field(value, "transaction.total_order").cast("long").alias(_ORDER),
        F.when(boundary & (_field(value, "status") == "END"), _field(value, "event_count").cast("long")).alias(_COUNT),
    )


def _summary(annotated: DataFrame, checkpoint_id: int) -> tuple[list[Txn], list[tuple[str, int]], list[Row]]:
    """Every transaction of the input, the (topic, partition) pairs its boundary events came from,
    and each transaction's first offset per (topic, partition): one Spark job. An event lives in one
    topic and partition (a re-sent one too: same key), so distinct ``total_order`` values add up over
    them."""
    is_boundary = F.col(_BOUNDARY).isNotNull()
    parts = (
        annotated.where(F.col(TXN).isNotNull())
        .groupBy(TXN, "topic", "partition")
        .agg(
            F.min(F.when(is_boundary, F.col("offset"))).alias("position"),
            F.max(F.col(_COUNT)).alias("expected"),
            F.countDistinct(F.col(_ORDER)).alias("seen"),
            F.count(F.lit(1)).alias("rows"),
            F.min(F.coalesce(F.col(SINCE), F.lit(checkpoint_id))).alias("since"),
            F.min("offset").alias("low"),
        )
        .collect()
    )
    by_txn: dict[str, list[Row]] = {}
    for r in parts:
        by_txn.setdefault(r[TXN], []).append(r)
    txns = [
        Txn(
            id=key,
            position=min((r["position"] for r in rs if r["position"] is not None), default=None),
            expected=max((r["expected"] for r in rs if r["expected"] is not None), default=None),
            seen=sum(r["seen"] for r in rs),
            rows=sum(r["rows"] for r in rs),
            since=min(r["since"] for r in rs),
        )
        for key, rs in by_txn.items()
    ]
    sources = sorted({(r["topic"], r["partition"]) for r in parts if r["position"] is not None})
    return txns, sources, parts


def _needs(df: DataFrame, value_column: str) -> None:
    missing = [c for c in (value_column, "topic", "partition", "offset") if c not in columns_of(df)]
    if missing:
        raise InvalidInputError(
            f'debezium(transactions="consistent"): expected the Kafka source\'s columns {value_column!r}, '
            f"'topic', 'partition' and 'offset' (a transaction's place in commit order is its boundary "
            f"events' offset in the connector's transaction topic); the micro-batch lacks {missing}, "
            f"received columns {columns_of(df)}"
        )


def consistent_cut(batch: DataFrame, value_column: str) -> DataFrame:
    """``batch`` plus the events the previous checkpoint held, minus the events this checkpoint holds
    (written to its carry first): see the module docstring.

    Raises:
        InvalidSinkConfigError: called outside a sink's ``write()``/``start()``.
        InvalidInputError: the batch lacks the Kafka source's columns; the transaction topic has
            more than one partition; a bounded write without a checkpoint location holds a transaction.
    """
    place = _PLACE.get()
    if place is None:
        raise InvalidSinkConfigError(
            'debezium(transactions="consistent") carries incomplete transactions under a sink\'s checkpoint '
            "location: it runs inside IcebergSink.write()/start(), received a call outside them"
        )
    _needs(batch, value_column)
    n = place.checkpoint_id
    store = CarryStore(place.location)
    records, row_folders = store.listing()
    older = [i for i in records if i < n]
    previous = store.read(older[-1]) if older else None  # what this micro-batch adds to its input
    data = batch.withColumn(SINCE, F.lit(None).cast("long"))
    if previous is not None and previous.held:
        # With its schema (the batch's and SINCE): no job to infer it from the files.
        carried = batch.sparkSession.read.schema(schema_of(data)).parquet(store.rows_path(previous.checkpoint_id))
        data = data.unionByName(carried, allowMissingColumns=True)
    annotated = _annotated(data, value_column)
    done = store.read(n)
    if done is not None:  # a replay: hold what the first run held
        held, carry = done.held, done
    else:
        txns, sources, parts = _summary(annotated, n)
        if len(sources) > 1:
            raise InvalidInputError(
                'debezium(transactions="consistent"): expected the transaction boundary events of one '
                "connector from one Kafka partition (Debezium's transaction topic in commit order: create it "
                f"with one partition), received them from {[f'{t}[{p}]' for t, p in sources]}"
            )
        released = previous.released if previous is not None else ()
        decision = decide(txns, n, released, place.max_events, place.max_batches)
        held = decision.held
        if decision.forced:
            logger.warning(
                "checkpoint %d: %d source transaction(s) let through incomplete (more than %d events held, or "
                "held for %d micro-batches): %s. They are committed in parts. Expected causes: a transaction "
                "larger than the bound, a table of the connector the stream does not subscribe to, or a "
                "transaction topic the stream does not read",
                n,
                len(decision.forced),
                place.max_events,
                place.max_batches,
                ", ".join(decision.forced[:5]) + (" ..." if len(decision.forced) > 5 else ""),
            )
        if held and place.temporary:
            raise InvalidInputError(
                'debezium(transactions="consistent"): a bounded write() without checkpoint_location holds '
                f"{len(held)} incomplete source transaction(s) ({', '.join(held[:5])}) and has no later write to "
                "carry them into; expected whole transactions, or pass checkpoint_location so the next write() "
                "of the same location completes them"
            )
        low: dict[str, dict[int, int]] = {}
        if held:
            rows_of_held = annotated.where(F.col(TXN).isin(list(held)))
            rows_of_held.select(*columns_of(data)).withColumn(SINCE, F.coalesce(F.col(SINCE), F.lit(n))).write.mode(
                "overwrite"
            ).parquet(store.rows_path(n))
            holding = set(held)
            for r in parts:
                if r[TXN] in holding:
                    partitions, partition = low.setdefault(r["topic"], {}), int(r["partition"])
                    partitions[partition] = min(int(r["low"]), partitions.get(partition, int(r["low"])))
        _faults.hit(_faults.CARRY_ROWS_WRITTEN, n)
        carry = Carry(n, held, decision.held_rows, decision.released, low)
        store.write(carry)
        _faults.hit(_faults.CARRY_RECORDED, n)
    if previous is not None:
        store.remove_before(previous.checkpoint_id, records, row_folders)
    logger.debug("checkpoint %d: %d transaction(s) held (%d events)", n, len(carry.held), carry.held_rows)
    kept = annotated.where(F.col(TXN).isNull() | ~F.col(TXN).isin(list(held))) if held else annotated
    return kept.select(*columns_of(batch))
