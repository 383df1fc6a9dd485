"""A writer task's reduction of rows sorted by key (writer/key_runs.py): the first row of each run of
equal keys, whatever Arrow batches the rows come in, and the overlap test of the tasks' key hashes."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from iceberg_sink.vocab.columns import RUN_ALONE_COLUMN, RUN_HASH_COLUMN, RUN_KEY_PREFIX
from iceberg_sink.writer.key_runs import KeyRuns, crossed, helper_columns

K0, K1 = RUN_KEY_PREFIX + "0", RUN_KEY_PREFIX + "1"


def sorted_rows(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Rows as a writer task receives them: sorted by (k0, k1, alone) with nulls first, then newest first."""
    rows = []
    for seq in range(count):
        alone = seq if rng.random() < 0.1 else None
        k0 = rng.choice([None, "a", "b", "é", ""]) if alone is None else None
        k1 = rng.choice([None, 1, 2, 3]) if alone is None else None
        rows.append({"id": seq, K0: k0, K1: k1, RUN_ALONE_COLUMN: alone, "order": rng.randint(0, 3)})

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        parts: list[Any] = []
        for name in (K0, K1, RUN_ALONE_COLUMN):
            value = row[name]
            parts += [value is not None, value if value is not None else 0]
        return (*parts, -row["order"], -row["id"])

    rows.sort(key=key)
    for row in rows:
        row[RUN_HASH_COLUMN] = None if row[RUN_ALONE_COLUMN] is not None else hash((row[K0], row[K1])) % 2**62
    return rows


def model(rows: list[dict[str, Any]]) -> list[int]:
    """Spark's window: the first row of each group of equal (k0, k1, alone), nulls equal."""
    kept, seen = [], set()
    for row in rows:
        group = (row[K0], row[K1], row[RUN_ALONE_COLUMN])
        if group not in seen:
            seen.add(group)
            kept.append(row["id"])
    return kept


def batches_of(rows: list[dict[str, Any]], rng: random.Random) -> list[pa.RecordBatch]:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            (K0, pa.string()),
            (K1, pa.int32()),
            (RUN_ALONE_COLUMN, pa.int64()),
            ("order", pa.int64()),
            (RUN_HASH_COLUMN, pa.int64()),
        ]
    )
    table = pa.Table.from_pylist(rows, schema=schema)
    out, at = [], 0
    while at < len(rows):
        size = rng.choice([0, 1, 2, 5, 17, 100])
        out.append(
            table.slice(at, size).combine_chunks().to_batches()[0]
            if size
            else pa.RecordBatch.from_pylist([], schema=schema)
        )
        at += size
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_first_row_of_each_run_is_kept_whatever_the_batches(seed: int) -> None:
    rng = random.Random(seed)
    rows = sorted_rows(rng, rng.randint(0, 300))
    runs = KeyRuns()
    out = list(runs.reduced(batches_of(rows, rng)))
    kept = [i for b in out for i in b.column("id").to_pylist()]
    assert kept == model(rows)
    for batch in out:
        assert batch.schema.names == ["id", "order"]  # the helper columns are gone
    by_id = {r["id"]: r for r in rows}
    want = sorted({by_id[i][RUN_HASH_COLUMN] for i in kept if by_id[i][RUN_HASH_COLUMN] is not None})
    assert np.frombuffer(runs.hashes(), dtype="<i8").tolist() == want


def test_a_batch_without_the_helper_columns_is_refused_by_name() -> None:
    batch = pa.RecordBatch.from_pylist([{"id": 1, K0: "a"}])
    with pytest.raises(ValueError, match="expected the key, alone and hash helper columns"):
        list(KeyRuns().reduced([batch]))


def test_tasks_cross_when_a_hash_is_in_two_of_them() -> None:
    def hashes(*values: int) -> bytes:
        return np.array(sorted(values), dtype="<i8").tobytes()

    assert not crossed([hashes(1, 2), hashes(3, 4), b""])
    assert crossed([hashes(1, 2), hashes(2, 5)])
    assert not crossed([hashes(1, 2)])  # one task: nothing to cross
    assert not crossed([])


def test_the_helper_columns_are_the_run_columns_and_the_hash() -> None:
    names = ["id", K0, RUN_ALONE_COLUMN, RUN_HASH_COLUMN, "v"]
    assert helper_columns(names) == [K0, RUN_ALONE_COLUMN, RUN_HASH_COLUMN]
    assert helper_columns(["id", "v"]) == []
