"""Draw the commit-cost benchmark's result as one PNG, and print its markdown table.

    .venv/bin/python -m benchmarks.plot_commits [benchmarks/results/commits.json] [--out docs/benchmarks/commits.png]
                                                [--markdown]

Three panels, one line per configuration: the commit latency of every checkpoint (a rolling median
of 25 checkpoints, and the raw points faintly), the manifests the current snapshot lists, and the
size of the current metadata.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
COLORS = {"merge": "#4c72b0", "no-merge": "#c44e52", "merge+expire": "#55a868", "no-merge+expire": "#dd8452"}


def rolling_median(values: list[float], width: int) -> list[float]:
    return [statistics.median(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat_ax, man_ax, meta_ax) = plt.subplots(1, 3, figsize=(17, 5))
    for name, r in result["results"].items():
        color = COLORS.get(name, "gray")
        ms = r["commit_ms_per_checkpoint"]
        xs = list(range(len(ms)))
        lat_ax.plot(xs, ms, ".", color=color, alpha=0.15, markersize=2)
        lat_ax.plot(xs, rolling_median(ms, 25), color=color, label=name)
        samples = r["samples"]
        cps = [s["checkpoint"] for s in samples]
        man_ax.plot(cps, [s["data_manifests"] + s["delete_manifests"] for s in samples], color=color, label=name)
        meta_ax.plot(cps, [s["metadata_json_bytes"] / 1024 for s in samples], color=color, label=name)
    lat_ax.set(
        title="commit latency (rolling median of 25; dots: each commit)",
        xlabel="checkpoint",
        ylabel="ms",
        yscale="log",
    )
    man_ax.set(title="manifests listed by the current snapshot", xlabel="checkpoint", ylabel="manifests")
    meta_ax.set(title="current metadata.json size", xlabel="checkpoint", ylabel="KiB")
    for ax in (lat_ax, man_ax, meta_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    params = result["parameters"]
    fig.suptitle(
        f"{params['checkpoints']} CDC checkpoints of {params['changes']} changes; expiry every "
        f"{params['expire_every']} checkpoints keeping {params['retain_last']} snapshots"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def _cores(window: dict[str, Any]) -> str:
    value = window.get("foreign_cores_mean")
    return "not measured" if value is None else f"{value:.2f} cores"


def markdown(result: dict[str, Any]) -> str:
    w = result["windows"]
    rows = [
        f"| configuration | p50 ms, checkpoints {w['early'][0]}-{w['early'][1]} | p50 ms, {w['late'][0]}-{w['late'][1]} "
        f"| p50 ratio | p99 ms, {w['early'][0]}-{w['early'][1]} | p99 ms, {w['late'][0]}-{w['late'][1]} | p99 ratio "
        "| p50 / p99 ratio, last 100 vs first 100 | manifests at the end | metadata.json at the end | snapshots at the end "
        "| metadata files at the end | other processes' CPU, early / late window | read back (DuckDB, Java) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["results"].items():
        c = r["commit_latency"]
        last = r["samples"][-1]
        check = r.get("verification", {})
        ok = all(v["matches_model"] for k, v in check.items() if k != "expected_rows")
        rows.append(
            f"| {name} | {c['early']['p50_ms']:.0f} | {c['late']['p50_ms']:.0f} | {c['ratio_p50']:.2f} "
            f"| {c['early']['p99_ms']:.0f} | {c['late']['p99_ms']:.0f} | {c['ratio_p99']:.2f} "
            f"| {c['ratio_p50_100']:.2f} / {c['ratio_p99_100']:.2f} "
            f"| {last['data_manifests']} data + {last['delete_manifests']} delete "
            f"| {last['metadata_json_bytes'] / 1024:.0f} KiB | {last['snapshots']} "
            f"| {last['metadata_json_files']} metadata.json, {last['metadata_folder_files']} files, "
            f"{last['metadata_folder_bytes'] / 2**20:.1f} MiB | {_cores(c['early'])} / {_cores(c['late'])} "
            f"| {'same rows as the model' if ok else 'MISMATCH'} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", nargs="?", default=str(PROJECT_ROOT / "benchmarks" / "results" / "commits.json"))
    parser.add_argument("--out", default=str(PROJECT_ROOT / "docs" / "benchmarks" / "commits.png"))
    parser.add_argument("--markdown", action="store_true", help="print the results table")
    args = parser.parse_args(argv)
    result = json.loads(Path(args.result).read_text(encoding="utf-8"))
    plot(result, Path(args.out))
    if args.markdown:
        sys.stdout.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
