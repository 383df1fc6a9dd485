"""The parts of a Debezium envelope and the event-level checks, as Columns built once and reused.

:func:`iceberg_sink.sources.debezium.read_envelope` splits each event into its payload, op, images,
schema part and order values, and checks the event as a whole (JSON, an op it knows, an image its op
needs). Those expressions depend on the reader's arguments only, never on a batch: built through
PySpark's Column calls they took about 1,800 Py4J round trips per micro-batch (0.2 ms and more each),
so :func:`envelope_columns` builds them once per Spark context and set of arguments (:func:`built`)
and every later batch reuses them.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink._spark_schema import built
from iceberg_sink._sql import column, named, parse
from iceberg_sink.errors import raised_from
from iceberg_sink.sources.event_order import order_expected, order_value
from iceberg_sink.sources.source_names import IDENTITY_FIELDS, identity_column, name_column
from iceberg_sink.vocab.columns import SOURCE_COLUMN, TRUNCATES_METADATA

logger = logging.getLogger("iceberg_sink")

# The reader's helper columns (dropped before the rows leave it).
PAYLOAD = "__iceberg_sink_payload"
KEY = "__iceberg_sink_message_key"
OP = "__iceberg_sink_dbz_op"
AFTER = "__iceberg_sink_dbz_after"
BEFORE = "__iceberg_sink_dbz_before"
IMAGE = "__iceberg_sink_dbz_image"
SCHEMA = "__iceberg_sink_dbz_schema"
ORDER = "__iceberg_sink_dbz_order"

KNOWN_OPS = ("c", "r", "u", "d", "t", "m")


def connector_event(schema: str, payload: str, op: str) -> str:
    """SQL text, true for an event Debezium's connectors send beside the change events, on topics a
    pattern subscription to the connector's prefix also reads (none has an op): a schema change (the
    prefix topic itself: ``ddl`` and ``tableChanges``), a transaction boundary
    (``provide.transaction.metadata``: ``status`` BEGIN or END and ``id``) or a heartbeat
    (``heartbeat.interval.ms``: ``ts_ms`` alone). Recognised by the schema part's name when the
    event has one, else by those fields. ``schema``, ``payload``, ``op``: the columns holding the
    event's schema part, its payload and its op."""
    name = f"get_json_object({column(schema)}, '$.name')"
    field = f"get_json_object({column(payload)}, '$.{{}}')"
    return (
        f"coalesce({column(op)} IS NULL AND ("
        f"{name} IN ('io.debezium.connector.common.Heartbeat', 'io.debezium.connector.common.TransactionMetadataValue')"
        f" OR endswith({name}, '.SchemaChangeValue')"
        f" OR ({field.format('ddl')} IS NOT NULL AND {field.format('tableChanges')} IS NOT NULL)"
        f" OR ({field.format('status')} IN ('BEGIN', 'END') AND {field.format('id')} IS NOT NULL)"
        f" OR to_json(json_object_keys({column(payload)})) = '[\"ts_ms\"]'"
        "), false)"
    )


def json_path(path: str) -> str:
    return "$." + path


@dataclass(frozen=True)
class EnvelopeColumns:
    """The expressions :func:`iceberg_sink.sources.debezium.read_envelope` applies to every batch, in
    its order: ``df.where(present).select(*first)``, then ``payload`` as :data:`PAYLOAD`, the ``parts``,
    ``df.where(kept)``, ``image`` as :data:`IMAGE`; ``stats`` (group, aggregates) count the batch."""

    present: Column  # a value that is not null or blank (a tombstone is null)
    first: list[Column]  # the carried columns, the value as text, the message key
    payload: Column
    parts: list[Column]  # op, after, before, schema part, raw order values
    kept: Column  # not a message, skipped truncate or connector event
    image: Column  # after, or before for a delete
    carried: list[Column]
    value: Column  # the value column (text now)
    extra: list[Column]  # op, order, source table, key names: the columns the reader adds
    helpers: list[Column]
    reason: Column  # why the event is refused, or null
    stats: tuple[list[Column], list[Column], Column] | None  # group, aggregates, an event no plan_on batch has
    added: list[str]


