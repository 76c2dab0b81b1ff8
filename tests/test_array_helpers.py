"""Array helpers: ``unique_sorted`` (``np.unique`` without numpy 2.4's slow hash path) and ``assign_rows``."""

from __future__ import annotations

import numpy as np
import pytest

from asyncgraph.arrays import unique_sorted


@pytest.mark.parametrize("size", [0, 1, 2, 17, 100_000])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.float32])
def test_unique_sorted_equals_np_unique(size: int, dtype: type) -> None:
    rng = np.random.default_rng(size)
    a = rng.integers(0, max(1, size // 3), size).astype(dtype)
    got = unique_sorted(a)
    want = np.unique(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_unique_sorted_does_not_change_its_input_and_takes_sorted_ranges() -> None:
    a = np.array([5, 3, 5, 1], dtype=np.int64)
    np.testing.assert_array_equal(unique_sorted(a), [1, 3, 5])
    np.testing.assert_array_equal(a, [5, 3, 5, 1])
    r = np.arange(1 << 16, dtype=np.int64)
    np.testing.assert_array_equal(unique_sorted(r), r)


def test_assign_rows_writes_ranges_and_scattered_ids_as_fancy_indexing_does() -> None:
    from asyncgraph.storage.accumulate import assign_rows

    rng = np.random.default_rng(0)
    for local in (np.arange(5, 69), np.array([3]), np.array([9, 2, 2, 7]), np.array([4, 5, 7]), np.arange(0)):
        rows, want = np.zeros((80, 3), np.float32), np.zeros((80, 3), np.float32)
        vals = rng.random((local.size, 3), dtype=np.float32)
        assign_rows(rows, local, vals)
        want[local] = vals
        np.testing.assert_array_equal(rows, want)
