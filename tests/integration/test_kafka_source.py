"""``iceberg-sink run`` with ``source: kafka`` against a real Kafka broker and Spark's Kafka source.

The broker (Apache Kafka 4.x, KRaft, loopback) and the jars of Spark's Kafka source come from
scripts/pipeline_components.py; the command runs in a subprocess whose SparkSession has the jars on
``spark.jars`` (the test session's shared SparkSession has not). The table is read back with
Iceberg Java and DuckDB, and every snapshot records the Kafka offsets it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.catalog import load_catalog

from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.sources.kafka_offsets import parse_summary, records_between, starting_entry
from iceberg_sink.sources.kafka_source import HINT_START
from tests.integration.kafka import kafka_broker, spark_kafka_conf  # noqa: F401
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def run_cli(config: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "iceberg_sink.cli", "--json", "run", str(config), *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=1800,  # a Spark start and two micro-batches; minutes on a machine shared by many Spark runs
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    # The command sets the Kafka source's options (sources/kafka_source.py): sink.start warns without them.
    assert HINT_START not in done.stderr, done.stderr[-6000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_run_reads_json_events_from_a_kafka_topic(
    kafka_broker: Any,  # noqa: F811
    java_reader: JavaIcebergReader,
    tmp_path: Path,
) -> None:
    """JSON events on two partitions of a topic, upserted by ``id`` in two runs of the command: the
    table equals the last value per id, and each snapshot names the end offsets it holds."""
    kafka_broker.create_topic("orders", partitions=2)
    first = [(str(i), json.dumps({"id": i, "item": f"item-{i}", "qty": i * 10})) for i in range(20)]
    kafka_broker.produce("orders", first)
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": kafka_broker.bootstrap,
                    "topic": "orders",
                    "value_format": "json",
                    "schema": "id long, item string, qty int",
                },
                "sink": {
                    "table": "shop.orders",
                    "embedded": "lake",
                    "create_if_missing": True,
                    "upsert": {"key": ["id"]},
                },
                "checkpoint_location": "checkpoints/orders",
                "spark": {"master": "local[2]", "conf": {**spark_kafka_conf(), "spark.sql.shuffle.partitions": "2"}},
            }
        )
    )
    result = run_cli(config, "--available-now")
    assert result["committed_records"] == 20, result
    # The first micro-batch's records counted as the sink counts them (sink.KafkaBatchRecords), from
    # the starting offsets Spark's Kafka source kept beside its offset log.
    (offsets,) = [p.parent for p in tmp_path.rglob("offsets/0")]
    store = CheckpointStore(str(offsets.parent), create=False)
    entry_0 = store.spark_offset_log(0)
    assert records_between(starting_entry(entry_0, store.spark_initial_offsets), entry_0) == 20
    second = [(str(i), json.dumps({"id": i, "item": f"item-{i}-v2", "qty": -i})) for i in range(10, 25)]
    kafka_broker.produce("orders", second)
    result = run_cli(config, "--available-now")
    assert result["commits"] >= 1, result

    want_rows = {i: {"id": i, "item": f"item-{i}", "qty": i * 10} for i in range(20)}
    want_rows.update({i: {"id": i, "item": f"item-{i}-v2", "qty": -i} for i in range(10, 25)})
    want = sorted(want_rows.values(), key=lambda r: r["id"])
    catalog = load_catalog("iceberg_sink", type="sql", uri=f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}")
    table = catalog.load_table("shop.orders")
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == want

    end = kafka_broker.end_offsets("orders")["orders"]
    assert sum(end.values()) == 35
    recorded = [parse_summary(dict(s.summary.additional_properties)) for s in table.snapshots() if s.summary]
    assert all(r for r in recorded), recorded  # every commit of the stream names its offsets
    assert recorded[-1] == {"orders": end}  # the last one: the whole topic
