"""Unchanged TOASTed columns before writing: the value a column marked unavailable (sources/toast.py) gets.

Two steps, both only for rows the Debezium reader marked (a batch without any placeholder skips them):

1. :func:`carry_forward`, inside the CDC reduction's window (topology/changes.py, no extra sort): a
   marked column of a change takes the value of the key's newest earlier change in the batch that
   holds one. An earlier change that is a delete gives nothing: the change is refused (the stored
   row is gone, and the deleted image does not carry the column).
2. :func:`fill_stored`, on the driver after the reduction: the keys whose final image is still
   marked are collected (one more Spark job over the reduced batch), their stored rows read from
   the table's branch head (table/lookup.py: only data files whose key bounds may hold them), and
   joined back (broadcast) by key. A key without a stored row, or whose stored value is the
   placeholder itself, is refused, naming the column.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from pyiceberg.table import Table
from pyspark.sql import Column, DataFrame, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from iceberg_sink import _faults
from iceberg_sink._iceberg.retry import moved_on
from iceberg_sink._spark_schema import columns_of, schema_of
from iceberg_sink._sql import named
from iceberg_sink.errors import CatalogUnavailableError, CommitRetriesExhaustedError, pending_because
from iceberg_sink.sources.toast import (
    can_hold,
    placeholder_reason,
    refuse_marked,
    refuse_unavailable,
    remark,
    unknown_columns,
)
from iceberg_sink.table.lookup import stored_rows
from iceberg_sink.vocab.columns import REJECT_COLUMN, UNAVAILABLE_COLUMN

logger = logging.getLogger("iceberg_sink")

# How often a lookup reads again on a newer table when a file of the one it read is gone.
_LOOKUP_RELOADS = 4

#: Why :func:`carry_forward` refuses a change (a helper column, dropped by the reduction).
AFTER_DELETE = "__iceberg_sink_toast_after_delete"
_STORED = "__iceberg_sink_stored_"
_KEY = "__iceberg_sink_stored_key_"


def _marked(name: str) -> Column:
    return F.coalesce(F.array_contains(unknown_columns(F.col(UNAVAILABLE_COLUMN)), F.lit(name)), F.lit(False))


def carry_forward(df: DataFrame, window: WindowSpec, op_column: str, skip: Sequence[str] = ()) -> DataFrame:
    """Marked columns take the key's newest earlier value in this batch (``window``: the key's
    changes, newest first; ``op_column``: normalised ops, ``D`` for deletes). Columns still marked
    stay in :data:`UNAVAILABLE_COLUMN`; :data:`AFTER_DELETE` names the first column whose earlier
    change is a delete (null when none)."""
    earlier = window.rowsBetween(Window.currentRow, Window.unboundedFollowing)
    names = [
        f.name
        for f in schema_of(df).fields
        if can_hold(f.dataType) and f.name not in (*skip, op_column, UNAVAILABLE_COLUMN)
    ]
    columns: list[Column] = []
    still: list[Column] = []
    deleted: list[Column] = []
    for name in names:
        marked = _marked(name)
        source = F.when(~marked, F.struct((F.col(op_column) == F.lit("D")).alias("d"), named(name).alias("v")))
        previous = F.first(source, ignorenulls=True).over(earlier)
        known = previous.isNotNull() & ~previous.getField("d")
        columns.append(F.when(marked & known, previous.getField("v")).otherwise(named(name)).alias(name))
        still.append(F.when(marked & ~known, F.lit(name)))
        deleted.append(F.when(marked & previous.isNotNull() & previous.getField("d"), F.lit(name)))
    if not names:
        return df.withColumn(AFTER_DELETE, F.lit(None).cast("string"))
    by_name = dict(zip(names, columns, strict=True))
    left = F.filter(F.array(*still), lambda n: n.isNotNull())
    return df.select(
        *[by_name.get(c, named(c)) for c in columns_of(df) if c != UNAVAILABLE_COLUMN],
        remark(F.col(UNAVAILABLE_COLUMN), left).alias(UNAVAILABLE_COLUMN),
        F.coalesce(*deleted).alias(AFTER_DELETE),
    )


def refuse_after_delete(df: DataFrame) -> DataFrame:
    """Refuse the changes :func:`carry_forward` found after a delete of their key (recording the event
    each was read from), and drop its column."""
    if AFTER_DELETE not in columns_of(df):
        return df
    reason = placeholder_reason(
        F.col(AFTER_DELETE), "its key was deleted earlier in this batch, so no stored value is known; see docs/cdc.md"
    )
    return refuse_marked(df, reason).drop(AFTER_DELETE)


@attrs.frozen
class StoredTable:
    """Where one table's stored rows are read: the table as loaded for the checkpoint, its branch, its
    key, and why the checkpoint's commit is deferred (a catalog outage or lost races: the table then
    misses pending checkpoints, so stored values would be stale). ``settle``, when given, is called
    before stored rows are read and gives the table and deferral to read with: the previous
    checkpoint's commit may still run beside this one (job/lane.py), and its rows count."""

    table: Table
    branch: str
    key: tuple[str, ...]
    deferred: BaseException | None = None
    settle: Callable[[], tuple[Table, BaseException | None]] | None = attrs.field(default=None, eq=False)


