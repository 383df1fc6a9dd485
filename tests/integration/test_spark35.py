"""The sink itself on Spark 3.5: ``spark35_driver`` runs in the Java venv (PySpark 3.5.7), then the
tables it wrote are read back here with PyIceberg, DuckDB and Apache Iceberg Java.

The driver runs once per module (about 30 s, plus about 20 s for the Kafka step); each test checks
one part of its result. For its Kafka step this module starts a real broker
(tests/integration/kafka.py), produces :func:`spark35_driver.kafka_records` to a topic, and gives
the driver Spark 3.5's Kafka source (``spark-sql-kafka-0-10_2.12`` of the venv's PySpark version,
fetched once from Maven Central by scripts/pipeline_components.py). When the broker or the jars
cannot be had, the driver still runs its other steps and only the Kafka test fails, with the cause.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import signal
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table import StaticTable
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType

from iceberg_sink.sources.kafka_offsets import parse_summary
from tests.integration import spark35_driver as driver
from tests.integration.kafka import components, spark_kafka_conf
from tests.integration.sources import event_batch
from tests.interop.java_env import JavaEnv
from tests.interop.readers import JavaIcebergReader, canonical_schema, duckdb_read, normalize, pyiceberg_read

ROOT = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT_S = 900.0
# The parent's PySpark 4 / venv settings must not leak into the Spark 3.5 driver and its workers.
_SCRUBBED_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SPARK_HOME",
    "SPARK_CONF_DIR",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
)

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_bucket4 = BucketTransform(4).transform(LongType())


@dataclass(frozen=True)
class DriverRun:
    result: dict[str, Any]
    returncode: int
    output: str = field(repr=False)  # stdout and stderr of the driver (Spark's log, tracebacks)
    seconds: float = 0.0
    kafka_error: str | None = None  # why the Kafka step could not be set up (then the driver ran without it)
    kafka_end_offsets: dict[int, int] = field(default_factory=dict)  # of driver.KAFKA_TOPIC, once produced


def _driver_env(java_env: JavaEnv) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV and not k.startswith("PYTEST")}
    env["PYSPARK_PYTHON"] = str(java_env.python)
    env["PYTHONPATH"] = str(ROOT)  # for ``tests.`` in the driver; iceberg_sink is installed there (editable)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run_driver(java_env: JavaEnv, work: Path, args: list[str]) -> DriverRun:
    started = dt.datetime.now(dt.UTC)
    proc = subprocess.Popen(
        [str(java_env.python), "-m", "tests.integration.spark35_driver", str(work), *args],
        cwd=ROOT,
        env=_driver_env(java_env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout takes down the JVM and workers too
    )
    try:
        output, _ = proc.communicate(timeout=DRIVER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"spark35_driver did not finish in {DRIVER_TIMEOUT_S:.0f}s; output tail:\n{output[-5000:]}")
    seconds = (dt.datetime.now(dt.UTC) - started).total_seconds()
    result_path = work / driver.RESULT_FILE
    if not result_path.is_file():
        pytest.fail(
            f"spark35_driver wrote no {driver.RESULT_FILE} (exit {proc.returncode}); output tail:\n{output[-5000:]}"
        )
    return DriverRun(json.loads(result_path.read_text(encoding="utf-8")), proc.returncode, output, seconds)


def _pyspark_version(java_env: JavaEnv) -> str:
    done = subprocess.run(
        [str(java_env.python), "-c", "from importlib.metadata import version; print(version('pyspark'))"],
        env=_driver_env(java_env),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def spark35_run(java_env: JavaEnv, tmp_path_factory: pytest.TempPathFactory) -> DriverRun:
    work = tmp_path_factory.mktemp("spark35")
    broker: Any = None
    kafka_args: list[str] = []
    kafka_error: str | None = None
    end_offsets: dict[int, int] = {}
    try:
        jars = spark_kafka_conf(_pyspark_version(java_env))["spark.jars"]
        broker = components().KafkaBroker(work / "kafka")
        broker.start()
        broker.create_topic(driver.KAFKA_TOPIC, partitions=driver.KAFKA_PARTITIONS)
        broker.produce(driver.KAFKA_TOPIC, driver.kafka_records())
        end_offsets = broker.end_offsets(driver.KAFKA_TOPIC).get(driver.KAFKA_TOPIC, {})
        kafka_args = ["--kafka", broker.bootstrap, "--jars", jars]
    except (Exception, pytest.fail.Exception) as e:  # spark_kafka_conf fails the test with pytest.fail
        kafka_error = f"{type(e).__name__}: {e}"
    try:
        run = _run_driver(java_env, work, kafka_args)
    finally:
        if broker is not None:
            broker.stop()
    return replace(run, kafka_error=kafka_error, kafka_end_offsets=end_offsets)


def _step(run: DriverRun, name: str) -> dict[str, Any]:
    step: dict[str, Any] = run.result[name]
    if not step["ok"]:
        pytest.fail(
            f"on PySpark {run.result['pyspark_version']}, step {name!r} of spark35_driver failed:\n{step['error']}"
        )
    return step


def _checkpoint_ids(metadata_location: str) -> list[str | None]:
    table = StaticTable.from_metadata(metadata_location)
    return [None if s.summary is None else s.summary.get(driver.CHECKPOINT_KEY) for s in table.snapshots()]


def _utc_day(ts: dt.datetime | None) -> dt.date | None:
    return None if ts is None else ts.astimezone(dt.UTC).date()


def _check_files_against_partitions(
    metadata_location: str, key: str, expected_partition: dict[Any, dict[str, Any]]
) -> dict[tuple[Any, ...], int]:
    """Every data file holds only rows of its own partition value (computed here in Python, in
    UTC); returns how many files each partition has."""
    files = StaticTable.from_metadata(metadata_location).inspect.files().to_pylist()
    per_partition: dict[tuple[Any, ...], int] = collections.Counter()
    for f in files:
        partition = f["partition"]
        keys = pq.read_table(f["file_path"].removeprefix("file://"), columns=[key])[key].to_pylist()
        wrong = [k for k in keys if expected_partition[k] != partition]
        assert not wrong, f"{f['file_path']} (partition {partition}) holds rows of other partitions: {wrong[:10]}"
        per_partition[tuple(sorted(partition.items()))] += 1
    assert sum(f["record_count"] for f in files) == len(expected_partition)
    assert set(per_partition) == {tuple(sorted(p.items())) for p in expected_partition.values()}
    return per_partition


def test_driver_ran_on_spark_35(spark35_run: DriverRun) -> None:
    result = spark35_run.result
    assert result["pyspark_version"].startswith("3.5."), result
    assert result["spark_version"].startswith("3.5."), result
    assert result["session_tz"] == driver.SESSION_TZ
    steps = ("bounded", "streamed", "debezium", *(("kafka",) if spark35_run.kafka_error is None else ()))
    failed = {name: result[name]["error"] for name in steps if not result[name]["ok"]}
    assert not failed and spark35_run.returncode == 0, (
        f"spark35_driver exit {spark35_run.returncode}; failed steps: {json.dumps(failed, indent=2)}\n"
        f"output tail:\n{spark35_run.output[-5000:]}"
    )


def test_bounded_write_on_spark_35(spark35_run: DriverRun, java_reader: JavaIcebergReader) -> None:
    step = _step(spark35_run, "bounded")
    location = step["metadata_location"]
    rows = driver.bounded_rows()
    expected_table = pa.Table.from_pylist(rows, schema=driver.bounded_arrow_schema())
    expected = normalize(expected_table, ["id"])
    assert step["rows_written"] == step["rows_in_table"] == len(rows)

    by_pyiceberg = pyiceberg_read(location)
    assert canonical_schema(by_pyiceberg) == canonical_schema(expected_table)
    assert normalize(by_pyiceberg, ["id"]) == expected
    assert normalize(duckdb_read(location), ["id"]) == expected
    assert normalize(java_reader.read(location), ["id"]) == expected

    # One write is one snapshot, checkpoint 0, as reported by the driver.
    assert _checkpoint_ids(location) == ["0"]
    assert [s["summary"][driver.CHECKPOINT_KEY] for s in step["snapshots"]] == ["0"]
    assert step["outcome_checkpoint_id"] == 0
    assert step["snapshots"][0]["summary"]["added-records"] == str(len(rows))

    # Partition values are Iceberg's (day in UTC although the session is in Asia/Kolkata), and hash
    # distribution (the default for a partitioned table) sends each partition to one writer.
    table = StaticTable.from_metadata(location)
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("ts_day", "day"),
        ("user_id_bucket", "bucket[4]"),
    ]
    expected_partition = {
        r["id"]: {"ts_day": _utc_day(r["ts"]), "user_id_bucket": _bucket4(r["user_id"])} for r in rows
    }
    per_partition = _check_files_against_partitions(location, "id", expected_partition)
    assert set(per_partition.values()) == {1}, per_partition


def test_streaming_availablenow_on_spark_35(spark35_run: DriverRun, java_reader: JavaIcebergReader) -> None:
    step = _step(spark35_run, "streamed")
    location = step["metadata_location"]
    batches = [event_batch(f * driver.ROWS_PER_FILE, driver.ROWS_PER_FILE) for f in range(driver.SOURCE_FILES)]
    expected = normalize(pa.concat_tables(batches), ["event_id"])
    assert step["rows_written"] == step["rows_in_table"] == len(expected)

    assert normalize(pyiceberg_read(location), ["event_id"]) == expected
    assert normalize(duckdb_read(location), ["event_id"]) == expected
    assert normalize(java_reader.read(location), ["event_id"]) == expected

    # maxFilesPerTrigger=1: one micro-batch, one snapshot, one checkpoint id per source file, one job.
    ids = [str(i) for i in range(driver.SOURCE_FILES)]
    assert _checkpoint_ids(location) == ids
    assert step["checkpoint_ids"] == ids
    assert len({s["summary"]["iceberg-sink.job-id"] for s in step["snapshots"]}) == 1
    # Each snapshot adds the rows of exactly one source file (the file stream orders files by
    # modification time, which ties for files written in the same instant, so not by name).
    table = StaticTable.from_metadata(location)
    files = {tuple(b["event_id"].to_pylist()) for b in batches}
    seen: set[int] = set()
    for i, snapshot in enumerate(table.snapshots()):
        assert snapshot.summary is not None and snapshot.summary["added-records"] == str(driver.ROWS_PER_FILE)
        upto = set(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()["event_id"].to_pylist())
        assert seen < upto and tuple(sorted(upto - seen)) in files, f"snapshot {i} added {sorted(upto - seen)}"
        seen = upto

    # day(ts) in UTC (20:00 UTC on 2024-03-09 is already 2024-03-10 in Kolkata), and within each
    # micro-batch one file per partition (hash distribution).
    source = pa.concat_tables(batches).to_pylist()
    expected_partition = {r["event_id"]: {"ts_day": _utc_day(r["ts"])} for r in source}
    _check_files_against_partitions(location, "event_id", expected_partition)
    entries = table.inspect.entries().to_pylist()
    for snapshot_id, added in _added_partitions(entries).items():
        assert len(added) == len(set(added)), f"snapshot {snapshot_id} has several files for one partition: {added}"


def _added_partitions(entries: list[dict[str, Any]]) -> dict[int, list[tuple[Any, ...]]]:
    added: dict[int, list[tuple[Any, ...]]] = collections.defaultdict(list)
    for e in entries:
        if e["status"] == 1:  # ADDED
            added[e["snapshot_id"]].append(tuple(sorted(e["data_file"]["partition"].items())))
    return added


def test_debezium_reader_on_spark_35(spark35_run: DriverRun, java_reader: JavaIcebergReader) -> None:
    """The Debezium reader on Spark 3.5, where Spark's expressions read every row image (no Arrow
    UDFs): a repeated key's first value is read, values that are no event are refused with their
    reasons, and the upserts read back equal in Iceberg Java and DuckDB."""
    step = _step(spark35_run, "debezium")
    first = len(driver.debezium_events())
    assert step["refused"] == {str(first + i): reason for i, reason in enumerate(driver.DEBEZIUM_GARBAGE.values())}
    location = step["metadata_location"]
    want = driver.debezium_expected_rows()
    columns = list(want[0])
    assert normalize(java_reader.read(location).select(columns), ["id"]) == want
    assert normalize(duckdb_read(location).select(columns), ["id"]) == want


def test_kafka_source_on_spark_35(spark35_run: DriverRun) -> None:
    """Spark 3.5's own Kafka source into an upsert: the table holds the last value of each id, and
    the snapshot names the end offset of every partition of the topic."""
    if spark35_run.kafka_error is not None:
        pytest.fail(f"the Kafka step of spark35_driver could not be set up:\n{spark35_run.kafka_error}")
    step = _step(spark35_run, "kafka")
    location = step["metadata_location"]
    want = driver.kafka_expected_rows()
    assert step["rows_in_table"] == len(want)
    assert normalize(pyiceberg_read(location), [driver.KAFKA_KEY]) == want
    assert normalize(duckdb_read(location), [driver.KAFKA_KEY]) == want

    end = spark35_run.kafka_end_offsets
    assert len(end) == driver.KAFKA_PARTITIONS and sum(end.values()) == len(driver.kafka_records()), end
    snapshots = StaticTable.from_metadata(location).snapshots()
    recorded = [parse_summary(dict(s.summary.additional_properties)) for s in snapshots if s.summary]
    assert recorded and all(recorded), recorded  # every commit of the stream names its offsets
    assert recorded[-1] == {driver.KAFKA_TOPIC: end}  # the last one: the whole topic
