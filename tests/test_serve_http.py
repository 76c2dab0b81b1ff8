"""``python -m asyncgraph.serve`` (issue 36, step 2): a real serve process over real PubMed
servers speaks KServe's Open Inference Protocol v2; its answers equal the model applied offline
to the same blocks; bad requests are 4xx with a message and the process keeps serving; a full
queue is 429; SIGTERM drains the requests in flight, then the process exits 0."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _serve_helpers import ServeProcess

import asyncgraph
from asyncgraph.client import Client
from asyncgraph.dataloading.fetch import sample_and_pull
from asyncgraph.dataloading.sampler import NeighborSampler
from asyncgraph.dataloading.stats import LoaderStats
from asyncgraph.errors import OutOfRangeError, RequestTimeoutError, UnknownModelError
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import load_model, save_model

NODES = [7, 19000, 3, 512, 7, 10001, 42]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return save_model(
        tmp_path_factory.mktemp("model"),
        GraphSAGE(500, 16, 3, n_layers=2),
        name="sage",
        kwargs={"in_feats": 500, "hidden": 16, "n_classes": 3, "n_layers": 2},
        fanouts=[5, 10],
    )


@pytest.fixture(scope="module")
def serve(
    served: Any, pubmed2: Any, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    proc = ServeProcess(
        tmp_path_factory.mktemp("serve"),
        ["--part-config", str(pubmed2.part_config), "--servers", str(served.ip_config()),
         "--model", str(model_dir), "--max-delay-ms", "1", "--max-body-bytes", "65536",
         "--msgpack-port", "0"],
    )  # fmt: skip
    yield proc
    proc.stop()
    assert proc.proc.returncode == 0, proc.log.read_text(errors="replace")


def test_answers_equal_the_offline_model(serve: ServeProcess, served: Any, model_dir: Path) -> None:
    status, answer = serve.infer(NODES, id="req-1")
    assert status == 200, answer
    assert answer["model_name"] == "sage" and answer["id"] == "req-1"
    (out,) = answer["outputs"]
    assert out["name"] == "output" and out["datatype"] == "FP32" and out["shape"] == [7, 3]
    got = torch.tensor(out["data"], dtype=torch.float32).reshape(7, 3)
    spec, model = load_model(model_dir)
    seeds = np.unique(NODES)
    client = Client.connect(served.addresses)
    try:
        sampled = client.loop.run(
            sample_and_pull(
                client.async_client,
                NeighborSampler(spec.fanouts),
                seeds,
                0,
                LoaderStats(),
                node_feats=["feat"],
            )
        )
    finally:
        client.close()
    with torch.no_grad():
        want = model(sampled.blocks, sampled.blocks[0].srcdata["feat"])[np.searchsorted(seeds, NODES)]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_health_metadata_and_metrics(serve: ServeProcess) -> None:
    assert serve.request("GET", "/v2/health/live") == (200, {"live": True})
    assert serve.request("GET", "/v2/health/ready") == (200, {"ready": True})
    status, meta = serve.request("GET", "/v2/models/sage")
    assert status == 200
    assert meta["inputs"][0]["name"] == "nodes" and meta["outputs"][0]["shape"] == [-1, 3]
    assert meta["parameters"]["fanouts"] == [5, 10]
    status, text = serve.request("GET", "/metrics")
    assert status == 200 and 'asyncgraph_serve_latency_seconds_count{stage="forward"}' in text
    assert 'asyncgraph_serve_requests_total{outcome="ok"}' in text


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (lambda s: s.infer([1, 19717]), 400, "unknown node ID 19717"),
        (lambda s: s.infer([-3]), 400, "unknown node ID -3"),
        (lambda s: s.infer([1.0, 2.0], datatype="FP32"), 400, "datatype 'FP32'"),
        (lambda s: s.infer([1.5]), 400, "flat list of integers"),
        (lambda s: s.infer([1, 2], model="nope"), 404, "no model 'nope'"),
        (lambda s: s.request("POST", "/v2/models/sage/infer", b"{not json"), 400, "malformed JSON"),
        (lambda s: s.request("POST", "/v2/models/sage/infer", b'{"inputs": []}'), 400, "exactly one input"),
        (lambda s: s.request("POST", "/v2/models/sage/infer", b"[" * 30000), 400, "nested too deeply"),
        (
            lambda s: s.request("POST", "/v2/models/sage/infer", b"[" + b"1," * 40000 + b"1]"),
            413,
            "over the limit",
        ),
    ],
)
def test_bad_requests_are_4xx_and_the_process_keeps_serving(
    serve: ServeProcess, call: Any, status: int, message: str
) -> None:
    got, answer = call(serve)
    assert got == status, answer
    assert message in answer["error"]
    ok, good = serve.infer([1, 2])
    assert ok == 200 and good["outputs"][0]["shape"] == [2, 3]


def test_queue_full_is_429_and_sigterm_drains(
    served: Any, pubmed2: Any, model_dir: Path, tmp_path: Path
) -> None:
    proc = ServeProcess(
        tmp_path,
        ["--servers", str(served.ip_config()), "--model", str(model_dir),
         "--max-delay-ms", "1500", "--idle-delay-ms", "1500", "--max-batch", "64", "--queue-limit", "8",
         "--deadline-ms", "20000"],
    )  # fmt: skip
    try:
        answers: list[tuple[int, Any]] = []
        first = threading.Thread(target=lambda: answers.append(proc.infer([1, 2, 3, 4, 5])))
        first.start()
        time.sleep(0.4)  # the first request waits for company (1.5 s)
        status, refused = proc.infer([6, 7, 8, 9, 10])
        assert status == 429 and refused["code"] == "overloaded", refused
        proc.proc.send_signal(signal.SIGTERM)
        first.join(timeout=30)
        assert answers and answers[0][0] == 200, answers
        assert answers[0][1]["outputs"][0]["shape"] == [5, 3]
        assert proc.proc.wait(timeout=30) == 0
        with pytest.raises(ConnectionRefusedError):
            proc.request("GET", "/v2/health/live")
    finally:
        proc.stop()


def test_msgpack_requests_in_flight_drain_on_sigterm_and_late_ones_time_out_typed(
    served: Any, model_dir: Path, tmp_path: Path
) -> None:
    """Over the msgpack port (requests answered from their batch, no task each): a request past
    its deadline in the queue gets ``RequestTimeoutError``, and one queued when SIGTERM comes is
    answered before the process exits 0."""
    proc = ServeProcess(
        tmp_path,
        ["--servers", str(served.ip_config()), "--model", str(model_dir), "--msgpack-port", "0",
         "--max-delay-ms", "1500", "--idle-delay-ms", "1500", "--deadline-ms", "20000"],
    )  # fmt: skip

    async def run() -> np.ndarray:
        url = f"tcp://127.0.0.1:{proc.msgpack_port}"
        async with asyncgraph.AsyncInferenceClient(url, timeout=30) as client:
            first = asyncio.ensure_future(client.infer([1, 2, 3]))  # waits 1.5 s for company
            started = time.perf_counter()
            with pytest.raises(RequestTimeoutError):
                await client.infer([4], timeout=0.2)  # its deadline passes while it is queued
            assert time.perf_counter() - started < 1.4  # answered at its deadline, not the batch's
            proc.proc.send_signal(signal.SIGTERM)
            return await first

    try:
        rows = asyncio.run(run())
        assert rows.shape == (3, 3) and np.isfinite(rows).all()
        assert proc.proc.wait(timeout=30) == 0
    finally:
        proc.stop()


def test_inference_client_sync_and_async_over_msgpack_and_http(serve: ServeProcess) -> None:
    _, answer = serve.infer(NODES)
    want = np.asarray(answer["outputs"][0]["data"], dtype=np.float32).reshape(7, 3)
    tcp, web = f"tcp://127.0.0.1:{serve.msgpack_port}", f"http://127.0.0.1:{serve.port}"
    for url in (tcp, web):
        with asyncgraph.InferenceClient(url, model="sage") as client:
            assert np.array_equal(client.infer(NODES), want)
            assert np.array_equal(client.infer(torch.tensor(NODES)), want)
            with pytest.raises(OutOfRangeError, match="unknown node ID 19717"):
                client.infer([1, 19717])
            assert client.infer([3]).shape == (1, 3)  # the connection survived the error
        with asyncgraph.InferenceClient(url, model="nope") as client, pytest.raises(UnknownModelError):
            client.infer([1])

    async def many() -> list[np.ndarray]:
        async with asyncgraph.AsyncInferenceClient(tcp) as client:
            meta = await client.metadata()
            assert meta["name"] == "sage" and meta["out_dim"] == 3
            return await asyncio.gather(*(client.infer([n, 7]) for n in range(20)))

    # pipelined on one connection, answered by id (merged into batches: with sampled fanouts a
    # node's sample depends on the batch it shares, so only the shapes are compared here)
    answers = asyncio.run(many())
    assert [rows.shape for rows in answers] == [(2, 3)] * 20
    assert all(np.isfinite(rows).all() for rows in answers)


def test_feature_cache_answers_the_same(
    serve: ServeProcess, served: Any, model_dir: Path, tmp_path: Path
) -> None:
    """Partitions read over sockets (``--no-shared-memory``) with a feature cache: the same answers
    as the shared-memory process, and ``/metrics`` counts the cache's hits."""
    cached = ServeProcess(
        tmp_path,
        ["--servers", str(served.ip_config()), "--model", str(model_dir), "--no-shared-memory",
         "--feature-cache-bytes", str(16 << 20)],
    )  # fmt: skip
    try:
        for nodes in (NODES, list(range(0, 19717, 1500))):
            status, want = serve.infer(nodes)
            status_cached, got = cached.infer(nodes)
            assert status == status_cached == 200
            np.testing.assert_allclose(got["outputs"][0]["data"], want["outputs"][0]["data"], atol=1e-6)
        _, text = cached.request("GET", "/metrics")
        (line,) = [x for x in text.splitlines() if x.startswith("asyncgraph_serve_cache_hits_total ")]
        hits = float(line.split()[1])
        assert hits > 0, text
    finally:
        cached.stop()
