"""The dead-letter table (``.dead_letter("ns.errors")``): refused rows go to an Iceberg table in the
same checkpoint as the good rows, on every path (single-table append, CDC, routed), exactly once
across SIGKILLs; both tables read back by Iceberg Java and DuckDB; metrics count them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iceberg_sink import IcebergSink, _faults
from iceberg_sink.cli import EXIT_OK, main
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.errors import InvalidInputError, InvalidSinkConfigError
from iceberg_sink.job.dead_letter import DEAD_LETTER_STATE
from iceberg_sink.observe.prometheus import metric_families
from iceberg_sink.sources.rejects import reject_where
from tests.helpers import driver_env
from tests.integration.sources import CHANGE_SCHEMA_DDL, apply_changes, write_change_files
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[2]
ERROR_COLUMNS = [
    "reason",
    "error_class",
    "source_table",
    "event",
    "raw",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
    "job_id",
    "checkpoint_id",
    "dead_lettered_at",
]


def negative_v(df: DataFrame) -> DataFrame:
    """A map_batches function refusing rows with a negative ``v`` (the sources' contract)."""
    return reject_where(
        df,
        F.when(F.col("v") < 0, F.concat(F.lit("v is negative: "), F.col("v"))),
        "NegativeV",
        F.to_json(F.struct("*")),
    )


def read_both(java_reader: JavaIcebergReader, metadata_location: str, key: Sequence[str]) -> list[dict[str, Any]]:
    """The table's rows as Iceberg Java reads them, checked equal to DuckDB's."""
    java = normalize(java_reader.read(metadata_location), key)
    assert normalize(duckdb_read(metadata_location), key) == java, "DuckDB and Iceberg Java differ"
    return java


def errors_of(java_reader: JavaIcebergReader, sink: IcebergSink, name: str) -> list[dict[str, Any]]:
    table = sink.load_table(name)
    assert table.schema().column_names == ERROR_COLUMNS
    assert [f.name for f in table.spec().fields] == ["dead_lettered_at_day"]
    return read_both(java_reader, table.metadata_location, ["raw"])


def test_append_refusals_go_to_the_dead_letter_table_and_are_counted(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    rows = [(i, -i if i % 4 == 3 else i) for i in range(40)]
    df = spark.createDataFrame(rows, "id long, v long")
    bad = [r for r in rows if r[1] < 0]
    # Fail-fast without a dead-letter table: the first refused row fails the batch, nothing committed.
    strict = IcebergSink.builder().embedded(tmp_path / "lake").table("db.strict").create_if_missing()
    strict_sink = strict.map_batches(negative_v).build()
    with pytest.raises(InvalidInputError, match=r"was not written: v is negative: -\d+ \(event: value '\{"):
        strict_sink.write(df)
    assert strict_sink.load_table().current_snapshot() is None

    builder = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").create_if_missing(partition_by=["id"])
    sink = builder.map_batches(negative_v).dead_letter("db.errors").build()
    outcome = sink.write(df, checkpoint_location=str(tmp_path / "ck"))
    assert outcome is not None and outcome.snapshot is not None
    good = read_both(java_reader, sink.load_table().metadata_location, ["id"])
    assert good == [{"id": i, "v": v} for i, v in rows if v >= 0]
    errors = errors_of(java_reader, sink, "db.errors")
    job_id = sink.load_table().current_snapshot().summary["iceberg-sink.job-id"]  # type: ignore[union-attr]
    assert len(errors) == len(bad)
    for error, (i, v) in zip(
        errors, sorted(bad, key=lambda r: json.dumps({"id": r[0], "v": r[1]}, separators=(",", ":"))), strict=True
    ):
        assert error["raw"] == json.dumps({"id": i, "v": v}, separators=(",", ":"))
        assert error["reason"] == f"v is negative: {v}" and error["error_class"] == "NegativeV"
        assert error["source_table"] == "db.t" and error["event"] == f"value '{error['raw']}'"
        assert (error["job_id"], error["checkpoint_id"]) == (job_id, 0)
        assert error["kafka_topic"] is None and error["dead_lettered_at"] is not None
    # The errors table's snapshot is checkpoint 0 of the same job (exactly-once bookkeeping).
    summary = sink.load_table("db.errors").current_snapshot().summary  # type: ignore[union-attr]
    assert (summary["iceberg-sink.job-id"], summary["iceberg-sink.checkpoint-id"]) == (job_id, "0")
    # Metrics: Flink-style, snake_case, per source table, the progress record and Prometheus.
    flink = sink.metrics().flink()
    assert flink["IcebergStreamWriter"]["deadLetterRecords"] == len(bad)
    assert flink["deadLetterRecordsBySourceTable"] == {"db.t": len(bad)}
    snapshot = sink.metrics()
    assert snapshot.dead_letter_records == len(bad)
    assert snapshot.dead_letter_records_by_table == (("db.t", len(bad)),)
    assert snapshot.flushed_records == len(rows) - len(bad)  # the good table's writers only
    assert sink.last_progress()["dead_letter_records"] == len(bad)  # type: ignore[index]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metric_families(snapshot, "db.t", "j")
        for s in family.samples
    }
    labels = (("job", "j"), ("table", "db.t"))
    assert samples[("iceberg_sink_IcebergStreamWriter_deadLetterRecords", labels)] == len(bad)
    by_table = tuple(sorted((*labels, ("source_table", "db.t"))))
    assert samples[("iceberg_sink_IcebergStreamWriter_deadLetterRecordsBySourceTable", by_table)] == len(bad)
    # A second write (all rows good) commits checkpoint 1 to the good table only.
    sink.write(spark.createDataFrame([(100, 1)], "id long, v long"), checkpoint_location=str(tmp_path / "ck"))
    assert len(sink.load_table("db.errors").snapshots()) == 1
    assert sink.last_progress()["dead_letter_records"] == 0  # type: ignore[index]


def test_cdc_null_keys_unknown_ops_and_required_nulls_are_dead_lettered(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    lake = tmp_path / "lake"
    # A table requiring v: a change with a null v does not fit it (refused by the writer task).
    sink0 = IcebergSink.builder().embedded(lake).table("db.x").create_if_missing().build()
    catalog = sink0.config.catalog.load()
    catalog.create_namespace_if_not_exists("db")
    catalog.create_table(
        "db.c",
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "v", StringType(), required=True),
            NestedField(3, "lsn", LongType(), required=False),
            identifier_field_ids=[1],
        ),
    )
    changes = [
        (1, "a", 1, "I"),
        (2, "b", 2, "I"),
        (None, "nokey", 3, "I"),
        (3, "c", 4, "X"),
        (2, None, 5, "U"),  # does not fit: v is required
        (1, None, 6, "D"),  # a delete needs its key only: applied
        (4, "d", 7, "+I"),
        (None, None, 8, "D"),
    ]
    df = spark.createDataFrame(changes, CHANGE_SCHEMA_DDL)
    builder = IcebergSink.builder().embedded(lake).table("db.c").cdc(op_column="op", order_by="lsn")
    sink = builder.dead_letter("db.errors").build()
    sink.write(df, checkpoint_location=str(tmp_path / "ck"))
    good = read_both(java_reader, sink.load_table().metadata_location, ["id"])
    assert good == [{"id": 2, "v": "b", "lsn": 2}, {"id": 4, "v": "d", "lsn": 7}]
    errors = errors_of(java_reader, sink, "db.errors")
    by_lsn = {json.loads(e["raw"])["lsn"]: e for e in errors}
    assert sorted(by_lsn) == [3, 4, 5, 8] and len(errors) == 4
    assert by_lsn[3]["error_class"] == by_lsn[8]["error_class"] == "NullKeyError"
    assert by_lsn[3]["reason"] == "a key column is null (id must all be set); row key: id=null"
    assert by_lsn[4]["error_class"] == "UnknownOperationError"
    assert by_lsn[4]["reason"].startswith("unknown operation code 'X' in column 'op'")
    assert by_lsn[5]["error_class"] == "RequiredColumnNullError"
    assert by_lsn[5]["reason"] == "column 'v' is required (not null) in table db.c but is null"
    assert json.loads(by_lsn[3]["raw"]) == {"id": None, "v": "nokey", "lsn": 3, "op": "I"}
    assert {e["source_table"] for e in errors} == {"db.c"}
    assert sink.metrics().dead_letter_records == 4


