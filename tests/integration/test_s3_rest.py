"""The sink against real object storage and a real REST catalog: SeaweedFS ``weed mini`` (S3 + Iceberg REST).

Everything is read back independently of the sink: PyIceberg through the same REST catalog, DuckDB
(httpfs + iceberg extensions) straight from S3, and Apache Iceberg Java 1.9.2 and the newest Iceberg
Java straight from S3 too, with Iceberg's own ``S3FileIO`` (``JavaIcebergReader.use_s3``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, InvalidSinkConfigError
from iceberg_sink.builder import IcebergSinkBuilder
from tests.integration.seaweed import seaweed  # noqa: F401
from tests.integration.sources import EVENT_SCHEMA_DDL, write_source_files
from tests.interop.readers import JavaIcebergReader, JavaReaderError, assert_readers_agree, normalize, s3_filesystem

NAMESPACE = "s3rest"


def rest_catalog(props: dict[str, str]) -> Catalog:
    return load_catalog("seaweed", **props)


def read_back(props: dict[str, str], identifier: str) -> Table:
    """The table as a fresh PyIceberg REST client sees it (not the sink's own catalog object)."""
    return rest_catalog(props).load_table(identifier)


def sink_builder(props: dict[str, str], table: str) -> IcebergSinkBuilder:
    return IcebergSink.builder().catalog("rest", **props).table(f"{NAMESPACE}.{table}")


def kv_frame(spark: SparkSession, start: int, end: int, value: str) -> DataFrame:
    return spark.range(start, end).select(
        F.col("id"), (F.col("id") % 7).alias("k"), F.concat(F.lit(f"{value}-"), F.col("id").cast("string")).alias("v")
    )


def test_pyiceberg_alone_round_trips_through_seaweedfs(seaweed: dict[str, str]) -> None:  # noqa: F811
    """The environment itself: PyIceberg creates, appends and scans over REST + S3 without the sink."""
    catalog = rest_catalog(seaweed)
    catalog.create_namespace_if_not_exists("smoke")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])
    table = catalog.create_table("smoke.t", schema=schema)
    rows = pa.table({"id": [1, 2, 3], "s": ["a", "b", None]}, schema=schema)
    table.append(rows)
    again = read_back(seaweed, "smoke.t")
    assert again.scan().to_arrow().sort_by("id").equals(rows)
    assert again.metadata_location.startswith(f"{seaweed['warehouse']}/")
    assert all(p.startswith("s3://") for p in again.inspect.files()["file_path"].to_pylist())


def check_s3_table(
    props: dict[str, str],
    java: JavaIcebergReader | Sequence[JavaIcebergReader],
    metadata_location: str,
    expected: pa.Table,
    key: list[str],
) -> None:
    """Iceberg Java (each reader given, through S3FileIO) and DuckDB (httpfs) read exactly ``expected``
    straight from S3."""
    readers = (java,) if isinstance(java, JavaIcebergReader) else tuple(java)
    assert_readers_agree(readers, metadata_location, expected, key, s3=props)


def test_java_reads_s3_through_s3fileio_and_fails_on_a_missing_object(
    seaweed: dict[str, str],  # noqa: F811
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    """The Java check can fail: a data file deleted from the bucket is an error naming it, not fewer
    rows, in both Iceberg Java readers; and the S3 secret key is not in the readers' logs."""
    catalog = rest_catalog(seaweed)
    catalog.create_namespace_if_not_exists("tamper")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])
    table = catalog.create_table("tamper.t", schema=schema)
    first = pa.table({"id": [1, 2, 3], "s": ["a", "b", None]}, schema=schema)
    second = pa.table({"id": [4, 5], "s": ["d", "e"]}, schema=schema)
    table.append(first)
    table.append(second)
    location = read_back(seaweed, "tamper.t").metadata_location
    assert location.startswith("s3://")

    check_s3_table(seaweed, java_readers, location, pa.concat_tables([first, second]), ["id"])
    for java in java_readers:
        # Java saw the s3:// paths themselves, through its own S3 client.
        java_files = java.files(location).to_pylist()
        assert len(java_files) == 2, java.label
        assert all(f["file_path"].startswith(seaweed["warehouse"] + "/") for f in java_files), java.label
    with pytest.raises(AssertionError):  # a model that differs from the table is caught
        check_s3_table(seaweed, java_readers, location, first, ["id"])

    gone = sorted(f["file_path"] for f in java_readers[0].files(location).to_pylist())[0]
    s3_filesystem(seaweed).delete_file(gone.removeprefix("s3://"))
    for java in java_readers:
        with pytest.raises(JavaReaderError) as failure:
            java.read(location)
        assert gone in str(failure.value), java.label
    secret = seaweed["s3.secret-access-key"]
    for java in java_readers:
        assert secret not in java.stderr_path.read_text(errors="replace"), f"{java.label} logged the S3 secret key"


