"""Pre-write topology for upserts and CDC: validate, normalise and reduce each checkpoint's changes.

Within one checkpoint only the last change of each key matters for the committed table: the
checkpoint becomes one snapshot whose equality deletes (one per changed key) remove every older
row of the key, and whose data files hold the key's final image, if any. So each key's changes are
reduced to the last one here, in Spark: a window over the key ordered by ``order_by`` (then arrival
order), which Spark computes with a sort that spills to disk. Writers therefore never track keys in
memory (Flink's insertedRowMap is a known out-of-memory cause), and never need position deletes:
a key has at most one inserted row per checkpoint, and an equality delete applies only to rows of
lower sequence numbers, so it never removes the row the same snapshot inserts.

Operation codes (Debezium's and Flink's row kinds map onto these):

=================  =============================================
insert             ``I``, ``insert``, ``c``, ``r``, ``+I``
update (after)     ``U``, ``update``, ``u``, ``+U``
update (before)    ``UB``, ``update_before``, ``-U``: dropped (the key is known)
delete             ``D``, ``delete``, ``d``, ``-D``
truncate           ``t``, ``truncate``: only in an op column marked :data:`TRUNCATES_METADATA`
                   (the Debezium reader's under ``truncate="apply"``); elsewhere unknown codes
=================  =============================================

A truncate empties its table at that point of the change order (per routed table with ``scope``):
the last truncate of the checkpoint, by the same order as a key's changes (``order_by``, then
arrival), drops every change ordered before it; a truncate without an order value is placed by
arrival instead (the changes that arrived before it are dropped). The changes after it are reduced
as usual. It is kept as one marker row (operation ``T``, its row columns and key null) that the
writers do not write but report (``WriteResult.truncated``), so the checkpoint's committable records
it and the committer removes every file of the table in the checkpoint's snapshot
(committer/committer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iceberg_sink._spark_schema import columns_of, schema_of
from iceberg_sink._sql import column, parse, path, path_column, row_struct, string, strings, where
from iceberg_sink._steps import Steps
from iceberg_sink.config import ChangeConfig
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.sources.rejects import refusal_sql
from iceberg_sink.topology.estimate import estimated_bytes
from iceberg_sink.topology.toast import AFTER_DELETE, carry_forward, refuse_after_delete
from iceberg_sink.vocab.columns import (
    DELETE_CODES,
    INSERT_CODES,
    OP_COLUMN,
    REJECT_COLUMN,
    RUN_ALONE_COLUMN,
    RUN_HASH_COLUMN,
    RUN_KEY_PREFIX,
    TRUNCATE_CODES,
    TRUNCATE_OP,
    TRUNCATES_METADATA,
    UNAVAILABLE_COLUMN,
    UPDATE_BEFORE_CODES,
    UPDATE_CODES,
)

_SEQ = "__iceberg_sink_seq"
_RANK = "__iceberg_sink_rank"
_POSITION = "__iceberg_sink_position"
_LAST_TRUNCATE = "__iceberg_sink_last_truncate"
_LAST_ORDERED = "__iceberg_sink_last_ordered_truncate"
_LAST_ARRIVED = "__iceberg_sink_last_unordered_truncate"


def carries_truncates(df: DataFrame, changes: ChangeConfig) -> bool:
    """Whether ``df``'s op column is marked as holding truncates (:data:`TRUNCATES_METADATA`)."""
    return changes.op_column is not None and _truncates_marked(schema_of(df), changes)  # no schema call without one


def _truncates_marked(schema: StructType, changes: ChangeConfig) -> bool:
    if changes.op_column is None or changes.op_column not in schema.fieldNames():
        return False
    return bool(schema[changes.op_column].metadata.get(TRUNCATES_METADATA))


