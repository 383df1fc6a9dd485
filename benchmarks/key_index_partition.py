"""What one partition of the partitioned key index costs at the size its split keeps it (issue 43):
the per-partition figures a billion-row extrapolation is derived from.

    .venv/bin/python -m benchmarks.key_index_partition [--entries 7812500] [--keys long uuid]
        [--lookup-keys 78 625] [--lookups 20] [--build-rows 4000000] [--out result.json]

A partition splits past ``iceberg-sink.key-index.partition-max-entries`` (8M), so a table of 1B rows
holds 128 partitions of about 7.8M entries each (``--entries``). For each key kind, on the local file
system (the page cache warm: the runs were just written), in this one process:

1. **the partition**: entries of that partition's hash range from 1,000 data files of 1M rows (what a
   1B-row table's files are), written as the runs size-tiered merges leave (about 76 %, 19 % and
   5 % of the entries, and two small runs of the last checkpoints), with the index's own
   ``write_run``;
2. **lookup task** (``partitioned._lookup``, what an executor runs): ``--lookup-keys`` keys of the
   partition (10,000 keys a checkpoint over 128 partitions: 78; over 16: 625), half present and half
   absent, against its runs, ``--lookups`` times with fresh keys; first with the run headers uncached
   (a new executor), then cached;
3. **merge task** (``partitioned._merge``): the partition's runs merged into one, its peak memory
   (the process's maximum resident size grows by it);
4. **build task** (``partitioned._build``): ``--build-rows`` rows of Parquet data files (1M rows
   each) indexed into one run, as a catch-up or a first build does.

Printed as JSON: the seconds of each, the bytes per entry, and the derived figures for 1B rows (the
partitions, the index's bytes, a checkpoint's lookup tasks and a full rebuild in core-seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.types import LongType, NestedField, StringType

from iceberg_sink.keyindex import partitioned, runs
from iceberg_sink.keyindex.manifest import IndexKey, Manifest
from iceberg_sink.keyindex.runs import DIGEST, DTYPES, INT
from iceberg_sink.vocab.files import DataFileMeta, FileContent

FILES = 1_000
ROWS_PER_FILE = 1_000_000
SHARES = (0.76, 0.19, 0.05)  # the runs size-tiered merges leave in a partition (fan-in 4)
SMALL_RUNS = 2  # runs of the last checkpoints, not merged yet
BILLION = 1_000_000_000


def _max_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _partition_runs(
    io: PyArrowFileIO, folder: Path, kind: str, entries: int, bounds: tuple[int, int], seed: int
) -> list[str]:
    """The runs of one partition of ``entries`` entries, hashes uniform in ``bounds``."""
    rng = np.random.default_rng(seed)
    files = [(f"s3://lake/t/data/{i:05d}.parquet", 96 * 1024 * 1024, ROWS_PER_FILE) for i in range(FILES)]
    sizes = [int(entries * s) for s in SHARES] + [entries // (FILES * 100)] * SMALL_RUNS
    paths = []
    for n, size in enumerate(sizes):
        e = np.empty(size, DTYPES[kind])
        e["s"] = rng.integers(bounds[0], bounds[1], size=size, dtype=np.uint64, endpoint=True)
        if kind == DIGEST:
            e["t"] = rng.integers(0, 2**64 - 1, size=size, dtype=np.uint64, endpoint=True)
        e["f"] = rng.integers(0, FILES, size=size, dtype=np.uint32)
        e["p"] = rng.integers(0, ROWS_PER_FILE, size=size, dtype=np.uint32)
        path = str(folder / f"run-{kind}-{n}.run")
        runs.write_run(io, path, kind, runs.sort_entries(e), files, partitioned.DEFAULT_BLOCK)
        paths.append(path)
    return paths


def _wanted(
    io: PyArrowFileIO, paths: list[str], kind: str, count: int, bounds: tuple[int, int], rng: np.random.Generator
) -> np.ndarray:
    """``count`` distinct hashes: half of them entries of the partition's largest run, half absent."""
    header = runs.read_header(io, paths[0])
    blocks = np.unique(rng.integers(0, len(header.firsts), size=count))
    present = runs.read_blocks(io, paths[0], header, blocks)
    present = present[rng.choice(len(present), size=count // 2, replace=False)]
    fields = ["s", "t"] if kind == DIGEST else ["s"]
    out = np.empty(count, np.dtype([(f, "<u8") for f in fields]))
    out[: count // 2]["s"] = present["s"]
    out[count // 2 :]["s"] = rng.integers(bounds[0], bounds[1], size=count - count // 2, dtype=np.uint64)
    if kind == DIGEST:
        out[: count // 2]["t"] = present["t"]
        out[count // 2 :]["t"] = rng.integers(0, 2**63, size=count - count // 2, dtype=np.uint64)
    return runs.distinct_hashes(out)


def _build_files(folder: Path, key: str, rows: int, seed: int) -> list[DataFileMeta]:
    rng = np.random.default_rng(seed)
    metas = []
    for n in range(rows // ROWS_PER_FILE):
        ids = rng.integers(0, 2**62, size=ROWS_PER_FILE, dtype=np.int64)
        if key == "long":
            column = pa.array(ids)
        else:  # UUID strings, as the scale benchmark's keys
            text = [f"{i:016x}{~i & 0xFFFFFFFFFFFFFFFF:016x}" for i in ids.tolist()]
            column = pa.array([f"{t[:8]}-{t[8:12]}-{t[12:16]}-{t[16:20]}-{t[20:]}" for t in text])
        path = folder / f"data-{key}-{n}.parquet"
        pq.write_table(pa.table({"id": column}), path)
        metas.append(
            DataFileMeta(
                content=FileContent.DATA,
                path=str(path),
                spec_id=0,
                partition=(),
                record_count=ROWS_PER_FILE,
                file_size_in_bytes=path.stat().st_size,
            )
        )
    return metas


def measure(key: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    io = PyArrowFileIO()
    kind = INT if key == "long" else DIGEST
    # The partitions a 1B-row index holds: the index's own split rule, applied to a run of 1B entries.
    grown = Manifest.empty(IndexKey((1,), kind, "bench"), partitioned.DEFAULT_PARTITIONS, partitioned.DEFAULT_BLOCK)
    grown = grown.with_runs([runs.RunFile("all", BILLION, 0, 0, 2**64 - 1)], [])
    manifest = partitioned.PartitionedIndex(io, str(folder))._split(grown)
    partitions = manifest.partitions
    bounds = manifest.bounds(partitions // 3)
    rss_before = _max_rss()
    started = time.perf_counter()
    paths = _partition_runs(io, folder, kind, args.entries, bounds, args.seed)
    written = time.perf_counter() - started
    nbytes = sum(os.path.getsize(p) for p in paths)
    entries = sum(runs.read_header(io, p).entries for p in paths)
    rng = np.random.default_rng(args.seed + 1)
    lookups: dict[str, Any] = {}
    for count in args.lookup_keys:
        cold, warm, hits = [], [], []
        for _ in range(args.lookups):
            wanted = _wanted(io, paths, kind, count, bounds, rng)
            runs.HEADERS.clear()
            runs.ENTRIES.clear()
            task = partitioned._Lookup(tuple(paths), tuple(wanted for _ in paths))
            t0 = time.perf_counter()
            found = partitioned._lookup(io, task)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            partitioned._lookup(io, task)
            warm.append(time.perf_counter() - t0)
            hits.append(sum(len(h) for h, _ in found))
        lookups[str(count)] = {
            "headers_uncached_p50_seconds": float(np.median(cold)),
            "headers_cached_p50_seconds": float(np.median(warm)),
            "hits_median": float(np.median(hits)),
        }
    runs.HEADERS.clear()
    runs.ENTRIES.clear()
    keep = frozenset(runs.read_header(io, paths[0]).files)
    merge = partitioned._Merge(
        tuple(paths), bounds[0], bounds[1], keep, kind, str(folder / f"merged-{kind}.run"), partitioned.DEFAULT_BLOCK
    )
    rss_merge = _max_rss()
    t0 = time.perf_counter()
    merged = partitioned._merge(io, merge)
    merge_seconds = time.perf_counter() - t0
    merge_peak = _max_rss() - rss_merge
    for p in [*paths, merged.path]:
        os.remove(p)
    schema = Schema(NestedField(1, "id", LongType() if key == "long" else StringType(), required=True))
    metas = _build_files(folder, key, args.build_rows, args.seed)
    index_key = IndexKey.of(schema, (1,))
    assert index_key is not None and index_key.kind == kind
    build = partitioned._Build(
        tuple(metas),
        schema,
        index_key,
        create_mapping_from_schema(schema),
        str(folder / f"built-{kind}.run"),
        partitioned.DEFAULT_BLOCK,
    )
    t0 = time.perf_counter()
    built = partitioned._build(io, build)
    build_seconds = time.perf_counter() - t0
    for m in metas:
        os.remove(m.path)
    os.remove(built.path)
    per_entry = nbytes / entries
    lookup_78 = lookups[str(args.lookup_keys[0])]
    return {
        "key": key,
        "partition_entries": entries,
        "runs": len(paths),
        "partition_bytes": nbytes,
        "bytes_per_entry": per_entry,
        "write_seconds": written,
        "lookup_tasks": lookups,
        "merge_seconds": merge_seconds,
        "merge_entries_per_second": entries / merge_seconds,
        "merge_peak_rss_growth_bytes": merge_peak,
        "build_rows": args.build_rows,
        "build_seconds": build_seconds,
        "build_rows_per_second": args.build_rows / build_seconds,
        "process_peak_rss_growth_bytes": _max_rss() - rss_before,
        "billion_rows": {
            "partitions": partitions,
            "index_bytes": per_entry * BILLION,
            "checkpoint_lookup_core_seconds": partitions * lookup_78["headers_cached_p50_seconds"],
            "checkpoint_lookup_core_seconds_uncached_headers": partitions * lookup_78["headers_uncached_p50_seconds"],
            "full_merge_core_seconds": merge_seconds * BILLION / entries,
            "rebuild_core_seconds": BILLION / (args.build_rows / build_seconds),
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=BILLION // 128)
    parser.add_argument("--keys", nargs="+", default=["long", "uuid"], choices=["long", "uuid"])
    parser.add_argument("--lookup-keys", type=int, nargs="+", default=[78, 625])
    parser.add_argument("--lookups", type=int, default=20)
    parser.add_argument("--build-rows", type=int, default=4_000_000)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    results = []
    for key in args.keys:
        with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="key-index-partition-") as folder:
            results.append(measure(key, args, Path(folder)))
    text = json.dumps({"machine": os.uname().machine, "cpus": os.cpu_count(), "results": results}, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
