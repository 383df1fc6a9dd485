"""sources/kafka_offsets.py: a checkpoint's Kafka end offsets, from Spark's offset log, as snapshot
summary keys (the stream end to end: tests/integration/test_kafka_source.py, tests/e2e)."""

from __future__ import annotations

import json
from pathlib import Path

from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.sink import KafkaBatchRecords
from iceberg_sink.sources.kafka_offsets import (
    initial_offsets,
    parse_summary,
    records_between,
    starting_entry,
    summary_properties,
)

META = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})


def entry(*sources: object) -> bytes:
    return "\n".join(["v1", META, *(json.dumps(s) for s in sources)]).encode()


def test_every_partition_of_every_kafka_source_is_recorded() -> None:
    log = entry({"shop.public.orders": {"1": 7, "0": 12}, "a.b": {"0": 0}}, {"logOffset": 3})
    properties = summary_properties(log)
    assert properties == {
        "kafka.offsets.shop.public.orders.0": "12",
        "kafka.offsets.shop.public.orders.1": "7",
        "kafka.offsets.a.b.0": "0",
    }
    assert parse_summary({**properties, "iceberg-sink.checkpoint-id": "4"}) == {
        "shop.public.orders": {0: 12, 1: 7},
        "a.b": {0: 0},
    }


def test_other_sources_and_missing_entries_add_nothing() -> None:
    assert summary_properties(None) == {}
    assert summary_properties(entry({"logOffset": 3})) == {}
    assert summary_properties(entry({"t": {"x": 1}})) == {}  # not partitions
    assert summary_properties(b"garbage") == {}


def test_the_store_reads_sparks_offset_log_of_a_batch(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_bytes(entry({"t": {"0": 5}}))
    store = CheckpointStore(str(tmp_path))
    assert summary_properties(store.spark_offset_log(3)) == {"kafka.offsets.t.0": "5"}
    assert store.spark_offset_log(4) is None
    assert CheckpointStore.for_table(str(tmp_path), "db.t").spark_offset_log(3) == store.spark_offset_log(3)


def test_a_micro_batchs_records_are_its_end_offsets_minus_the_previous_ones() -> None:
    """The count sizes a Kafka micro-batch Spark cannot size (topology/estimate.py)."""
    before = entry({"orders": {"0": 100, "1": 40}})
    now = entry({"orders": {"1": 45, "0": 5100}})
    assert records_between(before, now) == 5005
    assert records_between(now, now) == 0
    # Unknown: no previous entry (the first micro-batch reads from offsets no entry holds), a partition
    # the previous entry does not name (added to the topic meanwhile), no Kafka source at all.
    assert records_between(None, now) is None
    assert records_between(entry({"orders": {"0": 100}}), now) is None
    assert records_between(entry({"logOffset": 3}), entry({"logOffset": 4})) is None
    assert records_between(b"garbage", now) is None


def test_the_sink_counts_a_micro_batch_from_the_offset_log(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "6").write_bytes(entry({"t": {"0": 10}}))
    (tmp_path / "offsets" / "7").write_bytes(entry({"t": {"0": 25}}))
    (tmp_path / "offsets" / "9").write_bytes(entry({"logOffset": 9}))
    (tmp_path / "offsets" / "10").write_bytes(entry({"logOffset": 10}))
    store = CheckpointStore(str(tmp_path), create=False)
    assert KafkaBatchRecords(store)(7) == 15
    assert KafkaBatchRecords(store)(6) is None  # entry 5 is gone
    assert KafkaBatchRecords(store)(9) is None  # a file source
    assert KafkaBatchRecords(store)(0) is None  # no entry 0
    assert KafkaBatchRecords(CheckpointStore(str(tmp_path / "nowhere"), create=False))(3) is None
    # One query's micro-batches in turn: the entry read for 6 is 7's previous one, and a query whose
    # entry names no Kafka source is not read again (its later entries are not looked at).
    stream = KafkaBatchRecords(store)
    assert stream(6) is None and stream(7) == 15
    (tmp_path / "offsets" / "6").unlink()
    assert KafkaBatchRecords(store)(7) is None  # read again: 6 is gone
    files = KafkaBatchRecords(store)
    assert files(9) is None
    (tmp_path / "offsets" / "10").write_bytes(entry({"t": {"0": 99}}))
    (tmp_path / "offsets" / "11").write_bytes(entry({"t": {"0": 100}}))
    assert files(11) is None and KafkaBatchRecords(store)(11) == 1


def test_a_micro_batch_that_also_reads_another_source_is_not_counted() -> None:
    """Only Kafka's records can be counted: a union with a file source is left unsized."""
    before = entry({"t": {"0": 10}}, {"logOffset": 3})
    assert records_between(before, entry({"t": {"0": 25}}, {"logOffset": 4})) is None
    assert records_between(entry({"t": {"0": 10}}), entry({"t": {"0": 25}})) == 15


def started(offsets: object) -> bytes:
    """A source's starting offsets as Spark keeps them (``sources/<i>/0``: a zero byte, ``v1``, the JSON;
    written so by Spark 4.3's Kafka source, tests/integration/test_kafka_source.py reads a real one)."""
    return b"\0v1\n" + json.dumps(offsets).encode()


def test_a_querys_first_micro_batch_is_counted_from_where_its_sources_started(tmp_path: Path) -> None:
    now = entry({"orders": {"0": 120, "1": 40}})
    assert initial_offsets(started({"orders": {"0": 100, "1": 0}})) == '{"orders": {"0": 100, "1": 0}}'
    assert records_between(starting_entry(now, lambda i: started({"orders": {"0": 100, "1": 0}})), now) == 60
    # Unknown: a source's start not kept, not a Kafka source's, unresolved (-2: earliest), unreadable,
    # a partition it does not name; a union with another source.
    assert records_between(starting_entry(now, lambda i: None), now) is None
    assert records_between(starting_entry(now, lambda i: started({"logOffset": 0})), now) is None
    assert records_between(starting_entry(now, lambda i: started({"orders": {"0": -2, "1": 0}})), now) is None
    assert records_between(starting_entry(now, lambda i: b"garbage"), now) is None
    assert records_between(starting_entry(now, lambda i: started({"orders": {"0": 100}})), now) is None
    two = entry({"orders": {"0": 120}}, {"a": {"0": 7}})
    starts = {0: started({"orders": {"0": 100}}), 1: started({"a": {"0": 5}})}
    assert records_between(starting_entry(two, starts.get), two) == 22
    union = entry({"orders": {"0": 120}}, {"logOffset": 3})
    assert records_between(starting_entry(union, starts.get), union) is None
    # The sink's count of micro-batch 0, from the checkpoint location.
    (tmp_path / "offsets").mkdir()
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "offsets" / "0").write_bytes(now)
    (tmp_path / "offsets" / "1").write_bytes(entry({"orders": {"0": 125, "1": 41}}))
    (tmp_path / "sources" / "0" / "0").write_bytes(started({"orders": {"0": 100, "1": 0}}))
    stream = KafkaBatchRecords(CheckpointStore(str(tmp_path), create=False))
    assert stream(0) == 60 and stream(1) == 6
