"""Serving over a live graph (issue 36, items 2 and 5): inductive requests (a new node's
features and in-neighbours in the request) and answers that reflect acknowledged edges.

Cora in two partitions on real server processes, a real ``python -m asyncgraph.serve`` over
them (full-neighbourhood fanouts ``-1,-1``, so answers are deterministic) and one with the
model's sampled fanouts. The oracle is the model applied offline to the whole graph as one
block per layer (every node's every live in-edge), with the new node added by hand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _serve_helpers import ServeProcess

import asyncgraph
from asyncgraph.client import Client
from asyncgraph.dataloading.block import to_block
from asyncgraph.dataloading.sampler import layer_seed
from asyncgraph.errors import InvalidRequestError, OutOfRangeError
from asyncgraph.kernels.partition_sampling import keyed_words
from asyncgraph.nn import GraphSAGE
from asyncgraph.serve.artifact import load_model, save_model
from asyncgraph.testing import ServerGroup, start_servers

pytestmark = pytest.mark.timeout(300)

IN_FEATS, CLASSES = 1433, 7


@pytest.fixture(scope="module")
def group(cora2: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerGroup]:
    servers = start_servers(
        cora2.part_config, tmp_path_factory.mktemp("live-serve"), num_parts=2,
        extra_args=["--log-level", "WARNING"],
    )  # fmt: skip
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return save_model(
        tmp_path_factory.mktemp("model"),
        GraphSAGE(IN_FEATS, 16, CLASSES, n_layers=2),
        name="sage",
        kwargs={"in_feats": IN_FEATS, "hidden": 16, "n_classes": CLASSES, "n_layers": 2},
        fanouts=[2, 3],
    )


def _serve(group: ServerGroup, cora2: Any, model_dir: Path, workdir: Path, *extra: str) -> ServeProcess:
    return ServeProcess(
        workdir,
        ["--part-config", str(cora2.part_config), "--servers", str(group.ip_config()),
         "--model", str(model_dir), "--msgpack-port", "0", "--deadline-ms", "20000", *extra],
    )  # fmt: skip


@pytest.fixture(scope="module")
def full(
    group: ServerGroup, cora2: Any, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """A serve process sampling every in-edge (``--fanouts -1,-1``)."""
    proc = _serve(group, cora2, model_dir, tmp_path_factory.mktemp("serve-full"), "--fanouts=-1,-1")
    yield proc
    proc.stop()
    assert proc.proc.returncode == 0, proc.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def client(group: ServerGroup) -> Iterator[Client]:
    """A graph client of the same servers: reads the live graph and writes it."""
    c = Client.connect(group.addresses)
    yield c
    c.close()


def _features(client: Client) -> np.ndarray:
    n = client.book.num_nodes
    return client.loop.run(client.async_client.pull_numpy("node:feat", np.arange(n)))


def _oracle(
    client: Client,
    model_dir: Path,
    extra_feats: np.ndarray | None = None,
    extra_in: list[list[int]] | None = None,
) -> np.ndarray:
    """The model on the whole live graph (base nodes' live in-edges) plus new nodes ``N + i``
    with features ``extra_feats[i]`` and in-neighbours ``extra_in[i]``: every node's rows."""
    n = client.book.num_nodes
    src, dst, _ = client.loop.run(client.async_client.sample_neighbors(np.arange(n), -1))
    feats = _features(client)
    if extra_feats is not None and extra_in is not None:
        for i, nbrs in enumerate(extra_in):
            src = np.concatenate([src, np.asarray(nbrs, dtype=np.int64)])
            dst = np.concatenate([dst, np.full(len(nbrs), n + i, dtype=np.int64)])
        feats = np.concatenate([feats, extra_feats.astype(feats.dtype)])
    block = to_block(src, dst, np.arange(feats.shape[0]))
    _, model = load_model(model_dir)
    with torch.no_grad():
        out: np.ndarray = model([block, block], torch.from_numpy(feats)).numpy()
    return out


def _stored_nodes(client: Client) -> int:
    """How many nodes the live graph added (probing the strided new IDs, a few per partition)."""
    n, parts, count = client.book.num_nodes, client.book.num_partitions(), 0
    for p in range(parts):
        for k in range(8):
            try:
                client.loop.run(client.async_client.degrees(np.array([n + p + k * parts]), "in"))
            except OutOfRangeError:
                break
            count += 1
    return count


def _new_node_body(features: np.ndarray, neighbors: list[list[int]], **params: Any) -> bytes:
    flat = [v for run in neighbors for v in run]
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in neighbors])]).tolist()
    return json.dumps(
        {
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": list(features.shape),
                 "data": features.reshape(-1).tolist()},
                {"name": "neighbors", "datatype": "INT64", "shape": [len(flat)], "data": flat},
                {"name": "neighbor_offsets", "datatype": "INT64", "shape": [len(offsets)], "data": offsets},
            ],
            "parameters": params,
        }
    ).encode()  # fmt: skip


