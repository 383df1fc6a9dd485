"""Appends written by Spark's own (JVM) Parquet writer, where that is provably the same table data.

The Arrow path (``writer/spark.py``) moves every row from the JVM to a Python worker and back out
through PyArrow's writer. For plain appends Spark can write the same Parquet files itself:

- columns are projected to the table's schema, in order, each carrying its Iceberg field id as
  ``parquet.field.id`` metadata (``spark.sql.parquet.fieldId.write.enabled``); timestamps are written
  as ``TIMESTAMP_MICROS`` (never INT96) and dates/timestamps without rebasing (proleptic Gregorian);
- Iceberg partition values are computed as Spark expressions (:func:`partition_columns`: day/hour/
  month/year as whole units from the epoch, truncate with ``pmod``, and bucket as Iceberg's
  murmur3_x86_32 with seed 0 over the 8-byte little-endian long, in 32-bit arithmetic on longs,
  see :func:`iceberg_bucket`) and handed to ``partitionBy``;
- each write goes to a new folder ``<location>/data/iceberg-sink-<job>-<checkpoint>-<uuid>``. Spark's
  commit protocol (FileOutputCommitter, algorithm 1) moves only the output of the one committed
  attempt of each task into it when the job commits, so files of failed or speculative attempts are
  never listed; a crashed write leaves a folder no committable names, and its re-run uses a new
  folder. Only after the Spark job succeeded is the folder listed;
- the driver reads each file's footer: field ids and physical types are checked (a mismatch fails
  the checkpoint before anything is committed), and Iceberg metrics come from it
  (``_iceberg.metrics.footer_metrics``: no float bounds or NaN counts, nothing it cannot prove).

Anything else falls back to the Arrow path (:func:`unsupported`): CDC/upsert, non-local
locations, custom data paths, nested or required columns, types or transforms not listed above,
input columns that need more than a widening cast, range distribution, other codecs.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
from pyiceberg.partitioning import PartitionField
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
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from iceberg_sink._iceberg.metrics import footer_metrics
from iceberg_sink._spark_schema import columns_of, schema_of
from iceberg_sink._sql import named, valid_utf8
from iceberg_sink.vocab.columns import ERROR_MARKER
from iceberg_sink.vocab.distribution import DistributionMode
from iceberg_sink.vocab.files import DataFileMeta, FileContent
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spec import WriterSpec

logger = logging.getLogger(__name__)

FIELD_ID_KEY = "parquet.field.id"
_PARTITION_PREFIX = "__iceberg_p"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_CODECS = {"zstd": "zstd", "snappy": "snappy", "gzip": "gzip", "uncompressed": "none", "none": "none"}
# Session settings for the write; the previous values are restored afterwards.
_SESSION_CONF = {
    "spark.sql.parquet.fieldId.write.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.writeLegacyFormat": "false",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    "spark.sql.files.maxRecordsPerFile": "0",
}
_M32 = 0xFFFFFFFF


def _spark_type(t: IcebergType) -> str | None:
    """Spark's simpleString of the type Spark writes for Iceberg type ``t``, or None if not supported."""
    if isinstance(t, BooleanType):
        return "boolean"
    if isinstance(t, IntegerType):
        return "int"
    if isinstance(t, LongType):
        return "bigint"
    if isinstance(t, FloatType):
        return "float"
    if isinstance(t, DoubleType):
        return "double"
    if isinstance(t, DateType):
        return "date"
    if isinstance(t, TimestamptzType):
        return "timestamp"
    if isinstance(t, TimestampType):
        return "timestamp_ntz"
    if isinstance(t, StringType):
        return "string"
    if isinstance(t, BinaryType):
        return "binary"
    if isinstance(t, DecimalType):
        return f"decimal({t.precision},{t.scale})"
    return None


# Input type -> table type Spark casts exactly (the widenings Iceberg allows).
_WIDENINGS = {("int", "bigint"), ("float", "double")}


def _local_dir(location: str) -> str | None:
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "" and location.startswith("/"):
        return location
    return None


