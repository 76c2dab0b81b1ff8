"""Silent corruption is an error: narrowing casts that would wrap or overflow, and the rule for
negative indices (plain ints follow Python, ID arrays must be in range). Standalone Cora."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.errors import DTypeMismatchError, OutOfRangeError


@pytest.fixture
def g(cora2) -> Iterator[asyncgraph.DistGraph]:  # type: ignore[no-untyped-def]
    asyncgraph.initialize()
    yield asyncgraph.DistGraph("cora", part_config=cora2.part_config)
    asyncgraph.finalize()


def test_int64_values_that_overflow_int32_are_refused(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    t = asyncgraph.DistTensor((n, 2), torch.int32, name="ints")
    t[[0, 1]] = torch.tensor([[1, -2], [3, 2**31 - 1]], dtype=torch.int64)  # fits: stored exactly
    assert t[[0, 1]].tolist() == [[1, -2], [3, 2**31 - 1]]
    with pytest.raises(DTypeMismatchError, match=r"value 2147483648 .*outside \[-2147483648, 2147483647\]"):
        t[[2, 3]] = np.array([[5, 6], [7, 2**31]], dtype=np.int64)
    with pytest.raises(DTypeMismatchError, match="value -2147483649"):
        t[[2]] = np.array([[-(2**31) - 1, 0]], dtype=np.int64)
    with pytest.raises(DTypeMismatchError, match="would wrap"):
        asyncgraph.DistTensor((n, 1), torch.uint8, name="bytes")[[0]] = np.array([[-1]])
    assert t[[2, 3]].tolist() == [[0, 0], [0, 0]]  # nothing written


def test_float64_values_beyond_float32_are_refused(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    t = asyncgraph.DistTensor((n, 2), torch.float32, name="floats")
    t[[0]] = np.array([[1e38, -1.5]])  # in range: rounded, not refused
    np.testing.assert_allclose(t[[0]].numpy(), [[1e38, -1.5]], rtol=1e-6)
    with pytest.raises(DTypeMismatchError, match=r"value 1e\+39 .*would become inf"):
        t[[1]] = np.array([[0.0, 1e39]])
    with pytest.raises(DTypeMismatchError, match="would become inf"):
        t[[1]] = torch.tensor([[-1e300, 0.0]], dtype=torch.float64)
    t[[2]] = np.array([[np.inf, np.nan]])  # already non-finite: stored as given
    row = t[[2]].numpy()
    assert np.isinf(row[0, 0]) and np.isnan(row[0, 1])
    assert t[[1]].tolist() == [[0.0, 0.0]]


def test_negative_indices_plain_ints_follow_python_id_arrays_must_be_in_range(
    g: asyncgraph.DistGraph,
) -> None:
    n = g.num_nodes()
    t = asyncgraph.DistTensor((n, 1), torch.int64, name="rows")
    t[0:n] = torch.arange(n).reshape(n, 1)
    assert int(t[-5][0]) == n - 5 and int(t[-1][0]) == n - 1
    t[-2] = torch.tensor([7])
    assert int(t[n - 2][0]) == 7
    with pytest.raises(OutOfRangeError):
        t[-n - 1]
    with pytest.raises(OutOfRangeError):
        t[torch.tensor([-5])]
    with pytest.raises(OutOfRangeError):
        t[np.array([0, -1])]