@dataclass(frozen=True)
class EnvelopeArgs:
    """The arguments of ``read_envelope`` the envelope's expressions depend on (and a cache key)."""

    value_column: str
    carried: tuple[str, ...]  # columns kept as they are (keep=, Kafka's)
    key_from: str | None
    paths: tuple[str, ...]  # order paths, each with its type
    types: tuple[str, ...]
    truncate: str
    op_column: str
    order_column: str
    table_column: str | None
    table_fields: tuple[str, ...] | None
    key_column: str
    need_schemas: bool  # the batch's schema parts are counted
    placeholder: str | None  # events holding it are counted


def envelope_columns(spark: SparkSession, args: EnvelopeArgs) -> EnvelopeColumns:
    """:class:`EnvelopeColumns` for ``args``, built once per Spark context (:func:`built`)."""
    return built(spark, ("envelope", args), lambda: _build(args))  # type: ignore[no-any-return]


def _build(args: EnvelopeArgs) -> EnvelopeColumns:
    value_column, key_from, paths, table_column = args.value_column, args.key_from, args.paths, args.table_column
    # Named columns of the input (value_column, key_from, keep=) are top-level names: named(), not F.col.
    value = named(value_column).cast("string")
    message_key = [named(key_from).cast("string").alias(KEY)] if key_from is not None else []
    kept_columns = [named(c) for c in args.carried]
    v = named(value_column)
    # With the schema part, the payload is under "payload"; without it the value is the payload.
    # Each piece is a column of its own, so the expressions below refer to it instead of repeating it.
    # The whole value is read twice, for its two parts, and nowhere else (a 160-column event is 28 KB,
    # 25 of them its schema part). json_tuple reads both parts in one parse, but its Generate node
    # cost a wide stream's first micro-batch 0.6-1.6 s on a cold JVM (docs/benchmarks-debezium-wide.md).
    payload = F.col(PAYLOAD)
    order_names = [f"{ORDER}{i}" for i in range(len(paths))]  # each order path's raw text
    parts = [
        F.get_json_object(payload, "$.op").alias(OP),
        F.get_json_object(payload, "$.after").alias(AFTER),
        F.get_json_object(payload, "$.before").alias(BEFORE),
        F.get_json_object(v, "$.schema").alias(SCHEMA),
        *[F.get_json_object(payload, json_path(p)).alias(n) for p, n in zip(paths, order_names, strict=True)],
    ]
    op, after, before = F.col(OP), F.col(AFTER), F.col(BEFORE)
    # Message events carry no row; a skipped truncate is dropped too (before any check of its row);
    # so are the connector's schema changes, transaction boundaries and heartbeats.
    dropped = ["m"] + (["t"] if args.truncate == "skip" else [])
    kept = (op.isNull() | ~op.isin(*dropped)) & ~parse(connector_event(SCHEMA, PAYLOAD, OP))
    # Under "apply" the op column says it holds truncates: the change reduction applies them.
    extra: list[Column] = [
        op.alias(args.op_column, metadata={TRUNCATES_METADATA: True} if args.truncate == "apply" else {})
    ]
    reasons: list[Column] = [
        # A value that is not JSON has no payload that is an object either: the whole value is parsed
        # again, to say which, only for an event refused either way.
        F.when(
            F.json_object_keys(payload).isNull(),
            F.when(F.get_json_object(v, "$").isNull(), F.lit("value is not JSON")).otherwise(
                F.lit("value is not a JSON object")
            ),
        ),
        F.when(op.isNull(), F.lit(f"event has no op; expected one of {', '.join(KNOWN_OPS)}")),
        F.when(
            ~op.isin(*KNOWN_OPS),
            F.concat(F.lit("unknown op '"), op, F.lit(f"'; expected one of {', '.join(KNOWN_OPS)}")),
        ),
    ]
    if args.truncate == "fail":
        reasons.append(
            F.when(
                op == F.lit("t"),
                F.lit(
                    "truncate event (op 't') refused by truncate='fail'; pass truncate='apply' to empty the table "
                    "at that point, or truncate='skip' to ignore truncates"
                ),
            )
        )
    for code, name, row_image in (("c", "create", after), ("r", "read", after), ("u", "update", after)):
        reasons.append(F.when((op == F.lit(code)) & row_image.isNull(), F.lit(f"{name} without after")))
    reasons.append(F.when((op == F.lit("d")) & before.isNull(), F.lit("delete without before")))
    for row_image, name in ((after, "after"), (before, "before")):
        reasons.append(
            F.when(
                row_image.isNotNull() & F.json_object_keys(row_image).isNull(), F.lit(f"{name} is not a JSON object")
            )
        )
    raw_orders = [F.col(n) for n in order_names]
    if paths:
        orders = [order_value(n, t) for n, t in zip(order_names, args.types, strict=True)]
        for path, raw_order, order, kind in zip(paths, raw_orders, orders, args.types, strict=True):
            reasons.append(
                F.when(
                    raw_order.isNotNull() & order.isNull(),
                    F.concat(F.lit("order value '"), raw_order, F.lit(f"' at {path} is not {order_expected(kind)}")),
                )
            )
        if len(paths) == 1:
            extra.append(orders[0].alias(args.order_column))
        else:
            present = F.lit(True)
            for order in orders:
                present = present & order.isNotNull()
            fields = [o.alias(p.replace(".", "_")) for o, p in zip(orders, paths, strict=True)]
            extra.append(F.when(present, F.struct(*fields)).alias(args.order_column))
    helpers: list[Column] = []
    if table_column is not None:
        wanted = {*IDENTITY_FIELDS, *(args.table_fields or ())}
        source = {f: F.get_json_object(payload, f"$.source.{f}") for f in sorted(wanted)}
        extra.append(name_column(source, args.table_fields).alias(table_column))
        helpers.append(identity_column(source).alias(SOURCE_COLUMN))
    if key_from is not None:
        k = F.col(KEY)
        # With the schema part the key's fields are under "payload"; without it the key is them.
        key_fields = F.when(F.get_json_object(k, "$.schema").isNotNull(), F.get_json_object(k, "$.payload")).otherwise(
            k
        )
        extra.append(F.json_object_keys(key_fields).alias(args.key_column))
    added = [args.op_column] + ([args.order_column] if paths else []) + ([table_column] if table_column else [])
    added += [args.key_column] if key_from is not None else []
    return EnvelopeColumns(
        present=value.isNotNull() & (F.trim(value) != F.lit("")),
        first=[*kept_columns, value.alias(value_column), *message_key],
        payload=F.coalesce(F.get_json_object(v, "$.payload"), v),
        parts=parts,
        kept=kept,
        image=F.when(op == F.lit("d"), before).otherwise(after),
        carried=kept_columns,
        value=v,
        extra=extra,
        helpers=helpers,
        reason=F.coalesce(*reasons),
        stats=_stats(op, raw_orders, args.need_schemas, payload, args.placeholder),
        added=added,
    )


