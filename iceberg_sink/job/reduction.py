"""Stage 3 of a micro-batch's road (road.py): one row per changed key, complete.

Upserts and CDC: each table's changes are reduced to the last change of each key
(topology/changes.py), each table by its own key; tables sharing a key (a routed stream with one
key) are reduced together, in one pass. Then the values of unchanged TOASTed columns are taken from
the stored rows (topology/toast.py). Appends pass through.
"""

from __future__ import annotations

from functools import reduce as fold

import attrs
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iceberg_sink._spark_schema import columns_of
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.topology import toast
from iceberg_sink.topology.changes import reduce_changes


def reduce(df: DataFrame, batch: BatchPlan) -> DataFrame:
    """``df`` reduced to one row per changed key of each table, TOASTed values filled in; a routed
    batch with a dead-letter table keeps the rows of no table it writes (refused rows)."""
    return toast.resolve(_last_changes(df, batch), batch.stored_tables(), batch.route_column)


def _last_changes(df: DataFrame, batch: BatchPlan) -> DataFrame:
    changes = batch.changes
    if changes is None:
        return df
    tables = batch.rows_of()
    one_task = batch.sizes.single_task_max_bytes
    route = batch.route_column
    if route is None:  # one table
        if not batch.plans:
            return df  # no table yet and refused rows only: for the dead-letter table as they are
        (table,) = batch.plans
        key = batch.jobs[table].key
        return reduce_changes(df, attrs.evolve(changes, key=key), single_task_max_bytes=one_task)
    by_key: dict[tuple[str, ...], list[str]] = {}
    for table in sorted(tables):
        by_key.setdefault(batch.jobs[table].key, []).append(table)
    if not by_key:
        return df  # no table's rows: every row was refused, for the dead-letter table as it is
    if len(by_key) == 1:
        key = next(iter(by_key))
        return reduce_changes(df, attrs.evolve(changes, key=key), scope=[route], single_task_max_bytes=one_task)
    parts = [
        reduce_changes(
            df.where(F.col(route).isin(*group)),
            attrs.evolve(changes, key=key),
            scope=[route],
            single_task_max_bytes=one_task,
        )
        for key, group in sorted(by_key.items())
    ]
    if batch.dead is not None:
        rest = df.where(~F.coalesce(F.col(route).isin(*sorted(tables)), F.lit(False)))
        parts.append(rest.drop(*[c for c in columns_of(rest) if c not in columns_of(parts[0])]))
    return fold(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
