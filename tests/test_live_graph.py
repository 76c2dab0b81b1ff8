"""A live graph (issue 35): edges added and removed while clients sample, on real servers.

Cora in two partitions, served by real server processes (co-located clients through shared
memory, and clients over the socket only) and standalone. Every check compares against a
model of the live edge set built from the base graph and the acknowledged updates.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    MemoryBudgetError,
    OutOfRangeError,
    ShapeMismatchError,
    UnknownEdgeError,
    UnknownTensorError,
)
from asyncgraph.net.connection import Connection
from asyncgraph.protocol.ops import AddEdgesArgs, Op
from asyncgraph.testing import ServerGroup, start_servers

T = 20.0


class Model:
    """The live edge set: ``eid -> (src, dst)``, from the base graph and acknowledged updates."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> None:
        self.edges = {int(e): (int(s), int(d)) for e, (s, d) in enumerate(zip(src, dst, strict=True))}
        self.num_nodes = num_nodes
        self.num_base_edges = len(self.edges)
        self.removed: list[int] = []
        self.new_nodes: list[int] = []

    def add(self, eids: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        for e, s, d in zip(eids.tolist(), src.tolist(), dst.tolist(), strict=True):
            assert e not in self.edges
            self.edges[e] = (s, d)

    def remove(self, eids: np.ndarray) -> None:
        for e in eids.tolist():
            del self.edges[e]
            self.removed.append(e)

    def in_degrees(self) -> np.ndarray:
        """Indexed by node ID, added nodes included (IDs in between are not nodes)."""
        dst = np.array([d for _, d in self.edges.values()], dtype=np.int64)
        return np.bincount(dst, minlength=max([self.num_nodes, *self.new_nodes]) + 1)

    def nodes(self) -> np.ndarray:
        return np.concatenate([np.arange(self.num_nodes), np.array(self.new_nodes, dtype=np.int64)])


async def check_equals_model(client: AsyncClient, model: Model) -> None:
    """Degrees, endpoints and a full-neighbourhood sample of every node match the model, and
    no removed edge is found or sampled."""
    degrees = model.in_degrees()
    np.testing.assert_array_equal(await client.degrees(None, "in"), degrees[: model.num_nodes])
    np.testing.assert_array_equal(await client.degrees(model.nodes(), "in"), degrees[model.nodes()])
    eids = np.array(sorted(model.edges), dtype=np.int64)
    src, dst = await client.find_edges(eids)
    expect = np.array([model.edges[e] for e in eids.tolist()], dtype=np.int64)
    np.testing.assert_array_equal(np.stack([src, dst], 1), expect)
    s, d, e = await client.sample_neighbors(model.nodes(), -1)
    order = np.argsort(e)
    np.testing.assert_array_equal(e[order], eids)
    np.testing.assert_array_equal(np.stack([s[order], d[order]], 1), expect)
    for gone in model.removed[:5]:
        with pytest.raises(UnknownEdgeError):
            await client.find_edges([gone])


async def update_sequence(client: AsyncClient, model: Model, rng: np.random.Generator) -> None:
    """Adds across both owners, removals of base and of new edges, adds after removals."""
    n = model.num_nodes
    for size in (1, 40, 300):
        src, dst = rng.integers(0, n, size), rng.integers(0, n, size)
        model.add(await client.add_edges(src, dst), src, dst)
    live = np.array(sorted(model.edges), dtype=np.int64)
    base = live[live < 1000][::37]
    new = live[live >= model.num_base_edges][::5]
    await client.remove_edges(np.concatenate([base, new]))
    model.remove(np.concatenate([base, new]))
    hub = np.array([0, 0, 0, 5], dtype=np.int64)  # a node with several new in-edges
    model.add(await client.add_edges(np.array([1, 2, 3, 4]), hub), np.array([1, 2, 3, 4]), hub)
    # added nodes: on a given partition and on the least loaded one, wired to old and new nodes
    new = [await client.add_nodes(3, part=0), await client.add_nodes(2, part=1), await client.add_nodes(4)]
    ids = np.concatenate(new)
    model.new_nodes.extend(ids.tolist())
    src = np.concatenate([ids, rng.integers(0, n, ids.size), ids[::-1]])
    dst = np.concatenate([rng.integers(0, n, ids.size), ids, ids])
    model.add(await client.add_edges(src, dst), src, dst)


@pytest.fixture
async def base_model(cora2: Any) -> AsyncIterator[Model]:
    client = AsyncClient.standalone(cora2.part_config)
    try:
        e = np.arange(client.book.num_edges)
        src, dst = await client.find_edges(e)
        yield Model(src, dst, client.book.num_nodes)
    finally:
        await client.close()


@pytest.fixture
def servers(cora2: Any, tmp_path: Path) -> Any:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    yield group
    group.stop()


def _copy(model: Model) -> Model:
    out = Model(np.empty(0), np.empty(0), model.num_nodes)
    out.edges, out.num_base_edges = dict(model.edges), model.num_base_edges
    return out


@pytest.mark.timeout(180)
async def test_served_equals_standalone_after_the_same_updates(
    cora2: Any, servers: ServerGroup, base_model: Model
) -> None:
    standalone = AsyncClient.standalone(cora2.part_config)
    shm = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    sock = await AsyncClient.connect(servers.addresses, use_shared_memory=False)
    try:
        assert shm.local_partitions() == [0, 1]  # co-located: reads through shared memory
        served_model, alone_model = _copy(base_model), _copy(base_model)
        await shm.sample_neighbors(np.arange(50), 3, seed=1)  # attached before the updates
        await update_sequence(shm, served_model, np.random.default_rng(5))
        await update_sequence(standalone, alone_model, np.random.default_rng(5))
        assert served_model.edges == alone_model.edges  # the same new IDs
        n = base_model.num_nodes
        assert served_model.new_nodes[:5] == [n, n + 2, n + 4, n + 1, n + 3]  # N + p + k * P
        for client in (shm, sock):
            await check_equals_model(client, served_model)
        await check_equals_model(standalone, alone_model)
        seeds = np.arange(0, base_model.num_nodes, 3)
        for fanout, replace in ((2, False), (5, True), (-1, False)):
            want = await standalone.sample_neighbors(seeds, fanout, replace=replace, seed=11)
            for client in (shm, sock):
                got = await client.sample_neighbors(seeds, fanout, replace=replace, seed=11)
                for a, b in zip(got, want, strict=True):
                    np.testing.assert_array_equal(a, b)
        info = await sock.server_stats()
        assert sum(i["overlay_edges"] for i in info) == 341 + 4 + 27
        assert sum(i["overlay_nodes"] for i in info) == 9
    finally:
        for c in (shm, sock, standalone):
            await c.close()


@pytest.mark.timeout(120)
async def test_a_removed_edge_is_never_sampled_after_its_ack(servers: ServerGroup) -> None:
    writer = await AsyncClient.connect(servers.addresses, use_shared_memory=False)
    reader = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    try:
        degrees = await writer.degrees(None, "in")
        hubs = np.argsort(degrees)[-20:]
        await reader.sample_neighbors(hubs, 2, seed=0)  # mapped before any update
        _, _, eids = await writer.sample_neighbors(hubs, -1)
        rng = np.random.default_rng(0)
        for round_ in range(5):
            gone = rng.choice(eids, size=eids.size // 8, replace=False)
            await writer.remove_edges(gone)
            eids = np.setdiff1d(eids, gone)
            for client in (reader, writer):
                for seed in range(3):
                    for fanout in (1, 4, -1):
                        _, _, got = await client.sample_neighbors(hubs, fanout, seed=seed + 10 * round_)
                        assert not np.isin(got, gone).any()
                        assert np.isin(got, eids).all()
            with pytest.raises(UnknownEdgeError):
                await writer.remove_edges(gone[:1])  # removed already: refused, nothing changes
    finally:
        await writer.close()
        await reader.close()


@pytest.mark.timeout(120)
async def test_bad_updates_are_typed_and_change_nothing(servers: ServerGroup, base_model: Model) -> None:
    client = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    try:
        model = _copy(base_model)
        model.add(await client.add_edges([1, 2], [3, 2000]), np.array([1, 2]), np.array([3, 2000]))
        n, e = model.num_nodes, model.num_base_edges
        bad: list[tuple[type[Exception], Any]] = [
            (OutOfRangeError, client.add_edges([n], [0])),  # unknown source node
            (OutOfRangeError, client.add_edges([0], [n + 5])),  # unknown destination node
            (OutOfRangeError, client.add_edges([-1], [0])),
            (ShapeMismatchError, client.add_edges([0, 1], [2])),
            (DTypeMismatchError, client.add_edges(np.array([0.5]), np.array([1.0]))),
            (UnknownEdgeError, client.remove_edges([e + 2 * 1000])),  # a new ID never allocated
            (UnknownEdgeError, client.remove_edges([5, e + 9999])),  # one live, one unknown
            (OutOfRangeError, client.remove_edges([-3])),
            (OutOfRangeError, client.add_edges([n + 2 * 50], [0])),  # a source never added
            (OutOfRangeError, client.add_edges([0], [n + 1 + 2 * 50])),  # a destination never added
            (OutOfRangeError, client.sample_neighbors([n + 2 * 50], 2)),
            (InvalidRequestError, client.add_nodes(-1)),
            (OutOfRangeError, client.add_nodes(1, part=2)),
        ]
        for kind, call in bad:
            with pytest.raises(kind):
                await call
        await check_equals_model(client, model)
        # a hostile request straight to a server: checked there too, nothing changes
        host, port = servers.addresses[0]
        conn = await Connection.open(host, port, graph_name=None, timeout=T)
        try:
            foreign = np.array([n - 1], dtype=np.int64)  # owned by partition 1
            with pytest.raises(OutOfRangeError):
                await conn.call(Op.ADD_EDGES, {**AddEdgesArgs(foreign, foreign).encode(), "rid": "x1"}, T)
            with pytest.raises(ShapeMismatchError):
                args = {"src": np.array([0, 1]), "dst": np.array([0]), "rid": "x2"}
                await conn.call(Op.ADD_EDGES, args, T)
        finally:
            conn.close()
        await check_equals_model(client, model)
    finally:
        await client.close()


@pytest.mark.timeout(180)
async def test_updates_survive_kill9_with_wal_exactly(cora2: Any, tmp_path: Path, base_model: Model) -> None:
    state = tmp_path / "state"
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--state-dir", str(state), "--wal"],
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, reconnect_window=30.0)
        model = _copy(base_model)
        rng = np.random.default_rng(3)
        await update_sequence(client, model, rng)
        await client.snapshot()  # half the history in a snapshot, half in the log after it
        await update_sequence(client, model, rng)
        seeds = np.arange(0, model.num_nodes, 7)
        before = await client.sample_neighbors(seeds, 3, seed=4)
        for index in (0, 1):
            group.kill(index)
            group.restart(index)
        await check_equals_model(client, model)
        after = await client.sample_neighbors(seeds, 3, seed=4)
        for a, b in zip(after, before, strict=True):
            np.testing.assert_array_equal(a, b)
        # a resend of an applied add_edges (same request id) answers the same IDs, adds nothing
        host, port = group.addresses[0]
        conn = await Connection.open(host, port, graph_name=None, timeout=T)
        try:
            args = {**AddEdgesArgs(np.array([7]), np.array([8])).encode(), "rid": "once"}
            first = np.asarray(await conn.call(Op.ADD_EDGES, args, T))
            again = np.asarray(await conn.call(Op.ADD_EDGES, args, T))
            np.testing.assert_array_equal(first, again)
            model.add(first, np.array([7]), np.array([8]))
        finally:
            conn.close()
        group.kill(0)
        group.restart(0)
        await check_equals_model(client, model)
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(120)
async def test_colocated_readers_see_updates_without_the_socket(
    servers: ServerGroup, base_model: Model
) -> None:
    """A co-located reader maps the owner's overlay: after a growth (new memfds) it maps it
    again, and within a layout it reads each update from shared memory. Proven with both
    servers stopped (SIGSTOP): the reader still answers every structure read."""
    writer = await AsyncClient.connect(servers.addresses, use_shared_memory=False)
    reader = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    model = _copy(base_model)
    rng = np.random.default_rng(8)
    try:
        await reader.sample_neighbors(np.arange(10), 2, seed=0)  # mapped before any update
        src, dst = rng.integers(0, model.num_nodes, 3000), rng.integers(0, model.num_nodes, 3000)
        model.add(await writer.add_edges(src, dst), src, dst)  # > the first capacity: grown
        await check_equals_model(reader, model)  # re-mapped
        assert all(p.store is not None and p.store.overlay is not None for p in reader.partitions)
        src, dst = rng.integers(0, model.num_nodes, 20), rng.integers(0, model.num_nodes, 20)
        model.add(await writer.add_edges(src, dst), src, dst)
        gone = np.array(sorted(model.edges), dtype=np.int64)[::50]
        await writer.remove_edges(gone)
        model.remove(gone)
        for proc in servers.procs:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            await asyncio.wait_for(check_equals_model(reader, model), 30.0)
        finally:
            for proc in servers.procs:
                os.kill(proc.pid, signal.SIGCONT)
    finally:
        await writer.close()
        await reader.close()


@pytest.mark.timeout(180)
async def test_replicas_agree_with_their_primary(cora2: Any, tmp_path: Path, base_model: Model) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, num_servers=2, extra_args=["--log-level", "WARNING"]
    )
    try:
        client = await AsyncClient.connect(group.addresses, use_shared_memory=False, use_replicas=True)
        model = _copy(base_model)
        await client.degrees(None, "in")  # replicas in use before the updates
        await update_sequence(client, model, np.random.default_rng(2))
        for _ in range(3):  # reads take turns over primary and replica
            await check_equals_model(client, model)
        expect = model.in_degrees()
        for index in range(2, len(group.bound)):  # each replica, asked directly
            host, port = group.bound[index]
            conn = await Connection.open(host, port, graph_name=None, timeout=T)
            try:
                info = await conn.call(Op.INFO, {}, T)
                lo, hi = client.book.node_range(int(info["part_id"]))
                got = await conn.call(Op.DEGREES, {"ids": None, "edge_dir": "in"}, T)
                np.testing.assert_array_equal(np.asarray(got), expect[lo:hi])
            finally:
                conn.close()
        await client.close()
    finally:
        group.stop()


