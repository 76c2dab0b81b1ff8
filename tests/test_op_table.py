"""The op table (``asyncgraph.protocol.ops.OPS``) is the one truth about what each op may do.

Pure checks: every op is declared once and every set of ops is derived from the table. Then, on
real servers (Cora, ``--state-dir --wal``, SIGKILL), every op the table marks ``writes`` is
logged, applied once when resent with the same request id, and restored exactly after kill -9;
every ``primary_only`` op is refused by a replica; co-located clients run exactly the
``attached`` ops themselves. A write op added to the table without a scenario here fails
``test_every_write_op_has_a_durability_scenario``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import InvalidRequestError
from asyncgraph.net.connection import Connection
from asyncgraph.partition import PartitionConfig
from asyncgraph.protocol.ops import (
    ATTACHED_OPS,
    CATALOG_OPS,
    OFFLOADED_OPS,
    OPS,
    PRIMARY_ONLY_OPS,
    RETRYABLE_OPS,
    WRITE_OPS,
    AddEdgesArgs,
    AddNodesArgs,
    CreateTensorArgs,
    DeleteTensorArgs,
    Op,
    PushArgs,
    ReleaseTensorsArgs,
    RemoveEdgesArgs,
    SnapshotArgs,
    SparseUpdateArgs,
)
from asyncgraph.server.durable import WriteAheadLog
from asyncgraph.server.handlers import RequestHandlers
from asyncgraph.testing import ServerGroup, start_servers

T = 10.0


# --- pure --------------------------------------------------------------------------------
def test_every_op_is_declared_once_and_the_sets_derive_from_the_table() -> None:
    assert set(OPS) == set(Op)
    assert all(spec.op is op for op, spec in OPS.items())
    derived = {
        "writes": WRITE_OPS,
        "retryable": RETRYABLE_OPS,
        "primary_only": PRIMARY_ONLY_OPS,
        "attached": ATTACHED_OPS,
        "catalog": CATALOG_OPS,
        "offload": OFFLOADED_OPS,
    }
    for flag, ops in derived.items():
        assert ops == {op for op, spec in OPS.items() if getattr(spec, flag)}, flag
    assert WRITE_OPS <= RETRYABLE_OPS  # writes carry a request id: resending them is safe
    assert all(OPS[op].args is not None for op in WRITE_OPS)
    assert Op.RELEASE_TENSORS in WRITE_OPS  # it changes state: logged like every write


def test_server_dispatch_is_derived_from_the_table() -> None:
    from test_durable import small_store

    handlers = RequestHandlers(small_store(), num_clients=1)
    assert set(handlers.ops) == set(OPS)


# --- real servers: every write is logged, applied once, restored after kill -9 ------------
@dataclass
class Cluster:
    group: ServerGroup
    conn: Connection
    lo: int
    hi: int
    num_nodes: int
    state: Path
    #: One connection per holder: a connection acts only as the holder its hello named (issue 32).
    holders: dict[str, Connection] = field(default_factory=dict)

    async def call(self, op: Op, args: dict[str, Any]) -> Any:
        holder = args.get("holder")
        if holder is None:
            return await self.conn.call(op, args, T)
        if holder not in self.holders:
            self.holders[holder] = await _open(self.group, holder)
        return await self.holders[holder].call(op, args, T)

    def close(self) -> None:
        for conn in [self.conn, *self.holders.values()]:
            conn.close()
        self.holders.clear()

    async def tensors(self) -> dict[str, list[int]]:
        return {m["name"]: list(m["shape"]) for m in await self.call(Op.LIST_TENSORS, {})}

    async def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        return np.asarray(await self.call(Op.PULL, {"name": name, "ids": ids}))

    async def kill9_and_restart(self) -> None:
        self.close()
        self.group.kill(0)
        self.group.restart(0)
        self.conn = await _open(self.group)


async def _open(group: ServerGroup, holder: str | None = None) -> Connection:
    host, port = group.addresses[0]
    return await Connection.open(host, port, graph_name=None, timeout=T, holder=holder)


@pytest.fixture
async def cluster(cora2, tmp_path: Path) -> Any:
    state = tmp_path / "state"
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(state), "--wal"],
    )
    book = PartitionConfig.load(cora2.part_config).book()
    lo, hi = book.node_range(0)
    c = Cluster(group, await _open(group), lo, hi, book.num_nodes, state)
    try:
        yield c
    finally:
        c.close()
        group.stop()


def _with_rid(args: dict[str, Any], rid: str) -> dict[str, Any]:
    return {**args, "rid": rid}


async def _twice(c: Cluster, op: Op, args: dict[str, Any], rid: str) -> None:
    """The request, then its resend after a lost reply (same request id)."""
    await c.call(op, _with_rid(args, rid))
    await c.call(op, _with_rid(args, rid))


def _create(name: str, c: Cluster, cols: int = 2, holder: str | None = None) -> dict[str, Any]:
    return CreateTensorArgs(name, "node", [c.num_nodes, cols], "float32", {"kind": "zeros"}, holder).encode()


async def scenario_push(c: Cluster) -> Callable[[], Awaitable[None]]:
    await c.call(Op.CREATE_TENSOR, _create("node:p", c))
    ids = np.array([c.lo, c.lo + 1])
    await _twice(c, Op.PUSH, PushArgs("node:p", ids, np.ones((2, 2), np.float32), "add").encode(), "push-1")

    async def check() -> None:
        np.testing.assert_array_equal(await c.rows("node:p", ids), np.ones((2, 2), np.float32))

    return check


async def scenario_create_tensor(c: Cluster) -> Callable[[], Awaitable[None]]:
    await _twice(c, Op.CREATE_TENSOR, _create("node:c", c, holder="h1"), "create-1")

    async def check() -> None:
        assert (await c.tensors())["node:c"] == [c.num_nodes, 2]

    return check


async def scenario_create_takes_one_reference_when_resent(c: Cluster) -> Callable[[], Awaitable[None]]:
    await _twice(c, Op.CREATE_TENSOR, _create("node:c1", c, holder="h1"), "create-2")

    async def check() -> None:
        # one reference: one release frees it (a resent create counted twice would keep it)
        await c.call(Op.RELEASE_TENSORS, ReleaseTensorsArgs("h1", ["node:c1"]).encode())
        assert "node:c1" not in await c.tensors()
        await c.call(Op.CREATE_TENSOR, _create("node:c1", c, holder="h1"))  # for the next check

    return check


async def scenario_delete_tensor(c: Cluster) -> Callable[[], Awaitable[None]]:
    await c.call(Op.CREATE_TENSOR, _create("node:d", c))
    await _twice(c, Op.DELETE_TENSOR, DeleteTensorArgs("node:d").encode(), "delete-1")

    async def check() -> None:
        assert "node:d" not in await c.tensors()

    return check


async def scenario_release_tensors(c: Cluster) -> Callable[[], Awaitable[None]]:
    for rid in ("r-create-1", "r-create-2"):  # two references by holder h2
        await c.call(Op.CREATE_TENSOR, _with_rid(_create("node:r", c, holder="h2"), rid))
    await _twice(c, Op.RELEASE_TENSORS, ReleaseTensorsArgs("h2", ["node:r"]).encode(), "release-1")
    # released and made again with another shape: the new one must come back, not the old
    await c.call(Op.CREATE_TENSOR, _create("node:gone", c, holder="h3"))
    ids = np.array([c.lo])
    await c.call(Op.PUSH, PushArgs("node:gone", ids, np.full((1, 2), 7, np.float32)).encode())
    await c.call(Op.RELEASE_TENSORS, ReleaseTensorsArgs("h3", ["node:gone"]).encode())
    await c.call(Op.CREATE_TENSOR, _create("node:gone", c, cols=5, holder="h3"))

    async def check() -> None:
        tensors = await c.tensors()
        assert tensors["node:r"] == [c.num_nodes, 2]  # one of two references left
        assert tensors["node:gone"] == [c.num_nodes, 5]
        np.testing.assert_array_equal(await c.rows("node:gone", ids), np.zeros((1, 5), np.float32))

    return check


async def scenario_sparse_update(c: Cluster) -> Callable[[], Awaitable[None]]:
    await c.call(Op.CREATE_TENSOR, _create("node:emb", c))
    ids = np.array([c.lo, c.lo + 2])
    grads = np.ones((2, 2), np.float32)
    spec = {"kind": "adagrad", "lr": 0.5}
    await _twice(c, Op.SPARSE_UPDATE, SparseUpdateArgs("node:emb", ids, grads, spec).encode(), "sparse-1")
    once = await c.rows("node:emb", ids)
    assert np.all(once < 0) and np.allclose(once, once[0, 0])

    async def check() -> None:
        np.testing.assert_array_equal(await c.rows("node:emb", ids), once)
        state = await c.rows("node:emb#adagrad_state", ids)
        np.testing.assert_array_equal(state, np.ones((2, 2), np.float32))  # one squared gradient

    return check


async def _in_edges(c: Cluster, node: int) -> np.ndarray:
    out = await c.call(Op.SAMPLE, {"seeds": np.array([node]), "fanout": -1, "replace": False, "seed": None})
    return np.sort(np.asarray(out["eids"]))


async def scenario_add_edges(c: Cluster) -> Callable[[], Awaitable[None]]:
    args = AddEdgesArgs(np.array([c.hi, c.lo]), np.array([c.lo + 3, c.lo + 3])).encode()
    await _twice(c, Op.ADD_EDGES, args, "add-1")  # one edge pair, not two
    added = np.asarray(await c.call(Op.ADD_EDGES, _with_rid(args, "add-1")))  # answers the same IDs
    edges = await _in_edges(c, c.lo + 3)

    async def check() -> None:
        np.testing.assert_array_equal(await _in_edges(c, c.lo + 3), edges)
        assert np.isin(added, edges).all() and np.unique(added).size == 2

    return check


async def scenario_remove_edges(c: Cluster) -> Callable[[], Awaitable[None]]:
    before = await _in_edges(c, c.lo + 4)
    await _twice(c, Op.REMOVE_EDGES, RemoveEdgesArgs(before[:1]).encode(), "remove-1")  # no error resent

    async def check() -> None:
        np.testing.assert_array_equal(await _in_edges(c, c.lo + 4), before[1:])

    return check


async def scenario_add_nodes(c: Cluster) -> Callable[[], Awaitable[None]]:
    args = AddNodesArgs(2).encode()
    await _twice(c, Op.ADD_NODES, args, "nodes-1")  # two nodes, not four
    added = np.asarray(await c.call(Op.ADD_NODES, _with_rid(args, "nodes-1")))  # the same IDs
    np.testing.assert_array_equal(added, [c.num_nodes, c.num_nodes + 2])  # N + p + k * P, p = 0
    await c.call(Op.ADD_EDGES, AddEdgesArgs(np.array([c.lo]), added[1:]).encode())

    async def check() -> None:
        assert list(await _in_edges(c, int(added[1]))) != []
        assert list(await _in_edges(c, int(added[0]))) == []
        with pytest.raises(InvalidRequestError):  # a third node was never added
            await _in_edges(c, c.num_nodes + 4)

    return check


async def scenario_compact(c: Cluster) -> Callable[[], Awaitable[None]]:
    edges = await _in_edges(c, c.lo + 3)  # the edges add_edges appended, folded now
    await _twice(c, Op.COMPACT, {}, "compact-1")  # one compaction, not two

    async def check() -> None:
        np.testing.assert_array_equal(await _in_edges(c, c.lo + 3), edges)
        assert (await c.call(Op.STATS, {}))["compactions"] == 1

    return check


SCENARIOS: dict[Op, list[Callable[[Cluster], Awaitable[Callable[[], Awaitable[None]]]]]] = {
    Op.PUSH: [scenario_push],
    Op.CREATE_TENSOR: [scenario_create_tensor, scenario_create_takes_one_reference_when_resent],
    Op.DELETE_TENSOR: [scenario_delete_tensor],
    Op.RELEASE_TENSORS: [scenario_release_tensors],
    Op.SPARSE_UPDATE: [scenario_sparse_update],
    Op.ADD_EDGES: [scenario_add_edges],
    Op.REMOVE_EDGES: [scenario_remove_edges],
    Op.ADD_NODES: [scenario_add_nodes],
    Op.COMPACT: [scenario_compact],
}


def test_every_write_op_has_a_durability_scenario() -> None:
    assert set(SCENARIOS) == set(WRITE_OPS)


def _logged_ops(state: Path) -> list[str]:
    return [str(r["op"]) for log in sorted(state.glob("part0/wal-*")) for r in WriteAheadLog.records(log)]


@pytest.mark.timeout(120)
async def test_every_write_is_logged_applied_once_and_restored_after_kill9(cluster: Cluster) -> None:
    c = cluster
    checks = []
    for op in sorted(WRITE_OPS):
        for scenario in SCENARIOS[op]:
            checks.append(await scenario(c))
    for check in checks:
        await check()
    logged = set(_logged_ops(c.state))
    assert logged == {str(op) for op in WRITE_OPS}, logged
    await c.kill9_and_restart()  # only the log holds the history now
    for check in checks:
        await check()


@pytest.mark.timeout(120)
async def test_references_survive_a_snapshot_then_kill9(cluster: Cluster) -> None:
    """A snapshot keeps the holders' reference counts: after restart the holder still frees it."""
    c = cluster
    await c.call(Op.CREATE_TENSOR, _create("node:held", c, holder="h4"))
    await c.call(Op.SNAPSHOT, SnapshotArgs(1).encode())
    await c.kill9_and_restart()
    assert "node:held" in await c.tensors()
    deleted = await c.call(Op.RELEASE_TENSORS, ReleaseTensorsArgs("h4", ["node:held"]).encode())
    assert deleted == ["node:held"]
    await c.kill9_and_restart()
    assert "node:held" not in await c.tensors()


