"""The cheap-request paths (issue 9) decide exactly what the slow ones decided.

``check_rows`` checks a few IDs with Python ints and many with one subtraction and one unsigned
reduction; both are compared with the former two-reduction rule (kept here as the reference)
at every edge: the ends of the owned range, negative IDs, uint64 IDs above int64's range, int64's
extremes, empty arrays, and the size where the small path hands over to the vectorised one. The
store caches per-tensor access records (row bytes, rows, messages): a deleted and re-created
tensor must not see the old one. The read-lock fast path must still wait for a writer holding the
cross-process lock. Served pulls are checked on real servers over a raw protocol session, so the
server's own checks answer (a client would refuse foreign IDs before sending).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.arrays import _SMALL_IDS, check_rows
from asyncgraph.errors import (
    AsyncGraphError,
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownOpError,
    UnknownTensorError,
    error_from_code,
)
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol import ClientSession
from asyncgraph.protocol.messages import ErrorResponse, Response
from asyncgraph.service.limits import WorkLimits
from asyncgraph.service.local import PartitionService
from asyncgraph.storage import PartitionStore
from asyncgraph.storage.rwlock import SharedRWLock

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def reference_check(ids: np.ndarray, owned: tuple[int, int]) -> np.ndarray:
    """The former rule: two reductions, then one subtraction (what the fast paths must equal)."""
    lo, hi = owned
    if ids.ndim != 1:
        raise ShapeMismatchError(f"t: ids must be a 1-D array of global IDs, got shape {ids.shape}")
    if ids.size and ids.dtype.kind not in "iu":
        raise DTypeMismatchError(f"t: ids must be integers, got dtype {ids.dtype}")
    if not ids.size:
        return np.empty(0, dtype=np.int64)
    mn, mx = int(ids.min()), int(ids.max())
    if mn < lo or mx >= hi:
        bad = mn if mn < lo else mx
        raise OutOfRangeError(f"t: node ID {bad} is not owned by p (owns [{lo}, {hi}))")
    return np.asarray([int(v) - lo for v in ids.tolist()], dtype=np.int64)


def outcome(fn: Callable[[], np.ndarray]) -> tuple[str, Any]:
    try:
        out = fn()
    except AsyncGraphError as exc:
        return type(exc).__name__, str(exc)
    assert out.dtype == np.int64
    return "ok", out.tolist()


def same(ids: np.ndarray, owned: tuple[int, int]) -> None:
    got = outcome(lambda: check_rows("t", ids, dtype="float32", row_shape=(), owned=owned, owner="p")[0])
    want = outcome(lambda: reference_check(ids, owned))
    assert got == want, (ids.dtype, ids.tolist()[:12], owned)


OWNED = [(0, 1), (0, 50), (7, 50), (1000, 1003), ((1 << 40), (1 << 40) + 5), (5, 5)]


def edge_values(lo: int, hi: int) -> list[int]:
    return [lo - 1, lo, lo + 1, hi - 2, hi - 1, hi, hi + 1, -1, 0, I64_MIN, I64_MAX]


@pytest.mark.parametrize("owned", OWNED)
@pytest.mark.parametrize("size", [1, 2, _SMALL_IDS, _SMALL_IDS + 1, 300])
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "uint64", "uint32", "uint8"])
def test_range_check_equals_the_reference(owned: tuple[int, int], size: int, dtype: str) -> None:
    lo, hi = owned
    info = np.iinfo(dtype)
    rng = np.random.default_rng(size)
    values = [v for v in edge_values(lo, hi) if info.min <= v <= info.max]
    if hi > lo and lo <= info.max:  # a background of owned IDs, one edge value placed in it
        background = rng.integers(max(lo, info.min), min(hi, info.max + 1), size).astype(dtype)
    else:
        background = None
    for v in values:
        for pos in sorted({0, size // 2, size - 1}):
            ids = np.full(size, v, dtype=dtype) if background is None else background.copy()
            ids[pos] = v
            same(ids, owned)
    if dtype == "uint64":  # above int64's range: must be refused, not wrapped into range
        for big in (1 << 63, (1 << 63) + lo, (1 << 64) - 1, (1 << 64) - 1 - lo):
            same(np.full(size, big, dtype=np.uint64), owned)
            if hi > lo:
                mixed = np.full(size, lo, dtype=np.uint64)
                mixed[-1] = big
                same(mixed, owned)


def test_range_check_empty_and_bad_shapes() -> None:
    for ids in (np.empty(0, np.int64), np.empty(0, np.uint64), np.empty(0, np.float64)):
        same(ids, (0, 10))
    same(np.array([[1, 2]]), (0, 10))
    same(np.array([1.0]), (0, 10))
    same(np.array([True]), (0, 10))
    # torch-like and list input still go through to_numpy
    assert check_rows("t", [3, 4], dtype="f4", row_shape=(), owned=(3, 5), owner="p")[0].tolist() == [0, 1]


def test_range_check_random_against_reference() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        lo = int(rng.integers(0, 1000))
        hi = lo + int(rng.integers(0, 50))
        size = int(rng.integers(1, 40))
        ids = rng.integers(lo - 3, hi + 3, size)
        same(ids.astype(np.int64), (lo, hi))
        if lo >= 3:
            same(ids.astype(np.uint32), (lo, hi))


# ------------------------------------------------------------------------------------------------
# the store's cached access records and read-lock fast path
# ------------------------------------------------------------------------------------------------


def toy_store(shared: bool) -> PartitionStore:
    book = RangePartitionBook([0, 4, 10], [0, 5, 12])
    indptr = np.zeros(7, np.int64)
    empty = np.empty(0, np.int64)
    feats = {"feat": np.arange(12, dtype=np.float32).reshape(6, 2)}
    return PartitionStore.create("toy", 1, book, indptr, empty, empty, feats, {}, shared=shared)


@pytest.mark.parametrize("shared", [True, False])
def test_pull_push_single_ids_at_the_edges(shared: bool) -> None:
    with toy_store(shared) as store:
        np.testing.assert_array_equal(store.pull("node:feat", np.array([4])), [[0, 1]])
        np.testing.assert_array_equal(store.pull("node:feat", np.array([9], np.uint64)), [[10, 11]])
        for bad, shown in ((3, 3), (10, 10), (-1, -1), ((1 << 64) - 1, (1 << 64) - 1)):
            ids = np.array([bad], np.uint64 if bad > I64_MAX else np.int64)
            msg = (
                f"tensor 'node:feat': node ID {shown} is not owned by graph 'toy' partition 1 (owns [4, 10))"
            )
            with pytest.raises(OutOfRangeError) as info:
                store.pull("node:feat", ids)
            assert str(info.value) == msg
            with pytest.raises(OutOfRangeError) as info:
                store.push("node:feat", ids, np.zeros((1, 2), np.float32))
            assert str(info.value) == msg
        store.push("node:feat", np.array([9]), np.full((1, 2), 7, np.float32))
        np.testing.assert_array_equal(store.pull("node:feat", np.array([9, 4])), [[7, 7], [0, 1]])
        assert store.pull("node:feat", np.empty(0, np.int64)).shape == (0, 2)
        with pytest.raises(DTypeMismatchError, match="values have dtype float64; the tensor is float32"):
            store.push("node:feat", np.array([9]), np.zeros((1, 2)))
        with pytest.raises(DTypeMismatchError, match="values have dtype int32; the tensor is float32"):
            store.push("node:feat", np.array([9]), np.zeros((1, 2), np.int32))
        store.push("node:feat", np.array([8]), np.array([[1.5, -2.0]], ">f4"))  # byte-order twin: accepted
        np.testing.assert_array_equal(store.pull("node:feat", np.array([8])), [[1.5, -2.0]])
        with pytest.raises(UnknownTensorError, match=r"no tensor 'node:nope'.*have: node:feat"):
            store.pull("node:nope", np.array([4]))


@pytest.mark.parametrize("shared", [True, False])
def test_recreated_tensor_gets_a_fresh_access_record(shared: bool) -> None:
    with toy_store(shared) as store:
        store.create_tensor("node:x", "node", [10, 3], "float32")
        store.push("node:x", np.arange(4, 10), np.ones((6, 3), np.float32))
        assert store.row_bytes("node:x") == 12
        np.testing.assert_array_equal(store.pull("node:x", np.array([5])), [[1, 1, 1]])
        store.delete_tensor("node:x")
        with pytest.raises(UnknownTensorError):
            store.row_bytes("node:x")
        with pytest.raises(UnknownTensorError):
            store.pull("node:x", np.array([5]))
        store.create_tensor("node:x", "node", [10, 5], "float64")
        store.push("node:x", np.arange(4, 10), np.full((6, 5), 2.0))
        assert store.row_bytes("node:x") == 40
        np.testing.assert_array_equal(store.pull("node:x", np.array([5])), [[2.0] * 5])
        with pytest.raises(DTypeMismatchError, match="the tensor is float64"):
            store.push("node:x", np.array([5]), np.zeros((1, 5), np.float32))
        store.push("node:x", np.array([5]), np.full((1, 5), 3.0))
        np.testing.assert_array_equal(store.pull("node:x", np.array([5, 6]))[:, 0], [3.0, 2.0])


def test_service_limits_use_the_cached_row_bytes() -> None:
    with toy_store(False) as store:
        service = PartitionService(store, limits=WorkLimits(max_reply_bytes=16))
        assert service.pull("node:feat", np.array([4, 5])).shape == (2, 2)  # 16 bytes: fits
        with pytest.raises(InvalidRequestError) as info:
            service.pull("node:feat", np.array([4, 5, 6]))
        assert str(info.value).startswith(
            "pull from 'node:feat': 3 rows x 8 bytes = 24 bytes is over this server's per-request limit of 16"
        )
        with pytest.raises(UnknownTensorError):  # the tensor is named before any limit
            service.pull("node:nope", np.arange(100))


def test_pull_waits_for_a_writer_holding_the_cross_process_lock() -> None:
    with toy_store(True) as store:
        assert isinstance(store.lock, SharedRWLock)
        other = SharedRWLock.from_fd(os.dup(store.lock.fd))  # another description
        holding, released = threading.Event(), []

        def writer() -> None:
            with other.write():
                holding.set()
                time.sleep(0.3)
                released.append(time.monotonic())

        th = threading.Thread(target=writer)
        th.start()
        try:
            assert holding.wait(10)
            store.pull("node:feat", np.array([4]))
            done = time.monotonic()
        finally:
            th.join(10)
            other.close()
        assert released and done >= released[0]  # the pull ran only once the writer let go


# ------------------------------------------------------------------------------------------------
# served: a real server answers raw requests with its own checks
# ------------------------------------------------------------------------------------------------


class RawSession:
    """A blocking socket driven by ``ClientSession``: requests go to the server unchecked."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=30)
        self.session = ClientSession(graph_name=None, secret=None)
        while self.session.state.value != "ready":
            self._receive()
            out = self.session.data_to_send()
            if out:
                self.sock.sendall(b"".join(bytes(p) for p in out))

    received = 0  # bytes read from the server so far

    def _receive(self) -> list[Any]:
        buf = self.session.get_buffer(1 << 16)
        n = self.sock.recv_into(buf)
        assert n, "server closed the connection"
        self.received += n
        return self.session.buffer_updated(n)

    def call(self, op: str, args: dict[str, Any]) -> Any:
        rid, pieces = self.session.send_request(op, args)
        self.sock.sendall(b"".join(bytes(p) for p in pieces))
        for _ in range(1000):
            for ev in self._receive():
                if isinstance(ev, Response) and ev.id == rid:
                    return ev.result
                if isinstance(ev, ErrorResponse) and ev.id == rid:
                    raise error_from_code(ev.code, ev.message)
        raise AssertionError("no reply")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def raw(served: Any) -> Iterator[tuple[RawSession, tuple[int, int], int]]:
    session = RawSession(served.addresses[1])
    info = session.call("info", {})
    book = RangePartitionBook.from_dict(info["book"])
    yield session, book.node_range(1), int(info["num_nodes"])
    session.close()


