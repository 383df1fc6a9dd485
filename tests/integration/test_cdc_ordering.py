"""What docs/cdc.md promises about ``order_by``: null values, ties, and changes across checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink
from iceberg_sink.config import ChangeConfig
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.table.catalog import CatalogConfig
from iceberg_sink.topology.changes import reduce_changes
from iceberg_sink.vocab.columns import OP_COLUMN
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

DDL = "k long, v string, lsn long, op string"
CHANGES = ChangeConfig(key=("k",), op_column="op", order_by="lsn")


def frame(spark: SparkSession, partitions: list[list[tuple[Any, ...]]]) -> DataFrame:
    """A DataFrame whose Spark partition i holds exactly ``partitions[i]``, in that order."""
    rows = [row for part in partitions for row in part]
    sizes = [len(p) for p in partitions]
    # parallelize slices a list into contiguous, near-equal chunks: equal sizes give exact control.
    assert len(set(sizes)) == 1
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, len(partitions)), DDL)
    assert [[tuple(r) for r in p] for p in df.rdd.glom().collect()] == partitions
    return df


def reduced(df: DataFrame) -> dict[int, tuple[str, str | None]]:
    return {r["k"]: (r[OP_COLUMN], r["v"]) for r in reduce_changes(df, CHANGES).collect()}


def test_a_null_order_by_value_is_older_than_any_other(spark: SparkSession) -> None:
    df = frame(spark, [[(1, "set", 5, "U"), (1, "null-lsn", None, "U"), (2, "null-lsn", None, "I")]])
    assert reduced(df) == {1: ("U", "set"), 2: ("I", "null-lsn")}
    # The null row sits in the higher partition (it would win a tie) and still loses.
    first = frame(spark, [[(2, "set", 1, "U")]])
    assert reduced(first.union(df)) == {1: ("U", "set"), 2: ("U", "set")}


def test_ties_within_one_input_partition_go_to_the_later_row(spark: SparkSession) -> None:
    df = frame(spark, [[(1, "first", 7, "U"), (1, "second", 7, "D"), (2, "a", None, "I"), (2, "b", None, "U")]])
    assert reduced(df) == {1: ("D", "second"), 2: ("U", "b")}


def test_ties_across_input_partitions_go_to_the_higher_partition_not_arrival(spark: SparkSession) -> None:
    """Partition 1 holds the row that 'arrived' first (smaller arrival index in v): it still wins,
    because ties are broken by the position in the DataFrame, partition index first."""
    df = frame(spark, [[(1, "arrived-second", 7, "U")], [(1, "arrived-first", 7, "U")]])
    assert df.rdd.getNumPartitions() == 2
    assert [[r["v"] for r in p] for p in df.rdd.glom().collect()] == [["arrived-second"], ["arrived-first"]]
    assert reduced(df) == {1: ("U", "arrived-first")}


@pytest.mark.interop
def test_order_by_does_not_reorder_across_checkpoints(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """A change with a smaller order_by value in a later checkpoint still wins: each checkpoint is
    applied after the previous one."""
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.o")
        .create_if_missing()
        .cdc(op_column="op", key=["k"], order_by="lsn")
        .build()
    )
    sink.write(spark.createDataFrame([(1, "new", 10, "I"), (2, "keep", 10, "I")], DDL))
    sink.write(spark.createDataFrame([(1, "late", 5, "U")], DDL))
    table = sink.load_table()
    expected = [{"k": 1, "v": "late", "lsn": 5}, {"k": 2, "v": "keep", "lsn": 10}]
    assert normalize(java_reader.read(table.metadata_location), ["k"]) == expected
    assert normalize(duckdb_read(table.metadata_location), ["k"]) == expected


@pytest.mark.interop
def test_upsert_order_by_picks_the_newest_row_when_spark_reads_several_files_out_of_order(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Several files of one micro-batch (a stream's maxFilesPerTrigger > 1, or a folder) reach the
    sink in Spark's order, not their names': Spark packs small files by size, largest first. Key 1
    is in every file and its newest row (version 3) in the largest, so arrival order would keep an
    older one; ``upsert(order_by="version")`` keeps the newest."""
    folder = tmp_path / "in"
    folder.mkdir()
    files = {  # name -> (version of key 1, other keys in the file)
        "a-newest.parquet": (3, range(100, 2100)),
        "b-oldest.parquet": (1, range(3000, 3010)),
        "c-middle.parquet": (2, range(0)),
    }
    for name, (version, others) in files.items():
        ids = [1, *others]
        pq.write_table(
            pa.table({"k": pa.array(ids, pa.int64()), "version": pa.array([version] * len(ids), pa.int64())}),
            folder / name,
        )
    df = spark.read.parquet(str(folder))
    arrival = [r["version"] for r in df.where("k = 1").collect()]
    assert sorted(arrival) == [1, 2, 3] and arrival[-1] != 3, f"the input must reach the sink out of order: {arrival}"

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.u")
        .create_if_missing()
        .upsert(key=["k"], order_by="version")
        .build()
    )
    sink.write(df)
    metadata = sink.load_table().metadata_location
    others = [{"k": k, "version": v} for v, ks in files.values() for k in ks]
    expected = sorted([{"k": 1, "version": 3}, *others], key=lambda r: r["k"])
    assert normalize(java_reader.read(metadata), ["k"]) == expected
    assert normalize(duckdb_read(metadata), ["k"]) == expected


