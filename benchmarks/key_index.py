"""The key index's size and its rebuild time against its load time from table storage, without Spark.

    .venv/bin/python -m benchmarks.key_index [--rows 1000000 10000000] [--files-per-million 4]
        [--kinds long string] [--work-dir DIR] [--out result.json]

For each row count and key kind, writes data files of a table (SQLite catalog, local warehouse; a
key column in random order and a 40-byte payload, zstd Parquet as the sink writes them), then:

- **rebuild**: a cold index (persistence off) looks one key up in every file: each file's key column
  is read and indexed, as the first checkpoint after a restart did before the index was persisted;
- **persist**: the same with persistence on, then waits for the background writes (their time is
  reported separately: the commit never waits for it);
- **load**: a new index (a restarted driver) looks the same key up in every file: each entry is
  loaded from ``<metadata>/iceberg-sink-key-index/`` and verified (checksum, file, key).

Printed as JSON, one object per case: index bytes in memory and on disk, data bytes, and the wall
and process CPU seconds of each step (CPU is the measure to trust on a busy machine), plus the CPU
seconds other processes used meanwhile (``foreign_cpu_seconds``: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType

from benchmarks.cpu_monitor import ForeignCpuMonitor
from iceberg_sink._iceberg.files import arrow_schema
from iceberg_sink._iceberg.live_rows import key_columns
from iceberg_sink._iceberg.projection import key_schema
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.keyindex.persisted import index_location
from iceberg_sink.table.catalog import create_table
from iceberg_sink.vocab.files import DataFileMeta, FileContent

KINDS = {"long": LongType(), "string": StringType()}


def _table(root: Path, kind: str) -> Table:
    schema = Schema(NestedField(1, "k", KINDS[kind], required=True), NestedField(2, "payload", StringType()))
    catalog = SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=(root / "wh").as_uri())
    return create_table(catalog, f"db.{kind}", schema, UNPARTITIONED_PARTITION_SPEC, {"format-version": "3"})


def _write_files(table: Table, rows: int, files: int, kind: str, seed: int) -> list[DataFileMeta]:
    rng = np.random.default_rng(seed)
    keys = rng.permutation(rows).astype(np.int64)
    out = []
    for n, part in enumerate(np.array_split(keys, files)):
        column = pa.array(part) if kind == "long" else pa.array([f"user-{k:012d}" for k in part.tolist()])
        batch = pa.table({"k": column, "payload": pa.array(["x" * 40] * len(part))})
        batch = batch.cast(arrow_schema(table.schema()))
        path = table.location_provider().new_data_location(f"bench-{n:05d}.parquet")
        local = path.removeprefix("file://")
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(batch, local, compression="zstd")
        out.append(
            DataFileMeta(
                content=FileContent.DATA,
                path=path,
                spec_id=0,
                partition=(),
                record_count=len(part),
                file_size_in_bytes=os.path.getsize(local),
            )
        )
    return out


def _timed(step: Callable[[], Any], monitor: ForeignCpuMonitor) -> dict[str, float | None]:
    wall, cpu = time.time(), time.process_time()
    step()
    end = time.time()
    return {
        "wall_seconds": round(end - wall, 3),
        "cpu_seconds": round(time.process_time() - cpu, 3),
        "foreign_cpu_seconds": None if (f := monitor.between(wall, end)) is None else round(f, 2),
    }


def _lookup_all(table: Table, files: list[DataFileMeta], index: KeyIndex, kind: str) -> None:
    schema, ids = table.schema(), (1,)
    wanted = key_schema(schema, ids)
    probe = pa.table({"k": pa.array([7]) if kind == "long" else pa.array([f"user-{7:012d}"])})
    deleted = key_columns(probe.cast(arrow_schema(wanted)), wanted, ids)
    index.bind(table)
    found = sum(len(index.matching_positions(table.io, schema, f, ids, deleted, None)[0]) for f in files)
    assert found == 1, f"key 7 is in exactly one file, found {found} rows"


def run_case(work: Path, rows: int, files: int, kind: str, monitor: ForeignCpuMonitor) -> dict[str, Any]:
    table = _table(work, kind)
    made = time.time()
    data = _write_files(table, rows, files, kind, seed=rows)
    write_seconds = round(time.time() - made, 1)
    big = 1 << 40  # every file fits: the bound is not what is measured
    cold = KeyIndex(big, persist=False)
    rebuild = _timed(lambda: _lookup_all(table, data, cold, kind), monitor)
    persisting = KeyIndex(big, persist=True)
    persist = _timed(lambda: _lookup_all(table, data, persisting, kind), monitor)
    flush = _timed(persisting.flush, monitor)
    assert persisting.persisted.written == len(data) and persisting.persisted.write_failures == 0
    restarted = KeyIndex(big, persist=True)
    load = _timed(lambda: _lookup_all(table, data, restarted, kind), monitor)
    assert restarted.persisted.loaded == len(data) and restarted.data_files_read == 0
    folder = Path(index_location(table).removeprefix("file://"))
    return {
        "rows": rows,
        "key": kind,
        "data_files": files,
        "data_bytes": sum(f.file_size_in_bytes for f in data),
        "index_bytes_memory": cold.nbytes,
        "index_bytes_loaded": restarted.nbytes,
        "index_bytes_disk": sum(p.stat().st_size for p in folder.iterdir()),
        "rebuild_from_data_files": rebuild,
        "rebuild_while_persisting": persist,
        "background_write": flush,
        "load_from_persisted": load,
        "setup_write_seconds": write_seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--files-per-million", type=int, default=4, help="data files per million rows")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    monitor = ForeignCpuMonitor().start()
    results = []
    try:
        for rows in args.rows:
            for kind in args.kinds:
                with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="key-index-") as work:
                    files = max(1, rows * args.files_per_million // 1_000_000)
                    result = run_case(Path(work), rows, files, kind, monitor)
                results.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    finally:
        monitor.stop()
    text = json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