def _new_features(client: Client, rows: list[int]) -> np.ndarray:
    """Features of new nodes: existing rows, shuffled within the row (same values, new node)."""
    feats = _features(client)[rows].copy()
    rng = np.random.default_rng(1)
    for row in feats:
        rng.shuffle(row)
    return feats


def test_inductive_answers_equal_the_model_on_the_graph_with_the_new_nodes(
    full: ServeProcess, client: Client, model_dir: Path
) -> None:
    n = client.book.num_nodes
    neighbors = [[10, 20, 30, 2000, 1500], [], [7]]
    feats = _new_features(client, [5, 6, 7])
    want = _oracle(client, model_dir, feats, neighbors)[n : n + 3]
    status, answer = full.request("POST", "/v2/models/sage/infer", _new_node_body(feats, neighbors))
    assert status == 200, answer
    (out,) = answer["outputs"]
    assert out["shape"] == [3, CLASSES]
    got = np.asarray(out["data"], dtype=np.float32).reshape(3, CLASSES)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    for url in (f"tcp://127.0.0.1:{full.msgpack_port}", f"http://127.0.0.1:{full.port}"):
        with asyncgraph.InferenceClient(url, model="sage") as inference:
            answer_new = inference.infer_new(feats, neighbors)
            assert answer_new.node_ids is None
            np.testing.assert_allclose(answer_new.output, want, atol=1e-5, rtol=1e-5)
            flat = np.array([v for r in neighbors for v in r])
            again = inference.infer_new(torch.from_numpy(feats), flat, [0, 5, 5, 6]).output
            np.testing.assert_allclose(again, want, atol=1e-5, rtol=1e-5)
    assert _stored_nodes(client) == 0  # not stored unless asked


def test_sampled_inductive_answer_equals_blocks_built_by_hand(
    group: ServerGroup, cora2: Any, model_dir: Path, client: Client, tmp_path: Path
) -> None:
    """Fanouts [2, 3]: the new node's first hop is 3 of its 6 given neighbours (the documented
    draw), deeper hops the graph's samples (layer seeds of ``--seed 0``), its own hop in the
    inner block 2 of the 6 again."""
    nbrs = np.array([11, 400, 1200, 2600, 9, 77], dtype=np.int64)
    feats = _new_features(client, [100])
    aio = client.async_client

    def given(fanout: int, layer: int) -> np.ndarray:
        words = keyed_words(layer_seed(0, layer), np.zeros(nbrs.size, np.int64), np.arange(nbrs.size))
        return nbrs[np.sort(np.argsort(words, kind="stable")[:fanout])]  # the smallest words

    hop1 = given(3, 1)
    last = to_block(hop1, np.full(3, -1), np.array([-1]), np.full(3, -1))
    seeds = last.srcnodes.numpy()
    s, d, e = client.loop.run(aio.sample_neighbors(seeds[1:], 2, seed=layer_seed(0, 2)))
    hop2 = given(2, 2)
    first = to_block(
        np.concatenate([s, hop2]), np.concatenate([d, np.full(2, -1)]), seeds, np.concatenate([e, [-1, -1]])
    )
    inputs = first.srcnodes.numpy()
    x = np.empty((inputs.size, IN_FEATS), dtype=np.float32)
    x[0] = feats[0]
    x[1:] = client.loop.run(aio.pull_numpy("node:feat", inputs[1:]))
    _, model = load_model(model_dir)
    with torch.no_grad():
        want = model([first, last], torch.from_numpy(x)).numpy()
    serve = _serve(group, cora2, model_dir, tmp_path)
    try:
        with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{serve.msgpack_port}", model="sage") as inference:
            got = inference.infer_new(feats, [nbrs]).output
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
            np.testing.assert_array_equal(inference.infer_new(feats, [nbrs]).output, got)
    finally:
        serve.stop()
    assert serve.proc.returncode == 0


