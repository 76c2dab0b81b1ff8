"""Inductive requests on a typed graph (issue 36): a new ``paper`` of ACM (2 real servers, a
real ``python -m asyncgraph.serve``) from its features and in-neighbours per relation.

With sampled fanouts the answer equals the model applied offline to blocks built by hand (the
documented draw of the given neighbours, the servers' samples of graph nodes); with fanouts
-1 a stored new paper (``store=true``) asked by its new ID gets the answer the request got.
Bad requests are typed 400s over HTTP and msgpack; nothing is stored and the process serves on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import asyncgraph
from asyncgraph.client import Client
from asyncgraph.dataloading.hetero_block import to_hetero_block, typed_node_keys
from asyncgraph.dataloading.sampler import layer_seed
from asyncgraph.errors import InvalidRequestError, OutOfRangeError, ShapeMismatchError, UnknownTypeError
from asyncgraph.kernels.partition_sampling import keyed_words
from asyncgraph.nn import HeteroGraphSAGE
from asyncgraph.serve.artifact import load_model, save_model
from asyncgraph.testing import ServerGroup, start_servers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve_helpers import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from hetero_node_classification import load_acm  # noqa: E402

pytestmark = pytest.mark.timeout(300)

WORDS, CLASSES = 64, 3
AUTHORS = np.array([7, 300, 1200, 5, 64, 2000], dtype=np.int64)  # "writes": author -> paper
SUBJECTS = np.array([3, 11], dtype=np.int64)  # "subject-of": subject -> paper


@pytest.fixture(scope="module")
def acm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, ServerGroup, Path, Client]]:
    out = tmp_path_factory.mktemp("acm-inductive")
    hg = load_acm(words=WORDS)
    asyncgraph.partition_graph(hg, "acm", 2, out / "parts", part_method="random")
    group = start_servers(out / "parts" / "acm.json", out / "srv", num_parts=2)
    client = Client.connect(group.addresses)
    try:
        torch.manual_seed(0)
        etypes = [list(c) for c in hg.canonical_etypes]
        kwargs = {"canonical_etypes": etypes, "in_feats": WORDS, "hidden": 16, "n_classes": CLASSES,
                  "n_layers": 2, "target": "paper"}  # fmt: skip
        model_dir = save_model(
            out / "model", HeteroGraphSAGE(**kwargs), name="acm", kwargs=kwargs, fanouts=[3, 2]
        )
        yield hg, group, model_dir, client
    finally:
        client.close()
        group.stop()


def _serve(group: ServerGroup, model_dir: Path, workdir: Path, *extra: str) -> ServeProcess:
    return ServeProcess(
        workdir,
        ["--servers", str(group.ip_config()), "--model", str(model_dir), "--msgpack-port", "0",
         "--deadline-ms", "20000", *extra],
    )  # fmt: skip


@pytest.fixture(scope="module")
def full(acm: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A serve process sampling every in-edge (``--fanouts -1,-1``)."""
    _, group, model_dir, _ = acm
    proc = _serve(group, model_dir, tmp_path_factory.mktemp("serve-full"), "--fanouts=-1,-1")
    yield proc
    proc.stop()
    assert proc.proc.returncode == 0, proc.log.read_text(errors="replace")


def _paper_features(client: Client, row: int) -> np.ndarray:
    """A new paper's features: an existing paper's, shuffled (same values, a new node)."""
    key = typed_node_keys(client.async_client, "feat")
    assert key is not None
    book = client.book
    homo = book.map_to_homo_nid(np.array([row]), "paper")
    feats = np.asarray(client.loop.run(client.async_client.pull_numpy(key["paper"], homo))).copy()
    np.random.default_rng(1).shuffle(feats[0])
    return feats.astype(np.float32)


