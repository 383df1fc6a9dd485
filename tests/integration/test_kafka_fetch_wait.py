"""The Kafka source options a streaming sink waits on (sources/kafka_source.py).

Spark's Kafka source waits the consumer's ``fetch.max.wait.ms`` (500 ms by default) in every task
that reads a partition to its end, and asks for offsets after every poll of ``max.poll.records``
(500); ``sink.start`` warns when a Kafka source lacks either option, naming the source and what it
lacks, and the ``iceberg-sink run`` command sets both (tests/integration/test_kafka_source.py checks
that its runs log no such warning). A real broker and Spark's Kafka source, in a subprocess (the test
session's SparkSession has no Kafka jars).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from iceberg_sink.sources.kafka_source import (
    FETCH_WAIT_OPTION,
    POLL_RECORDS_OPTION,
    lacking_sources,
    options_hint,
)
from tests.integration.kafka import kafka_broker, run_spark_driver  # noqa: F401


@pytest.mark.slow
def test_start_warns_once_for_a_kafka_source_without_the_options(
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
    both = [FETCH_WAIT_OPTION, POLL_RECORDS_OPTION]
    assert result["found"] == {
        "plain": [["subscribe=events", both]],
        "fetch_wait_only": [["subscribe=events", [POLL_RECORDS_OPTION]]],
        "both": [],
        "union": [["subscribe=events", [POLL_RECORDS_OPTION]]],
        "assigned": [['assign={"events": [0]}', both]],
        "rate": [],
        "projected": [["subscribe=events", both]],
    }
    runs = result["runs"]
    plain_hint = options_hint([("subscribe=events", (FETCH_WAIT_OPTION, POLL_RECORDS_OPTION))])
    assert runs["plain"] == {"warnings": [plain_hint], "exception": None}
    poll_hint = options_hint([("subscribe=events", (POLL_RECORDS_OPTION,))])
    assert runs["fetch_wait_only"] == {"warnings": [poll_hint], "exception": None}
    assert runs["both"] == {"warnings": [], "exception": None}
    assert runs["rows"] == 9  # each stream read the topic's three events


def test_the_hint_names_each_source_with_what_it_lacks_and_how_to_set_it() -> None:
    hint = options_hint(
        [("subscribe=a", (FETCH_WAIT_OPTION, POLL_RECORDS_OPTION)), ("subscribePattern=b.*", (POLL_RECORDS_OPTION,))]
    )
    assert (
        f"subscribe=a without {FETCH_WAIT_OPTION}, {POLL_RECORDS_OPTION}; subscribePattern=b.* without {POLL_RECORDS_OPTION}"
        in hint
    )
    assert f'.option("{FETCH_WAIT_OPTION}", "10").option("{POLL_RECORDS_OPTION}", "20000")' in hint
    assert f"{FETCH_WAIT_OPTION} to 500, {POLL_RECORDS_OPTION} to 500" in hint


def test_the_hint_names_only_the_options_that_are_missing() -> None:
    hint = options_hint([("subscribe=a", (POLL_RECORDS_OPTION,))])
    assert FETCH_WAIT_OPTION not in hint
    assert f'.option("{POLL_RECORDS_OPTION}", "20000")' in hint


def test_a_plan_that_cannot_be_read_gives_no_hint() -> None:
    class NoPlan:
        _jdf = None  # not a JVM Dataset: reading its plan fails

    assert lacking_sources(NoPlan()) == []  # type: ignore[arg-type]


def test_a_stream_without_kafka_gives_no_hint(spark: Any) -> None:
    stream = spark.readStream.format("rate").load()
    assert lacking_sources(stream.union(spark.readStream.format("rate").load())) == []