def unsupported(spec: WriterSpec, input_schema: StructType, mode: DistributionMode) -> str | None:
    """Why ``spec`` cannot be written by Spark's Parquet writer, or None if it can."""
    if spec.op_column is not None or spec.equality_field_ids:
        return "upsert/CDC writes equality deletes"
    if _local_dir(spec.location) is None:
        return f"location {spec.location!r} is not a local path"
    props = spec.properties
    if props.get("write.format.default", "parquet").lower() != "parquet":
        return "the table's file format is not Parquet"
    for key in ("write.data.path", "write.object-storage.path", "write.folder-storage.path"):
        if props.get(key):
            return f"table property {key} is set"
    if props.get("write.object-storage.enabled", "false").lower() == "true":
        return "object storage layout is enabled"
    if spec.compression not in _CODECS:
        return f"codec {spec.compression}"
    if spec.compression_level >= 0 and spec.compression != "zstd":
        return "a compression level for a codec other than zstd"
    if mode is DistributionMode.RANGE:
        return "range distribution"
    schema = spec.schema
    for field in schema.fields:
        if field.required:
            return f"column {field.name} is required"
        if not isinstance(field.field_type, PrimitiveType) or _spark_type(field.field_type) is None:
            return f"column {field.name} has type {field.field_type}"
    table_types = {f.name: _spark_type(f.field_type) for f in schema.fields}
    for f in input_schema.fields:
        target = table_types.get(f.name)
        source = f.dataType.simpleString()
        if target is None:
            return f"input column {f.name} is not a table column"
        if source != target and (source, target) not in _WIDENINGS:
            return f"input column {f.name} is {source}, the table's is {target}"
    present = set(input_schema.fieldNames())
    for field in schema.fields:
        if field.name not in present and field.write_default is not None:
            # Defaults are filled in one place, the Arrow writers' conform step (writer/conform.py).
            return f"column {field.name} is not in the input and takes its write-default"
    for partition_field in spec.partition_spec.fields:
        if _partition_expression(partition_field, schema) is None:
            return f"partition field {partition_field.name} ({partition_field.transform})"
    return None


# -- partition values as Spark expressions ---------------------------------------------------------


class _Steps:
    """Adds intermediate columns one expression at a time, so no expression is inlined twice."""

    def __init__(self, df: DataFrame, prefix: str) -> None:
        self.df = df
        self._prefix = prefix
        self._n = 0
        self.names: list[str] = []

    def add(self, expr: Column) -> Column:
        name = f"{self._prefix}_{self._n}"
        self._n += 1
        self.df = self.df.withColumn(name, expr)
        self.names.append(name)
        return F.col(name)


def _mul32(x: Column, c: int) -> Column:
    """``x * c mod 2**32`` for ``0 <= x < 2**32``, without a 64-bit overflow (ANSI mode raises on one)."""
    low = x * F.lit(c & 0xFFFF)
    high = F.shiftleft((x * F.lit(c >> 16)).bitwiseAND(F.lit(0xFFFF)), 16)
    return (low + high).bitwiseAND(F.lit(_M32))


def _rotl32(x: Column, r: int) -> Column:
    return F.shiftleft(x, r).bitwiseOR(F.shiftright(x, 32 - r)).bitwiseAND(F.lit(_M32))


def iceberg_bucket(steps: _Steps, value: Column, num_buckets: int) -> Column:
    """Iceberg's bucket of a long ``value``: ``(murmur3_x86_32(8-byte LE, seed 0) & MAX_INT) % N``.

    Guava's ``hashLong`` (Iceberg) and Spark's ``Murmur3_x86_32.hashLong`` mix the low then the high
    32 bits; here in long arithmetic on unsigned 32-bit values, one step per column.
    """
    c1, c2 = 0xCC9E2D51, 0x1B873593
    v = steps.add(value.cast("bigint"))
    h: Column | None = None
    for half in (v.bitwiseAND(F.lit(_M32)), F.shiftright(v, 32).bitwiseAND(F.lit(_M32))):
        k = steps.add(_mul32(steps.add(half), c1))
        k = steps.add(_rotl32(k, 15))
        k = steps.add(_mul32(k, c2))
        x = k if h is None else steps.add(h.bitwiseXOR(k))
        x = steps.add(_rotl32(x, 13))
        h = steps.add((x * F.lit(5) + F.lit(0xE6546B64)).bitwiseAND(F.lit(_M32)))
    assert h is not None
    h = steps.add(h.bitwiseXOR(F.lit(8)))
    h = steps.add(h.bitwiseXOR(F.shiftright(h, 16)))
    h = steps.add(_mul32(h, 0x85EBCA6B))
    h = steps.add(h.bitwiseXOR(F.shiftright(h, 13)))
    h = steps.add(_mul32(h, 0xC2B2AE35))
    h = steps.add(h.bitwiseXOR(F.shiftright(h, 16)))
    return (h.bitwiseAND(F.lit(0x7FFFFFFF)) % F.lit(num_buckets)).cast("int")