def _by_hand(client: Client, model_dir: Path, feats: np.ndarray, given: dict[str, np.ndarray]) -> np.ndarray:
    """The model on blocks built by hand: graph nodes' hops sampled by the servers with the
    layer seeds of ``--seed 0``, the new paper's (ID -1) hops its given neighbours drawn with
    ``keyed_words(layer seed, 0, position)`` to each layer's fanout (the smallest words)."""
    spec, model = load_model(model_dir)
    aio, book = client.async_client, client.book
    canon = book.canonical_etypes
    current = np.array([-1], dtype=np.int64)
    blocks = []
    for layer, fanout in enumerate(reversed(spec.fanouts)):
        seed = layer_seed(0, layer)
        real = current[current >= 0]
        out = client.loop.run(aio.sample_etypes(real, np.full(len(canon), fanout), seed=seed))
        src, dst, et, teid = [out["src"]], [out["dst"]], [out["etype"]], [out["type_eid"]]
        for name, ids in given.items():
            r = book.etype_id(tuple(name.split(":")) if name.count(":") == 2 else name)
            homo = np.asarray(book.map_to_homo_nid(ids, canon[r][0]), dtype=np.int64)
            if homo.size > fanout:
                words = keyed_words(seed, np.zeros(homo.size, np.int64), np.arange(homo.size))
                homo = homo[np.sort(np.argsort(words, kind="stable")[:fanout])]  # the smallest words
            src.append(homo)
            dst.append(np.full(homo.size, -1))
            et.append(np.full(homo.size, r))
            teid.append(np.full(homo.size, -1))
        cat = [np.concatenate(p).astype(np.int64) for p in (src, dst, et, teid)]
        block = to_hetero_block(book, *cat, current, new_type="paper")
        blocks.append(block)
        current = block.homo.srcnodes.numpy()
    blocks.reverse()
    keys = typed_node_keys(aio, "feat")
    assert keys is not None
    x = {}
    for t, pos in blocks[0].src_pos.items():
        ids = current[pos]
        rows = np.empty((ids.size, WORDS), dtype=np.float32)
        rows[ids < 0] = feats[-1 - ids[ids < 0]]
        if (ids >= 0).any():
            rows[ids >= 0] = client.loop.run(aio.pull_numpy(keys[t], ids[ids >= 0]))
        x[t] = torch.from_numpy(rows)
    assert blocks[-1].num_edges() > 0 and (current[blocks[0].src_pos["paper"]] == -1).any()
    with torch.no_grad():
        want: np.ndarray = model(blocks, x).numpy()
    return want


def test_sampled_typed_inductive_answer_equals_blocks_built_by_hand(acm: Any, tmp_path: Path) -> None:
    """Fanouts [3, 2]: six authors and two subjects given, so the draw picks among them."""
    _, group, model_dir, client = acm
    feats = _paper_features(client, 10)
    given = {"writes": AUTHORS, "subject:subject-of:paper": SUBJECTS}
    want = _by_hand(client, model_dir, feats, given)
    serve = _serve(group, model_dir, tmp_path)
    try:
        for url in (f"tcp://127.0.0.1:{serve.msgpack_port}", f"http://127.0.0.1:{serve.port}"):
            with asyncgraph.InferenceClient(url, model="acm") as inference:
                got = inference.infer_new(feats, {k: [v] for k, v in given.items()}).output
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
                offsets = {k: [0, v.size] for k, v in given.items()}
                again = inference.infer_new(torch.from_numpy(feats), given, offsets, ntype="paper")
                np.testing.assert_allclose(again.output, got, atol=1e-6, rtol=1e-6)
                assert again.node_ids is None
    finally:
        serve.stop()
    assert serve.proc.returncode == 0, serve.log.read_text(errors="replace")


def _stored_papers(client: Client, hg: Any) -> int:
    """How many papers the live graph added (probing their per-type IDs, a few per partition)."""
    book, count, base = client.book, 0, hg.num_nodes("paper")
    for p in range(book.num_partitions()):
        for k in range(8):
            homo = book.map_to_homo_nid(np.array([base + p + k * book.num_partitions()]), "paper")
            try:
                client.loop.run(client.async_client.degrees(homo, "in"))
            except OutOfRangeError:
                break
            count += 1
    return count


def test_stored_typed_new_paper_answers_as_asked_by_its_new_id(acm: Any, full: ServeProcess) -> None:
    hg, _, _, client = acm
    feats = np.concatenate([_paper_features(client, 20), _paper_features(client, 21)])
    given = {"writes": [AUTHORS[:3], AUTHORS[3:4]], "subject:subject-of:paper": [SUBJECTS[:1], []]}
    before = _stored_papers(client, hg)
    with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{full.msgpack_port}", model="acm") as inference:
        asked = inference.infer_new(feats, given).output
        stored = inference.infer_new(feats, given, store=True)
        np.testing.assert_allclose(stored.output, asked, atol=1e-6, rtol=1e-6)
        assert stored.node_ids is not None and stored.node_ids.size == 2
        assert (stored.node_ids >= hg.num_nodes("paper")).all()
        assert _stored_papers(client, hg) == before + 2
        by_id = inference.infer({"paper": stored.node_ids})
        np.testing.assert_allclose(by_id, stored.output, atol=1e-5, rtol=1e-5)
    book = client.book
    homo = np.asarray(book.map_to_homo_nid(stored.node_ids, "paper"))
    out = client.loop.run(client.async_client.sample_etypes(homo, np.full(len(book.canonical_etypes), -1)))
    got = sorted(zip(out["dst"].tolist(), out["etype"].tolist(), out["src"].tolist(), strict=True))
    writes, subject_of = book.etype_id("writes"), book.etype_id("subject-of")
    a = np.asarray(book.map_to_homo_nid(AUTHORS[:4], "author")).tolist()
    s = int(book.map_to_homo_nid(SUBJECTS[:1], "subject")[0])
    h0, h1 = homo.tolist()
    assert got == sorted([(h0, writes, v) for v in a[:3]] + [(h0, subject_of, s), (h1, writes, a[3])])
    key = typed_node_keys(client.async_client, "feat")
    assert key is not None
    np.testing.assert_array_equal(client.loop.run(client.async_client.pull_numpy(key["paper"], homo)), feats)
    assert _stored_papers(client, hg) == before + 2


