"""Unchanged TOASTed columns (docs/cdc.md, "TOASTed columns") through ``.debezium(...)`` + ``.cdc(...)``.

PostgreSQL's connector with REPLICA IDENTITY DEFAULT sends ``__debezium_unavailable_value`` in an
update's ``after`` for a TOASTed column it did not change, and no ``before`` value. Before this
change every such update was refused (the stream wedged); now the column keeps the key's value: from
an earlier change of the same batch, else from the table's stored row. Strings, bytes (the
placeholder's bytes, base64 in JSON) and arrays of strings (a one-element array holding it) are
covered. Tables are read back by Iceberg Java and DuckDB.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidInputError, _faults
from iceberg_sink.sources.debezium import UNAVAILABLE_VALUE
from iceberg_sink.table.lookup import stored_rows
from tests.integration.test_debezium_events import envelope, field, frame
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize, pyiceberg_read

pytestmark = pytest.mark.interop

FIELDS = [
    field("id", "int32"),
    field("doc", "string"),
    field("n", "int32"),
    field("blob", "bytes"),
    {"type": "array", "items": {"type": "string", "optional": True}, "optional": True, "field": "tags"},
]
PLACEHOLDER_BYTES = base64.b64encode(UNAVAILABLE_VALUE.encode()).decode()
COLUMNS = ["id", "doc", "n", "blob", "tags"]


def text(i: int, version: int = 0) -> str:
    return f"long text {i}.{version} " + "x" * 3000  # what PostgreSQL would TOAST


def insert(i: int, lsn: int, version: int = 0) -> str:
    row = {"id": i, "doc": text(i, version), "n": 0, "blob": base64.b64encode(b"b%d" % i).decode(), "tags": [f"t{i}"]}
    return envelope("c", lsn, None, row, FIELDS)


def toasted(i: int, lsn: int, n: int) -> str:
    """An update that changed only ``n``: every TOASTed column holds the placeholder, no before value."""
    row = {"id": i, "doc": UNAVAILABLE_VALUE, "n": n, "blob": PLACEHOLDER_BYTES, "tags": [UNAVAILABLE_VALUE]}
    return envelope("u", lsn, {"id": i}, row, FIELDS)


def expected(i: int, n: int, version: int = 0) -> dict[str, Any]:
    return {"id": i, "doc": text(i, version), "n": n, "blob": b"b%d" % i, "tags": [f"t{i}"]}


def builder(lake: Path, table: str = "cdc.docs") -> Any:
    return (
        IcebergSink.builder()
        .embedded(lake)
        .table(table)
        .create_if_missing(format_version=2)  # PyIceberg renames columns and commits beside it: v2 only
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
    )


def build(lake: Path, table: str = "cdc.docs") -> IcebergSink:
    sink: IcebergSink = builder(lake, table).build()
    return sink


def read_back(java_reader: JavaIcebergReader, s: IcebergSink, columns: list[str] = COLUMNS) -> list[dict[str, Any]]:
    location = s.load_table().metadata_location
    java = normalize(java_reader.read(location).select(columns), ["id"])
    duck = normalize(duckdb_read(location).select(columns), ["id"])
    assert java == duck
    for row in java:
        row["blob"] = bytes(row["blob"]) if row["blob"] is not None else None
        row["tags"] = list(row["tags"]) if row["tags"] is not None else None
    return java


def test_unchanged_toasted_columns_keep_their_stored_values(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = build(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    # Checkpoint 0: rows with long values, one data file per checkpoint.
    s.write(frame(spark, [insert(i, i) for i in range(1, 6)]), checkpoint_location=ckpt)
    # Checkpoint 1: placeholders from the table (1, 2); within the batch (6 inserted, then updated
    # twice); a key updated twice with placeholders only (3: both from the table).
    batch = [toasted(1, 10, 1), toasted(2, 11, 1), insert(6, 12), toasted(6, 13, 1), toasted(6, 14, 2)]
    batch += [toasted(3, 15, 1), toasted(3, 16, 2)]
    s.write(frame(spark, batch), checkpoint_location=ckpt)
    model = {i: expected(i, 0) for i in range(1, 7)}
    model.update({1: expected(1, 1), 2: expected(2, 1), 3: expected(3, 2), 6: expected(6, 2)})
    assert read_back(java_reader, s) == [model[i] for i in sorted(model)]
    # Checkpoint 2: key 1 again (its row is now in checkpoint 1's file, checkpoint 0's is deleted by
    # an equality delete), key 4 whose doc changed in the same batch before the placeholder.
    changed = envelope(
        "u",
        21,
        {"id": 4},
        {"id": 4, "doc": text(4, 1), "n": 1, "blob": PLACEHOLDER_BYTES, "tags": [UNAVAILABLE_VALUE]},
        FIELDS,
    )
    s.write(frame(spark, [toasted(1, 20, 2), changed, toasted(4, 22, 2)]), checkpoint_location=ckpt)
    model[1] = expected(1, 2)
    model[4] = expected(4, 2, version=1)
    assert read_back(java_reader, s) == [model[i] for i in sorted(model)]


def test_stored_values_are_found_after_conversion_and_compaction(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = build(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [insert(i, i) for i in range(1, 4)]), checkpoint_location=ckpt)
    # A real new value for 1, so checkpoint 0's row of 1 is dead (equality delete).
    s.write(frame(spark, [insert(1, 10, version=1).replace('"op": "c"', '"op": "u"')]), checkpoint_location=ckpt)
    assert s.convert_equality_deletes().snapshot_id is not None  # the equality delete -> a position delete
    s.write(frame(spark, [toasted(1, 20, 5), toasted(2, 21, 5)]), checkpoint_location=ckpt)
    model = {1: expected(1, 5, version=1), 2: expected(2, 5), 3: expected(3, 0)}
    assert read_back(java_reader, s) == [model[i] for i in sorted(model)]
    s.compact(spark)
    s.write(frame(spark, [toasted(1, 30, 6), toasted(3, 31, 6)]), checkpoint_location=ckpt)
    model.update({1: expected(1, 6, version=1), 3: expected(3, 6)})
    assert read_back(java_reader, s) == [model[i] for i in sorted(model)]


def test_stored_values_of_a_v3_table_are_the_live_ones_not_those_its_deletion_vectors_removed(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """On format v3 an update's old row is removed by a deletion vector. The lookup applied position
    and equality deletes but no DV, so every earlier version of a key was "stored" too, and the join
    kept any one of them: an unchanged TOASTed column could take a value two updates old."""
    s: IcebergSink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.docs")
        .create_if_missing(format_version=3)
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    keys = range(1, 31)
    s.write(frame(spark, [insert(i, i) for i in keys]), checkpoint_location=ckpt)
    for version in (1, 2):  # real new values: each replaces the key's row, its old one goes to a DV
        batch = [insert(i, 100 * version + i, version).replace('"op": "c"', '"op": "u"') for i in keys]
        s.write(frame(spark, batch), checkpoint_location=ckpt)
    rows, _ = stored_rows(s.load_table(), "main", ["id"], [(i,) for i in keys], ["doc"])
    assert sorted(rows) == sorted((i, text(i, 2)) for i in keys)  # one live row per key
    s.write(frame(spark, [toasted(i, 300 + i, 7) for i in keys]), checkpoint_location=ckpt)
    model = [expected(i, 7, version=2) for i in keys]
    assert read_back(java_reader, s) == model
    assert normalize(pyiceberg_read(s.load_table().metadata_location).select(COLUMNS), ["id"]) == normalize(
        pa.Table.from_pylist(model), ["id"]
    )


def test_a_key_never_stored_is_refused_naming_the_column(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    s = build(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [insert(1, 1)]), checkpoint_location=ckpt)
    with pytest.raises(InvalidInputError, match=r"column 'doc' holds Debezium's placeholder .* no row of its key"):
        s.write(frame(spark, [toasted(1, 2, 1), toasted(9, 3, 1)]), checkpoint_location=ckpt)
    # After a delete of the key in the same batch nothing is stored to take the value from.
    deleted = envelope("d", 4, {"id": 1}, None, FIELDS)
    with pytest.raises(InvalidInputError, match=r"column 'doc' .* deleted earlier in this batch"):
        s.write(frame(spark, [deleted, toasted(1, 5, 1)]), checkpoint_location=ckpt)
    assert read_back(java_reader, s) == [expected(1, 0)]


def test_renamed_column_and_routed_tables_and_pruned_files(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """A column renamed in the table (and at the source) finds its values in files written under the
    old name; each routed table is looked up by itself; a key's lookup reads only the data files
    whose key bounds hold it."""
    s = build(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    for start in (1, 11, 21):  # three checkpoints, three data files with disjoint id ranges
        s.write(frame(spark, [insert(i, i) for i in range(start, start + 3)]), checkpoint_location=ckpt)
    table = s.load_table()
    with table.update_schema() as update:
        update.rename_column("doc", "body")
    renamed = [{**f, "field": "body"} if f["field"] == "doc" else f for f in FIELDS]
    row = {"id": 22, "body": UNAVAILABLE_VALUE, "n": 7, "blob": PLACEHOLDER_BYTES, "tags": [UNAVAILABLE_VALUE]}
    s.write(frame(spark, [envelope("u", 40, {"id": 22}, row, renamed)]), checkpoint_location=ckpt)
    got = {r["id"]: r for r in read_back(java_reader, s, ["id", "body", "n", "blob", "tags"])}
    assert got[22] == {"id": 22, "body": text(22), "n": 7, "blob": b"b22", "tags": ["t22"]}
    assert got[21]["body"] == text(21) and got[21]["n"] == 0
    rows, read = stored_rows(s.load_table(), "main", ["id"], [(2,)], ["body"])
    assert rows == [(2, text(2))] and read == 1

    routed = (
        IcebergSink.builder()
        .embedded(tmp_path / "routed")
        .route(table_column="source_table", namespace="cdc")
        .create_if_missing()
        .debezium(value_column="value")
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .build()
    )
    rckpt = str(tmp_path / "rckpt")
    notes = {"table": "notes"}
    first = [insert(1, 1), envelope("c", 2, None, {"id": 1, "doc": "note one", "n": 0}, FIELDS, notes)]
    routed.write(frame(spark, first), checkpoint_location=rckpt)
    note = {"id": 1, "doc": UNAVAILABLE_VALUE, "n": 3}
    second = [toasted(1, 3, 3), envelope("u", 4, {"id": 1}, note, FIELDS, notes)]
    routed.write(frame(spark, second), checkpoint_location=rckpt)
    for name, doc in (("items", text(1)), ("notes", "note one")):
        location = routed.load_table(f"cdc.{name}").metadata_location
        java = normalize(java_reader.read(location).select(["id", "doc", "n"]), ["id"])
        assert java == normalize(duckdb_read(location).select(["id", "doc", "n"]), ["id"])
        assert java == [{"id": 1, "doc": doc, "n": 3}], name


def test_unknown_values_go_to_the_dead_letter_table(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """With .dead_letter(...) an update whose TOASTed value is nowhere to be found is dead-lettered,
    naming the column; the batch's other changes, placeholders found in the table among them, commit."""
    s = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.docs")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .dead_letter("cdc.errors")
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [insert(1, 1)]), checkpoint_location=ckpt)
    s.write(frame(spark, [toasted(1, 2, 4), toasted(7, 3, 4)]), checkpoint_location=ckpt)
    assert read_back(java_reader, s) == [expected(1, 4)]
    errors = s.load_table("cdc.errors").scan().to_arrow().to_pylist()
    assert [e["error_class"] for e in errors] == ["InvalidInputError"]
    assert "column 'doc' holds Debezium's placeholder" in errors[0]["reason"]
    assert errors[0]["raw"] == toasted(7, 3, 4)  # the event as received


