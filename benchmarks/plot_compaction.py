"""Draw the compaction benchmark's result as one PNG.

    .venv/bin/python -m benchmarks.plot_compaction [benchmarks/results/compaction.json] [--out docs/benchmarks/compaction.png]

Three panels: files of the table after each CDC checkpoint without and with compaction; the read
time of a full scan (``count(*)`` and full materialisation) with DuckDB and Iceberg Java, log scale;
and the seconds of each compaction run, iceberg_sink vs Iceberg Java ``rewrite_data_files``, with
their throughput.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PLAIN_COLOR = "#c44e52"
COMPACTED_COLOR = "#4c72b0"
OURS_COLOR = "#4c72b0"
JAVA_COLOR = "#dd8452"
JAVA_LIGHT_COLOR = "#f3c19b"


def _label_bars(ax: Any, bars: Any, fmt: str) -> None:
    for bar in bars:
        height = bar.get_height()
        ax.annotate(
            fmt.format(height),
            (bar.get_x() + bar.get_width() / 2, height),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
        )


def plot(result: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b, params = result["part_a"], result["part_b"], result["parameters"]
    fig, (files_ax, read_ax, compact_ax) = plt.subplots(1, 3, figsize=(16, 5.2), width_ratios=[1, 1.3, 1.4])
    width = 0.38

    # 1. files after each checkpoint (or, for results without the series, after the last one)
    series = {name: a[name].get("files_after_checkpoint") for name in ("plain", "compacted")}
    if all(series.values()):
        for name, color, label in (
            ("plain", PLAIN_COLOR, "no compaction"),
            ("compacted", COMPACTED_COLOR, f"compaction every {params['compact_every']} checkpoints"),
        ):
            counts = series[name]
            xs = list(range(1, len(counts) + 1))
            files_ax.plot(xs, [c[0] for c in counts], color=color, label=f"data files, {label}")
            files_ax.plot(xs, [c[1] for c in counts], color=color, linestyle="--", label=f"delete files, {label}")
            for value, dy in zip(counts[-1], (5, -5), strict=True):
                files_ax.annotate(
                    str(value), (xs[-1], value), xytext=(3, dy), textcoords="offset points", fontsize=8, va="center"
                )
        files_ax.set_xlabel("checkpoint")
        from matplotlib.ticker import MaxNLocator

        files_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        kinds = [("data files", "total-data-files"), ("delete files", "total-delete-files")]
        xs = list(range(len(kinds)))
        for offset, name, color, label in (
            (-width / 2, "plain", PLAIN_COLOR, "no compaction"),
            (width / 2, "compacted", COMPACTED_COLOR, f"compaction every {params['compact_every']} checkpoints"),
        ):
            values = [a[name]["summary"][key] for _, key in kinds]
            bars = files_ax.bar([x + offset for x in xs], values, width, color=color, label=label)
            _label_bars(files_ax, bars, "{:.0f}")
        files_ax.set_xticks(xs, [k for k, _ in kinds])
    files_ax.set_ylabel("files in the current snapshot")
    files_ax.set_title(f"Files over {params['checkpoints']} CDC checkpoints")
    files_ax.legend(fontsize=7, loc="upper left")
    files_ax.margins(y=0.15)

    # 2. read times
    reads = [
        ("DuckDB\ncount(*)", "duckdb_count"),
        ("DuckDB\nfull scan", "duckdb_full"),
        ("Iceberg Java\ncount(*)", "java_count"),
        ("Iceberg Java\nfull scan", "java_full"),
    ]
    xs = list(range(len(reads)))
    for offset, name, color, label in (
        (-width / 2, "plain", PLAIN_COLOR, "no compaction"),
        (width / 2, "compacted", COMPACTED_COLOR, "with compaction"),
    ):
        values = [a[name]["read"][key]["median"] for _, key in reads]
        bars = read_ax.bar([x + offset for x in xs], values, width, color=color, label=label)
        _label_bars(read_ax, bars, "{:.2f}s")
    read_ax.set_yscale("log")
    read_ax.set_xticks(xs, [r for r, _ in reads])
    read_ax.set_ylabel(f"seconds (median of {params['read_runs']}, log scale)")
    read_ax.set_title("Full-table read time")
    read_ax.legend(fontsize=8, loc="upper right")
    read_ax.margins(y=0.2)

    # 3. compaction runs (the warm-up runs are in the JSON and the doc's table, not here)
    labels, values, colors, hatches, rates = [], [], [], [], []
    for key, color, hatch in (
        ("iceberg_sink", OURS_COLOR, ""),
        ("iceberg_java", JAVA_COLOR, ""),
        ("iceberg_java_keep_dangling", JAVA_LIGHT_COLOR, "//"),
    ):
        for i, run in enumerate(b.get(key, []), start=1):
            labels.append(f"run {i}")
            values.append(run["seconds"])
            colors.append(color)
            hatches.append(hatch)
            rates.append(run["mb_per_s"])
    bars = compact_ax.bar(range(len(values)), values, 0.6, color=colors)
    for bar, hatch in zip(bars, hatches, strict=True):
        bar.set_hatch(hatch)
    for bar, seconds, rate in zip(bars, values, rates, strict=True):
        compact_ax.annotate(
            f"{seconds:.2f}s\n{rate:.2g} MB/s",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    compact_ax.set_xticks(range(len(values)), labels, fontsize=8)
    from matplotlib.patches import Patch

    compact_ax.legend(
        handles=[
            Patch(color=OURS_COLOR, label="iceberg_sink sink.compact (PySpark 4)"),
            Patch(color=JAVA_COLOR, label="Iceberg Java rewrite_data_files (Spark 3.5)"),
            Patch(facecolor=JAVA_LIGHT_COLOR, hatch="//", label="  same, keeping dangling delete files"),
        ],
        fontsize=7,
        loc="upper left",
    )
    compact_ax.set_ylabel("seconds")
    inp = b["input"]
    compact_ax.set_title(
        f"Compacting the same table, after a warm-up run each\n({inp['data_files']} data + {inp['delete_files']} delete files, "
        f"{(inp['data_bytes'] + inp['delete_bytes']) / 1e6:.1f} MB)",
        fontsize=10,
    )
    compact_ax.margins(y=0.3)

    fig.suptitle(
        f"iceberg_sink compaction benchmark: {params['checkpoints']} checkpoints x "
        f"{params['changes_per_checkpoint']} upserts on {params['keys']} initial keys, bucket(4, id), local[{params['cores']}]",
        fontsize=11,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f}"


def markdown(result: dict[str, Any]) -> str:
    """The results tables of docs/benchmarks-compaction.md, from the JSON result."""
    a, b = result["part_a"], result["part_b"]
    lines = [
        "| table | data files | delete files | equality-delete rows | snapshots | write s (total) "
        "| of which compaction s | median checkpoint s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    every = result["parameters"]["compact_every"]
    for name, label in (("plain", "no compaction"), ("compacted", f"compaction every {every} checkpoints")):
        t = a[name]
        s = t["summary"]
        lines.append(
            f"| {label} | {s['total-data-files']} | {s['total-delete-files']} | {s['total-equality-deletes']} "
            f"| {t['snapshots']} | {t['write_seconds_total']:.1f} | {t['compaction_seconds_total']:.1f} "
            f"| {t['checkpoint_seconds_median']:.2f} |"
        )
    lines += [
        "",
        "| read (median s, runs) | no compaction | with compaction | ratio |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("duckdb_count", "DuckDB `count(*)`"),
        ("duckdb_full", "DuckDB full scan to Arrow"),
        ("java_count", "Iceberg Java `count(*)`"),
        ("java_full", "Iceberg Java full scan to Arrow"),
    ):
        plain, compacted = a["plain"]["read"][key], a["compacted"]["read"][key]

        def cell(r: dict[str, Any]) -> str:
            return f"{r['median']:.3f} ({', '.join(f'{x:.3f}' for x in r['runs'])})"

        lines.append(f"| {label} | {cell(plain)} | {cell(compacted)} | {plain['median'] / compacted['median']:.0f}x |")
    inp = b["input"]
    lines += [
        "",
        "| compactor | run | seconds | MB/s | input rows/s | output data files | output MB | output rows "
        "| delete files left | same content |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    groups = (
        ("iceberg_sink_warmup", "iceberg_sink `sink.compact`", "warm-up"),
        ("iceberg_sink", "iceberg_sink `sink.compact`", ""),
        ("iceberg_java_warmup", "Iceberg Java `rewrite_data_files`", "warm-up"),
        ("iceberg_java", "Iceberg Java `rewrite_data_files`", ""),
        ("iceberg_java_keep_dangling", "Iceberg Java, `remove-dangling-deletes=false`", ""),
    )
    for key, label, tag in groups:
        found = b.get(key, [])
        for i, run in enumerate(found if isinstance(found, list) else [found], start=1):
            out = run["output"]
            lines.append(
                f"| {label} | {tag or i} | {run['seconds']:.2f} | {run['mb_per_s']:.2f} | {run['input_rows_per_s']:.0f} "
                f"| {out['data_files']} | {_mb(out['data_bytes'])} | {out['data_records']} | {out['delete_files']} "
                f"| {'yes' if run['same_content'] else '**NO**'} |"
            )
    lines += [
        "",
        f"Input of every compaction run: {inp['data_files']} data files ({_mb(inp['data_bytes'])} MB, "
        f"{inp['data_records']} rows) and {inp['delete_files']} equality-delete files ({_mb(inp['delete_bytes'])} MB, "
        f"{inp['delete_records']} rows); {inp['summary']['total-records']} records in the snapshot summary (live and deleted).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("result", nargs="?", type=Path, default=PROJECT_ROOT / "benchmarks/results/compaction.json")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs/benchmarks/compaction.png")
    parser.add_argument("--markdown", action="store_true", help="print the results tables as Markdown too")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.result.read_text(encoding="utf-8"))))
    plot(json.loads(args.result.read_text(encoding="utf-8")), args.out)
    print(args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
