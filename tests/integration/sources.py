"""Deterministic streaming sources for integration tests: Parquet files a file-stream reads."""

from __future__ import annotations

import datetime as dt
import os
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


CHANGE_SCHEMA_DDL = "id long, v string, lsn long, op string"


def write_change_files(
    directory: Path, files: int, changes_per_file: int, keys: int, seed: int, first_key: int = 0
) -> list[pa.Table]:
    """Write ``files`` Parquet files of CDC changes (``op`` I/U/D, ordered by ``lsn``) on keys
    ``first_key .. first_key + keys - 1``: inserts of new keys, updates and deletes of live ones,
    deletes of absent keys, and keys repeated within a file. Apply them with :func:`apply_changes`."""
    import random

    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    live: set[int] = set()
    lsn = 0
    tables = []
    for f in range(files):
        rows: list[dict[str, object]] = []
        for _ in range(changes_per_file):
            key = first_key + rng.randrange(keys)
            lsn += 1
            r = rng.random()
            if r < 0.25 or (key not in live and r < 0.3):
                op = "D"
                live.discard(key)
            else:
                op = "U" if key in live else "I"
                live.add(key)
            rows.append({"id": key, "v": f"v{lsn}-{rng.randrange(10**6)}", "lsn": lsn, "op": op})
        rng.shuffle(rows)  # arrival order is not lsn order
        table = pa.Table.from_pylist(
            rows, pa.schema([("id", pa.int64()), ("v", pa.string()), ("lsn", pa.int64()), ("op", pa.string())])
        )
        path = directory / f"part-{f:05d}.parquet"
        pq.write_table(table, path)
        # A file stream reads files in modification-time order: make it the order of the changes.
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
        tables.append(table)
    return tables


def apply_changes(tables: list[pa.Table]) -> pa.Table:
    """The table a CDC sink keyed on ``id`` holds after ``tables`` (the highest ``lsn`` of a key wins)."""
    state: dict[int, dict[str, object]] = {}
    changes = [row for t in tables for row in t.to_pylist()]
    for row in sorted(changes, key=lambda r: int(r["lsn"])):
        if row["op"] == "D":
            state.pop(int(row["id"]), None)
        else:
            state[int(row["id"])] = {"id": row["id"], "v": row["v"], "lsn": row["lsn"]}
    return pa.Table.from_pylist(
        list(state.values()), pa.schema([("id", pa.int64()), ("v", pa.string()), ("lsn", pa.int64())])
    )


ROUTED_CHANGE_SCHEMA_DDL = "tbl string, id long, v string, lsn long, op string"


def write_routed_change_files(
    directory: Path, tables: list[str], files: int, changes_per_file: int, keys: int, seed: int
) -> dict[str, list[pa.Table]]:
    """Write ``files`` Parquet files of CDC changes for several tables at once, each row naming its
    table in ``tbl`` (the same keys recur in every table); return each table's changes per file
    (apply them with :func:`apply_changes`)."""
    import tempfile

    per_table: dict[str, list[pa.Table]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for i, table in enumerate(tables):
            per_table[table] = write_change_files(
                Path(scratch) / str(i), files=files, changes_per_file=changes_per_file, keys=keys, seed=seed + i
            )
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        parts = [
            t[f].add_column(0, "tbl", pa.array([name] * t[f].num_rows, pa.string())) for name, t in per_table.items()
        ]
        combined = pa.concat_tables(parts)
        # Interleave the tables' rows (each table's own order is kept by its lsn).
        order = sorted(range(combined.num_rows), key=lambda r: (r * 7919) % combined.num_rows)
        path = directory / f"part-{f:05d}.parquet"
        pq.write_table(combined.take(pa.array(order)), path)
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return per_table