@pytest.mark.timeout(180)
async def test_ten_writers_and_four_samplers(servers: ServerGroup, base_model: Model) -> None:
    """10 writers add and remove edges while 4 samplers sample, for a bounded number of rounds:
    no error, no sample holds an edge whose removal was acknowledged before it started, and
    the final graph is the base plus every acknowledged update."""
    n = base_model.num_nodes
    model = _copy(base_model)
    removed_acked: set[int] = set()
    writing = True

    async def writer(index: int) -> None:
        client = await AsyncClient.connect(servers.addresses, use_shared_memory=index % 2 == 0)
        rng = np.random.default_rng(100 + index)
        mine: list[int] = []
        try:
            for round_ in range(12):
                size = int(rng.integers(1, 60))
                src, dst = rng.integers(0, n, size), rng.integers(0, n, size)
                eids = await client.add_edges(src, dst)
                model.add(eids, src, dst)
                mine.extend(eids.tolist())
                if round_ % 3 == 2:  # remove some of its own edges, and a base edge of its own
                    gone = np.array([*mine[::4], index * 1000 + round_], dtype=np.int64)
                    await client.remove_edges(gone)
                    model.remove(gone)
                    removed_acked.update(gone.tolist())
                    mine = [e for e in mine if e not in removed_acked]
        finally:
            await client.close()

    async def sampler(index: int) -> int:
        client = await AsyncClient.connect(servers.addresses, use_shared_memory=index < 3)
        rng = np.random.default_rng(200 + index)
        samples = 0
        try:
            while writing and samples < 5000:  # bounded; a co-located sample never waits on I/O,
                await asyncio.sleep(0.002)  # so give the writers' tasks the loop between samples
                before = set(removed_acked)
                seeds = rng.integers(0, n, 200)
                _, _, eids = await client.sample_neighbors(seeds, int(rng.choice([-1, 3])), seed=samples)
                assert not before.intersection(eids.tolist())
                samples += 1
        finally:
            await client.close()
        return samples

    samplers = [asyncio.ensure_future(sampler(i)) for i in range(4)]
    try:
        await asyncio.gather(*(writer(i) for i in range(10)))
    finally:
        writing = False
    counts = await asyncio.gather(*samplers)
    assert all(c > 0 for c in counts)
    check = await AsyncClient.connect(servers.addresses, use_shared_memory=True)
    try:
        await check_equals_model(check, model)
    finally:
        await check.close()


