"""A running ``DistNodeDataLoader`` takes a live graph's added nodes as seeds between epochs
(issue 35): ``loader.add_seeds(ids)``, on real servers and standalone (Cora, two partitions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncgraph.errors import OutOfRangeError
from asyncgraph.testing import start_servers


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["served", "standalone"])
def test_added_nodes_join_the_seed_set_at_the_next_epoch(mode: str, cora2: Any, tmp_path: Path) -> None:
    import asyncgraph
    from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler

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
        base = np.arange(8)
        loader = DistNodeDataLoader(g, base, NeighborSampler([3, 3]), 4, shuffle=True, seed=3)
        first = sorted(s for _, seeds, _ in loader for s in seeds.tolist())
        assert first == base.tolist() and len(loader) == 2
        feats = torch.rand(3, 1433)
        labels = torch.tensor([1, 2, 3], dtype=g.ndata["label"].dtype)
        new = torch.cat([g.add_nodes(2, data={"feat": feats[:2], "label": labels[:2]}, part=0)])
        new = torch.cat([new, g.add_nodes(1, data={"feat": feats[2:], "label": labels[2:]}, part=1)])
        g.add_edges(torch.tensor([0, 1, 2, int(new[0])]), torch.cat([new, torch.tensor([5])]))
        with pytest.raises(OutOfRangeError):  # not a node: nothing added
            loader.add_seeds(torch.tensor([int(new.max()) + 2 * 10]))
        assert len(loader) == 2
        loader.add_seeds(new)
        assert len(loader) == 3
        seen: dict[int, tuple[torch.Tensor, int]] = {}
        for input_nodes, seeds, blocks in loader:
            src_feats = blocks[0].srcdata["feat"]
            for i, s in enumerate(seeds.tolist()):
                position = input_nodes.tolist().index(s)
                seen[s] = (src_feats[position], int(blocks[-1].dstdata["label"][i]))
        assert sorted(seen) == sorted([*base.tolist(), *new.tolist()])
        for k, node in enumerate(new.tolist()):
            assert torch.equal(seen[node][0], feats[k])  # the rows given to add_nodes
            assert seen[node][1] == int(labels[k])
    finally:
        asyncgraph.finalize()
        if group is not None:
            group.stop()


@pytest.mark.timeout(150)
def test_layerwise_inference_covers_the_nodes_and_edges_of_a_live_graph(cora2: Any) -> None:
    """Layer-wise inference on an updated graph (standalone) equals the model on one block of
    the whole live graph, added nodes included; the shared-memory fast path (``direct``) stands
    aside on a live graph (it reads the base structure only), so both settings agree."""
    import asyncgraph
    from asyncgraph.dataloading import to_block
    from asyncgraph.inference import layerwise_inference
    from asyncgraph.nn import GraphSAGE

    asyncgraph.initialize()
    g = asyncgraph.DistGraph("cora", part_config=cora2.part_config)
    try:
        n = g.num_nodes()
        torch.manual_seed(0)
        new = torch.cat([g.add_nodes(2, data={"feat": torch.rand(2, 1433)}, part=p) for p in (0, 1)])
        g.add_edges(torch.tensor([0, 1, 2, 3, int(new[0])]), torch.cat([new, torch.tensor([7])]))
        g.remove_edges(torch.arange(0, 400, 3))
        nodes = torch.cat([torch.arange(n), new])
        src, dst = g.edges()
        full = to_block(src, dst, nodes)
        model = GraphSAGE(1433, 8, 3, n_layers=2).eval()
        h = g.ndata["feat"][nodes]
        with torch.no_grad():
            h = model.layers[1](full, torch.relu(model.layers[0](full, h)))
        for direct in (True, False):
            out = layerwise_inference(
                g, model, "feat", batch_size=1000, name=f"lv{int(direct)}", direct=direct
            )
            torch.testing.assert_close(out[nodes], h, atol=1e-5, rtol=1e-5)
    finally:
        asyncgraph.finalize()
