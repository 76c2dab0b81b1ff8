"""Typed requests (issue 36 item 2): ``{ntype: per-type IDs}`` answered by a typed model
(``HeteroGraphSAGE``, ACM over 2 real servers); with fanouts -1 the answers equal layer-wise
inference to 1e-5; the OIP body names one input per node type."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, UnknownTypeError
from asyncgraph.inference import layerwise_inference
from asyncgraph.nn import HeteroGraphSAGE
from asyncgraph.serve.artifact import load_model, save_model
from asyncgraph.serve.core import InferenceCore
from asyncgraph.serve.http import parse_infer_body
from asyncgraph.testing import start_servers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve_helpers import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm  # noqa: E402

WORDS = 64


@pytest.fixture(scope="module")
def acm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, asyncgraph.DistGraph, Path, Any]]:
    out = tmp_path_factory.mktemp("acm-serve")
    hg = load_acm(words=WORDS)
    asyncgraph.partition_graph(hg, "acm", 2, out / "parts", part_method="random")
    group = start_servers(out / "parts" / "acm.json", out / "srv", num_parts=2)
    try:
        asyncgraph.initialize(group.ip_config())
        torch.manual_seed(0)
        etypes = [list(c) for c in hg.canonical_etypes]
        kwargs = {"canonical_etypes": etypes, "in_feats": WORDS, "hidden": 16, "n_classes": 3,
                  "n_layers": 2, "target": "paper"}  # fmt: skip
        model_dir = save_model(
            out / "model", HeteroGraphSAGE(**kwargs), name="acm", kwargs=kwargs, fanouts=[-1, -1]
        )
        yield hg, asyncgraph.DistGraph("acm"), model_dir, group
    finally:
        asyncgraph.finalize()
        group.stop()


def test_typed_requests_equal_layerwise_inference(acm: tuple[Any, asyncgraph.DistGraph, Path, Any]) -> None:
    hg, g, model_dir, _ = acm
    spec, model = load_model(model_dir)
    core = InferenceCore(g.client.async_client, model, spec.fanouts)
    assert core.target == "paper"
    papers = np.array([0, 5, 17, 100, 5, hg.num_nodes("paper") - 1])
    homo = core.check_nodes({"paper": papers})
    seeds, inverse = np.unique(homo, return_inverse=True)
    got = g.client.loop.run(core.infer(seeds))[torch.from_numpy(inverse)]
    out = layerwise_inference(g, model, "feat", batch_size=1500, name="srv_typed")
    want = out["paper"][torch.from_numpy(papers)]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for name in ("srv_typed.1", "srv_typed.done"):
        g.ndata[name].delete()
    # a node of another type, an unknown type, a per-type ID out of range: typed errors
    with pytest.raises(InvalidRequestError, match="answers 'paper' nodes only"):
        core.check_nodes({"author": np.array([0])})
    with pytest.raises(UnknownTypeError, match="unknown node type 'nope'"):
        core.check_nodes({"nope": np.array([0])})
    with pytest.raises(OutOfRangeError, match=f"unknown node ID {hg.num_nodes('paper')}"):
        g.client.loop.run(core.added_exist(core.check_nodes({"paper": np.array([hg.num_nodes("paper")])})))
    core.close()


def test_oip_body_with_one_input_per_node_type() -> None:
    def body(*inputs: tuple[str, list[int]]) -> bytes:
        import json

        specs = [{"name": n, "datatype": "INT64", "shape": [len(d)], "data": d} for n, d in inputs]
        return json.dumps({"inputs": specs}).encode()

    nodes, _, _ = parse_infer_body(body(("paper", [1, 2]), ("author", [3])))
    assert isinstance(nodes, dict) and list(nodes) == ["paper", "author"]
    assert nodes["paper"].tolist() == [1, 2] and nodes["author"].tolist() == [3]
    nodes, _, _ = parse_infer_body(body(("nodes", [4])))
    assert isinstance(nodes, np.ndarray) and nodes.tolist() == [4]
    with pytest.raises(InvalidRequestError, match="distinct node types"):
        parse_infer_body(body(("paper", [1]), ("paper", [2])))
    with pytest.raises(InvalidRequestError, match="distinct node types"):
        parse_infer_body(body(("nodes", [1]), ("paper", [2])))


def test_typed_requests_through_the_serve_process(
    acm: tuple[Any, asyncgraph.DistGraph, Path, Any], tmp_path: Path
) -> None:
    _, g, model_dir, group = acm
    spec, model = load_model(model_dir)
    core = InferenceCore(g.client.async_client, model, spec.fanouts)
    papers = np.array([3, 1, 3, 40])
    seeds, inverse = np.unique(core.check_nodes({"paper": papers}), return_inverse=True)
    want = g.client.loop.run(core.infer(seeds))[torch.from_numpy(inverse)].numpy()
    core.close()
    serve = ServeProcess(
        tmp_path, ["--servers", str(group.ip_config()), "--model", str(model_dir), "--msgpack-port", "0"]
    )
    try:
        status, meta = serve.request("GET", "/v2/models/acm")
        assert status == 200 and [i["name"] for i in meta["inputs"]] == ["nodes", "paper"]
        for url in (f"tcp://127.0.0.1:{serve.msgpack_port}", f"http://127.0.0.1:{serve.port}"):
            with asyncgraph.InferenceClient(url, model="acm") as client:
                np.testing.assert_allclose(client.infer({"paper": papers}), want, atol=1e-5, rtol=1e-5)
                with pytest.raises(InvalidRequestError, match="answers 'paper' nodes only"):
                    client.infer({"author": [0]})
                with pytest.raises(UnknownTypeError):
                    client.infer({"nope": [0]})
    finally:
        serve.stop()
    assert serve.proc.returncode == 0
