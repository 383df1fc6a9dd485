"""Plot the append benchmark: rows/s of every system, unpartitioned and partitioned, with each run.

    .venv/bin/python -m benchmarks.plot_append [benchmarks/results/append.json] [--out docs/benchmarks/append.png]

Needs matplotlib (the ``bench`` extra). The bar is the median the page reports; the dots are the
individual runs (rounds), so a disturbed run shows as a dot far from its bar.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

LAYOUTS = ("unpartitioned", "partitioned")
SYSTEMS = (
    ("iceberg_java-3.5", "Iceberg Java\nSpark 3.5"),
    ("iceberg_sink-3.5", "iceberg_sink\nSpark 3.5"),
    ("iceberg_sink-4", "iceberg_sink\nSpark 4.3"),
    ("iceberg_sink_jvm-3.5", "sink, Spark writer\nSpark 3.5"),
    ("iceberg_sink_jvm-4", "sink, Spark writer\nSpark 4.3"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("result", nargs="?", default="benchmarks/results/append.json")
    parser.add_argument("--out", default="docs/benchmarks/append.png")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems: dict[str, Any] = json.loads(Path(args.result).read_text())["systems"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, layout in zip(axes, LAYOUTS, strict=True):
        labels, medians, runs = [], [], []
        for key, label in SYSTEMS:
            entry = systems.get(f"{key}/{layout}")
            if entry is None:
                continue
            labels.append(label)
            medians.append(entry["rows_per_second"] / 1000)
            runs.append([r["rows_per_second"] / 1000 for r in entry["runs"]])
        xs = range(len(labels))
        colors = ["#888888" if "Java" in label else "#1f77b4" for label in labels]
        ax.bar(xs, medians, color=colors)
        for x, values in zip(xs, runs, strict=True):
            ax.scatter([x] * len(values), values, color="black", s=12, zorder=3)
        for name, style in (("ceiling-3.5", "--"), ("ceiling-4", ":")):
            if layout == "unpartitioned" and name in systems:
                ceiling = systems[name]["rows_per_second"] / 1000
                ax.axhline(ceiling, linestyle=style, color="red", linewidth=1, label=f"{name} (noop sink)")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_title(layout if layout == "unpartitioned" else "partitioned by day(ts), bucket(16, user_id)")
        ax.set_ylabel("thousand rows/s")
        if layout == "unpartitioned":
            ax.legend(fontsize=8, loc="upper right")
    fig.suptitle("Append: 2,000,000 events in 8 micro-batches, local[2] (bar: median, dots: runs)")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
