"""Reads of a live graph that used to refuse an updated partition (issue 35): out-degrees,
the list of every edge (``g.edges()``, ``AsyncClient.live_edges``) and the PyG graph store's
``edge_index``, over base + added - removed edges. Real servers (socket and shared memory) and
standalone give the same answers as a model of the edge set after the same updates (Cora, two
partitions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncgraph.client import AsyncClient
from asyncgraph.errors import OutOfRangeError
from asyncgraph.testing import start_servers


class Edges:
    """The live edge set ``eid -> (src, dst)`` and the nodes added."""

    def __init__(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.edges = {e: (int(s), int(d)) for e, (s, d) in enumerate(zip(src, dst, strict=True))}
        self.added: list[int] = []

    def listed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        eids = np.array(sorted(self.edges), dtype=np.int64)
        pairs = np.array([self.edges[e] for e in eids.tolist()], dtype=np.int64)
        return pairs[:, 0], pairs[:, 1], eids

    def out_degrees(self, ids: np.ndarray) -> np.ndarray:
        src = np.array([s for s, _ in self.edges.values()], dtype=np.int64)
        return np.array([int((src == i).sum()) for i in ids.tolist()], dtype=np.int64)


async def update(client: AsyncClient, model: Edges, rng: np.random.Generator) -> None:
    n = client.book.num_nodes
    new = np.concatenate([await client.add_nodes(2, part=0), await client.add_nodes(3, part=1)])
    model.added.extend(new.tolist())
    src = np.concatenate([rng.integers(0, n, 200), new, new[:2]])
    dst = np.concatenate([rng.integers(0, n, 200), rng.integers(0, n, new.size), new[3:]])
    for e, s, d in zip((await client.add_edges(src, dst)).tolist(), src.tolist(), dst.tolist(), strict=True):
        model.edges[e] = (s, d)
    live = np.array(sorted(model.edges), dtype=np.int64)
    gone = np.concatenate([live[: client.book.num_edges][::41], live[client.book.num_edges :][::7]])
    await client.remove_edges(gone)
    for e in gone.tolist():
        del model.edges[e]


@pytest.mark.timeout(180)
async def test_out_degrees_and_edge_lists_read_base_and_overlay(cora2: Any, tmp_path: Path) -> None:
    group = start_servers(
        cora2.part_config, tmp_path / "run", num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    standalone = AsyncClient.standalone(cora2.part_config)
    try:
        shm = await AsyncClient.connect(group.addresses, use_shared_memory=True)
        sock = await AsyncClient.connect(group.addresses, use_shared_memory=False)
        assert await sock.live_edges() is None  # never updated: the base's range answers
        src, dst = await standalone.find_edges(np.arange(standalone.book.num_edges))
        served, alone = Edges(src, dst), Edges(src, dst)
        await shm.degrees(np.arange(5), "out")  # mapped before the updates
        await update(sock, served, np.random.default_rng(7))
        await update(standalone, alone, np.random.default_rng(7))
        assert served.edges == alone.edges
        nodes = np.concatenate([np.arange(0, standalone.book.num_nodes, 13), served.added])
        want = served.out_degrees(nodes)
        for client in (shm, sock, standalone):
            np.testing.assert_array_equal(await client.degrees(nodes, "out"), want)
            got = await client.live_edges()
            assert got is not None
            for a, b in zip(got, served.listed(), strict=True):
                np.testing.assert_array_equal(a, b)
        every = await sock.degrees(None, "out")  # every base node: this partition's shares, summed
        np.testing.assert_array_equal(every, served.out_degrees(np.arange(standalone.book.num_nodes)))
        with pytest.raises(OutOfRangeError):  # an added node that does not exist
            await sock.degrees(np.array([int(max(served.added)) + 2 * 10]), "out")
        for c in (shm, sock):
            await c.close()
    finally:
        await standalone.close()
        group.stop()


@pytest.mark.timeout(120)
def test_distgraph_edges_and_the_pyg_graph_store_after_updates(cora2: Any) -> None:
    import torch
    from torch_geometric.data.graph_store import EdgeLayout

    import asyncgraph
    from asyncgraph.pyg import DistGraphStore

    asyncgraph.initialize()
    g = asyncgraph.DistGraph("cora", part_config=cora2.part_config)
    try:
        src, dst, eids = (t.numpy() for t in g.edges(form="all"))
        model = Edges(src, dst)
        assert eids.tolist() == sorted(model.edges)
        new = g.add_nodes(2, part=1)
        added = g.add_edges(torch.tensor([0, 1, int(new[0])]), torch.tensor([int(new[1]), 2, 3]))
        for e, s, d in zip(added.tolist(), [0, 1, int(new[0])], [int(new[1]), 2, 3], strict=True):
            model.edges[e] = (s, d)
        g.remove_edges(torch.tensor([0, int(added[0])]))
        del model.edges[0], model.edges[int(added[0])]
        got = [t.numpy() for t in g.edges(form="all")]
        for a, b in zip(got, model.listed(), strict=True):
            np.testing.assert_array_equal(a, b)
        gs = DistGraphStore(g)
        coo = next(a for a in gs.get_all_edge_attrs() if a.layout == EdgeLayout.COO)
        row, col = gs[coo]
        want = model.listed()
        np.testing.assert_array_equal(row.numpy(), want[0])
        np.testing.assert_array_equal(col.numpy(), want[1])
    finally:
        asyncgraph.finalize()
