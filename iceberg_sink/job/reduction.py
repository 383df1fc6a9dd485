"""Stage 3 of a micro-batch's road (road.py): one row per changed key, complete.

Upserts and CDC: each table's changes are reduced to the last change of each key
(topology/changes.py), each table by its own key; tables sharing a key (a routed stream with one
key) are reduced together, in one pass. Then the values of unchanged TOASTed columns are taken from
the stored rows (topology/toast.py). Appends pass through.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import reduce as fold

import attrs
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iceberg_sink._spark_schema import columns_of, schema_of
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.topology import toast
from iceberg_sink.topology.changes import reduce_changes, reducible_in_writers
from iceberg_sink.topology.estimate import counted_records
from iceberg_sink.vocab.distribution import DistributionMode

#: Sink jobs (by job id) a batch of which had one key's changes in two writer tasks: their batches are
#: reduced in Spark from then on (at most this many remembered, the oldest forgotten first).
MAX_CROSSED_JOBS = 1024
_CROSSED: OrderedDict[str, None] = OrderedDict()


def reduce(df: DataFrame, batch: BatchPlan) -> DataFrame:
    """``df`` reduced to one row per changed key of each table, TOASTed values filled in; a routed
    batch with a dead-letter table keeps the rows of no table it writes (refused rows)."""
    batch.reduced_in_writers = False
    return toast.resolve(_last_changes(df, batch), batch.stored_tables(), batch.route_column)


def _last_changes(df: DataFrame, batch: BatchPlan) -> DataFrame:
    changes = batch.changes
    if changes is None:
        return df
    tables = batch.rows_of()
    one_task = batch.sizes.single_task_max_bytes
    route = batch.route_column
    raw_kept = batch.dead is not None  # a refused row's raw value is for the dead-letter table
    if route is None:  # one table
        if not batch.plans:
            return df  # no table yet and refused rows only: for the dead-letter table as they are
        (table,) = batch.plans
        keyed = attrs.evolve(changes, key=batch.jobs[table].key)
        batch.reduced_in_writers = in_writers(batch) and reducible_in_writers(schema_of(df), keyed)
        return reduce_changes(
            df, keyed, single_task_max_bytes=one_task, in_writers=batch.reduced_in_writers, raw_kept=raw_kept
        )
    by_key: dict[tuple[str, ...], list[str]] = {}
    for table in sorted(tables):
        by_key.setdefault(batch.jobs[table].key, []).append(table)
    if not by_key:
        return df  # no table's rows: every row was refused, for the dead-letter table as it is
    if len(by_key) == 1:
        key = next(iter(by_key))
        return reduce_changes(
            df, attrs.evolve(changes, key=key), scope=[route], single_task_max_bytes=one_task, raw_kept=raw_kept
        )
    parts = [
        reduce_changes(
            df.where(F.col(route).isin(*group)),
            attrs.evolve(changes, key=key),
            scope=[route],
            single_task_max_bytes=one_task,
            raw_kept=raw_kept,
        )
        for key, group in sorted(by_key.items())
    ]
    if batch.dead is not None:
        rest = df.where(~F.coalesce(F.col(route).isin(*sorted(tables)), F.lit(False)))
        parts.append(rest.drop(*[c for c in columns_of(rest) if c not in columns_of(parts[0])]))
    return fold(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)


def in_writers(batch: BatchPlan) -> bool:
    """Whether ``batch``'s changes are to be reduced in its writer tasks, one per Spark partition of the
    input, without a shuffle (writer/key_runs.py): ``iceberg-sink.changes.reduce-in-writers`` says so
    (``auto``: a stream's micro-batch of Kafka alone, whose messages are keyed by the row's key; ``always``),
    the batch writes one table without a dead-letter table, the table's distribution moves no rows,
    and no batch of the sink job had a key's changes in two tasks (:func:`keys_crossed`). The batch's
    schema may still say no (topology/changes.py ``reducible_in_writers``): :func:`reduce` records the
    answer in ``batch.reduced_in_writers``, which the distribution, the write and the road follow."""
    choice = batch.sizes.reduce_in_writers
    if choice == "never" or (choice == "auto" and counted_records() is None):
        return False
    if batch.route_column is not None or batch.dead is not None or batch.job_id in _CROSSED:
        return False
    plans = list(batch.to_write().values())
    if len(plans) != 1:
        return False
    (plan,) = plans
    if plan.mode is DistributionMode.NONE:
        return True
    # hash clusters by partition only (the key's writer is the point of reducing in them); range sorts
    return not plan.table.spec().fields and (plan.mode is DistributionMode.HASH or not plan.sort_columns)


def keys_crossed(job_id: str) -> None:
    """Remember that a batch of ``job_id`` had a key's changes in two writer tasks: its input is not
    partitioned by the key, so its later batches are reduced in Spark."""
    _CROSSED[job_id] = None
    _CROSSED.move_to_end(job_id)
    while len(_CROSSED) > MAX_CROSSED_JOBS:
        _CROSSED.popitem(last=False)
