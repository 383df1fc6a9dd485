"""Pre-write topology: how rows are distributed to writer tasks before writing.

- ``none``: rows stay where they are; every task may write a file per partition it sees.
- ``hash``: rows are shuffled by their Iceberg partition value, so one task writes each partition.
- ``range``: rows are range-partitioned and sorted by partition value and sort columns, giving
  clustered, sorted files.

Spark has no Iceberg transforms, so each transform is rewritten as a Spark expression that is
constant within one Iceberg partition (day and hour in UTC for ``timestamptz`` as Iceberg does).
Bucket uses Iceberg's murmur3 through a vectorised UDF, since Spark's ``hash`` differs from it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from functools import reduce

import pandas as pd
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iceberg_sink._spark_schema import columns_of
from iceberg_sink._sql import path_column
from iceberg_sink.vocab.distribution import DistributionMode
from iceberg_sink.writer.task_start import task_start

_EXACT_BUCKET_TYPES = (IntegerType, LongType, StringType, BinaryType, DecimalType, DateType)


def _bucket_udf(num_buckets: int, source_type: IcebergType) -> object:
    arrow_type = schema_to_pyarrow(source_type, include_field_ids=False)

    @F.pandas_udf("int")  # type: ignore[attr-defined, untyped-decorator, misc]
    def iceberg_bucket(values: pd.Series) -> pd.Series:
        task_start()
        # Built inside the task: the transform wraps a native function that cannot be pickled.
        transform = BucketTransform(num_buckets).pyarrow_transform(source_type)
        array = pa.Array.from_pandas(values, type=arrow_type)
        return transform(array).to_pandas()

    return iceberg_bucket


def _utc_micros(column: Column, source_type: IcebergType) -> Column:
    if isinstance(source_type, TimestampType):
        # Wall-clock time: read the local fields as if they were UTC, as Iceberg does.
        return F.unix_micros(F.to_utc_timestamp(column.cast("timestamp"), F.current_timezone()))
    return F.unix_micros(column)


def _days(column: Column, source_type: IcebergType) -> Column:
    if isinstance(source_type, DateType):
        return F.unix_date(column)
    return F.floor(_utc_micros(column, source_type) / F.lit(86_400_000_000))


def transform_expression(spec_field_transform: object, column: Column, source_type: IcebergType) -> Column:
    """A Spark expression whose value is a function of the Iceberg partition value."""
    t = spec_field_transform
    if isinstance(t, IdentityTransform):
        return column
    if isinstance(t, HourTransform):
        return F.floor(_utc_micros(column, source_type) / F.lit(3_600_000_000))
    if isinstance(t, DayTransform):
        return _days(column, source_type)
    if isinstance(t, MonthTransform | YearTransform):
        date = F.date_from_unix_date(_days(column, source_type).cast("int"))
        if isinstance(t, YearTransform):
            return F.year(date)
        return F.year(date) * F.lit(12) + F.month(date)
    if isinstance(t, TruncateTransform):
        if isinstance(source_type, StringType | BinaryType):
            return F.substring(column, 1, t.width)
        if isinstance(source_type, DecimalType):
            return F.floor(column * F.lit(10**source_type.scale) / F.lit(t.width))
        return F.floor(column / F.lit(t.width))
    if isinstance(t, BucketTransform):
        if isinstance(source_type, _EXACT_BUCKET_TYPES):
            return _bucket_udf(t.num_buckets, source_type)(column)  # type: ignore[operator, no-any-return]
        # Other types: hashing the source keeps rows of one value together (more files, same result).
        return column
    return column


def partition_expressions(spec: PartitionSpec, schema: Schema, present: Collection[str] | None = None) -> list[Column]:
    """Spark expressions of the partition fields; with ``present`` (the DataFrame's columns), fields
    whose source column is missing (an optional column, null in every row) are left out."""
    exprs = []
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        name = schema.find_column_name(field.source_id)
        assert name is not None
        if present is not None and name.split(".")[0] not in present:
            continue
        exprs.append(transform_expression(field.transform, path_column(name), source.field_type))
    return exprs


def distribute(
    df: DataFrame,
    mode: DistributionMode,
    spec: PartitionSpec,
    schema: Schema,
    sort_columns: Sequence[str] = (),
    extra_keys: Sequence[str] = (),
    one_task: bool = False,
) -> DataFrame:
    """Apply ``mode`` to ``df``.

    Args:
        sort_columns: the table's sort order columns (used by ``range``).
        extra_keys: columns every change of one key must share a writer by (CDC keys).
        one_task: the batch is written by one task (:func:`to_writers`).
    """
    present = set(columns_of(df))
    keys = partition_expressions(spec, schema, present) + [path_column(k) for k in extra_keys]
    sort_columns = [c for c in sort_columns if c.split(".")[0] in present]
    if mode is DistributionMode.NONE:
        return df
    if mode is DistributionMode.HASH:
        return to_writers(df, mode, keys, one_task) if keys else df
    ordering = keys + [path_column(c) for c in sort_columns]
    if not ordering:
        return df
    return to_writers(df, mode, ordering, one_task)


def to_writers(df: DataFrame, mode: DistributionMode, keys: Sequence[Column], one_task: bool) -> DataFrame:
    """``df``'s rows clustered by ``keys`` for the writer tasks: ``hash`` gives each key one task,
    ``range`` also sorts by them. With ``one_task`` (a batch whose shuffle has one partition) the rows
    go to that one task without a shuffle, sorted alike for ``range``: the same task and files, one
    Spark stage fewer."""
    if one_task:
        single = df.coalesce(1)
        return single if mode is DistributionMode.HASH else single.sortWithinPartitions(*keys)
    if mode is DistributionMode.HASH:
        return df.repartition(*keys)
    return df.repartitionByRange(*keys).sortWithinPartitions(*keys)


def distribute_routed(
    df: DataFrame,
    route_column: str,
    tables: Mapping[str, tuple[PartitionSpec, Schema]],
    mode: DistributionMode,
    one_task: bool = False,
) -> DataFrame:
    """Cluster a routed batch's rows by (table, partition): ``hash`` gives each (table, partition) to
    one writer task; ``range`` also sorts by them; ``none`` leaves rows. ``tables``: each table's
    spec and schema, by the name ``route_column`` holds; ``one_task``: see :func:`to_writers`."""
    if mode is DistributionMode.NONE:
        return df
    # Tables of one partition layout share one expression; layouts differ only by source
    # columns and transforms, so a stream of many similar tables has one or a few.
    layouts: dict[tuple[tuple[str, str], ...], tuple[list[str], list[Column]]] = {}
    present = set(columns_of(df))
    for table, (spec, schema) in sorted(tables.items()):
        shape = tuple((schema.find_column_name(f.source_id) or "", str(f.transform)) for f in spec.fields)
        if shape not in layouts:
            layouts[shape] = ([], partition_expressions(spec, schema, present))
        layouts[shape][0].append(table)
    keyed = [(names, exprs) for names, exprs in layouts.values() if exprs]
    keys: list[Column] = [F.col(route_column)]
    if len(keyed) == 1 and len(layouts) == 1:
        keys += keyed[0][1]
    elif keyed:
        partition = reduce(
            lambda acc, te: acc.when(F.col(route_column).isin(*te[0]), F.hash(*te[1])),
            keyed[1:],
            F.when(F.col(route_column).isin(*keyed[0][0]), F.hash(*keyed[0][1])),
        ).otherwise(F.lit(0))
        keys.append(partition)
    return to_writers(df, mode, keys, one_task)
