"""The task writer on its own: files, partition values, metrics, names — checked against PyIceberg."""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.partitioning import PartitionField, PartitionSpec
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
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from iceberg_sink import InvalidInputError
from iceberg_sink.vocab.files import FileContent
from tests.helpers import write_batches, writer_spec

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "score", DoubleType()),
    NestedField(4, "ts", TimestamptzType()),
    NestedField(5, "day", DateType()),
    NestedField(6, "amount", DecimalType(10, 2)),
    NestedField(7, "blob", BinaryType()),
)
UTC = dt.UTC


def rows(n: int, offset: int = 0) -> pa.Table:
    base = dt.datetime(2024, 12, 31, 22, 0, tzinfo=UTC)
    return pa.table(
        {
            "id": pa.array([offset + i for i in range(n)], pa.int64()),
            "name": [f"name-{i % 7}-{'x' * (i % 40)}" if i % 5 else None for i in range(n)],
            "score": [float("nan") if i % 11 == 0 else i / 3 for i in range(n)],
            "ts": pa.array([base + dt.timedelta(minutes=37 * i) for i in range(n)], pa.timestamp("us", tz="UTC")),
            "day": [dt.date(2023, 1, 1) + dt.timedelta(days=i % 400) for i in range(n)],
            "amount": [Decimal(i) / 4 for i in range(n)],
            "blob": [bytes([i % 256]) * (i % 3) for i in range(n)],
        },
    )


def make_table(catalog: Catalog, name: str, spec: PartitionSpec, props: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    catalog.create_namespace_if_not_exists("db")
    return catalog.create_table(f"db.{name}", schema=SCHEMA, partition_spec=spec, properties=props or {})


ALL_TRANSFORMS = PartitionSpec(
    PartitionField(4, 1000, DayTransform(), "ts_day"),
    PartitionField(1, 1001, BucketTransform(5), "id_bucket"),
    PartitionField(2, 1002, TruncateTransform(6), "name_trunc"),
    PartitionField(5, 1003, MonthTransform(), "day_month"),
    PartitionField(4, 1004, YearTransform(), "ts_year"),
    PartitionField(4, 1005, HourTransform(), "ts_hour"),
    PartitionField(6, 1006, TruncateTransform(10), "amount_trunc"),
    PartitionField(7, 1007, IdentityTransform(), "blob"),
)


def test_partition_values_equal_pyiceberg_transforms(catalog: Catalog) -> None:
    table = make_table(catalog, "parts", ALL_TRANSFORMS)
    data = rows(300)
    result = write_batches(writer_spec(table), data.slice(0, 120), data.slice(120))
    assert sum(f.record_count for f in result.data_files) == 300
    fields = ALL_TRANSFORMS.fields
    for meta in result.data_files:
        written = pq.read_table(meta.path.removeprefix("file://"))
        assert written.num_rows == meta.record_count
        for row in written.to_pylist():
            expected = tuple(
                f.transform.transform(SCHEMA.find_field(f.source_id).field_type)(
                    _internal(row[SCHEMA.find_field(f.source_id).name])
                )
                for f in fields
            )
            assert expected == meta.partition, row


def _internal(value: object) -> object:
    """PyIceberg's Python transforms take Iceberg's internal representation."""
    if isinstance(value, dt.datetime):
        return int((value - dt.datetime(1970, 1, 1, tzinfo=UTC)) / dt.timedelta(microseconds=1))
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days
    return value


def test_metrics_match_the_data(catalog: Catalog) -> None:
    table = make_table(catalog, "metrics", PartitionSpec())
    data = rows(200)
    result = write_batches(writer_spec(table), data)
    (meta,) = result.data_files
    assert meta.content == FileContent.DATA
    assert meta.record_count == 200
    value_counts, nulls, nans = dict(meta.value_counts), dict(meta.null_value_counts), dict(meta.nan_value_counts)
    lower, upper = dict(meta.lower_bounds), dict(meta.upper_bounds)
    assert value_counts[1] == 200 and nulls[1] == 0
    assert nulls[2] == sum(1 for v in data["name"].to_pylist() if v is None)
    assert nans[3] == sum(1 for v in data["score"].to_pylist() if math.isnan(v))
    scores = [v for v in data["score"].to_pylist() if not math.isnan(v)]
    assert from_bytes(DoubleType(), lower[3]) == min(scores)
    assert from_bytes(DoubleType(), upper[3]) == max(scores)
    assert from_bytes(LongType(), lower[1]) == 0 and from_bytes(LongType(), upper[1]) == 199
    # Strings: 16 characters by default (write.metadata.metrics.default = truncate(16)), upper rounded up.
    names = sorted(v for v in data["name"].to_pylist() if v is not None)
    assert from_bytes(StringType(), lower[2]) == names[0][:16]
    assert from_bytes(StringType(), upper[2]) >= names[-1][:16]
    assert len(from_bytes(StringType(), upper[2])) <= 16
    assert from_bytes(DecimalType(10, 2), upper[6]) == Decimal("49.75")
    assert meta.file_size_in_bytes == Path(meta.path.removeprefix("file://")).stat().st_size
    assert meta.split_offsets and meta.split_offsets[0] == 4


def test_metrics_modes_from_properties(catalog: Catalog) -> None:
    table = make_table(
        catalog,
        "modes",
        PartitionSpec(),
        {"write.metadata.metrics.column.name": "none", "write.metadata.metrics.column.score": "counts"},
    )
    (meta,) = write_batches(writer_spec(table), rows(50)).data_files
    assert 2 not in dict(meta.value_counts) and 2 not in dict(meta.lower_bounds)
    assert 3 in dict(meta.value_counts) and 3 not in dict(meta.lower_bounds)


def test_files_roll_at_target_size(catalog: Catalog) -> None:
    table = make_table(catalog, "roll", PartitionSpec())
    spec = writer_spec(table, target_file_size=20_000, buffer_bytes=10_000, compression="uncompressed")
    result = write_batches(spec, *[rows(500, offset=i * 500) for i in range(8)])
    assert len(result.data_files) > 2
    assert sum(f.record_count for f in result.data_files) == 4000
    assert len({f.path for f in result.data_files}) == len(result.data_files)


def test_file_names_unique_per_job_checkpoint_and_task(catalog: Catalog) -> None:
    table = make_table(catalog, "names", PartitionSpec())
    a = write_batches(writer_spec(table, job_id="jobA", checkpoint_id=3), rows(5), task_id=0)
    b = write_batches(writer_spec(table, job_id="jobA", checkpoint_id=3), rows(5), task_id=0)
    (pa_, pb) = (a.data_files[0].path, b.data_files[0].path)
    assert pa_ != pb
    assert "jobA" in pa_ and "-000003-" in pa_


def test_partition_values_cannot_escape_the_table_location(catalog: Catalog) -> None:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name"))
    table = make_table(catalog, "escape", spec)
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["../../../../tmp/evil", "a/b", "x=y%z"]})
    result = write_batches(writer_spec(table), data)
    data_root = table.location().removeprefix("file://") + "/data/"
    for meta in result.data_files:
        path = Path(meta.path.removeprefix("file://")).resolve()
        assert str(path).startswith(data_root), path
        assert path.parent.parent == Path(data_root)
    assert sorted(f.partition[0] for f in result.data_files) == sorted(data["name"].to_pylist())


