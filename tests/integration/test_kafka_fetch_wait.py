"""The Kafka source option a micro-batch at the end of its topics waits on (sources/kafka_source.py).

Spark's Kafka source waits the consumer's ``fetch.max.wait.ms`` (500 ms by default) in every task
that reads a partition to its end; ``sink.start`` warns when a Kafka source lacks the option, naming
the source, and the ``iceberg-sink run`` command sets it (tests/integration/test_kafka_source.py
checks that its runs log no such warning). A real broker and Spark's Kafka source, in a subprocess
(the test session's SparkSession has no Kafka jars).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from iceberg_sink.sources.kafka_source import FETCH_WAIT_OPTION, fetch_wait_hint, waiting_sources
from tests.integration.kafka import kafka_broker, run_spark_driver  # noqa: F401


@pytest.mark.slow
def test_start_warns_once_for_a_kafka_source_without_the_fetch_wait(
    kafka_broker: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    kafka_broker.create_topic("events", partitions=1)
    kafka_broker.produce("events", [(str(i), f"event {i}") for i in range(3)])
    done = run_spark_driver(
        "tests.integration.kafka_fetch_wait_driver",
        tmp_path / "request.json",
        {"bootstrap": kafka_broker.bootstrap, "topic": "events", "lake": str(tmp_path / "lake")},
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["found"] == {
        "plain": ["subscribe=events"],
        "with_option": [],
        "union": ["subscribe=events"],
        "assigned": ['assign={"events": [0]}'],
        "rate": [],
        "projected": ["subscribe=events"],
    }
    runs = result["runs"]
    assert runs["plain"] == {"warnings": [fetch_wait_hint(["subscribe=events"])], "exception": None}
    assert runs["with_option"] == {"warnings": [], "exception": None}
    assert runs["rows"] == 6  # both streams read the topic's three events


def test_the_hint_names_the_sources_and_the_option() -> None:
    hint = fetch_wait_hint(["subscribe=a", "subscribePattern=b.*"])
    assert "subscribe=a; subscribePattern=b.*" in hint
    assert f'.option("{FETCH_WAIT_OPTION}", "10")' in hint


def test_a_plan_that_cannot_be_read_gives_no_hint() -> None:
    class NoPlan:
        _jdf = None  # not a JVM Dataset: reading its plan fails

    assert waiting_sources(NoPlan()) == []  # type: ignore[arg-type]


def test_a_stream_without_kafka_gives_no_hint(spark: Any) -> None:
    stream = spark.readStream.format("rate").load()
    assert waiting_sources(stream.union(spark.readStream.format("rate").load())) == []