def _rows(answer: dict[str, Any]) -> np.ndarray:
    (out,) = answer["outputs"]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def _json_body(inputs: list[dict[str, Any]], **params: Any) -> bytes:
    return json.dumps({"inputs": inputs, "parameters": params}).encode()


FEAT_OK = {"name": "features", "datatype": "FP32", "shape": [1, IN_FEATS], "data": [0.5] * IN_FEATS}
NBRS_OK = {"name": "neighbors", "datatype": "INT64", "shape": [2], "data": [1, 2]}
OFFS_OK = {"name": "neighbor_offsets", "datatype": "INT64", "shape": [2], "data": [0, 2]}


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_json_body([_with(FEAT_OK, shape=[1, 10], data=[0.5] * 10), NBRS_OK, OFFS_OK]), "must have shape"),
        (_json_body([_with(FEAT_OK, shape=[IN_FEATS]), NBRS_OK, OFFS_OK]), "does not match"),
        (_json_body([FEAT_OK, NBRS_OK, _with(OFFS_OK, shape=[3], data=[0, 1, 2])]), "n + 1 = 2"),
        (_json_body([FEAT_OK, NBRS_OK, _with(OFFS_OK, data=[0, 1])]), "rise from 0"),
        (_json_body([FEAT_OK, _with(NBRS_OK, data=[1, 99999]), OFFS_OK]), "unknown neighbour node ID 9"),
        (_json_body([FEAT_OK, _with(NBRS_OK, data=[1, -2]), OFFS_OK]), "unknown neighbour node ID -2"),
        (_json_body([_with(FEAT_OK, datatype="INT64"), NBRS_OK, OFFS_OK]), "datatype 'INT64'"),
        (_json_body([_with(FEAT_OK, data=["x"] * IN_FEATS), NBRS_OK, OFFS_OK]), "flat list of numbers"),
        (_json_body([FEAT_OK, NBRS_OK]), "an inductive request has the inputs"),
        (_json_body([FEAT_OK, NBRS_OK, OFFS_OK], store="yes"), "parameters.store"),
        (_json_body([_with(FEAT_OK, shape=[0, IN_FEATS], data=[]), NBRS_OK, OFFS_OK]), "n >= 1"),
        (
            _json_body([_with(FEAT_OK, data=[float("nan")] * IN_FEATS), NBRS_OK, OFFS_OK]),
            "NaN or infinity",
        ),
    ],
)
def test_bad_inductive_requests_are_400_and_the_process_keeps_serving(
    full: ServeProcess, client: Client, body: bytes, message: str
) -> None:
    before = _stored_nodes(client)
    status, answer = full.request("POST", "/v2/models/sage/infer", body)
    assert status == 400, answer
    assert message in answer["error"]
    assert _stored_nodes(client) == before
    ok, good = full.request("POST", "/v2/models/sage/infer", _json_body([FEAT_OK, NBRS_OK, OFFS_OK]))
    assert ok == 200 and good["outputs"][0]["shape"] == [1, CLASSES]
    assert full.infer([1, 2])[0] == 200


