"""The live destination index's compiled in-place update (``kernels/overlay_index.py``) equals
a full rebuild of the index of every appended edge (pure parts), and so does numpy's form."""

from __future__ import annotations

import numpy as np
import pytest

from asyncgraph.kernels import overlay_index
from asyncgraph.kernels.overlay_index import INDEX
from asyncgraph.storage.overlay import INDEX_SHIFT, Overlay


@pytest.fixture(params=["compiled", "python", "numpy"])
def kernels(request: pytest.FixtureRequest) -> overlay_index.IndexKernels:
    """The compiled pair (loaded in the background, waited for), its Python source, and the
    numpy form of the offsets' update."""
    if request.param == "python":
        return overlay_index.IndexKernels(overlay_index.merge_order, overlay_index.shift_offsets)
    if request.param == "numpy":
        return overlay_index.IndexKernels(overlay_index.merge_order, overlay_index.shift_offsets_numpy)
    if not INDEX.wait_ready(120.0):
        pytest.skip("numba kernels unavailable (ASYNCGRAPH_NO_JIT or no numba)")
    assert INDEX.kernels is not None
    return INDEX.kernels


def _starts(block: np.ndarray, within: np.ndarray) -> np.ndarray:
    v = np.arange(within.size)
    return np.asarray(block[v >> INDEX_SHIFT] + within)


def _rebuilt(dst: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts) of a one-shot counting sort of ``dst`` over ``size`` offsets."""
    starts = np.zeros(size, np.int64)
    np.cumsum(np.bincount(dst, minlength=size - 1)[: size - 1], out=starts[1:])
    return np.argsort(dst, kind="stable"), starts


@pytest.mark.parametrize("seed", range(8))
def test_appending_in_batches_builds_the_index_of_all_edges_at_once(
    seed: int, kernels: overlay_index.IndexKernels
) -> None:
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(1, 2000))
    size = nodes + 1
    spread = [nodes, max(1, nodes // 50), 3]  # random, clustered in a few blocks, a few nodes
    batches = [
        rng.integers(0, int(rng.choice(spread)), int(rng.integers(1, 300))) % nodes
        for _ in range(int(rng.integers(1, 12)))
    ]
    total = sum(b.size for b in batches)
    order = np.full(total + 5, -7, np.int64)  # spare capacity past the edges stays untouched
    block = np.zeros(((size - 1) >> INDEX_SHIFT) + 1, np.int64)
    within = np.zeros(size, np.int64)
    dst = np.empty(0, np.int64)
    for batch in batches:
        first = dst.size
        dst = np.concatenate([dst, batch.astype(np.int64)])
        new = np.argsort(batch, kind="stable")
        sorted_dst = batch[new].astype(np.int64)
        at = _starts(block, within)[sorted_dst + 1]
        kernels.merge_order(order, first, at, first + new)
        kernels.shift_offsets(block, within, sorted_dst, INDEX_SHIFT)
        want_order, want_starts = _rebuilt(dst, size)
        np.testing.assert_array_equal(order[: dst.size], want_order)
        np.testing.assert_array_equal(_starts(block, within), want_starts)
    assert (order[total:] == -7).all()


@pytest.mark.parametrize("jit", ["1", "0"])
def test_an_overlay_indexes_its_appended_edges_with_and_without_numba(
    jit: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Overlay.append`` (compiled, and numpy's form) and a growth of the node index keep the
    offsets equal to a rebuild; nodes added later have no appended edges."""
    if jit == "1":
        if not INDEX.wait_ready(120.0):
            pytest.skip("numba kernels unavailable (ASYNCGRAPH_NO_JIT or no numba)")
    else:
        monkeypatch.setattr(INDEX, "kernels", None)
        monkeypatch.setattr(INDEX, "started", True)  # not loading: numpy's form throughout
    rng = np.random.default_rng(7)
    n = 700
    ov = Overlay("t", part_id=0, num_parts=1, node_start=0, num_local_nodes=n, edge_base=0,
                 edge_start=0, num_base_edges=1, node_base=n, shared=False)  # fmt: skip
    dst = np.empty(0, np.int64)
    for _ in range(6):
        batch = rng.integers(0, n, int(rng.integers(1, 200)))
        ov.append(rng.integers(0, n, batch.size), batch)
        dst = np.concatenate([dst, batch])
    ov.add_nodes(3000)  # past the first capacity: the index grows
    size = ov.add_indptr.size
    order, starts = _rebuilt(dst, size)
    np.testing.assert_array_equal(ov.add_order[: dst.size], order)
    np.testing.assert_array_equal(ov.add_starts(np.arange(size)), starts)
