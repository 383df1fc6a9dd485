"""Plot the append benchmark: end-to-end and steady-state rows/s of every system on every shape.

    .venv/bin/python -m benchmarks.plot_append [benchmarks/results/append.json] [--out docs/benchmarks/append.png]

Needs matplotlib (the ``bench`` extra). One panel per shape (partitioning x row groups per file);
per system a solid bar (end to end, from the start call) and a hatched bar (steady state, batches
2..N), both medians; the dots are the individual runs (rounds), so a disturbed run shows as a dot
far from its bar.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SYSTEMS = (
    ("iceberg_java-3.5", "Iceberg Java 1.9.2\nSpark 3.5"),
    ("iceberg_java-4.1", "Iceberg Java newest\nSpark 4.1"),
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

    data: dict[str, Any] = json.loads(Path(args.result).read_text())
    systems: dict[str, Any] = data["systems"]
    shapes = sorted({e["shape"] for e in systems.values() if not e["name"].startswith("ceiling")})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4.8), sharey=True, squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        labels, entries = [], []
        for key, label in SYSTEMS:
            entry = systems.get(f"{key}/{shape}")
            if entry is not None:
                labels.append(label)
                entries.append(entry)
        xs = list(range(len(labels)))
        for offset, figure, hatch in ((-0.2, "rows_per_second", None), (0.2, "steady_rows_per_second", "//")):
            values = [(e.get(figure) or 0) / 1000 for e in entries]
            colors = ["#888888" if "Java" in label else "#1f77b4" for label in labels]
            ax.bar([x + offset for x in xs], values, width=0.4, color=colors, hatch=hatch, edgecolor="white")
            for x, e in zip(xs, entries, strict=True):
                runs = [(r.get(figure) or 0) / 1000 for r in e["runs"]]
                ax.scatter([x + offset] * len(runs), runs, color="black", s=10, zorder=3)
        groups = shape.split("/")[1]
        ceiling = systems.get(f"ceiling-4/unpartitioned/{groups}")
        if ceiling is not None and shape.startswith("unpartitioned"):
            ax.axhline(
                ceiling["rows_per_second"] / 1000, linestyle=":", color="red", linewidth=1, label="ceiling (noop), e2e"
            )
            ax.legend(fontsize=8, loc="upper right")
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_title(f"{shape} (solid: end to end, hatched: steady)", fontsize=9)
        ax.set_ylabel("thousand rows/s")
    config = data["config"]
    fig.suptitle(
        f"Append: {config['rows']:,} events in {config['batches']} micro-batches, local[{config['cores']}] "
        "(bars: medians, dots: runs)"
    )
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