def test_a_dead_lettered_placeholder_keeps_the_event_as_received(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Issue 42, item 3: an event refused for a TOASTed value found nowhere is dead-lettered as it was
    received (its text, Kafka coordinates and source table), as every other refused event is. Its
    ``raw`` held the row the reduction made of it (op, ``before`` and ``source`` lost), its ``event``
    that row's text instead of the Kafka coordinates."""
    s = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("cdc.docs")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
        .dead_letter("cdc.errors")
        .build()
    )
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [insert(1, 1)]), checkpoint_location=ckpt)
    never_stored = toasted(7, 3, 4)  # no stored row of key 7
    after_delete = toasted(1, 5, 4)  # key 1 deleted earlier in the batch
    batch = [never_stored, envelope("d", 4, {"id": 1}, None, FIELDS), after_delete, insert(2, 6)]
    s.write(frame(spark, batch), checkpoint_location=ckpt)
    # The batch's good changes commit, key 1's delete too: the refused update after it does not take
    # the delete with it (before, key 1 stayed in the table).
    assert read_back(java_reader, s) == [expected(2, 0)]
    location = s.load_table("cdc.errors").metadata_location
    errors = sorted(
        java_reader.read(location).to_pylist(), key=lambda e: e["kafka_offset"] if e["kafka_offset"] is not None else -1
    )
    assert normalize(duckdb_read(location), ["kafka_offset"]) == normalize(java_reader.read(location), ["kafka_offset"])
    got = [(e["kafka_offset"], e["raw"], e["event"], e["source_table"], e["error_class"]) for e in errors]
    assert got == [
        (0, never_stored, "topic items partition 0 offset 0", "cdc.docs", "InvalidInputError"),
        (2, after_delete, "topic items partition 0 offset 2", "cdc.docs", "InvalidInputError"),
    ]
    assert "no row of its key" in errors[0]["reason"] and "deleted earlier in this batch" in errors[1]["reason"]