FEAT = {"name": "features", "datatype": "FP32", "shape": [1, WORDS], "data": [0.5] * WORDS}


def _ints(name: str, data: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": "INT64", "shape": [len(data)], "data": data}


def _body(*inputs: dict[str, Any], **params: Any) -> bytes:
    """An OIP body; the bad ones ask ``store`` too (a failed request stores nothing)."""
    return json.dumps({"inputs": list(inputs), "parameters": {"store": True, **params}}).encode()


OK = (_ints("neighbors:writes", [1, 2]), _ints("neighbor_offsets:writes", [0, 2]))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body(FEAT, _ints("neighbors:nope", [1]), _ints("neighbor_offsets:nope", [0, 1])), "unknown"),
        (
            _body(FEAT, _ints("neighbors:written-by", [1]), _ints("neighbor_offsets:written-by", [0, 1])),
            "ends at 'author' nodes",
        ),
        (_body({**FEAT, "shape": [1, 10], "data": [0.5] * 10}, *OK), "must have shape"),
        (_body(FEAT, OK[0], _ints("neighbor_offsets:writes", [0, 1, 2])), "n + 1 = 2"),
        (_body(FEAT, _ints("neighbors:writes", [1, 10**7]), OK[1]), "unknown neighbour node ID 10000000"),
        (_body(FEAT, OK[0]), "an inductive request has the inputs"),
        (_body(FEAT, *OK, ntype="author"), "answers 'paper' nodes only"),
        (_body(FEAT, *OK, ntype="nope"), "unknown node type 'nope'"),
        (_body(FEAT, _ints("neighbors", [1]), _ints("neighbor_offsets", [0, 1])), "per relation"),
        (_body({**FEAT, "data": [float("nan")] * WORDS}, *OK), "NaN or infinity"),
    ],
)
def test_bad_typed_inductive_requests_are_400_and_nothing_is_stored(
    acm: Any, full: ServeProcess, body: bytes, message: str
) -> None:
    hg, _, _, client = acm
    before = _stored_papers(client, hg)
    status, answer = full.request("POST", "/v2/models/acm/infer", body)
    assert status == 400, answer
    assert message in answer["error"], answer
    assert _stored_papers(client, hg) == before
    ok, good = full.request("POST", "/v2/models/acm/infer", _body(FEAT, *OK, store=False))
    assert ok == 200 and good["outputs"][0]["shape"] == [1, CLASSES], good


def test_bad_typed_inductive_requests_over_msgpack_are_typed(acm: Any, full: ServeProcess) -> None:
    hg, _, _, client = acm
    before = _stored_papers(client, hg)
    row = np.zeros((1, WORDS), np.float32)
    with asyncgraph.InferenceClient(f"tcp://127.0.0.1:{full.msgpack_port}", model="acm") as inference:
        with pytest.raises(OutOfRangeError, match="unknown neighbour node ID 99999"):
            inference.infer_new(row, {"writes": [[99999]]}, store=True)
        with pytest.raises(UnknownTypeError, match="unknown or ambiguous relation 'nope'"):
            inference.infer_new(row, {"nope": [[1]]}, store=True)
        with pytest.raises(InvalidRequestError, match="ends at 'subject' nodes"):
            inference.infer_new(row, {"has-subject": [[1]]}, store=True)
        with pytest.raises(ShapeMismatchError, match="must have shape"):
            inference.infer_new(np.zeros((1, 3), np.float32), {"writes": [[1]]}, store=True)
        with pytest.raises(InvalidRequestError, match="per relation"):
            inference.infer_new(row, [[1]], store=True)
        assert inference.infer_new(row, {"writes": [[1]]}).output.shape == (1, CLASSES)
        assert inference.infer({"paper": [0]}).shape == (1, CLASSES)
    assert _stored_papers(client, hg) == before