def resolve(
    df: DataFrame, tables: Mapping[str | None, StoredTable] | None, route_column: str | None = None
) -> DataFrame:
    """:func:`fill_stored` for a CDC sink (``tables``); a sink without a key (``tables`` None) refuses
    the marked rows: it has no stored row to take the value from."""
    if tables is None:
        return refuse_unavailable(df, "the sink has no key to find its stored row by (use .cdc(...))")
    return fill_stored(df, tables, route_column)


def _stored_rows_now(
    target: StoredTable, keys: list[tuple[object, ...]], columns: list[str]
) -> tuple[list[tuple[Any, ...]], int]:
    """:func:`stored_rows` of the table as the checkpoint loaded it, or, when a file of it is gone
    (another writer moved the head and a snapshot expiry removed the old head's files), of the table
    as the catalog has it now: the stored values are the newest either way. A file missing from the
    current table is an error (``_iceberg/retry.moved_on``, the rule commits follow too)."""
    table = target.table
    for reloads in range(_LOOKUP_RELOADS + 1):
        try:
            return stored_rows(table, target.branch, target.key, keys, columns)
        except FileNotFoundError:
            current = moved_on(table, lambda: target.table.catalog.load_table(target.table.name()))
            if current is None or reloads == _LOOKUP_RELOADS:
                raise
            logger.info(
                "unchanged TOASTed columns of table %s: a file of the table as loaded was removed meanwhile; "
                "reading the table as it is now",
                ".".join(table.name()),
            )
            table = current
    raise AssertionError("unreachable")


