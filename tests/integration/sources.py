"""Deterministic streaming sources for integration tests: Parquet files a file-stream reads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

EVENT_SCHEMA_DDL = "event_id long, user_id long, ts timestamp, name string, score double"


def event_batch(start: int, n: int) -> pa.Table:
    base = dt.datetime(2024, 3, 9, 20, 0, tzinfo=dt.UTC)
    ids = list(range(start, start + n))
    return pa.table(
        {
            "event_id": pa.array(ids, pa.int64()),
            "user_id": pa.array([i % 37 for i in ids], pa.int64()),
            "ts": pa.array([base + dt.timedelta(minutes=53 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            "name": [f"user-{i % 37}" if i % 9 else None for i in ids],
            "score": [float("nan") if i % 13 == 0 else i * 0.5 for i in ids],
        }
    )


def write_source_files(directory: Path, files: int, rows_per_file: int, first_file: int = 0) -> list[pa.Table]:
    """Write ``files`` Parquet files (named so that they sort in order); return their contents."""
    directory.mkdir(parents=True, exist_ok=True)
    tables = []
    for f in range(first_file, first_file + files):
        table = event_batch(f * rows_per_file, rows_per_file)
        pq.write_table(table, directory / f"part-{f:05d}.parquet")
        tables.append(table)
    return tables