def test_a_stale_overlay_view_is_refused_then_mapped_again(cora2: Any) -> None:
    """A process mapping an owner's overlay reads it in place; once the owner grows it (new
    memfds) the old view is refused (never read past its arrays) until mapped again."""
    from test_storage import ExporterThread

    from asyncgraph.partition import load_partition
    from asyncgraph.service import PartitionService
    from asyncgraph.service.live import OverlayMovedError
    from asyncgraph.storage.fdpass import attach_store, fetch_catalog
    from asyncgraph.storage.store import PartitionStore

    owner = PartitionService(PartitionStore.from_partition(load_partition(cora2.part_config, 0), shared=True))
    exported = ExporterThread(owner.store, label="live.p0")
    lo, hi = owner.store.node_range
    try:
        owner.add_edges(np.array([hi - 1]), np.array([lo]))
        reader_store = attach_store(exported.exporter.address, exported.exporter.token)
        reader = PartitionService(reader_store)
        try:
            seeds = np.array([lo, lo + 1])
            np.testing.assert_array_equal(reader.degrees(seeds, "in"), owner.degrees(seeds, "in"))
            owner.add_edges(np.full(3000, hi - 2), np.full(3000, lo + 1))  # past the capacity: grown
            assert reader_store.catalog_stale
            with pytest.raises(OverlayMovedError):
                reader.degrees(seeds, "in")
            reader_store.sync_catalog(*fetch_catalog(exported.exporter.address, exported.exporter.token))
            np.testing.assert_array_equal(reader.degrees(seeds, "in"), owner.degrees(seeds, "in"))
            owner.add_edges(np.array([hi - 3]), np.array([lo]))  # in place: read without re-mapping
            assert not reader_store.catalog_stale
            np.testing.assert_array_equal(
                reader.sample(seeds, -1, False, 1), owner.sample(seeds, -1, False, 1)
            )
        finally:
            reader_store.close()
    finally:
        exported.close()
        owner.store.close()


