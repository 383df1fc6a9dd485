"""benchmarks.batch_timeline on an event log Spark wrote (benchmarks.cdc's Kafka stream of 2026-12-07,
kept to the fields and first micro-batches the timeline reads; two bounded writes before the stream)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.batch_timeline import events, main, medians, timeline

LOG = Path(__file__).parent / "data" / "spark-events-cdc-kafka.jsonl"


def test_each_micro_batch_is_split_into_driver_work_jobs_and_the_gap_to_the_next() -> None:
    log = list(events(LOG))
    rows = timeline(log)
    # The stream's five micro-batches: the two bounded writes before it are no micro-batch of a stream.
    starts = [e for e in log if e["Event"].endswith("SQLExecutionStart")]
    assert [r["execution"] for r in rows] == [
        e["executionId"] for e in starts if e["rootExecutionId"] == e["executionId"] and "runId =" in e["description"]
    ]
    assert len(rows) == 5 and rows[0]["execution"] == 2
    times = {(e["Event"].rsplit(".", 1)[-1], e["executionId"]): e["time"] for e in log if "executionId" in e}
    for n, row in enumerate(rows):
        assert row["before_jobs"] + row["jobs"] + row["after_jobs"] == row["total"] > 0, row
        assert min(row["before_jobs"], row["jobs"], row["after_jobs"]) >= 0, row
        assert row["spark_jobs"] == 1 and row["tasks"] == 2, row  # one write job, one task per Kafka partition
        assert 0 < row["task_cpu_p50"] <= row["task_run_p50"] <= row["jobs"], row
        following = rows[n + 1]["execution"] if n + 1 < len(rows) else None
        if following is not None:
            gap = (
                times[("SparkListenerSQLExecutionStart", following)]
                - times[("SparkListenerSQLExecutionEnd", row["execution"])]
            )
            assert row["between"] == gap >= 0, row
    assert rows[-1]["between"] is None  # the log ends before the next one starts
    # The write job of the first micro-batch: the job of the execution under it (its collect).
    [inner] = [e["executionId"] for e in starts if e["rootExecutionId"] == rows[0]["execution"] != e["executionId"]]
    [job_id] = [e["Job ID"] for e in log if e.get("Properties", {}).get("spark.sql.execution.id") == str(inner)]
    job = {e["Event"]: e for e in log if e.get("Job ID") == job_id}
    assert (
        rows[0]["jobs"]
        == job["SparkListenerJobEnd"]["Completion Time"] - job["SparkListenerJobStart"]["Submission Time"]
    )


def test_the_medians_and_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    rows = timeline(events(LOG))
    assert medians(rows[2:])["jobs"] == sorted(r["jobs"] for r in rows[2:])[1]
    assert main([str(LOG), "--skip", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["batches"] == rows and printed["median"] == medians(rows[2:]) and printed["skipped"] == 2


def test_a_missing_or_compressed_log_is_named(tmp_path: Path) -> None:
    (tmp_path / "events_1_app.zstd").write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(SystemExit, match="expected an uncompressed event log at"):
        list(events(tmp_path))
