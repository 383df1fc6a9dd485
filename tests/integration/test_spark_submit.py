"""docs/spark-cluster.md, done: ``spark-submit`` of the page's ``job.py`` to a standalone cluster.

The workers (tests/integration/standalone.py, ``project_on_workers=False``) have nothing of the
project: their Python comes from the archive the page's step 1 builds, shipped with
``spark.archives``; Spark's Kafka source comes from Maven Central through ``--packages``. The job
reads JSON orders from a real Kafka broker (tests/integration/kafka.py) and upserts them into a table
of a SQLite catalog configured by ``PYICEBERG_CATALOG__LAKE__*``; the test reads it back with DuckDB.
A second job in the same application upserts through the partitioned key index on the same workers
(one ``spark-submit`` for both: a submit is about 30 s of start-up).

Building the archive (a venv with the checkout's wheel and the ``spark`` extra but PySpark, packed
with ``tar -czf``) takes about a minute; it is cached under
``${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/spark-env/`` keyed by a hash of pyproject.toml, the
sink's sources and the Python version, so it is rebuilt exactly when what it holds would change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyiceberg.catalog import load_catalog

from tests.docs import samples
from tests.integration.kafka import components, kafka_broker  # noqa: F401
from tests.integration.standalone import ROOT, StandaloneCluster, spark_home, standalone_cluster
from tests.interop.readers import duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

PAGE = ROOT / "docs" / "spark-cluster.md"


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers whose environment holds nothing of the project."""
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), project_on_workers=False) as running:
        yield running


def page_job() -> str:
    """The page's ``job.py``, as the page shows it."""
    blocks = samples.parse(PAGE.read_text(), samples.page_name(PAGE))
    [job] = [b.code for b in blocks if b.title == "job.py"]
    return job


# A second job in the same application (one spark-submit: a driver, two executors and the archive
# unpacked once, about 30 s on this machine): the page's job.py runs first, as submitted; then the
# metadata it left is printed (the test reads that state), and upserts into the page's table resolve
# their deletes through the partitioned key index, every step (indexing, lookups, merges) a Spark
# job on the workers.
BOTH_JOBS = """
import runpy

from pyiceberg.catalog import load_catalog
from pyspark.sql import SparkSession

from iceberg_sink import IcebergSink

runpy.run_path("job.py", run_name="__main__")
print("after job.py:", load_catalog("lake").load_table("shop.orders").metadata_location, flush=True)
spark = SparkSession.builder.getOrCreate()
sink = (
    IcebergSink.builder()
    .catalog("lake")
    .table("shop.orders")
    .upsert(key=["id"])
    .write_option("iceberg-sink.key-index.mode", "partitioned")
    .write_option("iceberg-sink.key-index.driver-max-bytes", 0)
    .write_option("iceberg-sink.key-index.partitions", 2)
    .write_option("iceberg-sink.key-index.partition-max-entries", 8)
    .build()
)
for n in range(3):
    rows = [(i, f"item-{i}-v{n}", i * 10 + n) for i in range(n, 40, 3)]
    sink.write(spark.createDataFrame(rows, "id long, item string, qty int").repartition(2))
print("key index jobs:", sink._committer_index.runner.jobs, flush=True)
"""