def test_served_single_id_pulls_at_the_edges(raw: tuple[RawSession, tuple[int, int], int]) -> None:
    session, (lo, hi), _ = raw
    first = session.call("pull", {"name": "node:feat", "ids": np.array([lo])})
    last = session.call("pull", {"name": "node:feat", "ids": np.array([hi - 1], np.uint64)})
    both = session.call("pull", {"name": "node:feat", "ids": np.array([lo, hi - 1])})
    np.testing.assert_array_equal(both, np.concatenate([first, last]))
    assert first.shape == (1, both.shape[1]) and first.dtype == np.float32
    empty = session.call("pull", {"name": "node:feat", "ids": np.empty(0, np.int64)})
    assert empty.shape == (0, both.shape[1])
    cases = [
        (np.array([lo - 1]), lo - 1),
        (np.array([hi]), hi),
        (np.array([-5]), -5),
        (np.array([(1 << 63) + lo], np.uint64), (1 << 63) + lo),
        (np.array([(1 << 64) - 1], np.uint64), (1 << 64) - 1),
        (np.array([lo] * _SMALL_IDS + [hi]), hi),  # just over the small path
        (np.array([lo] * (_SMALL_IDS - 1) + [lo - 2]), lo - 2),
        (np.concatenate([np.arange(lo, lo + 500), [I64_MIN]]), I64_MIN),
    ]
    for ids, bad in cases:
        with pytest.raises(OutOfRangeError) as info:
            session.call("pull", {"name": "node:feat", "ids": ids})
        owner = "graph 'pubmed' partition 1"
        assert (
            str(info.value)
            == f"tensor 'node:feat': node ID {bad} is not owned by {owner} (owns [{lo}, {hi}))"
        )
    with pytest.raises(UnknownTensorError, match="no tensor 'node:nope'"):
        session.call("pull", {"name": "node:nope", "ids": np.array([lo])})
    with pytest.raises(DTypeMismatchError, match="must be an integer array"):
        session.call("pull", {"name": "node:feat", "ids": np.array([1.0])})
    with pytest.raises(UnknownOpError, match=r"unknown op 'frobnicate'; this server knows \[.*'pull'"):
        session.call("frobnicate", {})
    # the server kept serving through every refusal
    np.testing.assert_array_equal(session.call("pull", {"name": "node:feat", "ids": np.array([lo])}), first)


