"""Exported model artifacts (issue 36, item 1): a GraphSAGE saved as a ``torch.export`` program
(``serve.artifact.export_model``) answers what its ``state_dict`` form answers, to 1e-5, on the same sampled
blocks of Cora, and a real serve process serves it from a folder that names no class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _serve_helpers import ServeProcess

import asyncgraph
from asyncgraph.client import AsyncClient
from asyncgraph.dataloading.fetch import sample_and_pull
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import InvalidRequestError
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import export_model, load_model

pytestmark = pytest.mark.timeout(300)

SEEDS = np.array([0, 3, 7, 42, 512, 1000, 2700], dtype=np.int64)


async def _blocks(part_config: Path, fanouts: list[int], seeds: np.ndarray) -> tuple[list[Any], torch.Tensor]:
    aio = AsyncClient.standalone(part_config)
    try:
        sampled = await sample_and_pull(
            aio, NeighborSampler(fanouts), seeds, 0, LoaderStats(), node_feats=["feat"]
        )
    finally:
        await aio.close()
    return sampled.blocks, sampled.blocks[0].srcdata["feat"]


@pytest.mark.parametrize("aggregator", ["mean", "gcn", "pool"])
async def test_exported_answers_equal_the_state_dict_model(
    cora2: Any, tmp_path: Path, aggregator: str
) -> None:
    torch.manual_seed(0)
    model = GraphSAGE(1433, 16, 7, n_layers=2, aggregator=aggregator).eval()
    folder = export_model(tmp_path / "exported", model, name="sage", fanouts=[5, 10])
    doc = json.loads((folder / "model.json").read_text())
    assert doc["class"] is None and doc["exported"] == "model.pt2" and not (folder / "model.pt").exists()
    spec, exported = load_model(folder)
    assert spec.fanouts == [5, 10] and spec.exported == "model.pt2"
    for fanouts, seeds in (([5, 10], SEEDS), ([-1, -1], SEEDS[:1]), ([2, 0], SEEDS)):  # sizes differ
        blocks, x = await _blocks(cora2.part_config, fanouts, seeds)
        with torch.no_grad():
            want = model(blocks, x)
            got = exported(blocks, x)
        assert got.shape == (seeds.size, 7)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_broken_exported_folder_is_a_typed_error(tmp_path: Path) -> None:
    folder = export_model(tmp_path / "m", GraphSAGE(8, 4, 2, n_layers=1), name="tiny", fanouts=[3])
    (folder / "model.pt2").write_bytes(b"not a program")
    with pytest.raises(InvalidRequestError, match="not a loadable exported program"):
        load_model(folder)
    doc = json.loads((folder / "model.json").read_text())
    (folder / "model.json").write_text(json.dumps({**doc, "exported": "../elsewhere.pt2"}))
    with pytest.raises(InvalidRequestError, match="'exported' must name a file"):
        load_model(folder)
    with pytest.raises(InvalidRequestError, match="exports a GraphSAGE"):
        export_model(tmp_path / "x", torch.nn.Linear(2, 2), name="x", fanouts=[1])


def test_the_serve_process_serves_an_exported_model(cora2: Any, tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = GraphSAGE(1433, 16, 7, n_layers=2).eval()
    folder = export_model(tmp_path / "exported", model, name="sage", fanouts=[5, 10])
    import asyncio

    blocks, x = asyncio.run(_blocks(cora2.part_config, [5, 10], np.unique(SEEDS)))
    with torch.no_grad():
        want = model(blocks, x).numpy()
    serve = ServeProcess(
        tmp_path / "serve", ["--part-config", str(cora2.part_config), "--model", str(folder)]
    )
    try:
        with asyncgraph.InferenceClient(f"http://127.0.0.1:{serve.port}", model="sage") as client:
            np.testing.assert_allclose(client.infer(SEEDS), want, atol=1e-5, rtol=1e-5)
        status, meta = serve.request("GET", "/v2/models/sage")
        assert status == 200 and meta["outputs"][0]["shape"] == [-1, 7]
    finally:
        serve.stop()
    assert serve.proc.returncode == 0, serve.log.read_text(errors="replace")
