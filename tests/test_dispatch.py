"""One way to reach a partition: the scatter routine, op records, shared validation, served == standalone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.arrays import WIRE_DTYPE_KINDS, as_id_array, check_rows
from asyncgraph.client import AsyncClient
from asyncgraph.client.scatter import gather_rows, scatter, split_by_owner, take
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownOpError,
)
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol import codec
from asyncgraph.protocol.ops import (
    BarrierArgs,
    CreateTensorArgs,
    FindEdgesArgs,
    Op,
    PullArgs,
    PushArgs,
    SampleArgs,
    SparseUpdateArgs,
)
from asyncgraph.server.handlers import RequestHandlers
from asyncgraph.storage.store import PartitionStore
from asyncgraph.testing import ServerGroup, start_servers


# --- scatter -------------------------------------------------------------------------------------
class FakePartition:
    """A partition that records what it was asked; ``remote`` ones wait for ``release``."""

    store = None
    closed = False

    def __init__(self, part_id: int, log: list[str], *, remote: bool, fail: bool = False) -> None:
        self.part_id = part_id
        self.name = f"fake{part_id}"
        self.log = log
        self.remote = remote
        self.fail = fail
        self.release = asyncio.Event()
        self.cancelled = False

    def runs_here(self, op: Op) -> bool:
        return not self.remote

    async def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        kind = "remote" if self.remote else "local"
        self.log.append(f"{kind}{self.part_id} start")
        if self.remote:
            try:
                if self.fail:
                    await asyncio.sleep(0)
                    raise OutOfRangeError(f"partition {self.part_id} failed on purpose")
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        elif self.fail:
            raise OutOfRangeError(f"partition {self.part_id} failed on purpose")
        self.log.append(f"{kind}{self.part_id} done")
        return ids * 10


def _pull_all(parts: list[FakePartition], ids: np.ndarray, owner: np.ndarray) -> Any:
    positions = split_by_owner(owner, len(parts))
    return scatter(parts, positions, Op.PULL, lambda p, pos: p.pull("x", take(ids, pos)))  # type: ignore[arg-type]


async def test_scatter_starts_remote_first_and_merges_in_caller_order() -> None:
    log: list[str] = []
    parts = [
        FakePartition(0, log, remote=True),
        FakePartition(1, log, remote=False),
        FakePartition(2, log, remote=True),
    ]
    for p in parts:
        p.release.set()
    ids = np.array([7, 1, 4, 8, 2, 5])
    owner = np.array([2, 0, 1, 2, 0, 1])
    results = await _pull_all(parts, ids, owner)
    assert log.index("remote0 start") < log.index("local1 start")
    assert log.index("remote2 start") < log.index("local1 start")
    np.testing.assert_array_equal(gather_rows(results, ids.size, (), np.int64), ids * 10)
    assert [pos.tolist() for pos, _ in results] == [[1, 4], [2, 5], [0, 3]]  # partition order


async def test_scatter_single_owner_passes_the_whole_request() -> None:
    log: list[str] = []
    parts = [FakePartition(0, log, remote=False), FakePartition(1, log, remote=True)]
    ids = np.array([3, 1, 2])
    seen: list[np.ndarray | None] = []

    async def call(p: Any, pos: np.ndarray | None) -> np.ndarray:
        seen.append(pos)
        return take(ids, pos)

    results = await scatter(parts, split_by_owner(np.zeros(3, np.int64), 2), Op.PULL, call)  # type: ignore[arg-type]
    assert seen == [None]
    assert gather_rows(results, 3, (), np.int64) is ids  # neither split nor copied
    assert await scatter(parts, split_by_owner(np.zeros(0, np.int64), 2), Op.PULL, call) == []  # type: ignore[arg-type]


async def test_scatter_cancels_the_rest_when_a_remote_fails() -> None:
    log: list[str] = []
    hanging = FakePartition(0, log, remote=True)  # never released
    failing = FakePartition(1, log, remote=True, fail=True)
    local = FakePartition(2, log, remote=False)
    ids = np.arange(6)
    with pytest.raises(OutOfRangeError, match="partition 1 failed"):
        await asyncio.wait_for(_pull_all([hanging, failing, local], ids, ids % 3), 5.0)
    assert hanging.cancelled
    assert "local2 done" in log


async def test_scatter_local_error_cancels_remote_and_waits_for_them() -> None:
    log: list[str] = []
    hanging = FakePartition(0, log, remote=True)
    local = FakePartition(1, log, remote=False, fail=True)
    ids = np.arange(4)
    with pytest.raises(OutOfRangeError, match="partition 1 failed"):
        await asyncio.wait_for(_pull_all([hanging, local], ids, ids % 2), 5.0)
    assert hanging.cancelled  # finished (cancelled) before the error was raised


# --- op records ----------------------------------------------------------------------------------
def test_ops_are_plain_strings() -> None:
    assert Op.PULL == "pull" and isinstance(Op.SPARSE_UPDATE, str)
    args = PushArgs("node:x", np.array([1, 2]), np.zeros((2, 3), np.float32), "add")
    back = PushArgs.decode(args.encode())
    assert back.name == "node:x" and back.op == "add" and back.values.shape == (2, 3)
    assert PushArgs.decode({"name": "a", "ids": np.array([1]), "values": np.zeros(1)}).op == "assign"
    assert SampleArgs.decode(SampleArgs(np.array([1]), 5, True, 3).encode()).seed == 3


@pytest.mark.parametrize(
    ("record", "args", "exc", "words"),
    [
        (PullArgs, {"ids": np.array([1])}, InvalidRequestError, ["pull", "missing argument 'name'"]),
        (PullArgs, {"name": 3, "ids": np.array([1])}, InvalidRequestError, ["'name' must be str, got int"]),
        (PullArgs, {"name": "a", "ids": [1, 2]}, InvalidRequestError, ["'ids' must be ndarray"]),
        (PullArgs, {"name": "a", "ids": np.array([1.5])}, DTypeMismatchError, ["integer array", "float64"]),
        (PullArgs, {"name": "a", "ids": np.array([[1]])}, DTypeMismatchError, ["one-dimensional", "(1, 1)"]),
        (
            SampleArgs,
            {"seeds": np.array([1]), "fanout": True},
            InvalidRequestError,
            ["must be int, got bool"],
        ),
        (SampleArgs, {"seeds": np.array([1]), "fanout": 2, "seed": 1.5}, InvalidRequestError, ["seed"]),
        (FindEdgesArgs, {"eids": np.array([0.5])}, DTypeMismatchError, ["find_edges", "eids"]),
        (BarrierArgs, {"name": "b", "timeout": 0}, InvalidRequestError, ["timeout must be in (0, 604800]"]),
        (BarrierArgs, {"name": "b", "timeout": "1"}, InvalidRequestError, ["int or float"]),
        (
            CreateTensorArgs,
            {"name": "a", "policy": "graph", "shape": [1], "dtype": "float32"},
            InvalidRequestError,
            ["policy", "'graph'"],
        ),
        (
            CreateTensorArgs,
            {"name": "a", "policy": "node", "shape": [1.0], "dtype": "float32"},
            InvalidRequestError,
            ["list of ints"],
        ),
        (
            CreateTensorArgs,
            {"name": "a", "policy": "node", "shape": [1], "dtype": "float32", "init": 3},
            InvalidRequestError,
            ["init"],
        ),
        (
            SparseUpdateArgs,
            {"name": "a", "ids": np.array([1]), "grads": np.zeros(1), "spec": [1]},
            InvalidRequestError,
            ["'spec' must be dict"],
        ),
    ],
)
def test_op_records_reject_bad_arguments(
    record: Any, args: dict[str, Any], exc: type, words: list[str]
) -> None:
    with pytest.raises(exc) as info:
        record.decode(args)
    for word in words:
        assert word in str(info.value)


def _toy_store() -> PartitionStore:
    book = RangePartitionBook([0, 4, 10], [0, 5, 12])
    indptr = np.zeros(7, np.int64)
    empty = np.empty(0, np.int64)
    feats = {"feat": np.ones((6, 2), np.float32)}
    return PartitionStore.create("toy", 1, book, indptr, empty, empty, feats, {}, shared=False)


def test_handler_table_is_keyed_by_op() -> None:
    handlers = RequestHandlers(_toy_store(), num_clients=1)
    assert set(handlers.ops) == set(Op)
    with pytest.raises(UnknownOpError, match=r"'frobnicate'.*pull"):
        handlers.lookup("frobnicate")
    rows = handlers.lookup(Op.PULL)(PullArgs("node:feat", np.array([5, 4])).encode())
    np.testing.assert_array_equal(rows, np.ones((2, 2), np.float32))


# --- shared pieces -------------------------------------------------------------------------------
def test_check_rows_is_the_one_row_validation() -> None:
    local, vals = check_rows(
        "t",
        np.array([5, 9]),
        np.zeros((2, 3), ">f4"),
        dtype="float32",
        row_shape=(3,),
        owned=(4, 10),
        owner="p1",
    )
    assert local.tolist() == [1, 5] and vals.dtype.isnative
    with pytest.raises(OutOfRangeError, match=r"node ID 10 is not owned by p1 \(owns \[4, 10\)\)"):
        check_rows("t", [4, 10], dtype="float32", row_shape=(), owned=(4, 10), owner="p1")
    with pytest.raises(ShapeMismatchError, match=r"\(1, 2\)"):
        check_rows("t", np.array([[4, 5]]), dtype="float32", row_shape=())
    with pytest.raises(DTypeMismatchError, match="float64"):
        check_rows("t", np.array([4.0]), dtype="float32", row_shape=())
    with pytest.raises(DTypeMismatchError, match="grads have dtype float64; the tensor is float32"):
        check_rows("t", np.array([4]), np.zeros(1), dtype="float32", row_shape=(), values_name="grads")
    with pytest.raises(ShapeMismatchError, match=r"\(2,\); 1 ids need \(1,\)"):
        check_rows("t", np.array([4]), np.zeros(2, np.float32), dtype="float32", row_shape=())
    assert as_id_array(torch.tensor(3)).tolist() == [3]


def test_complex_dtypes_are_refused_like_the_codec_refuses_them() -> None:
    assert codec._ARRAY_KINDS == WIRE_DTYPE_KINDS
    assert "c" not in WIRE_DTYPE_KINDS
    with pytest.raises(DTypeMismatchError, match="complex64"):
        _toy_store().create_tensor("node:z", "node", [10], "complex64")
    with pytest.raises(DTypeMismatchError, match="complex128"):
        PartitionStore.create(
            "toy",
            1,
            RangePartitionBook([0, 4, 10], [0, 5, 12]),
            np.zeros(7, np.int64),
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            {"z": np.zeros(6, np.complex128)},
            {},
            shared=False,
        )


def test_nn_is_a_lazy_attribute() -> None:
    assert asyncgraph.nn.SAGEConv is not None
    assert "nn" in dir(asyncgraph)


# --- served == standalone ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def servers(pubmed2, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    group = start_servers(pubmed2.part_config, tmp_path_factory.mktemp("dispatch"), num_parts=2)
    yield group
    group.stop()


_SAME_KEYS = (
    "protocol_version",
    "graph_name",
    "part_id",
    "num_parts",
    "num_nodes",
    "num_edges",
    "book",
    "tensors",
)


@pytest.mark.parametrize("shared_memory", [True, False])
async def test_standalone_info_equals_served_info(servers: ServerGroup, pubmed2, shared_memory: bool) -> None:
    served = await AsyncClient.connect(servers.addresses, use_shared_memory=shared_memory)
    alone = AsyncClient.standalone(pubmed2.part_config)
    try:
        assert served.is_standalone is False and alone.is_standalone is True
        for part in range(2):
            got, want = await alone.info(part), await served.info(part)
            assert {k: got[k] for k in _SAME_KEYS} == {k: want[k] for k in _SAME_KEYS}
            assert got["shm"] is None and got["num_clients"] == 1
    finally:
        await served.close()
        await alone.close()


@pytest.mark.parametrize("mode", ["standalone", "socket", "shared"])
async def test_complex_tensor_refused_everywhere(servers: ServerGroup, pubmed2, mode: str) -> None:
    if mode == "standalone":
        client = AsyncClient.standalone(pubmed2.part_config)
    else:
        client = await AsyncClient.connect(servers.addresses, use_shared_memory=mode == "shared")
    try:
        with pytest.raises(DTypeMismatchError, match="complex64"):
            await client.create_tensor("node:cplx", "node", [client.book.num_nodes], "complex64")
        assert "node:cplx" not in [m.name for m in await client.refresh_tensors()]
    finally:
        await client.close()


async def test_mixed_partitions_give_standalone_results(servers: ServerGroup, pubmed2) -> None:
    served = await AsyncClient.connect(servers.addresses, local_partitions=[1])  # 0 remote, 1 local
    alone = AsyncClient.standalone(pubmed2.part_config)
    try:
        n = served.book.num_nodes
        ids = np.random.default_rng(5).integers(0, n, 500)
        np.testing.assert_array_equal(
            await served.pull_numpy("node:feat", ids), await alone.pull_numpy("node:feat", ids)
        )
        for a, b in zip(
            await served.sample_neighbors(ids, 4, seed=9),
            await alone.sample_neighbors(ids, 4, seed=9),
            strict=True,
        ):
            np.testing.assert_array_equal(a, b)
        eids = np.random.default_rng(6).integers(0, served.book.num_edges, 300)
        for a, b in zip(await served.find_edges(eids), await alone.find_edges(eids), strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        await served.close()
        await alone.close()


def test_distgraph_sample_neighbors_returns_tensors(pubmed2) -> None:
    client = asyncgraph.Client.standalone(pubmed2.part_config)
    try:
        g = asyncgraph.DistGraph(client.graph_name, client=client)
        src, dst, eids = g.sample_neighbors(np.array([0, 1, 2]), 3, seed=1)
        assert all(isinstance(t, torch.Tensor) for t in (src, dst, eids))
    finally:
        client.close()
