"""Layer-wise inference (issue 27 §1): equal to a full-graph forward pass on one machine (PubMed,
served and standalone), resumable from its progress tensor, .npy output keyed by original IDs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.dataloading import to_block
from asyncgraph.errors import InvalidRequestError
from asyncgraph.inference import layerwise_inference, write_npy
from asyncgraph.nn import GraphConv, GraphSAGE


def _full_forward(g: asyncgraph.DistGraph, layers: list[torch.nn.Module]) -> torch.Tensor:
    """The reference: every layer on one block holding the whole graph, in one process."""
    n = g.num_nodes()
    src, dst = g.edges()
    full = to_block(src, dst, torch.arange(n))
    h = g.ndata["feat"][0:n]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            h = layer(full, h)
            if i != len(layers) - 1:
                h = torch.relu(h)
    return h


def test_layerwise_equals_full_graph_forward(g: asyncgraph.DistGraph, tmp_path: Path, pubmed2) -> None:
    torch.manual_seed(0)
    model = GraphSAGE(500, 32, 3, n_layers=3).eval()
    want = _full_forward(g, list(model.layers))
    out = layerwise_inference(g, model, g.ndata["feat"], batch_size=3000, name="lw")
    got = out[0 : g.num_nodes()]
    assert got.shape == (19717, 3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    names = set(g.ndata)
    assert "lw.2" in names and "lw.done" in names and "lw.0" not in names and "lw.1" not in names
    assert g.ndata["lw.done"].count_nonzero() == g.num_nodes()
    # a GraphConv stack through the same API, layers given as a list ("left"/"both" count a
    # source's out-degree inside the block, as DGL does: only "right"/"none" are batch-exact)
    convs = [GraphConv(500, 16, norm="right"), GraphConv(16, 4, norm="none")]
    if g.client.is_standalone:  # (the served run checks the same path above)
        torch.testing.assert_close(
            layerwise_inference(g, convs, "feat", batch_size=5000, name="gc")[0 : g.num_nodes()],
            _full_forward(g, convs), atol=1e-5, rtol=1e-5,
        )  # fmt: skip
        g.ndata["gc.1"].delete()
        g.ndata["gc.done"].delete()
    # .npy keyed by original IDs: row v is original node v's
    path = write_npy(out, tmp_path / "pred.npy", orig_nids=pubmed2.orig_nids, chunk_rows=4000)
    saved = np.load(path)
    assert np.array_equal(saved[pubmed2.orig_nids], got.numpy())
    for name in ("lw.2", "lw.done"):
        g.ndata[name].delete()


def test_resume_recomputes_only_unfinished_nodes(g: asyncgraph.DistGraph) -> None:
    torch.manual_seed(1)
    model = GraphSAGE(500, 16, 3, n_layers=2).eval()
    want = _full_forward(g, list(model.layers))
    layerwise_inference(g, model, "feat", batch_size=4000, name="rs", keep_intermediate=True)
    # as if a trainer died in layer 1: some nodes' layer-1 rows never written
    lost = torch.arange(100, 19717, 7)
    g.ndata["rs.done"][lost] = torch.ones(lost.numel(), dtype=torch.int8)
    g.ndata["rs.1"][lost] = torch.full((lost.numel(), 3), 99.0)
    calls: list[int] = []

    def step(i: int, layer: torch.nn.Module, block: object, h: torch.Tensor) -> torch.Tensor:
        calls.append(i)
        out = layer(block, h)
        return torch.relu(out) if i == 0 else out

    out = layerwise_inference(g, model, "feat", batch_size=4000, name="rs", resume=True, layer_fn=step)
    assert set(calls) == {1}  # layer 0 was complete: not recomputed
    torch.testing.assert_close(out[0 : g.num_nodes()], want, atol=1e-5, rtol=1e-5)
    for name in ("rs.1", "rs.done"):
        g.ndata[name].delete()


def test_bad_arguments_are_typed(g: asyncgraph.DistGraph) -> None:
    model = GraphSAGE(500, 8, 3, n_layers=2)
    with pytest.raises(InvalidRequestError, match="node tensor"):
        layerwise_inference(g, model, "nope")
    with pytest.raises(InvalidRequestError, match="batch_size"):
        layerwise_inference(g, model, "feat", batch_size=0)
    with pytest.raises(InvalidRequestError, match="fanouts"):
        layerwise_inference(g, model, "feat", fanouts=[5])
    with pytest.raises(InvalidRequestError, match="out_dims"):
        layerwise_inference(g, [torch.nn.Identity()], "feat")
    with pytest.raises(InvalidRequestError, match="name"):
        layerwise_inference(g, model, "feat", name="a:b")
    assert not any(n.startswith("inference.") for n in g.ndata)


def test_example_launched_two_trainers_matches_full_graph(tmp_path: Path) -> None:
    """examples/layerwise_inference.py, 2 partitions x 1 trainer: the .npy it writes (original
    IDs) equals the trained model's full-graph forward pass on the original PubMed to 1e-5."""
    import subprocess
    import sys

    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph
    from asyncgraph.testing import subprocess_env

    root = Path(__file__).resolve().parent.parent
    npz = root / "examples" / "data" / "pubmed.npz"
    partition_graph(Graph.from_npz(npz), "pubmed", 2, tmp_path / "p", part_method="random")
    cfg = tmp_path / "p" / "pubmed.json"
    cmd = [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(cfg), "--", sys.executable]
    cmd += [str(root / "examples" / "layerwise_inference.py"), "--part-config", str(cfg), "--epochs", "2"]
    cmd += ["--out", str(tmp_path / "pred.npy"), "--save-model", str(tmp_path / "model.pt")]
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "[trainer 0] layer-wise inference of 19717 nodes: test accuracy 0." in res.stdout + res.stderr
    z = np.load(npz)
    model = GraphSAGE(500, 64, 3, n_layers=2)
    model.load_state_dict(torch.load(tmp_path / "model.pt"))
    model.eval()
    full = to_block(z["src"], z["dst"], np.arange(z["label"].size))
    with torch.no_grad():
        want = model([full, full], torch.from_numpy(z["feat"]))
    np.testing.assert_allclose(np.load(tmp_path / "pred.npy"), want.numpy(), atol=1e-5, rtol=1e-5)


