"""Plot a soak run (``benchmarks.soak``) as one PNG over the run's minutes, and print its markdown tables.

    python -m benchmarks.plot_soak [benchmarks/results/soak.json] [--out docs/benchmarks/soak.png] [--markdown]

Five panels sharing the time axis: committed changes per second over the last minute of commits (and
the rate source's rate); commit latency of every commit (and a rolling median of 10) with the compactions
marked; resident memory of the driver's Python, its JVM and the Python workers; the table's live
data and delete files, snapshots and files under its data folder; and the CPU other processes used
per interval (the machine is shared; above the dashed line an interval counts as disturbed).

Needs matplotlib, which is not in the project's venv: a throwaway venv does, e.g.
``python3 -m venv /tmp/plot-venv && /tmp/plot-venv/bin/pip install matplotlib`` and then
``PYTHONPATH=. /tmp/plot-venv/bin/python -m benchmarks.plot_soak``. ``--markdown`` alone needs nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
MEMORY = {
    "driver_python": ("driver Python", "#4c72b0"),
    "driver_jvm": ("driver JVM (runs the executors)", "#c44e52"),
    "python_workers_sum": ("Python workers, sum", "#55a868"),
    "python_worker_max": ("largest Python worker", "#8172b2"),
    "python_daemon": ("PySpark daemon", "#937860"),
}


def rolling_median(values: list[float], width: int) -> list[float]:
    return [statistics.median(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def compaction_times(samples: list[dict[str, Any]]) -> list[float]:
    """Minutes at which the sampled count of succeeded compactions went up."""
    out, seen = [], 0
    for s in samples:
        done = s.get("sink", {}).get("compactions_succeeded", 0)
        if done > seen:
            out.append(s["t"] / 60)
            seen = done
    return out


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    commits = result["commits"]
    params = result["parameters"]
    minutes = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(13, 17), sharex=True)
    thr, lat, mem, files, cpu = axes

    # Committed changes per second over the last minute of commits (samples see 0 or 2 commits per interval).
    window = []
    for i, c in enumerate(commits):
        j = next(k for k in range(i + 1) if commits[k]["t"] >= c["t"] - 60)
        if i > j:
            span = c["t"] - commits[j]["t"]
            window.append((c["t"] / 60, (c["end_value"] - commits[j]["end_value"]) / span))
    thr.plot([m for m, _ in window], [v for _, v in window], color="#4c72b0", label="committed changes/s, last 60 s")
    thr.axhline(params["rows_per_second"], color="black", linestyle="--", linewidth=1, label="rate source rows/s")
    # The first window holds the catch-up batch of the start-up (the source ran while Spark started).
    thr.set(ylabel="changes / s", title="throughput (first minute clipped: start-up catch-up)")
    thr.set_ylim(0, params["rows_per_second"] * 2)

    cm = [c["t"] / 60 for c in commits]
    ms = [c["commit_ms"] for c in commits]
    lat.plot(cm, ms, ".", color="#c44e52", alpha=0.35, markersize=3, label="commit latency, each commit")
    lat.plot(cm, rolling_median(ms, 10), color="#c44e52", label="rolling median of 10 commits")
    fresh = [c.get("freshness_s") for c in commits]
    if all(f is not None for f in fresh):
        twin = lat.twinx()
        twin.plot(cm, fresh, color="#dd8452", linewidth=0.8, alpha=0.7, label="freshness (s, right)")
        twin.set_ylabel("freshness s (newest change's age at commit)")
        twin.legend(loc="upper right", fontsize=8)
    for i, m in enumerate(compaction_times(samples)):
        lat.axvline(m, color="gray", alpha=0.3, linewidth=0.8, label="compaction done" if i == 0 else None)
    lat.set(ylabel="ms", title="commit latency (sink's last_commit_duration_ms)", yscale="log")

    for key, (label, color) in MEMORY.items():
        mem.plot(minutes, [s["rss_bytes"][key] / MIB for s in samples], color=color, label=label)
    mem.set(ylabel="MiB (VmRSS)", title=f"resident memory (spark.driver.memory={params['driver_memory']})")

    with_table = [s for s in samples if "table" in s]
    tm = [s["t"] / 60 for s in with_table]
    for key, label, color, style in (
        ("data_files", "live data files", "#4c72b0", "-"),
        ("delete_files", "live delete files", "#c44e52", "-"),
        ("snapshots", "snapshots", "#55a868", "-"),
        ("files_under_data", "files under data/ (incl. not yet expired)", "#937860", "--"),
    ):
        files.plot(tm, [s["table"][key] for s in with_table], color=color, linestyle=style, label=label)
    files.set(ylabel="count", title="table files (table metadata) and snapshots")

    fm = [(s["t"] / 60, s["foreign_cores"]) for s in samples if s.get("foreign_cores") is not None]
    cpu.fill_between([m for m, _ in fm], [v for _, v in fm], step="mid", color="#8c8c8c", alpha=0.6)
    threshold = result["summary"]["foreign_cpu"]["disturbed_threshold_cores"]
    cpu.axhline(threshold, color="black", linestyle="--", linewidth=1, label=f"disturbed above {threshold} cores")
    cpu.set(ylabel="cores", xlabel="minutes since start", title="CPU used by other processes (machine shared)")
    cpu.set_ylim(0, max(2.0, max((v for _, v in fm), default=0) * 1.1))

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"soak: {params['minutes']:g} min, rate {params['rows_per_second']} rows/s over {params['keys']:,} keys, "
        f"trigger {params['trigger_seconds']:g} s, compaction every {params['compact_every']} commits, "
        f"conversion every {params['convert_every']} (0: off), expiry every {params['expire_every']}"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    t = s["throughput"]
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| run | {s['run_seconds'] / 60:.1f} min, {t['commits']} commits, {t['batches']} micro-batches |",
        f"| changes committed | {t['changes_committed']:,} |",
        f"| throughput | {t['changes_per_second_overall']:,.0f} changes/s overall, "
        f"{t['changes_per_second_after_warmup']:,.0f} after the warm-up (source: {t['target_rows_per_second']:,}/s) |",
        f"| behind the source at stop | {t['lag_changes_at_stop']:,} changes |",
    ]
    for key, label in (
        ("commit_latency_ms", "commit latency ms"),
        ("batch_trigger_ms", "micro-batch ms (Spark's triggerExecution)"),
        ("freshness_seconds", "freshness s (age of a commit's newest change)"),
        ("batch_input_rows", "changes per micro-batch"),
    ):
        v = s[key]
        if v.get("count"):
            lines.append(
                f"| {label}: p50 / p90 / p99 / max | {v['p50']:,.0f} / {v['p90']:,.0f} / {v['p99']:,.0f} / "
                f"{v['max']:,.0f} |"
                if key != "freshness_seconds"
                else f"| {label}: p50 / p90 / p99 / max | {v['p50']:.1f} / {v['p90']:.1f} / {v['p99']:.1f} / "
                f"{v['max']:.1f} |"
            )
    m = s["maintenance"]
    lines += [
        f"| compactions (succeeded / triggered / failed) | {m['compactions_succeeded']} / "
        f"{m['compactions_triggered']} / {m['compactions_failed']}; {m['compaction_rewritten_files']} files "
        f"rewritten, {m['compaction_removed_delete_files']} delete files removed |",
        # Runs before these counters existed counted a compaction that rewrote nothing as succeeded.
        *(
            [
                f"| compactions that rewrote nothing (every group dropped) / groups dropped / plans made again | "
                f"{m['compactions_noop']} / {m['compaction_dropped_groups']} / {m['compaction_replans']} |"
            ]
            if "compactions_noop" in m
            else []
        ),
        f"| equality-delete conversions (succeeded / failed) | {m['conversions_succeeded']} / "
        f"{m['conversions_failed']} |",
        f"| snapshot expiries | {m['expiries']}: {m['expired_snapshots']} snapshots, "
        f"{m['expiry_deleted_files']} files deleted, {m['expiry_errors']} errors |",
    ]
    f = s["foreign_cpu"]
    lines.append(
        f"| other processes' CPU | mean {f['mean_cores']} cores, max {f['max_cores']}; "
        f"{f['disturbed_intervals']} of {f['intervals']} intervals above {f['disturbed_threshold_cores']} |"
    )
    c = result["checks"]
    readers = [r for r in ("duckdb", "iceberg_java") if r in c]
    lines.append(
        f"| read back ({', '.join(readers)}) | model {c['model_rows']:,} rows after {c['changes']:,} changes: "
        + ", ".join(f"{r} {c[r]['rows']:,} rows, {'matches' if c[r]['matches_model'] else 'DIFFERS'}" for r in readers)
        + f"; ok = {result['ok']} |"
    )

    mem = [
        "",
        "| process (VmRSS, MiB) | after first commit | after warm-up | end | max | slope after warm-up, MiB/h "
        "| slope over 2nd half, MiB/h |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, (label, _) in MEMORY.items():
        v = s["memory"].get(key)
        if v:
            mem.append(
                f"| {label} | {v['start_mib']:.0f} | {v['after_warmup_mib']:.0f} | {v['end_mib']:.0f} "
                f"| {v['max_mib']:.0f} | {v['slope_mib_per_hour_after_warmup']} | {v['slope_mib_per_hour_second_half']} |"
            )
    fl = [
        "",
        "| table (from metadata) | start | end | max | mean |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("data_files", "live data files"),
        ("delete_files", "live delete files"),
        ("equality_deletes", "live equality-delete rows"),
        ("position_deletes", "live position-delete rows"),
        ("records", "records in live data files"),
        ("snapshots", "snapshots"),
        ("metadata_json_bytes", "metadata.json bytes"),
        ("files_under_data", "files under data/"),
        ("files_under_metadata", "files under metadata/"),
    ):
        v = s["files"].get(key)
        if v:
            fl.append(f"| {label} | {v['start']:,} | {v['end']:,} | {v['max']:,} | {v['mean']:,} |")
    return "\n".join(lines + mem + fl) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", nargs="?", default=str(PROJECT_ROOT / "benchmarks" / "results" / "soak.json"))
    parser.add_argument("--out", default=str(PROJECT_ROOT / "docs" / "benchmarks" / "soak.png"))
    parser.add_argument("--markdown", action="store_true", help="print the results tables and do not plot")
    args = parser.parse_args(argv)
    result = json.loads(Path(args.result).read_text(encoding="utf-8"))
    if args.markdown:
        print(markdown(result), end="")
        return
    plot(result, Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