def test_bounded_write_into_a_partitioned_table_on_s3(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_reader: JavaIcebergReader,
) -> None:
    df = kv_frame(spark, 0, 300, "v")
    sink = sink_builder(seaweed, "bounded").create_if_missing(partition_by=["bucket(4, id)"]).build()
    outcome = sink.write(df.repartition(3))
    assert outcome is not None and outcome.snapshot is not None

    table = read_back(seaweed, f"{NAMESPACE}.bounded")
    assert len(table.snapshots()) == 1
    assert normalize(table.scan().to_arrow(), ["id"]) == normalize(df.toArrow(), ["id"])
    check_s3_table(seaweed, java_reader, table.metadata_location, df.toArrow(), ["id"])
    files = table.inspect.files().to_pylist()
    assert files, "no data files"
    warehouse = seaweed["warehouse"]
    assert all(f["file_path"].startswith(f"{warehouse}/") for f in files), [f["file_path"] for f in files]
    assert table.metadata_location.startswith(f"{warehouse}/")
    # bucket(4, id) over 300 ids fills all 4 buckets; hash distribution writes one file per bucket.
    assert sorted(f["partition"]["id_bucket"] for f in files) == [0, 1, 2, 3]


def test_streaming_query_commits_one_snapshot_per_micro_batch_on_s3(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    tables = write_source_files(tmp_path / "src", files=3, rows_per_file=40)
    stream = spark.readStream.schema(EVENT_SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "src"))
    sink = sink_builder(seaweed, "events").create_if_missing(partition_by=["day(ts)"]).build()
    query = sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    assert query.awaitTermination(120), "streaming query did not finish within 120 s"
    assert query.exception() is None, query.exception()

    table = read_back(seaweed, f"{NAMESPACE}.events")
    summaries = [s.summary for s in table.snapshots()]
    assert all(s is not None for s in summaries)
    assert [s["iceberg-sink.checkpoint-id"] for s in summaries] == ["0", "1", "2"]  # type: ignore[index]
    assert len({s["iceberg-sink.job-id"] for s in summaries}) == 1  # type: ignore[index]
    assert [s["added-records"] for s in summaries] == ["40", "40", "40"]  # type: ignore[index]
    expected = normalize(pa.concat_tables(tables), ["event_id"])
    assert normalize(table.scan().to_arrow(), ["event_id"]) == expected
    check_s3_table(seaweed, java_reader, table.metadata_location, pa.concat_tables(tables), ["event_id"])
    java_snapshots = java_reader.snapshots(table.metadata_location).to_pylist()
    assert [json.loads(s["summary"])["iceberg-sink.checkpoint-id"] for s in java_snapshots] == ["0", "1", "2"]
    assert all(p.startswith(f"{seaweed['warehouse']}/") for p in table.inspect.files()["file_path"].to_pylist())


