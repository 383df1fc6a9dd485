"""Deterministic input of the CDC benchmark, written once as Parquet and read by both systems.

The table has a ``long`` key and four payload columns::

    id long (key), name string, version long, amount double, ts timestamp

The initial load holds ``rows`` ids at version 0. Batch ``b`` (1-based) holds ``batch_size``
upserts in shuffled order: ``update_fraction`` of them are updates of distinct existing ids drawn
uniformly from every id alive so far (their ``version`` becomes ``b``, ``amount`` and ``ts`` new
random values), the rest inserts of new ids. Where new ids come from (``new_keys``):

- ``above`` (default): ids ``0 .. rows-1`` first, then each insert takes the next id above the
  highest so far, as auto-increment keys do. iceberg_sink can prove such keys new from the table's
  key bounds and skips their equality deletes.
- ``within``: the initial ids are the even numbers ``0 .. 2*rows-2``; inserts take random unused odd
  numbers, inside the range of existing keys (as random or hashed keys do): no key bound proves
  them new, so iceberg_sink writes an equality delete for every key of the batch.

No key repeats within a batch (``MERGE INTO`` refuses a target row matched by two source rows), so
the final state is known exactly: :class:`Expected` keeps it as NumPy arrays and derives the row
count, the sum of ``version`` and a sample of rows to compare with what each table returns.

Both systems read the very same files, so they see identical data (same seed, same bytes).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Spark DDL of the input files (both systems read them with this schema).
SPARK_DDL = "id bigint, name string, version bigint, amount double, ts timestamp"
COLUMNS = ("id", "name", "version", "amount", "ts")
ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("version", pa.int64()),
        pa.field("amount", pa.float64()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
    ]
)
_TS_BASE_MICROS = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp() * 1_000_000)
_TS_SPAN_MICROS = 365 * 86_400 * 1_000_000
#: Rows per Parquet file of the initial load (keeps the generator's memory flat at 10M rows).
INITIAL_FILE_ROWS = 1_000_000


def _rows(ids: np.ndarray, versions: np.ndarray, amounts: np.ndarray, ts: np.ndarray) -> pa.Table:
    id_array = pa.array(ids, pa.int64())
    names = pc.binary_join_element_wise(
        "user-", pc.cast(id_array, pa.string()), "-v", pc.cast(pa.array(versions, pa.int64()), pa.string()), ""
    )
    return pa.Table.from_arrays(
        [
            id_array,
            names,
            pa.array(versions, pa.int64()),
            pa.array(amounts, pa.float64()),
            pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        ],
        schema=ARROW_SCHEMA,
    )


def expected_name(row_id: int, version: int) -> str:
    return f"user-{row_id}-v{version}"


def _digits(values: np.ndarray) -> np.ndarray:
    """Decimal digits of each non-negative integer (0 has one)."""
    powers = 10 ** np.arange(1, 19, dtype=np.int64)
    return np.searchsorted(powers, values, side="right") + 1


#: The reader's side of ``Expected.checksums`` (Spark SQL aggregates, the same names).
CHECKSUM_SQL = {
    "id_times_version": "sum(id * version)",
    "amount_cents": "sum(cast(round(amount * 100) as bigint))",
    "ts_seconds": "sum(unix_micros(ts) div 1000000)",
    "name_length": "sum(length(name))",
}


@dataclass
class Expected:
    """The table's final state, known from the generator, and what to compare it with.

    Arrays are indexed by id over the whole id space; ``alive`` marks the ids the table holds.
    """

    version: np.ndarray
    amount: np.ndarray
    ts: np.ndarray
    times_updated: np.ndarray
    alive: np.ndarray
    initial: np.ndarray
    initial_rows: int

    @property
    def rows(self) -> int:
        return int(self.alive.sum())

    def version_sum(self) -> int:
        return int(self.version[self.alive].sum())

    def checksums(self) -> dict[str, int]:
        """Exact integer sums over every row the table holds, one per column, to compare with the
        reader's (``CHECKSUM_SQL``): with row count and distinct ids they pin down each row's version,
        amount, timestamp and the length of its name, not only those of the sampled rows."""
        ids = np.flatnonzero(self.alive).astype(np.int64)
        version = self.version[ids].astype(np.int64)
        return {
            "id_times_version": int((ids * version).sum()),
            "amount_cents": int(np.rint(self.amount[ids] * 100).astype(np.int64).sum()),
            "ts_seconds": int((self.ts[ids] // 1_000_000).sum()),
            # "user-<id>-v<version>"
            "name_length": int((7 + _digits(ids) + _digits(version)).sum()),
        }

    def sample_ids(self, seed: int, updated: int = 300, inserted: int = 100, untouched: int = 100) -> list[int]:
        """Ids to read back: updated ones (several times when there are), inserted and untouched ones."""
        rng = np.random.default_rng(seed + 1)
        picks: list[np.ndarray] = []
        for pool, count in (
            (np.flatnonzero(self.times_updated > 1), updated // 3),
            (np.flatnonzero(self.times_updated > 0), updated),
            (np.flatnonzero(self.alive & ~self.initial), inserted),
            (np.flatnonzero(self.initial & (self.times_updated == 0)), untouched),
        ):
            if len(pool):
                picks.append(rng.choice(pool, size=min(count, len(pool)), replace=False))
        return sorted({int(i) for part in picks for i in part})

    def row(self, row_id: int) -> dict[str, Any]:
        version = int(self.version[row_id])
        return {
            "id": row_id,
            "name": expected_name(row_id, version),
            "version": version,
            "amount": float(self.amount[row_id]),
            "ts_micros": int(self.ts[row_id]),
        }


@dataclass
class Dataset:
    """Where the generated files are, and the expected end state."""

    initial_files: list[Path]
    batch_files: list[Path]
    expected: Expected
    updates_per_batch: int
    inserts_per_batch: int
    new_keys: str
    generate_seconds: float
    bytes_initial: int = field(default=0)

    def rows_before_batch(self, index: int) -> int:
        """Table rows when batch ``index`` (0-based) starts."""
        return self.expected.initial_rows + index * self.inserts_per_batch


#: Where inserted ids come from: ``above`` the highest id so far (auto-increment keys), or ``within``
#: the range of existing ids (initial ids are even, inserted ids random unused odd numbers).
NEW_KEY_LAYOUTS = ("above", "within")


def generate(
    out_dir: Path,
    rows: int,
    batches: int,
    batch_size: int,
    seed: int,
    update_fraction: float = 0.5,
    new_keys: str = "above",
) -> Dataset:
    """Write the initial load and the batches under ``out_dir``; return them with the expected state."""
    started = time.perf_counter()
    if rows < 1 or batches < 0 or batch_size < 1 or not 0.0 <= update_fraction <= 1.0:
        raise ValueError(f"bad sizes: rows={rows} batches={batches} batch_size={batch_size} fraction={update_fraction}")
    if new_keys not in NEW_KEY_LAYOUTS:
        raise ValueError(f"new_keys: expected one of {NEW_KEY_LAYOUTS}, received {new_keys!r}")
    updates = round(batch_size * update_fraction)
    inserts = batch_size - updates
    if updates > rows:
        raise ValueError(f"{updates} updates per batch need at least as many initial rows (have {rows})")
    rng = np.random.default_rng(seed)
    if new_keys == "above":
        space = rows + batches * inserts
        initial_ids = np.arange(rows, dtype=np.int64)
        new_ids = np.arange(rows, space, dtype=np.int64)
    else:
        if batches * inserts > rows:
            raise ValueError(f"new_keys='within' has room for {rows} inserts, not {batches * inserts}")
        space = 2 * rows
        initial_ids = np.arange(rows, dtype=np.int64) * 2
        new_ids = rng.choice(rows, size=batches * inserts, replace=False).astype(np.int64) * 2 + 1
    version = np.zeros(space, dtype=np.int64)
    amount = np.zeros(space, dtype=np.float64)
    ts = np.zeros(space, dtype=np.int64)
    times_updated = np.zeros(space, dtype=np.int32)
    alive = np.zeros(space, dtype=bool)
    initial = np.zeros(space, dtype=bool)
    alive[initial_ids] = True
    initial[initial_ids] = True

    initial_dir = out_dir / "initial"
    batch_dir = out_dir / "batches"
    initial_dir.mkdir(parents=True, exist_ok=True)
    batch_dir.mkdir(parents=True, exist_ok=True)
    initial_files: list[Path] = []
    for start in range(0, rows, INITIAL_FILE_ROWS):
        ids = initial_ids[start : start + INITIAL_FILE_ROWS]
        amount[ids] = np.round(rng.random(len(ids)) * 10_000, 2)
        ts[ids] = _TS_BASE_MICROS + rng.integers(0, _TS_SPAN_MICROS, len(ids))
        path = initial_dir / f"part-{len(initial_files):05d}.parquet"
        pq.write_table(_rows(ids, version[ids], amount[ids], ts[ids]), path, compression="zstd")
        initial_files.append(path)

    batch_files: list[Path] = []
    live_ids = initial_ids
    for b in range(1, batches + 1):
        updated = live_ids[rng.choice(len(live_ids), size=updates, replace=False)]
        inserted = new_ids[(b - 1) * inserts : b * inserts]
        ids = np.concatenate([updated, inserted])[rng.permutation(batch_size)]
        version[ids] = b
        amount[ids] = np.round(rng.random(batch_size) * 10_000, 2)
        ts[ids] = _TS_BASE_MICROS + rng.integers(0, _TS_SPAN_MICROS, batch_size)
        times_updated[updated] += 1
        alive[inserted] = True
        path = batch_dir / f"batch-{b:05d}.parquet"
        pq.write_table(_rows(ids, version[ids], amount[ids], ts[ids]), path, compression="zstd")
        batch_files.append(path)
        live_ids = np.concatenate([live_ids, inserted])

    return Dataset(
        initial_files=initial_files,
        batch_files=batch_files,
        expected=Expected(version, amount, ts, times_updated, alive, initial, rows),
        updates_per_batch=updates,
        inserts_per_batch=inserts,
        new_keys=new_keys,
        generate_seconds=time.perf_counter() - started,
        bytes_initial=sum(p.stat().st_size for p in initial_files),
    )


def compare(expected: Expected, observed: dict[str, Any], sample_ids: list[int]) -> dict[str, Any]:
    """Compare what a reader returned (see ``merge_into_driver.observe``) with the expected state."""
    rows_by_id = {int(r["id"]): r for r in observed["sample"]}
    mismatches: list[dict[str, Any]] = []
    for row_id in sample_ids:
        want = expected.row(row_id)
        got = rows_by_id.get(row_id)
        if got != want:
            mismatches.append({"id": row_id, "expected": want, "observed": got})
    sample_rows = len(observed["sample"])
    ok = (
        observed["rows"] == expected.rows
        and observed["distinct_ids"] == expected.rows
        and observed["version_sum"] == expected.version_sum()
        and not mismatches
        and sample_rows == len(sample_ids)
    )
    checksums: dict[str, Any] = {}
    if "checksums" in observed:
        want = expected.checksums()
        checksums = {"expected": want, "observed": observed["checksums"], "equal": observed["checksums"] == want}
        ok = ok and checksums["equal"]
    return {
        "ok": ok,
        "rows": observed["rows"],
        "expected_rows": expected.rows,
        "distinct_ids": observed["distinct_ids"],
        "version_sum": observed["version_sum"],
        "expected_version_sum": expected.version_sum(),
        "sample_ids": len(sample_ids),
        "sample_rows_returned": sample_rows,
        "sample_mismatches": len(mismatches),
        "first_mismatches": mismatches[:5],
        **({"checksums": checksums} if checksums else {}),
    }
