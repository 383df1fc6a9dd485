"""Converting equality deletes into position deletes beside a live stream and compaction.

The tables are format v2 (``create_if_missing(format_version=2)``): the sink's v3 tables, the
upsert/CDC default, get deletion vectors instead (conversion on v3: test_v3_conversion.py).

Every table is read back by Apache Iceberg Java and DuckDB and compared with a model of the changes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import CompactionConfig, IcebergSink
from iceberg_sink._iceberg.position_deletes import FILE_PATH_ID, POS_ID
from iceberg_sink.topology.compaction import compact
from iceberg_sink.topology.conversion import convert_equality_deletes, job
from tests.integration.test_cdc import apply, expected, frame, random_changes
from tests.interop.readers import JavaIcebergReader, assert_readers_agree, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop


def cdc_sink(tmp_path: Path, partition_by: list[str] | None = None, **conversion: Any) -> Any:
    builder = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.users")
        .create_if_missing(partition_by=["region"] if partition_by is None else partition_by, format_version=2)
        .cdc(op_column="op", key=["id", "region"], order_by="lsn")
    )
    return builder.convert_equality_deletes(**conversion) if conversion else builder


def stream(spark: SparkSession, sink: Any, model: dict[int, dict[str, Any]], rng: random.Random, batches: int) -> None:
    lsn = max((r["lsn"] for r in model.values()), default=0)
    for _ in range(batches):
        changes = random_changes(rng, model, lsn + 1000, 40, keys=30)
        lsn = max(c["lsn"] for c in changes)
        sink.write(frame(spark, changes))
        apply(model, changes)


def files_by_content(table: Table) -> dict[int, list[dict[str, Any]]]:
    result: dict[int, list[dict[str, Any]]] = {0: [], 1: [], 2: []}
    for f in table.inspect.files().to_pylist():
        result[f["content"]].append(f)
    return result


def check_reads(
    java: JavaIcebergReader | Sequence[JavaIcebergReader], table: Table, model: dict[int, dict[str, Any]]
) -> None:
    """The Iceberg Java reader(s) given and DuckDB read exactly the model."""
    readers = (java,) if isinstance(java, JavaIcebergReader) else tuple(java)
    assert_readers_agree(readers, table.metadata_location, expected(model), ["id"])


def racing(load: Callable[[], Table], before_commit: Callable[[], None], call: int = 2) -> Callable[[], Table]:
    """A table loader that lets another writer commit before the ``call``-th load (the commit's)."""
    calls = {"n": 0}

    def loader() -> Table:
        calls["n"] += 1
        if calls["n"] == call:
            before_commit()
        return load()

    return loader


@pytest.mark.parametrize("partition_by", [["region"], []])
def test_conversion_replaces_equality_deletes_by_file_scoped_position_deletes(
    spark: SparkSession, java_readers: tuple[JavaIcebergReader, ...], tmp_path: Path, partition_by: list[str]
) -> None:
    rng = random.Random(3)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path, partition_by).build()
    stream(spark, sink, model, rng, 5)
    before = files_by_content(sink.load_table())
    assert before[2] and not before[1]
    check_reads(java_readers, sink.load_table(), model)  # equality deletes, before the conversion
    result = convert_equality_deletes(sink.load_table)
    table = sink.load_table()
    after = files_by_content(table)
    assert result.snapshot_id == table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    assert result.removed_equality_delete_files == len(before[2]) and not after[2]
    assert result.added_position_delete_files == len(after[1]) > 0
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary.operation.value == "replace"  # type: ignore[union-attr]
    assert summary["total-equality-deletes"] == "0"  # type: ignore[index]
    assert summary["iceberg-sink.operation"] == "convert-equality-deletes"  # type: ignore[index]
    # One file-scoped position delete file per data file with deleted rows: sorted, exact bounds.
    named = []
    for f in after[1]:
        rows = pq.read_table(f["file_path"].removeprefix("file://"))
        paths = set(rows.column("file_path").to_pylist())
        assert len(paths) == 1
        named.append(paths.pop())
        positions = rows.column("pos").to_pylist()
        assert positions == sorted(set(positions))
        lower, upper = dict(f["lower_bounds"]), dict(f["upper_bounds"])
        assert lower[FILE_PATH_ID] == upper[FILE_PATH_ID] == named[-1].encode()
        assert lower[POS_ID] == positions[0].to_bytes(8, "little")
        assert upper[POS_ID] == positions[-1].to_bytes(8, "little")
    assert len(named) == len(set(named))
    check_reads(java_readers, table, model)
    # Without equality deletes PyIceberg reads the table too.
    assert normalize(pyiceberg_read(table.metadata_location), ["id"]) == expected(model)
    # Nothing left to convert.
    assert convert_equality_deletes(sink.load_table).snapshot_id is None

    # More changes, then a second conversion merges each data file's old position deletes.
    stream(spark, sink, model, rng, 3)
    result = convert_equality_deletes(sink.load_table)
    table = sink.load_table()
    after = files_by_content(table)
    assert result.removed_position_delete_files > 0 and not after[2]
    named = [
        next(iter(set(pq.read_table(f["file_path"].removeprefix("file://")).column("file_path").to_pylist())))
        for f in after[1]
    ]
    assert len(named) == len(set(named))
    check_reads(java_readers, table, model)


