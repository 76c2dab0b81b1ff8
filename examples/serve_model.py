"""Online inference: train GraphSAGE briefly, save it, serve it next to the graph, query it.

Standalone on Cora (partitioned into a temporary folder; the serve process holds the partitions):
    python examples/serve_model.py
With a model trained by examples/train_dist.py (``--save-model DIR``) and running servers:
    python examples/serve_model.py --part-config data/pubmed2/pubmed.json --model DIR \\
        --servers ip_config.txt

It starts ``python -m asyncgraph.serve`` (HTTP, KServe's Open Inference Protocol v2, and the
msgpack protocol), asks for a few nodes' outputs with ``asyncgraph.InferenceClient`` over both,
prints the predicted classes and the ``curl`` line that asks the same, then stops the server with
SIGTERM (it drains, then exits).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import asyncgraph
from asyncgraph.dataloading import DistNodeDataLoader, NeighborSampler
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import save_model

CORA = Path(__file__).resolve().parent / "data" / "cora.npz"


def train(part_config: Path, out: Path, epochs: int) -> Path:
    """Train GraphSAGE on ``part_config`` standalone for ``epochs`` and save its artifact in ``out``."""
    asyncgraph.initialize()
    g = asyncgraph.DistGraph(asyncgraph.PartitionConfig.load(part_config).graph_name, part_config=part_config)
    fanouts = [10, 10]
    train_nids = asyncgraph.node_split(g.ndata["train_mask"][0 : g.num_nodes()], g.get_partition_book())
    loader = DistNodeDataLoader(g, train_nids, NeighborSampler(fanouts), batch_size=256)
    kwargs = {"in_feats": int(g.ndata["feat"].shape[1]), "hidden": 32,
              "n_classes": int(g.ndata["label"][0 : g.num_nodes()].max()) + 1, "n_layers": 2}  # fmt: skip
    model = GraphSAGE(**kwargs)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        for _input_nodes, _seeds, blocks in loader:
            loss = torch.nn.functional.cross_entropy(
                model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}")
    loader.close()
    asyncgraph.finalize()
    return save_model(out, model, name="sage", kwargs=kwargs, fanouts=fanouts)


def serve(
    part_config: Path, model: Path, servers: Path | None, workdir: Path
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start ``python -m asyncgraph.serve`` on free loopback ports; wait until it is ready."""
    ready = workdir / "serve-ready.json"
    argv = [sys.executable, "-m", "asyncgraph.serve", "--part-config", str(part_config),
            "--model", str(model), "--port", "0", "--msgpack-port", "0",
            "--ready-file", str(ready)]  # fmt: skip
    if servers is not None:
        argv += ["--servers", str(servers)]
    proc = subprocess.Popen(argv)
    end = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise SystemExit("the serve process did not become ready")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part-config", type=Path, help="default: Cora, partitioned into a temp folder")
    ap.add_argument("--model", type=Path, help="a saved model folder (default: train one briefly)")
    ap.add_argument("--servers", type=Path, help="ip_config of running servers (default: standalone)")
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        part_config = args.part_config
        if part_config is None:
            asyncgraph.partition_graph(asyncgraph.Graph.from_npz(CORA), "cora", 1, work / "cora")
            part_config = work / "cora" / "cora.json"
        model = args.model or train(part_config, work / "model", args.epochs)
        proc, where = serve(part_config, model, args.servers, work)
        try:
            nodes = [0, 1, 2, 3, 100]
            with asyncgraph.InferenceClient(
                f"tcp://127.0.0.1:{where['msgpack_port']}", model="sage"
            ) as client:
                logits = client.infer(nodes)  # float32 [5, classes], msgpack
            with asyncgraph.InferenceClient(f"http://127.0.0.1:{where['port']}", model="sage") as client:
                same = client.infer(nodes)  # the same over HTTP (OIP v2)
            print(f"nodes {nodes}: predicted classes {logits.argmax(1).tolist()}")
            print(f"msgpack and HTTP answers equal: {bool(np.array_equal(logits, same))}")
            body = json.dumps(
                {"inputs": [{"name": "nodes", "datatype": "INT64", "shape": [2], "data": [0, 1]}]}
            )
            print(f"curl -s -X POST http://127.0.0.1:{where['port']}/v2/models/sage/infer -d '{body}'")
        finally:
            proc.send_signal(signal.SIGTERM)  # drains in-flight requests, then exits 0
            print(f"serve process exited with {proc.wait(timeout=60)}")


if __name__ == "__main__":
    main()
