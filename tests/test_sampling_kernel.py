"""Tests of the vectorised CSC neighbour-sampling kernel."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError
from asyncgraph.kernels import in_degrees, sample_csc
from asyncgraph.kernels import sampling as K


def chi2_critical(df: int, p: float = 0.001) -> float:
    """Upper ``p`` critical value of chi-square(df), by bisection on the regularised gamma CDF."""
    lo, hi = 0.0, float(df) + 50.0 * float(df) ** 0.5 + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        cdf = float(
            torch.special.gammainc(
                torch.tensor(df / 2, dtype=torch.float64), torch.tensor(mid / 2, dtype=torch.float64)
            )
        )
        lo, hi = (mid, hi) if cdf < 1 - p else (lo, mid)
    return lo


def make_csc(
    degrees: list[int] | np.ndarray, num_src: int = 1000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CSC with the given in-degrees, random sources and edge IDs offset by 500 (global IDs)."""
    rng = np.random.default_rng(seed)
    deg = np.asarray(degrees, dtype=np.int64)
    indptr = np.zeros(deg.size + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    indices = rng.integers(0, num_src, int(indptr[-1]), dtype=np.int64)
    eids = 500 + np.arange(int(indptr[-1]), dtype=np.int64)
    return indptr, indices, eids


def check_consistent(
    indptr: np.ndarray,
    indices: np.ndarray,
    eids: np.ndarray,
    seeds: np.ndarray,
    src: np.ndarray,
    pos: np.ndarray,
    out_eids: np.ndarray,
) -> np.ndarray:
    """Every sampled edge is an in-edge of its seed with matching (src, eid); returns positions."""
    assert src.dtype == pos.dtype == out_eids.dtype == np.int64
    assert src.shape == pos.shape == out_eids.shape
    assert np.all(np.diff(pos) >= 0), "output must be grouped by seed position in order"
    edge_pos = out_eids - 500
    rows = seeds[pos]
    assert np.all(edge_pos >= indptr[rows]) and np.all(edge_pos < indptr[rows + 1])
    np.testing.assert_array_equal(indices[edge_pos], src)
    return edge_pos


DEGREES = [0, 1, 3, 5, 10, 11, 15, 40, 41, 64, 100, 1000, 5000]


@pytest.mark.parametrize("fanout", [1, 5, 10, 40])
def test_without_replacement(fanout: int) -> None:
    indptr, indices, eids = make_csc(DEGREES * 3)
    seeds = np.concatenate([np.arange(len(DEGREES) * 3), np.arange(len(DEGREES))])  # duplicates too
    src, pos, out = sample_csc(indptr, indices, eids, seeds, fanout, False, np.random.default_rng(1))
    edge_pos = check_consistent(indptr, indices, eids, seeds, src, pos, out)
    deg = np.diff(indptr)[seeds]
    counts = np.bincount(pos, minlength=seeds.size)
    np.testing.assert_array_equal(counts, np.minimum(deg, fanout))
    # no duplicate edge within one seed occurrence
    assert np.unique(pos * 10**9 + edge_pos).size == pos.size
    # all in-edges of seeds with degree <= fanout
    small = np.flatnonzero(deg <= fanout)
    got = np.sort(edge_pos[np.isin(pos, small)])
    want = np.sort(np.concatenate([np.arange(indptr[s], indptr[s + 1]) for s in seeds[small]]))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fanout", [1, 7, 50])
def test_with_replacement(fanout: int) -> None:
    indptr, indices, eids = make_csc(DEGREES)
    seeds = np.arange(len(DEGREES))
    src, pos, out = sample_csc(indptr, indices, eids, seeds, fanout, True, np.random.default_rng(2))
    check_consistent(indptr, indices, eids, seeds, src, pos, out)
    deg = np.diff(indptr)[seeds]
    np.testing.assert_array_equal(np.bincount(pos, minlength=seeds.size), np.where(deg > 0, fanout, 0))


@pytest.mark.parametrize("replace", [False, True])
def test_fanout_all_and_zero(replace: bool) -> None:
    indptr, indices, eids = make_csc(DEGREES)
    seeds = np.array([12, 0, 3, 3], dtype=np.int64)
    src, pos, out = sample_csc(indptr, indices, eids, seeds, -1, replace, np.random.default_rng(0))
    edge_pos = check_consistent(indptr, indices, eids, seeds, src, pos, out)
    want = np.concatenate([np.arange(indptr[s], indptr[s + 1]) for s in seeds])
    np.testing.assert_array_equal(edge_pos, want)
    src, pos, out = sample_csc(indptr, indices, eids, seeds, 0, replace, np.random.default_rng(0))
    assert src.size == pos.size == out.size == 0
    src, pos, out = sample_csc(
        indptr, indices, eids, np.empty(0, np.int64), 5, replace, np.random.default_rng(0)
    )
    assert src.size == pos.size == out.size == 0 and src.dtype == np.int64


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [5, 40])
def test_reproducible(replace: bool, fanout: int) -> None:
    indptr, indices, eids = make_csc(DEGREES * 4)
    seeds = np.random.default_rng(5).integers(0, len(DEGREES) * 4, 200)
    a = sample_csc(indptr, indices, eids, seeds, fanout, replace, np.random.default_rng(42))
    b = sample_csc(indptr, indices, eids, seeds, fanout, replace, np.random.default_rng(42))
    c = sample_csc(indptr, indices, eids, seeds, fanout, replace, np.random.default_rng(43))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[2], c[2])