def test_stream_commits_during_conversion_do_not_conflict(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    rng = random.Random(4)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path).build()
    stream(spark, sink, model, rng, 3)
    converted = {e["file_path"] for e in files_by_content(sink.load_table())[2]}
    # Between the plan and the commit the stream adds data and new equality deletes.
    result = convert_equality_deletes(racing(sink.load_table, lambda: stream(spark, sink, model, rng, 1)))
    table = sink.load_table()
    assert result.snapshot_id is not None and result.replans == 0
    remaining = {e["file_path"] for e in files_by_content(table)[2]}
    assert remaining and not remaining & converted  # the stream's newer deletes stay, the planned ones went
    check_reads(java_reader, table, model)


@pytest.mark.parametrize("partition_by", [["region"], []])
def test_compaction_planned_before_a_conversion_commit_drops_its_groups(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, partition_by: list[str]
) -> None:
    """Compaction reads S; the stream then deletes rows (equality deletes newer than S) and the
    conversion turns those into position deletes of the files compaction is rewriting and removes
    them. Committing the compaction's files (at S's sequence number, without those deletes) would
    bring the rows back: it must see the new position deletes and drop those groups."""
    rng = random.Random(8)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path, partition_by).build()
    stream(spark, sink, model, rng, 3)
    done: dict[str, Any] = {}

    def stream_then_convert() -> None:
        stream(spark, sink, model, rng, 1)
        done["conversion"] = convert_equality_deletes(sink.load_table)

    # One plan: the dropped groups are not planned again in this run.
    result = compact(spark, racing(sink.load_table, stream_then_convert), CompactionConfig(max_replans=0))
    table = sink.load_table()
    check_reads(java_reader, table, model)
    assert done["conversion"].snapshot_id is not None
    assert result.planned_groups > 0 and result.dropped_groups > 0
    # A later compaction applies the position deletes and removes them.
    again = sink.compact(spark)
    table = sink.load_table()
    assert again.snapshot_id is not None and not files_by_content(table)[1]
    check_reads(java_reader, table, model)


def test_compaction_committing_before_a_conversion_commit_makes_it_plan_again(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """The conversion plans; a compaction planned before the stream's newest deletes then commits
    (rewriting files the conversion adds position deletes for, removing delete files it removes,
    adding files at a sequence number below the newest deletes). The conversion must not commit its
    plan: it plans again on the new head, and nothing comes back or is doubled."""
    rng = random.Random(12)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path).build()
    stream(spark, sink, model, rng, 3)
    planned = threading.Event()
    release = threading.Event()
    outcome: dict[str, Any] = {}

    def paused_conversion() -> None:
        def load() -> Any:
            table = sink.load_table()
            return table

        def loader_pausing_before_commit() -> Any:
            outcome["loads"] = outcome.get("loads", 0) + 1
            if outcome["loads"] == 2:
                planned.set()
                release.wait(600)
            return load()

        try:
            outcome["result"] = convert_equality_deletes(loader_pausing_before_commit)
        except BaseException as e:  # surfaced by the assertions below
            outcome["error"] = e
            planned.set()

    def stream_then_start_conversion() -> None:
        stream(spark, sink, model, rng, 1)  # equality deletes newer than the compaction's plan
        thread = threading.Thread(target=paused_conversion)
        thread.start()
        outcome["thread"] = thread
        planned.wait(600)  # the conversion has planned on the head with those deletes

    compaction = compact(spark, racing(sink.load_table, stream_then_start_conversion), CompactionConfig())
    assert compaction.snapshot_id is not None  # committed while the conversion waited
    release.set()
    outcome["thread"].join(600)
    assert "error" not in outcome, outcome.get("error")
    table = sink.load_table()
    check_reads(java_reader, table, model)
    assert outcome["result"].replans >= 1
    # The stream's deletes newer than the compaction's plan were converted on the second plan.
    assert not files_by_content(table)[2]


