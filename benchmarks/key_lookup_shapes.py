"""The v3 commit's key lookup in the driver's index: file by file (what the index does) against one
sorted key array merged over all files (the shape docs/architecture.md's key index section weighed).

A CDC table of random updates keeps every version of a row in its data file until compaction: after
N changes its files hold the initial rows plus N, and every file has keys in a checkpoint's range.
This script builds ``--files`` files of ``--rows-per-file`` random keys out of ``--key-space`` as the
index holds them (``SortedKeys``: sorted int64 keys and row positions), asks them for
``--wanted`` distinct random keys (a checkpoint's deleted keys, ``WantedKeys``), and times, in one
process, the median of ``--trials`` after a warm-up call (``compaction.timed_runs``):

- ``per_file``: ``SortedKeys.lookup`` of every file (the index's path: a read of each row's key in
  the range from the checkpoint's membership table, or a binary search per key);
- ``merged``: one array of every file's keys (with each row's file and position) sorted once
  (``merge_ms``, not counted in a lookup): two binary searches per wanted key, the matched rows
  gathered and grouped by file, as a per-file answer;
- ``merged_search``: the binary searches alone (the merged shape's lower bound).

Both answers are checked equal. Prints JSON:

    python -m benchmarks.key_lookup_shapes --files 240 --rows-per-file 24000 --out /tmp/shapes.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.compaction import timed_runs
from iceberg_sink.keyindex.keys import SortedKeys, WantedKeys


def per_file(files: list[SortedKeys], wanted: WantedKeys) -> dict[int, np.ndarray]:
    found = {slot: keys.lookup(wanted) for slot, keys in enumerate(files)}
    return {slot: rows for slot, rows in found.items() if len(rows)}


def merged_lookup(keys: np.ndarray, slots: np.ndarray, rows: np.ndarray, wanted: WantedKeys) -> dict[int, np.ndarray]:
    first = np.searchsorted(keys, wanted.keys, "left")
    last = np.searchsorted(keys, wanted.keys, "right")
    counts = last - first
    total = int(counts.sum())
    starts = np.repeat(first - (np.cumsum(counts) - counts), counts)
    indices = starts + np.arange(total)
    combined = np.sort((slots[indices].astype(np.int64) << 32) | rows[indices].astype(np.int64))
    file_of = combined >> 32
    bounds = np.flatnonzero(np.diff(file_of)) + 1
    return {int(part[0] >> 32): part & 0xFFFFFFFF for part in np.split(combined, bounds) if len(part)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=240)
    parser.add_argument("--rows-per-file", type=int, default=24_000)
    parser.add_argument("--key-space", type=int, default=1_000_000)
    parser.add_argument("--wanted", type=int, default=40_000)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    files = []
    for _ in range(args.files):
        values = rng.integers(0, args.key_space, args.rows_per_file)
        order = np.argsort(values, kind="stable").astype(np.uint32)
        files.append(SortedKeys(values[order], order))
    wanted = WantedKeys.of(rng.integers(0, args.key_space, args.wanted))

    started = time.perf_counter()
    keys: np.ndarray = np.concatenate([f.keys for f in files])
    slots: np.ndarray = np.concatenate([np.full(len(f.keys), i, np.int32) for i, f in enumerate(files)])
    orders: list[np.ndarray] = [f.order if f.order is not None else np.arange(len(f.keys)) for f in files]
    rows: np.ndarray = np.concatenate(orders)
    by_key = np.argsort(keys, kind="stable")
    keys, slots, rows = keys[by_key], slots[by_key], rows[by_key]
    merge_ms = (time.perf_counter() - started) * 1e3

    expected, got = per_file(files, wanted), merged_lookup(keys, slots, rows, wanted)
    per_file_ms = timed_runs(lambda: per_file(files, wanted), args.trials)["median"] * 1e3
    merged_ms = timed_runs(lambda: merged_lookup(keys, slots, rows, wanted), args.trials)["median"] * 1e3
    search_ms = (
        timed_runs(
            lambda: (np.searchsorted(keys, wanted.keys, "left"), np.searchsorted(keys, wanted.keys, "right")),
            args.trials,
        )["median"]
        * 1e3
    )
    if expected.keys() != got.keys() or any(not np.array_equal(expected[k], got[k]) for k in expected):
        raise AssertionError("the merged lookup's answer differs from the per-file lookups'")
    result = {
        "benchmark": "key-lookup-shapes",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "rows": len(keys),
        "matched_rows": int(sum(len(v) for v in expected.values())),
        "files_matched": len(expected),
        "membership_table": wanted.table is not None,
        "per_file_ms": per_file_ms,
        "merged_ms": merged_ms,
        "merged_search_ms": search_ms,
        "merge_ms": merge_ms,
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