@pytest.mark.timeout(120)
async def test_the_overlay_counts_against_the_memory_budget(
    cora2: Any, tmp_path: Path, base_model: Model
) -> None:
    """An update whose overlay growth would pass ``--memory-budget`` is refused with
    ``MemoryBudgetError`` and changes nothing; smaller ones go on."""
    from asyncgraph.partition import load_partition
    from asyncgraph.storage.store import PartitionStore

    held = []
    for part in (0, 1):
        with PartitionStore.from_partition(load_partition(cora2.part_config, part), shared=False) as store:
            held.append(sum(size for _, size in store.local_sizes().values()))
    budget = max(held) + 300_000  # room for a first overlay (~60 kB), not for 20k more edges
    group = start_servers(
        cora2.part_config,
        tmp_path / "run",
        num_parts=2,
        extra_args=["--log-level", "WARNING", "--memory-budget", str(budget)],
    )
    client = await AsyncClient.connect(group.addresses, use_shared_memory=False)
    try:
        model = _copy(base_model)
        model.add(await client.add_edges([1, 2], [3, 4]), np.array([1, 2]), np.array([3, 4]))
        many = np.full(20_000, 3)
        with pytest.raises(MemoryBudgetError):
            await client.add_edges(many, many)
        with pytest.raises(MemoryBudgetError):
            await client.add_nodes(1 << 20, part=0)
        await check_equals_model(client, model)
        model.add(await client.add_edges([5] * 100, [6] * 100), np.full(100, 5), np.full(100, 6))
        await check_equals_model(client, model)
    finally:
        await client.close()
        group.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["served", "standalone"])
