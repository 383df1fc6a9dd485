"""A sorted file's key lookup (keyindex/keys.py): both ways of answering it, the membership table and
the binary searches, against the rows a plain comparison finds."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from iceberg_sink.keyindex.keys import SortedKeys, WantedKeys, index_rows

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))


def _expected(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.isin(values, wanted)).astype(np.int64)


def _file(values: np.ndarray) -> SortedKeys:
    keys = index_rows(pa.table({"id": pa.array(values, pa.int64())}), SCHEMA, (1,))
    assert isinstance(keys, SortedKeys)
    return keys


@pytest.mark.parametrize("seed", range(60))
def test_a_lookup_finds_every_row_of_every_wanted_key_and_no_other(seed: int) -> None:
    rng = random.Random(seed)
    low = rng.choice([0, -(2**40), -(2**63), 2**63 - 10**7])
    span = rng.choice([10, 1_000, 100_000, 2**40])
    span = min(span, 2**63 - 1 - low)
    nprng = np.random.default_rng(seed)
    rows = rng.choice([1, 5, 300, 5_000])
    values = low + nprng.integers(0, span, rows, dtype=np.int64)
    if rng.random() < 0.5:
        values = np.sort(values)  # a file already in key order keeps no order array
    asked = rng.choice([0, 1, 20, 2_000])
    wanted = np.concatenate([low + nprng.integers(0, span, asked, dtype=np.int64), nprng.choice(values, asked // 2)])
    if rng.random() < 0.3:
        wanted = np.concatenate([wanted, np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64)])
    want = WantedKeys.of(wanted)
    plain = WantedKeys(want.keys, None)
    expected = _expected(values, wanted)
    keys = _file(values)
    assert keys.lookup(want).tolist() == expected.tolist()
    assert keys.lookup(plain).tolist() == expected.tolist()


def test_the_membership_table_is_built_for_a_narrow_range_only() -> None:
    narrow = WantedKeys.of(np.arange(0, 20_000, 3, dtype=np.int64))
    assert narrow.table is not None and len(narrow.table) == 19_999
    assert WantedKeys.of(np.array([0, 2**40], np.int64)).table is None
    extremes = WantedKeys.of(np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64))
    assert extremes.table is None
    assert WantedKeys.of(np.empty(0, np.int64)).table is None


def test_a_file_with_many_rows_in_the_range_is_searched_and_answers_the_same() -> None:
    values = np.repeat(np.arange(100_000, dtype=np.int64), 2)  # every key twice: repeats follow the first
    wanted = np.array([5, 7, 99_999, 100_000], np.int64)
    want = WantedKeys.of(wanted)
    assert want.table is not None
    assert _file(values).lookup(want).tolist() == [10, 11, 14, 15, 199_998, 199_999]
