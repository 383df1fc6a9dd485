"""Between stages 3 and 4 of a micro-batch's road (road.py): a wide change batch's value columns packed in one struct.

Spark analyses, optimises and plans every step of a batch's plan over every column it carries, and a
plan wider than ``spark.sql.codegen.maxFields`` (100) is not compiled whole-stage, so each task of each
micro-batch generates the code of every projection again. A 160-column Debezium table spent most of a
steady micro-batch there (docs/benchmarks-debezium-wide.md): the reduction, its refusals and the
distribution never look at the columns they carry, only at the key, the operation, the order and the
partition and sort sources. So a batch with at least ``iceberg-sink.write.packed-columns-min``
columns the road does not name carries them in :data:`PACKED_COLUMN`, one struct, and each writer
task unpacks it (writer/task_writer.py ``unpacked``) before conforming the rows to the table: the
plan is a few columns wide whatever the table's width.

Only where nothing between here and the writers reads a value column: changes (CDC or upserts) of
one table, without a dead-letter table (whose refusal of a required null reads each column) and
without TOAST markers (whose stored values replace columns after the reduction). The columns' order
before packing is kept in the struct's metadata (:data:`PACKED_ORDER`), from which the reduction's
refusals write a refused row's value as they would unpacked (topology/changes.py).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from iceberg_sink import options
from iceberg_sink._spark_schema import columns_of
from iceberg_sink._sql import column, named, parse, string
from iceberg_sink.job.plan import BatchPlan
from iceberg_sink.vocab.columns import PACKED_COLUMN, PACKED_ORDER, UNAVAILABLE_COLUMN

_OURS = "__iceberg_sink"


def pack(df: DataFrame, batch: BatchPlan) -> DataFrame:
    """``df`` with the value columns the road does not name in :data:`PACKED_COLUMN`, when the batch
    qualifies (the module's docstring); else ``df`` itself."""
    changes = batch.changes
    plans = batch.to_write()
    if changes is None or batch.route_column is not None or batch.dead is not None or len(plans) != 1:
        return df
    (plan,) = plans.values()
    minimum = plan.resolved.get(options.PACKED_COLUMNS_MIN)
    columns = columns_of(df)
    if minimum <= 0 or UNAVAILABLE_COLUMN in columns or PACKED_COLUMN in columns:
        return df
    schema = plan.table.schema()
    sources = [schema.find_column_name(f.source_id) for f in plan.table.spec().fields]
    used = [name for name in (*changes.key, changes.op_column, changes.order_by, *plan.sort_columns, *sources) if name]
    # Spark resolves names without case by default, and a dotted name may be a nested field or a
    # column whose name holds the dot: every reading keeps its column out of the struct.
    kept = {n.lower() for name in used for n in (name, name.split(".")[0])}
    packed = [c for c in columns if c.lower() not in kept and not c.startswith(_OURS)]
    if not packed or len(packed) < minimum:
        return df
    struct = parse("named_struct(" + ", ".join(f"{string(c)}, {column(c)}" for c in packed) + ")")
    return df.select(
        *[named(c) for c in columns if c not in packed],
        struct.alias(PACKED_COLUMN, metadata={PACKED_ORDER: columns}),
    )
