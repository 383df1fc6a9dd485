"""Append benchmark: rows/s of a Parquet file stream into Iceberg, iceberg_sink vs Spark's Iceberg writer.

    .venv/bin/python -m benchmarks.append [--batches 8] [--batch-rows 250000] [--rounds 2]
                                          [--out benchmarks/results/append.json]

One invocation generates the stream once (``benchmarks/append_data.py``: ``--batches`` Parquet files
of ``--batch-rows`` events, from ``--seed``) and measures, interleaved, each system in a fresh
process of its own (``benchmarks/append_driver.py``), ``local[2]``:

| system | Spark | what |
|---|---|---|
| ``ceiling-3.5`` / ``ceiling-4`` | 3.5 (Java venv) / the main venv's | Spark reading the stream, only counting it (``noop`` sink) |
| ``iceberg_java-3.5`` | 3.5 + Apache Iceberg Java 1.9.2 | ``writeStream.format("iceberg")`` |
| ``iceberg_sink-3.5`` | 3.5 (Java venv; the jar is not used) | this sink |
| ``iceberg_sink-4`` | the main venv's | this sink |
| ``iceberg_sink_jvm-*`` | as above | this sink with Spark's Parquet writer (``iceberg-sink.writer.jvm-parquet=true``) |

Each writer runs unpartitioned and partitioned by ``day(ts), bucket(16, user_id)``. A round runs every
system once; odd rounds run them in reverse order, so a slow phase of the machine does not always
hit the same system. rows/s is measured from the stream's start to the end of its last micro-batch
(which holds the last commit); each system's figure is the median over the rounds, and is given as
a ratio to the ceiling of the same Spark version and to Iceberg Java (same partitioning).

After all runs, every table written (the sink's and Java's) is checked with Apache Iceberg Java
(Spark SQL over the table's metadata.json) and DuckDB's iceberg extension: row count and an exact
integer checksum of every column against the generator's (``append_data.CHECKSUM_SQL``).

Before each run the driver waits (up to ``--wait-quiet`` s) until other processes used under 0.2
cores for 3 s; the CPU time other processes used during each run is reported
(``benchmarks/cpu_monitor.py``). JSON goes to stdout and ``--out``; progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.append_data import CHECKSUM_COLUMNS, checksum_sql, compare, generate
from benchmarks.cdc import java_env_paths, machine, source_state
from benchmarks.cpu_monitor import ForeignCpuMonitor

PROJECT_ROOT = Path(__file__).resolve().parents[1]
QUIET_CORES = 0.2
QUIET_SECONDS = 3.0
# Variables of this venv that must not leak into the Spark 3.5 subprocess.
_SCRUBBED_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SPARK_HOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_CONF_DIR",
)
LAYOUTS = ("unpartitioned", "partitioned")
SYSTEMS = (
    "ceiling-3.5",
    "ceiling-4",
    "iceberg_java-3.5",
    "iceberg_sink-3.5",
    "iceberg_sink-4",
    "iceberg_sink_jvm-3.5",
    "iceberg_sink_jvm-4",
)


def log(message: str) -> None:
    print(f"[append {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_driver(python: Path | str, spec: dict[str, Any], work_dir: Path, java_venv: bool) -> dict[str, Any]:
    spec = {**spec, "result": str(work_dir / "result.json")}
    spec_path = work_dir / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not (java_venv and k in _SCRUBBED_ENV)}
    # The drivers (and the sink's Python workers) import this checkout's iceberg_sink and benchmarks.
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(
        [str(python), "-m", "benchmarks.append_driver", str(spec_path)],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=sys.stderr,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"append_driver ({spec['system']}) failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    return result


def plan(systems: list[str], layouts: list[str], rounds: int) -> list[tuple[int, str, str]]:
    """(round, system, layout) in run order: ceilings once per round, writers once per layout."""
    one = [(s, "unpartitioned") for s in systems if s.startswith("ceiling")]
    for layout in layouts:
        one += [(s, layout) for s in systems if not s.startswith("ceiling")]
    out = []
    for r in range(rounds):
        order = one if r % 2 == 0 else list(reversed(one))
        out += [(r, s, layout) for s, layout in order]
    return out


def check_tables(tables: dict[str, str], expected: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Checksum of every table with Iceberg Java and DuckDB, against the generator's."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    from tests.interop.readers import JavaIcebergReader, duckdb_connect

    checks: dict[str, dict[str, Any]] = {}
    con = duckdb_connect()
    try:
        with JavaIcebergReader(driver_memory="2g", cores=2) as java:
            for name, metadata in tables.items():
                row = java.sql(checksum_sql("t", "spark"), views={"t": metadata}).to_pylist()[0]
                java_check = compare(expected, row)
                path = metadata.removeprefix("file://").replace("'", "''")
                cursor = con.execute(checksum_sql(f"iceberg_scan('{path}')", "duckdb"))
                names = [d[0] for d in cursor.description]
                duck_row = dict(zip(names, cursor.fetchone(), strict=True))
                duck_check = compare(expected, duck_row)
                files = con.execute(
                    f"select count(*) from iceberg_metadata('{path}') where manifest_content = 'DATA'"
                ).fetchone()
                checks[name] = {
                    "ok": java_check["ok"] and duck_check["ok"],
                    "iceberg_java": {**java_check, "observed": {k: row.get(k) for k in CHECKSUM_COLUMNS}},
                    "duckdb": duck_check,
                    "data_files": int(files[0]) if files else None,
                }
                log(
                    f"checked {name}: {'ok' if checks[name]['ok'] else 'MISMATCH'} ({checks[name]['data_files']} files)"
                )
    finally:
        con.close()
    return checks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.append", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=8, help="micro-batches = Parquet files (default 8)")
    parser.add_argument("--batch-rows", type=int, default=250_000, help="events per micro-batch (default 250000)")
    parser.add_argument("--rounds", type=int, default=2, help="times each system runs (default 2)")
    parser.add_argument("--seed", type=int, default=20261123)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="unpartitioned,partitioned (default both)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="write option of the sink (repeatable), e.g. iceberg-sink.writer.buffer-bytes=33554432",
    )
    parser.add_argument("--wait-quiet", type=float, default=120.0)
    parser.add_argument("--skip-checks", action="store_true", help="do not read the tables back (smoke runs only)")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "benchmarks" / "results" / "append.json")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    if set(args.systems) - set(SYSTEMS) or not args.systems:
        parser.error(f"--systems: expected a subset of {', '.join(SYSTEMS)}; received {args.systems}")
    if set(args.layouts) - set(LAYOUTS) or not args.layouts:
        parser.error(f"--layouts: expected a subset of {', '.join(LAYOUTS)}; received {args.layouts}")
    if args.rounds < 1 or args.batches < 1 or args.batch_rows < 1:
        parser.error("--rounds, --batches and --batch-rows must be at least 1")
    args.sink_options = dict(o.split("=", 1) for o in args.sink_option)
    return args


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    run_started = time.perf_counter()
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="iceberg-sink-append-bench-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    monitor = ForeignCpuMonitor().start()
    log(f"scratch directory {work_dir}")
    try:
        java_python, jar = java_env_paths()
        stream = generate(work_dir / "stream", args.batches, args.batch_rows, args.seed)
        log(f"generated {stream.rows} events in {len(stream.files)} files ({stream.bytes / 1e6:.0f} MB)")
        common = {
            "source_dir": str(work_dir / "stream"),
            "cores": args.cores,
            "driver_memory": args.driver_memory,
            "shuffle_partitions": args.shuffle_partitions,
            "quiet": {"threshold": QUIET_CORES, "seconds": QUIET_SECONDS, "max_wait": args.wait_quiet},
            "jar": str(jar),
            "sink_options": args.sink_options,
        }
        runs: list[dict[str, Any]] = []
        for round_, name, layout in plan(args.systems, args.layouts, args.rounds):
            system, version = name.split("-", 1)
            run_dir = work_dir / "runs" / f"{round_}-{name}-{layout}"
            run_dir.mkdir(parents=True)
            java_venv = version == "3.5"
            raw = run_driver(
                java_python if java_venv else sys.executable,
                {**common, "system": system, "partitioned": layout == "partitioned", "work_dir": str(run_dir)},
                run_dir,
                java_venv,
            )
            raw.update(
                round=round_,
                name=name,
                layout=layout,
                foreign_cpu_seconds=monitor.between(raw["wall_start"], raw["wall_end"]),
            )
            runs.append(raw)
            log(f"round {round_} {name} {layout}: {raw['rows_per_second']:,.0f} rows/s")

        expected_rows = stream.rows
        checks: dict[str, dict[str, Any]] = {}
        tables = {
            f"{r['round']}-{r['name']}-{r['layout']}": r["metadata_location"] for r in runs if r["metadata_location"]
        }
        if not args.skip_checks and tables:
            checks = check_tables(tables, stream.checksum)

        systems: dict[str, dict[str, Any]] = {}
        for r in runs:
            key = r["name"] if r["name"].startswith("ceiling") else f"{r['name']}/{r['layout']}"
            entry = systems.setdefault(
                key,
                {"name": r["name"], "layout": r["layout"], "spark_version": r["spark_version"], "runs": []},
            )
            entry["runs"].append(
                {
                    "round": r["round"],
                    "rows_per_second": r["rows_per_second"],
                    "seconds": r["seconds"],
                    "rows": r["rows"],
                    "foreign_cpu_seconds": r["foreign_cpu_seconds"],
                    "waited_for_quiet_seconds": r["waited_for_quiet_seconds"],
                    "batch_trigger_ms": [b["trigger_ms"] for b in r["batches"]],
                    "check": checks.get(f"{r['round']}-{r['name']}-{r['layout']}"),
                }
            )
        for entry in systems.values():
            rates = [run["rows_per_second"] for run in entry["runs"]]
            entry["rows_per_second"] = statistics.median(rates)
            entry["rows_ok"] = all(run["rows"] == expected_rows for run in entry["runs"])
        for entry in systems.values():
            version = entry["name"].split("-", 1)[1]
            ceiling = systems.get(f"ceiling-{version}")
            java = systems.get(f"iceberg_java-3.5/{entry['layout']}")
            entry["ratio_to_ceiling"] = _ratio(
                entry["rows_per_second"], ceiling["rows_per_second"] if ceiling else None
            )
            if not entry["name"].startswith("ceiling"):
                entry["ratio_to_iceberg_java"] = _ratio(
                    entry["rows_per_second"], java["rows_per_second"] if java else None
                )
        monitor.stop()
        result: dict[str, Any] = {
            "benchmark": "append",
            "started_at": started_at,
            "config": {
                "batches": args.batches,
                "batch_rows": args.batch_rows,
                "rows": stream.rows,
                "stream_bytes": stream.bytes,
                "rounds": args.rounds,
                "seed": args.seed,
                "cores": args.cores,
                "driver_memory": args.driver_memory,
                "shuffle_partitions": args.shuffle_partitions,
                "sink_options": args.sink_options,
                "partition_by": ["day(ts)", "bucket(16, user_id)"],
            },
            "machine": machine(),
            "iceberg_sink_source": source_state(),
            "systems": systems,
            "checks_ok": all(c["ok"] for c in checks.values()) if checks else None,
            "foreign_cpu_total_seconds": monitor.between(
                time.time() - (time.perf_counter() - run_started), time.time()
            ),
            "timings_seconds": {"generate": stream.generate_seconds, "total": time.perf_counter() - run_started},
        }
        result["ok"] = all(e["rows_ok"] for e in systems.values()) and result["checks_ok"] is not False
    finally:
        monitor.stop()
        if args.keep:
            log(f"kept {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    text = json.dumps(result, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    for key, entry in systems.items():
        extra = f", {entry['ratio_to_iceberg_java']:.2f}x Iceberg Java" if entry.get("ratio_to_iceberg_java") else ""
        ceiling = f"{entry['ratio_to_ceiling']:.2f}x ceiling" if entry.get("ratio_to_ceiling") else ""
        log(f"{key:34s} {entry['rows_per_second']:>10,.0f} rows/s  {ceiling}{extra}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
