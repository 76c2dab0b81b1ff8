"""KServe's Open Inference Protocol v2 over aiohttp: infer, health, model metadata, metrics.

``POST /v2/models/{name}/infer`` takes one input ``nodes`` (``INT64``/``INT32``/``UINT32``/
``UINT64``, shape ``[n]``, flat ``data``) and answers one output ``output`` (``FP32``, shape
``[n, d]``, row-major ``data``), the model's rows in the order of the nodes asked (repeats
allowed). ``parameters.timeout_ms`` shortens the request's deadline. Every error is
``{"error": message, "code": asyncgraph error code}`` with a 4xx/5xx status; the process keeps
serving everyone else.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from asyncgraph.errors import (
    AsyncGraphError,
    DTypeMismatchError,
    InvalidRequestError,
    OverloadedError,
    RequestTimeoutError,
    ServerUnavailableError,
    ShapeMismatchError,
    UnknownModelError,
)
from asyncgraph.serve.artifact import ModelSpec
from asyncgraph.serve.batching import DynamicBatcher
from asyncgraph.serve.core import InferenceCore
from asyncgraph.serve.inductive import NEW_NODE_INPUTS, NewNodesInput, run_request
from asyncgraph.serve.metrics import ServeMetrics

__all__ = ["INPUT_DATATYPES", "ServeState", "build_app", "status_of"]

log = logging.getLogger(__name__)

INPUT_DATATYPES = {"INT64": np.int64, "INT32": np.int32, "UINT64": np.uint64, "UINT32": np.uint32}
FEATURE_DATATYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16}
INPUT_NAME = "nodes"
OUTPUT_NAME = "output"
NODE_IDS_NAME = "node_ids"
STATE_KEY = web.AppKey("asyncgraph_serve", object)


@dataclass
class ServeState:
    """What the handlers share: the model, the batching core, readiness and metrics."""

    spec: ModelSpec
    core: InferenceCore | None = None
    batcher: DynamicBatcher | None = None
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    ready: bool = False
    draining: bool = False
    max_body_bytes: int = 1 << 20
    probed_at: float = float("-inf")
    unreachable: str | None = None


def status_of(exc: BaseException) -> int:
    """The HTTP status a typed error answers with."""
    if isinstance(exc, UnknownModelError):
        return 404
    if isinstance(exc, InvalidRequestError):
        return 400
    if isinstance(exc, OverloadedError):
        return 429
    if isinstance(exc, RequestTimeoutError):
        return 504
    if isinstance(exc, ServerUnavailableError):
        return 503
    return 500


def _error(exc: AsyncGraphError, status: int | None = None) -> web.Response:
    code = exc.code if isinstance(exc, AsyncGraphError) else "internal"
    return web.json_response({"error": str(exc), "code": code}, status=status or status_of(exc))


def _state(request: web.Request) -> ServeState:
    state = request.app[STATE_KEY]
    assert isinstance(state, ServeState)
    return state


def _model(state: ServeState, request: web.Request) -> ModelSpec:
    name = request.match_info["name"]
    version = request.match_info.get("version")
    if name != state.spec.name or (version is not None and version != state.spec.version):
        asked = name if version is None else f"{name} version {version}"
        raise UnknownModelError(
            f"no model {asked!r} here; served: {state.spec.name!r} version {state.spec.version}"
        )
    return state.spec


def _input_array(spec: Any) -> tuple[str, np.ndarray]:
    """One OIP input ``{name, datatype, shape, data}`` as ``(name, array of that shape)``: IDs
    (integers, shape ``[n]``), or for ``features`` (an inductive request) numbers ``[n, d]``."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequestError("each input must be an object with a 'name'")
    name, datatype = spec["name"], spec.get("datatype")
    floats = name == NEW_NODE_INPUTS[0]
    allowed: dict[str, type[Any]] = FEATURE_DATATYPES if floats else INPUT_DATATYPES
    if not isinstance(datatype, str) or datatype not in allowed:
        raise DTypeMismatchError(f"input {name!r}: datatype {datatype!r}, expected one of {sorted(allowed)}")
    shape, data = spec.get("shape"), spec.get("data")
    number = (int, float) if floats else (int,)
    if not isinstance(data, list) or not all(type(v) in number for v in data):
        kind = "numbers" if floats else "integers"
        raise DTypeMismatchError(f"input {name!r}: 'data' must be a flat list of {kind}")
    dims = 2 if floats else 1
    if not (
        isinstance(shape, list)
        and len(shape) == dims
        and all(type(s) is int and s >= 0 for s in shape)
        and int(np.prod(shape)) == len(data)
    ):
        raise ShapeMismatchError(
            f"input {name!r}: shape {shape!r} does not match the {len(data)} values of 'data' "
            f"(expected {'[n, d]' if floats else '[n]'})"
        )
    try:
        return name, np.array(data, dtype=allowed[datatype]).reshape(shape)
    except OverflowError:
        raise DTypeMismatchError(f"input {name!r}: a value does not fit {datatype}") from None


