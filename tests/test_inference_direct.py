"""Direct layer-wise inference (issue 31 §5): a trainer computes the GraphSAGE layers of the nodes
of co-located partitions straight from their shared memory (no blocks, sampling requests, pulls
or loader thread), exactly; partitions that are not co-located still work (their destinations
through the loader, their source rows pulled), and so does resuming from a partial run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.dataloading import to_block
from asyncgraph.inference import layerwise_inference
from asyncgraph.inference_kernel import _numpy_sum, neighbour_sum, wait_ready
from asyncgraph.nn import GraphSAGE, SAGEConv
from asyncgraph.testing import start_servers, subprocess_env

WORKER = Path(__file__).resolve().parent / "workers" / "inference_direct_worker.py"


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


def _drop(g: asyncgraph.DistGraph, prefix: str) -> None:
    for name in list(g.ndata):
        if name.startswith(prefix + "."):
            g.ndata[name].delete()


def test_two_trainers_infer_their_partitions_from_shared_memory(pubmed2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """2 servers, 2 trainer processes on this host: every node of every layer is computed on
    the direct path (none through the loader), each trainer's share is its in-edge-balanced
    range, and the result equals the full-graph forward pass to 1e-5."""
    group = start_servers(pubmed2.part_config, tmp_path / "srv", num_parts=2, num_clients=2)
    try:
        out = tmp_path / "pred.npy"
        env = {**subprocess_env(), "ASYNCGRAPH_IP_CONFIG": str(group.ip_config()), "WORLD_SIZE": "2"}
        env["OMP_NUM_THREADS"] = "1"
        cmd = [sys.executable, str(WORKER), "--ip-config", str(group.ip_config()), "--out", str(out)]
        procs = [
            subprocess.Popen(
                cmd, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for r in (0, 1)
        ]
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
        asyncgraph.initialize(group.ip_config())
        try:
            g = asyncgraph.DistGraph("pubmed")
            model = GraphSAGE(500, 16, 3, n_layers=2)
            model.load_state_dict(torch.load(str(out) + ".model.pt"))
            want = _full_forward(g, list(model.eval().layers))
            n = g.num_nodes()
        finally:
            asyncgraph.finalize()
    finally:
        group.stop()
    np.testing.assert_allclose(np.load(out), want.numpy(), atol=1e-5, rtol=1e-5)
    shares = []
    for rank in (0, 1):
        row = json.loads(Path(f"{out}.rank{rank}.json").read_text())
        lo, hi = row["share"]
        shares.append((lo, hi))
        assert sorted(row["local"]) == [0, 1]
        assert row["stats"]["direct"] == 2 * (hi - lo)  # both layers, every node of the share
        assert row["stats"]["loader"] == 0
        assert row["stats"]["layers"] > 0
    assert shares[0][0] == 0 and shares[0][1] == shares[1][0] and shares[1][1] == n


def test_direct_equals_loader_for_every_aggregator(g: asyncgraph.DistGraph) -> None:
    """mean, sum and gcn layers, with and without bias, activation and norm, and a 3-layer
    model: the direct path gives the loader path's outputs to 1e-5."""
    torch.manual_seed(2)
    layers: list[torch.nn.Module] = [
        SAGEConv(500, 12, "sum", bias=False),
        SAGEConv(12, 8, "gcn", activation=torch.tanh),
        SAGEConv(8, 3, "mean", norm=torch.nn.LayerNorm(3)),
    ]
    stats: dict[str, float] = {}
    got = layerwise_inference(g, layers, "feat", batch_size=2500, name="dir", stats=stats)
    got_rows = got[0 : g.num_nodes()]
    _drop(g, "dir")
    assert stats["direct"] == 3 * g.num_nodes() and stats["loader"] == 0
    plain: dict[str, float] = {}
    want = layerwise_inference(g, layers, "feat", batch_size=2500, name="ldr", direct=False, stats=plain)
    assert plain["direct"] == 0 and plain["loader"] == 3 * g.num_nodes()
    torch.testing.assert_close(got_rows, want[0 : g.num_nodes()], atol=1e-5, rtol=1e-5)
    _drop(g, "ldr")


def test_partition_not_colocated_and_resume(pubmed2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Only partition 0 mapped here (partition 1 over its socket): partition 0's nodes take the
    direct path with partition 1's source rows pulled, partition 1's nodes the loader; exact.
    Then a resume after some scattered nodes lost their layer-1 rows recomputes only those."""
    group = start_servers(pubmed2.part_config, tmp_path / "srv", num_parts=2)
    asyncgraph.initialize(group.ip_config(), local_partitions=[0])
    try:
        g = asyncgraph.DistGraph("pubmed")
        assert g.local_partition_ids == [0]
        lo, hi = g.get_partition_book().node_range(0)
        torch.manual_seed(4)
        model = GraphSAGE(500, 16, 3, n_layers=2).eval()
        want = _full_forward(g, list(model.layers))
        stats: dict[str, float] = {}
        out = layerwise_inference(
            g, model, "feat", batch_size=3000, name="mix", keep_intermediate=True, stats=stats
        )
        torch.testing.assert_close(out[0 : g.num_nodes()], want, atol=1e-5, rtol=1e-5)
        assert stats["direct"] == 2 * (hi - lo)
        assert stats["loader"] == 2 * (g.num_nodes() - (hi - lo))
        lost = torch.arange(3, g.num_nodes(), 11)
        g.ndata["mix.done"][lost] = torch.ones(lost.numel(), dtype=torch.int8)
        g.ndata["mix.1"][lost] = torch.full((lost.numel(), 3), 99.0)
        again: dict[str, float] = {}
        out = layerwise_inference(g, model, "feat", batch_size=3000, name="mix", resume=True, stats=again)
        torch.testing.assert_close(out[0 : g.num_nodes()], want, atol=1e-5, rtol=1e-5)
        in_part0 = int(((lost >= lo) & (lost < hi)).sum())
        assert again["direct"] == in_part0 and again["loader"] == lost.numel() - in_part0
        _drop(g, "mix")
    finally:
        asyncgraph.finalize()
        group.stop()


@pytest.mark.parametrize("readonly", [False, True])
def test_neighbour_sum_compiled_equals_numpy(readonly: bool) -> None:
    """The compiled kernel and its numpy form: same sums, sources outside the rows' range and
    -1 positions skipped, non-contiguous destinations (starts/ends gathered)."""
    if os.environ.get("ASYNCGRAPH_NO_JIT", "") not in ("", "0"):
        pytest.skip("ASYNCGRAPH_NO_JIT is set")
    assert wait_ready(120.0)
    rng = np.random.default_rng(0)
    indptr = np.concatenate(([0], np.cumsum(rng.integers(0, 9, 300)))).astype(np.int64)
    indices = rng.integers(-1, 1000, int(indptr[-1])).astype(np.int64)
    rows = rng.standard_normal((400, 7)).astype(np.float32)
    rows.flags.writeable = not readonly
    pick = np.sort(rng.choice(300, 120, replace=False))
    for starts, ends in ((indptr[:-1], indptr[1:]), (indptr[pick], indptr[pick + 1])):
        got = np.ones((starts.size, 7), dtype=np.float32)
        want = np.ones((starts.size, 7), dtype=np.float32)
        neighbour_sum(got, starts, ends, indices, rows, 250)
        _numpy_sum(want, starts, ends, indices, rows, 250)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        ref = np.ones((starts.size, 7), dtype=np.float32)
        for i, (s, e) in enumerate(zip(starts, ends, strict=True)):
            for v in indices[s:e]:
                if 250 <= v < 650:
                    ref[i] += rows[v - 250]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
