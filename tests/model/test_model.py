"""The randomized model check (docs/model-check.md): real Spark writes and commits against Python models."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyspark.sql import SparkSession

from iceberg_sink import _faults
from iceberg_sink.keyindex.manifest import read_current
from iceberg_sink.sources import debezium as debezium_module
from tests.interop.readers import JavaIcebergReader
from tests.model import debezium_steps, harness, transactions_steps, v3_steps
from tests.model.harness import SKIP_ENV, World
from tests.model.points import INDEX_FAULT_POINTS

pytestmark = pytest.mark.interop


def test_model(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    java_newest_reader: JavaIcebergReader,
    tmp_path: Path,
    model_seed: int,
    model_steps: int,
    model_long: bool,
) -> None:
    world = World(spark, java_reader, tmp_path, model_seed, long=model_long, java_newest=java_newest_reader)
    seconds = world.run(model_steps)
    v3 = sum(": v3: " in line for line in world.trace)
    index_deaths = sum("[crash at index-" in line and "-> crashed" in line for line in world.trace)
    tables = v3_steps.tables(world)
    layout = f"DVs {tables.layout_of(v3_steps.V3)}, up to {tables.stats['shared_puffins']} shared files live"
    sys.stderr.write(
        f"model check seed {model_seed}: {model_steps} steps ({v3} on v3 tables: {layout}; {index_deaths} driver "
        f"deaths inside a key index save; writes by road: {dict(world.roads)}) in {seconds:.1f}s\n"
    )
    if world.keyed_frames:
        # Frames partitioned by key under "always": some write took the writers' road (not only Spark's).
        assert world.roads["reduced in the writer tasks"] > 0, world.roads


def test_model_catalog_outages(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short profile may draw ``catalog_outage`` rarely: one seed where it dominates, between the
    writes of every job, so pending checkpoints, both recovery paths, the limit and both reasons (an
    unreachable catalog, races lost to another writer on every attempt) always run."""
    monkeypatch.setattr(harness, "OPERATIONS", {"cdc": 2, "upsert": 1, "append": 1, "catalog_outage": 4})
    world = harness.World(spark, java_reader, tmp_path, seed=5)
    seconds = world.run(8)
    outages = [line for line in world.trace if ": catalog outage: " in line]
    lost = [line for line in world.trace if ": lost races: " in line]
    assert outages and lost and len(outages) + len(lost) >= 3, world.trace
    sys.stderr.write(
        f"model check: {len(outages)} catalog outages, {len(lost)} windows of lost races in {seconds:.1f}s\n"
    )