def test_null_in_required_column_is_refused(catalog: Catalog) -> None:
    table = make_table(catalog, "required", PartitionSpec())
    bad = pa.table({"id": pa.array([1, None], pa.int64())})
    with pytest.raises(InvalidInputError, match=r"column 'id' is required .* 1 row\(s\)"):
        write_batches(writer_spec(table), bad)


def test_failed_task_deletes_its_files(catalog: Catalog) -> None:
    from iceberg_sink.writer.task_writer import TaskWriter

    table = make_table(catalog, "abort", PartitionSpec())
    spec = writer_spec(table, target_file_size=1, buffer_bytes=1)
    writer = TaskWriter(spec, task_id=0, attempt_id=0)
    writer.write(rows(10))
    writer.write(rows(10))
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert len(list(data_dir.iterdir())) == 2
    writer.abort()
    assert list(data_dir.iterdir()) == []


def _many_partitions(n: int, partitions: int, offset: int = 0) -> pa.Table:
    """``n`` rows whose ``name`` cycles through ``partitions`` values, so every batch touches them all."""
    return pa.table(
        {
            "id": pa.array(range(offset, offset + n), pa.int64()),
            "name": [f"p{(offset + i) % partitions:04d}" for i in range(n)],
            "score": [float(i) for i in range(n)],
        }
    )


