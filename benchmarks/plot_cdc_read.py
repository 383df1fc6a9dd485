"""Plot a CDC read-cost run (``benchmarks.cdc --scan-every K``): write latency per batch and full-scan
time at every scan point, for the sink and for MERGE INTO, and print the markdown table.

    .venv/bin/python -m benchmarks.plot_cdc_read benchmarks/results/cdc-read-10m.json \
        [--out docs/benchmarks/cdc_read.png] [--markdown]

Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def markdown(result: dict[str, Any]) -> str:
    points = result["systems"]["iceberg_sink"]["scan_points"]
    rows = [
        "| after batch | sink scan s | MERGE scan s | ratio | sink data files | sink delete files "
        "| equality deletes | position deletes |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        merge = p["merge_scan_seconds"]
        ratio = p["ratio"]
        rows.append(
            f"| {p['batch']} | {p['sink_scan_seconds']:.2f} | {'-' if merge is None else f'{merge:.2f}'} "
            f"| {'-' if ratio is None else f'{ratio:.2f}'} | {p['sink_data_files']} | {p['sink_delete_files']} "
            f"| {p['sink_equality_deletes']:,} | {p['sink_position_deletes']:,} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("result")
    parser.add_argument("--out", default="docs/benchmarks/cdc_read.png")
    parser.add_argument("--markdown", action="store_true", help="also print the scan-point table")
    args = parser.parse_args()
    result = json.loads(Path(args.result).read_text())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = result["systems"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, label in (("iceberg_sink", "iceberg_sink (+ conversion)"), ("merge_into", "MERGE INTO")):
        if name in systems:
            seconds = systems[name]["batch_seconds"]
            left.plot(range(1, len(seconds) + 1), seconds, marker=".", linewidth=0.8, label=label)
    left.axhline(0.45, color="red", linestyle="--", linewidth=1, label="target 0.45 s")
    left.set_xlabel("batch")
    left.set_ylabel("seconds per 10k-change batch")
    left.set_yscale("log")
    left.legend(fontsize=8)
    left.set_title("write latency")

    points = systems["iceberg_sink"]["scan_points"]
    batches = [p["batch"] for p in points]
    right.plot(batches, [p["sink_scan_seconds"] for p in points], marker="o", label="iceberg_sink table")
    right.plot(
        batches, [p["merge_scan_seconds"] for p in points], marker="s", label="MERGE-on-read table (Iceberg Java)"
    )
    for p in points:
        if p["ratio"] is not None:
            right.annotate(f"{p['ratio']:.2f}x", (p["batch"], p["sink_scan_seconds"]), fontsize=7)
    right.set_xlabel("after batch")
    right.set_ylabel("full scan seconds (Iceberg Java)")
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    right.set_title("read cost (ratio = sink / MERGE)")
    rows = result.get("config", {}).get("rows")
    fig.suptitle(f"CDC read cost{f' at {rows:,} rows' if rows else ''}")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)
    if args.markdown:
        print(markdown(result))


if __name__ == "__main__":
    main()
