"""Where a benchmark's CPU goes, by process and by JVM thread: /proc sampled once a second.

    .venv/bin/python -m benchmarks.thread_cpu record SAMPLES --seconds 600 &   # beside a run
    .venv/bin/python -m benchmarks.thread_cpu summarize SAMPLES --result cdc.json [--system iceberg_sink_kafka]
        [--window 15] [--skip-entries 2]

``record`` writes one line per Java or Python process (itself left out) and per thread of each
Spark or Flink JVM every second: the time, the id, its CPU ticks (user + system) so far, what it is and its name.
``summarize`` prints JSON: over a system's stream (its ``batch_intervals`` in a ``benchmarks.cdc``
result, the first ``--skip-entries`` left out), the CPU seconds of each kind of process and of each
JVM thread kind (digits folded: ``C2 CompilerThre``, ``Executor task l``, ``stream execution``...),
the same for each ``--window`` seconds of it (how long the JIT compiler keeps working), and the
changes of the stream per CPU second. Nothing here changes what is measured: it only reads /proc.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _kind(cmdline: str) -> str | None:
    head = cmdline[:200]
    if "java" not in head and "python" not in head:
        return None
    if "SparkSubmit" in cmdline:
        return "spark"
    if "flink" in cmdline.lower() and "java" in head:
        return "flink"
    if "kafka" in cmdline.lower() and "java" in head:
        return "kafka"
    if "pyspark.daemon" in cmdline:
        return "python-worker"
    return "python" if "python" in head else "java"


def _ticks(stat: str) -> tuple[str, int]:
    """(name, utime + stime) of a /proc stat line (the name may hold spaces and parentheses)."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    return name, int(fields[11]) + int(fields[12])


def record(out: Path, seconds: float) -> None:
    started = time.time()
    with out.open("w") as sink:
        while time.time() - started < seconds:
            now = time.time()
            for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
                    kind = _kind(cmdline)
                    if kind is None:
                        continue
                    _, ticks = _ticks(Path(f"/proc/{pid}/stat").read_text())
                    sink.write(f"{now:.2f}\tP{pid}\t{ticks}\t{kind}\t{cmdline[:80]}\n")
                    if kind in ("spark", "flink"):
                        for tid in os.listdir(f"/proc/{pid}/task"):
                            name, ticks = _ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
                            sink.write(f"{now:.2f}\tT{tid}\t{ticks}\t{kind}-thread\t{name}\n")
                except (OSError, ValueError, IndexError):
                    continue  # the process or thread ended between the listing and the read
            sink.flush()
            time.sleep(max(0.0, 1.0 - (time.time() - now)))


def _series(samples: Path) -> dict[str, list[tuple[float, int, str, str]]]:
    series: dict[str, list[tuple[float, int, str, str]]] = collections.defaultdict(list)
    for line in samples.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 5:
            series[parts[1]].append((float(parts[0]), int(parts[2]), parts[3], parts[4]))
    return series


def _used(
    series: dict[str, list[tuple[float, int, str, str]]], start: float, end: float
) -> dict[str, dict[str, float]]:
    """CPU seconds between ``start`` and ``end``: per process kind and per JVM thread kind."""
    processes: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    for key, points in series.items():
        inside = [p for p in points if start <= p[0] <= end]
        if len(inside) < 2:
            continue
        used = (inside[-1][1] - inside[0][1]) / TICKS
        kind, name = inside[-1][2], inside[-1][3]
        if key.startswith("T"):
            threads[f"{kind.removesuffix('-thread')}: {re.sub(r'[0-9]+', '#', name)}"] += used
        else:
            processes[kind] += used
    return {
        "processes": {k: round(v, 2) for k, v in processes.most_common()},
        "threads": {k: round(v, 2) for k, v in threads.most_common() if v >= 0.01},
    }


def summarize(samples: Path, result: dict[str, Any], system: str, window: float, skip: int) -> dict[str, Any]:
    raw = result["systems"][system]
    intervals = raw["batch_intervals"][skip:]
    changes = sum((raw.get("micro_batch_changes") or raw.get("batch_changes") or [])[skip:]) or None
    start, end = intervals[0][0], intervals[-1][1]
    series = _series(samples)
    whole = _used(series, start, end)
    cpu = sum(whole["processes"].values())
    windows = []
    at = start
    while at + window <= end:
        windows.append({"from_seconds": round(at - start, 1), **_used(series, at, at + window)})
        at += window
    return {
        "system": system,
        "seconds": round(end - start, 2),
        "entries": len(intervals),
        "changes": changes,
        "cpu_seconds": round(cpu, 2),
        "cpu_seconds_per_million_changes": round(cpu / changes * 1e6, 2) if changes else None,
        "cores_busy": round(cpu / (end - start), 2),
        **whole,
        "windows": windows,
        "note": "processes sampled once a second: a process or thread that lived less than two samples is left out",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.thread_cpu", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("samples", type=Path)
    rec.add_argument("--seconds", type=float, default=600.0)
    summ = commands.add_parser("summarize")
    summ.add_argument("samples", type=Path)
    summ.add_argument("--result", type=Path, required=True, help="a benchmarks.cdc result JSON")
    summ.add_argument("--system", default="iceberg_sink_kafka")
    summ.add_argument("--window", type=float, default=15.0)
    summ.add_argument("--skip-entries", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.samples, args.seconds)
        return 0
    result = json.loads(args.result.read_text())
    print(json.dumps(summarize(args.samples, result, args.system, args.window, args.skip_entries), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