def test_killed_trainer_resumes_after_server_restart(pubmed2, tmp_path: Path) -> None:
    """A trainer dies mid layer 1; the servers (--state-dir --wal) are restarted; a new trainer
    with resume=True computes only the unfinished batches and the result is exact."""
    import subprocess
    import sys

    from asyncgraph.testing import start_servers, subprocess_env

    worker = Path(__file__).resolve().parent / "workers" / "inference_worker.py"
    args = ["--log-level", "WARNING", "--state-dir", str(tmp_path / "state"), "--wal"]
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}

    def trainer(group: object, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(worker), "--ip-config", str(group.ip_config()), *extra]  # type: ignore[attr-defined]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)

    group = start_servers(pubmed2.part_config, tmp_path / "a", num_parts=2, extra_args=args)
    try:
        died = trainer(group, "--die-after", "2")
        assert died.returncode == 9, died.stderr[-3000:]
    finally:
        group.stop()
    group = start_servers(pubmed2.part_config, tmp_path / "b", num_parts=2, extra_args=args)
    try:
        out = tmp_path / "pred.npy"
        done = trainer(group, "--out", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        asyncgraph.initialize(group.ip_config())
        try:
            g = asyncgraph.DistGraph("pubmed")
            model = GraphSAGE(500, 16, 3, n_layers=2)
            model.load_state_dict(torch.load(str(out) + ".model.pt"))
            want = _full_forward(g, list(model.eval().layers))
        finally:
            asyncgraph.finalize()
    finally:
        group.stop()
    assert int(np.load(str(out) + ".layer1_batches.npy")[0]) == 3  # 5 batches, 2 survived the kill
    np.testing.assert_allclose(np.load(out), want.numpy(), atol=1e-5, rtol=1e-5)
