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
        self.zero: set[int] = set()  # edges whose weight "edge:p" is 0

    def listed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        eids = np.array(sorted(self.edges), dtype=np.int64)
        pairs = np.array([self.edges[e] for e in eids.tolist()], dtype=np.int64)
        return pairs[:, 0], pairs[:, 1], eids

    def out_degrees(self, ids: np.ndarray) -> np.ndarray:
        src = np.array([s for s, _ in self.edges.values()], dtype=np.int64)
        return np.array([int((src == i).sum()) for i in ids.tolist()], dtype=np.int64)


async def update(client: AsyncClient, model: Edges, rng: np.random.Generator) -> None:
    n, e = client.book.num_nodes, client.book.num_edges
    await client.create_tensor("edge:p", "edge", [e], "float32")
    base_p = np.where(np.arange(e) % 5 == 0, 0.0, 1.0 + np.arange(e) % 3).astype(np.float32)
    await client.push("edge:p", np.arange(e), base_p)  # every fifth base edge weighs 0
    new = np.concatenate([await client.add_nodes(2, part=0), await client.add_nodes(3, part=1)])
    model.added.extend(new.tolist())
    src = np.concatenate([rng.integers(0, n, 200), new, new[:2]])
    dst = np.concatenate([rng.integers(0, n, 200), rng.integers(0, n, new.size), new[3:]])
    new_p = np.where(np.arange(src.size) % 4 == 0, 0.0, 2.0).astype(np.float32)  # every fourth: 0
    added = await client.add_edges(src, dst, data={"edge:p": new_p})
    model.zero.update(added[new_p == 0].tolist())
    model.zero.update(np.flatnonzero(base_p == 0).tolist())
    for eid, s, d in zip(added.tolist(), src.tolist(), dst.tolist(), strict=True):
        model.edges[eid] = (s, d)
    live = np.array(sorted(model.edges), dtype=np.int64)
    gone = np.concatenate([live[: client.book.num_edges][::41], live[client.book.num_edges :][::7]])
    await client.remove_edges(gone)
    for e in gone.tolist():
        del model.edges[e]


async def check_sample_edges(
    served: tuple[AsyncClient, ...], standalone: AsyncClient, model: Edges, nodes: np.ndarray
) -> None:
    """``sample_edges`` in and out, weighted, excluding, with and without replacement: served =
    standalone for one seed, and every pick a live edge of a seed, of weight > 0, not excluded."""
    exclude = np.array(sorted(model.edges), dtype=np.int64)[::9]
    for edge_dir in ("in", "out"):
        for fanout, replace, prob in ((3, False, "p"), (2, True, "p"), (-1, False, None), (4, False, None)):
            kwargs: dict[str, Any] = {"edge_dir": edge_dir, "replace": replace, "seed": 5, "prob": prob}
            want = await standalone.sample_edges(nodes, fanout, exclude=exclude, **kwargs)
            for client in served:
                got = await client.sample_edges(nodes, fanout, exclude=exclude, **kwargs)
                for a, b in zip(got, want, strict=True):
                    np.testing.assert_array_equal(a, b)
            src, dst, eids = want
            assert eids.size
            assert all(
                model.edges[e] == (s, d)
                for e, s, d in zip(eids.tolist(), src.tolist(), dst.tolist(), strict=True)
            )
            assert not np.isin(eids, exclude).any()
            ends = dst if edge_dir == "in" else src
            assert np.isin(ends, nodes).all()
            if prob is not None:
                assert not set(eids.tolist()) & model.zero
            if fanout == -1:  # every live edge of the seeds that is not excluded
                want_all = {
                    e
                    for e, (s, d) in model.edges.items()
                    if (d if edge_dir == "in" else s) in set(nodes.tolist())
                    and e not in set(exclude.tolist())
                }
                assert set(eids.tolist()) == want_all


@pytest.mark.timeout(180)
async def test_out_degrees_edge_lists_and_sample_edges_read_base_and_overlay(
    cora2: Any, tmp_path: Path
) -> None:
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
        await check_sample_edges((shm, sock), standalone, served, nodes)
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