def _refusals(changes: ChangeConfig, truncates: bool) -> list[tuple[str, str]]:
    """Why a change cannot be applied (SQL text of a reason, null when it can) per check, in order: a
    null key column, then an operation code that is none of the known ones. They mark refused rows
    (sources/rejects.py), which fail the batch or go to the dead-letter table."""
    null_key = " OR ".join(f"({path(k)} IS NULL)" for k in changes.key)
    if truncates:
        # A truncate has no key (Debezium's carries no row and a null message key).
        null_key = f"({null_key}) AND NOT {_is_truncate_sql(changes)}"
    key_text = (
        "concat_ws(', ', "
        + ", ".join(f"concat({string(k + '=')}, coalesce(CAST({path(k)} AS STRING), 'null'))" for k in changes.key)
        + ")"
    )
    null_text = f"a key column is null ({', '.join(changes.key)} must all be set); row key: "
    key_reason = f"concat({string(null_text)}, {key_text})"
    checks = [(f"CASE WHEN {null_key} THEN {key_reason} END", "NullKeyError")]
    if changes.op_column is not None:
        op = f"CAST({path(changes.op_column)} AS STRING)"
        codes = INSERT_CODES + UPDATE_CODES + UPDATE_BEFORE_CODES + DELETE_CODES + (TRUNCATE_CODES if truncates else ())
        allowed = ", ".join(codes)
        known = f"{op} IN ({strings(codes)})"
        expected = f"' in column {changes.op_column!r}; expected one of {allowed}; row key: "
        opening = string("unknown operation code '")
        op_reason = f"concat({opening}, coalesce({op}, 'null'), {string(expected)}, {key_text})"
        checks.append((f"CASE WHEN NOT coalesce({known}, false) THEN {op_reason} END", "UnknownOperationError"))
    return checks


def _normalised_op(changes: ChangeConfig, truncates: bool) -> str:
    if changes.op_column is None:
        return "'U'"
    op = f"CAST({path(changes.op_column)} AS STRING)"
    cases = [(INSERT_CODES, "I"), (UPDATE_CODES, "U"), (UPDATE_BEFORE_CODES, "B"), (DELETE_CODES, "D")]
    if truncates:
        cases.append((TRUNCATE_CODES, TRUNCATE_OP))
    return "CASE " + " ".join(f"WHEN {op} IN ({strings(codes)}) THEN {string(to)}" for codes, to in cases) + " END"


def _is_truncate_sql(changes: ChangeConfig) -> str:
    if changes.op_column is None:
        return "false"
    return f"coalesce(CAST({path(changes.op_column)} AS STRING) IN ({strings(TRUNCATE_CODES)}), false)"


def is_truncate(changes: ChangeConfig) -> Column:
    """True for the rows of a change DataFrame whose operation is a truncate (never null)."""
    if changes.op_column is None:
        return F.lit(False)
    return F.coalesce(path_column(changes.op_column).cast("string").isin(*TRUNCATE_CODES), F.lit(False))


def no_rows(df: DataFrame, changes: ChangeConfig) -> Callable[[], bool]:
    """Asks (one small Spark job, when called) whether ``df`` holds no row to write: nothing at all
    (a Debezium batch of message events, tombstones and skipped truncates), truncates only, or only
    rows a source refused (they go to the dead-letter table, and the batch may lack the table's
    columns: a Debezium batch of events that are not JSON has no row image to read them from)."""

    def asked() -> bool:
        rows = df.where(F.col(REJECT_COLUMN).isNull()) if REJECT_COLUMN in columns_of(df) else df
        if carries_truncates(df, changes):
            rows = rows.where(~is_truncate(changes))
        return rows.limit(1).count() == 0

    return asked