def _floor_div(steps: _Steps, value: Column, divisor: int) -> Column:
    """``floor(value / divisor)`` in exact long arithmetic (no double rounding near a boundary)."""
    steps.add(value.cast("bigint"))
    name = steps.names[-1]
    return F.expr(f"(`{name}` - pmod(`{name}`, {divisor})) div {divisor}")


def _partition_expression(field: PartitionField, schema: Schema) -> Any:
    """A function building the partition value of ``field`` as a Spark column, or None if unsupported."""
    source = schema.find_field(field.source_id)
    t, transform = source.field_type, field.transform
    name = source.name

    def col() -> Column:
        return named(name)

    is_ts = isinstance(t, TimestamptzType)
    is_date = isinstance(t, DateType)
    is_int = isinstance(t, IntegerType | LongType)
    if isinstance(transform, IdentityTransform) and (is_int or is_date):
        return lambda steps: F.unix_date(col()) if is_date else col()
    if isinstance(transform, TruncateTransform) and is_int:
        width = transform.width
        return lambda steps: col() - F.pmod(col(), F.lit(width).cast(_spark_type(t) or "bigint"))
    if isinstance(transform, BucketTransform) and (is_int or is_date or is_ts):
        n = transform.num_buckets

        def bucket(steps: _Steps) -> Column:
            value = F.unix_date(col()) if is_date else F.unix_micros(col()) if is_ts else col()
            return iceberg_bucket(steps, value, n)

        return bucket
    if isinstance(transform, HourTransform) and is_ts:
        return lambda steps: _floor_div(steps, F.unix_micros(col()), 3_600_000_000).cast("int")
    if isinstance(transform, DayTransform | MonthTransform | YearTransform) and (is_ts or is_date):

        def days(steps: _Steps) -> Column:
            return (
                F.unix_date(col()) if is_date else _floor_div(steps, F.unix_micros(col()), 86_400_000_000).cast("int")
            )

        if isinstance(transform, DayTransform):
            return days

        def months_or_years(steps: _Steps) -> Column:
            date = F.date_from_unix_date(steps.add(days(steps)))
            if isinstance(transform, YearTransform):
                return (F.year(date) - F.lit(1970)).cast("int")
            return ((F.year(date) - F.lit(1970)) * F.lit(12) + F.month(date) - F.lit(1)).cast("int")

        return months_or_years
    return None


def partition_columns(df: DataFrame, spec: WriterSpec) -> tuple[DataFrame, list[str]]:
    """``df`` with one int/long column per partition field holding Iceberg's partition value."""
    names = []
    for i, field in enumerate(spec.partition_spec.fields):
        build = _partition_expression(field, spec.schema)
        assert build is not None
        steps = _Steps(df, f"__iceberg_t{i}")
        value = build(steps)
        name = f"{_PARTITION_PREFIX}{i}"
        df = steps.df.withColumn(name, value).drop(*steps.names)
        names.append(name)
    return df, names


# -- the write -------------------------------------------------------------------------------------


@contextmanager
def _session_conf(spark: SparkSession, values: dict[str, str]) -> Iterator[None]:
    previous: dict[str, str | None] = {k: spark.conf.get(k, None) for k in values}
    for k, v in values.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in previous.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def _project(df: DataFrame, schema: Schema) -> DataFrame:
    """``df`` as the table's columns, in order, with their field ids; a string that is not valid
    UTF-8 fails the job with an ERROR_MARKER message (reported as InvalidInputError naming the
    column, as the Arrow writers' check does: writer/conform.check_utf8)."""
    present = set(columns_of(df))
    version = df.sparkSession.version
    columns = []
    for field in schema.fields:
        spark_type = _spark_type(field.field_type)
        assert spark_type is not None
        value = named(field.name).cast(spark_type) if field.name in present else F.lit(None).cast(spark_type)
        if spark_type == "string" and field.name in present:
            message = f"{ERROR_MARKER} column {field.name!r} holds a string that is not valid UTF-8"
            value = F.when(~valid_utf8(field.name, version), F.raise_error(F.lit(message))).otherwise(value)
        columns.append(value.alias(field.name, metadata={FIELD_ID_KEY: field.field_id}))
    return df.select(*columns)


def _partition_value(segment: str, prefix: str) -> int | None:
    if not segment.startswith(prefix + "="):
        raise RuntimeError(f"unexpected partition folder {segment!r}; expected {prefix}=<value>")
    text = segment[len(prefix) + 1 :]
    return None if text == _HIVE_NULL else int(text)