def test_open_files_stay_under_the_limit_and_every_row_is_written_once(catalog: Catalog) -> None:
    from iceberg_sink.writer.task_writer import TaskWriter

    table = make_table(catalog, "lru", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    # A one-byte buffer flushes every write: each partition's file is opened at its first row.
    spec = writer_spec(table, max_open_files=3, buffer_bytes=1)
    writer = TaskWriter(spec, task_id=0, attempt_id=0)
    batches = [_many_partitions(50, 10, offset=i * 50) for i in range(4)]
    for batch in batches:
        writer.write(batch)
        assert writer.open_files <= 3
    result = writer.complete()
    assert writer.peak_open_files == 3
    # 10 partitions through 3 slots, visited round robin: every visit after the first three evicts.
    assert writer.evicted_files > 0
    assert len(result.data_files) == writer.evicted_files + 3
    assert len({f.path for f in result.data_files}) == len(result.data_files)
    written = pa.concat_tables(pq.read_table(f.path.removeprefix("file://")) for f in result.data_files)
    assert sorted(written["id"].to_pylist()) == list(range(200))
    for meta in result.data_files:
        rows_of_file = pq.read_table(meta.path.removeprefix("file://"))
        assert meta.record_count == rows_of_file.num_rows
        assert set(rows_of_file["name"].to_pylist()) == {meta.partition[0]}
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    on_disk = {str(p) for p in data_dir.rglob("*.parquet")}
    assert on_disk == {f.path.removeprefix("file://") for f in result.data_files}


def test_without_pressure_a_partition_keeps_one_file(catalog: Catalog) -> None:
    from iceberg_sink.writer.task_writer import TaskWriter

    table = make_table(catalog, "lru_wide", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    writer = TaskWriter(writer_spec(table, max_open_files=10, buffer_bytes=1), task_id=0, attempt_id=0)
    for i in range(4):
        writer.write(_many_partitions(50, 10, offset=i * 50))
    result = writer.complete()
    assert writer.evicted_files == 0 and writer.peak_open_files == 10
    assert len(result.data_files) == 10


def test_rows_waiting_for_their_first_flush_hold_no_file(catalog: Catalog) -> None:
    from iceberg_sink.writer.task_writer import TaskWriter

    table = make_table(catalog, "lru_buffered", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    writer = TaskWriter(writer_spec(table, max_open_files=2), task_id=0, attempt_id=0)
    for i in range(4):
        writer.write(_many_partitions(50, 10, offset=i * 50))
    assert writer.open_files == 0
    result = writer.complete()
    # Buffers (bounded together by the buffer size) are not files: each partition still gets one.
    assert writer.evicted_files == 0 and writer.peak_open_files == 1
    assert len(result.data_files) == 10
    assert sum(f.record_count for f in result.data_files) == 200


def test_flushes_past_the_total_buffer_open_files_within_the_limit(catalog: Catalog) -> None:
    from iceberg_sink.writer.task_writer import TaskWriter

    table = make_table(catalog, "lru_total", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    batch = _many_partitions(400, 40)
    # Per-file buffer far above a batch's slice, total buffer below a batch: only the total bound flushes.
    writer = TaskWriter(writer_spec(table, max_open_files=5, buffer_bytes=batch.nbytes // 8), task_id=0, attempt_id=0)
    for i in range(6):
        writer.write(_many_partitions(400, 40, offset=i * 400))
        assert writer.open_files <= 5
    result = writer.complete()
    assert writer.peak_open_files == 5 and writer.evicted_files > 0
    assert sorted(
        pa.concat_tables(pq.read_table(f.path.removeprefix("file://")) for f in result.data_files)["id"].to_pylist()
    ) == list(range(2400))


def test_abort_deletes_files_the_lru_already_closed(catalog: Catalog) -> None:
    from iceberg_sink.writer.task_writer import TaskWriter

    table = make_table(catalog, "lru_abort", PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "name")))
    writer = TaskWriter(writer_spec(table, max_open_files=2, buffer_bytes=1), task_id=0, attempt_id=0)
    writer.write(_many_partitions(30, 6))
    assert writer.evicted_files > 0
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert list(data_dir.rglob("*.parquet"))
    writer.abort()
    assert list(data_dir.rglob("*.parquet")) == []


def test_float_partitions_keep_negative_zero_apart_and_nans_together(catalog: Catalog) -> None:
    # Iceberg Java reads an identity partition column from the partition tuple: a 0.0 row filed
    # under -0.0 would read back as -0.0, and a filter on 0.0 would prune its file.
    spec = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "score"))
    table = make_table(catalog, "floats", spec)
    other_nan = struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0]  # a negative NaN payload
    scores = [-0.0, 0.0, math.nan, other_nan, None, 1.0, 0.0, -0.0]
    data = pa.table({"id": pa.array(range(len(scores)), pa.int64()), "score": pa.array(scores, pa.float64())})
    result = write_batches(writer_spec(table), data, data.slice(2, 2))
    by_partition: dict[str, list[int]] = {}
    for meta in result.data_files:
        (value,) = meta.partition
        label = "null" if value is None else "nan" if math.isnan(value) else repr(value)
        ids = pq.read_table(meta.path.removeprefix("file://"))["id"].to_pylist()
        assert label not in by_partition, f"two files for partition {label}"
        by_partition[label] = sorted(ids)
        for i in ids:
            got = scores[i]
            assert (got is None and value is None) or (
                got is not None
                and value is not None
                and ((math.isnan(got) and math.isnan(value)) or repr(got) == repr(value))
            ), (i, got, value)
    assert by_partition == {"-0.0": [0, 7], "0.0": [1, 6], "nan": [2, 2, 3, 3], "null": [4], "1.0": [5]}
