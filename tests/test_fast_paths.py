"""Direct tests of the fast paths: ``to_block``'s relabel paths, SAGEConv's sparse aggregation,
the numpy-mask ``Dropout`` and the keyed per-request sampling RNG.

Every fast path is compared with its slow counterpart *and* with a naive reference, so a bug
shared by both paths still fails.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncgraph.dataloading import block as block_mod
from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.errors import InvalidRequestError
from asyncgraph.kernels.partition_sampling import keyed_rng, sample_partition
from asyncgraph.nn import sage as sage_mod
from asyncgraph.nn.sage import Dropout, SAGEConv
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage import PartitionStore

# ------------------------------------------------------------------------------------------------
# to_block: table path, sort fallback, torch path
# ------------------------------------------------------------------------------------------------

Edges = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]


def reference_block(src: Any, dst: Any, dst_nodes: Any, eids: Any = None) -> tuple[np.ndarray, ...]:
    """Naive dict-based ``to_block``: (srcnodes, dstnodes, edge_index, eids), or raises."""
    src_l = [int(v) for v in np.asarray(src).reshape(-1)]
    dst_l = [int(v) for v in np.asarray(dst).reshape(-1)]
    dn = [int(v) for v in np.asarray(dst_nodes).reshape(-1)]
    if len(set(dn)) != len(dn):
        raise InvalidRequestError("dst_nodes must be unique")
    local = {v: i for i, v in enumerate(dn)}
    for d in dst_l:
        if d not in local:
            raise InvalidRequestError(f"edge destination {d} is not among dst_nodes")
    srcnodes = list(dn)
    for s in src_l:
        if s not in local:
            local[s] = len(srcnodes)
            srcnodes.append(s)
    edge_index = np.array([[local[s] for s in src_l], [local[d] for d in dst_l]], dtype=np.int64)
    eids_a = np.empty(0, dtype=np.int64) if eids is None else np.asarray(eids, dtype=np.int64)
    return (
        np.array(srcnodes, dtype=np.int64),
        np.array(dn, dtype=np.int64),
        edge_index.reshape(2, len(src_l)),
        eids_a,
    )


def block_fields(b: Block) -> tuple[np.ndarray, ...]:
    for t in (b.srcnodes, b.dstnodes, b.edge_index, b.eids):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int64
    assert b.edge_index.dim() == 2 and b.edge_index.shape[0] == 2
    return tuple(t.cpu().numpy() for t in (b.srcnodes, b.dstnodes, b.edge_index, b.eids))


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """("ok", fields) or ("error", (type, message)) of a to_block-like call."""
    try:
        res = fn(*args)
    except Exception as e:  # compared across paths, so every exception type counts
        return "error", (type(e), str(e))
    return "ok", block_fields(res) if isinstance(res, Block) else res


def assert_same_outcome(a: tuple[str, Any], b: tuple[str, Any], what: str) -> None:
    assert a[0] == b[0], f"{what}: {a} vs {b}"
    if a[0] == "error":
        assert a[1] == b[1], what
    else:
        assert len(a[1]) == len(b[1]) == 4
        for name, x, y in zip(("srcnodes", "dstnodes", "edge_index", "eids"), a[1], b[1], strict=True):
            assert x.shape == y.shape, f"{what}: {name} shape {x.shape} vs {y.shape}"
            np.testing.assert_array_equal(x, y, err_msg=f"{what}: {name}")


class Counter:
    calls = 0


@contextmanager
def spy(name: str) -> Iterator[Counter]:
    """Count calls of a module-level function of ``block_mod`` (still running it)."""
    counter = Counter()
    fn = getattr(block_mod, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counter.calls += 1
        return fn(*args, **kwargs)

    with mock.patch.object(block_mod, name, wrapper):
        yield counter


def to_block_sort(*args: Any) -> Block:
    """``to_block`` forced onto the sort fallback (every ID is >= the table limit)."""
    with mock.patch.object(block_mod, "_TABLE_LIMIT", 0), spy("_relabel_table") as table:
        b = to_block(*args)
    assert table.calls == 0
    return b


def to_block_compressed(src: Any, dst: Any, dst_nodes: Any, eids: Any = None) -> Block:
    """The table path on any IDs: relabel them to ranks (order and equality kept), map back."""
    allv = np.concatenate([np.asarray(x, dtype=np.int64).reshape(-1) for x in (src, dst, dst_nodes)])
    uniq, inv = np.unique(allv, return_inverse=True)
    n_s, n_d = np.asarray(src).size, np.asarray(dst).size
    c_src, c_dst, c_dn = inv[:n_s], inv[n_s : n_s + n_d], inv[n_s + n_d :]
    with spy("_relabel_sort") as sort:
        try:
            b = to_block(c_src, c_dst, c_dn, eids)
        except InvalidRequestError as e:  # report the original ID, as the other paths do
            m = re.fullmatch(r"edge destination (-?\d+) (.*)", str(e))
            if m is None:
                raise
            raise InvalidRequestError(f"edge destination {uniq[int(m[1])]} {m[2]}") from None
    assert sort.calls == 0
    return Block(
        torch.from_numpy(uniq[b.srcnodes.numpy()]),
        torch.from_numpy(uniq[b.dstnodes.numpy()]),
        b.edge_index,
        b.eids,
    )


# "huge" and "near_int64_max" IDs are all beyond the table limit (sort fallback); "mixed" puts a
# few huge IDs among small ones; "negative" mixes signs. (IDs just under the limit would make the
# table path allocate a 2**26-entry table: see test_to_block_table_limit_boundary instead.)
ID_RANGES: dict[str, st.SearchStrategy[int]] = {
    "small": st.integers(0, 12),
    "medium": st.integers(0, 3000),
    "huge": st.integers(2**27, 2**40),
    "mixed": st.one_of(st.integers(0, 12), st.integers(2**27, 2**27 + 12), st.integers(2**40, 2**40 + 5)),
    "negative": st.integers(-20, 20),
    "near_int64_max": st.integers(2**63 - 50, 2**63 - 1),
}


@st.composite
def graphs(draw: st.DrawFn) -> tuple[str, Edges, str]:
    """(range name, (src, dst, dst_nodes, eids), input kind); sometimes invalid on purpose."""
    name = draw(st.sampled_from(sorted(ID_RANGES)))
    ids = ID_RANGES[name]
    dst_nodes = draw(st.lists(ids, min_size=0, max_size=8, unique=True))
    others = draw(st.lists(ids, min_size=0, max_size=8))
    n_edges = draw(st.integers(0, 16)) if dst_nodes else 0
    pool = dst_nodes + others
    src = [draw(st.sampled_from(pool)) for _ in range(n_edges)] if pool else []
    dst = [draw(st.sampled_from(dst_nodes)) for _ in range(n_edges)]
    fault = draw(st.sampled_from(["none", "none", "dup", "missing", "both"]))
    if fault in ("dup", "both") and dst_nodes:
        dst_nodes.insert(draw(st.integers(0, len(dst_nodes))), draw(st.sampled_from(dst_nodes)))
    if fault in ("missing", "both"):
        bad = draw(ids.filter(lambda v: v not in dst_nodes))
        at = draw(st.integers(0, len(dst)))
        src.insert(at, draw(ids))
        dst.insert(at, bad)
    with_eids = draw(st.booleans())
    eids = np.arange(len(src), dtype=np.int64) * 7 + 3 if with_eids else None
    kind = draw(st.sampled_from(["numpy", "list", "tensor"]))
    arrays = (
        np.array(src, dtype=np.int64),
        np.array(dst, dtype=np.int64),
        np.array(dst_nodes, dtype=np.int64),
        eids,
    )
    return name, arrays, kind


def convert(a: np.ndarray | None, kind: str) -> Any:
    if a is None:
        return None
    return {"numpy": a, "list": a.tolist(), "tensor": torch.from_numpy(a.copy())}[kind]


@settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_to_block_paths_agree(case: tuple[str, Edges, str]) -> None:
    name, arrays, kind = case
    args = tuple(convert(a, kind) for a in arrays)
    want = outcome(reference_block, *arrays)
    lo = min([0] + [int(a.min()) for a in arrays[:3] if a.size])
    hi = max([0] + [int(a.max()) for a in arrays[:3] if a.size])
    table_eligible = lo >= 0 and hi < block_mod._TABLE_LIMIT
    with spy("_relabel_table") as table, spy("_relabel_sort") as sort:
        auto = outcome(to_block, *args)
    # path selection: the table for small non-negative IDs, the sort fallback otherwise
    assert (table.calls, sort.calls) == ((1, 0) if table_eligible else (0, 1)), name
    assert_same_outcome(auto, want, f"auto/{name}")
    assert_same_outcome(outcome(to_block_sort, *args), want, f"sort/{name}")
    assert_same_outcome(outcome(block_mod._to_block_torch, *args), want, f"torch/{name}")
    assert_same_outcome(outcome(to_block_compressed, *arrays), want, f"table-compressed/{name}")
    # the scratch table is left clean, error or not
    table_arr = getattr(block_mod._scratch, "table", None)
    if table_arr is not None:
        assert bool((table_arr == -1).all())


def test_to_block_table_limit_boundary() -> None:
    """IDs on either side of the table limit choose the right path and agree with the reference."""
    rng = np.random.default_rng(5)
    with mock.patch.object(block_mod, "_TABLE_LIMIT", 40):
        for _ in range(60):
            dst_nodes = rng.choice(45, size=int(rng.integers(1, 10)), replace=False)
            n = int(rng.integers(0, 20))
            src = rng.integers(0, 45, n)
            dst = rng.choice(dst_nodes, n)
            hi = max(int(src.max()) if n else 0, int(dst_nodes.max()))
            with spy("_relabel_table") as table:
                got = block_fields(to_block(src, dst, dst_nodes))
            assert table.calls == (1 if hi < 40 else 0)
            for x, y in zip(got, reference_block(src, dst, dst_nodes), strict=True):
                np.testing.assert_array_equal(x, y)


def test_to_block_table_reset_between_calls() -> None:
    """Consecutive calls with overlapping IDs (as sources in one, destinations in the next)."""
    calls = [
        ([5, 6, 7, 5, 9], [1, 2, 1, 3, 3], [3, 2, 1]),
        ([1, 2, 3, 8], [5, 6, 5, 9], [9, 6, 5]),  # previous dsts are now new sources
        ([5, 9, 6, 1, 1], [7, 7, 8, 8, 7], [7, 8]),  # previous srcs/dsts are all new sources
        ([7, 8], [7, 8], [8, 7]),
        ([], [], [1, 2, 3]),
    ]
    for _ in range(2):
        for src, dst, dn in calls:
            got = block_fields(to_block(src, dst, dn))
            for x, y in zip(got, reference_block(src, dst, dn), strict=True):
                np.testing.assert_array_equal(x, y)
            assert bool((block_mod._scratch.table == -1).all())
    # errors part-way through must also leave the table clean for the next call
    with pytest.raises(InvalidRequestError, match="unique"):
        to_block([1], [2], [2, 3, 2])
    with pytest.raises(InvalidRequestError, match="edge destination 4 "):
        to_block([1, 2], [2, 4], [2, 3])
    assert bool((block_mod._scratch.table == -1).all())
    b = to_block([3, 4, 1], [2, 2, 3], [3, 2])
    np.testing.assert_array_equal(b.srcnodes.numpy(), [3, 2, 4, 1])
    np.testing.assert_array_equal(b.edge_index.numpy(), [[0, 2, 3], [1, 1, 0]])


def test_to_block_threads() -> None:
    """Four threads relabelling overlapping IDs at once each get correct blocks."""
    n_threads, n_calls = 4, 150
    cases = []
    rng = np.random.default_rng(11)
    for _ in range(n_threads * n_calls):
        dn = rng.choice(60, size=int(rng.integers(1, 20)), replace=False)
        n = int(rng.integers(0, 60))
        src, dst = rng.integers(0, 60, n), rng.choice(dn, n)
        cases.append((src, dst, dn, reference_block(src, dst, dn)))
    barrier = threading.Barrier(n_threads)
    failures: list[str] = []
    tables: list[int] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(t, len(cases), n_threads):
                src, dst, dn, want = cases[i]
                for x, y in zip(block_fields(to_block(src, dst, dn)), want, strict=True):
                    np.testing.assert_array_equal(x, y)
            tables.append(id(block_mod._scratch.table))
        except Exception as e:
            failures.append(repr(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, to interleave the relabels
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert not failures, failures[:3]
    assert len(set(tables)) == n_threads  # one scratch table per thread


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_block_cuda_matches_cpu() -> None:
    rng = np.random.default_rng(3)
    for hi in (50, 2**40):
        dn = np.unique(rng.integers(0, hi, 20))
        src, dst = rng.integers(0, hi, 100), rng.choice(dn, 100)
        cpu = block_fields(to_block(src, dst, dn))
        b = to_block(*(torch.from_numpy(a).cuda() for a in (src, dst, dn)))
        assert b.srcnodes.is_cuda and b.edge_index.is_cuda and b.eids.is_cuda
        for x, y in zip(block_fields(b)[:3], cpu[:3], strict=True):
            np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------------------------------------
# SAGEConv: sparse CSR aggregation vs gather/index_add
# ------------------------------------------------------------------------------------------------

NUM_DST, NUM_SRC_EXTRA, NUM_EDGES = 12, 20, 70
ISOLATED = (8, 9, 10, 11)  # destination nodes given no in-edges


def make_block(seed: int) -> Block:
    rng = np.random.default_rng(seed)
    dst_nodes = rng.choice(1000, NUM_DST + NUM_SRC_EXTRA, replace=False)
    dst = rng.choice(dst_nodes[: NUM_DST - len(ISOLATED)], NUM_EDGES)
    src = rng.choice(dst_nodes, NUM_EDGES)  # sources among destinations and beyond
    b = to_block(src, dst, dst_nodes[:NUM_DST])
    deg = np.bincount(b.edge_index[1].numpy(), minlength=NUM_DST)
    assert (deg[list(ISOLATED)] == 0).all() and (deg[: NUM_DST - len(ISOLATED)] > 0).all()
    return b


def reference_sage(conv: SAGEConv, block: Block, h: torch.Tensor) -> torch.Tensor:
    """Dense float64 loop implementation of DGL's SAGEConv semantics."""
    h = h.detach().double()
    src, dst = block.edge_index.numpy()
    nd = block.num_dst_nodes()
    agg = torch.zeros(nd, h.shape[1], dtype=torch.float64)
    for d in range(nd):
        nb = h[src[dst == d]]
        if conv.aggregator == "sum":
            agg[d] = nb.sum(0)
        elif conv.aggregator == "mean":
            agg[d] = nb.mean(0) if len(nb) else 0.0
        elif conv.aggregator == "gcn":
            agg[d] = (nb.sum(0) + h[d]) / (len(nb) + 1)
        elif conv.aggregator == "max":
            agg[d] = nb.max(0).values if len(nb) else 0.0
    w_neigh = conv.fc_neigh.weight.detach().double()
    out = agg @ w_neigh.t()
    if conv.fc_self is not None:
        out = out + h[:nd] @ conv.fc_self.weight.detach().double().t()
    if conv.bias is not None:
        out = out + conv.bias.detach().double()
    return out


TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.float64: {"rtol": 1e-10, "atol": 1e-10}}


def make_conv(in_f: int, out_f: int, agg: str, dtype: torch.dtype, seed: int) -> SAGEConv:
    torch.manual_seed(seed)
    conv = SAGEConv(in_f, out_f, aggregator=agg).to(dtype)
    with torch.no_grad():
        conv.bias.uniform_(-1, 1)  # a non-zero bias, so it is checked too
    return conv


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("agg", ["mean", "sum", "gcn"])
def test_sage_sparse_path_matches_gather(agg: str, dtype: torch.dtype) -> None:
    """in_feats <= out_feats: the sparse path runs with grad enabled; outputs and grads agree."""
    for seed in range(3):
        block = make_block(seed)
        conv = make_conv(5, 7, agg, dtype, seed)
        x = torch.randn(block.num_src_nodes(), 5, dtype=dtype, generator=torch.Generator().manual_seed(seed))
        weights = torch.randn(NUM_DST, 7, dtype=dtype)

        with mock.patch.object(sage_mod, "_spmm_aggregate", wraps=sage_mod._spmm_aggregate) as sp:
            conv.zero_grad()
            fast = conv(block, x)
            (fast * weights).sum().backward()
            assert sp.call_count == 1, "sparse path not taken for features without grad"
            fast_grads = {n: p.grad.clone() for n, p in conv.named_parameters()}

            conv.zero_grad()
            x_g = x.clone().requires_grad_(True)
            with mock.patch.object(sage_mod, "SPMM_GRAD", False):  # the gather path, for reference
                slow = conv(block, x_g)
                (slow * weights).sum().backward()
            assert sp.call_count == 1, "sparse path taken for features that need grad with SPMM_GRAD off"
            slow_grads = {n: p.grad.clone() for n, p in conv.named_parameters()}

        assert fast.dtype == slow.dtype == dtype
        torch.testing.assert_close(fast, slow, **TOL[dtype])
        ref = reference_sage(conv, block, x).to(dtype)
        torch.testing.assert_close(fast, ref, **TOL[dtype])
        torch.testing.assert_close(slow, ref, **TOL[dtype])
        assert set(fast_grads) == set(slow_grads) and fast_grads
        for name in fast_grads:
            assert fast_grads[name].abs().sum() > 0, name
            torch.testing.assert_close(fast_grads[name], slow_grads[name], **TOL[dtype], msg=name)
        # destinations without in-edges aggregate to zeros: their output is fc_self(h) + bias
        iso = list(ISOLATED)
        with torch.no_grad():
            lin = conv.fc_neigh if agg == "gcn" else conv.fc_self  # gcn: the node is its own neighbour
            want_iso = lin(x[iso]) + conv.bias
        torch.testing.assert_close(fast[iso], want_iso, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("agg", ["mean", "sum", "gcn", "max"])
def test_sage_no_grad_matches_grad_lin_first(agg: str, dtype: torch.dtype) -> None:
    """in_feats > out_feats (fc_neigh first): CSR products under no_grad, and with grad (SPMM_GRAD)
    equal to the gather path."""
    block = make_block(7)
    conv = make_conv(9, 4, agg, dtype, 7)
    x = torch.randn(block.num_src_nodes(), 9, dtype=dtype)
    with mock.patch.object(sage_mod, "_spmm_aggregate", wraps=sage_mod._spmm_aggregate) as sp:
        with torch.no_grad():
            fast = conv(block, x)
        assert sp.call_count == (0 if agg == "max" else 1)
        with mock.patch.object(sage_mod, "SPMM_GRAD", False):  # the gather path, for reference
            slow = conv(block, x.clone().requires_grad_(True))
        assert sp.call_count == (0 if agg == "max" else 1)
        slow_csr = conv(block, x.clone().requires_grad_(True))  # with grad through CSR products
        assert sp.call_count == (0 if agg == "max" else 2)
    torch.testing.assert_close(slow_csr.detach(), slow.detach(), **TOL[dtype])
    torch.testing.assert_close(fast, slow.detach(), **TOL[dtype])
    torch.testing.assert_close(fast, reference_sage(conv, block, x).to(dtype), **TOL[dtype])


def test_sage_sparse_cache_per_dtype_and_aggregator() -> None:
    """One block reused across dtypes and aggregators (the CSR matrix cache is keyed by both)."""
    block = make_block(1)
    x64 = torch.randn(block.num_src_nodes(), 6, dtype=torch.float64)
    for agg in ("mean", "gcn", "sum", "mean"):
        for dtype in (torch.float64, torch.float32, torch.float64):
            conv = make_conv(6, 6, agg, dtype, 3)
            got = conv(block, x64.to(dtype))
            torch.testing.assert_close(got, reference_sage(conv, block, x64).to(dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("agg", ["mean", "sum", "gcn"])
def test_sage_half_precision_without_grad(agg: str, dtype: torch.dtype) -> None:
    """torch has no CPU sparse CSR product for half types: they must take the gather path."""
    block = make_block(2)
    conv = make_conv(5, 7, agg, dtype, 2)
    x = torch.randn(block.num_src_nodes(), 5).to(dtype)
    with torch.no_grad():
        fast = conv(block, x)
    slow = conv(block, x.clone().requires_grad_(True)).detach()
    assert fast.dtype == dtype
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(fast.double(), reference_sage(conv, block, x), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("agg", ["mean", "sum", "gcn"])
def test_sage_under_cpu_autocast(agg: str) -> None:
    """Under bf16 autocast the sparse product (no bf16 CPU kernel) stays in float32."""
    block = make_block(3)
    conv = make_conv(5, 7, agg, torch.float32, 3)
    x = torch.randn(block.num_src_nodes(), 5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = conv(block, x)
    torch.testing.assert_close(got.double(), reference_sage(conv, block, x.double()), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("agg", ["mean", "sum", "gcn"])
def test_sparse_aggregate_edge_cases(agg: str) -> None:
    """No edges at all, and non-contiguous input features."""
    empty = to_block([], [], [4, 2, 9])
    feat = torch.randn(3, 5, dtype=torch.float64)
    got = sage_mod._spmm_aggregate(empty, feat, agg)
    want = feat if agg == "gcn" else torch.zeros_like(feat)
    torch.testing.assert_close(got, want)

    block = make_block(4)
    base = torch.randn(8, block.num_src_nodes(), dtype=torch.float64)
    feat_t = base.t()  # non-contiguous view
    assert not feat_t.is_contiguous()
    conv = make_conv(8, 8, agg, torch.float64, 2)
    torch.testing.assert_close(conv(block, feat_t), reference_sage(conv, block, feat_t), **TOL[torch.float64])


# ------------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------------


def positive(n: int, dtype: torch.dtype, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """Entries in [0.5, 1.5): never zero, so a zero in the output marks a dropped unit."""
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, dtype=dtype, generator=g) + 0.5
    return x.view(shape) if shape is not None else x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_eval_and_p0_are_identity(dtype: torch.dtype) -> None:
    x = positive(1000, dtype, (20, 50))
    d = Dropout(0.5)
    d.eval()
    assert torch.equal(d(x), x)
    d0 = Dropout(0.0)
    d0.train()
    assert torch.equal(d0(x), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dropout_p1_zeroes_everything(dtype: torch.dtype) -> None:
    d = Dropout(1.0)
    d.train()
    x = positive(500, torch.float32, (10, 50)).to(dtype)
    y = d(x)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, torch.zeros_like(x))
    assert torch.equal(torch.nn.Dropout(1.0)(x), y)  # same contract as nn.Dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.5, 0.2, 0.9])
def test_dropout_rate_and_scaling(p: float, dtype: torch.dtype) -> None:
    n = 100_000
    x = positive(n, dtype, (250, 400))
    d = Dropout(p)
    d.train()
    torch.manual_seed(0)
    y = d(x)
    assert y.shape == x.shape and y.dtype == dtype
    kept = y != 0
    # documented keep probability: 1 - round(p * 2**16) / 2**16 (exactly 0.5 for p = 0.5)
    q = 1 - round(p * 65536) / 65536
    assert abs(q - (1 - p)) <= 2**-17
    sigma = (n * q * (1 - q)) ** 0.5
    assert abs(int(kept.sum()) - n * q) <= 6 * sigma
    # kept units are scaled by 1 / (1 - p); dropped ones are exactly zero
    torch.testing.assert_close(
        y[kept], x[kept] / (1 - p), rtol=2e-7 if dtype == torch.float32 else 1e-15, atol=0
    )
    assert bool((y[~kept] == 0).all())
    # the mask is not structured by position: each half and each column block is near q
    for part in (kept[:125], kept[125:], kept[:, :200], kept[:, 200:]):
        m = part.numel()
        assert abs(int(part.sum()) - m * q) <= 6 * (m * q * (1 - q)) ** 0.5


def test_dropout_reproducible_under_manual_seed() -> None:
    x = positive(10_000, torch.float32, (100, 100))
    d = Dropout(0.5)
    d.train()
    torch.manual_seed(123)
    a1, a2 = d(x), d(x)
    torch.manual_seed(123)
    b1, b2 = d(x), d(x)
    torch.manual_seed(124)
    c1 = d(x)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)  # consecutive calls draw new masks
    assert not torch.equal(a1, c1)  # another seed, another mask
    # in-place gives the same values under the same seed
    di = Dropout(0.5, inplace=True)
    di.train()
    xi = x.clone()
    torch.manual_seed(123)
    yi = di(xi)
    assert torch.equal(yi, a1) and torch.equal(xi, a1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_gradient_is_masked_and_scaled(dtype: torch.dtype) -> None:
    p = 0.3
    x = positive(4000, dtype, (40, 100)).t().requires_grad_(True)  # a non-contiguous input too
    d = Dropout(p)
    d.train()
    y = d(x)
    upstream = torch.randn(y.shape, dtype=dtype)
    y.backward(upstream)
    kept = (y != 0).detach()
    assert 0 < int(kept.sum()) < kept.numel()
    assert x.grad is not None
    want = torch.where(kept, upstream / (1 - p), torch.zeros_like(upstream))
    torch.testing.assert_close(x.grad, want, rtol=2e-7 if dtype == torch.float32 else 1e-15, atol=0)
    torch.testing.assert_close(
        y.detach(),
        torch.where(kept, x.detach() / (1 - p), 0),
        rtol=2e-7 if dtype == torch.float32 else 1e-15,
        atol=0,
    )


def test_dropout_empty_input() -> None:
    d = Dropout(0.5)
    d.train()
    assert d(torch.empty(0, 4)).shape == (0, 4)


# ------------------------------------------------------------------------------------------------
# keyed_rng and sample_partition
# ------------------------------------------------------------------------------------------------


def stream(seed: int | None, part: int, n: int = 64) -> np.ndarray:
    return keyed_rng(seed, part).integers(0, 2**63, n, dtype=np.int64)


def test_keyed_rng_same_key_same_stream() -> None:
    for seed, part in [(0, 0), (1, 0), (0, 1), (12345, 3), (-7, 2), (2**70 + 5, 1), (2**64 - 1, 0)]:
        a = stream(seed, part)
        stream(seed + 1, part + 1)  # another key in between resets the per-thread generator
        b = stream(seed, part)
        np.testing.assert_array_equal(a, b)
        # and the generator's other methods are deterministic too
        r1 = keyed_rng(seed, part).random(5)
        r2 = keyed_rng(seed, part).random(5)
        np.testing.assert_array_equal(r1, r2)


def test_keyed_rng_resets_buffered_uint32() -> None:
    """A half-used 64-bit word (32-bit draws) of the previous key must not leak into the next."""
    want = keyed_rng(5, 0).integers(0, 2**32, 7, dtype=np.uint32)
    keyed_rng(6, 0).integers(0, 2**32, 1, dtype=np.uint32)  # leaves half a word buffered
    np.testing.assert_array_equal(keyed_rng(5, 0).integers(0, 2**32, 7, dtype=np.uint32), want)


def test_keyed_rng_different_keys_different_streams() -> None:
    keys = [(s, p) for s in (0, 1, 2, 3, 2**32, 2**64, 2**64 + 1, -1) for p in range(4)]
    firsts = {k: tuple(stream(*k, n=4)) for k in keys}
    assert len(set(firsts.values())) == len(keys)
    assert firsts[(1, 2)] != firsts[(2, 1)]
    # neighbouring keys are not correlated
    a = keyed_rng(0, 0).random(50_000)
    b = keyed_rng(1, 0).random(50_000)
    c = keyed_rng(0, 1).random(50_000)
    for u in (a, b, c):
        assert abs(u.mean() - 0.5) < 6 * (1 / 12 / u.size) ** 0.5
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / 50_000**0.5
    assert abs(np.corrcoef(a, c)[0, 1]) < 6 / 50_000**0.5


def test_keyed_rng_none_is_fresh_and_threads_are_independent() -> None:
    assert not np.array_equal(stream(None, 0), stream(None, 0))
    want = stream(42, 1, n=40)
    got: dict[str, np.ndarray] = {}
    g = keyed_rng(42, 1)
    head = g.integers(0, 2**63, 20, dtype=np.int64)

    def other() -> None:  # keyed_rng on another thread must not disturb this thread's generator
        got["other"] = stream(42, 1, n=40)
        stream(7, 7)

    th = threading.Thread(target=other)
    th.start()
    th.join()
    tail = g.integers(0, 2**63, 20, dtype=np.int64)
    np.testing.assert_array_equal(np.concatenate([head, tail]), want)
    np.testing.assert_array_equal(got["other"], want)  # same key, same stream on any thread


@pytest.fixture(scope="module")
def sampling_store() -> Iterator[PartitionStore]:
    """Partition 1 of a 2-partition graph: 50 nodes with in-degree 20 (more than the fanout)."""
    book = RangePartitionBook([0, 50, 100], [0, 1000, 2000])
    rng = np.random.default_rng(0)
    indptr = np.arange(0, 1001, 20, dtype=np.int64)
    indices = rng.integers(0, 100, 1000)
    eids = np.arange(1000, 2000, dtype=np.int64)
    store = PartitionStore.create("fastpaths", 1, book, indptr, indices, eids, {}, {}, shared=False)
    yield store
    store.close()


@pytest.mark.parametrize("replace", [False, True])
def test_sample_partition_deterministic(sampling_store: PartitionStore, replace: bool) -> None:
    store = sampling_store
    seeds = np.array([50, 73, 99, 73, 60, 88, 50], dtype=np.int64)
    first = sample_partition(store, seeds, 5, replace, 17)
    other = sample_partition(store, seeds, 5, replace, 18)  # resets the thread's generator
    again = sample_partition(store, seeds, 5, replace, 17)
    assert set(first) == {"src", "dst", "eids"}
    for k in first:
        np.testing.assert_array_equal(first[k], again[k], err_msg=k)
    assert not np.array_equal(first["eids"], other["eids"])
    # sanity: every sampled edge is an in-edge of its destination with its own source
    assert first["eids"].size == 5 * seeds.size
    local_e = first["eids"] - 1000
    local_dst = first["dst"] - 50
    assert ((local_e >= store.indptr[local_dst]) & (local_e < store.indptr[local_dst + 1])).all()
    np.testing.assert_array_equal(store.indices[local_e], first["src"])
    np.testing.assert_array_equal(np.repeat(seeds, 5), first["dst"])
    if not replace:  # distinct edges per seed occurrence
        per_seed = local_e.reshape(seeds.size, 5)
        assert all(np.unique(r).size == 5 for r in per_seed)
    # same key from another thread: same sample
    box: dict[str, dict[str, np.ndarray]] = {}
    th = threading.Thread(target=lambda: box.setdefault("r", sample_partition(store, seeds, 5, replace, 17)))
    th.start()
    th.join()
    for k in first:
        np.testing.assert_array_equal(first[k], box["r"][k], err_msg=k)


def test_keyed_rng_none_in_a_forked_child_is_not_the_parents_stream() -> None:
    """seed=None reuses one entropy-seeded generator per thread and process: a forked child
    must seed its own, or parent and child would sample the same "random" edges."""
    import multiprocessing

    stream(None, 0)  # the parent's generator exists before the fork
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply(stream, (None, 0))
    parent = stream(None, 0)
    assert not np.array_equal(child, parent)
    assert keyed_rng(None, 0) is keyed_rng(None, 3)  # one generator, fresh draws, no re-seeding


def test_sample_partition_same_with_or_without_the_compiled_kernel(
    sampling_store: PartitionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused compiled pass (src, dst and eids gathered in it) equals sample_csc + gathers."""
    from asyncgraph.kernels import compiled

    if compiled.disabled():
        pytest.skip("ASYNCGRAPH_NO_JIT is set")
    assert compiled.wait_ready(120)
    seeds = np.array([50, 73, 99, 73, 60, 88, 50, 51], dtype=np.int64)
    for fanout in (1, 5, 19, 20, 21, 32):
        fast = sample_partition(sampling_store, seeds, fanout, False, 3)
        with monkeypatch.context() as m:
            m.setattr(compiled, "ready", lambda: False)
            slow = sample_partition(sampling_store, seeds, fanout, False, 3)
        for k in ("src", "dst", "eids"):
            np.testing.assert_array_equal(fast[k], slow[k], err_msg=f"{k}, fanout {fanout}")
