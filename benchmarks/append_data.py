"""The append benchmark's event stream: Parquet files generated once from a seed, and their checksum.

Each file is one micro-batch (the drivers read the folder with ``maxFilesPerTrigger=1``). Columns:

| column | Spark type | values |
|---|---|---|
| ``event_id`` | long | 0 .. rows-1, unique, in file order |
| ``user_id`` | long | uniform in [0, 100000) |
| ``ts`` | timestamp | uniform over 7 days from 2026-01-05 00:00 UTC (microseconds) |
| ``type`` | string | one of 8 event types |
| ``payload`` | string | 16-96 characters, every 50th row non-ASCII, 1 in 100 null |
| ``amount`` | double | a whole number of cents in [0, 1000), 1 in 50 null |

Partitioned by ``day(ts), bucket(16, user_id)`` a batch touches 7 x 16 = 112 partitions. Files are
written with row groups of ``rows_per_file / 4`` rows by default, so Spark splits each file over both
cores; with one row group a micro-batch is one task.

The checksum (:data:`CHECKSUM_SQL`) is one row of integers every reader computes exactly the same
way: Spark SQL (Iceberg Java) and DuckDB both run the same text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SPARK_DDL = "event_id long, user_id long, ts timestamp, type string, payload string, amount double"
USERS = 100_000
DAYS = 7
START_MICROS = 1_767_571_200_000_000  # 2026-01-05T00:00:00Z
TYPES = ("view", "click", "add_to_cart", "remove_from_cart", "purchase", "search", "login", "logout")

# One row; integer sums only, so Spark and DuckDB agree exactly. ``micros`` is the timestamp as
# microseconds since the epoch (Spark: unix_micros, DuckDB: epoch_us); ``{MICROS}`` is replaced.
CHECKSUM_SQL = (
    "select count(*) as rows, count(distinct event_id) as distinct_ids, sum(event_id) as sum_event_id, "
    "sum(user_id) as sum_user_id, sum({MICROS} % 1000000007) as sum_ts_mod, "
    "sum(length(type)) as sum_type_len, sum(length(payload)) as sum_payload_len, "
    "count(payload) as payloads, sum(cast(round(amount * 100) as bigint)) as sum_cents, "
    "count(amount) as amounts, sum((event_id * 31 + user_id) % 1000003) as mix "
    "from {TABLE}"
)
CHECKSUM_COLUMNS = (
    "rows",
    "distinct_ids",
    "sum_event_id",
    "sum_user_id",
    "sum_ts_mod",
    "sum_type_len",
    "sum_payload_len",
    "payloads",
    "sum_cents",
    "amounts",
    "mix",
)


def checksum_sql(table: str, dialect: str) -> str:
    micros = {"spark": "unix_micros(ts)", "duckdb": "epoch_us(ts)"}[dialect]
    return CHECKSUM_SQL.replace("{MICROS}", micros).replace("{TABLE}", table)


@dataclass(frozen=True)
class Stream:
    files: tuple[Path, ...]
    rows: int
    bytes: int
    checksum: dict[str, int]
    generate_seconds: float


def _payloads(rng: np.random.Generator, n: int, event_ids: np.ndarray) -> pa.Array:
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ", dtype=np.uint8)
    pool_size = 4096
    lengths = rng.integers(8, 88, size=pool_size)
    pool = []
    for i, length in enumerate(lengths):
        text = alphabet[rng.integers(0, len(alphabet), size=int(length))].tobytes().decode()
        if i % 50 == 0:
            text = "Zürich-東京-" + text  # non-ASCII, multi-byte UTF-8
        pool.append(text)
    picks = pa.array(np.asarray(pool, dtype=object)[rng.integers(0, pool_size, size=n)], pa.string())
    suffix = pc.cast(pa.array(event_ids), pa.string())
    joined = pc.binary_join_element_wise(picks, suffix, "#")
    nulls = pa.array(rng.integers(0, 100, size=n) == 0)
    return pc.if_else(nulls, pa.nulls(n, pa.string()), joined)


def batch(rng: np.random.Generator, first_id: int, n: int) -> pa.Table:
    event_ids = np.arange(first_id, first_id + n, dtype=np.int64)
    amounts = rng.integers(0, 100_000, size=n) / 100.0
    return pa.table(
        {
            "event_id": pa.array(event_ids),
            "user_id": pa.array(rng.integers(0, USERS, size=n, dtype=np.int64)),
            "ts": pa.array(
                START_MICROS + rng.integers(0, DAYS * 86_400_000_000, size=n, dtype=np.int64),
                pa.timestamp("us", tz="UTC"),
            ),
            "type": pa.array(np.asarray(TYPES, dtype=object)[rng.integers(0, len(TYPES), size=n)], pa.string()),
            "payload": _payloads(rng, n, event_ids),
            "amount": pc.if_else(
                pa.array(rng.integers(0, 50, size=n) == 0), pa.nulls(n, pa.float64()), pa.array(amounts)
            ),
        }
    )


def _checksum(tables: list[pa.Table]) -> dict[str, int]:
    t = pa.concat_tables(tables)
    ids = t.column("event_id").to_numpy()
    users = t.column("user_id").to_numpy()
    micros = t.column("ts").cast(pa.int64()).to_numpy()
    payload_len = pc.utf8_length(t.column("payload"))
    amount = t.column("amount")
    cents = pc.cast(pc.round(pc.multiply(amount, 100.0)), pa.int64())
    return {
        "rows": t.num_rows,
        "distinct_ids": len(np.unique(ids)),
        "sum_event_id": int(ids.sum()),
        "sum_user_id": int(users.sum()),
        "sum_ts_mod": int((micros % 1_000_000_007).sum()),
        "sum_type_len": int(pc.sum(pc.utf8_length(t.column("type"))).as_py()),
        "sum_payload_len": int(pc.sum(payload_len).as_py() or 0),
        "payloads": t.num_rows - t.column("payload").null_count,
        "sum_cents": int(pc.sum(cents).as_py() or 0),
        "amounts": t.num_rows - amount.null_count,
        "mix": int(((ids * 31 + users) % 1_000_003).sum()),
    }


def generate(directory: Path, batches: int, rows_per_batch: int, seed: int, row_groups: int = 4) -> Stream:
    """Write ``batches`` Parquet files of ``rows_per_batch`` rows in ``row_groups`` row groups each
    into ``directory`` (Spark reads a row group per task: 1 makes a one-task micro-batch)."""
    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files, tables = [], []
    for i in range(batches):
        table = batch(rng, i * rows_per_batch, rows_per_batch)
        path = directory / f"events-{i:04d}.parquet"
        pq.write_table(table, path, compression="snappy", row_group_size=max(1, -(-rows_per_batch // row_groups)))
        files.append(path)
        tables.append(table)
    return Stream(
        files=tuple(files),
        rows=batches * rows_per_batch,
        bytes=sum(p.stat().st_size for p in files),
        checksum=_checksum(tables),
        generate_seconds=time.perf_counter() - started,
    )


def compare(expected: dict[str, int], observed: dict[str, Any]) -> dict[str, Any]:
    """Each checksum column: expected, observed, equal."""
    mismatches = {
        k: {"expected": expected[k], "observed": observed.get(k)}
        for k in CHECKSUM_COLUMNS
        if observed.get(k) is None or int(observed[k]) != expected[k]
    }
    return {"ok": not mismatches, "mismatches": mismatches}
