"""sources/kafka_offsets.py: a checkpoint's Kafka end offsets, from Spark's offset log, as snapshot
summary keys (the stream end to end: tests/integration/test_kafka_source.py, tests/e2e)."""

from __future__ import annotations

import json
from pathlib import Path

from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.sources.kafka_offsets import parse_summary, summary_properties

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
