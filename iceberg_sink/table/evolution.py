"""Schema evolution in flight: a micro-batch whose columns the table lacks changes the table first.

Mode (``.schema_evolution(...)``, option ``iceberg-sink.schema-evolution``):

- ``off`` (default): the table's schema is never changed; extra columns are a
  :class:`~iceberg_sink.errors.SchemaMismatchError`.
- ``add-columns``: columns (top-level or fields of structs reached through structs) that the
  DataFrame has and the table lacks are added, as optional columns.
- ``add-and-widen``: also widens a column's type when the DataFrame's is wider, along Iceberg's
  legal promotions only: int to long, float to double, decimal(P, S) to decimal(P', S) with P' > P.

Everything else is refused before anything is committed, naming the table and each column: a
new column that is required (not null) in the DataFrame (existing rows have no value for it), a
narrowing or any other type change (string to int, long to int, ...), a new field inside a list or
map, a column that differs from the table's only in case. A column the table has and the batch
lacks is written as null when optional; when required it is refused, as without evolution.

Order and recovery. The change is committed to the catalog before the checkpoint's data files are
written (they are written with the new schema), so the schema change and the data that needs it land
in that order. It is idempotent: each attempt plans against the table as loaded now, so a batch
replayed after a crash between the schema change and the data commit finds its columns present and
changes nothing; another writer adding the same column first is fine too (the same name with an
incompatible type is an error). Committables kept pending across the change (a catalog outage) hold
files of an older schema: the committer accepts them, since columns were only added or widened.
A commit that loses a race with another writer is planned again and retried with the sink's commit
retry policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StructType,
)
from pyspark.sql import types as T

from iceberg_sink._iceberg import schema_update
from iceberg_sink._iceberg.retry import RetryPolicy, catalog_unreachable
from iceberg_sink._iceberg.schema_update import SchemaChange
from iceberg_sink.errors import CatalogUnavailableError, CommitRetriesExhaustedError, SchemaMismatchError
from iceberg_sink.table.schema import check_compatible, storable_struct

logger = logging.getLogger(__name__)

OFF = "off"
ADD_COLUMNS = "add-columns"
ADD_AND_WIDEN = "add-and-widen"
MODES = (OFF, ADD_COLUMNS, ADD_AND_WIDEN)


def wider(source: IcebergType, target: IcebergType) -> bool:
    """Whether ``target`` is a legal Iceberg promotion of ``source`` (and differs from it)."""
    if isinstance(source, IntegerType) and isinstance(target, LongType):
        return True
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return True
    return (
        isinstance(source, DecimalType)
        and isinstance(target, DecimalType)
        and source.scale == target.scale
        and source.precision < target.precision
    )


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _plan_struct(
    source: StructType,
    target: StructType,
    prefix: tuple[str, ...],
    mode: str,
    changes: list[SchemaChange],
    problems: list[str],
) -> None:
    by_name = {f.name: f for f in target.fields}
    lower = {f.name.lower() for f in target.fields}
    for f in source.fields:
        path = (*prefix, f.name)
        t = by_name.get(f.name)
        if t is None:
            if f.name.lower() in lower:
                continue  # reported by check_compatible (names differ only in case)
            if f.required:
                problems.append(
                    f"{_dotted(path)}: new column is required (not null) in the DataFrame; schema evolution adds "
                    "optional columns only (rows already in the table have no value for it): make the DataFrame "
                    "column nullable (e.g. df.to(schema) with the field nullable=True), or add the column to the "
                    "table yourself"
                )
            else:
                changes.append((path, "add", f.field_type))
            continue
        _plan_type(f.field_type, t.field_type, path, mode, changes, problems)


def _plan_type(
    source: IcebergType,
    target: IcebergType,
    path: tuple[str, ...],
    mode: str,
    changes: list[SchemaChange],
    problems: list[str],
) -> None:
    if isinstance(source, StructType) and isinstance(target, StructType):
        _plan_struct(source, target, path, mode, changes, problems)
        return
    if isinstance(source, ListType | MapType) and isinstance(target, ListType | MapType):
        _check_no_new_fields(source, target, path, problems)
        return
    if wider(target, source):
        if mode == ADD_AND_WIDEN:
            changes.append((path, "widen", source))
        else:
            problems.append(
                f"{_dotted(path)}: the DataFrame's type {source} is wider than the table's {target}; schema evolution "
                f"mode {mode!r} does not widen types: use 'add-and-widen', or cast the column to {target}"
            )
    # Any other difference (a narrowing is fine: the writer casts; string to int is not) is left to
    # check_compatible against the evolved schema, which names it.


def _check_no_new_fields(source: IcebergType, target: IcebergType, path: tuple[str, ...], problems: list[str]) -> None:
    """Fields added to structs inside lists or maps, or widened there, are not evolved."""
    pairs: list[tuple[IcebergType, IcebergType, str]] = []
    if isinstance(source, ListType) and isinstance(target, ListType):
        pairs.append((source.element_type, target.element_type, "element"))
    elif isinstance(source, MapType) and isinstance(target, MapType):
        pairs += [(source.key_type, target.key_type, "key"), (source.value_type, target.value_type, "value")]
    for s, t, part in pairs:
        where = f"{_dotted(path)}.{part}"
        if isinstance(s, StructType) and isinstance(t, StructType):
            names = {f.name for f in t.fields}
            extra = [f.name for f in s.fields if f.name not in names]
            if extra:
                problems.append(
                    f"{where}: fields {extra} are not in the table; schema evolution does not add fields inside "
                    "lists or maps: add them to the table yourself"
                )
        elif wider(t, s):
            problems.append(
                f"{where}: the DataFrame's type {s} is wider than the table's {t}; schema evolution does not widen "
                "types inside lists or maps"
            )


def plan(table_name: str, schema: Schema, struct: T.StructType, mode: str) -> list[SchemaChange]:
    """The changes ``schema`` needs to take ``struct`` under ``mode`` (empty: none).

    Raises:
        SchemaMismatchError: naming the table and every column that no allowed change can fit.
    """
    if mode == OFF:
        return []
    changes: list[SchemaChange] = []
    problems: list[str] = []
    _plan_struct(storable_struct(struct), schema.as_struct(), (), mode, changes, problems)
    if problems:
        raise SchemaMismatchError(table_name, problems)
    return changes


OUTAGE_NOTE = (
    "nothing of the checkpoint was written. A batch that needs a schema change is not kept pending "
    "through a catalog outage (its files would be written with columns the table does not have yet): "
    "the stream stops here. Checkpoints already pending stay under the checkpoint location; restart the "
    "stream once the catalog answers and they are committed in order, then this batch is written again"
)
"""What a schema change that meets an unreachable catalog tells the user (docs/schema-evolution.md)."""


def evolve(
    table_name: str,
    table: Table,
    struct: T.StructType,
    mode: str,
    load_table: Callable[[], Table],
    retry: RetryPolicy,
    runtime_checked: Iterable[str] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> Table:
    """Change ``table``'s schema so that it takes ``struct``, and return the table as committed.

    Nothing is committed unless the whole of ``struct`` then fits: every problem (those evolution
    cannot fix and those :func:`~iceberg_sink.table.schema.check_compatible` finds against the
    evolved schema) is raised at once, naming the table and the columns.

    Args:
        table_name: the table's identifier, for messages.
        table: the table as loaded.
        struct: the DataFrame's columns stored in the table.
        mode: one of :data:`MODES`.
        load_table: loads the table again (before each retry).
        retry: the commit retry policy (``commit.retry.*``).
        runtime_checked: as for check_compatible (CDC key columns).

    Raises:
        SchemaMismatchError: the batch cannot be written even after the allowed changes.
        CommitRetriesExhaustedError: every attempt lost a race with another schema change.
        CatalogUnavailableError: the catalog stayed unreachable.
    """
    checked = tuple(runtime_checked)
    attempt = 0
    deadline = time.monotonic() + retry.total_timeout_ms / 1000
    while True:
        changes = plan(table_name, table.schema(), struct, mode)
        # Everything else the batch needs is checked before anything is committed.
        target = schema_update.preview(table, changes) if changes else table.schema()
        check_compatible(table_name, target, struct, runtime_checked=checked)
        if not changes:
            return table
        attempt += 1
        exhausted = attempt > retry.num_retries or time.monotonic() > deadline
        described = ", ".join(f"{kind} {_dotted(path)} {t}" for path, kind, t in changes)
        try:
            schema_update.commit(table, changes)
            logger.info("table %s schema evolved: %s", table_name, described)
        except CommitFailedException as e:
            if exhausted:
                raise CommitRetriesExhaustedError(
                    f"schema change of table {table_name} ({described}): {attempt} attempts lost to concurrent "
                    f"writers ({e}); nothing of the checkpoint was written"
                ) from e
            logger.info("schema change of table %s lost a race (attempt %s): %s", table_name, attempt, e)
            sleep(retry.wait_ms(attempt) / 1000)
        except Exception as e:
            # Outcome unknown: the next attempt plans against the table as it is and finds it done or not.
            if not catalog_unreachable(e):
                raise
            if exhausted:
                raise CatalogUnavailableError(
                    f"schema change of table {table_name} ({described}): the catalog is unreachable "
                    f"({type(e).__name__}: {e}); {OUTAGE_NOTE}"
                ) from e
            logger.warning("schema change of table %s: the catalog is unreachable (attempt %s)", table_name, attempt)
            sleep(retry.wait_ms(attempt) / 1000)
        # Planned again on the table as committed: finds nothing left to do once the change landed.
        table = _reload(load_table, retry, table_name, sleep)


def _reload(
    load_table: Callable[[], Table], retry: RetryPolicy, table_name: str, sleep: Callable[[float], None]
) -> Table:
    for attempt in range(retry.num_retries + 1):
        try:
            return load_table()
        except Exception as e:
            if not catalog_unreachable(e):
                raise
            if attempt == retry.num_retries:
                raise CatalogUnavailableError(
                    f"schema change of table {table_name}: the catalog is unreachable ({type(e).__name__}: {e}); "
                    f"{OUTAGE_NOTE}"
                ) from e
            sleep(retry.wait_ms(attempt + 1) / 1000)
    raise AssertionError("unreachable")
