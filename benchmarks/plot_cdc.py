"""Plot per-batch upsert latency from one or more ``benchmarks.cdc`` results (needs matplotlib).

    .venv/bin/pip install matplotlib
    .venv/bin/python -m benchmarks.plot_cdc benchmarks/results/cdc.json [more.json ...] \\
        [--out docs/benchmarks/cdc_latency.png]

One panel per result file (two columns when there are several): seconds per batch against the batch number (the table's row count
before the batch on the top axis) for each system, the warm-up batches shaded, the steady-state
median as a dashed line. A batch during which other processes used more than
``--busy-threshold`` CPU seconds per second is drawn hollow and flagged in the legend.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = PROJECT_ROOT / "docs" / "benchmarks" / "cdc_latency.png"
STYLE = {
    "iceberg_sink": {"label": "iceberg_sink upsert (Spark 4.3)", "color": "#1f77b4", "marker": "o"},
    "merge_into": {
        "label": "foreachBatch + MERGE INTO, MoR (Spark 3.5, Iceberg Java)",
        "color": "#d62728",
        "marker": "s",
    },
}

NEW_KEYS_TEXT = {
    "above": "above the highest id (auto-increment): iceberg_sink skips their equality deletes",
    "within": "inside the existing id range: iceberg_sink writes an equality delete for every key",
}


def _rows_label(rows: float) -> str:
    return f"{rows / 1e6:.2f}M" if rows >= 1e6 else f"{rows / 1e3:.0f}k"


def plot_panel(ax: Any, result: dict[str, Any], busy_threshold: float) -> None:
    from matplotlib.ticker import MaxNLocator

    config = result["config"]
    batches = config["batches"]
    warmup = config["warmup"]
    x = list(range(1, batches + 1))
    if warmup:
        ax.axvspan(0.5, warmup + 0.5, color="0.92", zorder=0)
        ax.text(0.6, 0.02, "warm-up", transform=ax.get_xaxis_transform(), va="bottom", fontsize=8, color="0.4")
    flagged = False
    for name, system in result["systems"].items():
        style = STYLE.get(name, {"label": name, "color": "0.3", "marker": "^"})
        seconds = system["batch_seconds"]
        steady = system["steady_state"]
        label = f"{style['label']}: median {steady['median']:.2f}s, p90 {steady['p90']:.2f}s"
        ax.plot(x, seconds, color=style["color"], marker=style["marker"], markersize=4, linewidth=1.5, label=label)
        ax.axhline(steady["median"], color=style["color"], linestyle="--", linewidth=0.8, alpha=0.7)
        busy = [
            (i, s)
            for i, (s, (start, end), foreign) in enumerate(
                zip(seconds, system["batch_intervals"], system["batch_foreign_cpu_seconds"], strict=True), start=1
            )
            if foreign is not None and foreign / max(end - start, 1e-9) > busy_threshold
        ]
        if busy:
            flagged = True
            ax.scatter(
                [i for i, _ in busy],
                [s for _, s in busy],
                s=70,
                facecolors="white",
                edgecolors=style["color"],
                linewidths=1.5,
                zorder=5,
            )
    if flagged:
        ax.scatter(
            [], [], s=70, facecolors="white", edgecolors="0.3", label=f"other processes busy (> {busy_threshold} cores)"
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0.5, batches + 0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch")
    ax.set_ylabel("seconds per batch (wall)")
    ax.grid(True, alpha=0.3)
    rows = result["rows_before_batch"]
    ticks = sorted({1, batches, *range(1, batches + 1, max(1, batches // 5))})
    top = ax.secondary_xaxis("top")
    top.set_xticks(ticks)
    top.set_xticklabels([_rows_label(rows[t - 1]) for t in ticks], fontsize=8)
    top.set_xlabel("table rows before the batch", fontsize=8)
    new_keys = NEW_KEYS_TEXT.get(config.get("new_keys", "above"), str(config.get("new_keys")))
    ax.set_title(
        f"{_rows_label(config['rows'])} initial rows; batches of {config['batch_size']:,} changes "
        f"({config['updates_per_batch']:,} updates + {config['inserts_per_batch']:,} inserts)\n"
        f"new ids {new_keys}",
        fontsize=10,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, frameon=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot_cdc", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="JSON files written by python -m benchmarks.cdc")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"PNG to write (default {DEFAULT_OUT})")
    parser.add_argument("--busy-threshold", type=float, default=0.25, help="cores used by others to flag a batch")
    args = parser.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_cdc needs matplotlib: .venv/bin/pip install matplotlib", file=sys.stderr)
        return 2
    results = [json.loads(p.read_text(encoding="utf-8")) for p in args.results]
    ncols = 1 if len(results) == 1 else 2
    nrows = (len(results) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(9.5 * ncols, 5.8 * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax, result in zip(flat, results, strict=False):
        plot_panel(ax, result, args.busy_threshold)
    for ax in flat[len(results) :]:
        ax.set_visible(False)
    machine = results[0]["machine"]
    fig.suptitle(
        f"CDC upserts into an Iceberg table: latency per batch ({machine['cpus']} cores, "
        f"{machine['memory_gib']:.0f} GiB, local[{results[0]['config']['cores']}])",
        fontsize=11,
    )
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