def executor_requirements() -> list[str]:
    """What step 1 installs besides the sink: the ``spark`` extra without PySpark (the cluster's)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    return [r for r in extra if not r.startswith("pyspark")]


def _cache_key() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for path in [ROOT / "pyproject.toml", *sorted((ROOT / "iceberg_sink").rglob("*"))]:
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _run(cmd: list[str | Path], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH", "VIRTUAL_ENV"))}
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def env_archive() -> Path:
    """Step 1 of the page (the sink from this checkout's wheel), or the cached result of it."""
    cache = Path(os.environ.get("ICEBERG_SINK_CACHE") or Path.home() / ".cache" / "iceberg-sink") / "spark-env"
    archive = cache / _cache_key() / "env.tar.gz"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    work = cache / f".build-{uuid.uuid4().hex}"
    work.mkdir()
    try:
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", work / "dist", ROOT], cwd=work)
        [wheel] = (work / "dist").glob("iceberg_sink-*.whl")
        _run([sys.executable, "-m", "venv", "--without-pip", "env"], cwd=work)
        pip = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            "env/bin/python",
            "install",
            "-q",
            "--disable-pip-version-check",
        ]
        _run([*pip, wheel, *executor_requirements()], cwd=work)
        _run(["tar", "-C", "env", "-czf", "env.tar.gz", "."], cwd=work)
        for old in cache.iterdir():  # one archive of about 150 MB is enough
            if not old.name.startswith("."):
                shutil.rmtree(old, ignore_errors=True)
        archive.parent.mkdir()
        (work / "env.tar.gz").rename(archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return archive


def test_the_pages_job_runs_with_spark_submit_and_a_shipped_environment(
    bare_cluster: StandaloneCluster,
    kafka_broker: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    archive = env_archive()
    built = time.monotonic() - started
    kafka_broker.create_topic("orders", partitions=2)
    orders = [{"id": i, "item": f"item-{i}", "qty": i * 10} for i in range(40)]
    kafka_broker.produce("orders", [(str(o["id"]), json.dumps(o)) for o in orders])

    submit_dir = tmp_path / "submit"  # the driver's working directory: the archive and job.py
    submit_dir.mkdir()
    (submit_dir / "job.py").write_text(page_job())
    shutil.copy(archive, submit_dir / "env.tar.gz")
    connector = components().spark_kafka_version(pyspark.__version__)
    page = PAGE.read_text()
    # What step 3 shows, with the connector that exists for this Spark version.
    shown = ["--packages", "spark-sql-kafka-0-10_2.13:", "--conf spark.archives=env.tar.gz#env", "job.py"]
    assert all(s in page for s in shown), shown
    assert all(f"'{r}'" in page for r in executor_requirements())
    lake = tmp_path / "lake"  # catalog and warehouse: on paths every worker shares (one machine)
    lake.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SPARK_", "PYSPARK_"))}
    env.update(
        {
            "PYTHONPATH": str(ROOT),  # the driver's Python: this checkout's sink, with PySpark
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYSPARK_PYTHON": "./env/bin/python",
            "BOOTSTRAP": kafka_broker.bootstrap,
            "CHECKPOINT": str(tmp_path / "checkpoints" / "orders"),
            "PYICEBERG_CATALOG__LAKE__TYPE": "sql",
            "PYICEBERG_CATALOG__LAKE__URI": f"sqlite:///{lake / 'catalog.db'}",
            "PYICEBERG_CATALOG__LAKE__WAREHOUSE": (lake / "warehouse").as_uri(),
        }
    )
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        *("--master", bare_cluster.url),
        *("--packages", f"org.apache.spark:spark-sql-kafka-0-10_2.13:{connector}"),
        *("--conf", "spark.archives=env.tar.gz#env"),
        # The small test cluster: two executors of one core, the driver on loopback, both executors
        # registered before the first job (on a busy machine too) so that each is asked for its Python.
        *("--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1"),
        *("--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"),
        *("--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0"),
        *("--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=180s"),
        *("--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"),
    ]

    def submit(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        """``spark-submit`` of ``args`` (the script and its arguments) on the bare cluster: the run and its seconds."""
        started = time.monotonic()
        done = subprocess.run(
            [*command, *args],
            cwd=submit_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            start_new_session=True,
        )
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-8000:]}\n{bare_cluster.executor_logs()}"
        return done, time.monotonic() - started

    (submit_dir / "both.py").write_text(BOTH_JOBS)
    done, seconds = submit("both.py", "--available-now")

    # Every executor asked (both, unless the scheduler put the two tasks on one) ran the archive's
    # Python, unpacked in its own working directory, and the archive's iceberg_sink.
    reported = re.findall(r"^executor python: (\S+) (\S+)$", done.stdout, re.M)
    executors = bare_cluster.executor_dirs()
    assert len(executors) == 2 and 1 <= len(reported) <= 2, (done.stdout, executors)
    for python, module in reported:
        home = Path(python).parent.parent
        assert python.endswith("/env/bin/python") and home.parent in executors, (python, executors)
        assert module.startswith(f"{home}/lib/python"), module
        assert "/site-packages/iceberg_sink/" in module and str(ROOT) not in module
    # --packages resolved the connector and the executors fetched it from the driver.
    assert "spark-sql-kafka-0-10_2.13" in done.stderr
    assert any((e / f"org.apache.spark_spark-sql-kafka-0-10_2.13-{connector}.jar").exists() for e in executors)

    # The table as the page's job left it (metadata files are never rewritten).
    [after_job] = re.findall(r"^after job.py: (\S+)$", done.stdout, re.M)
    assert normalize(duckdb_read(after_job), ["id"]) == orders

    # The partitioned key index on the same bare workers: its tasks import the archive's sink.
    jobs = re.findall(r"^key index jobs: (\d+)$", done.stdout, re.M)
    assert jobs and int(jobs[0]) > 0, done.stdout[-3000:]
    for n in range(3):
        for i in range(n, 40, 3):
            orders[i] = {"id": i, "item": f"item-{i}-v{n}", "qty": i * 10 + n}
    catalog = load_catalog("lake", type="sql", uri=f"sqlite:///{lake / 'catalog.db'}")
    table = catalog.load_table("shop.orders")
    assert table.metadata_location != after_job
    assert normalize(duckdb_read(table.metadata_location), ["id"]) == orders
    print(f"archive {built:.0f} s (cached: {built < 5}), spark-submit of both jobs {seconds:.0f} s")