def test_upsert_writes_equality_deletes_on_s3_and_compaction_applies_them(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    identifier = f"{NAMESPACE}.kv"
    sink = sink_builder(seaweed, "kv").create_if_missing(format_version=2).upsert(key=["id"]).build()
    sink.write(kv_frame(spark, 0, 10, "a"))
    sink.write(kv_frame(spark, 5, 15, "b"))
    expected_rows = pa.concat_tables([kv_frame(spark, 0, 5, "a").toArrow(), kv_frame(spark, 5, 15, "b").toArrow()])
    expected = normalize(expected_rows, ["id"])

    table = read_back(seaweed, identifier)
    first, second = (s.summary for s in table.snapshots())
    assert first is not None and second is not None
    assert first["added-records"] == "10"
    # The second write replaces ids 5..9: their equality deletes (one per written key) are on S3.
    assert int(second["added-equality-deletes"] or 0) >= 5 and second["added-records"] == "10"
    assert int(second["added-delete-files"] or 0) >= 1
    delete_files = table.inspect.delete_files().to_pylist()
    assert delete_files and all(f["file_path"].startswith(f"{seaweed['warehouse']}/") for f in delete_files)
    # DuckDB and both Iceberg Java readers (all straight from S3) apply the equality deletes.
    check_s3_table(seaweed, java_readers, table.metadata_location, expected_rows, ["id"])

    result = sink.compact(spark)
    assert result.snapshot_id is not None and result.removed_delete_files >= 1, result
    table = read_back(seaweed, identifier)
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == result.snapshot_id
    assert current.summary is not None and current.summary.operation.value == "replace"
    assert table.inspect.delete_files().num_rows == 0
    assert all(p.startswith(f"{seaweed['warehouse']}/") for p in table.inspect.files()["file_path"].to_pylist())
    assert normalize(table.scan().to_arrow(), ["id"]) == expected
    check_s3_table(seaweed, java_readers, table.metadata_location, expected_rows, ["id"])


def test_s3_secret_stays_out_of_logs_and_config_repr(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_reader: JavaIcebergReader,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = seaweed["s3.secret-access-key"]
    caplog.set_level(logging.DEBUG, logger="iceberg_sink")
    # v2: SeaweedFS's table bucket refuses a v3 table's Puffin files (test_v3_rest.py sets another data path).
    sink = (
        sink_builder(seaweed, "secret")
        .create_if_missing(partition_by=["k"], format_version=2)
        .upsert(key=["id", "k"])
        .build()
    )
    sink.write(kv_frame(spark, 0, 20, "a"))
    sink.write(kv_frame(spark, 10, 30, "b"))
    sink.compact(spark)
    expected = kv_frame(spark, 0, 10, "a").union(kv_frame(spark, 10, 30, "b")).toArrow()
    check_s3_table(seaweed, java_reader, read_back(seaweed, f"{NAMESPACE}.secret").metadata_location, expected, ["id"])
    records = [r for r in caplog.records if r.name.startswith("iceberg_sink")]
    assert records, "the sink logged nothing: this check would prove nothing"
    for record in records:
        assert secret not in record.getMessage(), record.getMessage()
        assert secret not in repr(record.args)
    assert secret not in caplog.text
    assert secret not in repr(sink.config)
    assert secret not in str(sink.config)
    assert secret not in repr(sink.config.catalog)

    # A catalog that rejects the credential: the error names the catalog, never the secret.
    wrong = {**seaweed, "credential": seaweed["s3.access-key-id"] + ":" + secret[::-1]}
    with pytest.raises(InvalidSinkConfigError) as failure:
        sink_builder(wrong, "secret").build()
    assert secret[::-1] not in str(failure.value)
    assert secret not in str(failure.value)


def special_partition_values_round_trip(
    spark: SparkSession,
    props: dict[str, str],
    java_readers: Sequence[JavaIcebergReader],
    builder: IcebergSinkBuilder,
    identifier: str,
) -> None:
    """Identity partition values a URL escapes or reads (``%``, ``?``, ``#``, ``/``, ``+``, a space,
    non-ASCII) make object keys holding ``%25``, ``%3F``, ``+``...: the sink's upserts and compaction,
    Iceberg Java's S3FileIO and DuckDB's httpfs must all name the same objects and rows. ``builder``
    creates the table partitioned by ``p`` with the key ``id, p``."""
    values = ["a b", "50%", "q?r#s", "c/d", "é=1&x+y", "%41"]
    schema = "id long, p string, v string"
    sink = builder.build()
    model = {(i, p): "a" for i, p in enumerate(values)}
    sink.write(spark.createDataFrame([(i, p, v) for (i, p), v in model.items()], schema))
    updates = {(i, p): "b" for i, p in enumerate(values) if i % 2 == 0}
    sink.write(spark.createDataFrame([(i, p, v) for (i, p), v in updates.items()], schema))
    model.update(updates)
    expected = pa.Table.from_pylist([{"id": i, "p": p, "v": v} for (i, p), v in model.items()])
    table = read_back(props, identifier)
    check_s3_table(props, java_readers, table.metadata_location, expected, ["id"])
    sink.compact(spark)
    table = read_back(props, identifier)
    assert table.inspect.delete_files().num_rows == 0
    assert normalize(table.scan().to_arrow(), ["id"]) == normalize(expected, ["id"])
    check_s3_table(props, java_readers, table.metadata_location, expected, ["id"])


def test_partition_values_with_url_special_characters_on_s3(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    """Format v2 (equality deletes); v3 is in test_v3_rest.py (its Puffin files need another bucket).
    DuckDB 1.5.5 read the value 'a b' of an equality delete file in the folder ``p=a+b`` as 'a+b'
    and applied none of its deletes, until the sink wrote delete files outside partition folders."""
    builder = (
        sink_builder(seaweed, "special").create_if_missing(partition_by=["p"], format_version=2).upsert(key=["id", "p"])
    )
    special_partition_values_round_trip(spark, seaweed, java_readers, builder, f"{NAMESPACE}.special")


def test_a_rest_catalog_commits_a_routed_checkpoints_tables_in_one_transactions_request(
    spark: SparkSession,
    seaweed: dict[str, str],  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    """SeaweedFS's REST catalog serves ``POST /v1/{prefix}/transactions/commit`` (without listing it in
    /v1/config): a routed checkpoint's tables land in one request (docs/transactions.md). Its answer
    lost after it landed, every table finds its snapshot and none commits twice; another writer
    moving one table between load and request makes the server refuse the whole request (409) and
    every table prepare again. Read back by Iceberg Java and DuckDB from S3."""
    from iceberg_sink import _faults

    sink = (
        IcebergSink.builder()
        .catalog("rest", **seaweed)
        .route(table_column="tbl", namespace=NAMESPACE)
        .create_if_missing(format_version=2)  # the other writer below, PyIceberg, cannot commit to v3
        .atomic_commits("required")  # accepted: this catalog commits several tables at once
        .build()
    )
    names = (f"{NAMESPACE}.ta", f"{NAMESPACE}.tb")

    def rows(n: int) -> DataFrame:
        return spark.createDataFrame(
            [("ta", 10 * n + i, f"a{n}") for i in range(3)] + [("tb", 10 * n, f"b{n}")], "tbl string, id long, v string"
        )

    def marks(name: str) -> list[int]:
        found = [s.summary.get("iceberg-sink.checkpoint-id") for s in read_back(seaweed, name).snapshots() if s.summary]
        return [int(m) for m in found if m is not None]

    ckpt = str(tmp_path / "ck")
    lost: list[str] = []

    def lose_answer(point: str, _: int) -> None:
        if point == _faults.TRANSACTION_COMMITTED and not lost:
            lost.append(point)
            raise ConnectionResetError("connection reset after the transaction was applied")

    _faults.install(lose_answer)
    try:
        first = sink.write(rows(0), checkpoint_location=ckpt)
    finally:
        _faults.clear()
    assert lost and first is not None and first.atomic
    assert [marks(n) for n in names] == [[0], [0]]  # found landed, not committed twice

    hits: list[int] = []
    other = pa.table({"id": pa.array([999], pa.int64()), "v": pa.array(["other"])})

    def other_writer(point: str, _: int) -> None:
        if point == _faults.BEFORE_COMMIT_SEND:
            hits.append(1)
            if len(hits) == len(names):  # both prepared: another writer moves tb
                rest_catalog(seaweed).load_table(names[1]).append(other)

    _faults.install(other_writer)
    try:
        second = sink.write(rows(1), checkpoint_location=ckpt)
    finally:
        _faults.clear()
    assert len(hits) > len(names) and second is not None and second.atomic
    assert [marks(n) for n in names] == [[0, 1], [0, 1]]
    expected = {
        names[0]: [{"id": 10 * n + i, "v": f"a{n}"} for n in (0, 1) for i in range(3)],
        names[1]: [{"id": 0, "v": "b0"}, {"id": 10, "v": "b1"}, {"id": 999, "v": "other"}],
    }
    for name, want in expected.items():
        table = read_back(seaweed, name)
        check_s3_table(seaweed, java_reader, table.metadata_location, pa.Table.from_pylist(want), ["id"])