def test_distgraph_updates_with_dgl_names(mode: str, cora2: Any, tmp_path: Path) -> None:
    """``DistGraph.add_edges`` / ``remove_edges`` / ``add_nodes`` (DGL's names, torch in and out)."""
    import torch

    import asyncgraph

    group = None
    if mode == "served":
        group = start_servers(
            cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
        )
        asyncgraph.initialize(group.ip_config())
        g = asyncgraph.DistGraph("cora")
    else:
        asyncgraph.initialize()
        g = asyncgraph.DistGraph("cora", part_config=cora2.part_config)
    try:
        n, e = g.num_nodes(), g.num_edges()
        before = g.in_degrees(torch.tensor([0, 1]))
        eids = g.add_edges(torch.tensor([5, 6, 7]), torch.tensor([0, 0, 1]))
        assert eids.dtype == torch.int64 and bool((eids >= e).all())
        assert g.in_degrees(torch.tensor([0, 1])).tolist() == [int(before[0]) + 2, int(before[1]) + 1]
        src, dst = g.find_edges(eids)
        assert src.tolist() == [5, 6, 7] and dst.tolist() == [0, 0, 1]
        g.remove_edges(eids[:1])
        assert g.in_degrees(0) == int(before[0]) + 1
        new = g.add_nodes(2, part=1)
        assert new.tolist() == [n + 1, n + 3]
        g.add_edges(torch.tensor([0, 1]), new)
        sampled_src, _, _ = g.sample_neighbors(new, -1, output="tuple")
        assert sorted(sampled_src.tolist()) == [0, 1]
        assert g.sample_neighbors(new, -1).num_nodes() == n + 4  # it holds the added nodes
        assert g.num_nodes() == n  # the base nodes; added ones are reached by ID
        with pytest.raises(UnknownTensorError):  # data of new edges: of an edge tensor that exists
            g.add_edges(torch.tensor([0]), torch.tensor([1]), data={"w": torch.ones(1)})
        with pytest.raises(UnknownEdgeError):
            g.remove_edges(eids[:1])
    finally:
        asyncgraph.finalize()
        if group is not None:
            group.stop()