def test_a_refused_event_beside_placeholders_fails_the_batch_as_invalid_input(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """The TOAST lookup collects the keys still marked in a Spark job of its own, before the writers:
    a refused event of the same batch (here an order value that is not a long) fails that job first.
    It must still be reported as InvalidInputError naming the event, with nothing committed (the
    model check's seed 5 caught it raised as Spark's own exception)."""
    s = build(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [insert(i, i) for i in range(1, 3)]), checkpoint_location=ckpt)
    bad = envelope("c", "abc", None, {"id": 9, "doc": "d", "n": 0, "blob": None, "tags": None}, FIELDS)
    with pytest.raises(InvalidInputError, match=r"order value 'abc' at source.lsn is not a long"):
        s.write(frame(spark, [toasted(1, 10, 1), bad]), checkpoint_location=ckpt)
    assert [snap.summary["iceberg-sink.checkpoint-id"] for snap in s.load_table().snapshots()] == ["0"]  # type: ignore[index]
    assert read_back(java_reader, s) == [expected(1, 0), expected(2, 0)]


def test_stored_values_are_not_read_while_an_earlier_checkpoint_is_pending_after_lost_races(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """A stream whose checkpoint 1 (a new doc for key 1) lost every commit attempt to another writer
    keeps it pending; checkpoint 2 needs key 1's stored doc, which the table does not hold yet (it is
    in the pending checkpoint): the batch must fail naming why, never take the stale doc, and a
    restart commits checkpoint 1, then 2 with the doc of 1."""
    import os

    from pyspark.errors import StreamingQueryException

    from iceberg_sink import _faults

    source = tmp_path / "src"
    source.mkdir()

    def add(n: int, events: list[str]) -> None:
        hidden = source / f".{n}.tmp"
        hidden.write_text("\n".join(events) + "\n")
        os.utime(hidden, (1_700_000_000 + n, 1_700_000_000 + n))  # the file stream's order
        hidden.rename(source / f"{n:03d}.json")

    def start(s: IcebergSink) -> Any:
        return s.start(spark.readStream.option("maxFilesPerTrigger", 1).text(str(source)), str(tmp_path / "ckpt"))

    s = (
        builder(tmp_path / "lake")
        .write_option("commit.retry.num-retries", 1)
        .write_option("commit.retry.min-wait-ms", 10)
        .write_option("iceberg-sink.commit.pending-retry-interval-ms", 0)
        .build()
    )
    others: list[int] = []

    def other_writer(point: str, checkpoint_id: int) -> None:
        if point == _faults.BEFORE_COMMIT_SEND and checkpoint_id == 1:
            table = s.load_table()
            table.append(table.schema().as_arrow().empty_table())
            others.append(checkpoint_id)

    query = start(s)
    try:
        add(0, [insert(i, i) for i in range(1, 4)])
        query.processAllAvailable()
        _faults.install(other_writer)
        add(1, [insert(1, 10, version=1).replace('"op": "c"', '"op": "u"')])
        query.processAllAvailable()
        assert s.metrics().pending_checkpoints == 1 and query.isActive
        add(2, [toasted(1, 20, 5), toasted(2, 21, 5)])
        with pytest.raises(StreamingQueryException) as failure:
            query.processAllAvailable()
    finally:
        query.stop()
        _faults.clear()
    message = str(failure.value)
    assert "CommitRetriesExhaustedError" in message and "other writers won every commit attempt" in message, message
    assert "TOASTed" in message, message
    assert others, "the other writer never committed"
    history = [
        snap.summary["iceberg-sink.checkpoint-id"]
        for snap in s.load_table().snapshots()
        if snap.summary and "iceberg-sink.checkpoint-id" in snap.summary.additional_properties
    ]
    assert history == ["0"], history

    s = build(tmp_path / "lake")
    query = start(s)
    try:
        query.processAllAvailable()  # Spark runs batch 2 again: checkpoint 1 is committed first
    finally:
        query.stop()
    assert query.exception() is None
    model = {1: expected(1, 5, version=1), 2: expected(2, 5), 3: expected(3, 0)}
    assert read_back(java_reader, s) == [model[i] for i in sorted(model)]


def test_stored_values_are_read_again_when_another_writer_expired_the_files_the_batch_loaded(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Between the checkpoint's load of the table and its lookup of stored values, the table is
    compacted and Iceberg Java expires every older snapshot (``retain_last => 1``), deleting the files
    of the table as the batch loaded it. The lookup read those files and failed with FileNotFoundError
    (the stream stopped); it now reads the table as the catalog has it (the same rule as commits)."""
    s = build(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    s.write(frame(spark, [insert(i, i) for i in range(1, 4)]), checkpoint_location=ckpt)
    s.write(frame(spark, [insert(1, 10, version=1).replace('"op": "c"', '"op": "u"')]), checkpoint_location=ckpt)
    other = build(tmp_path / "lake")
    loaded: set[str] = set()

    def other_writers(point: str, checkpoint_id: int) -> None:
        if point != _faults.BEFORE_LOOKUP or loaded:
            return
        table = other.load_table()
        loaded.update(f["file_path"] for f in table.inspect.files().to_pylist() if f["content"] == 0)
        other.compact(spark)
        # Iceberg Java's expiry, through a JDBC catalog of its own; the sink's catalog then points at
        # Java's metadata, as if Java had committed to it.
        jdbc = java_reader.catalog(f"{tmp_path}/java-wh", jdbc_uri=f"jdbc:sqlite:file:{tmp_path}/java-catalog.db")
        java_reader.sql(f"CREATE NAMESPACE IF NOT EXISTS {jdbc}.cdc")
        metadata = other.load_table().metadata_location
        java_reader.sql(f"CALL {jdbc}.system.register_table(table => 'cdc.docs', metadata_file => '{metadata}')")
        java_reader.sql(
            f"CALL {jdbc}.system.expire_snapshots(table => 'cdc.docs', "
            "older_than => TIMESTAMP '2100-01-01 00:00:00', retain_last => 1)"
        )
        folder = Path(table.location().removeprefix("file://")) / "metadata"
        newest = max(folder.glob("*.metadata.json"), key=lambda p: p.stat().st_mtime_ns)
        catalog = table.catalog
        catalog.drop_table("cdc.docs")
        catalog.register_table("cdc.docs", newest.as_uri())

    _faults.install(other_writers)
    try:
        s.write(frame(spark, [toasted(1, 20, 5), toasted(2, 21, 5)]), checkpoint_location=ckpt)
    finally:
        _faults.clear()
    assert loaded and not [p for p in loaded if Path(p.removeprefix("file://")).exists()]  # Java deleted them
    model = {1: expected(1, 5, version=1), 2: expected(2, 5), 3: expected(3, 0)}
    assert read_back(java_reader, s) == [model[i] for i in sorted(model)]