def test_bad_inductive_requests_over_msgpack_are_typed(full: ServeProcess) -> None:
    with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{full.msgpack_port}", model="sage") as inference:
        with pytest.raises(OutOfRangeError, match="unknown neighbour node ID 5000"):
            inference.infer_new(np.zeros((1, IN_FEATS), np.float32), [[5000]])
        with pytest.raises(InvalidRequestError, match="must have shape"):
            inference.infer_new(np.zeros((2, 3), np.float32), [[1], [2]])
        with pytest.raises(InvalidRequestError, match="are for typed graphs"):
            inference.infer_new(np.zeros((1, IN_FEATS), np.float32), {"cites": [[1]]})
        assert inference.infer_new(np.zeros((1, IN_FEATS), np.float32), [[1]]).output.shape == (1, CLASSES)


def test_an_answer_reflects_acknowledged_edges_and_stored_new_nodes(
    full: ServeProcess, client: Client, model_dir: Path
) -> None:
    """Live-graph composition: after ``add_edges`` is acknowledged, the next answer for the
    destination equals the model on the updated graph; ``store=true`` adds a new node and its
    in-edges and returns its ID."""
    node = 100
    status, before = full.infer([node, 3])
    assert status == 200
    base = _oracle(client, model_dir)
    np.testing.assert_allclose(_rows(before), base[[node, 3]], atol=1e-5, rtol=1e-5)
    src = np.array([5, 700, 2500], dtype=np.int64)
    eids = client.loop.run(client.async_client.add_edges(src, np.full(3, node)))
    assert eids.size == 3
    want = _oracle(client, model_dir)
    assert not np.allclose(want[node], base[node], atol=1e-4)  # the edges change this node's answer
    status, after = full.infer([node, 3])
    assert status == 200, after
    np.testing.assert_allclose(_rows(after), want[[node, 3]], atol=1e-5, rtol=1e-5)
    # and an inductive request whose neighbour gained edges sees them in its deeper hop
    feats = _new_features(client, [8])
    with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{full.msgpack_port}", model="sage") as inference:
        stored = inference.infer_new(feats, [[node, 4]], store=True)
    n = client.book.num_nodes
    want_new = _oracle(client, model_dir, feats, [[node, 4]])[n : n + 1]
    np.testing.assert_allclose(stored.output, want_new, atol=1e-5, rtol=1e-5)
    assert stored.node_ids is not None and stored.node_ids.size == 1 and int(stored.node_ids[0]) >= n
    s, d, _ = client.loop.run(client.async_client.sample_neighbors(stored.node_ids, -1))
    assert sorted(s.tolist()) == [4, node] and set(d.tolist()) == {int(stored.node_ids[0])}
    # its features were stored with it: a request naming the stored node gets the same answer
    np.testing.assert_array_equal(client.pull("node:feat", stored.node_ids).numpy(), np.asarray(feats))
    status, named = full.infer([int(stored.node_ids[0])])
    assert status == 200, named
    np.testing.assert_allclose(_rows(named), stored.output, atol=1e-5, rtol=1e-5)
    # and it can be the neighbour of the next new node (an added node is a node like any)
    stored_id = int(stored.node_ids[0])
    with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{full.msgpack_port}", model="sage") as inference:
        nxt = inference.infer_new(feats, [[stored_id]])
        with pytest.raises(OutOfRangeError, match=f"unknown neighbour node ID {stored_id + 2}"):
            inference.infer_new(feats, [[stored_id + 2]])  # never added
    both = np.concatenate([feats, feats])  # the stored node as N, the next one as N + 1
    want_next = _oracle(client, model_dir, both, [[node, 4], [n]])[n + 1 : n + 2]
    np.testing.assert_allclose(nxt.output, want_next, atol=1e-5, rtol=1e-5)