def _after_last_truncate(df: DataFrame, changes: ChangeConfig, scope: Sequence[str], refused: Column) -> DataFrame:
    """``df`` without the changes ordered before the last truncate of their table (``scope``), and
    without the truncates but that last one (the marker). Without truncates nothing is dropped.

    A change's position is (``order_by`` present, ``order_by``, arrival), the order the reduction
    sorts a key's changes by (nulls oldest); the last truncate per table is found by one small
    aggregation, joined back by the scope columns (a broadcast: one row per truncated table).

    A truncate without an order value (``order_by`` null: Debezium's truncate carries no ``lsn`` of
    some connectors, or a producer left it out) is placed by arrival: the changes that arrived before
    it are dropped, those after it kept, whatever their order values. By position alone it would sort
    before every ordered change (nulls oldest), and the changes that arrived before it would silently
    outlive it."""
    seq = F.col(_SEQ)
    parts = [seq]
    order = path_column(changes.order_by) if changes.order_by is not None else None
    if order is not None:
        parts = [order.isNotNull(), order, *parts]
    position = F.struct(*[p.alias(f"p{i}") for i, p in enumerate(parts)])
    with_position = df.withColumn(_POSITION, position)
    truncate = ~refused & (F.col(OP_COLUMN) == F.lit(TRUNCATE_OP))
    this = F.col(_POSITION)
    aggregates = [F.max(this).alias(_LAST_TRUNCATE)]
    if order is not None:
        aggregates += [
            F.max(F.when(order.isNotNull(), this)).alias(_LAST_ORDERED),
            F.max(F.when(order.isNull(), seq)).alias(_LAST_ARRIVED),
        ]
    truncates = with_position.where(truncate).groupBy(*[F.col(c) for c in scope]).agg(*aggregates)
    last = F.col(_LAST_TRUNCATE)
    on: list[str] | Column = list(scope) if scope else F.lit(True)
    joined = with_position.join(F.broadcast(truncates), on=on, how="left")
    if order is None:
        kept = refused | last.isNull() | (this >= last)
        return joined.where(kept).drop(_POSITION, _LAST_TRUNCATE)
    ordered, arrived = F.col(_LAST_ORDERED), F.col(_LAST_ARRIVED)
    after_all = (ordered.isNull() | (this >= ordered)) & (arrived.isNull() | (seq > arrived))
    # The marker is the last truncate by position; every other truncate goes, every change kept is
    # after all of them (the ordered ones by position, those without an order value by arrival).
    is_truncate = F.coalesce(F.col(OP_COLUMN) == F.lit(TRUNCATE_OP), F.lit(False))
    kept = refused | last.isNull() | (this == last) | (~is_truncate & after_all)
    return joined.where(kept).drop(_POSITION, _LAST_TRUNCATE, _LAST_ORDERED, _LAST_ARRIVED)


def fits_one_task(df: DataFrame, max_bytes: int) -> bool:
    """Whether ``df`` is a small batch, run in one task: Spark's size estimate of it
    (topology/estimate.py) is at most ``max_bytes`` (``iceberg-sink.changes.single-task-max-bytes``);
    False when it has none or ``max_bytes`` is 0 (never). The one rule for the reduction, the write
    after it and a routed batch's planning job."""
    if max_bytes <= 0:
        return False
    size = estimated_bytes(df)
    return size is not None and size <= max_bytes


def _order_type(schema: StructType, name: str) -> DataType | None:
    """The type of ``name`` in ``schema`` as ``F.col`` resolves it (dots select nested fields; a
    field of another case only when it is the one such field, as Spark's default resolution finds
    it); None when there is no such field."""
    current: DataType = schema
    for part in name.split("."):
        if not isinstance(current, StructType):
            return None
        found = _field_named(current, part)
        if found is None:
            return None
        current = current[found].dataType
    return current