def test_served_push_single_ids_at_the_edges(raw: tuple[RawSession, tuple[int, int], int]) -> None:
    session, (lo, hi), num_nodes = raw
    name = "node:costs_probe"
    session.call(
        "create_tensor", {"name": name, "policy": "node", "shape": [num_nodes, 2], "dtype": "float32"}
    )
    session.call("push", {"name": name, "ids": np.array([hi - 1]), "values": np.full((1, 2), 5, np.float32)})
    session.call(
        "push", {"name": name, "ids": np.array([lo], np.uint32), "values": np.ones((1, 2), np.float32)}
    )
    with pytest.raises(OutOfRangeError, match=f"node ID {hi} is not owned"):
        session.call("push", {"name": name, "ids": np.array([hi]), "values": np.ones((1, 2), np.float32)})
    with pytest.raises(DTypeMismatchError, match="values have dtype float64; the tensor is float32"):
        session.call("push", {"name": name, "ids": np.array([lo]), "values": np.ones((1, 2))})
    got = session.call("pull", {"name": name, "ids": np.array([lo, hi - 1])})
    np.testing.assert_array_equal(got, [[1, 1], [5, 5]])
    session.call("delete_tensor", {"name": name})


def test_served_metrics_count_exactly_what_was_sent(cora2: Any, tmp_path: Path) -> None:
    """``bytes_out`` (summed per reply) equals the bytes the client read; errors and replies count."""
    from tests.test_metrics import scrape, start_metered

    group, port = start_metered(cora2.part_config, tmp_path / "srv", 1)
    try:
        session = RawSession(group.addresses[0])
        before, got_before = scrape(port), session.received
        for i in range(5):
            session.call("pull", {"name": "node:feat", "ids": np.array([i])})
        session.call("pull", {"name": "node:feat", "ids": np.arange(7)})
        with pytest.raises(OutOfRangeError):
            session.call("pull", {"name": "node:feat", "ids": np.array([-1])})
        after = scrape(port)
        out = ("asyncgraph_bytes_total", (("direction", "out"),))
        assert after[out] - before[out] == session.received - got_before
        rows = [
            v for k, v in after.items() if k[0].startswith("asyncgraph_rows") and ("direction", "out") in k[1]
        ]
        assert rows == [12.0]
        session.close()
    finally:
        group.stop()


