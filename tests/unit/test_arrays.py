"""iceberg_sink._arrays: the distinct values of integer arrays, as np.unique gives them."""

from __future__ import annotations

import numpy as np
import pytest

from iceberg_sink._arrays import distinct, has_repeats


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32, np.int8])
@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000, 40_000])
def test_distinct_is_what_np_unique_gives(dtype: type, size: int) -> None:
    rng = np.random.default_rng(size)
    info = np.iinfo(dtype)
    # Extremes of the type and many repeats among them: a neighbour comparison must keep each once.
    values = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
    if size > 2:
        values[: size // 3] = values[size // 3 : 2 * (size // 3)]
        values[0], values[-1] = info.min, info.max
    for kind in ("quicksort", "stable"):
        got = distinct(values, kind=kind)
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, np.unique(values))
        assert has_repeats(values) == (len(np.unique(values)) < len(values))


def test_sorted_runs_and_all_equal() -> None:
    runs = np.concatenate([np.arange(0, 100, 2), np.arange(1, 101, 2), np.arange(0, 100, 2)]).astype(np.int64)
    np.testing.assert_array_equal(distinct(runs, kind="stable"), np.arange(0, 100))
    np.testing.assert_array_equal(distinct(np.full(5, -3, np.int64)), [-3])
    assert has_repeats(np.full(2, 9, np.int64))
    assert not has_repeats(np.array([3, 1, 2], np.int64))


def test_the_input_is_left_alone() -> None:
    values = np.array([5, 1, 5, 0], np.int64)
    distinct(values)
    np.testing.assert_array_equal(values, [5, 1, 5, 0])
    one = np.array([4], np.int64)
    distinct(one)[0] = 7
    assert one[0] == 4


@pytest.mark.parametrize(
    "values",
    [np.array([1.0, np.nan, np.nan]), np.array(["a", "b"], dtype=object), np.zeros((2, 2), np.int64)],
)
def test_refuses_what_it_cannot_order_as_numpy_does(values: np.ndarray) -> None:
    with pytest.raises(TypeError, match="one-dimensional integer array"):
        distinct(values)