def test_compaction_racing_the_conversion_both_ways(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compactions racing an equality-delete conversion (the conversion commits between the
    compaction's plan and its commit), each checked against the model by Iceberg Java and DuckDB:
    per-file validation must both drop groups whose files the new position deletes name and commit
    groups of the same partition whose files they do not name."""
    # The CDC job neither compacts nor converts by itself here: the equality deletes of its last
    # checkpoints are what the racing conversion converts.
    monkeypatch.setenv(SKIP_ENV, "compaction,convert_deletes")
    world = World(spark, java_reader, tmp_path, seed=5)
    for _ in range(8):
        for _ in range(3):
            world.op_cdc()
            world.check()
        world.op_convert_deletes(mode="conversion_commits_first")
        world.check()
        if len(world.race_outcomes) == 2:
            break
    assert set(world.race_outcomes) == {"dropped", "committed beside new position deletes"}, "\n".join(world.trace)


def test_model_sink_schema_evolution(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The short profile may draw ``sink_schema_evolution`` rarely: one seed where the sink itself
    evolves db.main often (added columns, widened types, crashes right after the schema change),
    between other writers' batches and the harness's own schema changes (renames)."""
    monkeypatch.setattr(
        harness,
        "OPERATIONS",
        {"sink_schema_evolution": 4, "cdc": 2, "upsert": 1, "branch_upsert": 1, "schema_evolution": 1},
    )
    world = harness.World(spark, java_reader, tmp_path, seed=7)
    seconds = world.run(8)
    # And once for certain: the driver dies right after the schema change; the replay finds it done.
    world.op_sink_schema_evolution(crash_at=_faults.AFTER_SCHEMA_CHANGE)
    world.check()
    assert "[crash at after-schema-change] -> crashed" in world.trace[-1], world.trace[-1]
    evolutions = [line for line in world.trace if "sink schema evolution" in line]
    assert len(evolutions) >= 3, world.trace
    sys.stderr.write(f"model check sink schema evolution: {len(evolutions)} in {seconds:.1f}s\n")


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "one-at-a-time"])
def test_routed_job_crashes_and_replays(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, atomic: bool
) -> None:
    """The routed CDC job (docs/routing.md) on its own: checkpoints over three tables, each possibly
    crashed at a fault point and replayed by a restarted sink, until at least three crashes happened;
    every table is checked against its model by Iceberg Java and DuckDB after each checkpoint, and
    right after an atomic job's crash every table the checkpoint touched holds it or none does."""
    world = World(spark, java_reader, tmp_path, seed=9)
    world.routed_atomic = atomic
    for _ in range(14):
        world.op_routed_cdc()
        world.check_routed()
        if sum("-> crashed" in line for line in world.trace) >= 3:
            break
    assert sum("-> crashed" in line for line in world.trace) >= 3, "\n".join(world.trace)


