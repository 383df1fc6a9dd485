"""Debezium events without a schema part whose field holds another JSON kind than the batch's others
(issue 42, item 2): the event is refused against the table's column type when the table has the
column, else against the kind most of the batch's events give the field, and the rest of the batch
commits. With a dead-letter table the event lands there as received; without one the batch fails
with the same reason before anything is committed. Before, such a batch failed whole ("conflicting
types"), dead-letter table or not, and a stream replayed it on every restart.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink, InvalidInputError
from iceberg_sink.sources.debezium import UNAVAILABLE_VALUE, read_envelope
from tests.integration.test_dead_letter import read_both
from tests.integration.test_debezium_events import envelope, frame
from tests.interop.readers import JavaIcebergReader

pytestmark = pytest.mark.interop

MAJORITY = "the type most of this batch's events give it"
TABLE = "the type of the table's column"


def create(lsn: int, row: dict[str, Any]) -> str:
    """A create event without a schema part (schemas.enable=false)."""
    return envelope("c", lsn, None, row)


def items(lake: Path, dead_letter: bool = True) -> IcebergSink:
    builder = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.items")
        .create_if_missing()
        .debezium(value_column="value", table_column=None)
        .cdc(op_column="op", key=["id"], order_by="lsn")
    )
    return (builder.dead_letter("db.errors") if dead_letter else builder).build()


def errors(sink: IcebergSink) -> list[dict[str, Any]]:
    rows = sink.load_table("db.errors").scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda e: (e["checkpoint_id"], e["kafka_offset"]))


def test_an_event_of_another_kind_is_refused_against_the_majority_then_the_table(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    sink = items(tmp_path / "lake")
    ckpt = str(tmp_path / "ckpt")
    # No table yet: each field takes the kind most events give it.
    first = [
        create(1, {"id": 5001, "qty": 1, "name": "a"}),
        create(2, {"id": "5002", "qty": 2, "name": "b"}),
        create(3, {"id": 5003, "qty": "lots", "name": "c"}),
        create(4, {"id": 5004, "qty": 4, "name": 7}),
        create(5, {"id": 5005, "qty": 5, "name": "e"}),
    ]
    sink.write(frame(spark, first), checkpoint_location=ckpt)
    table = sink.load_table()
    assert [(f.name, str(f.field_type)) for f in table.schema().fields] == [
        ("id", "long"),
        ("qty", "long"),
        ("name", "string"),
        ("lsn", "long"),
    ]
    good = [{"id": 5001, "qty": 1, "name": "a", "lsn": 1}, {"id": 5005, "qty": 5, "name": "e", "lsn": 5}]
    assert read_both(java_reader, table.metadata_location, ["id"]) == good
    # The table exists: its types decide, even where most of the batch's events give another kind
    # (two strings in qty against one number), and the TOAST placeholder text in a long column.
    second = [
        create(6, {"id": 5006, "qty": "lots", "name": "f"}),
        envelope("u", 7, {"id": 5001}, {"id": 5001, "qty": UNAVAILABLE_VALUE, "name": "a2"}),
        create(8, {"id": 5007, "qty": 7, "name": "g"}),
    ]
    sink.write(frame(spark, second), checkpoint_location=ckpt)
    good.append({"id": 5007, "qty": 7, "name": "g", "lsn": 8})
    assert read_both(java_reader, sink.load_table().metadata_location, ["id"]) == good
    got = [(e["checkpoint_id"], e["kafka_offset"], e["raw"], e["reason"], e["error_class"]) for e in errors(sink)]
    assert got == [
        (
            0,
            1,
            first[1],
            f"""field 'id' holds the JSON string "5002", which does not fit long, {MAJORITY}""",
            "InvalidInputError",
        ),
        (
            0,
            2,
            first[2],
            f"""field 'qty' holds the JSON string "lots", which does not fit long, {MAJORITY}""",
            "InvalidInputError",
        ),
        (
            0,
            3,
            first[3],
            f"field 'name' holds the JSON number 7, which does not fit string, {MAJORITY}",
            "InvalidInputError",
        ),
        (
            1,
            0,
            second[0],
            f"""field 'qty' holds the JSON string "lots", which does not fit long, {TABLE}""",
            "InvalidInputError",
        ),
        (
            1,
            1,
            second[1],
            f"""field 'qty' holds the JSON string "{UNAVAILABLE_VALUE}", which does not fit long, {TABLE}""",
            "InvalidInputError",
        ),
    ]


def test_without_a_dead_letter_table_the_batch_fails_naming_the_field_and_commits_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = items(tmp_path / "lake", dead_letter=False)
    ckpt = str(tmp_path / "ckpt")
    sink.write(frame(spark, [create(1, {"id": 1, "qty": 1})]), checkpoint_location=ckpt)
    # One event alone: the batch by itself would read qty as a string; the table says long.
    alone = [create(2, {"id": 2, "qty": "lots"})]
    expected = rf"""field 'qty' holds the JSON string "lots", which does not fit long, {TABLE} \(event: topic items"""
    with pytest.raises(InvalidInputError, match=expected):
        sink.write(frame(spark, alone), checkpoint_location=ckpt)
    assert len(sink.load_table().metadata.snapshots) == 1
    # Called directly (no table), read_envelope fails the job reading it with the same kind of reason.
    batch = frame(
        spark, [create(1, {"id": 1, "ok": True}), create(2, {"id": 2, "ok": "yes"}), create(3, {"id": 3, "ok": False})]
    )
    with pytest.raises(Exception, match=r"""field 'ok' holds the JSON string "yes", which does not fit boolean"""):
        read_envelope(batch).collect()


def test_source_tables_whose_values_settle_on_types_no_column_holds_still_fail_the_batch(spark: SparkSession) -> None:
    """Each source table settles its own types: one table's string column never turns another's
    numbers into refusals. Types no single column holds still fail the batch, naming the field."""
    orders = {"table": "orders"}
    events = [
        create(1, {"id": 1, "code": 7}),
        create(2, {"id": 2, "code": 8}),
        envelope("c", 3, None, {"id": 3, "code": "x"}, None, orders),
    ]
    with pytest.raises(InvalidInputError, match=r"code: is (bigint|string) in some events and (bigint|string) in"):
        read_envelope(frame(spark, events))


def test_a_stream_goes_on_past_an_event_of_another_kind(
    spark: SparkSession, tmp_path: Path, java_reader: JavaIcebergReader
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    lines = [
        [create(1, {"id": 1, "qty": 1}), create(2, {"id": 2, "qty": 2})],
        [create(3, {"id": 3, "qty": 3}), create(4, {"id": 4, "qty": "lots"})],
        [create(5, {"id": 5, "qty": 5})],
    ]
    for i, part in enumerate(lines):
        (source / f"part-{i}.txt").write_text("".join(line + "\n" for line in part))
        os.utime(source / f"part-{i}.txt", (1_700_000_000 + i, 1_700_000_000 + i))
    sink = items(tmp_path / "lake")
    stream = spark.readStream.option("maxFilesPerTrigger", 1).text(str(source))
    query = sink.start(stream, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(600)
    assert query.exception() is None
    assert [(p["checkpoint_id"], p["status"], p["dead_letter_records"]) for p in sink.progress()] == [
        (0, "committed", 0),
        (1, "committed", 1),
        (2, "committed", 0),
    ]
    rows = read_both(java_reader, sink.load_table().metadata_location, ["id"])
    assert [(r["id"], r["qty"]) for r in rows] == [(1, 1), (2, 2), (3, 3), (5, 5)]
    (error,) = sink.load_table("db.errors").scan().to_arrow().to_pylist()
    assert error["raw"] == lines[1][1] and json.loads(error["raw"])["after"]["qty"] == "lots"
    assert error["reason"] == f"""field 'qty' holds the JSON string "lots", which does not fit long, {TABLE}"""