def _dash(batch: DataFrame) -> DataFrame:
    """A ``map_batches`` function refusing the rows whose ``v`` is a dash (a source's own refusal)."""
    reason = F.when(F.col("v") == "-", F.lit("v is a dash"))
    return reject_where(batch, reason, "Dash", F.to_json(F.struct("*")), source_table=F.col("tbl"))


def _routed_sink(lake: Path, dead_letter: str | None = None) -> IcebergSink:
    """A routed CDC sink (table column ``tbl``, namespace ``r``) whose :func:`_dash` refuses rows."""
    builder = (
        IcebergSink.builder()
        .embedded(lake)
        .route(table_column="tbl", namespace="r")
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .create_if_missing()
        .map_batches(_dash)
    )
    return (builder.dead_letter(dead_letter) if dead_letter is not None else builder).build()


def test_routed_refusals_share_one_dead_letter_table(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    rows = [
        ("a", 1, "x", 1, "I"),
        ("a", None, "y", 2, "I"),  # null key
        ("b", 1, "z", 3, "I"),
        ("b", 2, "w", 4, "Q"),  # unknown op code
        ("errors", 5, "v", 5, "I"),  # names the dead-letter table itself
        ("c", 9, "-", 6, "I"),  # refused by a map_batches function
    ]
    df = spark.createDataFrame(rows, "tbl string, id long, v string, lsn long, op string")

    sink = _routed_sink(tmp_path / "lake", dead_letter="r.errors")
    sink.write(df, checkpoint_location=str(tmp_path / "ck"))
    catalog = sink.config.catalog.load()
    assert sorted(t[1] for t in catalog.list_tables("r")) == ["a", "b", "errors"]  # no table "c"
    for name, expected in (("r.a", [{"id": 1, "v": "x", "lsn": 1}]), ("r.b", [{"id": 1, "v": "z", "lsn": 3}])):
        assert read_both(java_reader, sink.load_table(name).metadata_location, ["id"]) == expected, name
    errors = errors_of(java_reader, sink, "r.errors")
    got = sorted((e["source_table"], e["error_class"]) for e in errors)
    assert got == [
        ("c", "Dash"),
        ("r.a", "NullKeyError"),
        ("r.b", "UnknownOperationError"),
        ("r.errors", "DeadLetterRouteError"),
    ]
    assert dict(sink.metrics().dead_letter_records_by_table) == {"c": 1, "r.a": 1, "r.b": 1, "r.errors": 1}
    # Without a dead-letter table the same batch fails, naming the first refusal; nothing is committed.
    strict = _routed_sink(tmp_path / "lake2")
    with pytest.raises(InvalidInputError, match="was not written: "):
        strict.write(df)
    strict_catalog = strict.config.catalog.load()
    # Fail-fast refuses in the batch's first Spark job: no table (not even the namespace) is created.
    assert not strict_catalog.namespace_exists("r") or strict_catalog.list_tables("r") == []


def test_a_routed_batch_whose_every_row_is_refused_lands_in_the_dead_letter_table(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """Issue 42, item 1 (routed half): a micro-batch whose every row a source refused (a bad message
    alone in its micro-batch, the common case at a low event rate) goes to the dead-letter table and
    the stream goes on. It failed with IndexError in the change reduction: no table to reduce."""

    sink = _routed_sink(tmp_path / "lake", dead_letter="r.errors")
    schema = "tbl string, id long, v string, lsn long, op string"
    sink.write(spark.createDataFrame([("a", 1, "-", 1, "I"), ("b", 2, "-", 2, "I")], schema), str(tmp_path / "ck"))
    catalog = sink.config.catalog.load()
    assert sorted(t[1] for t in catalog.list_tables("r")) == ["errors"]  # no table for refused rows only
    got = sorted((e["source_table"], e["error_class"]) for e in errors_of(java_reader, sink, "r.errors"))
    assert got == [("a", "Dash"), ("b", "Dash")]
    # The next batch, of good rows, is written as usual.
    sink.write(spark.createDataFrame([("a", 1, "z", 3, "I")], schema), str(tmp_path / "ck"))
    assert read_both(java_reader, sink.load_table("r.a").metadata_location, ["id"]) == [{"id": 1, "v": "z", "lsn": 3}]


def _items_sink(tmp_path: Path, errors: str = "db.errors") -> IcebergSink:
    """A Debezium CDC sink of db.items whose refused events go to ``errors``."""
    return (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.items")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .dead_letter(errors)
        .build()
    )


def _good_item() -> str:
    """A Debezium event (with its schema part) creating row id 1, v 'a', at lsn 1."""
    from tests.integration.test_debezium_events import envelope

    fields = [{"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "v"}]
    return envelope("c", 1, None, {"id": 1, "v": "a"}, fields)


def test_a_debezium_batch_whose_every_event_is_refused_lands_in_the_dead_letter_table(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """Issue 42, item 1 (single-table half): a micro-batch of only refused events (a bad message alone
    in its micro-batch) goes to the dead-letter table, before the table exists and after. It failed
    the batch with SchemaMismatchError (the key column missing: no good event to read columns from),
    and Spark replays a failed batch on every restart: a crash loop."""
    sink = _items_sink(tmp_path)
    ck = str(tmp_path / "ck")
    catalog = sink.config.catalog.load()
    sink.write(spark.createDataFrame([("not json",)], "value string"), ck)  # no table yet
    assert sorted(t[1] for t in catalog.list_tables("db")) == ["errors"]  # nothing to create db.items from
    sink.write(spark.createDataFrame([(_good_item(),)], "value string"), ck)
    sink.write(spark.createDataFrame([("{also not json",), ("[]",)], "value string"), ck)  # the table exists
    assert read_both(java_reader, sink.load_table().metadata_location, ["id"]) == [{"id": 1, "v": "a", "lsn": 1}]
    raws = sorted(e["raw"] for e in errors_of(java_reader, sink, "db.errors"))
    assert raws == sorted(["not json", "{also not json", "[]"])
    assert [p["status"] for p in sink.progress()][-3:] == ["empty", "committed", "empty"]
    assert [p["dead_letter_records"] for p in sink.progress()][-3:] == [1, 0, 2]


def test_a_stream_goes_on_past_a_micro_batch_of_refused_events_only(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """The same as a stream: the bad message's micro-batch commits to the dead-letter table alone, so
    the query neither fails nor replays it, and the next micro-batch creates the table."""
    import os

    source = tmp_path / "src"
    source.mkdir()
    for i, line in enumerate(["not json", _good_item(), "{broken"]):
        (source / f"part-{i}.txt").write_text(line + "\n")
        os.utime(source / f"part-{i}.txt", (1_700_000_000 + i, 1_700_000_000 + i))
    sink = _items_sink(tmp_path)
    stream = spark.readStream.option("maxFilesPerTrigger", 1).text(str(source))
    query = sink.start(stream, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    assert [(p["checkpoint_id"], p["status"], p["dead_letter_records"]) for p in sink.progress()] == [
        (0, "empty", 1),
        (1, "committed", 0),
        (2, "empty", 1),
    ]
    assert read_both(java_reader, sink.load_table().metadata_location, ["id"]) == [{"id": 1, "v": "a", "lsn": 1}]
    assert sorted(e["raw"] for e in errors_of(java_reader, sink, "db.errors")) == ["not json", "{broken"]


def test_text_that_is_not_utf8_keeps_both_tables_readable(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    """A refused event is written as readable text (bad bytes as U+FFFD). Before, a garbage Kafka
    message refused as "not JSON" failed its whole batch even with a dead-letter table (the
    dead-letter writer choked on the raw bytes: WriteFailedError, the stream stopped), and with
    column metrics off its bytes would have gone into the table, which DuckDB then cannot read. A row
    whose own string is not UTF-8 is not dead-lettered (the writers' check, after the split): its
    batch fails naming the column, and nothing is committed."""
    from tests.integration.test_debezium_events import envelope

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.t")
        .create_if_missing()
        .dead_letter("db.errors")
        .build()
    )
    bad = "cast(unhex('C328') as string)"
    df = spark.sql(f"select id, case when id = 3 then {bad} else concat('v', id) end as v from range(6)")
    with pytest.raises(InvalidInputError, match=r"column 'v' holds a string that is not valid UTF-8"):
        sink.write(df, checkpoint_location=str(tmp_path / "ck"))

    cdc = _items_sink(tmp_path, "db.cdc_errors")
    good = envelope(
        "c",
        1,
        None,
        {"id": 1, "v": "a"},
        [{"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "v"}],
    )
    garbage = b"\xff\xfe{not json \xc3\x28"
    events = spark.createDataFrame(
        [("items", 0, 0, good.encode()), ("items", 0, 1, garbage)],
        "topic string, partition int, offset long, value binary",
    )
    cdc.write(events, checkpoint_location=str(tmp_path / "ck-cdc"))
    assert read_both(java_reader, cdc.load_table().metadata_location, ["id"]) == [{"id": 1, "v": "a", "lsn": 1}]
    (refused,) = errors_of(java_reader, cdc, "db.cdc_errors")
    assert refused["kafka_offset"] == 1 and refused["raw"] == garbage.decode("utf-8", "replace")


def test_no_extra_spark_job_when_no_row_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """The split happens in the writer tasks: with .dead_letter and no refused row, a write runs
    as many Spark jobs as without it."""
    df = spark.createDataFrame([(i, i) for i in range(20)], "id long, v long")

    def jobs(dead_letter: str | None, name: str) -> int:
        builder = IcebergSink.builder().embedded(tmp_path / "lake").table(name).create_if_missing()
        builder = builder.map_batches(negative_v)
        if dead_letter is not None:
            builder = builder.dead_letter(dead_letter)
        sink = builder.build()
        sink.write(df.limit(1), checkpoint_location=str(tmp_path / name))  # tables created, workers warm
        group = f"dl-{name}"
        spark.sparkContext.setJobGroup(group, group)
        try:
            sink.write(df, checkpoint_location=str(tmp_path / name))
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))

    without, with_dead_letter = jobs(None, "db.plain"), jobs("db.errors", "db.dl")
    assert with_dead_letter == without >= 1


def test_the_dead_letter_table_is_refused_at_build_when_it_is_the_target(tmp_path: Path) -> None:
    builder = IcebergSink.builder().embedded(tmp_path / "lake").create_if_missing()
    with pytest.raises(InvalidSinkConfigError, match="dead_letter: the dead-letter table must not be the sink's table"):
        builder.table("db.t").dead_letter("DB.T").build()
    with pytest.raises(InvalidSinkConfigError, match=r"dead_letter: expected a table name 'namespace.name'"):
        IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").dead_letter("errors").build()


def test_run_yaml_dead_letter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": 1, "v": "a"}\n{"id": null, "v": "b"}\n')
    config = tmp_path / "p.yaml"
    config.write_text(
        "source: {type: files, path: in, format: json, schema: 'id long, v string'}\n"
        "sink: {embedded: lake, table: db.t, create_if_missing: true, upsert: {key: [id]}, dead_letter: db.errors}\n"
        "checkpoint_location: ck\ntrigger: {availableNow: true}\n"
    )
    assert main(["run", str(config), "--json"]) == EXIT_OK, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").build()
    assert sink.load_table().scan().to_arrow().to_pylist() == [{"id": 1, "v": "a"}]
    errors = sink.load_table("db.errors").scan().to_arrow().to_pylist()
    assert [(e["error_class"], e["raw"]) for e in errors] == [("NullKeyError", '{"id":null,"v":"b"}')]


# -- a real SIGKILL at every step between the two tables' commits ------------------------------------

FILES = 7
# (point, checkpoint, nth hit): the good table stages and commits first, the dead-letter table second.
KILLS: list[tuple[str, int, int, list[str], list[str]]] = [
    # (point, checkpoint, nth, tables holding the checkpoint after the kill, tables with it stored)
    (_faults.AFTER_WRITE, 1, 1, [], []),
    (_faults.AFTER_MANIFESTS, 2, 1, [], ["good"]),  # the good committable persisted, not the errors'
    (_faults.AFTER_MANIFESTS, 3, 2, [], ["good", "errors"]),  # both persisted, nothing committed
    (_faults.AFTER_COMMIT, 4, 1, ["good"], ["good", "errors"]),  # between the two commits
    # The errors' commit landed; the good table's committable was removed after its own commit.
    (_faults.COMMIT_SENT, 5, 2, ["good", "errors"], ["errors"]),
]
# The same steps when the two tables commit in one transaction (the default on this SQL catalog,
# docs/transactions.md): (point, the checkpoint the kill names, nth hit, the checkpoint, holding,
# stored). Points inside the transaction name checkpoint -1; each run replays the checkpoint stored
# by the run before (its transaction is the first hit), so the second is the new checkpoint's.
ATOMIC_KILLS: list[tuple[str, int, int, int, list[str], list[str]]] = [
    (_faults.AFTER_WRITE, 1, 1, 1, [], []),
    (_faults.AFTER_MANIFESTS, 2, 1, 2, [], ["good"]),
    (_faults.AFTER_MANIFESTS, 3, 2, 3, [], ["good", "errors"]),
    # Inside the transaction, the good table's pointer moved: rolled back, neither holds it.
    (_faults.BETWEEN_TABLE_SWAPS, -1, 2, 4, [], ["good", "errors"]),
    # The first table to see the answer: both hold it, both committables still stored.
    (_faults.COMMIT_SENT, 5, 1, 5, ["good", "errors"], ["good", "errors"]),
]


def write_sources(folder: Path) -> tuple[pa.Table, list[int]]:
    """CDC change files, each with bad rows (null keys, unknown op codes) mixed in; returns the good
    changes and the lsn of every bad row."""
    tables = write_change_files(folder, files=FILES, changes_per_file=30, keys=15, seed=11)
    good, bad_lsn = [], []
    for f, table in enumerate(tables):
        rows = table.to_pylist()
        good.append(table)
        top = 10_000 * (f + 1)
        bad = [
            {"id": None, "v": "nokey", "lsn": top + 1, "op": "I"},
            {"id": 3, "v": "badop", "lsn": top + 2, "op": "Z"},
            {"id": None, "v": "both", "lsn": top + 3, "op": "Z"},
        ]
        bad_lsn += [r["lsn"] for r in bad]
        path = folder / f"part-{f:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[:10] + bad + rows[10:], table.schema), path)
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return apply_changes(good), bad_lsn


def run_driver(root: Path, props: dict[str, str], kill: Sequence[Any] | None, atomic: str = "auto") -> str:
    request = root / "request.json"
    stream = {
        "kind": "cdc",
        "table": "db.c",
        "dead_letter": "db.errors",
        "source": str(root / "src"),
        "checkpoint": str(root / "ck"),
        "atomic_commits": atomic,
    }
    request.write_text(json.dumps({"catalog": props, "streams": [stream], "kill": list(kill) if kill else None}))
    out = root / f"driver-{time.monotonic_ns()}.out"
    env = driver_env()
    with out.open("wb") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.crash_driver", str(request)],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out.read_text(encoding="utf-8", errors="replace")


def committed(catalog: Catalog, name: str) -> list[int]:
    if not catalog.table_exists(name):
        return []
    snapshots = catalog.load_table(name).snapshots()
    assert len({s.summary["iceberg-sink.job-id"] for s in snapshots}) <= 1  # type: ignore[index]
    return [int(s.summary["iceberg-sink.checkpoint-id"]) for s in snapshots]  # type: ignore[index]


@pytest.mark.slow
@pytest.mark.parametrize("atomic", ["off", "auto"])
def test_sigkill_between_the_good_and_the_dead_letter_commit_loses_and_duplicates_nothing(
    tmp_path: Path, java_reader: JavaIcebergReader, atomic: str
) -> None:
    (tmp_path / "wh").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'cat.db'}", "warehouse": (tmp_path / "wh").as_uri()}
    expected, bad_lsn = write_sources(tmp_path / "src")
    catalog = load_catalog("crash", **props)
    stores = {
        "good": CheckpointStore(str(tmp_path / "ck")),
        "errors": CheckpointStore(str(tmp_path / "ck"), DEAD_LETTER_STATE),
    }
    names = {"good": "db.c", "errors": "db.errors"}
    kills = ATOMIC_KILLS if atomic == "auto" else [(p, c, n, c, h, s) for p, c, n, h, s in KILLS]
    for point, kill_at, nth, checkpoint, holding, stored in kills:
        output = run_driver(tmp_path, props, (point, kill_at, nth), atomic)
        assert f"KILLING at {point} {kill_at}" in output and "timeout" not in output, output[-4000:]
        for which, name in names.items():
            where = f"{name} killed at {point} (hit {nth}) of checkpoint {checkpoint}"
            assert committed(catalog, name) == list(range(checkpoint + (1 if which in holding else 0))), where
            assert stores[which].pending_ids() == ([checkpoint] if which in stored else []), where
    output = run_driver(tmp_path, props, None, atomic)
    assert "DONE" in output, output[-4000:]
    assert committed(catalog, "db.c") == committed(catalog, "db.errors") == list(range(FILES))
    assert stores["good"].pending_ids() == stores["errors"].pending_ids() == []
    good = catalog.load_table("db.c")
    assert read_both(java_reader, good.metadata_location, ["id"]) == normalize(expected, ["id"])
    errors = read_both(java_reader, catalog.load_table("db.errors").metadata_location, ["raw"])
    got = sorted(json.loads(e["raw"])["lsn"] for e in errors)
    assert got == sorted(bad_lsn)  # each refused row exactly once
    for e in errors:
        lsn = json.loads(e["raw"])["lsn"]
        assert e["checkpoint_id"] == lsn // 10_000 - 1
        assert e["error_class"] == ("UnknownOperationError" if lsn % 10 == 2 else "NullKeyError")
