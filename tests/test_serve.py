"""Online inference core (issue 36, step 1): over real PubMed servers, a batch's answer equals the
model applied offline to the same sampled blocks (fixed seed), and with fanouts -1 equals
layer-wise inference; the dynamic batcher merges concurrent requests, refuses a full queue and
keeps each request's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.dataloading.fetch import sample_and_pull
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import (
    DTypeMismatchError,
    InvalidRequestError,
    OutOfRangeError,
    OverloadedError,
    RequestTimeoutError,
)
from asyncgraph.inference import layerwise_inference
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import load_model, save_model
from asyncgraph.serve.batching import BatchOptions, DynamicBatcher
from asyncgraph.serve.core import BatchTimes, InferenceCore

NODES = np.array([7, 19000, 3, 512, 7, 10001, 42], dtype=np.int64)


@pytest.fixture(scope="module")
def graph(served: Any) -> Iterator[asyncgraph.DistGraph]:
    asyncgraph.initialize(served.ip_config())
    yield asyncgraph.DistGraph("pubmed")
    asyncgraph.finalize()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = GraphSAGE(500, 16, 3, n_layers=2)
    return save_model(
        tmp_path_factory.mktemp("model"),
        model,
        name="sage",
        kwargs={"in_feats": 500, "hidden": 16, "n_classes": 3, "n_layers": 2},
        fanouts=[5, 10],
    )


def _offline(g: asyncgraph.DistGraph, model: torch.nn.Module, fanouts: list[int], seeds: np.ndarray) -> Any:
    """The model applied to ``sample_and_pull``'s blocks of ``seeds`` (seed 0), in this test."""

    async def run() -> torch.Tensor:
        sampled = await sample_and_pull(
            g.client.async_client, NeighborSampler(fanouts), seeds, 0, LoaderStats(), node_feats=["feat"]
        )
        with torch.no_grad():
            return model.eval()(sampled.blocks, sampled.blocks[0].srcdata["feat"])

    return g.client.loop.run(run())


def test_artifact_round_trip(model_dir: Path) -> None:
    spec, model = load_model(model_dir)
    assert (spec.name, spec.fanouts, spec.feat, spec.class_path) == (
        "sage", [5, 10], "feat", "asyncgraph.nn.sage:GraphSAGE"
    )  # fmt: skip
    torch.manual_seed(0)
    fresh = GraphSAGE(500, 16, 3, n_layers=2)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert not model.training


def test_a_broken_model_folder_is_a_typed_error(model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    for name in ("model.json", "model.pt"):
        shutil.copy(model_dir / name, tmp_path / name)
    spec = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**spec, "kwargs": {**spec["kwargs"], "hidden": 8}}))
    with pytest.raises(InvalidRequestError, match=r"model\.pt"):  # weights of another shape
        load_model(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({**spec, "class": "os:getcwd"}))
    with pytest.raises(InvalidRequestError, match=r"not a torch\.nn\.Module"):
        load_model(tmp_path)
    (tmp_path / "model.json").write_text("{")
    with pytest.raises(InvalidRequestError, match="not JSON"):
        load_model(tmp_path)


def test_answers_equal_offline_model_on_the_same_blocks(graph: asyncgraph.DistGraph, model_dir: Path) -> None:
    spec, model = load_model(model_dir)
    core = InferenceCore(graph.client.async_client, model, spec.fanouts)
    seeds = np.unique(NODES)
    got = graph.client.loop.run(core.infer(seeds))
    want = _offline(graph, model, spec.fanouts, seeds)
    assert got.shape == (seeds.size, 3)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    # the same nodes again: the same answer (one batch seed for every batch)
    torch.testing.assert_close(graph.client.loop.run(core.infer(seeds)), got, atol=0, rtol=0)
    core.close()


def test_full_neighbourhood_equals_layerwise_inference(graph: asyncgraph.DistGraph, model_dir: Path) -> None:
    _, model = load_model(model_dir)
    core = InferenceCore(graph.client.async_client, model, [-1, -1])
    seeds = np.unique(np.concatenate([NODES, np.arange(0, 19717, 97)]))
    got = graph.client.loop.run(core.infer(seeds))
    out = layerwise_inference(graph, model, graph.ndata["feat"], batch_size=5000, name="srv_lw")
    want = out[torch.from_numpy(seeds)]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for name in ("srv_lw.1", "srv_lw.done"):
        graph.ndata[name].delete()
    core.close()


