"""Stage 4 of a micro-batch's road (road.py): rows to writer tasks (the pre-write topology).

One table: its distribution mode (``none`` / ``hash`` / ``range``, topology/distribution.py), by its
partition and sort order. A routed batch: by (table, partition), ``hash`` unless the builder set
another mode. Appends that Spark's own Parquet writer takes (writer/jvm.py) are left as they are:
that writer distributes them itself.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from iceberg_sink.job import codegen
from iceberg_sink.job.parallelism import SHUFFLE_PARTITIONS
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.topology.distribution import distribute as distribute_table
from iceberg_sink.topology.distribution import distribute_routed
from iceberg_sink.vocab.distribution import DistributionMode


def distribute(df: DataFrame, batch: BatchPlan) -> DataFrame:
    """``df`` distributed to the writer tasks of ``batch``."""
    if batch.route_column is not None:
        mode = DistributionMode(batch.distribution_mode) if batch.distribution_mode else DistributionMode.HASH
        tables = {t: (p.table.spec(), p.table.schema()) for t, p in batch.rows_of().items()}
        return distribute_routed(df, batch.route_column, tables, mode, one_task=_one_task(df))
    plan = next(iter(batch.to_write().values()), None)
    if plan is None or batch.jvm_appends(df):
        return df  # nothing of the table is written (the dead-letter table's rows are), or the JVM distributes
    if batch.reduced_in_writers:
        return df  # its writer tasks reduce it where it is (job/reduction.py chose a distribution that moves nothing)
    sort = [c for c in plan.sort_columns if c]
    return distribute_table(
        df, plan.mode, plan.table.spec(), plan.table.schema(), sort_columns=sort, one_task=_one_task(df)
    )


def _one_task(df: DataFrame) -> bool:
    """Whether a small batch (codegen.py) shuffles into one partition (job/parallelism.py chose one, or
    the session's setting is 1): its rows then reach their one writer task without a shuffle. A
    larger batch keeps the shuffle, so the work before it keeps its own tasks."""
    return codegen.active() and str(df.sparkSession.conf.get(SHUFFLE_PARTITIONS)).strip() == "1"