def test_replies_to_one_read_go_out_in_one_write(cora2: Any, tmp_path: Path) -> None:
    """Eight requests sent in one segment (a pipelining client) are answered with one socket
    write (``asyncgraph_socket_writes_total``), every reply is right, an error among them
    included, and the connection keeps serving sequential calls one write each."""
    from tests.test_metrics import scrape, start_metered

    group, port = start_metered(cora2.part_config, tmp_path / "srv", 1)
    try:
        session = RawSession(group.addresses[0])
        expected = session.call("pull", {"name": "node:feat", "ids": np.arange(8)})
        writes = ("asyncgraph_socket_writes_total", ())
        before = scrape(port)[writes]
        rids, frames = [], []
        for i in range(8):
            ids = np.array([i]) if i != 5 else np.array([-1])  # one refused request in the middle
            rid, pieces = session.session.send_request("pull", {"name": "node:feat", "ids": ids})
            rids.append(rid)
            frames.append(b"".join(bytes(p) for p in pieces))
        session.sock.sendall(b"".join(frames))
        replies: dict[int, Any] = {}
        for _ in range(1000):
            if len(replies) == 8:
                break
            for ev in session._receive():
                replies[ev.id] = ev
        assert sorted(replies) == rids
        for i, rid in enumerate(rids):
            if i == 5:
                assert isinstance(replies[rid], ErrorResponse) and replies[rid].code == "out_of_range"
            else:
                np.testing.assert_array_equal(replies[rid].result, expected[i : i + 1])
        assert scrape(port)[writes] - before == 1
        session.call("pull", {"name": "node:feat", "ids": np.array([3])})
        session.call("pull", {"name": "node:feat", "ids": np.array([4])})
        assert scrape(port)[writes] - before == 3
        session.close()
    finally:
        group.stop()