def _new_nodes_input(arrays: list[tuple[str, np.ndarray]], params: Any) -> NewNodesInput:
    """An inductive request's inputs: ``features``, ``neighbors`` and ``neighbor_offsets``, or on
    a typed graph ``features`` and per relation ``neighbors:<etype>`` and
    ``neighbor_offsets:<etype>`` (``parameters.ntype``: the new nodes' type, optional)."""
    names = [name for name, _ in arrays]
    named = dict(arrays)
    typed = [n for n in names if n.startswith(("neighbors:", "neighbor_offsets:"))]
    rels = [n.split(":", 1)[1] for n in typed if n.startswith("neighbors:")]
    expected = ["features", *(f"{k}:{r}" for r in rels for k in ("neighbors", "neighbor_offsets"))]
    if not (sorted(names) == sorted(NEW_NODE_INPUTS) or (typed and sorted(names) == sorted(expected))):
        raise InvalidRequestError(
            f"an inductive request has the inputs {list(NEW_NODE_INPUTS)} (on a typed graph "
            f"'features' and per relation 'neighbors:<etype>' and 'neighbor_offsets:<etype>'), got {names}"
        )
    params = params if isinstance(params, dict) else {}
    store, ntype = params.get("store", False), params.get("ntype")
    if not isinstance(store, bool):
        raise InvalidRequestError("parameters.store must be true or false")
    if ntype is not None and not isinstance(ntype, str):
        raise InvalidRequestError("parameters.ntype must be a node type's name")
    if not typed:
        return NewNodesInput(named["features"], named["neighbors"], named["neighbor_offsets"], store, ntype)
    nbrs = {r: named[f"neighbors:{r}"] for r in rels}
    offs = {r: named[f"neighbor_offsets:{r}"] for r in rels}
    return NewNodesInput(named["features"], nbrs, offs, store, ntype)


