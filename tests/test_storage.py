"""Storage layer: memfd shared arrays, the cross-process RW lock, PartitionStore, fd passing.

Fixtures are built from small numpy arrays (no partition files needed). Cross-process tests use
``subprocess`` with a small script, passing fds either by inheritance (``pass_fds``) or through
``FdExporter`` + ``attach_store`` with the exporter's event loop running in a background thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from asyncgraph.errors import (
    AuthenticationError,
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ServerUnavailableError,
    ShapeMismatchError,
    TensorExistsError,
    UnknownTensorError,
)
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.storage import (
    AttachedStore,
    FdExporter,
    LocalRWLock,
    PartitionStore,
    SharedArray,
    SharedRWLock,
    TensorMeta,
    attach_store,
    export,
    fetch_tensors,
)

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# A 3-partition graph: 15 nodes, 30 edges; the store under test is partition 1.
NODE_BOUNDS = [0, 4, 10, 15]
EDGE_BOUNDS = [0, 6, 20, 30]
PART = 1


def make_store(shared: bool = True, part_id: int = PART, graph: str = "toy") -> PartitionStore:
    """Partition ``part_id`` of the toy graph with node:feat (float32 x3) and edge:w (float64)."""
    book = RangePartitionBook(NODE_BOUNDS, EDGE_BOUNDS)
    n_lo, n_hi = book.node_range(part_id)
    e_lo, e_hi = book.edge_range(part_id)
    n, e = n_hi - n_lo, e_hi - e_lo
    rng = np.random.default_rng(part_id)
    counts = np.full(n, e // max(n, 1))
    counts[-1] += e - counts.sum()
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = rng.integers(0, book.num_nodes, e)
    eids = np.arange(e_lo, e_hi)
    feat = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 100 * n_lo
    w = np.arange(e, dtype=np.float64) + 0.5
    return PartitionStore.create(
        graph, part_id, book, indptr, indices, eids, {"feat": feat}, {"w": w}, shared=shared
    )


def snapshot(store: PartitionStore) -> tuple[list[TensorMeta], dict[str, bytes]]:
    metas = sorted(store.list_tensors(), key=lambda m: m.name)
    return metas, {m.name: store.local_rows(m.name).tobytes() for m in metas}


def fd_count(settle: float = 2.0) -> int:
    """Open fds of this process, once the exporter thread's sockets have settled.

    The exporter serves each fetch on a worker thread of this same process and closes its
    sockets just after the client has its reply, so an immediate count can include them.
    """
    deadline = time.monotonic() + settle
    count = len(os.listdir("/proc/self/fd"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
        again = len(os.listdir("/proc/self/fd"))
        if again == count:
            return count
        count = again
    return count


def run_child(code: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start ``python -c code args...`` with asyncgraph importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        **kw,
    )


class ExporterThread:
    """An FdExporter whose event loop runs in a background thread (like a server's)."""

    def __init__(self, store: PartitionStore, label: str = "toy.p1") -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.exporter = FdExporter(store, label=label)
        self.run(self.exporter.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the loop thread (where a server mutates its store)."""

        async def wrap() -> T:
            return fn()

        return self.run(wrap())

    def close(self) -> None:
        self.run(self.exporter.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def exported() -> Iterator[ExporterThread]:
    store = make_store(shared=True)
    ex = ExporterThread(store)
    try:
        yield ex
    finally:
        ex.close()
        store.close()


# --- SharedArray ----------------------------------------------------------------------------
def test_shared_array_visible_and_writable_from_another_process() -> None:
    sa = SharedArray.create("asyncgraph.test.arr", (5, 4), "float32")
    sa.array[...] = np.arange(20, dtype=np.float32).reshape(5, 4)
    os.set_inheritable(sa.fd, True)
    child = run_child(
        """
        import sys
        import numpy as np
        from asyncgraph.storage.memfd import SharedArray
        sa = SharedArray.from_fd(int(sys.argv[1]), (5, 4), "float32")
        print(float(sa.array.sum()))
        sa.array[2] += 1000
        sa.array[4, 3] = -1
        sa.close()
        """,
        str(sa.fd),
        pass_fds=(sa.fd,),
    )
    out, _ = child.communicate(timeout=20)
    assert child.returncode == 0
    assert float(out.strip()) == float(np.arange(20).sum())
    expect = np.arange(20, dtype=np.float32).reshape(5, 4)
    expect[2] += 1000
    expect[4, 3] = -1
    np.testing.assert_array_equal(sa.array, expect)
    sa.close()


def test_shared_array_read_only_mapping_and_size_check() -> None:
    sa = SharedArray.create("asyncgraph.test.ro", (3,), "int64")
    ro = SharedArray.from_fd(os.dup(sa.fd), (3,), "int64", writable=False)
    sa.array[1] = 7
    assert ro.array[1] == 7
    assert not ro.array.flags.writeable
    with pytest.raises(ValueError):
        ro.array[0] = 1
    with pytest.raises(InvalidRequestError, match="needs"):
        SharedArray.from_fd(os.dup(sa.fd), (4,), "int64")  # larger than the memfd
    # the size is sealed: nobody can truncate it under a mapping (SIGBUS)
    with pytest.raises(PermissionError):
        os.ftruncate(sa.fd, 0)
    ro.close()
    sa.close()
    sa.close()  # idempotent
    with pytest.raises(InvalidRequestError):
        _ = sa.array


@pytest.mark.parametrize("shape", [(0,), (0, 8), (5, 0), (0, 0, 3)])
def test_zero_size_shared_arrays(shape: tuple[int, ...]) -> None:
    sa = SharedArray.create("asyncgraph.test.empty", shape, "float32")
    assert sa.array.shape == shape
    other = SharedArray.from_fd(os.dup(sa.fd), shape, "float32")
    assert other.array.shape == shape and other.array.size == 0
    other.close()
    sa.close()


def test_zero_size_partition_store() -> None:
    # partition 1 of this book owns no nodes and no edges
    book = RangePartitionBook([0, 5, 5, 8], [0, 3, 3, 9])
    store = PartitionStore.create(
        "empty",
        1,
        book,
        np.zeros(1, np.int64),
        np.empty(0, np.int64),
        np.empty(0, np.int64),
        {"feat": np.empty((0, 4), np.float32)},
        {},
    )
    store.create_tensor("node:emb", "node", [8, 2], "float32", {"kind": "normal", "seed": 1})
    assert store.pull("node:feat", np.empty(0, np.int64)).shape == (0, 4)
    store.push("node:emb", np.empty(0, np.int64), np.empty((0, 2), np.float32), op="add")
    with pytest.raises(OutOfRangeError, match=r"owns \[5, 5\)"):
        store.pull("node:feat", np.array([5]))
    desc, fds = export(store, None, structure=True)
    client = AttachedStore.attach(desc, [os.dup(fd) for fd in fds])
    assert client.pull("node:emb", np.empty(0, np.int32)).shape == (0, 2)
    client.close()
    store.close()


def test_nothing_appears_in_dev_shm(exported: ExporterThread) -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    store = make_store(shared=True, graph="devshm")
    store.create_tensor("node:x", "node", [15, 2], "float32")
    client = attach_store(exported.exporter.address, exported.exporter.token)
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert after == before
    # the memory is visible only as anonymous memfds
    target = os.readlink(f"/proc/self/fd/{export(store, None, structure=True)[1][1]}")
    assert target.startswith("/memfd:asyncgraph.devshm.p1.indptr")
    client.close()
    store.close()


# --- PartitionStore: data access -------------------------------------------------------------
@pytest.mark.parametrize("shared", [True, False])
def test_structure_and_initial_tensors(shared: bool) -> None:
    store = make_store(shared)
    assert store.node_range == (4, 10) and store.edge_range == (6, 20)
    assert store.indptr.shape == (7,) and store.indices.shape == (14,) and store.eids[0] == 6
    assert not store.indptr.flags.writeable and not store.indices.flags.writeable
    assert {m.name: m for m in store.list_tensors()} == {
        "node:feat": TensorMeta("node:feat", "node", (15, 3), "float32"),
        "edge:w": TensorMeta("edge:w", "edge", (30,), "float64"),
    }
    meta = store.tensor_meta("edge:w")
    assert TensorMeta.from_dict(meta.to_dict()) == meta
    np.testing.assert_array_equal(store.pull("edge:w", np.array([19, 6])), [13.5, 0.5])
    store.close()
    with pytest.raises(InvalidRequestError, match="closed"):
        store.pull("node:feat", np.array([4]))


@pytest.mark.parametrize("shared", [True, False])
def test_pull_push_semantics(shared: bool) -> None:
    store = make_store(shared)
    feat = store.local_rows("node:feat").copy()
    # pull: any int dtype, duplicates, empty, returns a new array
    for dt in (np.int64, np.int32, np.uint16, np.uint64):
        ids = np.array([9, 4, 4, 7], dtype=dt)
        got = store.pull("node:feat", ids)
        np.testing.assert_array_equal(got, feat[[5, 0, 0, 3]])
    got = store.pull("node:feat", np.array([4]))
    got[:] = -5
    np.testing.assert_array_equal(store.local_rows("node:feat"), feat)  # a copy, not a view
    assert store.pull("node:feat", np.array([], dtype=np.int64)).shape == (0, 3)
    assert store.pull("node:feat", np.array([])).shape == (0, 3)  # empty float array is fine

    # assign: duplicates -> last wins
    ids = np.array([5, 8, 5, 5], dtype=np.int32)
    vals = np.arange(12, dtype=np.float32).reshape(4, 3)
    store.push("node:feat", ids, vals)
    expect = feat.copy()
    expect[1] = vals[3]
    expect[4] = vals[1]
    np.testing.assert_array_equal(store.local_rows("node:feat"), expect)

    # add: duplicates accumulate
    store.push("node:feat", np.array([6, 6, 6, 9]), np.ones((4, 3), np.float32), op="add")
    expect[2] += 3
    expect[5] += 1
    np.testing.assert_array_equal(store.local_rows("node:feat"), expect)

    # 1-D tensor, edge policy
    store.push("edge:w", np.array([10, 10, 19]), np.array([1.0, 2.0, 3.0]), op="add")
    w = store.pull("edge:w", np.array([10, 19]))
    np.testing.assert_array_equal(w, [4.5 + 3.0, 13.5 + 3.0])
    store.push("edge:w", np.array([], np.int64), np.array([], np.float64))  # empty push is a no-op
    store.close()


def test_add_matches_reference_on_large_random_duplicates() -> None:
    book = RangePartitionBook([0, 3000], [0, 0])
    store = PartitionStore.create(
        "big", 0, book, np.zeros(3001, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), {}, {}
    )
    store.create_tensor("node:h", "node", [3000, 300], "float64")
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, 20000)  # heavy duplicates, several add.at chunks
    vals = rng.standard_normal((20000, 300))
    store.push("node:h", ids, vals, op="add")
    ref = np.zeros((3000, 300))
    np.add.at(ref, ids, vals)
    np.testing.assert_allclose(store.local_rows("node:h"), ref, rtol=1e-12, atol=1e-9)
    # assign with duplicates: last occurrence wins
    store.push("node:h", ids, vals)
    last = {int(i): k for k, i in enumerate(ids)}
    keys = np.array(sorted(last))
    np.testing.assert_array_equal(store.pull("node:h", keys), vals[[last[k] for k in keys]])
    store.close()


# --- PartitionStore: rejections change nothing -------------------------------------------------
F32 = np.float32
BAD_REQUESTS: list[tuple[str, Callable[[PartitionStore], Any], type[Exception], list[str]]] = [
    (
        "pull id above range",
        lambda s: s.pull("node:feat", np.array([5, 10])),
        OutOfRangeError,
        ["10", "[4, 10)", "partition 1"],
    ),
    ("pull id below range", lambda s: s.pull("node:feat", np.array([3])), OutOfRangeError, ["3", "[4, 10)"]),
    ("pull negative id", lambda s: s.pull("edge:w", np.array([-1, 7])), OutOfRangeError, ["-1", "[6, 20)"]),
    ("pull float ids", lambda s: s.pull("node:feat", np.array([5.0])), DTypeMismatchError, ["float64"]),
    ("pull bool ids", lambda s: s.pull("node:feat", np.array([True])), DTypeMismatchError, ["bool"]),
    ("pull 2-D ids", lambda s: s.pull("node:feat", np.array([[5, 6]])), ShapeMismatchError, ["(1, 2)"]),
    (
        "pull unknown tensor",
        lambda s: s.pull("node:nope", np.array([5])),
        UnknownTensorError,
        ["node:nope", "node:feat", "edge:w"],
    ),
    (
        "push id above range",
        lambda s: s.push("node:feat", np.array([5, 12]), np.ones((2, 3), F32)),
        OutOfRangeError,
        ["12", "[4, 10)"],
    ),
    (
        "push negative id",
        lambda s: s.push("node:feat", np.array([-3, 5]), np.ones((2, 3), F32), "add"),
        OutOfRangeError,
        ["-3"],
    ),
    (
        "push float ids",
        lambda s: s.push("node:feat", np.array([5.5]), np.ones((1, 3), F32)),
        DTypeMismatchError,
        ["float64"],
    ),
    (
        "push 2-D ids",
        lambda s: s.push("node:feat", np.array([[5]]), np.ones((1, 3), F32)),
        ShapeMismatchError,
        ["(1, 1)"],
    ),
    (
        "push wrong dtype",
        lambda s: s.push("node:feat", np.array([5]), np.ones((1, 3))),
        DTypeMismatchError,
        ["float64", "float32"],
    ),
    (
        "push wrong row shape",
        lambda s: s.push("node:feat", np.array([5]), np.ones((1, 4), F32)),
        ShapeMismatchError,
        ["(1, 4)", "(1, 3)"],
    ),
    (
        "push wrong length",
        lambda s: s.push("node:feat", np.array([5, 6]), np.ones((3, 3), F32), "add"),
        ShapeMismatchError,
        ["(3, 3)", "(2, 3)"],
    ),
    (
        "push unknown tensor",
        lambda s: s.push("edge:nope", np.array([7]), np.ones(1)),
        UnknownTensorError,
        ["edge:nope"],
    ),
    (
        "push unknown op",
        lambda s: s.push("node:feat", np.array([5]), np.ones((1, 3), F32), "mul"),
        InvalidRequestError,
        ["'mul'", "assign", "add"],
    ),
    (
        "create shape mismatch",
        lambda s: s.create_tensor("node:feat", "node", [15, 4], "float32"),
        TensorExistsError,
        ["node:feat", "[15, 3]", "[15, 4]"],
    ),
    (
        "create dtype mismatch",
        lambda s: s.create_tensor("node:feat", "node", [15, 3], "float64"),
        TensorExistsError,
        ["float32", "float64"],
    ),
    (
        "create policy mismatch",
        lambda s: s.create_tensor("edge:w", "node", [15], "float64"),
        TensorExistsError,
        ["policy=edge", "policy=node"],
    ),
    (
        "create wrong shape[0]",
        lambda s: s.create_tensor("node:x", "node", [16, 2], "float32"),
        ShapeMismatchError,
        ["[16, 2]", "15"],
    ),
    (
        "create edge wrong shape[0]",
        lambda s: s.create_tensor("edge:x", "edge", [15], "float32"),
        ShapeMismatchError,
        ["30"],
    ),
    (
        "create empty shape",
        lambda s: s.create_tensor("node:x", "node", [], "float32"),
        ShapeMismatchError,
        ["[]"],
    ),
    (
        "create float shape",
        lambda s: s.create_tensor("node:x", "node", [15.0], "float32"),  # type: ignore[list-item]
        ShapeMismatchError,
        ["integers"],
    ),
    (
        "create object dtype",
        lambda s: s.create_tensor("node:x", "node", [15], "object"),
        DTypeMismatchError,
        ["object"],
    ),
    (
        "create string dtype",
        lambda s: s.create_tensor("node:x", "node", [15], "U4"),
        DTypeMismatchError,
        ["<U4"],
    ),
    (
        "create unknown dtype",
        lambda s: s.create_tensor("node:x", "node", [15], "float33"),
        DTypeMismatchError,
        ["float33"],
    ),
    (
        "create big-endian dtype",
        lambda s: s.create_tensor("node:x", "node", [15], ">f4"),
        DTypeMismatchError,
        ["byte order"],
    ),
    (
        "create bad policy",
        lambda s: s.create_tensor("node:x", "graph", [15], "float32"),  # type: ignore[arg-type]
        InvalidRequestError,
        ["'graph'"],
    ),
    (
        "init unknown kind",
        lambda s: s.create_tensor("node:x", "node", [15], "float32", {"kind": "xavier"}),
        InvalidRequestError,
        ["xavier", "uniform"],
    ),
    (
        "init no kind",
        lambda s: s.create_tensor("node:x", "node", [15], "float32", {"seed": 1}),
        InvalidRequestError,
        ["None"],
    ),
    (
        "init unknown param",
        lambda s: s.create_tensor("node:x", "node", [15], "float32", {"kind": "uniform", "lo": 0.0}),
        InvalidRequestError,
        ["'lo'", "high"],
    ),
    (
        "init zeros with param",
        lambda s: s.create_tensor("node:x", "node", [15], "float32", {"kind": "zeros", "seed": 1}),
        InvalidRequestError,
        ["seed"],
    ),
    (
        "init float seed",
        lambda s: s.create_tensor("node:x", "node", [15], "float32", {"kind": "normal", "seed": 1.5}),
        InvalidRequestError,
        ["seed", "1.5"],
    ),
    (
        "init negative std",
        lambda s: s.create_tensor(
            "node:x", "node", [15], "float32", {"kind": "normal", "std": -1.0, "seed": 0}
        ),
        InvalidRequestError,
        ["std"],
    ),
    (
        "init low > high",
        lambda s: s.create_tensor(
            "node:x", "node", [15], "float32", {"kind": "uniform", "low": 2, "high": 1, "seed": 0}
        ),
        InvalidRequestError,
        ["low"],
    ),
    (
        "init nan",
        lambda s: s.create_tensor(
            "node:x", "node", [15], "float32", {"kind": "normal", "mean": float("nan"), "seed": 0}
        ),
        InvalidRequestError,
        ["mean"],
    ),
    (
        "init not a mapping",
        lambda s: s.create_tensor("node:x", "node", [15], "float32", "zeros"),  # type: ignore[arg-type]
        InvalidRequestError,
        ["mapping"],
    ),
    (
        "random init of ints",
        lambda s: s.create_tensor("node:x", "node", [15], "int32", {"kind": "uniform", "seed": 0}),
        DTypeMismatchError,
        ["int32"],
    ),
    (
        "delete unknown",
        lambda s: s.delete_tensor("node:nope"),
        UnknownTensorError,
        ["node:nope", "node:feat"],
    ),
    ("meta unknown", lambda s: s.tensor_meta("edge:nope"), UnknownTensorError, ["edge:nope", "edge:w"]),
]


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(("case", "call", "exc", "words"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_rejections_are_typed_helpful_and_change_nothing(
    shared: bool, case: str, call: Callable[[PartitionStore], Any], exc: type[Exception], words: list[str]
) -> None:
    store = make_store(shared)
    store.push("node:feat", np.array([4, 9]), np.full((2, 3), 7, F32))
    before = snapshot(store)
    with pytest.raises(exc) as info:
        call(store)
    assert isinstance(info.value, InvalidRequestError)
    message = str(info.value)
    for word in words:
        assert word in message, f"{case}: {word!r} not in {message!r}"
    assert snapshot(store) == before
    store.close()


def test_create_tensor_is_idempotent_and_validates_before_creating() -> None:
    store = make_store(shared=True)
    meta = store.create_tensor("node:emb", "node", (15, 2), "float32", {"kind": "uniform", "seed": 3})
    assert meta == TensorMeta("node:emb", "node", (15, 2), "float32")
    store.push("node:emb", np.array([5]), np.array([[9, 9]], F32))
    before = snapshot(store)
    # same spec (any init, numpy ints in shape, np.dtype spelling) -> existing meta, data untouched
    again = store.create_tensor("node:emb", "node", [np.int64(15), 2], "float32", {"kind": "zeros"})  # type: ignore[list-item]
    assert again == meta
    assert snapshot(store) == before
    store.create_tensor("edge:flag", "edge", [30], "bool")
    store.push("edge:flag", np.array([7, 7]), np.array([True, True]), op="add")
    assert store.pull("edge:flag", np.array([6, 7])).tolist() == [False, True]
    store.delete_tensor("node:emb")
    assert not store.has_tensor("node:emb")
    store.create_tensor("node:emb", "node", (15, 5), "float64")  # recreated with another shape
    assert store.pull("node:emb", np.array([5])).shape == (1, 5)
    store.close()


@pytest.mark.parametrize("kind", ["uniform", "normal"])
def test_seeded_init_is_independent_of_partitioning(kind: str) -> None:
    n = 10_000
    init = {"kind": kind, "seed": 42}

    def global_tensor(node_bounds: list[int], shared: bool) -> np.ndarray:
        book = RangePartitionBook(node_bounds, [0] * len(node_bounds))
        parts = []
        for p in range(book.num_partitions()):
            lo, hi = book.node_range(p)
            empty = np.empty(0, np.int64)
            store = PartitionStore.create(
                "g", p, book, np.zeros(hi - lo + 1, np.int64), empty, empty, {}, {}, shared=shared
            )
            store.create_tensor("node:emb", "node", [n, 3, 2], "float32", init)
            parts.append(store.local_rows("node:emb").copy())
            store.close()
        return np.concatenate(parts)

    one = global_tensor([0, n], shared=False)
    three = global_tensor([0, 3000, 6500, n], shared=True)
    uneven = global_tensor([0, 1, 4097, 4100, 9999, n], shared=False)
    np.testing.assert_array_equal(one, three)
    np.testing.assert_array_equal(one, uneven)
    assert one.shape == (n, 3, 2) and one.dtype == np.float32
    if kind == "uniform":
        assert one.min() >= 0.0 and one.max() < 1.0
    else:
        assert abs(float(one.mean())) < 0.05 and abs(float(one.std()) - 1.0) < 0.05
    assert len(np.unique(one)) > 0.99 * one.size  # rows of different blocks differ
    book = RangePartitionBook([0, n], [0, 0])
    empty = np.empty(0, np.int64)
    other = PartitionStore.create("g", 0, book, np.zeros(n + 1, np.int64), empty, empty, {}, {}, shared=False)
    other.create_tensor("node:emb", "node", [n, 3, 2], "float32", {"kind": kind, "seed": 43})
    assert not np.array_equal(other.local_rows("node:emb"), one)


# --- locks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("make_lock", [LocalRWLock, lambda: SharedRWLock.create("asyncgraph.test.lock")])
def test_rw_lock_threads(make_lock: Callable[[], LocalRWLock]) -> None:
    lock = make_lock()
    events: list[str] = []
    # re-entrancy: read in read, read in write, write in write
    with lock.read(), lock.read():
        pass
    with lock.write(), lock.read(), lock.write():
        pass
    with lock.read(), pytest.raises(RuntimeError, match="read lock"), lock.write():
        pass
    # a writer excludes readers of other threads
    entered = threading.Event()

    def reader() -> None:
        with lock.read():
            events.append("read")
        entered.set()

    with lock.write():
        t = threading.Thread(target=reader)
        t.start()
        assert not entered.wait(0.2)
        events.append("write-done")
    t.join(5)
    assert events == ["write-done", "read"]
    if isinstance(lock, SharedRWLock):
        lock.close()


def test_shared_rw_lock_excludes_other_descriptions_and_forked_children() -> None:
    lock = SharedRWLock.create("asyncgraph.test.fork")
    other = SharedRWLock.from_fd(os.dup(lock.fd))  # own open file description, like another process
    with lock.read():
        fcntl.flock(other.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # readers share
        fcntl.flock(other.fd, fcntl.LOCK_UN)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pid = os.fork()
        if pid == 0:  # child: the at-fork hook re-opened the lock, so the parent's SH excludes EX
            try:
                fcntl.flock(lock.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os._exit(1)
            except BlockingIOError:
                os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    other.close()
    lock.close()


CHILD_HOLD_WRITE = """
    import sys, time
    from asyncgraph.storage.fdpass import attach_store
    store = attach_store(sys.argv[1], bytes.fromhex(sys.argv[2]))
    with store.lock.write():
        print("locked", flush=True)
        time.sleep(60)
"""


def test_sigkill_of_write_lock_holder_does_not_deadlock(exported: ExporterThread) -> None:
    store = exported.store
    child = run_child(CHILD_HOLD_WRITE, exported.exporter.address, exported.exporter.token.hex())
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        done = threading.Event()

        def writer() -> None:
            store.push("node:feat", np.array([5]), np.full((1, 3), 1, F32), op="add")
            done.set()

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        assert not done.wait(0.3), "push went through while another process held the write lock"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert done.wait(5), "the lock of a SIGKILLed process was not released"
        t.join(5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for f in (child.stdin, child.stdout):
            if f is not None:
                f.close()


# --- fd passing ------------------------------------------------------------------------------
CHILD_ADD = """
    import sys
    import numpy as np
    from asyncgraph.storage.fdpass import attach_store
    store = attach_store(sys.argv[1], bytes.fromhex(sys.argv[2]))
    ids = np.array([int(x) for x in sys.argv[3].split(",")])
    ones = np.ones((ids.size, 64), np.float32)
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(200):
        store.push("node:acc", ids, ones, op="add")
    store.close()
    print("done", flush=True)
"""


def test_concurrent_add_from_two_processes_is_exact(exported: ExporterThread) -> None:
    store = exported.store
    exported.call(lambda: store.create_tensor("node:acc", "node", [15, 64], "float32"))
    rng = np.random.default_rng(0)
    id_sets = [np.repeat(np.arange(4, 10), 40), rng.integers(4, 10, 300)]  # overlapping, with duplicates
    args = (exported.exporter.address, exported.exporter.token.hex())
    children = [run_child(CHILD_ADD, *args, ",".join(map(str, ids))) for ids in id_sets]
    try:
        for c in children:
            assert c.stdout is not None and c.stdout.readline().strip() == "ready"
        for c in children:
            assert c.stdin is not None
            c.stdin.write("go\n")
            c.stdin.flush()
        for c in children:
            out, _ = c.communicate(timeout=25)
            assert c.returncode == 0 and out.strip() == "done"
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    expect = np.zeros((6, 64), np.float32)
    for ids in id_sets:
        expect += 200 * np.bincount(ids - 4, minlength=6)[:, None]
    np.testing.assert_array_equal(store.local_rows("node:acc"), expect)


def test_attach_sees_same_memory_and_new_tensors(exported: ExporterThread) -> None:
    server = exported.store
    address, token = exported.exporter.address, exported.exporter.token
    client = attach_store(address, token)
    assert client.attached and {m.name for m in client.list_tensors()} == {"node:feat", "edge:w"}
    np.testing.assert_array_equal(client.indptr, server.indptr)
    np.testing.assert_array_equal(client.eids, server.eids)
    assert not client.indices.flags.writeable
    client.push("node:feat", np.array([6]), np.full((1, 3), -2, F32))
    np.testing.assert_array_equal(server.pull("node:feat", np.array([6])), [[-2, -2, -2]])
    with pytest.raises(InvalidRequestError, match="through the server"):
        client.create_tensor("node:new", "node", [15], "float32")
    with pytest.raises(InvalidRequestError, match="through the server"):
        client.delete_tensor("node:feat")
    with pytest.raises(OutOfRangeError):
        client.pull("node:feat", np.array([3]))

    # a tensor created after attach
    exported.call(
        lambda: server.create_tensor("node:late", "node", [15, 2], "float64", {"kind": "normal", "seed": 5})
    )
    assert not client.has_tensor("node:late")
    desc, fds = fetch_tensors(address, token, ["node:late"])
    assert [m.name for m in client.add_attached(desc, fds)] == ["node:late"]
    np.testing.assert_array_equal(client.local_rows("node:late"), server.local_rows("node:late"))
    client.push("node:late", np.array([4, 4]), np.ones((2, 2)), op="add")
    np.testing.assert_array_equal(server.local_rows("node:late")[0], client.local_rows("node:late")[0])
    # fetching an already known tensor again keeps the mapping and closes the extra fd
    n_fds = fd_count()
    client.add_attached(*fetch_tensors(address, token, ["node:late"]))
    assert fd_count() == n_fds
    # deleted and re-created with another shape on the server: re-fetch replaces the mapping
    exported.call(lambda: server.delete_tensor("node:late"))
    exported.call(lambda: server.create_tensor("node:late", "node", [15], "int32"))
    client.add_attached(*fetch_tensors(address, token, ["node:late"]))
    assert client.tensor_meta("node:late").shape == (15,)
    client.forget_tensor("node:late")
    client.forget_tensor("node:late")  # no-op when unknown
    assert not client.has_tensor("node:late")
    with pytest.raises(UnknownTensorError, match="node:missing"):
        fetch_tensors(address, token, ["node:missing"])
    # a subset attach
    sub = attach_store(address, token, names=["edge:w"])
    assert [m.name for m in sub.list_tensors()] == ["edge:w"]
    sub.close()
    client.close()


def test_wrong_token_and_missing_server(exported: ExporterThread) -> None:
    address = exported.exporter.address
    assert address.startswith("@asyncgraph.toy.p1.")
    with pytest.raises(AuthenticationError, match="wrong token"):
        attach_store(address, b"x" * 32)
    with pytest.raises(AuthenticationError):
        fetch_tensors(address, exported.exporter.token[:-1] + b"?", ["node:feat"])
    with pytest.raises(ServerUnavailableError, match=r"@asyncgraph\.nobody\.here"):
        attach_store("@asyncgraph.nobody.here", exported.exporter.token, timeout=1.0)
    # the exporter still serves after rejections
    attach_store(address, exported.exporter.token).close()


def test_unresponsive_exporter_times_out() -> None:
    import socket

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind("\0asyncgraph.test.silent." + os.urandom(4).hex())
    silent.listen(1)
    name = "@" + silent.getsockname()[1:].decode()
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="did not answer"):
        attach_store(name, b"t" * 32, timeout=0.3)
    assert time.monotonic() - t0 < 3
    silent.close()


def test_many_tensors_need_several_fd_batches(exported: ExporterThread) -> None:
    server = exported.store

    def create_many() -> None:
        for i in range(300):
            server.create_tensor(f"edge:t{i}", "edge", [30], "int16")

    exported.call(create_many)
    client = attach_store(exported.exporter.address, exported.exporter.token)
    assert len(client.list_tensors()) == 302
    client.push("edge:t299", np.array([19]), np.array([7], np.int16))
    assert server.pull("edge:t299", np.array([19]))[0] == 7
    client.close()


def test_each_shared_tensor_holds_one_descriptor(exported: ExporterThread) -> None:
    """Issue 22 item 9: a shared tensor holds exactly one fd in the server's store and in an
    attached one (before: two, the memfd and the duplicate Python's ``mmap`` keeps), and its
    mapping stays valid while a view of it lives."""
    server, n = exported.store, 60
    gc.collect()
    before = fd_count()
    exported.call(
        lambda: [server.create_tensor(f"node:one{i}", "node", [15, 2], "float32") for i in range(n)]
    )
    assert fd_count() - before == n
    address, token = exported.exporter.address, exported.exporter.token
    client = attach_store(address, token, names=[])  # the structure only
    attached = fd_count()
    client.add_attached(*fetch_tensors(address, token, [f"node:one{i}" for i in range(n)]))
    assert fd_count() - attached == n  # and one each in the attached store
    client.push("node:one7", np.array([6]), np.full((1, 2), 5, F32))
    np.testing.assert_array_equal(server.pull("node:one7", np.array([6])), [[5, 5]])
    view = server.local_rows("node:one7")[1:]
    exported.call(lambda: server.delete_tensor("node:one7"))
    client.close()
    gc.collect()
    assert fd_count() - before == n - 1
    assert float(view.sum()) == 10  # the mapping outlives its descriptor


def test_close_leaves_no_fds_open() -> None:
    gc.collect()
    before = fd_count()
    store = make_store(shared=True)
    store.create_tensor("node:emb", "node", [15, 4], "float32", {"kind": "uniform", "seed": 0})
    ex = ExporterThread(store)
    client = attach_store(ex.exporter.address, ex.exporter.token)
    ex.call(lambda: store.create_tensor("edge:late", "edge", [30], "float32"))
    client.add_attached(*fetch_tensors(ex.exporter.address, ex.exporter.token, ["edge:late"]))
    rows = client.local_rows("node:emb")  # a view the caller still holds at close
    assert fd_count() > before
    client.close()
    assert float(rows.sum()) >= 0  # still readable: unmapped only when dropped
    del rows
    ex.close()
    store.close()
    store.close()
    gc.collect()
    assert fd_count() == before
    local = make_store(shared=False)
    with pytest.raises(InvalidRequestError, match="shared=False"):
        export(local, None, structure=True)
    with pytest.raises(InvalidRequestError, match="shared=True"):
        FdExporter(local, label="x")
    local.close()


# --- measurements (reported, loosely bounded) ------------------------------------------------
@pytest.mark.perf
def test_measure_lock_overhead_and_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    def per_call(fn: Callable[[], Any], n: int) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    def best(fn: Callable[[], Any], n: int = 3) -> float:
        return min(per_call(fn, 1) for _ in range(n))

    lock = SharedRWLock.create("asyncgraph.test.bench")
    local = LocalRWLock()

    def shared_read() -> None:
        with lock.read():
            pass

    def shared_write() -> None:
        with lock.write():
            pass

    def local_read() -> None:
        with local.read():
            pass

    def null() -> None:
        with contextlib.nullcontext():
            pass

    lines = [
        f"lock overhead per acquire+release: nullcontext {per_call(null, 20000) * 1e6:.2f} us, "
        f"LocalRWLock.read {per_call(local_read, 20000) * 1e6:.2f} us, "
        f"SharedRWLock.read {per_call(shared_read, 20000) * 1e6:.2f} us, "
        f"SharedRWLock.write {per_call(shared_write, 20000) * 1e6:.2f} us"
    ]
    lock.close()

    n, d = 100_000, 128
    book = RangePartitionBook([0, n], [0, 0])
    empty = np.empty(0, np.int64)
    store = PartitionStore.create("bench", 0, book, np.zeros(n + 1, np.int64), empty, empty, {}, {})
    store.create_tensor("node:x", "node", [n, d], "float32", {"kind": "uniform", "seed": 0})
    plain = store.local_rows("node:x").copy()
    ids = np.random.default_rng(0).integers(0, n, n)
    vals = np.ones((n, d), np.float32)
    mb = n * d * 4 / 1e6
    t_take = best(lambda: np.take(plain, ids, axis=0))
    t_pull = best(lambda: store.pull("node:x", ids))
    t_assign = best(lambda: store.push("node:x", ids, vals))
    t_add = best(lambda: store.push("node:x", ids, vals, op="add"))
    t_addat = best(lambda: np.add.at(plain, ids, vals), 1)
    t_small = per_call(lambda: store.pull("node:x", ids[:1]), 5000)
    lines.append(
        f"100k random rows x {d} float32 ({mb:.0f} MB): np.take {t_take * 1e3:.1f} ms, "
        f"store.pull {t_pull * 1e3:.1f} ms ({mb / t_pull / 1e3:.2f} GB/s), "
        f"push assign {t_assign * 1e3:.1f} ms, push add {t_add * 1e3:.1f} ms "
        f"(plain 2-D np.add.at {t_addat * 1e3:.1f} ms); 1-row pull {t_small * 1e6:.1f} us"
    )
    store.close()
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert t_pull < 10 * t_take + 0.05


def test_create_validates_partition_arrays_and_from_partition() -> None:
    from types import SimpleNamespace

    book = RangePartitionBook(NODE_BOUNDS, EDGE_BOUNDS)
    empty = np.empty(0, np.int64)
    with pytest.raises(ShapeMismatchError, match="indptr"):
        PartitionStore.create("g", 1, book, np.zeros(3, np.int64), empty, empty, {}, {})
    with pytest.raises(ShapeMismatchError, match="node feature 'feat'"):
        PartitionStore.create(
            "g", 1, book, np.zeros(7, np.int64), empty, empty, {"feat": np.zeros((5, 2))}, {}
        )
    with pytest.raises(DTypeMismatchError, match="edge feature 'name'"):
        PartitionStore.create(
            "g", 1, book, np.zeros(7, np.int64), empty, empty, {}, {"name": np.array(["a"] * 14)}
        )
    part = SimpleNamespace(
        config=SimpleNamespace(graph_name="ns"),
        part_id=0,
        book=book,
        edge_range=(0, 0),
        indptr=np.zeros(5, np.int32),
        indices=empty,
        eids=empty,
        node_feats={"label": np.arange(4, dtype=np.int64)},
        edge_feats={},
    )
    store = PartitionStore.from_partition(part, shared=False)  # type: ignore[arg-type]
    assert store.graph_name == "ns" and store.indptr.dtype == np.int64
    np.testing.assert_array_equal(store.pull("node:label", np.array([3, 0])), [3, 0])
    store.close()


def test_exporter_survives_garbage_clients(exported: ExporterThread) -> None:
    import socket

    raw = "\0" + exported.exporter.address[1:]
    for payload in (b"", b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", b"\x00\x00\x00\x01\xc1"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(raw)
        s.sendall(payload)
        s.close()
    client = attach_store(exported.exporter.address, exported.exporter.token)
    assert client.has_tensor("node:feat")
    client.close()


def test_exporter_under_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")
    store = make_store(shared=True, graph="uv")

    async def main() -> None:
        async with FdExporter(store, label="uv.p1") as ex:
            client = await asyncio.to_thread(attach_store, ex.address, ex.token)
            np.testing.assert_array_equal(client.pull("edge:w", np.array([6])), [0.5])
            client.close()
            with pytest.raises(AuthenticationError):
                await asyncio.to_thread(attach_store, ex.address, b"nope")

    uvloop.run(main())
    store.close()
