"""The commit lane (job/lane.py): a v3 stream's commit runs beside its next micro-batch when its
Kafka source had more records waiting, with commit order, exactly once and the hooks unchanged.

A real broker and Spark's Kafka source, in a subprocess (the test session's SparkSession has no
Kafka jars): tests/integration/commit_lane_driver.py. The topic's keyed records (a key's changes in
one partition, as Debezium writes them) are read 40 at a time, so every micro-batch but the last
has records waiting behind it.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from iceberg_sink import _faults
from iceberg_sink.sources.debezium import UNAVAILABLE_VALUE
from tests.integration.kafka import kafka_broker, run_spark_driver  # noqa: F401
from tests.integration.test_debezium_events import envelope, field
from tests.interop.readers import JavaIcebergReader, assert_readers_agree

RECORDS, KEYS, PER_TRIGGER = 400, 50, 40
STALL = [_faults.BEFORE_COMMIT_SEND, 1.5]


def _produce(broker: Any, topic: str, seed: int) -> dict[int, str]:
    """RECORDS random updates of KEYS keys; the model: each key's last value."""
    rng = random.Random(seed)
    broker.create_topic(topic, partitions=2)
    records = [(str(rng.randrange(KEYS)), f"v{i}-{rng.randrange(10**6)}") for i in range(RECORDS)]
    broker.produce(topic, records)
    return {int(k): v for k, v in records}


def _run(
    tmp_path: Path,
    broker: Any,
    topic: str,
    overlap: str,
    kill: list[Any] | None = None,
    debezium: bool = False,
    stall: list[Any] | None = None,
) -> dict[str, Any]:
    killed_on = tmp_path / "killed_on"
    killed_on.unlink(missing_ok=True)  # a kill's thread name is this run's, never an earlier run's
    fields = {
        "bootstrap": broker.bootstrap,
        "topic": topic,
        "lake": str(tmp_path / "lake"),
        "checkpoint": str(tmp_path / "checkpoint"),
        "overlap": overlap,
        "per_trigger": PER_TRIGGER,
        "kill": kill,
        "killed_on": str(killed_on),
        "debezium": debezium,
        "stall": stall,
    }
    # A kill takes the driver's process group: the driver, its JVM and workers.
    done = run_spark_driver("tests.integration.commit_lane_driver", tmp_path / "request.json", fields)
    if kill:
        assert done.returncode != 0, "the driver was to be killed"
        return {"killed_on": killed_on.read_text()}
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _every_checkpoint_once(result: dict[str, Any]) -> None:
    checkpoints = result["checkpoints"]
    assert sorted(checkpoints) == list(range(len(checkpoints))), checkpoints  # one snapshot each
    assert checkpoints == sorted(checkpoints)  # committed in order (snapshots listed oldest first)


@pytest.mark.slow
def test_commits_run_beside_the_next_micro_batch_and_land_in_order(
    kafka_broker: Any,  # noqa: F811
    tmp_path: Path,
    java_readers: tuple[JavaIcebergReader, ...],
) -> None:
    model = _produce(kafka_broker, "kv", seed=41)
    # Each commit on the lane stalls, so the next micro-batch is planned and written beside it.
    result = _run(tmp_path, kafka_broker, "kv", "auto", stall=STALL)
    # Every record is in the table when processAllAvailable() returns: the last micro-batch had
    # nothing waiting, so it committed before returning, after the lane's checkpoint.
    assert [(i, v) for i, v, _ in result["rows"]] == sorted(model.items())
    records = result["progress"]
    statuses = [r["status"] for r in records]
    assert statuses[-1] == "committed"
    assert "committing" in statuses and set(statuses) <= {"committing", "committed"}, statuses
    assert result["overlapped_commits"] == statuses.count("committing")
    # A checkpoint committed on the lane is named by the next micro-batch's record, which took it.
    for before, after in itertools.pairwise(records):
        if before["status"] == "committing":
            assert before["snapshot_id"] is None
            assert before["checkpoint_id"] in after["committed_pending"], (before, after)
    _every_checkpoint_once(result)
    assert len(result["checkpoints"]) == len(records)
    # Post-commit hooks: once per checkpoint, in order, never on the lane's thread.
    hooks = result["hooks"]
    assert [h["checkpoint_id"] for h in hooks] == sorted(result["checkpoints"])
    assert not [h for h in hooks if h["thread"].startswith("iceberg-sink-commit")], hooks
    assert_readers_agree(
        java_readers, result["metadata_location"], [{"id": i, "v": v, "seq": s} for i, v, s in result["rows"]], ["id"]
    )


@pytest.mark.slow
def test_a_driver_killed_while_the_lane_commits_loses_nothing_and_commits_nothing_twice(
    kafka_broker: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Killed on the lane at each step of a commit in turn, on one checkpoint location: each restart
    recovers from the kill before it (its checkpoint pending, or committed and not yet seen) and is
    killed at the next step of a later checkpoint. The last restart runs to the end with the lane off
    (``never``): every micro-batch it runs commits before it returns."""
    model = _produce(kafka_broker, "kv", seed=43)
    kills = ((_faults.BEFORE_COMMIT_SEND, 3), (_faults.COMMIT_SENT, 5), (_faults.AFTER_COMMIT, 7))
    for point, checkpoint in kills:
        killed = _run(tmp_path, kafka_broker, "kv", "auto", kill=[point, checkpoint])
        assert killed["killed_on"].startswith("iceberg-sink-commit"), (point, killed)  # it died on the lane
    result = _run(tmp_path, kafka_broker, "kv", "never")  # the same checkpoint location, restarted
    assert [(i, v) for i, v, _ in result["rows"]] == sorted(model.items())
    assert {r["status"] for r in result["progress"]} == {"committed"}
    assert result["overlapped_commits"] == 0
    _every_checkpoint_once(result)


@pytest.mark.slow
def test_unchanged_toasted_columns_take_the_value_the_commit_on_the_lane_wrote(
    kafka_broker: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A key's update in micro-batch N sets a TOASTed column; its update in N+1 leaves it unchanged
    (the placeholder), so N+1 reads the stored row: with N's commit still on the lane while N+1 is
    planned, the lookup must wait for it, or it reads the value N replaced."""
    fields = [field("id", "int32"), field("doc", "string"), field("n", "int32")]
    kafka_broker.create_topic("docs", partitions=1)  # micro-batches of exactly PER_TRIGGER events
    events, lsn = [], 0
    for version in range(5):
        for i in range(PER_TRIGGER):  # one micro-batch: every key's document replaced
            lsn += 1
            row = {"id": i, "doc": f"doc {i}.{version}", "n": -1}
            events.append(envelope("c" if version == 0 else "u", lsn, None if version == 0 else {"id": i}, row, fields))
        for i in range(PER_TRIGGER):  # the next: only n changed, the document TOASTed
            lsn += 1
            row = {"id": i, "doc": UNAVAILABLE_VALUE, "n": version}
            events.append(envelope("u", lsn, {"id": i}, row, fields))
    kafka_broker.produce("docs", [(None, e) for e in events])
    # Each commit on the lane stalls, so the next micro-batch is planned while it runs.
    result = _run(tmp_path, kafka_broker, "docs", "auto", debezium=True, stall=STALL)
    assert [tuple(r) for r in result["rows"]] == [(i, f"doc {i}.4", 4) for i in range(PER_TRIGGER)]
    assert "committing" in {r["status"] for r in result["progress"]}
    _every_checkpoint_once(result)
