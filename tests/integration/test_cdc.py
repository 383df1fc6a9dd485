"""Upserts and CDC: equality deletes, one snapshot per checkpoint, checked against a dict model.

After every checkpoint the table read by Apache Iceberg Java (the reference reader for equality
deletes) and by DuckDB must equal the model: applying every change in order to a Python dict.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, InvalidSinkConfigError, SchemaMismatchError, _faults
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = pytest.mark.interop

CHANGE_DDL = "id long, region string, v string, n long, lsn long, op string"
OPS = {"insert": "I", "update": "U", "delete": "D", "update_before": "UB"}


def random_changes(
    rng: random.Random, model: dict[int, dict[str, Any]], lsn: int, count: int, keys: int
) -> list[dict[str, Any]]:
    """Changes that are valid against the model as it evolves: updates/deletes of live keys,
    inserts of absent ones, repeated keys, delete-then-reinsert, update-before images."""
    live = dict(model)
    out = []
    for _ in range(count):
        key = rng.randrange(keys)
        lsn += 1
        if key in live and rng.random() < 0.35:
            out.append({**live.pop(key), "lsn": lsn, "op": rng.choice(["D", "delete"])})
            continue
        if key in live and rng.random() < 0.2:
            out.append({**live[key], "lsn": lsn, "op": "UB"})
            lsn += 1
        row = {"id": key, "region": f"r{key % 3}", "v": f"v{lsn}", "n": rng.randrange(10**6), "lsn": lsn}
        op = "U" if key in live else rng.choice(["I", "insert"])
        live[key] = row
        out.append({**row, "op": op})
    return out


def apply(model: dict[int, dict[str, Any]], changes: list[dict[str, Any]]) -> None:
    for change in sorted(changes, key=lambda c: c["lsn"]):
        code = OPS.get(change["op"], change["op"])
        if code == "D":
            model.pop(change["id"], None)
        elif code in ("I", "U"):
            model[change["id"]] = {k: v for k, v in change.items() if k != "op"}


def frame(spark: SparkSession, rows: list[dict[str, Any]], partitions: int = 3) -> DataFrame:
    return spark.createDataFrame(
        [tuple(r[c] for c in ("id", "region", "v", "n", "lsn", "op")) for r in rows], CHANGE_DDL
    ).repartition(partitions)


def expected(model: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    schema = pa.schema(
        [("id", pa.int64()), ("region", pa.string()), ("v", pa.string()), ("n", pa.int64()), ("lsn", pa.int64())]
    )
    return normalize(pa.Table.from_pylist(list(model.values()), schema=schema), ["id"])


def cdc_builder(tmp_path: Path, partition_by: list[str]) -> Any:
    return (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        .create_if_missing(partition_by=partition_by, format_version=2)  # equality deletes (v3: test_v3_cdc.py)
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
    )


@pytest.mark.parametrize(("seed", "partition_by"), [(7, []), (11, ["region", "bucket(4, id)"])])
def test_random_change_stream_matches_the_model(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, seed: int, partition_by: list[str]
) -> None:
    rng = random.Random(seed)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_builder(tmp_path, partition_by).build()
    checkpoint_dir = str(tmp_path / "ckpt")
    lsn = 0
    for checkpoint in range(8):
        changes = random_changes(rng, model, lsn, rng.randrange(5, 60), keys=40)
        lsn = max(c["lsn"] for c in changes)
        rng.shuffle(changes)  # arrival order differs from lsn order: order_by must win
        if checkpoint == 4:
            # Crash after the committable is persisted; a new sink object (a restarted driver)
            # must commit the stored committable rather than write the batch again.
            def crash(point: str, cp: int) -> None:
                if point == _faults.AFTER_MANIFESTS:
                    raise RuntimeError("driver lost")

            _faults.install(crash)
            try:
                with pytest.raises(RuntimeError, match="driver lost"):
                    sink.write(frame(spark, changes), checkpoint_location=checkpoint_dir, checkpoint_id=checkpoint)
            finally:
                _faults.clear()
            sink = cdc_builder(tmp_path, partition_by).build()
        sink.write(frame(spark, changes), checkpoint_location=checkpoint_dir, checkpoint_id=checkpoint)
        apply(model, changes)
        table = sink.load_table()
        assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected(model), (
            f"checkpoint {checkpoint}"
        )
        assert normalize(duckdb_read(table.metadata_location), ["id"]) == expected(model), f"checkpoint {checkpoint}"
    snapshots = sink.load_table().snapshots()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in snapshots] == [str(i) for i in range(8)]  # type: ignore[index]
    assert [s.sequence_number for s in snapshots] == list(range(1, 9))


def test_snapshot_summary_counts_equality_deletes(spark: SparkSession, tmp_path: Path) -> None:
    sink = cdc_builder(tmp_path, []).build()
    sink.write(frame(spark, [{"id": 1, "region": "a", "v": "x", "n": 1, "lsn": 1, "op": "I"}]))
    sink.write(frame(spark, [{"id": 1, "region": "a", "v": "x", "n": 1, "lsn": 2, "op": "D"}]))
    sink.write(frame(spark, [{"id": 2, "region": "a", "v": "y", "n": 1, "lsn": 3, "op": "U"}]))
    sink.write(frame(spark, [{"id": 2, "region": "a", "v": "z", "n": 1, "lsn": 4, "op": "U"}]))
    first, second, _, fourth = sink.load_table().snapshots()
    assert first.summary is not None and second.summary is not None and fourth.summary is not None
    # Into an empty table every key is provably new: no equality delete at all.
    assert first.summary.operation.value == "append"
    assert first.summary["added-data-files"] == "1"
    assert "added-delete-files" not in first.summary.additional_properties
    assert second.summary.operation.value == "delete"
    assert second.summary["added-delete-files"] == "1"
    assert "added-data-files" not in second.summary.additional_properties
    assert second.summary["added-equality-deletes"] == "1" and second.summary["added-equality-delete-files"] == "1"
    assert fourth.summary.operation.value == "overwrite"
    assert fourth.summary["added-data-files"] == "1" and fourth.summary["added-equality-deletes"] == "1"
    table = sink.load_table()
    assert table.schema().identifier_field_names() == {"id", "region"}
    assert all(table.schema().find_field(k).required for k in ("id", "region"))


def test_upsert_last_row_of_a_key_wins(spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    sink = (
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.kv").create_if_missing().upsert(key=["k"]).build()
    )
    sink.write(spark.createDataFrame([(1, "a"), (2, "b"), (1, "c")], "k long, v string").coalesce(1))
    sink.write(spark.createDataFrame([(2, "d"), (3, "e"), (3, "f")], "k long, v string").coalesce(1))
    rows = normalize(java_reader.read(sink.load_table().metadata_location), ["k"])
    assert rows == [{"k": 1, "v": "c"}, {"k": 2, "v": "d"}, {"k": 3, "v": "f"}]


def test_debezium_codes_and_reinsert_in_one_checkpoint(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.dbz")
        .create_if_missing()
        .cdc(op_column="__op", key=["id"], order_by="ts_ms")
        .build()
    )
    ddl = "id long, name string, ts_ms long, __op string"
    sink.write(spark.createDataFrame([(1, "snap", 1, "r"), (2, "new", 2, "c"), (3, "gone", 3, "c")], ddl))
    sink.write(
        spark.createDataFrame(
            [
                (1, "upd", 10, "u"),
                (3, None, 11, "d"),
                (3, "back", 12, "c"),
                (2, None, 13, "d"),
                (4, "x", 14, "c"),
                (4, None, 15, "d"),
            ],
            ddl,
        )
    )
    rows = normalize(java_reader.read(sink.load_table().metadata_location), ["id"])
    assert rows == [{"id": 1, "name": "upd", "ts_ms": 10}, {"id": 3, "name": "back", "ts_ms": 12}]


def test_bad_change_input_commits_nothing(spark: SparkSession, tmp_path: Path) -> None:
    sink = cdc_builder(tmp_path, []).build()
    good = [{"id": 1, "region": "a", "v": "x", "n": 1, "lsn": 1, "op": "I"}]
    sink.write(frame(spark, good))
    with pytest.raises(InvalidInputError, match="unknown operation code 'X' in column 'op'"):
        sink.write(
            frame(
                spark,
                [{**good[0], "lsn": 2, "op": "U"}, {"id": 2, "region": "b", "v": "y", "n": 2, "lsn": 3, "op": "X"}],
            )
        )
    with pytest.raises(InvalidInputError, match="a key column is null"):
        sink.write(frame(spark, [{"id": None, "region": "b", "v": "y", "n": 2, "lsn": 4, "op": "I"}]))
    with pytest.raises(SchemaMismatchError, match=r"operation column .* is missing"):
        sink.write(frame(spark, good).drop("op"))
    with pytest.raises(SchemaMismatchError, match="region: column is required in the table but missing"):
        sink.write(frame(spark, good).drop("region"))
    table = sink.load_table()
    assert len(table.snapshots()) == 1
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    assert len(list(data_dir.rglob("*.parquet"))) == 1  # the first checkpoint's data file only (its key was new)


def test_build_refuses_partitions_outside_the_key_and_v1_tables(
    tmp_path: Path, catalog: Catalog, catalog_props: dict[str, str]
) -> None:
    with pytest.raises(
        InvalidSinkConfigError, match=r"must include the source column of every partition field.*ts_day = day\(ts\)"
    ):
        IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing(partition_by=["day(ts)"]).upsert(
            key=["id"]
        ).build()
    with pytest.raises(InvalidSinkConfigError, match="need format version 2"):
        IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing(format_version=1).upsert(
            key=["id"]
        ).build()
    with pytest.raises(InvalidSinkConfigError, match="upsert\\(\\)/cdc\\(\\): expected one of them"):
        IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing().upsert(key=["id"]).cdc(
            "op", ["id"]
        ).build()
    with pytest.raises(InvalidSinkConfigError, match="cdc\\(op_column\\)"):
        IcebergSink.builder().embedded(tmp_path).table("db.t").create_if_missing().cdc(
            op_column="id", key=["id"]
        ).build()
    catalog.create_namespace("db")
    catalog.create_table(
        "db.v1",
        Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType())),
        properties={"format-version": "1"},
    )
    with pytest.raises(InvalidSinkConfigError, match=r"format version 1.*need format version 2"):
        IcebergSink.builder().catalog("test", **catalog_props).table("db.v1").upsert(key=["id"]).build()
    catalog.create_table("db.v2", Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType())))
    with pytest.raises(InvalidSinkConfigError, match="key column 'nope' is not in table"):
        IcebergSink.builder().catalog("test", **catalog_props).table("db.v2").upsert(key=["nope"]).build()


def test_streaming_cdc_one_snapshot_per_micro_batch(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    rng = random.Random(3)
    model: dict[int, dict[str, Any]] = {}
    lsn = 0
    source = tmp_path / "changes"
    source.mkdir()
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("region", pa.string()),
            ("v", pa.string()),
            ("n", pa.int64()),
            ("lsn", pa.int64()),
            ("op", pa.string()),
        ]
    )
    for i in range(3):
        changes = random_changes(rng, model, lsn, 40, keys=25)
        lsn = max(c["lsn"] for c in changes)
        apply(model, changes)
        pq.write_table(pa.Table.from_pylist(changes, schema=schema), source / f"part-{i}.parquet")
        # Distinct modification times keep the file stream's batch order equal to the change order.
        os.utime(source / f"part-{i}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
    sink = cdc_builder(tmp_path, ["region"]).build()
    stream = spark.readStream.schema(CHANGE_DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = sink.start(stream, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    table = sink.load_table()
    assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1", "2"]  # type: ignore[index]
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == expected(model)


def test_new_keys_skip_equality_deletes_but_updates_do_not(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.mono")
        .create_if_missing(format_version=2)  # equality deletes
        .upsert(key=["id"])
        .build()
    )
    ddl = "id long, v string"
    sink.write(spark.createDataFrame([(i, "a") for i in range(0, 100)], ddl))
    sink.write(spark.createDataFrame([(i, "b") for i in range(100, 200)], ddl))  # all above the table's max id
    sink.write(spark.createDataFrame([(i, "c") for i in range(190, 210)], ddl))  # 10 updates, 10 new
    summaries = [s.summary for s in sink.load_table().snapshots()]
    assert [s.additional_properties.get("added-equality-deletes") for s in summaries if s] == [None, None, "10"]
    rows = normalize(java_reader.read(sink.load_table().metadata_location), ["id"])
    assert rows == [{"id": i, "v": "a" if i < 100 else "b" if i < 190 else "c"} for i in range(210)]
    # With the optimisation off, every changed key gets its delete.
    plain = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.mono")
        .upsert(key=["id"])
        .write_option("iceberg-sink.cdc.skip-deletes-for-new-keys", False)
        .build()
    )
    plain.write(spark.createDataFrame([(i, "d") for i in range(300, 305)], ddl))
    assert sink.load_table().current_snapshot().summary["added-equality-deletes"] == "5"  # type: ignore[union-attr,index]


def test_new_key_proof_broken_by_a_concurrent_writer_falls_back_to_deletes(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Another writer adds a row with a key we proved new, between our write and our commit."""
    ddl = "id long, v string"
    other = IcebergSink.builder().embedded(tmp_path / "lake").table("db.race").create_if_missing().build()
    other.write(spark.createDataFrame([(1, "old")], ddl))
    fired = {"n": 0}

    def concurrent_append(summary: Any) -> None:
        if fired["n"] == 0:
            fired["n"] += 1
            other.write(spark.createDataFrame([(50, "theirs")], ddl))

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.race")
        .upsert(key=["id"])
        .pre_commit_hook(concurrent_append)
        .build()
    )
    sink.write(spark.createDataFrame([(50, "ours"), (60, "ours")], ddl))  # 50 and 60 were new when written
    rows = normalize(java_reader.read(sink.load_table().metadata_location), ["id"])
    assert rows == [{"id": 1, "v": "old"}, {"id": 50, "v": "ours"}, {"id": 60, "v": "ours"}]
    last = sink.load_table().current_snapshot().summary  # type: ignore[union-attr]
    assert last["added-equality-deletes"] == "2"  # type: ignore[index]