def test_streaming_with_background_conversion_and_compaction(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """A stream with conversion every 2 commits and compaction every 5, both in the background:
    every snapshot reads as the model of its checkpoint, and equality deletes do not pile up."""
    import os

    import pyarrow as pa

    from tests.integration.test_cdc import CHANGE_DDL

    rng = random.Random(31)
    model: dict[int, dict[str, Any]] = {}
    source = tmp_path / "changes"
    source.mkdir()
    schema = pa.schema(
        [(n, pa.int64() if t == "long" else pa.string()) for n, t in (c.split() for c in CHANGE_DDL.split(", "))]
    )
    lsn = 0
    models = []
    for i in range(12):
        changes = random_changes(rng, model, lsn, 25, keys=30)
        lsn = max(c["lsn"] for c in changes)
        apply(model, changes)
        models.append(expected(model))
        pq.write_table(pa.Table.from_pylist(changes, schema=schema), source / f"part-{i:03d}.parquet")
        os.utime(source / f"part-{i:03d}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
    states: list[tuple[int, str]] = []
    holder: dict[str, Any] = {}
    builder = cdc_sink(tmp_path, every_n_commits=2).compaction(every_n_commits=5, background=True)
    builder.post_commit_hook(lambda r: states.append((r.checkpoint_id, holder["sink"].load_table().metadata_location)))
    sink = builder.build()
    holder["sink"] = sink
    source_df = spark.readStream.schema(CHANGE_DDL).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = sink.start(source_df, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    sink.await_conversions(300)
    sink.await_compactions(300)
    metrics = sink.metrics()
    assert metrics.conversions_failed == 0 and metrics.last_conversion_error is None
    assert metrics.conversions_succeeded >= 2
    table = sink.load_table()
    checkpoints = [
        s.summary["iceberg-sink.checkpoint-id"]  # type: ignore[index]
        for s in table.snapshots()
        if s.summary.operation.value != "replace"  # type: ignore[union-attr]
    ]
    assert checkpoints == [str(i) for i in range(12)]
    check_reads(java_reader, table, model)
    assert [c for c, _ in states] == list(range(12))
    for checkpoint, location in states:
        assert normalize(java_reader.read(location), ["id"]) == models[checkpoint], f"checkpoint {checkpoint}"
        assert normalize(duckdb_read(location), ["id"]) == models[checkpoint], f"checkpoint {checkpoint}"
    # Once converted, the table holds no equality delete older than the last conversion's plan.
    sink.convert_equality_deletes()
    table = sink.load_table()
    assert not files_by_content(table)[2]
    check_reads(java_reader, table, model)


def test_conversion_after_the_key_was_widened_and_columns_renamed(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Old data and delete files hold the key as int under its old name; new ones as long under the
    new name. Keys are looked up by field id and compared after widening."""
    from pyiceberg.types import LongType

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.w")
        .create_if_missing(format_version=2)
        .upsert(key=["k"])
        .build()
    )
    model: dict[int, str] = {}

    def upsert(rows: list[tuple[int, str]], ddl: str) -> None:
        sink.write(spark.createDataFrame(rows, ddl).repartition(2))
        model.update(dict(rows))

    for batch in range(3):
        upsert([(i, f"v{batch}-{i}") for i in range(batch * 5, batch * 5 + 20)], "k int, v string")
    table = sink.load_table()
    with table.update_schema() as update:
        update.update_column("k", LongType())
        update.rename_column("k", "key")
        update.rename_column("v", "value")
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.w").upsert(key=["key"]).build()
    big = 2**33
    upsert([(3, "new-3"), (17, "new-17"), (big, "big")], "key long, value string")
    upsert([(big, "big-2"), (4, "new-4")], "key long, value string")
    result = convert_equality_deletes(sink.load_table)
    table = sink.load_table()
    assert result.snapshot_id is not None and not files_by_content(table)[2]
    want = sorted(model.items())
    for read in (java_reader.read(table.metadata_location), duckdb_read(table.metadata_location)):
        assert sorted(zip(read.column("key").to_pylist(), read.column("value").to_pylist(), strict=True)) == want


KEY_KINDS = {
    # key columns, Spark DDL, key of the i-th id
    "long": (["id"], "id long, v string", lambda i: (i,)),
    # Required (upsert keys are identifier fields) long strings: kept as Arrow columns.
    "string": (["k"], "k string, v string", lambda i: (f"key-{i:05d}-" + "x" * 3000,)),
    "two columns": (["id", "region"], "id long, region string, v string", lambda i: (i // 2, f"r{i % 2}")),
}


@pytest.mark.parametrize("kind", sorted(KEY_KINDS))
def test_key_index_across_runs_compaction_and_a_restart(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, kind: str
) -> None:
    """The trigger's key index reads each data file once, drops files compaction removed, and a new
    sink (a restart: cold in memory) loads the persisted entries and converts correctly; every
    state reads as the model."""
    from iceberg_sink.topology.conversion.trigger import ConversionTrigger

    keys, ddl, key_of = KEY_KINDS[kind]
    names = [c.split()[0] for c in ddl.split(", ")]
    model: dict[tuple[Any, ...], str] = {}
    rng = random.Random(kind)

    def build() -> Any:
        return (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.k")
            .create_if_missing(format_version=2)
            .upsert(key=keys)
            .convert_equality_deletes(every_n_commits=1, background=False)
            .build()
        )

    def upsert(sink: Any, ids: list[int], version: int) -> None:
        rows = [(*key_of(i), f"v{version}-{i}") for i in ids]
        sink.write(spark.createDataFrame(rows, ddl).repartition(2))
        model.update({r[:-1]: r[-1] for r in rows})

    def check(sink: Any) -> None:
        table = sink.load_table()
        assert not files_by_content(table)[2], "every equality delete converted"
        want = sorted((*tuple(k), v) for k, v in model.items())
        for read in (java_reader.read(table.metadata_location), duckdb_read(table.metadata_location)):
            got = sorted(zip(*(read.column(n).to_pylist() for n in names), strict=True))
            assert got == want

    def index(sink: Any) -> Any:
        trigger: ConversionTrigger = sink._conversion
        return trigger.index

    sink = build()
    upsert(sink, list(range(300)), 0)
    for version in range(1, 5):
        upsert(sink, rng.sample(range(300), 40) + list(range(300 + 10 * version, 310 + 10 * version)), version)
        check(sink)
    table = sink.load_table()
    ever = {
        e.data_file.file_path
        for s in table.snapshots()
        for m in s.manifests(table.io)
        if m.content == 0
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    }
    metrics = sink.metrics()
    assert metrics.conversions_succeeded == 4 and metrics.conversions_failed == 0
    # Each data file read at most once over four runs (without the index: every older file every run).
    assert 0 < metrics.conversion_data_files_read <= len(ever)
    assert index(sink).files > 0 and metrics.conversion_key_index_bytes == index(sink).nbytes

    # Compaction rewrites the data files: the next run indexes the new ones and drops the old.
    sink.compact(spark, CompactionConfig(min_input_files=2, delete_file_threshold=1))
    upsert(sink, rng.sample(range(300), 40), 5)
    check(sink)
    live = {f["file_path"] for f in files_by_content(sink.load_table())[0]}
    assert index(sink).data_paths() <= live

    # A restart: a new sink starts with an empty index in memory and loads the entries the first
    # one persisted (close() waits for its background writes); files indexed by no run are read.
    sink.close()
    restarted = build()
    upsert(restarted, [*rng.sample(range(300), 40), 1000, 1001], 6)
    check(restarted)
    assert restarted.metrics().key_index_entries_loaded > 0
    upsert(restarted, rng.sample(range(300), 40), 7)
    check(restarted)


def test_a_position_delete_file_that_fails_to_write_leaves_no_file_and_commits_nothing(
    spark: SparkSession,
    java_readers: tuple[JavaIcebergReader, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The conversion writes a position delete file per data file; when one write fails (here the
    third, after two were written), every file it wrote is deleted again, nothing is committed, and
    the next conversion converts everything."""
    rng = random.Random(11)
    model: dict[int, dict[str, Any]] = {}
    sink = cdc_sink(tmp_path).build()
    stream(spark, sink, model, rng, 5)
    head = sink.load_table().current_snapshot().snapshot_id  # type: ignore[union-attr]
    real, calls = job.write_position_deletes, {"n": 0}

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(job, "write_position_deletes", failing)
    with pytest.raises(OSError, match="injected"):
        convert_equality_deletes(sink.load_table)
    assert calls["n"] >= 3
    assert sink.load_table().current_snapshot().snapshot_id == head  # type: ignore[union-attr]
    assert not list((tmp_path / "lake").rglob("*-pos-deletes.parquet")), "a written file was left behind"
    monkeypatch.setattr(job, "write_position_deletes", real)
    result = convert_equality_deletes(sink.load_table)
    assert result.snapshot_id is not None and result.added_position_delete_files >= 3
    check_reads(java_readers, sink.load_table(), model)
