"""``iceberg-sink``: run a pipeline from YAML, inspect, and the maintenance commands' --json,
--dry-run and exit codes, on real Spark and SQLite catalogs, tables read back with Iceberg Java and DuckDB."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from iceberg_sink import CommitVetoedError, IcebergSink, _faults
from iceberg_sink.cli import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, main
from tests.helpers import driver_env
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "pipeline.yaml"


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str, code: int = EXIT_OK) -> dict[str, Any]:
    """Runs the CLI with --json; stdout must be exactly one JSON document."""
    assert main([*argv, "--json"]) == code, capsys.readouterr().err[-3000:]
    out = capsys.readouterr().out
    doc: dict[str, Any] = json.loads(out)
    assert out.count("\n") == 1 and doc["ok"] is (code == EXIT_OK)
    return doc


def write_users(folder: Path, name: str, rows: list[tuple[int, str, str, int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"user_id": u, "country": c, "name": n, "visits": v}) for u, c, n, v in rows]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    # Spark's file source takes files in modification-time order: one second apart, in name order.
    stamp = dt.datetime(2026, 1, 1).timestamp() + len(list(folder.iterdir()))
    os.utime(path, (stamp, stamp))


def test_run_the_documented_pipeline_then_inspect_it(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], java_reader: JavaIcebergReader
) -> None:
    config = tmp_path / "pipeline.yaml"
    shutil.copy(EXAMPLE, config)  # the file as documented; its relative paths land in tmp_path
    expected: dict[tuple[int, str], dict[str, Any]] = {}
    batches = [
        [(i, ("de", "fr", "us")[i % 3], f"u{i}", 1) for i in range(30)],
        [(i, ("de", "fr", "us")[i % 3], f"u{i}-b", 2) for i in range(0, 30, 2)],  # updates half of them
        [(i, ("de", "fr", "us")[i % 3], f"u{i}-c", 3) for i in range(25, 40)],  # updates and inserts
    ]
    for n, rows in enumerate(batches):
        write_users(tmp_path / "incoming", f"part-{n}.json", rows)
        for u, c, name, v in rows:
            expected[(u, c)] = {"user_id": u, "country": c, "name": name, "visits": v}

    first = cli_json(capsys, "run", str(config))
    assert first["table"] == "db.users" and first["commits"] == 3 and first["batches"] == 3
    assert first["committed_records"] == sum(len(b) for b in batches)
    assert first["stopped_by"] == "source drained"

    # A second run continues the same job from the checkpoint: only the new file is written.
    more = [(i, ("de", "fr", "us")[i % 3], f"u{i}-d", 4) for i in range(35, 45)]
    write_users(tmp_path / "incoming", "part-3.json", more)
    for u, c, name, v in more:
        expected[(u, c)] = {"user_id": u, "country": c, "name": name, "visits": v}
    second = cli_json(capsys, "run", str(config))
    assert second["commits"] == 1 and second["committed_records"] == len(more)

    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.users").build()
    table = sink.load_table()
    want = sorted(expected.values(), key=lambda r: (r["user_id"], r["country"]))
    assert normalize(java_reader.read(table.metadata_location), ["user_id", "country"]) == want
    assert normalize(duckdb_read(table.metadata_location), ["user_id", "country"]) == want

    report = cli_json(
        capsys,
        "inspect",
        "db.users",
        "--embedded",
        str(tmp_path / "lake"),
        "--checkpoint-location",
        str(tmp_path / "checkpoints" / "users"),
        "--limit",
        "0",
    )
    job = report["checkpoint_locations"][0]
    assert job["pending"] == [] and job["table"] == "db.users" and job["last_committed_checkpoint"] == 3
    written = [(s["job_id"], s["checkpoint_id"]) for s in report["snapshots"] if s["job_id"] is not None]
    assert sorted(written) == [(job["job_id"], cp) for cp in range(4)]
    compactions = [s for s in report["snapshots"] if s["sink_operation"] == "compaction"]
    assert len(compactions) == 1  # after the first run's second commit (the count starts again per run)
    assert report["snapshot_count"] == len(report["snapshots"]) == 5
    totals = report["files"]["totals"]
    assert totals["data_records"] - totals["delete_records"] <= len(expected) <= totals["data_records"]
    assert {p["partition"] for p in report["files"]["partitions"]} == {"country=de", "country=fr", "country=us"}
    files = table.inspect.files().to_pylist()
    assert totals["data_files"] + totals["delete_files"] == len(files)
    assert totals["data_bytes"] + totals["delete_bytes"] == sum(f["file_size_in_bytes"] for f in files)

    # The human form says the same in tables.
    assert main(["inspect", "db.users", "--embedded", str(tmp_path / "lake")]) == EXIT_OK
    human = capsys.readouterr().out
    # An upsert table the pipeline created: format v3, the default for upserts and CDC.
    assert "table db.users (format v3)" in human and "country=fr" in human and job["job_id"] in human


def test_run_rate_source_stops_after_max_batches(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "rate.yaml"
    config.write_text(
        "source: {type: rate, rows_per_second: 50, num_partitions: 2}\n"
        "sink: {embedded: lake, table: demo.events, create_if_missing: {partition_by: [page]}}\n"
        "checkpoint_location: ckpt\n"
        "trigger: {processingTime: '1 second'}\n"
        "stop: {max_batches: 3}\n"
    )
    doc = cli_json(capsys, "run", str(config))
    assert doc["batches"] >= 3 and doc["stopped_by"] == "max_batches (3)"
    table = IcebergSink.builder().embedded(tmp_path / "lake").table("demo.events").build().load_table()
    rows = duckdb_read(table.metadata_location).to_pylist()
    # Every generated value exactly once, with the demo columns derived from it.
    ids = sorted(r["event_id"] for r in rows)
    assert ids == list(range(len(ids))) and len(ids) == doc["committed_records"] > 0
    assert all(r["user_id"] == r["event_id"] % 50 for r in rows)
    assert {r["page"] for r in rows} <= {"/home", "/cart", "/checkout", "/search"}


def test_kafka_without_the_connector_says_what_to_install(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kafka.yaml"
    config.write_text(
        "source: {type: kafka, bootstrap_servers: 'localhost:9092', topic: events, value_format: json, "
        "schema: 'id long'}\nsink: {embedded: lake, table: db.k, create_if_missing: true}\ncheckpoint_location: ck\n"
    )
    doc = cli_json(capsys, "run", str(config), code=EXIT_USAGE)
    assert "source.type: kafka needs Spark's Kafka connector" in doc["error"]["message"]
    assert f"spark-sql-kafka-0-10_2.13:{spark.version}" in doc["error"]["message"]
    (tmp_path / "in").mkdir()
    config.write_text(
        "source: {type: files, path: in, format: json, schema: 'id lng'}\n"
        "sink: {embedded: lake, table: db.k, create_if_missing: true}\ncheckpoint_location: ck\n"
    )
    doc = cli_json(capsys, "run", str(config), code=EXIT_USAGE)
    assert doc["error"]["message"].startswith(
        f"{config}: source.schema: expected a DDL schema such as 'id long, name string', received 'id lng'"
    )
    config.write_text(config.read_text().replace("schema: 'id lng'", "max_files_per_trigger: 1"))
    doc = cli_json(capsys, "run", str(config), code=EXIT_USAGE)
    assert doc["error"]["message"].endswith("holds no files to infer it from; give source.schema")


def test_inspect_shows_pending_checkpoints_and_the_plan_compact_then_follows(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], java_reader: JavaIcebergReader
) -> None:
    lake, ckpt = str(tmp_path / "lake"), str(tmp_path / "ckpt")
    sink = IcebergSink.builder().embedded(lake).table("db.t").create_if_missing(partition_by=["p"]).build()
    for i in range(3):
        sink.write(spark.createDataFrame([(i * 10 + j, j % 2) for j in range(10)], "id long, p long"), ckpt)

    def veto(_: object) -> None:
        raise RuntimeError("not now")

    vetoing = (
        IcebergSink.builder().embedded(lake).table("db.t").pre_commit_hook(veto).build()  # type: ignore[arg-type]
    )
    with pytest.raises(CommitVetoedError):
        vetoing.write(spark.createDataFrame([(100, 0), (101, 1)], "id long, p long"), ckpt)

    report = cli_json(capsys, "inspect", "db.t", "--embedded", lake, "--checkpoint-location", ckpt)
    [loc] = report["checkpoint_locations"]
    assert loc["last_committed_checkpoint"] == 2 and loc["route"] is None
    assert [(p["checkpoint_id"], p["records"], p["committed"]) for p in loc["pending"]] == [(3, 2, False)]
    # Without TABLE: the job's table (a single-table job has one).
    [job] = cli_json(capsys, "inspect", "--embedded", lake, "--checkpoint-location", ckpt)["checkpoint_locations"]
    [entry] = job["tables"]
    assert (entry["table"], entry["last_committed_checkpoint"], entry["pending_ids"]) == ("db.t", 2, [3])
    assert job["job_id"] == loc["job_id"] and entry["table_uuid"] == str(sink.load_table().metadata.table_uuid)
    parts = {p["partition"]: p for p in report["files"]["partitions"]}
    assert {k: (v["data_files"], v["data_records"]) for k, v in parts.items()} == {"p=0": (3, 15), "p=1": (3, 15)}
    plan = report["compaction"]
    assert (plan["groups"], plan["data_files"]) == (2, 6)

    dry = cli_json(capsys, "compact", "db.t", "--embedded", lake, "--partition", "p=1", "--dry-run")
    assert dry["plan"]["data_files"] == 3 and [p["partition"] for p in dry["plan"]["partitions"]] == ["p=1"]
    before = sink.load_table()
    assert before.current_snapshot() is not None
    assert len(before.snapshots()) == 3  # the dry run committed nothing

    done = cli_json(capsys, "compact", "db.t", "--embedded", lake, "--partition", "p=1")
    assert done["rewritten_data_files"] == 3 and done["added_data_files"] == 1
    table = sink.load_table()
    assert sorted(f["partition"]["p"] for f in table.inspect.files().to_pylist()) == [0, 0, 0, 1]
    want = [{"id": i * 10 + j, "p": j % 2} for i in range(3) for j in range(10)]
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == sorted(want, key=lambda r: r["id"])


class DriverCrash(BaseException):
    """The driver dies here: nothing after this point of the checkpoint runs (not caught per table)."""


def test_inspect_a_routed_checkpoint_location_lists_each_table_and_its_pending_checkpoints(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], java_reader: JavaIcebergReader
) -> None:
    lake, ckpt = str(tmp_path / "lake"), str(tmp_path / "ckpt")
    sink = (
        IcebergSink.builder()
        .embedded(lake)
        .route(table_column="tbl", namespace="db")
        .create_if_missing()
        .write_option("iceberg-sink.route.commit-threads", 1)  # one after another, in name order
        .atomic_commits("off")  # so that a crash can fall between two tables' commits
        .build()
    )
    names = ["db.a", "db.b", "db.c"]
    batches = [[(t, n * 100 + i, f"v{n}") for t in "abc" for i in range(3 + n)] for n in range(2)]

    def rows(n: int) -> Any:
        return spark.createDataFrame(batches[n], "tbl string, id long, v string")

    sink.write(rows(0), ckpt)

    # Checkpoint 1 crashes between two tables' commits: db.a committed (its committable not removed
    # yet), db.b and db.c stored, not committed.
    def crash(point: str, checkpoint_id: int) -> None:
        if point == _faults.AFTER_COMMIT and checkpoint_id == 1:
            raise DriverCrash

    _faults.install(crash)
    try:
        with pytest.raises(DriverCrash):
            sink.write(rows(1), ckpt)
    finally:
        _faults.clear()

    listing = cli_json(capsys, "inspect", "--embedded", lake, "--checkpoint-location", ckpt)
    [job] = listing["checkpoint_locations"]
    assert job["route"] == "tables routed by column 'tbl' (namespace 'db')" and job["job_id"]
    assert job["atomic_commits"] is True  # the catalog could (the sink chose not to)
    catalog = sink.config.catalog.load()
    uuids = {name: str(catalog.load_table(name).metadata.table_uuid) for name in names}
    got = {
        t["table"]: (t["table_uuid"], t["table_state"], t["last_committed_checkpoint"], t["pending_ids"])
        for t in job["tables"]
    }
    assert got == {
        "db.a": (uuids["db.a"], "ok", 1, [1]),
        "db.b": (uuids["db.b"], "ok", 0, [1]),
        "db.c": (uuids["db.c"], "ok", 0, [1]),
    }
    pending = {t["table"]: t["pending"][0] for t in job["tables"]}
    assert [(p["records"], p["committed"]) for p in pending.values()] == [(4, True), (4, False), (4, False)]

    # One table of the routed location, with the table's report.
    report = cli_json(capsys, "inspect", "db.b", "--embedded", lake, "--checkpoint-location", ckpt)
    [loc] = report["checkpoint_locations"]
    assert (loc["table"], loc["route"], loc["job_id"], loc["table_uuid"]) == (
        "db.b",
        job["route"],
        job["job_id"],
        uuids["db.b"],
    )
    assert loc["last_committed_checkpoint"] == 0 and loc["table_state"] == "ok"
    assert [(p["checkpoint_id"], p["records"], p["committed"]) for p in loc["pending"]] == [(1, 4, False)]
    assert main(["inspect", "--embedded", lake, "--checkpoint-location", ckpt]) == EXIT_OK
    human = capsys.readouterr().out
    assert "db.b" in human and "1 (committed)" in human and job["job_id"] in human

    # The rerun of checkpoint 1 commits what is stored, once; nothing stays pending.
    sink.write(rows(1), ckpt, checkpoint_id=1)
    job = cli_json(capsys, "inspect", "--embedded", lake, "--checkpoint-location", ckpt)["checkpoint_locations"][0]
    assert [(t["table"], t["last_committed_checkpoint"], t["pending_ids"]) for t in job["tables"]] == [
        (name, 1, []) for name in names
    ]
    for name in names:
        table = catalog.load_table(name)
        assert [s.summary["iceberg-sink.checkpoint-id"] for s in table.snapshots()] == ["0", "1"]  # type: ignore[index]
        want = sorted(({"id": i, "v": v} for b in batches for t, i, v in b if f"db.{t}" == name), key=lambda r: r["id"])
        assert normalize(java_reader.read(table.metadata_location), ["id"]) == want
        assert normalize(duckdb_read(table.metadata_location), ["id"]) == want

    # Someone else drops and re-creates db.c: the listing says so, and so does the table's report.
    schema = catalog.load_table("db.c").schema()
    catalog.drop_table("db.c")
    catalog.create_table("db.c", schema)
    got = {
        t["table"]: t
        for t in cli_json(capsys, "inspect", "--embedded", lake, "--checkpoint-location", ckpt)["checkpoint_locations"][
            0
        ]["tables"]
    }
    assert (got["db.c"]["table_state"], got["db.c"]["table_uuid"]) == ("replaced", uuids["db.c"])
    assert got["db.c"]["catalog_table_uuid"] != uuids["db.c"] and got["db.c"]["last_committed_checkpoint"] is None
    report = cli_json(capsys, "inspect", "db.c", "--embedded", lake, "--checkpoint-location", ckpt)
    assert report["checkpoint_locations"][0]["table_state"] == "replaced"
    catalog.drop_table("db.c")
    assert (
        cli_json(capsys, "inspect", "--embedded", lake, "--checkpoint-location", ckpt)["checkpoint_locations"][0][
            "tables"
        ][2]["table_state"]
        == "missing"
    )
    # A table the routed job never wrote: no state, nothing pending.
    IcebergSink.builder().embedded(lake).table("db.z").create_if_missing().build().write(rows(0).drop("tbl"))
    other = cli_json(capsys, "inspect", "db.z", "--embedded", lake, "--checkpoint-location", ckpt)
    assert other["checkpoint_locations"][0]["has_state"] is False and other["checkpoint_locations"][0]["pending"] == []
    assert len(job["tables"]) == 3 and not (Path(ckpt) / "iceberg_sink" / "tables" / "db.z").exists()


def test_expire_snapshots_dry_run_lists_what_the_real_run_does(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], java_reader: JavaIcebergReader
) -> None:
    lake = str(tmp_path / "lake")
    sink = IcebergSink.builder().embedded(lake).table("db.x").create_if_missing().upsert(key=["id"]).build()
    for i in range(4):
        sink.write(spark.createDataFrame([(j, f"v{i}") for j in range(5)], "id long, v string"))
    args = ["expire-snapshots", "db.x", "--embedded", lake, "--older-than-hours", "0", "--retain-last", "1"]
    metadata = sink.load_table().metadata_location
    dry = cli_json(capsys, *args, "--dry-run")
    assert dry["dry_run"] is True and len(dry["expired_snapshot_ids"]) == 3 and dry["deleted_files"]
    assert sink.load_table().metadata_location == metadata  # nothing changed
    assert all(Path(p.removeprefix("file://")).exists() for p in dry["deleted_files"])
    real = cli_json(capsys, *args)
    assert (real["expired_snapshot_ids"], real["deleted_files"]) == (dry["expired_snapshot_ids"], dry["deleted_files"])
    assert not any(Path(p.removeprefix("file://")).exists() for p in real["deleted_files"])
    table = sink.load_table()
    assert normalize(java_reader.read(table.metadata_location), ["id"]) == [{"id": j, "v": "v3"} for j in range(5)]


def test_json_and_exit_codes_of_the_maintenance_commands(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = str(tmp_path / "lake")
    # v2: equality deletes for convert-equality-deletes.
    sink = (
        IcebergSink.builder()
        .embedded(lake)
        .table("db.m")
        .create_if_missing(format_version=2)
        .upsert(key=["id"])
        .build()
    )
    for i in range(3):
        sink.write(spark.createDataFrame([(i, "a"), (i + 1, "b")], "id long, v string"))
    orphan = Path(sink.load_table().location().removeprefix("file://")) / "data" / "stray.parquet"
    orphan.write_bytes(b"x")
    old = (dt.datetime.now() - dt.timedelta(days=10)).timestamp()
    os.utime(orphan, (old, old))
    where = ["db.m", "--embedded", lake]
    assert cli_json(capsys, "remove-orphans", *where, "--dry-run")["orphan_files"] == [orphan.as_uri()]
    assert orphan.exists()
    assert cli_json(capsys, "remove-orphans", *where)["orphan_files"] == [orphan.as_uri()]
    assert not orphan.exists()
    converted = cli_json(capsys, "convert-equality-deletes", *where)
    assert converted["removed_equality_delete_files"] == 2 and converted["snapshot_id"] is not None
    rewritten = cli_json(capsys, "rewrite-manifests", *where)
    assert rewritten["snapshot_id"] is not None
    assert sorted(r["id"] for r in sink.load_table().scan().to_arrow().to_pylist()) == [0, 1, 2, 3]

    missing = cli_json(capsys, "inspect", "db.nope", "--embedded", lake, code=EXIT_NOT_FOUND)
    assert missing["error"]["message"] == f"table db.nope does not exist in the embedded catalog at {lake}"
    assert cli_json(capsys, "inspect", *where, "--checkpoint-location", str(tmp_path / "no"), code=EXIT_NOT_FOUND)
    assert cli_json(capsys, "inspect", "db.m", "--embedded", str(tmp_path / "nowhere"), code=EXIT_NOT_FOUND)
    assert cli_json(
        capsys, "inspect", "--embedded", lake, "--checkpoint-location", str(tmp_path / "no"), code=EXIT_NOT_FOUND
    )
    neither = cli_json(capsys, "inspect", "--embedded", lake, code=EXIT_USAGE)
    assert neither["error"]["message"].startswith("TABLE: required (positional, or --table namespace.name), or")
    usage = cli_json(capsys, "compact", "--embedded", lake, code=EXIT_USAGE)
    assert usage["error"]["message"] == "TABLE: required (positional, or --table namespace.name)"


def test_console_run_json_stdout_is_one_document_and_a_timeout_stop_loses_nothing(tmp_path: Path) -> None:
    """The real command in its own process (Spark's JVM shares its stdout): --json leaves exactly one
    document there; runs stopped by --timeout, mid-batch or not, commit each generated row once."""
    config = tmp_path / "rate.yaml"
    config.write_text(
        "source: {type: rate, rows_per_second: 20, columns: {id: value, at: timestamp}}\n"
        "sink: {embedded: lake, table: demo.rate, create_if_missing: true}\n"
        "checkpoint_location: ckpt\ntrigger: {processingTime: '1 second'}\n"
    )
    env = driver_env(str(ROOT))
    docs = []
    for extra in (["--timeout", "40", "--progress"], ["--max-batches", "2"]):
        run = subprocess.run(
            [sys.executable, "-m", "iceberg_sink.cli", "run", str(config), "--json", *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert run.returncode == EXIT_OK, run.stderr[-3000:]
        assert run.stdout.count("\n") == 1, run.stdout
        docs.append(json.loads(run.stdout))
        if "--progress" in extra:  # with --json, progress goes to stderr
            assert re.search(r"^batch \d+: \d+ rows$", run.stderr, re.MULTILINE), run.stderr[-3000:]
    assert docs[0]["stopped_by"] == "timeout (40 s)" and docs[1]["stopped_by"] == "max_batches (2)"
    table = IcebergSink.builder().embedded(tmp_path / "lake").table("demo.rate").build().load_table()
    ids = sorted(r["id"] for r in duckdb_read(table.metadata_location).to_pylist())
    assert ids == list(range(len(ids))), (docs, ids)
    assert len(ids) == docs[0]["committed_records"] + docs[1]["committed_records"], (docs, len(ids))


def test_a_failing_stream_is_one_line_naming_the_error(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": 1, "v": "a"}\n{"id": null, "v": "b"}\n')
    config = tmp_path / "p.yaml"
    config.write_text(
        "source: {type: files, path: in, format: json, schema: 'id long, v string'}\n"
        "sink: {embedded: lake, table: db.t, create_if_missing: true, upsert: {key: [id]}}\n"
        "checkpoint_location: ck\ntrigger: {availableNow: true}\n"
    )
    doc = cli_json(capsys, "run", str(config), code=EXIT_FAILED)
    assert doc["error"] == {
        "type": "InvalidInputError",
        "message": "InvalidInputError: checkpoint 0 of table db.t was not written: a key column is null "
        '(id must all be set); row key: id=null (event: value \'{"id":null,"v":"b"}\')',
    }
    table = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").build().load_table()
    assert table.current_snapshot() is None  # nothing committed
