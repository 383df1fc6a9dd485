"""Tables written by the sink, read back by Apache Iceberg Java 1.9.2, DuckDB and PyIceberg.

Filtered Java reads prune files by the column metrics the writers recorded: a wrong lower or upper
bound makes Java skip a file that holds matching rows, so these reads check the metrics.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, normalize, pyiceberg_read

pytestmark = pytest.mark.interop
UTC = dt.UTC


def typed_rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    base = dt.datetime(2024, 2, 28, 18, 0, tzinfo=UTC)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "small": pa.array([i % 1000 - 500 for i in ids], pa.int32()),
            "name": [
                None if i % 10 == 0 else f"{'abcdefghij'[i % 10]}-name-that-is-longer-than-sixteen-{i % 13}"
                for i in ids
            ],
            "score": [math.nan if i % 17 == 0 else (i % 101) - 50.25 for i in ids],
            "ratio": pa.array([None if i % 7 == 0 else i / 1000 for i in ids], pa.float32()),
            "flag": [i % 3 == 0 for i in ids],
            "d": [dt.date(2023, 12, 1) + dt.timedelta(days=i % 120) for i in ids],
            "ts": pa.array([base + dt.timedelta(minutes=97 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            "local_ts": pa.array(
                [dt.datetime(2024, 1, 1) + dt.timedelta(seconds=3_601 * i) for i in ids], pa.timestamp("us")
            ),
            "amount": pa.array([Decimal(i * 37 % 10_000) / 100 for i in ids], pa.decimal128(10, 2)),
            "blob": pa.array([bytes([i % 251, (i * 7) % 256]) for i in ids], pa.binary()),
        }
    )


FILTERS: list[tuple[str, Callable[[dict[str, Any]], bool]]] = [
    ("id > 260", lambda r: r["id"] > 260),
    ("small between -300 and -280", lambda r: -300 <= r["small"] <= -280),
    ("name = 'c-name-that-is-longer-than-sixteen-5'", lambda r: r["name"] == "c-name-that-is-longer-than-sixteen-5"),
    ("name >= 'h'", lambda r: r["name"] is not None and r["name"] >= "h"),
    ("name like 'd-name%'", lambda r: r["name"] is not None and r["name"].startswith("d-name")),
    ("name is null", lambda r: r["name"] is None),
    # Spark orders NaN above every number while Iceberg's metrics evaluator treats NaN as matching no
    # comparison (bounds exclude NaN, as the spec requires), so NaN is excluded explicitly.
    ("score > 40 and not isnan(score)", lambda r: not math.isnan(r["score"]) and r["score"] > 40),
    ("score < -49", lambda r: not math.isnan(r["score"]) and r["score"] < -49),
    ("isnan(score)", lambda r: math.isnan(r["score"])),
    ("ratio < 0.05", lambda r: r["ratio"] is not None and r["ratio"] < 0.05),
    ("flag", lambda r: r["flag"]),
    ("d >= DATE'2024-03-20'", lambda r: r["d"] >= dt.date(2024, 3, 20)),
    ("ts < TIMESTAMP'2024-03-02 06:00:00'", lambda r: r["ts"] < dt.datetime(2024, 3, 2, 6, tzinfo=UTC)),
    ("local_ts >= TIMESTAMP_NTZ'2024-01-10 00:00:00'", lambda r: r["local_ts"] >= dt.datetime(2024, 1, 10)),
    ("amount > 95.5", lambda r: r["amount"] > Decimal("95.5")),
    ("blob = X'0523'", lambda r: r["blob"] == b"\x05\x23"),
]


@pytest.fixture(scope="module")
def written(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[IcebergSink, pa.Table]:
    """One table written by a bounded write and then two streaming micro-batches."""
    tmp = tmp_path_factory.mktemp("interop")
    bounded, streamed = typed_rows(0, 200), [typed_rows(200, 80), typed_rows(280, 80)]
    pq.write_table(bounded, tmp / "bounded.parquet")
    (tmp / "src").mkdir()
    for i, t in enumerate(streamed):
        pq.write_table(t, tmp / "src" / f"part-{i}.parquet")
    sink = (
        IcebergSink.builder()
        .embedded(tmp / "data")
        .table("db.typed")
        .create_if_missing(partition_by=["day(ts)", "bucket(3, id)", "truncate(1, name)"])
        .build()
    )
    sink.write(spark.read.parquet(str(tmp / "bounded.parquet")))
    schema = spark.read.parquet(str(tmp / "bounded.parquet")).schema
    df = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(tmp / "src"))
    query = sink.start(df, str(tmp / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    return sink, pa.concat_tables([bounded, *streamed])


def test_every_reader_returns_the_input(
    written: tuple[IcebergSink, pa.Table], java_readers: tuple[JavaIcebergReader, ...]
) -> None:
    """Iceberg Java 1.9.2, the newest Iceberg Java, DuckDB and PyIceberg all read back the input."""
    sink, expected_table = written
    location = sink.load_table().metadata_location
    assert_readers_agree(java_readers, location, expected_table, ["id"])
    assert normalize(pyiceberg_read(location), ["id"]) == normalize(expected_table, ["id"])


def test_java_sees_the_snapshots_and_their_summaries(
    written: tuple[IcebergSink, pa.Table], java_reader: JavaIcebergReader
) -> None:
    import json

    sink, _ = written
    snapshots = java_reader.snapshots(sink.load_table().metadata_location).to_pylist()
    summaries = [json.loads(s["summary"]) if isinstance(s["summary"], str) else dict(s["summary"]) for s in snapshots]
    assert [s["operation"] for s in snapshots] == ["append"] * 3
    assert [int(s["added-records"]) for s in summaries] == [200, 80, 80]
    assert summaries[-1]["total-records"] == "360"
    assert len({s["iceberg-sink.job-id"] for s in summaries}) == 2  # the bounded write is a job of its own


@pytest.mark.parametrize(("predicate", "keep"), FILTERS, ids=[f[0] for f in FILTERS])
def test_filtered_java_reads_equal_filtering_the_input(
    written: tuple[IcebergSink, pa.Table],
    java_reader: JavaIcebergReader,
    predicate: str,
    keep: Callable[[dict[str, Any]], bool],
) -> None:
    sink, expected_table = written
    expected_rows = [r for r in expected_table.to_pylist() if keep(r)]
    assert expected_rows, f"filter {predicate} selects nothing: the test would prove nothing"
    expected = normalize(pa.Table.from_pylist(expected_rows, schema=expected_table.schema), ["id"])
    got = java_reader.read(sink.load_table().metadata_location, where=predicate)
    assert normalize(got, ["id"]) == expected


def test_files_are_pruned_by_metrics(written: tuple[IcebergSink, pa.Table], tmp_path: Path) -> None:
    """The table has many files, so a selective filter that returns right rows really used metrics."""
    sink, _ = written
    table = sink.load_table()
    files = table.inspect.files()
    assert files.num_rows > 20
    selective = table.scan(row_filter="id > 350").plan_files()
    assert 0 < len(list(selective)) < files.num_rows