def test_bad_node_ids_are_typed_errors(graph: asyncgraph.DistGraph, model_dir: Path) -> None:
    _, model = load_model(model_dir)
    core = InferenceCore(graph.client.async_client, model, [5, 10])
    with pytest.raises(OutOfRangeError, match="unknown node ID 19717"):  # no owner added it
        graph.client.loop.run(core.added_exist(core.check_nodes(np.array([1, 19717], dtype=np.int64))))
    with pytest.raises(OutOfRangeError, match="unknown node ID -1"):
        core.check_nodes(np.array([-1], dtype=np.int64))
    with pytest.raises(DTypeMismatchError):
        core.check_nodes(np.array([1.5]))
    core.close()


def test_batcher_merges_refuses_and_keeps_deadlines(graph: asyncgraph.DistGraph, model_dir: Path) -> None:
    spec, model = load_model(model_dir)
    core = InferenceCore(graph.client.async_client, model, spec.fanouts)
    calls: list[np.ndarray] = []

    async def run(seeds: np.ndarray, times: BatchTimes) -> torch.Tensor:
        calls.append(seeds)
        return await core.infer(seeds, times)

    async def scenario() -> None:
        batcher = DynamicBatcher(
            run, BatchOptions(max_batch=64, max_delay=0.2, idle_delay=0.2, queue_limit=20, deadline=30)
        )
        batcher.start()
        requests = [np.array([3, 7]), np.array([7, 42, 512]), np.array([19000])]
        answers = await asyncio.gather(*(batcher.submit(r) for r in requests))
        assert len(calls) == 1  # one sample, one forward for the three
        merged = await core.infer(calls[0])  # the merged batch alone, again
        for nodes, answer in zip(requests, answers, strict=True):
            torch.testing.assert_close(answer, merged[np.searchsorted(calls[0], nodes)], atol=0, rtol=0)
        # a full queue is refused at once, the others still answered
        first = asyncio.ensure_future(batcher.submit(np.arange(15)))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match="queue full"):
            await batcher.submit(np.arange(10))
        assert (await first).shape == (15, 3)
        # a deadline shorter than the batching delay: a typed timeout, and nothing runs for it
        before = len(calls)
        with pytest.raises(RequestTimeoutError):
            await batcher.submit(np.array([5]), timeout=0.01)
        await asyncio.sleep(0.3)
        assert len(calls) == before
        assert await batcher.drain(5.0)

    graph.client.loop.run(scenario())
    core.close()


def test_an_idle_batcher_does_not_wait_for_company(graph: asyncgraph.DistGraph, model_dir: Path) -> None:
    spec, model = load_model(model_dir)
    core = InferenceCore(graph.client.async_client, model, spec.fanouts)

    async def scenario() -> float:
        batcher = DynamicBatcher(core.infer, BatchOptions(max_delay=5.0, idle_delay=0.0, deadline=30))
        batcher.start()
        await batcher.submit(np.array([1]))  # warm
        t0 = asyncio.get_running_loop().time()
        await batcher.submit(np.array([2, 3]))
        took = asyncio.get_running_loop().time() - t0
        assert await batcher.drain(5.0)
        return took

    assert graph.client.loop.run(scenario()) < 2.0  # not the 5 s max_delay: nothing else was running
    core.close()


def test_with_one_batch_in_flight_requests_that_came_during_a_batch_are_merged() -> None:
    """The batcher alone (a pure part): with one slot, requests that arrive while a batch runs
    wait (up to ``max_delay``) and go as one batch after it; a request that comes when nothing
    runs is cut at once (``idle_delay`` 0)."""
    sizes: list[int] = []

    async def run(seeds: np.ndarray, times: BatchTimes) -> torch.Tensor:
        sizes.append(int(seeds.size))
        await asyncio.sleep(0.2)
        return torch.from_numpy(seeds.astype(np.float32)).unsqueeze(1)

    async def scenario() -> float:
        batcher = DynamicBatcher(run, BatchOptions(max_delay=0.5, idle_delay=0.0, in_flight=1, deadline=30))
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(np.array([1])))
        await asyncio.sleep(0.05)  # the first batch runs
        during = []
        for node in (2, 3, 4):
            during.append(asyncio.ensure_future(batcher.submit(np.array([node]))))
            await asyncio.sleep(0.02)
        rows = await asyncio.gather(first, *during)
        assert [float(r[0, 0]) for r in rows] == [1.0, 2.0, 3.0, 4.0]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await batcher.submit(np.array([5]))  # idle: not the 0.5 s max_delay
        took = loop.time() - t0
        assert await batcher.drain(5.0)
        return took

    took = asyncio.run(scenario())
    assert sizes == [1, 3, 1], sizes
    assert took < 0.45, took