def fill_stored(df: DataFrame, tables: Mapping[str | None, StoredTable], route_column: str | None = None) -> DataFrame:
    """Give the marked columns of the reduced batch ``df`` their stored values, refuse what is still
    unknown, and drop :data:`UNAVAILABLE_COLUMN` (see the module docstring). ``tables``: by route
    value (``route_column``), or the one table under None."""
    if UNAVAILABLE_COLUMN not in columns_of(df):
        return df
    marker = F.col(UNAVAILABLE_COLUMN)
    pending = df.where(marker.isNotNull())
    if REJECT_COLUMN in columns_of(df):
        pending = pending.where(F.col(REJECT_COLUMN).isNull())
    route = F.col(route_column) if route_column is not None else F.lit("")
    names: dict[str, StoredTable] = (
        {t: v for t, v in tables.items() if t is not None} if route_column is not None else {"": tables[None]}
    )
    width = max((len(t.key) for t in names.values()), default=0)
    keys = [_key_part(names, route, i).alias(f"k{i}") for i in range(width)]
    wanted: dict[str, dict[tuple[object, ...], None]] = {}
    marked: set[str] = set()
    for row in pending.select(
        route.alias("r"), F.struct(*keys).alias("k"), unknown_columns(marker).alias("m")
    ).collect():
        target = names.get(row["r"])
        if target is None:
            continue
        wanted.setdefault(row["r"], {})[tuple(row["k"])[: len(target.key)]] = None
        marked.update(row["m"])
    if not wanted:
        return refuse_unavailable(df, "the table holds no row of its key")
    types = {f.name: f.dataType for f in schema_of(df).fields}
    columns = [c for c in columns_of(df) if c in marked]  # in the table's order: a refusal names the first
    spark = df.sparkSession
    parts: list[DataFrame] = []
    for name, by_key in wanted.items():
        target = names[name]
        if target.settle is not None:
            table, deferred = target.settle()
            target = attrs.evolve(target, table=table, deferred=deferred, settle=None)
        if target.deferred is not None:
            lost = isinstance(target.deferred, CommitRetriesExhaustedError)
            raise (CommitRetriesExhaustedError if lost else CatalogUnavailableError)(
                f"table {'.'.join(target.table.name())}: {len(by_key)} keys need their stored values for unchanged "
                f"TOASTed columns, but {pending_because(target.deferred)} and checkpoints may be pending, so the "
                "table as last loaded may be stale; restart the stream once its commits land (nothing is lost)"
            ) from target.deferred
        _faults.hit(_faults.BEFORE_LOOKUP, -1)
        try:
            rows, read = _stored_rows_now(target, list(by_key), columns)
        except ValueError as e:  # a nested key: its rows stay marked and are refused
            logger.warning("unchanged TOASTed columns of table %s: %s", target.table.name(), e)
            rows, read = [], 0
        logger.info(
            "unchanged TOASTed columns: %s keys looked up in %s, %s data files read, %s rows found",
            len(by_key),
            ".".join(target.table.name()),
            read,
            len(rows),
        )
        schema = T.StructType(
            [T.StructField(f"k{i}", types[k]) for i, k in enumerate(target.key)]
            + [T.StructField(f"c{i}", T.StructType([T.StructField("v", types[c])])) for i, c in enumerate(columns)]
        )
        found = spark.createDataFrame(
            [(*r[: len(target.key)], *[(v,) for v in r[len(target.key) :]]) for r in rows], schema
        )
        parts.append(
            found.select(
                F.lit(name).alias(f"{_KEY}r"),
                *[
                    (F.col(f"k{i}").cast("string") if i < len(target.key) else F.lit("")).alias(f"{_KEY}{i}")
                    for i in range(width)
                ],
                *[F.col(f"c{i}").alias(f"{_STORED}{i}") for i in range(len(columns))],
            )
        )
    join = [f"{_KEY}r", *[f"{_KEY}{i}" for i in range(width)]]
    stored = parts[0]
    for part in parts[1:]:
        stored = stored.unionByName(part)
    keyed = df.select(
        "*",
        F.when(marker.isNotNull(), route).alias(f"{_KEY}r"),
        *[_key_part(names, route, i).alias(f"{_KEY}{i}") for i in range(width)],
    )
    joined = keyed.join(F.broadcast(stored.dropDuplicates(join)), on=join, how="left")
    replaced: dict[str, Column] = {}
    left: list[Column] = []
    for i, c in enumerate(columns):
        value = F.col(f"{_STORED}{i}")
        # A stored placeholder (never written by this sink, but by another writer) is not a value.
        usable = _marked(c) & value.isNotNull() & ~value.getField("v").eqNullSafe(named(c))
        replaced[c] = F.when(usable, value.getField("v")).otherwise(named(c)).alias(c)
        left.append(F.when(_marked(c) & ~usable, F.lit(c)))
    rest = F.filter(F.array(*left), lambda n: n.isNotNull()) if left else F.array().cast("array<string>")
    out = joined.select(
        *[replaced.get(c, named(c)) for c in columns_of(df) if c != UNAVAILABLE_COLUMN],
        remark(marker, rest).alias(UNAVAILABLE_COLUMN),
    )
    return refuse_unavailable(out, "the table holds no row of its key (or only the placeholder)")


def _key_part(names: Mapping[str, StoredTable], route: Column, i: int) -> Column:
    """Key field ``i`` of each row by its table, as text (``""`` past a shorter key): routed tables'
    keys differ in type, and text compares the same on both sides of the join."""
    part: Column | None = None
    for name, target in names.items():
        value = named(target.key[i]).cast("string") if i < len(target.key) else F.lit("")
        part = F.when(route == F.lit(name), value) if part is None else part.when(route == F.lit(name), value)
    assert part is not None
    return part


__all__ = ["AFTER_DELETE", "StoredTable", "carry_forward", "fill_stored", "refuse_after_delete", "resolve"]
