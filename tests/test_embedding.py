"""DistEmbedding with SparseAdagrad / SparseAdam: updates run on the owners of the rows.

Kernel tests compare ``apply_sparse_update`` with torch's optimizers on dense rows; API tests
train an embedding served (2 servers) and standalone against a dense torch reference; a
concurrency test runs two trainer processes; rejection tests check typed errors that change
nothing (rows and optimizer state byte-identical).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from workers.sparse_update import SPEC as WORKER_SPEC
from workers.sparse_update import rounds as worker_rounds

import asyncgraph
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    TensorExistsError,
    UnknownTensorError,
)
from asyncgraph.kernels import apply_sparse_update, validate_spec
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage.store import PartitionStore
from asyncgraph.testing import ServerGroup

TOL = 1e-6

ROOT = Path(__file__).resolve().parent.parent


# --- references ------------------------------------------------------------------------------
class RowAdam:
    """Adam applied only to the rows touched in a step, each row with its own step count (DGL)."""

    def __init__(self, w: torch.Tensor, lr: float, betas: tuple[float, float], eps: float) -> None:
        self.w = w.clone()
        self.m = torch.zeros_like(w)
        self.v = torch.zeros_like(w)
        self.t = torch.zeros(w.shape[0], dtype=torch.int64)
        self.lr, self.betas, self.eps = lr, betas, eps

    def step(self, ids: torch.Tensor, grads: torch.Tensor) -> None:
        dense = torch.zeros_like(self.w).index_add_(0, ids, grads)
        rows = torch.unique(ids)
        g = dense[rows]
        b1, b2 = self.betas
        self.t[rows] += 1
        t = self.t[rows].double()
        self.m[rows] = b1 * self.m[rows] + (1 - b1) * g
        self.v[rows] = b2 * self.v[rows] + (1 - b2) * g * g
        bc1 = (1 - b1**t).float().unsqueeze(1)
        bc2 = (1 - b2**t).float().unsqueeze(1)
        self.w[rows] -= self.lr * (self.m[rows] / bc1) / ((self.v[rows] / bc2).sqrt() + self.eps)


def dense_grad(n: int, ids: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    return torch.zeros(n, *grads.shape[1:], dtype=grads.dtype).index_add_(0, ids, grads)


# --- kernel ----------------------------------------------------------------------------------
LO, HI = 10, 30  # the rows partition 1 of the toy store owns


def toy_store(dtype: str = "float32") -> PartitionStore:
    book = RangePartitionBook([0, LO, HI], [0, 0, 0])
    empty = np.empty(0, dtype=np.int64)
    store = PartitionStore.create(
        "toy", 1, book, np.zeros(HI - LO + 1, dtype=np.int64), empty, empty, {}, {}, shared=False
    )
    store.create_tensor("node:w", "node", [HI, 3], dtype, {"kind": "uniform", "low": -1, "high": 1})
    return store


def snapshot(store: PartitionStore) -> dict[str, bytes]:
    return {m.name: store.local_rows(m.name).tobytes() for m in store.list_tensors()}


def steps(seed: int, count: int, *, every_row: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.integers(LO, HI - 4, 25)  # duplicates; the last 4 rows untouched
        if every_row:
            ids = np.concatenate([ids, np.arange(LO, HI)])
        out.append((ids, rng.standard_normal((ids.size, 3)).astype(np.float32)))
    return out


def test_kernel_adagrad_matches_torch_adagrad() -> None:
    store = toy_store()
    w0 = torch.from_numpy(store.local_rows("node:w").copy())
    ref = torch.nn.Parameter(w0.clone())
    opt = torch.optim.Adagrad([ref], lr=0.3, eps=1e-10)
    touched = np.zeros(HI - LO, dtype=bool)
    for ids, grads in steps(1, 5):
        apply_sparse_update(store, "node:w", ids, grads, {"kind": "adagrad", "lr": 0.3})
        ref.grad = dense_grad(HI - LO, torch.from_numpy(ids - LO), torch.from_numpy(grads))
        opt.step()
        touched[ids - LO] = True
    got = store.local_rows("node:w")
    assert 0 < touched.sum() < touched.size
    np.testing.assert_allclose(got, ref.detach().numpy(), rtol=0, atol=TOL)
    np.testing.assert_array_equal(got[~touched], w0.numpy()[~touched])  # untouched: bit-identical
    state = opt.state[ref]["sum"].numpy()
    np.testing.assert_allclose(store.local_rows("node:w#adagrad_state"), state, rtol=1e-6, atol=TOL)


def test_kernel_adam_matches_torch_adam_and_per_row_reference() -> None:
    store = toy_store()
    w0 = torch.from_numpy(store.local_rows("node:w").copy())
    spec = {"kind": "adam", "lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-8}
    # every row touched every step: per-row Adam is torch's dense Adam
    ref = torch.nn.Parameter(w0.clone())
    opt = torch.optim.Adam([ref], lr=0.05, betas=(0.8, 0.99), eps=1e-8)
    for ids, grads in steps(2, 4, every_row=True):
        apply_sparse_update(store, "node:w", ids, grads, spec)
        ref.grad = dense_grad(HI - LO, torch.from_numpy(ids - LO), torch.from_numpy(grads))
        opt.step()
    np.testing.assert_allclose(store.local_rows("node:w"), ref.detach().numpy(), rtol=0, atol=TOL)
    np.testing.assert_array_equal(store.local_rows("node:w#adam_step"), np.full(HI - LO, 4))
    # then sparse steps: untouched rows keep their step count, moments and values
    row_ref = RowAdam(ref.detach(), 0.05, (0.8, 0.99), 1e-8)
    row_ref.t[:] = 4
    row_ref.m[:] = torch.from_numpy(store.local_rows("node:w#adam_m").copy())
    row_ref.v[:] = torch.from_numpy(store.local_rows("node:w#adam_v").copy())
    for ids, grads in steps(3, 4):
        apply_sparse_update(store, "node:w", ids, grads, spec)
        row_ref.step(torch.from_numpy(ids - LO), torch.from_numpy(grads))
    np.testing.assert_allclose(store.local_rows("node:w"), row_ref.w.numpy(), rtol=0, atol=TOL)
    np.testing.assert_array_equal(store.local_rows("node:w#adam_step"), row_ref.t.numpy())
    assert store.tensor_meta("node:w#adam_step").shape == (HI,)


def test_kernel_float64_and_duplicates_accumulate() -> None:
    store = toy_store("float64")
    before = store.local_rows("node:w").copy()
    grads = np.ones((3, 3), dtype=np.float64)
    apply_sparse_update(store, "node:w", np.array([12, 12, 12]), grads, {"kind": "adagrad", "lr": 1.0})
    assert store.tensor_meta("node:w#adagrad_state").dtype == "float64"
    np.testing.assert_array_equal(store.local_rows("node:w#adagrad_state")[2], [9.0, 9.0, 9.0])
    np.testing.assert_allclose(store.local_rows("node:w")[2], before[2] - 1.0, atol=1e-12)  # 3/sqrt(9)
    changed = np.flatnonzero((store.local_rows("node:w") != before).any(axis=1))
    assert changed.tolist() == [2]


def test_kernel_rejections_change_nothing() -> None:
    store = toy_store()
    spec = {"kind": "adam", "lr": 0.1}
    apply_sparse_update(store, "node:w", np.array([11, 12]), np.ones((2, 3), np.float32), spec)
    store.create_tensor("node:ints", "node", [HI, 3], "int64")
    store.create_tensor("node:v#adagrad_state", "node", [HI, 2], "float32")  # clashes with state
    store.create_tensor("node:v", "node", [HI, 3], "float32")
    before = snapshot(store)
    ok_ids, ok_grads = np.array([11, 13]), np.ones((2, 3), np.float32)
    bad: list[tuple[type[Exception], str, Any, Any, Any]] = [
        (UnknownTensorError, "node:nope", ok_ids, ok_grads, spec),
        (DTypeMismatchError, "node:ints", ok_ids, np.ones((2, 3), np.int64), spec),
        (DTypeMismatchError, "node:w", ok_ids, ok_grads.astype(np.float64), spec),
        (ShapeMismatchError, "node:w", ok_ids, np.ones((2, 4), np.float32), spec),
        (ShapeMismatchError, "node:w", ok_ids, np.ones((3, 3), np.float32), spec),
        (ShapeMismatchError, "node:w", ok_ids.reshape(2, 1), ok_grads, spec),
        (DTypeMismatchError, "node:w", ok_ids.astype(np.float32), ok_grads, spec),
        (OutOfRangeError, "node:w", np.array([11, 9]), ok_grads, spec),  # owned by partition 0
        (OutOfRangeError, "node:w", np.array([11, HI]), ok_grads, spec),
        (TensorExistsError, "node:v", ok_ids, ok_grads, {"kind": "adagrad", "lr": 0.1}),
    ]
    bad_specs: list[Any] = [
        None,
        {"kind": "sgd", "lr": 0.1},
        {"kind": "adam"},
        {"kind": "adam", "lr": 0.0},
        {"kind": "adam", "lr": -1},
        {"kind": "adam", "lr": True},
        {"kind": "adam", "lr": float("nan")},
        {"kind": "adam", "lr": "0.1"},
        {"kind": "adam", "lr": 0.1, "eps": 0},
        {"kind": "adam", "lr": 0.1, "betas": (0.9, 1.0)},
        {"kind": "adam", "lr": 0.1, "betas": (-0.1, 0.9)},
        {"kind": "adam", "lr": 0.1, "betas": (0.9,)},
        {"kind": "adagrad", "lr": 0.1, "betas": (0.9, 0.99)},
        {"kind": "adam", "lr": 0.1, "momentum": 0.9},
    ]
    bad += [(InvalidRequestError, "node:w", ok_ids, ok_grads, s) for s in bad_specs]
    for exc, name, ids, grads, sp in bad:
        with pytest.raises(exc):
            apply_sparse_update(store, name, ids, grads, sp)
        assert snapshot(store) == before, (exc, name, sp)
    assert validate_spec({"kind": "adam", "lr": 1}) == {
        "kind": "adam",
        "lr": 1.0,
        "eps": 1e-8,
        "betas": [0.9, 0.999],
    }
    apply_sparse_update(store, "node:w", np.empty(0, np.int64), np.empty((0, 3), np.float32), spec)
    assert snapshot(store) == before


# --- user API, served and standalone ---------------------------------------------------------
def batches(n: int, seed: int, count: int) -> list[torch.Tensor]:
    """ID batches over both partitions (low IDs and high IDs), with duplicates."""
    rng = np.random.default_rng(seed)
    pool = np.concatenate([np.arange(0, 200), np.arange(n - 200, n)])
    return [torch.from_numpy(rng.choice(pool, 120)) for _ in range(count)]


def toy_loss(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    target = torch.sin(ids.double().unsqueeze(1) + torch.arange(rows.shape[1])).float()
    return ((rows - target) ** 2).sum() + rows.sum(dim=1).pow(3).mean()


def run_training(
    emb: asyncgraph.DistEmbedding,
    opt: asyncgraph.SparseAdagrad | asyncgraph.SparseAdam,
    ref_step: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], None],
    ref_weight: torch.Tensor,
    n: int,
) -> np.ndarray:
    """Train both for a few steps (two lookups per step, one shared ID set); return touched mask."""
    touched = np.zeros(n, dtype=bool)
    for step, ids in enumerate(batches(n, 5, 4)):
        other = ids[::3].flip(0)
        if step % 2 == 0:
            opt.zero_grad()  # before the forward pass ...
        loss = toy_loss(emb(ids), ids) + toy_loss(emb(other), other)
        if step % 2 == 1:
            opt.zero_grad()  # ... or between forward and backward: both work, as in torch
        loss.backward()
        with torch.no_grad():
            untraced = emb(ids[:5])  # no_grad lookups are not traced
        assert not untraced.requires_grad and len(emb.trace) == 2
        if step == 0:  # a lookup whose result is not used in the loss has no grad: skipped
            emb(torch.tensor([7]))
        opt.step()
        assert emb.trace == []
        leaf = ref_weight.detach().requires_grad_(True)
        ref_loss = toy_loss(leaf[ids], ids) + toy_loss(leaf[other], other)
        ref_loss.backward()
        assert leaf.grad is not None
        ref_step([(torch.unique(ids), leaf.grad)])
        touched[ids.numpy()] = True
    return touched


def test_sparse_adagrad_trains_like_dense_torch(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    mode = "standalone" if asyncgraph.is_standalone() else "served"
    emb = asyncgraph.DistEmbedding(n, 4, name=f"emb_ada_{mode}")
    assert emb.shape == (n, 4) and emb.key == f"node:emb_ada_{mode}"
    w0 = emb.weight[0:n].clone()
    assert -1 <= float(w0.min()) < -0.9 and 0.9 < float(w0.max()) <= 1  # uniform(-1, 1) default
    opt = asyncgraph.SparseAdagrad([emb], lr=0.05)
    ref = torch.nn.Embedding(n, 4)
    ref.weight.data.copy_(w0)
    ref_opt = torch.optim.Adagrad(ref.parameters(), lr=0.05, eps=1e-10)

    def ref_step(grads: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        ref.weight.grad = grads[0][1]
        ref_opt.step()

    touched = run_training(emb, opt, ref_step, ref.weight.data, n)
    got = emb.weight[0:n].numpy()
    np.testing.assert_allclose(got, ref.weight.data.numpy(), rtol=0, atol=TOL)
    np.testing.assert_array_equal(got[~touched], w0.numpy()[~touched])
    assert 0 < touched.sum() < n
    state = g.client.pull(f"node:emb_ada_{mode}#adagrad_state", np.arange(n)).numpy()
    np.testing.assert_allclose(state, ref_opt.state[ref.weight]["sum"].numpy(), rtol=1e-6, atol=TOL)
    rows = emb(torch.tensor([1, 2, n - 1]))
    rows.sum().backward()
    opt.zero_grad()  # after backward: the gradients are dropped, step() sends nothing
    opt.step()
    assert emb.trace == []
    np.testing.assert_array_equal(emb.weight[0:n].numpy(), got)


def test_sparse_adam_trains_like_per_row_adam(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    mode = "standalone" if asyncgraph.is_standalone() else "served"
    emb = asyncgraph.DistEmbedding(n, 3, name=f"emb_adam_{mode}", init_func=asyncgraph.normal_init(0, 0.5, 3))
    w0 = emb.weight[0:n].clone()
    opt = asyncgraph.SparseAdam([emb], lr=0.01, betas=(0.85, 0.995), eps=1e-8)
    ref = RowAdam(w0, 0.01, (0.85, 0.995), 1e-8)

    def ref_step(grads: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        rows, dense = grads[0]
        ref.step(rows, dense[rows])

    touched = run_training(emb, opt, ref_step, ref.w, n)
    got = emb.weight[0:n].numpy()
    np.testing.assert_allclose(got, ref.w.numpy(), rtol=0, atol=TOL)
    np.testing.assert_array_equal(got[~touched], w0.numpy()[~touched])
    steps = g.client.pull(f"node:emb_adam_{mode}#adam_step", np.arange(n)).numpy()
    np.testing.assert_array_equal(steps, ref.t.numpy())
    assert int(steps.max()) >= 2  # some rows were touched in several steps


def test_client_sparse_update_rejections_change_nothing(g: asyncgraph.DistGraph) -> None:
    n = g.num_nodes()
    client = g.client
    mode = "standalone" if asyncgraph.is_standalone() else "served"
    emb = asyncgraph.DistEmbedding(n, 2, name=f"emb_bad_{mode}")
    opt = asyncgraph.SparseAdam([emb], lr=0.1)
    rows = emb(torch.tensor([0, n - 1]))
    rows.sum().backward()
    opt.step()  # state exists and is non-zero
    names = [emb.key, *(emb.key + s for s in ("#adam_m", "#adam_v", "#adam_step"))]
    everything = np.arange(n)

    def state() -> list[bytes]:
        return [client.pull(name, everything).numpy().tobytes() for name in names]

    before = state()
    ids = np.array([1, n - 2])
    grads = np.ones((2, 2), np.float32)
    spec = {"kind": "adam", "lr": 0.1}
    cases: list[tuple[type[Exception], str, Any, Any, Any]] = [
        (ShapeMismatchError, emb.key, ids, np.ones((2, 3), np.float32), spec),
        (ShapeMismatchError, emb.key, ids, np.ones((3, 2), np.float32), spec),
        (DTypeMismatchError, emb.key, ids, grads.astype(np.float64), spec),
        (OutOfRangeError, emb.key, np.array([1, n]), grads, spec),
        (OutOfRangeError, emb.key, np.array([-1, 5]), grads, spec),
        (UnknownTensorError, "node:no_such", ids, grads, spec),
        (DTypeMismatchError, "node:label", ids, grads, spec),
        (InvalidRequestError, emb.key, ids, grads, {"kind": "adam", "lr": -0.1}),
        (InvalidRequestError, emb.key, ids, grads, {"kind": "rmsprop", "lr": 0.1}),
        (InvalidRequestError, emb.key, ids, grads, {"kind": "adam", "lr": 0.1, "betas": [1, 0]}),
    ]
    for exc, name, i, gr, sp in cases:
        with pytest.raises(exc):
            client.sparse_update(name, i, gr, sp)
    with pytest.raises(InvalidRequestError):
        asyncgraph.SparseAdam([emb], lr=0)
    with pytest.raises(InvalidRequestError):
        asyncgraph.SparseAdagrad([emb, emb], lr=0.1)
    conn = client.aio.connections[0] if client.aio.connections else None
    if conn is not None:  # the server validates too (a client that skipped validation)
        server_cases: list[tuple[type[Exception], dict[str, Any]]] = [
            (OutOfRangeError, {"ids": np.array([n - 1])}),
            (DTypeMismatchError, {"grads": grads.astype(np.float64)}),
            (ShapeMismatchError, {"grads": np.ones((2, 5), np.float32)}),
            (InvalidRequestError, {"spec": {"kind": "adam", "lr": 0.1, "eps": -1.0}}),
            (InvalidRequestError, {"spec": [1, 2]}),
        ]
        for exc, override in server_cases:
            args = {"name": emb.key, "ids": np.array([1, 2]), "grads": grads, "spec": spec, **override}
            with pytest.raises(exc):
                client.loop.run(conn.call("sparse_update", args, 10.0))
    assert state() == before


def test_two_processes_update_disjoint_rows_concurrently(served: ServerGroup) -> None:
    asyncgraph.initialize(served.ip_config())
    try:
        client = asyncgraph.DistGraph("pubmed").client
        n = client.book.num_nodes
        client.create_tensor("node:conc", "node", [n, 2], "float32", asyncgraph.uniform_init(-1, 1, 9))
        rows = np.concatenate([np.arange(0, 64), np.arange(n - 64, n)])
        w0 = client.pull("node:conc", rows).numpy()
        count = 30
        script = ROOT / "tests" / "workers" / "sparse_update.py"
        args = [(1, 0, "1"), (2, 1, "0")]  # (seed, parity, shared memory)
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(served.ip_config()), str(count), str(s), str(p), shm],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for s, p, shm in args
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
        # disjoint rows: the interleaving does not matter, and dense Adagrad leaves rows whose
        # gradient is zero untouched, so one dense optimizer replaying both workers is exact
        position = np.full(n, -1)
        position[rows] = np.arange(rows.size)
        ref = torch.nn.Parameter(torch.from_numpy(w0.copy()))
        ref_opt = torch.optim.Adagrad([ref], lr=WORKER_SPEC["lr"], eps=WORKER_SPEC["eps"])
        for s, p, _ in args:
            for ids, grads in worker_rounds(n, p, s, count):
                ref.grad = dense_grad(rows.size, torch.from_numpy(position[ids]), torch.from_numpy(grads))
                ref_opt.step()
        got = client.pull("node:conc", rows).numpy()
        np.testing.assert_allclose(got, ref.detach().numpy(), rtol=0, atol=TOL)
        assert (got != w0).all(axis=1).sum() > 100  # both workers' rows moved
    finally:
        asyncgraph.finalize()