class Counts:
    def __init__(self, schemas: list[str | None], unordered: int, ordered: int, placeholders: int = 0) -> None:
        self.schemas = schemas
        self.unordered = unordered
        self.ordered = ordered
        self.placeholders = placeholders


def _per_event(
    op: Column, raw_orders: list[Column], payload: Column, placeholder: str | None
) -> tuple[Column, Column, Column]:
    """Per event: a row event without an order value, a row event with one, and whether its
    payload's text (where the row images are; not the schema part, most of a wide event) holds the
    placeholder (as is or base64, as bytes are written)."""
    found = F.lit(False)
    if placeholder is not None:
        encoded = base64.b64encode(placeholder.encode()).decode().rstrip("=")
        found = payload.contains(placeholder) | payload.contains(encoded)
    row_event = op.isin("c", "r", "u", "d")
    missing = F.lit(False)
    for raw in raw_orders:
        missing = missing | raw.isNull()
    return row_event & missing, row_event & ~missing, found


def _stats(
    op: Column, raw_orders: list[Column], need_schemas: bool, payload: Column, placeholder: str | None
) -> tuple[list[Column], list[Column], Column] | None:
    """The grouping and aggregates of :func:`batch_stats`, and what no event of a batch
    :meth:`LastCounts.plan_on` accepts may hold; None when there is nothing to count."""
    if not need_schemas and not raw_orders and placeholder is None:
        return None
    unordered, ordered, found = _per_event(op, raw_orders, payload, placeholder)
    group = [F.col(SCHEMA).alias("s")] if need_schemas else []
    aggregates = [
        F.sum(unordered.cast("long")).alias("unordered"),
        F.sum(ordered.cast("long")).alias("ordered"),
        F.sum(found.cast("long")).alias("placeholders"),
    ]
    return group, aggregates, unordered | found