def _field_named(struct: StructType, name: str) -> str | None:
    """The field of ``struct`` a reference to ``name`` finds, as Spark's default resolution does: the
    one named exactly so, else the one field of another case; None when there is none."""
    names = struct.fieldNames()
    if name in names:
        return name
    folded = [n for n in names if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def _orderable(data_type: DataType) -> bool:
    """Whether Spark sorts values of ``data_type`` (not maps, nor structs or arrays holding one)."""
    if isinstance(data_type, MapType):
        return False
    if isinstance(data_type, StructType):
        return all(_orderable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _orderable(data_type.elementType)
    return True


def check_order_by(schema: StructType, changes: ChangeConfig) -> None:
    """Refuse an ``order_by`` the input lacks or Spark cannot sort, naming both, before any plan is
    built (Spark's own error would name the sink's internal columns instead)."""
    if changes.order_by is None:
        return
    mode = "upsert" if changes.is_upsert else "cdc"
    found = _order_type(schema, changes.order_by)
    if found is None:
        raise InvalidSinkConfigError(
            f"{mode}(order_by): expected a column of the input (dots select nested fields), received "
            f"{changes.order_by!r}; the input's columns: {', '.join(schema.fieldNames()) or 'none'}"
        )
    if not _orderable(found):
        raise InvalidSinkConfigError(
            f"{mode}(order_by): expected a column Spark can sort (numbers, strings, dates, timestamps, ...; "
            f"no maps), received {changes.order_by!r} of type {found.simpleString()}"
        )


def reduce_changes(
    df: DataFrame,
    changes: ChangeConfig,
    scope: Sequence[str] = (),
    single_task_max_bytes: int = 0,
    in_writers: bool = False,
    raw_kept: bool = True,
) -> DataFrame:
    """Return one row per changed key: its last change, with the operation in :data:`OP_COLUMN`.

    The input's op column is dropped (it is not stored in the table). ``scope``: columns that
    qualify the key (a routed sink's table column: equal keys of two tables are different keys).
    ``single_task_max_bytes``: when Spark estimates the input at most this large (and > 0), the
    reduction runs in one task without a shuffle (the key's grouping needs none in one partition),
    and so do the writers after it unless a distribution repartitions: a 10,000-change micro-batch
    spent more on the shuffle's second stage than on its rows. The arrival order is numbered before
    the rows are brought together, so it stays the source's order whatever order they come in.
    ``in_writers`` (the caller checked :func:`reducible_in_writers`, and passes no ``scope``): the rows
    stay in their Spark partitions, sorted there by key, a key's newest change first, with the helper
    columns the writer tasks reduce them by (writer/key_runs.py); no shuffle, no single task.
    ``raw_kept``: a refused row's mark keeps its raw value (a dead-letter table stores it); without
    one a refusal fails the batch, whose message names a Kafka message by its coordinates, and a wide
    row's JSON text (hundreds of expressions to parse and analyse) is not built.
    """

    # The plan is built from SQL text (iceberg_sink/_sql.py): one statement for the steps up to a
    # truncate's or TOASTed column's (DataFrame) steps, and the input's schema asked for once.
    schema = schema_of(df)
    check_order_by(schema, changes)
    columns = schema.fieldNames()
    # A batch of truncates only has no row columns (table/schema.py lets a CDC key be missing): its
    # key columns are null, so any other row of it is refused for its null key.
    absent = [k for k in changes.key if k not in columns]
    if absent:
        df = df.select("*", *[F.lit(None).alias(k) for k in absent])
        columns = [*columns, *absent]
    stored = [c for c in columns if c not in (REJECT_COLUMN, UNAVAILABLE_COLUMN)]
    raw = f"to_json({row_struct(stored)}, map('ignoreNullFields', 'false'))"
    truncates = _truncates_marked(schema, changes)
    checks = _refusals(changes, truncates)
    # The arrival order in a step of its own: a Project holding a nondeterministic expression stops the
    # optimizer from pushing the filters below through it (the refusals would be computed for every row).
    steps = Steps(df, columns).add(("monotonically_increasing_id()", _SEQ))
    if not in_writers and fits_one_task(df, single_task_max_bytes):
        steps.one_partition()
    steps.add((refusal_sql(columns, checks, raw, raw_kept=raw_kept), REJECT_COLUMN))
    refused_sql = f"{column(REJECT_COLUMN)} IS NOT NULL"
    steps.add((f"CASE WHEN NOT ({refused_sql}) THEN {_normalised_op(changes, truncates)} END", OP_COLUMN))
    steps.where(f"{refused_sql} OR {column(OP_COLUMN)} <> 'B'")
    if truncates:
        with_op = _after_last_truncate(steps.frame(), changes, scope, F.col(REJECT_COLUMN).isNotNull())
        steps = Steps(with_op, columns_of(with_op))
    # A refused row is not a change of its key: it is its own group (kept whole, never reduced away);
    # so is the truncate marker (it has no key).
    alone = f"CASE WHEN {refused_sql} OR {column(OP_COLUMN)} = {string(TRUNCATE_OP)} THEN {column(_SEQ)} END"
    partition = [*[path(c) for c in scope], *[path(k) for k in changes.key], alone]
    ordering = ([f"{path(changes.order_by)} DESC NULLS LAST"] if changes.order_by is not None else []) + [
        f"{column(_SEQ)} DESC"
    ]
    # The input's op column is not stored: dropped by the name a reference to it finds.
    dropped = [_SEQ, _RANK] + (
        [_field_named(schema, changes.op_column) or changes.op_column] if changes.op_column else []
    )
    if in_writers:
        return _sorted_for_writers(steps, changes, alone, ordering).drop(dropped).frame()
    window = f"PARTITION BY {', '.join(partition)} ORDER BY {', '.join(ordering)}"
    if UNAVAILABLE_COLUMN not in columns:
        steps.add((f"row_number() OVER ({window})", _RANK)).where(f"{column(_RANK)} = 1")
        return steps.drop(dropped).frame()
    # Unchanged TOASTed columns (sources/toast.py) take the key's previous value in this batch.
    with_op = steps.frame()
    skip = [*changes.key, *(c for c in (changes.op_column, changes.order_by) if c is not None)]
    by_key = Window.partitionBy(*[parse(p) for p in partition]).orderBy(
        *([path_column(changes.order_by).desc_nulls_last()] if changes.order_by is not None else []),
        F.col(_SEQ).desc(),
    )
    with_op = carry_forward(with_op, by_key, OP_COLUMN, skip)
    # A change still holding a placeholder after a delete of its key has no value to take: it is
    # refused, but the delete before it still applies. So a key's change is its newest change not
    # after a delete, and the changes newer than it (all after a delete) are kept to be refused.
    # (Ranking first and refusing the newest change dropped the key's delete with it.)
    after = f"{column(AFTER_DELETE)} IS NOT NULL"
    seen = f"sum(CASE WHEN {after} THEN 0 ELSE 1 END) OVER ({window} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    last = where(
        with_op.withColumn(_RANK, parse(seen)), f"{column(_RANK)} = 0 OR ({column(_RANK)} = 1 AND NOT ({after}))"
    )
    return refuse_after_delete(last).drop(*dropped)


#: Key types whose values the writer tasks compare as Spark groups them (writer/key_runs.py): no
#: collations, no floating point (never an Iceberg key), nothing nested.
_RUN_KEY_TYPES = (
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    BinaryType,
    BooleanType,
    DateType,
    TimestampType,
    TimestampNTZType,
    DecimalType,
)


def reducible_in_writers(schema: StructType, changes: ChangeConfig) -> bool:
    """Whether a batch of ``schema`` can be reduced in its writer tasks: no truncates to place (they
    order the whole batch), no TOASTed columns (their values come from the key's earlier changes),
    and keys of types the tasks compare as Spark groups them (strings without a collation)."""
    if _truncates_marked(schema, changes) or UNAVAILABLE_COLUMN in schema.fieldNames():
        return False
    for key in changes.key:
        found = _order_type(schema, key)
        plain_string = isinstance(found, StringType) and found.simpleString() == "string"
        if not (plain_string or isinstance(found, _RUN_KEY_TYPES)):
            return False
    return True


def _sorted_for_writers(steps: Steps, changes: ChangeConfig, alone: str, ordering: Sequence[str]) -> Steps:
    """``steps``' changes sorted within each Spark partition for its writer tasks to reduce
    (writer/key_runs.py): by key (a copy of each key column), then a row alone by its arrival, then
    a key's newest change first (``ordering``: ``order_by``, nulls oldest, then arrival); the key's
    hash beside it."""
    keys = [path(k) for k in changes.key]
    runs = [RUN_KEY_PREFIX + str(i) for i in range(len(keys))] + [RUN_ALONE_COLUMN]
    helpers = [*zip(keys, runs, strict=False), (alone, RUN_ALONE_COLUMN)]
    helpers.append((f"CASE WHEN {alone} IS NULL THEN xxhash64({', '.join(keys)}) END", RUN_HASH_COLUMN))
    return steps.add(*helpers).sort_within([*(f"{column(name)} ASC NULLS FIRST" for name in runs), *ordering])