@pytest.mark.model_long_only  # CI time; its step runs at random in every seed, and test_routing_names.py in CI
def test_hostile_routed_names_are_refused(spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    """Routed checkpoints interleaved with batches naming hostile tables (control characters,
    URL-special characters, dots, very long names: harness.hostile_table_name): each hostile batch
    is refused whole with its table named, nothing is created or committed, and every routed table
    still equals its model (Iceberg Java and DuckDB) through the next good checkpoints."""
    world = World(spark, java_reader, tmp_path, seed=11)
    for _ in range(4):
        world.op_routed_cdc()
        world.check_routed()
        world.op_hostile_routed_names()
        world.check_routed()
    refused = [line for line in world.trace if "hostile table names" in line and "-> refused" in line]
    assert len(refused) == 4, "\n".join(world.trace)


def test_other_writers_under_a_stream(spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path) -> None:
    """Each other-writer step once (docs/model-check.md), between CDC checkpoints, every table checked
    against its model by Iceberg Java and DuckDB after each: a column renamed and one dropped under a
    stream, an expiry of fresh snapshots (with another writer's rows of the batch's keys) between a
    stream batch's proof and its commit, and a maintenance commit whose answer is lost before an outage."""
    world = World(spark, java_reader, tmp_path, seed=11)
    for kind in harness.OTHER_WRITER_KINDS:
        world.op_cdc()
        world.check()
        world.op_other_writers(kind)
        world.check()
    steps = [line for line in world.trace if ": other writer" in line]
    assert len(steps) == len(harness.OTHER_WRITER_KINDS), world.trace
    assert "refused naming the column" in steps[0] and "added back" in steps[1], steps
    assert "CommitStateUnknownError, files kept" in steps[3], steps
    sys.stderr.write("model check other writers:\n  " + "\n  ".join(steps) + "\n")


def test_debezium_hostile_events(
    spark: SparkSession,
    java_reader: JavaIcebergReader,
    tmp_path: Path,
    model_job_seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The short profile may draw ``debezium_cdc`` rarely: its job alone, both with and without the
    schema part and every truncate policy, for a few batches each (tests/model/debezium_steps.py)."""
    world = World(spark, java_reader, tmp_path, seed=model_job_seed)
    # Ordered by the lsn (PostgreSQL) or by binlog position (MariaDB, MySQL), files past 999999.
    for schema, truncate, binlog in (
        (True, "fail", True),
        (False, "skip", False),
        (True, "apply", False),
        (False, "apply", True),
    ):
        job = debezium_steps.DebeziumJob(
            world.seed, world.catalog_props, tmp_path / f"dbz-{schema}-{truncate}", world.created_format
        )
        job.schema, job.truncate, job.binlog = schema, truncate, binlog
        job.truncate_every = 0.4  # a truncate within the few batches
        for _ in range(2):
            job.step(world)
        world.catalog.drop_table(debezium_steps.TABLE)
    # Plain batches through one sink: the second and third are planned on the statistics of the one
    # before, without counting them (sources/envelope.py), and must leave the table as the model says.
    counted: list[int] = []
    counting = debezium_module.batch_stats
    monkeypatch.setattr(debezium_module, "batch_stats", lambda *a: counted.append(1) or counting(*a))
    job = debezium_steps.DebeziumJob(world.seed, world.catalog_props, tmp_path / "dbz-planned", world.created_format)
    job.schema, job.truncate, job.toast_share, job.hostile_share, job.fresh_share = True, "skip", 0.0, 0.0, 0.0
    for _ in range(3):
        job.step(world)
    assert len(counted) == 1, world.trace


def test_consistent_transactions(
    spark: SparkSession, java_reader: JavaIcebergReader, tmp_path: Path, model_job_seed: int
) -> None:
    """The short profile may draw ``consistent_transactions`` rarely: its job alone, a micro-batch
    without a crash and one dying at each point (tests/model/transactions_steps.py)."""
    world = World(spark, java_reader, tmp_path, seed=model_job_seed)
    job = transactions_steps.TransactionsJob(world.seed, world.catalog_props, tmp_path, world.created_format)
    for point in (None, *transactions_steps.CRASH_POINTS, None):
        job.step(world, crash=point)
    assert job.source.complete_prefix() > 0, world.trace


def test_model_commit_lane(
    spark: SparkSession, java_reader: JavaIcebergReader, java_newest_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """Streams of db.v3 whose commits run on the commit lane (job/lane.py), one per window a lane's
    commit can meet while the next micro-batch is planned and written beside it (another writer
    appending rows of keys those micro-batches insert as new, an expiry, a compaction, nothing) and a
    driver death at each point of the lane's commit, replayed by a restarted sink: db.v3 checked
    against its model by both Iceberg Javas, DuckDB and PyIceberg after each, every checkpoint one
    snapshot (tests/model/v3_steps.py ``v3_lane``)."""
    world = World(spark, java_reader, tmp_path, seed=21, java_newest=java_newest_reader)
    v3 = v3_steps.tables(world)
    v3.op_cdc(v3_steps.V3)
    for window in v3_steps.LANE_WINDOWS:
        if window == "crash":
            for point in v3_steps.LANE_CRASH_POINTS:
                v3.op_lane(window, crash_at=point)
        else:
            v3.op_lane(window)
    trace = "\n".join(world.trace)
    assert v3.stats["lane_crash"] == len(v3_steps.LANE_CRASH_POINTS), (v3.stats, trace)
    assert v3.stats["lane_other_writer"] == v3.stats["lane_compaction"] == v3.stats["lane_expire"] == 1, trace
    # Every window but a death at the stream's last checkpoint has a next micro-batch writing beside it.
    assert v3.stats["lane_beside"] >= len(v3_steps.LANE_WINDOWS) - 1, (v3.stats, trace)
    assert v3.stats["lane_commits"] >= 2 * (len(v3_steps.LANE_WINDOWS) + 2), (v3.stats, trace)
    sys.stderr.write(f"model check, the commit lane: {dict(v3.stats)}\n")


def test_model_v3_tables(
    spark: SparkSession, java_reader: JavaIcebergReader, java_newest_reader: JavaIcebergReader, tmp_path: Path
) -> None:
    """The v3 operations (tests/model/v3_steps.py) in a fixed order, each table checked against its
    model after every step by both Iceberg Javas, DuckDB and PyIceberg: CDC checkpoints on db.v3 over
    few keys (so DVs merge), one dying after its commit was sent and replayed, Iceberg Java's DELETE
    writing its own DV that the next checkpoint merges, the sink's compaction, and db.v2up taking
    equality deletes on v2, converted into position delete files on v2, upgraded to v3, then DVs
    (which take over and remove those files), then its equality deletes converted into DVs; Iceberg
    Java adding columns with default values to db.v3 under its running sink."""
    world = World(spark, java_reader, tmp_path, seed=13, java_newest=java_newest_reader)
    v3 = v3_steps.tables(world)
    v3.op_cdc(v3_steps.V3)
    for _ in range(6):  # checkpoints deleting rows of files that have a DV: the sink merges into it
        v3.op_cdc(v3_steps.V3)
        if v3.stats["dv_merges"]:
            break
    v3.op_deletes_beside_another_writer()  # issue 42 item 6: "nothing to commit" decided on a stale table
    v3.op_cdc(v3_steps.V2UP)
    for _ in range(4):  # a checkpoint whose rows cancel out sends no commit: no crash at commit-sent
        v3.op_cdc(v3_steps.V3, crash_at=_faults.COMMIT_SENT)
        if v3.stats["crashes"]:
            break
    assert world.key_index_options, "seed 13 resolves deletes through the partitioned key index"
    for point in INDEX_FAULT_POINTS:  # the driver dies inside the index's save; the replay reads the stored one
        for _ in range(4):  # a checkpoint whose lookup writes nothing new saves nothing
            crashes = v3.stats["crashes"]
            v3.op_cdc(v3_steps.V3, crash_at=point)
            if v3.stats["crashes"] > crashes:
                break
        else:
            raise AssertionError(f"no checkpoint died at {point}:\n" + "\n".join(world.trace))
    v3.op_cdc(v3_steps.V2UP)
    for _ in range(4):
        v3.op_java_delete()
        v3.op_cdc(v3_steps.V3)
        if v3.stats["java_dv_merges"]:
            break
    v3.op_v2_conversion()  # file-scoped position delete files on v2 ...
    for _ in range(4):  # (a checkpoint first when the conversion left no equality delete to upgrade with)
        v3.op_upgrade()
        if v3.stats["upgrades"]:
            break
    for _ in range(4):  # after the upgrade: DVs beside the old equality deletes, taking over those files
        v3.op_cdc(v3_steps.V2UP)
        if v3.stats["position_files_retired"]:
            break
    v3.op_conversion()  # ... the equality deletes become DVs, merged with those
    v3.op_java_default()  # Java adds a column with a default value: later checkpoints write its write-default
    v3.op_cdc(v3_steps.V3)
    v3.op_compaction()  # of db.v3 or db.v2up, drawn
    v3.op_cdc(v3_steps.V2UP)
    v3.op_java_default()
    v3.op_cdc(v3_steps.V3)
    trace = "\n".join(world.trace)
    assert v3.stats["crashes"] >= 3 and v3.stats["upgrades"] == 1, trace
    assert v3.stats["dv_merges"] >= 1 and v3.stats["java_dv_merges"] >= 1, (v3.stats, trace)
    assert v3.stats["compactions"] >= 1 and v3.stats["conversions"] == 1, trace
    assert v3.stats["java_defaults"] == 2, trace
    assert v3.stats["v2_position_files"] >= 1 and v3.stats["position_files_retired"] >= 1, (v3.stats, trace)
    # The index's partitions split as db.v3 grew (8 entries each at most): every answer above agreed
    # with the model and the readers through them.
    first = world.key_index_options["iceberg-sink.key-index.partitions"]
    grown = [
        read_current(PyArrowFileIO(), str(p.parent))[1].partitions for p in tmp_path.rglob("partitioned/*/current")
    ]
    assert grown and max(grown) > first, (first, grown)
    sys.stderr.write(f"model check v3 tables: {dict(v3.stats)}, checks took {v3.seconds['checks']:.1f}s\n")