def _list_files(root: str, partitions: int) -> list[tuple[str, tuple[int | None, ...]]]:
    found = []
    for directory, dirs, files in os.walk(root):
        # Only partition folders: never Spark's _temporary (uncommitted task attempts) or hidden ones.
        dirs[:] = [d for d in dirs if d.startswith(_PARTITION_PREFIX)]
        relative = os.path.relpath(directory, root)
        segments = [] if relative == "." else relative.split(os.sep)
        for name in files:
            if name.startswith(("_", ".")) or not name.endswith(".parquet"):
                continue
            if len(segments) != partitions:
                raise RuntimeError(f"file {name} in {directory} is not at partition depth {partitions}")
            values = tuple(_partition_value(s, f"{_PARTITION_PREFIX}{i}") for i, s in enumerate(segments))
            found.append((os.path.join(relative, name) if segments else name, values))
    return sorted(found)


def _file_meta(
    spec: WriterSpec, local_root: str, uri_root: str, relative: str, partition: tuple[Any, ...]
) -> DataFileMeta | None:
    local = os.path.join(local_root, relative)
    metadata = pq.read_metadata(local)
    arrow_schema = metadata.schema.to_arrow_schema()
    for field in spec.schema.fields:
        got = arrow_schema.field(field.name) if field.name in arrow_schema.names else None
        field_id = (got.metadata or {}).get(b"PARQUET:field_id") if got is not None else None
        if field_id is None or int(field_id) != field.field_id:
            raise RuntimeError(
                f"{local}: column {field.name} has Parquet field id {field_id!r}, expected {field.field_id}"
            )
    for i in range(metadata.num_columns):
        column = metadata.schema.column(i)
        field = spec.schema.find_field(column.path)
        if isinstance(field.field_type, TimestampType | TimestamptzType) and column.physical_type != "INT64":
            raise RuntimeError(f"{local}: timestamp column {column.path} is {column.physical_type}, expected INT64")
    if metadata.num_rows == 0:
        return None
    metrics = footer_metrics(metadata, spec.schema, spec.properties)
    return DataFileMeta(
        content=FileContent.DATA,
        path=f"{uri_root}/{relative.replace(os.sep, '/')}",
        spec_id=spec.partition_spec.spec_id,
        partition=partition,
        record_count=metadata.num_rows,
        file_size_in_bytes=os.path.getsize(local),
        column_sizes=metrics["column_sizes"],
        value_counts=metrics["value_counts"],
        null_value_counts=metrics["null_value_counts"],
        nan_value_counts=metrics["nan_value_counts"],
        lower_bounds=metrics["lower_bounds"],
        upper_bounds=metrics["upper_bounds"],
        split_offsets=metrics["split_offsets"],
    )


def write_appends(df: DataFrame, spec: WriterSpec, mode: DistributionMode) -> list[WriteResult] | None:
    """Write ``df`` with Spark's Parquet writer; None (nothing written) when :func:`unsupported` says no."""
    reason = unsupported(spec, schema_of(df), mode)
    if reason is not None:
        logger.debug("appends of %s use the Arrow writer: %s", spec.table_name, reason)
        return None
    local_data = _local_dir(spec.location)
    assert local_data is not None
    folder = f"iceberg-sink-{spec.job_id}-{spec.checkpoint_id:06d}-{uuid.uuid4().hex}"
    uri_root = f"{spec.location.rstrip('/')}/data/{folder}"
    local_root = os.path.join(local_data, "data", folder)
    out, partition_names = partition_columns(_project(df, spec.schema), spec)
    if mode is DistributionMode.HASH and partition_names:
        out = out.repartition(*[F.col(n) for n in partition_names])
    writer = (
        out.write.mode("errorifexists")
        .option("compression", _CODECS[spec.compression])
        .option("mapreduce.fileoutputcommitter.algorithm.version", "1")
        .option("parquet.block.row.count.limit", str(spec.row_group_limit))
    )
    if spec.compression_level >= 0:
        writer = writer.option("parquet.compression.codec.zstd.level", str(spec.compression_level))
    row_group_bytes = spec.properties.get("write.parquet.row-group-size-bytes")
    if row_group_bytes:
        writer = writer.option("parquet.block.size", row_group_bytes)
    if partition_names:
        writer = writer.partitionBy(*partition_names)
    with _session_conf(df.sparkSession, _SESSION_CONF):
        writer.parquet(uri_root)
    files = _list_files(local_root, len(partition_names))
    with ThreadPoolExecutor(max_workers=8) as pool:
        metas = list(pool.map(lambda f: _file_meta(spec, local_root, uri_root, f[0], f[1]), files))
    data_files = tuple(m for m in metas if m is not None)
    return [WriteResult(data_files=data_files)] if data_files else []