def batch_stats(events: DataFrame, stats: tuple[list[Column], list[Column], Column] | None) -> Counts:
    """One Spark job: the batch's distinct schema parts (when grouped by them), how many row events
    have no order value, and how many events' payload holds the placeholder (as is or base64, as
    bytes are written)."""
    if stats is None:
        return Counts([], 0, 0)
    group, aggregates, _ = stats
    result = events.groupBy(*group).agg(*aggregates).collect()
    return Counts(
        [r["s"] for r in result] if group else [],
        sum(r["unordered"] or 0 for r in result),
        sum(r["ordered"] or 0 for r in result),
        sum(r["placeholders"] or 0 for r in result),
    )


# -- A batch planned on the statistics of the one before
#
# The statistics job is a Spark job of its own in every batch (200-400 ms of a narrow table's
# micro-batch, docs/benchmarks-debezium-wide.md). Where the sink reads a stream's batches (and a
# sink's successive write() calls), a reader may instead plan a batch on the last statistics it
# counted, when those were plain (schema parts only: every row event ordered, no placeholder); every
# event of the batch is then checked, inside the Spark jobs that read it, to agree with them (its
# schema part one of them; ordered; no placeholder), and one that does not fails the job with
# STALE_COUNTS. The sink then reads and writes the batch again, counted (job/reading.py): nothing
# of the failed attempt was committed.

STALE_COUNTS = "iceberg-sink: batch planned on the last batch's Debezium statistics holds an event they do not cover"
#: What a Spark job fails with when a row image is one the Arrow reader leaves to Spark's
#: expressions (sources/arrow_rows.py): the batch is read again the same way.
READ_BY_SPARK = "iceberg-sink: a Debezium row image this batch's Arrow reader leaves to Spark's reader"


@dataclass
class _Reading:
    plan: bool  # readers may plan on their last statistics
    readers: list[LastCounts]  # the readers of this batch


_READING: ContextVar[_Reading | None] = ContextVar("iceberg_sink_debezium_reading", default=None)


@contextmanager
def reading_batch(plan: bool) -> Iterator[None]:
    """Inside: the sink reads and writes one batch. Readers given a :class:`LastCounts` plan it on
    their last statistics and read its row images with Arrow where they can (``plan``), or count
    them and leave every image to Spark. When the batch fails (an exception leaves the block), every
    reader of it forgets its last statistics: the next batch is counted, never planned on those of a
    batch that was not written (a column the table refused would fail it too); one that failed on
    :data:`READ_BY_SPARK` also leaves its next batches' images to Spark for a while."""
    reading = _Reading(plan, [])
    token = _READING.set(reading)
    try:
        yield
    except BaseException as e:
        left = (read_again(e) or "").startswith(READ_BY_SPARK)
        for reader in reading.readers:
            reader.forget()
            if left:
                reader.leave_to_spark()
        raise
    finally:
        _READING.reset(token)


