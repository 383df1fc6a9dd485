"""Append benchmark: a Parquet file stream into Iceberg, iceberg_sink vs Spark's Iceberg writer, measured symmetrically.

    .venv/bin/python -m benchmarks.append [--batches 8] [--batch-rows 250000] [--rounds 2] [--row-groups 4,1]
                                          [--systems ...] [--out benchmarks/results/append.json]

One invocation generates the stream once per row-group count (``benchmarks/append_data.py``:
``--batches`` Parquet files of ``--batch-rows`` events from ``--seed``; 4 row groups split a
micro-batch over both cores, 1 makes it one task) and measures, interleaved, each system in a fresh
process of its own (``benchmarks/append_driver.py``), ``local[2]``:

| system | Spark | what |
|---|---|---|
| ``ceiling-3.5`` / ``ceiling-4`` | 3.5 (Java venv) / the main venv's | Spark reading the stream, only counting it (``noop`` sink) |
| ``iceberg_java-3.5`` | 3.5 + Apache Iceberg Java 1.9.2 (Java venv) | ``CREATE TABLE`` then ``writeStream.format("iceberg")`` |
| ``iceberg_java-4.1`` | 4.1 + the newest Iceberg Java (``tests/interop/java_env.py``) | the same |
| ``iceberg_sink-3.5`` | 3.5 (Java venv; the jar is not used) | this sink: import, builder, ``start()`` |
| ``iceberg_sink-4`` | the main venv's | this sink |
| ``iceberg_sink_jvm-*`` | as above | this sink with Spark's Parquet writer (``iceberg-sink.writer.jvm-parquet=true``) |

The newest Iceberg Java runs on Spark 4.1 because its runtime does not load on the Spark 4.3 this
project installs (``java_env.NEWEST_RUNTIME_ARTIFACT``). Each writer runs every shape: unpartitioned
and partitioned by ``day(ts), bucket(16, user_id)``, times each row-group count. A round runs every
system once per shape; odd rounds run them in reverse order.

The timed window is the same for every system (see append_driver.py): from a ready SparkSession and
stream DataFrame to the end of the last micro-batch, with table creation, the sink's import and
builder, and the start call inside it; nothing is written or warmed up before it. Per run: end to end
rows/s, steady state rows/s (batches 2..N), start-up (first batch end minus a median steady batch),
and CPU-seconds per million rows of the process tree (driver, JVM, Python workers), end to end and
steady. Each figure is the median over rounds, and writers get ratios to both Java baselines on the
same shape.

After all runs, every table written is checked with Apache Iceberg Java (Spark SQL over the table's
metadata.json) and DuckDB's iceberg extension: row count and an exact integer checksum of every
column against the generator's (``append_data.CHECKSUM_SQL``).

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
# Row groups per file: 4 splits a micro-batch over both cores, 1 makes it one task.
ROW_GROUPS = (4, 1)
SYSTEMS = (
    "ceiling-3.5",
    "ceiling-4",
    "iceberg_java-3.5",
    "iceberg_java-4.1",
    "iceberg_sink-3.5",
    "iceberg_sink-4",
    "iceberg_sink_jvm-3.5",
    "iceberg_sink_jvm-4",
)
DEFAULT_SYSTEMS = ("ceiling-4", "iceberg_java-3.5", "iceberg_java-4.1", "iceberg_sink-3.5", "iceberg_sink-4")
# The Java baselines every writer is compared with, by Spark version label.
BASELINES = ("iceberg_java-3.5", "iceberg_java-4.1")
# Medians reported per system and shape (each run's figures come from append_driver._figures).
FIGURES = (
    "rows_per_second",
    "steady_rows_per_second",
    "seconds",
    "startup_seconds",
    "start_call_seconds",
    "first_batch_end_seconds",
    "steady_batch_seconds",
    "cpu_seconds_per_million_rows",
    "steady_cpu_seconds_per_million_rows",
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


def shapes(layouts: list[str], row_groups: list[int]) -> list[str]:
    """Shape names: ``<layout>/<n>rg`` (``unpartitioned/4rg``)."""
    return [f"{layout}/{n}rg" for n in row_groups for layout in layouts]


def plan(
    systems: list[str], layouts: list[str], rounds: int, row_groups: list[int] | None = None
) -> list[tuple[int, str, str]]:
    """(round, system, shape) in run order: ceilings once per round and row-group count (unpartitioned),
    writers once per shape."""
    row_groups = row_groups or [4]
    one: list[tuple[str, str]] = []
    for n in row_groups:
        one += [(s, f"unpartitioned/{n}rg") for s in systems if s.startswith("ceiling")]
        for layout in layouts:
            one += [(s, f"{layout}/{n}rg") for s in systems if not s.startswith("ceiling")]
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
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default {','.join(DEFAULT_SYSTEMS)})",
    )
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="unpartitioned,partitioned (default both)")
    parser.add_argument(
        "--row-groups",
        default=",".join(map(str, ROW_GROUPS)),
        help="row groups per file, comma-separated (default 4,1: two tasks and one task per micro-batch)",
    )
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
    try:
        args.row_groups = [int(n) for n in args.row_groups.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--row-groups: expected comma-separated integers; received {args.row_groups!r}")
    if not args.row_groups or min(args.row_groups) < 1:
        parser.error(f"--row-groups: expected positive integers; received {args.row_groups}")
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


def _interpreters(versions: set[str]) -> dict[str, tuple[Path | str, Path, bool]]:
    """Spark version label -> (python, Iceberg runtime jar, scrub this venv's variables), for the
    labels asked for only (each other venv is built on first use, which takes minutes)."""
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.insert(0, str(PROJECT_ROOT))
    out: dict[str, tuple[Path | str, Path, bool]] = {}
    if "3.5" in versions or "4" in versions:
        java_python, jar = java_env_paths() if "3.5" in versions else (Path(sys.executable), Path())
        out["3.5"] = (java_python, jar, True)
        out["4"] = (sys.executable, jar, False)  # the jar is not used by the sink
    if "4.1" in versions:
        from tests.interop.java_env import newest_runtime

        newest = newest_runtime()
        out["4.1"] = (newest.python, newest.jars[0], True)
    return out


def _summarise(runs: list[dict[str, Any]], checks: dict[str, dict[str, Any]], expected_rows: int) -> dict[str, Any]:
    systems: dict[str, dict[str, Any]] = {}
    for r in runs:
        key = f"{r['name']}/{r['shape']}"
        entry = systems.setdefault(
            key,
            {"name": r["name"], "shape": r["shape"], "spark_version": r["spark_version"], "runs": []},
        )
        entry["runs"].append(
            {
                "round": r["round"],
                **{f: r.get(f) for f in FIGURES},
                "rows": r["rows"],
                "foreign_cpu_seconds": r["foreign_cpu_seconds"],
                "waited_for_quiet_seconds": r["waited_for_quiet_seconds"],
                "batch_trigger_ms": [b["trigger_ms"] for b in r["batches"]],
                "check": checks.get(f"{r['round']}-{r['name']}-{r['shape']}"),
            }
        )
    for entry in systems.values():
        for figure in FIGURES:
            values = [run[figure] for run in entry["runs"] if run.get(figure) is not None]
            entry[figure] = statistics.median(values) if values else None
        entry["rows_ok"] = all(run["rows"] == expected_rows for run in entry["runs"])
    for entry in systems.values():
        if entry["name"].startswith("ceiling"):
            continue
        entry["ratios"] = {}
        for baseline in BASELINES:
            java = systems.get(f"{baseline}/{entry['shape']}")
            if java is None or entry["name"] == baseline:
                continue
            entry["ratios"][baseline] = {
                "end_to_end": _ratio(entry["rows_per_second"], java["rows_per_second"]),
                "steady": _ratio(entry["steady_rows_per_second"], java["steady_rows_per_second"]),
                # Above 1: this system needs more CPU per row than Java.
                "cpu_per_row": _ratio(entry["cpu_seconds_per_million_rows"], java["cpu_seconds_per_million_rows"]),
                "startup_minus_java_seconds": (
                    entry["startup_seconds"] - java["startup_seconds"]
                    if entry["startup_seconds"] is not None and java["startup_seconds"] is not None
                    else None
                ),
            }
    return systems


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    run_started = time.perf_counter()
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="iceberg-sink-append-bench-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    monitor = ForeignCpuMonitor().start()
    log(f"scratch directory {work_dir}")
    try:
        interpreters = _interpreters({name.split("-", 1)[1] for name in args.systems})
        streams = {
            n: generate(work_dir / f"stream-{n}rg", args.batches, args.batch_rows, args.seed, row_groups=n)
            for n in args.row_groups
        }
        stream = streams[args.row_groups[0]]
        log(f"generated {stream.rows} events in {len(stream.files)} files ({stream.bytes / 1e6:.0f} MB) per stream")
        common = {
            "cores": args.cores,
            "driver_memory": args.driver_memory,
            "shuffle_partitions": args.shuffle_partitions,
            "quiet": {"threshold": QUIET_CORES, "seconds": QUIET_SECONDS, "max_wait": args.wait_quiet},
            "sink_options": args.sink_options,
        }
        runs: list[dict[str, Any]] = []
        for round_, name, shape in plan(args.systems, args.layouts, args.rounds, args.row_groups):
            system, version = name.split("-", 1)
            layout, groups = shape.split("/")
            python, jar, scrub = interpreters[version]
            run_dir = work_dir / "runs" / f"{round_}-{name}-{layout}-{groups}"
            run_dir.mkdir(parents=True)
            raw = run_driver(
                python,
                {
                    **common,
                    "system": system,
                    "jar": str(jar),
                    "source_dir": str(work_dir / f"stream-{groups}"),
                    "partitioned": layout == "partitioned",
                    "work_dir": str(run_dir),
                },
                run_dir,
                scrub,
            )
            raw.update(
                round=round_,
                name=name,
                shape=shape,
                foreign_cpu_seconds=monitor.between(raw["wall_start"], raw["wall_end"]),
            )
            runs.append(raw)
            log(
                f"round {round_} {name} {shape}: {raw['rows_per_second']:,.0f} rows/s end to end, "
                f"{(raw.get('steady_rows_per_second') or 0):,.0f} steady"
            )

        checks: dict[str, dict[str, Any]] = {}
        tables = {
            f"{r['round']}-{r['name']}-{r['shape']}": r["metadata_location"] for r in runs if r["metadata_location"]
        }
        if not args.skip_checks and tables:
            checks = check_tables(tables, stream.checksum)
        systems = _summarise(runs, checks, stream.rows)
        monitor.stop()
        result: dict[str, Any] = {
            "benchmark": "append",
            "started_at": started_at,
            "config": {
                "batches": args.batches,
                "batch_rows": args.batch_rows,
                "rows": stream.rows,
                "stream_bytes": {f"{n}rg": s.bytes for n, s in streams.items()},
                "row_groups": args.row_groups,
                "rounds": args.rounds,
                "seed": args.seed,
                "cores": args.cores,
                "driver_memory": args.driver_memory,
                "shuffle_partitions": args.shuffle_partitions,
                "sink_options": args.sink_options,
                "partition_by": ["day(ts)", "bucket(16, user_id)"],
                "window": "from the SparkSession and stream DataFrame being ready (table creation, imports, builder, "
                "start call included) to the end of the last micro-batch",
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
        line = f"{key:36s} {entry['rows_per_second']:>10,.0f} rows/s e2e"
        if entry.get("steady_rows_per_second"):
            line += f" {entry['steady_rows_per_second']:>10,.0f} steady, start-up {entry['startup_seconds']:.2f}s"
        if entry.get("cpu_seconds_per_million_rows"):
            line += f", {entry['cpu_seconds_per_million_rows']:.1f} CPU-s/M rows"
        for baseline, ratio in (entry.get("ratios") or {}).items():
            line += f" | vs {baseline}: {ratio['end_to_end']:.2f}x e2e {ratio['steady']:.2f}x steady"
        log(line)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