def parse_infer_body(
    body: bytes,
) -> tuple[np.ndarray | dict[str, np.ndarray] | NewNodesInput, Any, float | None]:
    """``(node IDs, request id, timeout in seconds or None)`` of an OIP v2 infer body, or a typed
    error naming what is wrong. The IDs are one input ``nodes`` (homogeneous IDs), or on a typed
    graph one input per node type named by it (per-type IDs; answered in the inputs' order). An
    inductive request's inputs (``features``, ``neighbors``, ``neighbor_offsets``, or per
    relation ``neighbors:<etype>``, ``neighbor_offsets:<etype>``; ``parameters.store``,
    ``parameters.ntype``) come back as a ``NewNodesInput`` in the IDs' place."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise InvalidRequestError("malformed JSON body: nested too deeply") from None
    if not isinstance(doc, dict):
        raise InvalidRequestError("the body must be a JSON object with 'inputs'")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequestError(
            f"'inputs' must hold exactly one input, {INPUT_NAME!r}, or one per node type of a typed graph"
        )
    arrays = [_input_array(spec) for spec in inputs]
    names = [name for name, _ in arrays]
    params = doc.get("parameters") or {}
    nodes: np.ndarray | dict[str, np.ndarray] | NewNodesInput
    if NEW_NODE_INPUTS[0] in names:
        nodes = _new_nodes_input(arrays, params)
    elif names == [INPUT_NAME]:
        nodes = arrays[0][1]
    elif INPUT_NAME in names or len(set(names)) != len(names):
        raise InvalidRequestError(f"inputs {names}: either one {INPUT_NAME!r} or distinct node types")
    else:
        nodes = dict(arrays)
    timeout = params.get("timeout_ms") if isinstance(params, dict) else None
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise InvalidRequestError("parameters.timeout_ms must be a number")
    return nodes, doc.get("id"), None if timeout is None else float(timeout) / 1e3


async def infer(request: web.Request) -> web.Response:
    state = _state(request)
    started = time.perf_counter()
    outcome = "ok"
    try:
        spec = _model(state, request)
        if state.draining or not state.ready or state.core is None or state.batcher is None:
            raise ServerUnavailableError("not ready: " + ("draining" if state.draining else "starting"))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            outcome = "too_large"
            message = f"request body over the limit of {state.max_body_bytes} bytes ({exc.text})"
            return web.json_response({"error": message, "code": "too_large"}, status=413)
        raw, request_id, timeout = parse_infer_body(body)
        rows, node_ids = await run_request(state.core, state.batcher, raw, timeout)
        out = rows.numpy()
        answer: dict[str, Any] = {
            "model_name": spec.name,
            "model_version": spec.version,
            "outputs": [
                {
                    "name": OUTPUT_NAME,
                    "datatype": "FP32",
                    "shape": [int(s) for s in out.shape],
                    "data": out.reshape(-1).tolist(),
                }
            ],
        }
        if node_ids is not None:  # an inductive request's stored nodes
            ids = {"name": NODE_IDS_NAME, "datatype": "INT64", "shape": [node_ids.size]}
            answer["outputs"].append({**ids, "data": node_ids.tolist()})
        if request_id is not None:
            answer["id"] = request_id
        return web.json_response(answer)
    except AsyncGraphError as exc:
        outcome = exc.code
        return _error(exc)
    except Exception as exc:  # a bug of ours: answered, logged, the process keeps serving
        outcome = "internal"
        log.exception("inference request failed")
        return web.json_response({"error": f"{type(exc).__name__}: {exc}", "code": "internal"}, status=500)
    finally:
        state.metrics.count_request(outcome)
        state.metrics.observe_stage("total", time.perf_counter() - started)


async def live(request: web.Request) -> web.Response:
    return web.json_response({"live": True})


async def ready(request: web.Request) -> web.Response:
    """200 while the model is loaded and every graph server answers a ping (checked at most every
    half second; the ping also reconnects a lost server), else 503 with the reason."""
    state = _state(request)
    ok = state.ready and not state.draining and state.core is not None
    reason = "draining" if state.draining else None if ok else "starting"
    if ok and state.core is not None:
        now = time.monotonic()
        if now - state.probed_at > 0.5:
            state.probed_at = now
            state.unreachable = await state.core.graph_unreachable()
        reason = state.unreachable
        ok = reason is None
    body: dict[str, Any] = {"ready": ok} if ok else {"ready": False, "reason": reason}
    return web.json_response(body, status=200 if ok else 503)


async def model_ready(request: web.Request) -> web.Response:
    state = _state(request)
    try:
        _model(state, request)
    except UnknownModelError as exc:
        return _error(exc)
    ok = state.ready and not state.draining
    return web.json_response({"name": state.spec.name, "ready": ok}, status=200 if ok else 503)


async def server_metadata(request: web.Request) -> web.Response:
    try:
        version = importlib.metadata.version("asyncgraph")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout
        version = "unknown"
    return web.json_response({"name": "asyncgraph", "version": version, "extensions": []})


async def model_metadata(request: web.Request) -> web.Response:
    state = _state(request)
    try:
        spec = _model(state, request)
    except UnknownModelError as exc:
        return _error(exc)
    core = state.core
    out_dim = core.out_dim if core is not None and core.out_dim is not None else -1
    # homogeneous IDs, or on a typed graph per-type IDs under the node type's name
    names = [INPUT_NAME]
    if core is not None and core.async_client.book.is_hetero:
        names += [core.target] if core.target is not None else list(core.async_client.book.ntypes)
    return web.json_response(
        {
            "name": spec.name,
            "versions": [spec.version],
            "platform": "asyncgraph_pytorch",
            "inputs": [{"name": name, "datatype": "INT64", "shape": [-1]} for name in names],
            "outputs": [{"name": OUTPUT_NAME, "datatype": "FP32", "shape": [-1, out_dim]}],
            "parameters": {
                "fanouts": spec.fanouts,
                "feat": spec.feat,
                "class": spec.class_path or None,
                "exported": spec.exported,
            },
        }
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=_state(request).metrics.text(), content_type="text/plain", charset="utf-8")


def build_app(state: ServeState, *, max_body_bytes: int) -> web.Application:
    """The aiohttp application of one serving process (bodies over ``max_body_bytes``: 413)."""
    state.max_body_bytes = max_body_bytes
    app = web.Application(client_max_size=max_body_bytes)
    app[STATE_KEY] = state
    app.add_routes(
        [
            web.get("/v2", server_metadata),
            web.get("/v2/health/live", live),
            web.get("/v2/health/ready", ready),
            web.get("/v2/models/{name}", model_metadata),
            web.get("/v2/models/{name}/versions/{version}", model_metadata),
            web.get("/v2/models/{name}/ready", model_ready),
            web.post("/v2/models/{name}/infer", infer),
            web.post("/v2/models/{name}/versions/{version}/infer", infer),
            web.get("/metrics", metrics),
        ]
    )
    return app
