"""A real PySpark driver started with driver_java_options(): the first one writes its class data
sharing archive at exit, a later one maps it and writes through the sink (each in a fresh process:
a JVM keeps the options it started with)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from iceberg_sink._driver_jvm import ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]

DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession
from iceberg_sink import IcebergSink, driver_java_options

cache, lake, log = sys.argv[1:4]
options = driver_java_options(cache_dir=cache)
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.extraJavaOptions", f"{options} -Xlog:cds*=info:file={log}")
         .getOrCreate())
sink = IcebergSink.builder().embedded(lake).table("db.t").create_if_missing().build()
sink.write(spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id long, v string"))
jvm = spark.sparkContext._jvm
arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
print(json.dumps({"options": options, "arguments": arguments, "vm_info": jvm.java.lang.System.getProperty("java.vm.info")}))
spark.stop()
"""


def _drive(tmp_path: Path, run: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT}  # not the suite's shared archive
    env.update(PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    log = tmp_path / f"cds-{run}.log"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "cds"), str(tmp_path / "lake"), str(log)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = log.read_text() if log.is_file() else ""
    return result


@pytest.mark.slow
def test_a_driver_writes_its_archive_at_exit_and_the_next_maps_it(tmp_path: Path) -> None:
    first = _drive(tmp_path, "first")
    options = str(first["options"])
    assert "-XX:ArchiveClassesAtExit=" in options
    assert set(options.split()) <= set(first["arguments"])  # type: ignore[arg-type]
    # The JVM writes the archive once the Python driver has gone; wait for it to be whole.
    deadline = time.time() + 120
    partials: list[Path] = []
    while time.time() < deadline:
        partials = list((tmp_path / "cds").glob("*.partial"))
        if partials and "Written dynamic archive" in (tmp_path / "cds-first.log").read_text():
            break
        time.sleep(0.5)
    assert partials, "no archive written at the driver's exit"
    for partial in partials:
        past = time.time() - 600
        os.utime(partial, (past, past))  # settled: no JVM writes it any more

    second = _drive(tmp_path, "second")
    archive = [o for o in str(second["options"]).split() if o.startswith("-XX:SharedArchiveFile=")]
    assert archive, second["options"]
    path = archive[0].split("=", 1)[1]
    assert Path(path).is_file()
    assert f"Opened archive {path}" in str(second["log"]) or f"Opened shared archive file {path}" in str(
        second["log"]
    ), str(second["log"])[-2000:]
    assert "sharing" in str(second["vm_info"])

    from iceberg_sink import IcebergSink

    sink = IcebergSink.builder().embedded(tmp_path / "lake").table("db.t").build()
    assert sorted(sink.load_table("db.t").scan().to_arrow().column("id").to_pylist()) == [1, 1, 2, 2, 3, 3]