def test_upsert_order_by_is_checked_like_cdcs(tmp_path: Path) -> None:
    for bad in ("", 7):
        builder = IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing()
        with pytest.raises(InvalidSinkConfigError, match=r"upsert\(order_by\): expected None or a column name"):
            builder.upsert(key=["k"], order_by=bad).validate()  # type: ignore[arg-type]
    builder = IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing()
    with pytest.raises(
        InvalidSinkConfigError, match=r"cdc\(order_by\): expected None or a column name other than the op"
    ):
        builder.cdc(op_column="op", key=["k"], order_by="op").validate()


def test_an_order_by_the_input_lacks_or_spark_cannot_sort_is_named_before_anything_is_committed(
    spark: SparkSession, tmp_path: Path
) -> None:
    ddl = "k long, src struct<lsn: long>, m map<string, int>"
    rows = [(1, (2,), {"a": 1}), (1, (1,), {"a": 2})]

    def sink(order_by: str, table: str) -> IcebergSink:
        return (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table(f"db.{table}")
            .create_if_missing()
            .upsert(key=["k"], order_by=order_by)
            .build()
        )

    for order_by, table, problem in (
        ("lsn", "missing", r"expected a column of the input .* received 'lsn'; the input's columns: k, src, m"),
        ("src.nope", "nested_missing", r"expected a column of the input .* received 'src.nope'"),
        ("m", "map", r"expected a column Spark can sort .* received 'm' of type map<string,int>"),
    ):
        bad = sink(order_by, table)
        with pytest.raises(InvalidSinkConfigError, match=rf"upsert\(order_by\): {problem}"):
            bad.write(spark.createDataFrame(rows, ddl))
        assert bad.load_table().current_snapshot() is None
    nested = sink("SRC.lsn", "nested")  # dots select a nested field, as F.col reads them (any case)
    nested.write(spark.createDataFrame(rows, ddl))
    assert [(r["k"], r["src"]["lsn"], r["m"]) for r in nested.load_table().scan().to_arrow().to_pylist()] == [
        (1, 2, [("a", 1)])
    ]


def test_start_names_an_order_by_the_stream_lacks_before_the_query_starts(spark: SparkSession, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    stream = spark.readStream.schema("k long, v string").parquet(str(source))
    for routed in (False, True):
        builder = IcebergSink.builder().embedded(tmp_path / "lake")
        builder = builder.route(table_column="v", namespace="db") if routed else builder.table("db.t")
        sink = builder.create_if_missing().upsert(key=["k"], order_by="lsn").build()
        active = len(spark.streams.active)
        with pytest.raises(InvalidSinkConfigError, match=r"upsert\(order_by\): expected a column of the input .*'lsn'"):
            sink.start(stream, checkpoint_location=str(tmp_path / f"ck-{routed}"))
        assert len(spark.streams.active) == active
    assert not CatalogConfig.embedded(tmp_path / "lake").load().table_exists("db.t")  # checked before creating it
