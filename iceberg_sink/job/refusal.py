"""Stage 2 of a micro-batch's road (road.py): refuse rows, and decide what happens to refused rows.

A check that can refuse a single row marks it with ``reject_where`` (sources/rejects.py): Debezium
conversion, a null key or an unknown operation code (topology/changes.py), a routing rule, a
``map_batches`` function, and here a null in a column the table requires. :func:`refuse` runs before
the change reduction (so an older change of a refused row's key still applies); :func:`enforce`
runs once per batch, right before the rows reach the writers, on every road:

* without ``.dead_letter(...)``: the first refused row fails the batch's Spark job (fail-fast,
  reported as InvalidInputError before anything is committed);
* with ``.dead_letter("ns.errors")``: the refusal column is kept, and each writer task splits the
  rows it receives (dead_letter.py): good rows to the table's writer, refused rows to the
  dead-letter table's, in the same Spark job.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pyiceberg.schema import Schema
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink._spark_schema import columns_of
from iceberg_sink._sql import named
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.sources.rejects import fail_on_reject, reject_where
from iceberg_sink.vocab.columns import DELETE_CODES, MARK_COLUMNS, REJECT_COLUMN, SOURCE_COLUMN, TRUNCATE_CODES


def refuse(df: DataFrame, batch: BatchPlan) -> DataFrame:
    """The rows the batch writes (a routed table whose checkpoint is stored already is not written
    again), with a dead-letter table each row holding null in a column its table requires refused.
    A Debezium event's source (SOURCE_COLUMN) served the plan (job/source_ledger.py) and goes here,
    for every sink (dropping a column the batch lacks is a no-op)."""
    df = df.drop(SOURCE_COLUMN)
    tables = batch.rows_of()
    if batch.route_column is not None and len(tables) != len(batch.plans):
        df = df.where(F.col(batch.route_column).isin(*sorted(tables)))
    if batch.dead is None:
        return df  # the writers' schema check refuses such a batch whole (writer/conform.py)
    schemas = {t: p.table.schema() for t, p in batch.plans.items()}
    op_column = batch.changes.op_column if batch.changes is not None else None
    keys = {t: job.key for t, job in batch.jobs.items()}
    return refuse_required_nulls(df, schemas, op_column, batch.route_column, keys)


#: error_class of a row holding null in a column its table requires.
REQUIRED_NULL_CLASS = "RequiredColumnNullError"


def without_reject(struct: T.StructType) -> T.StructType:
    """``struct`` without the sink's own columns (vocab/columns.py ``MARK_COLUMNS``: the refusal, the
    unavailable-columns marker of sources/toast.py, a Debezium event's source): none is ever stored in a table."""
    if not any(c in struct.fieldNames() for c in MARK_COLUMNS):
        return struct
    return T.StructType([f for f in struct.fields if f.name not in MARK_COLUMNS])


def enforce(df: DataFrame, dead_letter: bool) -> DataFrame:
    """The one enforcement point, right before the writers: fail-fast without a dead-letter table
    (the refusal column is dropped), else the refusal column stays for the writer tasks to split on."""
    if not dead_letter:
        return fail_on_reject(df)
    return df


def refuse_required_nulls(
    df: DataFrame,
    tables: Mapping[str, Schema],
    op_column: str | None,
    route_column: str | None = None,
    keys: Mapping[str, Collection[str]] | None = None,
) -> DataFrame:
    """Mark the rows holding null in a top-level column their table requires (a delete needs its
    key only, a truncate nothing; a null key is the change rules' refusal). With a dead-letter table such a row is
    refused alone instead of failing its whole batch in the writer (writer/conform.py). Checked in
    Spark before changes are reduced, so an older change of the key in the batch still applies.
    ``tables``: each table's schema by name; ``route_column``: a routed sink's table column;
    ``keys``: each table's upsert/CDC key columns, refused for a null by the change rules like its
    identifier fields (a table created without identifier fields still requires its key)."""
    present = columns_of(df)
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, schema in sorted(tables.items()):
        key = set(schema.identifier_field_ids)
        key_names = set((keys or {}).get(name, ()))
        required = tuple(
            f.name
            for f in schema.fields
            if f.required and f.field_id not in key and f.name not in key_names and f.name in present
        )
        if required:
            groups.setdefault(required, []).append(name)
    if not groups:
        return df
    table = F.col(route_column) if route_column is not None else F.lit(next(iter(tables)))
    reason: Column | None = None
    for required, names in groups.items():
        for column in required:
            found = named(column).isNull()
            if route_column is not None:
                found = found & F.col(route_column).isin(*names)
            text = F.concat(F.lit(f"column {column!r} is required (not null) in table "), table, F.lit(" but is null"))
            here = F.when(found, text)
            reason = here if reason is None else F.coalesce(reason, here)
    assert reason is not None
    if op_column is not None and op_column in present:
        op = named(op_column).cast("string")
        reason = F.when(~F.coalesce(op.isin(*DELETE_CODES, *TRUNCATE_CODES), F.lit(False)), reason)
    raw = F.to_json(
        F.struct(*[named(c) for c in present if c not in (REJECT_COLUMN, route_column)]),
        {"ignoreNullFields": "false"},
    )
    return reject_where(df, reason, REQUIRED_NULL_CLASS, raw)


def refuse_routed_to(df: DataFrame, route_column: str, dead_letter: str) -> DataFrame:
    """A routed sink's rows naming the dead-letter table itself are refused: they go to it as
    refused rows, never appended to it as data."""
    name = F.col(route_column)
    reason = F.when(
        F.lower(name) == F.lit(dead_letter.lower()),
        F.lit(f"rows may not be routed to the dead-letter table {dead_letter}"),
    )
    raw = F.to_json(
        F.struct(*[named(c) for c in columns_of(df) if c not in (REJECT_COLUMN, route_column)]),
        {"ignoreNullFields": "false"},
    )
    return reject_where(df, reason, "DeadLetterRouteError", raw, source_table=name)
