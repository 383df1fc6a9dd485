"""Pre- and post-commit hooks: order, snapshot properties, veto keeps the checkpoint pending, failures counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import CommitResult, CommitSummary, CommitVetoedError, IcebergSink, PostCommitHookError
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.job.pipeline import SinkJob
from tests.helpers import LosingCatalog


def test_hooks_run_in_order_and_add_properties(spark: SparkSession, tmp_path: Path) -> None:
    calls: list[str] = []
    results: list[CommitResult] = []

    def pre_a(summary: CommitSummary) -> dict[str, str]:
        calls.append(f"pre_a:{summary.checkpoint_id}:{summary.records}")
        return {"app.batch-records": str(summary.records)}

    def pre_b(summary: CommitSummary) -> None:
        calls.append(f"pre_b:{summary.checkpoint_id}")

    def post_a(result: CommitResult) -> None:
        calls.append(f"post_a:{result.checkpoint_id}")
        results.append(result)

    def post_b(result: CommitResult) -> None:
        calls.append(f"post_b:{result.checkpoint_id}")

    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.h")
        .create_if_missing()
        .pre_commit_hook(pre_a)
        .pre_commit_hook(pre_b)
        .post_commit_hook(post_a)
        .post_commit_hook(post_b)
        .build()
    )
    sink.write(spark.range(0, 7), checkpoint_location=str(tmp_path / "ckpt"))
    assert calls == ["pre_a:0:7", "pre_b:0", "post_a:0", "post_b:0"]
    (result,) = results
    snapshot = sink.load_table().current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert result.snapshot_id == snapshot.snapshot_id and result.operation == "append"
    assert snapshot.summary["app.batch-records"] == "7"
    assert result.snapshot_summary["iceberg-sink.checkpoint-id"] == "0"
    assert sink.metrics().commits == 1 and sink.metrics().committed_records == 7


def test_veto_keeps_the_checkpoint_pending_until_a_restart_commits_it(spark: SparkSession, tmp_path: Path) -> None:
    allow = {"yes": False}

    def gate(summary: CommitSummary) -> None:
        if not allow["yes"]:
            raise RuntimeError("audit service down")

    def build() -> Any:
        return (
            IcebergSink.builder()
            .embedded(tmp_path / "lake")
            .table("db.v")
            .create_if_missing()
            .pre_commit_hook(gate)
            .build()
        )

    sink = build()
    ckpt = str(tmp_path / "ckpt")
    with pytest.raises(CommitVetoedError, match=r"audit service down.*stays pending"):
        sink.write(spark.range(0, 5), checkpoint_location=ckpt, checkpoint_id=0)
    assert sink.load_table().snapshots() == []
    assert [c.checkpoint_id for c in CheckpointStore(ckpt).pending()] == [0]
    assert sink.metrics().vetoed_commits == 1
    allow["yes"] = True
    # The restarted stream replays batch 0: the stored committable is committed, not rewritten.
    outcome = build().write(spark.range(100, 105), checkpoint_location=ckpt, checkpoint_id=0)
    assert outcome is not None and outcome.snapshot is not None
    assert sorted(sink.load_table().scan().to_arrow()["id"].to_pylist()) == [0, 1, 2, 3, 4]
    assert CheckpointStore(ckpt).pending() == []


def test_failing_post_commit_hook_is_counted_and_does_not_undo_the_commit(spark: SparkSession, tmp_path: Path) -> None:
    def broken(result: CommitResult) -> None:
        raise ValueError("dashboard unreachable")

    seen: list[int] = []
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.p")
        .create_if_missing()
        .post_commit_hook(broken)
        .post_commit_hook(lambda r: seen.append(r.checkpoint_id))
        .build()
    )
    sink.write(spark.range(0, 3))
    sink.write(spark.range(3, 6))
    assert sink.metrics().post_commit_hook_failures == 2
    assert seen == [0, 0]  # later hooks still run; each write() is a job of its own
    assert len(sink.load_table().snapshots()) == 2

    strict = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.p")
        .post_commit_hook(broken)
        .write_option("iceberg-sink.post-commit.fail-on-error", True)
        .build()
    )
    with pytest.raises(PostCommitHookError, match="dashboard unreachable"):
        strict.write(spark.range(6, 9))
    assert len(strict.load_table().snapshots()) == 3  # the commit stands


def test_hooks_must_be_callable(tmp_path: Path) -> None:
    from iceberg_sink import InvalidSinkConfigError

    with pytest.raises(InvalidSinkConfigError, match="pre_commit_hook: expected a callable, received 'nope'"):
        IcebergSink.builder().embedded(tmp_path).table("db.x").create_if_missing().pre_commit_hook("nope").build()  # type: ignore[arg-type]


def test_a_commit_whose_response_was_lost_still_runs_post_commit_hooks_and_metrics(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The catalog applies the commit but the answer never arrives: the retry finds the snapshot
    landed, and the checkpoint counts as committed by this run (hooks, metrics, trigger)."""
    results: list[CommitResult] = []
    sink = (
        IcebergSink.builder()
        .embedded(tmp_path / "lake")
        .table("db.lost")
        .create_if_missing()
        .post_commit_hook(results.append)
        .build()
    )
    props = dict(sink.config.catalog.properties)
    catalog = LosingCatalog(sink.config.catalog.name, **props)
    job = SinkJob(sink.config, CheckpointStore(str(tmp_path / "ckpt")), catalog=catalog)
    df = spark.range(0, 5)
    job.ensure_table(df.schema)
    catalog.lose_next = 1
    outcome = job.process(df, 0)
    assert outcome is not None and outcome.snapshot is not None and not outcome.already_committed
    table = sink.load_table()
    assert [r.snapshot_id for r in results] == [table.metadata.current_snapshot_id]
    assert len(table.snapshots()) == 1
    assert job.metrics.snapshot().commits == 1 and job.metrics.snapshot().committed_records == 5