class LastCounts:
    """One reader's last counted statistics, kept across its batches (``.debezium``'s reader)."""

    def __init__(self) -> None:
        self._counts: Counts | None = None
        self._spark_reads = 0  # batches whose row images Spark reads before Arrow may again
        self._left = 0  # batches that met an image the Arrow reader leaves to Spark

    def _register(self) -> _Reading | None:
        reading = _READING.get()
        if reading is not None and self not in reading.readers:
            reading.readers.append(self)
        return reading

    def arrow_reads(self) -> bool:
        """Whether this batch's row images may be read by the Arrow reader (sources/arrow_rows.py):
        inside :func:`reading_batch` on its first attempt, unless a recent batch met an image the
        Arrow reader leaves to Spark. After the k-th such batch, Spark reads the next 2^k (at most
        1,024): a stream whose every batch holds such a value is not read twice per batch."""
        reading = self._register()
        if reading is None or not reading.plan:
            return False
        if self._spark_reads > 0:
            self._spark_reads -= 1
            return False
        return True

    def leave_to_spark(self) -> None:
        self._left += 1
        self._spark_reads = 2 ** min(self._left, 10)

    def plan_on(self) -> Counts | None:
        """The statistics to plan this batch on, or None to count them (outside
        :func:`reading_batch`, inside it without ``plan``, or when the last ones were not plain)."""
        reading = self._register()
        if reading is None:
            return None
        return self._counts if reading.plan else None

    def remember(self, counts: Counts, need_schemas: bool) -> None:
        """Keep ``counts`` when plain; a batch without events keeps the ones before."""
        if need_schemas and not counts.schemas:
            return
        plain = counts.unordered == 0 and counts.placeholders == 0 and None not in counts.schemas
        self._counts = counts if plain else None

    def forget(self) -> None:
        self._counts = None


def unlike(spark: SparkSession, counts: Counts, args: EnvelopeArgs, surprise: Column) -> Column:
    """A string column, null for an event ``counts`` cover; for any other it fails the Spark job
    with :data:`STALE_COUNTS`. Built once per set of schema parts (:func:`built`)."""

    def build() -> Column:
        odd = surprise
        if args.need_schemas:
            schema = F.col(SCHEMA)
            odd = odd | schema.isNull() | ~schema.isin(*counts.schemas)
        return F.when(odd, F.raise_error(F.lit(STALE_COUNTS))).cast("string")

    return built(spark, ("unlike", args, tuple(sorted(str(s) for s in counts.schemas))), build)  # type: ignore[no-any-return]


def read_again(error: BaseException | None) -> str | None:
    """Why the batch is to be read again, counted and read by Spark's expressions, when ``error`` (or
    one it was raised from) is a Spark job failed on :data:`STALE_COUNTS` or :data:`READ_BY_SPARK`
    (the marker and the rest of its line); else None."""
    for e in raised_from(error) if error is not None else ():
        text = str(e)
        for marker in (READ_BY_SPARK, STALE_COUNTS):
            at = text.find(marker)
            if at >= 0:
                return text[at:].splitlines()[0][:400]
    return None


def warn_unordered(counts: Counts, paths: Sequence[str]) -> None:
    if paths and counts.unordered and counts.ordered:
        logger.warning(
            "%s of %s Debezium events of this batch have no order value at %s: within the batch each sorts "
            "before every ordered change of its key (nulls are oldest), so it loses to older changes of the same key",
            counts.unordered,
            counts.unordered + counts.ordered,
            ", ".join(paths),
        )