def chi2_stat(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize(
    ("degree", "fanout", "replace"),
    [(50, 5, False), (7, 5, False), (50, 5, True), (100, 40, False), (500, 40, False), (41, 1, False)],
)
def test_uniformity(degree: int, fanout: int, replace: bool) -> None:
    """Neighbour frequencies of one node over many (vectorised) trials pass a chi-square bound."""
    indptr, indices, eids = make_csc([3, degree, 2])
    trials = 20_000
    seeds = np.ones(trials, dtype=np.int64)
    _, _, out = sample_csc(indptr, indices, eids, seeds, fanout, replace, np.random.default_rng(7))
    counts = np.bincount(out - 500 - indptr[1], minlength=degree)
    assert counts.size == degree and counts.sum() == trials * fanout
    assert chi2_stat(counts) < chi2_critical(degree - 1)
    if not replace:  # pairs are uniform too: check how often position 0 and 1 come together
        edge = (out - 500 - indptr[1]).reshape(trials, fanout)
        both = np.count_nonzero((edge == 0).any(axis=1) & (edge == 1).any(axis=1))
        p = fanout * (fanout - 1) / (degree * (degree - 1))
        assert abs(both - trials * p) < 4.5 * (trials * p * (1 - p)) ** 0.5 + 1


def test_exact_fallbacks_uniform() -> None:
    """The exact segmented-sort fallback (rarely hit by the redraw path) is uniform and distinct."""
    deg = np.full(20_000, 30, dtype=np.int64)
    picked = K._topk_segmented(deg, 4, np.random.default_rng(3))
    assert picked.shape == (20_000, 4)
    srt = np.sort(picked, axis=1)
    assert not (srt[:, 1:] == srt[:, :-1]).any() and picked.min() >= 0 and picked.max() < 30
    assert chi2_stat(np.bincount(picked.ravel(), minlength=30)) < chi2_critical(29)
    mixed = np.array([5, 9, 100, 6], dtype=np.int64)
    picked = K._topk_segmented(mixed, 5, np.random.default_rng(0))
    assert (picked < mixed[:, None]).all()
    np.testing.assert_array_equal(np.sort(picked[0]), np.arange(5))


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.perf)])
def test_hubs_fast_and_correct(timed: bool) -> None:
    hub = 100_000
    indptr, indices, eids = make_csc([hub, 3, hub, hub // 2], num_src=10**6)
    seeds = np.tile(np.array([0, 1, 2, 3]), 2_000)
    for fanout, replace in [(10, False), (10, True), (64, False)]:
        t0 = time.perf_counter()
        src, pos, out = sample_csc(indptr, indices, eids, seeds, fanout, replace, np.random.default_rng(9))
        elapsed = time.perf_counter() - t0
        edge_pos = check_consistent(indptr, indices, eids, seeds, src, pos, out)
        deg = np.diff(indptr)[seeds]
        want = np.full(seeds.size, fanout) if replace else np.minimum(deg, fanout)
        np.testing.assert_array_equal(np.bincount(pos, minlength=seeds.size), want)
        if not replace:
            assert np.unique(pos * 10**9 + edge_pos).size == pos.size
        # 6,000 hub samples must not touch all 100k in-edges of each hub (that would be 6e8)
        if timed:
            assert elapsed < 1.0, f"fanout {fanout} replace {replace} took {elapsed:.2f}s"


def test_validation() -> None:
    indptr, indices, eids = make_csc([2, 3])
    rng = np.random.default_rng(0)
    with pytest.raises(OutOfRangeError):
        sample_csc(indptr, indices, eids, np.array([2]), 1, False, rng)
    with pytest.raises(OutOfRangeError):
        sample_csc(indptr, indices, eids, np.array([-1]), 1, False, rng)
    with pytest.raises(DTypeMismatchError):
        sample_csc(indptr, indices, eids, np.array([0.5]), 1, False, rng)
    with pytest.raises(DTypeMismatchError):
        sample_csc(indptr, indices.astype(np.float64), eids, np.array([0]), 1, False, rng)
    with pytest.raises(DTypeMismatchError):
        sample_csc(indptr, indices, eids, np.array([0]), 1.5, False, rng)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        sample_csc(indptr, indices, eids, np.array([0]), -2, False, rng)
    with pytest.raises(InvalidRequestError):
        sample_csc(indptr, indices, eids[:-1], np.array([0]), 1, False, rng)
    np.testing.assert_array_equal(in_degrees(indptr, np.array([1, 0, 1], dtype=np.int32)), [3, 2, 3])
    with pytest.raises(OutOfRangeError):
        in_degrees(indptr, np.array([5]))
    # narrower integer dtypes are accepted; outputs are int64
    src, pos, out = sample_csc(
        indptr.astype(np.int32),
        indices.astype(np.int32),
        eids.astype(np.int32),
        np.array([1], dtype=np.uint8),
        -1,
        False,
        rng,
    )
    assert src.dtype == pos.dtype == out.dtype == np.int64 and src.size == 3


def _compiled_ready() -> None:
    from asyncgraph.kernels import compiled

    if compiled.disabled():
        pytest.skip("ASYNCGRAPH_NO_JIT is set")
    assert compiled.wait_ready(120), "numba is a dependency: the compiled kernel must load"


@pytest.fixture(params=["compiled", "numpy"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on the compiled (numba) branch and on the vectorised numpy one."""
    from asyncgraph.kernels import compiled

    if request.param == "numpy":
        monkeypatch.setattr(compiled, "ready", lambda: False)
    else:
        _compiled_ready()  # numba is a dependency: the compiled kernel must load
    return str(request.param)


def test_compiled_kernel_gives_the_numpy_paths_samples_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a process has loaded the compiled kernel yet must never change a sample: both
    paths consume the generator identically and return identical arrays (random graphs with
    hubs, duplicate seeds, empty and tiny inputs, every fanout up to 32)."""
    from asyncgraph.kernels import compiled

    _compiled_ready()
    rng = np.random.default_rng(2026)
    for trial in range(60):
        degrees = rng.integers(0, 60, size=int(rng.integers(1, 40)))
        degrees[rng.integers(0, degrees.size)] = int(rng.integers(100, 3000))  # a hub
        indptr, indices, eids = make_csc(list(degrees))
        seeds = rng.integers(0, degrees.size, size=int(rng.integers(0, 50)))
        fanout = int(rng.integers(1, 33))
        fast = sample_csc(indptr, indices, eids, seeds, fanout, False, np.random.default_rng(trial))
        with monkeypatch.context() as m:
            m.setattr(compiled, "ready", lambda: False)
            slow = sample_csc(indptr, indices, eids, seeds, fanout, False, np.random.default_rng(trial))
        for a, b in zip(fast, slow, strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype == np.int64
        # the fused form (partition sampling): the same edges, gathered in the compiled pass
        global_seeds = seeds.astype(np.int64) * 7 + 1000
        fused = compiled.uniform_edges(
            indptr.astype(np.int64),
            indices.astype(np.int64),
            eids.astype(np.int64),
            seeds.astype(np.int64),
            global_seeds,
            fanout,
            np.random.default_rng(trial),
        )
        for a, b in zip(fused, (slow[0], global_seeds[slow[1]], slow[2]), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fanout", [1, 5, 10, 32])
def test_both_paths_exact_and_uniform(kernel_path: str, fanout: int) -> None:
    """Either path: exactly min(deg, fanout) distinct in-edges per seed occurrence, every
    in-edge of small seeds in CSC order, reproducible from the generator's state, and uniform
    (chi-square over one node's neighbours, pairs too)."""
    indptr, indices, eids = make_csc(DEGREES * 2)
    seeds = np.concatenate([np.arange(len(DEGREES) * 2), np.arange(len(DEGREES))])
    src, pos, out = sample_csc(indptr, indices, eids, seeds, fanout, False, np.random.default_rng(3))
    edge_pos = check_consistent(indptr, indices, eids, seeds, src, pos, out)
    deg = np.diff(indptr)[seeds]
    np.testing.assert_array_equal(np.bincount(pos, minlength=seeds.size), np.minimum(deg, fanout))
    assert np.unique(pos * 10**9 + edge_pos).size == pos.size
    small = np.flatnonzero(deg <= fanout)
    for s in small[:5]:
        np.testing.assert_array_equal(edge_pos[pos == s], np.arange(indptr[seeds[s]], indptr[seeds[s] + 1]))
    again = sample_csc(indptr, indices, eids, seeds, fanout, False, np.random.default_rng(3))
    np.testing.assert_array_equal(again[2], out)
    degree, trials = 3 * fanout + 4, 8000
    indptr, indices, eids = make_csc([3, degree, 2])
    _, _, out = sample_csc(
        indptr, indices, eids, np.ones(trials, np.int64), fanout, False, np.random.default_rng(11)
    )
    edge = (out - 500 - indptr[1]).reshape(trials, fanout)
    counts = np.bincount(edge.ravel(), minlength=degree)
    assert chi2_stat(counts) < chi2_critical(degree - 1)
    if fanout > 1:
        both = np.count_nonzero((edge == 0).any(axis=1) & (edge == 1).any(axis=1))
        p = fanout * (fanout - 1) / (degree * (degree - 1))
        assert abs(both - trials * p) < 4.5 * (trials * p * (1 - p)) ** 0.5 + 1


def test_compiled_kernel_marks_its_cache_built() -> None:
    """After a load, the marker that spares later processes the compiling child exists, keyed
    by this source, Python and numba (a changed kernel gets a new marker, hence a new child)."""
    from asyncgraph.kernels import compiled

    _compiled_ready()
    marker = compiled.SAMPLING.marker()
    assert marker.exists(), marker
    assert marker.name.startswith("compiled-ready-") and marker.parent.name == "__pycache__"
    # every signature the request paths use was built at load (none compiles on a request)
    kernels = compiled.SAMPLING.kernels
    assert kernels is not None
    assert all(len(k.signatures) >= 2 for k in kernels)  # read-only and writable structure


def test_relabel_kernel_is_the_loaders_own() -> None:
    """The loaders' compiled relabelling loads as its own set, with its own cache marker, and
    declines arrays it was not compiled for (read-only ones) rather than compiling on a batch."""
    from asyncgraph.dataloading import relabel_kernel

    _compiled_ready()
    assert relabel_kernel.wait_ready(120)
    marker = relabel_kernel.RELABEL.marker()
    assert marker.exists() and marker.name.startswith("relabel_kernel-ready-"), marker
    kernel = relabel_kernel.RELABEL.kernels
    assert kernel is not None and len(kernel.signatures) >= 1  # writable int64 only
    ro = np.array([1, 2], dtype=np.int64)
    ro.flags.writeable = False
    assert relabel_kernel.relabel(ro, ro, ro, np.full(3, -1, dtype=np.int64)) is None


def test_compiled_state_says_which_sampler_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``state()``: "compiled" once loaded, "loading" while the loader runs, "numpy" otherwise."""
    import threading

    from asyncgraph.kernels import compiled

    if compiled.disabled():
        pytest.skip("ASYNCGRAPH_NO_JIT is set")
    _compiled_ready()
    assert compiled.state() == "compiled"
    jit = compiled.SAMPLING
    monkeypatch.setattr(jit, "kernels", None)
    monkeypatch.setattr(jit, "started", True)
    monkeypatch.setattr(jit, "loader_done", threading.Event())
    assert compiled.state() == "loading"
    jit.loader_done.set()  # the loader finished without kernels (no numba, a failure)
    assert compiled.state() == "numpy"
    monkeypatch.setattr(jit, "started", False)
    assert compiled.state() == "numpy"


@pytest.mark.parametrize("no_jit", [False, True])
def test_server_info_reports_its_sampler(
    no_jit: bool, pubmed2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server says which sampler its requests get: compiled once loaded (it loads in the
    background after start-up), numpy for good under ``ASYNCGRAPH_NO_JIT=1``."""
    from asyncgraph.client.sync_client import Client
    from asyncgraph.kernels import compiled
    from asyncgraph.testing import start_servers

    if compiled.disabled() and not no_jit:
        pytest.skip("ASYNCGRAPH_NO_JIT is set")
    monkeypatch.setenv("ASYNCGRAPH_NO_JIT", "1" if no_jit else "0")
    group = start_servers(pubmed2.part_config, tmp_path, num_parts=2)
    try:
        client = Client.connect(group.addresses, use_shared_memory=False)
        try:
            deadline = time.monotonic() + 120
            states = [client.info(p)["sampler"] for p in range(2)]
            while "loading" in states and time.monotonic() < deadline:
                time.sleep(0.1)
                states = [client.info(p)["sampler"] for p in range(2)]
            assert states == (["numpy"] * 2 if no_jit else ["compiled"] * 2)
        finally:
            client.close()
    finally:
        group.stop()