# --- refused where the table says so ------------------------------------------------------
@pytest.fixture
def replicated(cora2, tmp_path: Path) -> Iterator[ServerGroup]:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, extra_args=["--log-level", "WARNING"]
    )
    yield group
    group.stop()


MINIMAL_ARGS: dict[Op, dict[str, Any]] = {
    Op.CREATE_TENSOR: CreateTensorArgs("node:x", "node", [4], "float32").encode(),
    Op.DELETE_TENSOR: {"name": "node:x"},
    Op.RELEASE_TENSORS: ReleaseTensorsArgs("h", ["node:x"]).encode(),
    Op.BARRIER: {"name": "b", "timeout": 1.0},
    Op.SNAPSHOT: {"epoch": 1},
    Op.SPARSE_UPDATE: SparseUpdateArgs(
        "node:x", np.array([0]), np.ones((1, 1), np.float32), {"kind": "adagrad", "lr": 0.1}
    ).encode(),
    Op.ADD_REPLICA: {"port": 1, "pid": 1},
    Op.ADD_EDGES: AddEdgesArgs(np.array([0]), np.array([0])).encode(),
    Op.REMOVE_EDGES: RemoveEdgesArgs(np.array([0])).encode(),
    Op.ADD_NODES: AddNodesArgs(1).encode(),
    Op.COMPACT: {},
}


async def test_a_replica_refuses_every_primary_only_op(replicated: ServerGroup) -> None:
    assert set(MINIMAL_ARGS) == set(PRIMARY_ONLY_OPS)
    host, port = replicated.bound[2]  # partition 0's replica
    conn = await Connection.open(host, port, graph_name=None, timeout=T)
    try:
        for op in sorted(PRIMARY_ONLY_OPS):
            with pytest.raises(InvalidRequestError, match="replica") as err:
                await conn.call(op, MINIMAL_ARGS[op], T)
            assert str(op) in str(err.value)
        await conn.call(Op.PING, {}, T)  # still serving
    finally:
        conn.close()


async def test_colocated_clients_run_exactly_the_attached_ops(replicated: ServerGroup) -> None:
    client = await AsyncClient.connect(replicated.addresses, use_shared_memory=True)
    try:
        local = [p for p in client.partitions if getattr(p, "server", None) is not None]
        assert local, "no partition was attached through shared memory"
        for partition in local:
            assert {op for op in Op if partition.runs_here(op)} == ATTACHED_OPS
    finally:
        await client.close()
