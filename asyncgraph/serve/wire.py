"""The serving process's msgpack protocol (for ``InferenceClient``): the graph servers' frames
(``protocol/codec.py``: a 4-byte length, a msgpack header, arrays by reference) over one TCP
connection, requests pipelined and answered as they finish (matched by ``id``).

Request ``{"op": "infer", "id": int, "model": str | None, "nodes": int array [n],
"timeout_ms": number | None}`` (or ``{"op": "meta", "id": int}``); answer ``{"id", "ok": True,
"output": float32 array [n, d]}`` or ``{"id", "ok": False, "code", "error"}``. An inductive
request (``serve/inductive.py``) is ``{"op": "infer_new", "id", "model", "features": [n, d],
"neighbors": int [m], "offsets": int [n + 1], "store": bool, "timeout_ms"}``; its answer adds
``"node_ids"`` (int64 [n]) when ``store`` is true. On a typed graph ``neighbors`` and
``offsets`` are ``{relation: array}`` (per-type source IDs) and ``"ntype"`` may name the new
nodes' type (default: the model's target type); ``node_ids`` are then per-type IDs. A malformed frame
or one over the size limit is answered with a ``protocol`` error and the connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

import numpy as np

from asyncgraph.errors import (
    AsyncGraphError,
    InvalidRequestError,
    ProtocolError,
    ServerUnavailableError,
    UnknownModelError,
)
from asyncgraph.protocol.codec import decode_frame, encode_frame_bytes
from asyncgraph.protocol.framing import LENGTH_PREFIX
from asyncgraph.serve.http import ServeState
from asyncgraph.serve.inductive import NewNodesInput, run_request

__all__ = ["FrameReader", "WireServer", "write_frame"]

log = logging.getLogger(__name__)


class FrameReader:
    """Frames from a stream, read in large chunks: pipelined small requests cost one read of
    the socket for many frames, not two ``readexactly`` awaits each."""

    def __init__(self, reader: asyncio.StreamReader, max_size: int) -> None:
        self._reader = reader
        self._max_size = max_size
        self._buffer = bytearray()
        self._start = 0

    async def next(self) -> Any:
        """The next frame's value; ``None`` at a clean end of stream; ``ProtocolError`` if malformed."""
        prefix = LENGTH_PREFIX.size
        while True:
            have = len(self._buffer) - self._start
            if have >= prefix:
                (size,) = LENGTH_PREFIX.unpack_from(self._buffer, self._start)
                if size > self._max_size:
                    raise ProtocolError(f"frame of {size} bytes is over the limit of {self._max_size}")
                if have >= prefix + size:
                    begin = self._start + prefix
                    body = bytes(self._buffer[begin : begin + size])
                    self._start = begin + size
                    if self._start == len(self._buffer):
                        self._buffer.clear()
                        self._start = 0
                    return decode_frame(body)
            chunk = await self._reader.read(1 << 16)
            if not chunk:
                if have == 0:
                    return None
                where = "a frame's length" if have < prefix else "a frame"
                raise ProtocolError(f"the connection closed inside {where}")
            if self._start:
                del self._buffer[: self._start]
                self._start = 0
            self._buffer += chunk


def write_frame(writer: asyncio.StreamWriter, value: Any) -> None:
    writer.write(encode_frame_bytes(value))


def _request_nodes(msg: dict[str, Any]) -> np.ndarray | dict[str, np.ndarray] | NewNodesInput:
    """The IDs of an ``infer`` request, or the new nodes of an ``infer_new`` one (unchecked)."""
    if msg["op"] == "infer_new":
        feats, nbrs, offs = (msg.get(key) for key in ("features", "neighbors", "offsets"))

        def arrays(value: Any) -> bool:  # one array, or {etype: array} (a typed graph's)
            if isinstance(value, dict):
                return all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in value.items())
            return isinstance(value, np.ndarray)

        if not (isinstance(feats, np.ndarray) and arrays(nbrs) and arrays(offs)):
            raise InvalidRequestError(
                "'features' must be an array, 'neighbors' and 'offsets' arrays or {relation: array}"
            )
        store, ntype = msg.get("store", False), msg.get("ntype")
        if not isinstance(store, bool):
            raise InvalidRequestError("'store' must be true or false")
        if ntype is not None and not isinstance(ntype, str):
            raise InvalidRequestError("'ntype' must be a node type's name")
        return NewNodesInput(feats, nbrs, offs, store, ntype)
    nodes: Any = msg.get("nodes")
    typed = isinstance(nodes, dict) and all(
        isinstance(t, str) and isinstance(v, np.ndarray) for t, v in nodes.items()
    )
    if not (isinstance(nodes, np.ndarray) or typed):
        raise InvalidRequestError("'nodes' must be an integer array or {node type: array}")
    return nodes  # type: ignore[no-any-return]


def _error_reply(rid: Any, exc: BaseException) -> tuple[dict[str, Any], str]:
    """The reply to a request that failed with ``exc``, and its outcome for the metrics."""
    if isinstance(exc, AsyncGraphError):
        return {"id": rid, "ok": False, "code": exc.code, "error": str(exc)}, exc.code
    log.error("msgpack inference request failed", exc_info=exc)
    return {"id": rid, "ok": False, "code": "internal", "error": f"{type(exc).__name__}: {exc}"}, "internal"


class WireServer:
    """Answers msgpack frames on a TCP port through the same batcher as HTTP (``ServeState``)."""

    def __init__(self, state: ServeState, *, max_frame: int) -> None:
        self.state = state
        self.max_frame = max_frame
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._requests: set[asyncio.Task[None]] = set()
        self._queued: set[asyncio.Future[Any]] = set()  # requests answered from their batch

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen; returns the bound port."""
        self._server = await asyncio.start_server(
            self._serve_connection, host, port, reuse_port=reuse_port or None
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        frames = FrameReader(reader, self.max_frame)
        try:
            while True:
                try:
                    msg = await frames.next()
                except (ProtocolError, ConnectionError) as exc:
                    with contextlib.suppress(Exception):
                        write_frame(writer, {"id": None, "ok": False, "code": "protocol", "error": str(exc)})
                        await writer.drain()
                    return
                if msg is None:
                    return
                if self._answer_from_batch(msg, writer):
                    if writer.transport.get_write_buffer_size():  # a client that does not read its
                        await writer.drain()  # answers is not read either (back-pressure)
                    continue
                request = asyncio.ensure_future(self._answer(msg, writer))
                self._requests.add(request)
                request.add_done_callback(self._requests.discard)
        finally:
            self._connections.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    def _answer_from_batch(self, msg: Any, writer: asyncio.StreamWriter) -> bool:
        """Queue an ``infer`` of valid base-graph IDs without a task of its own, answered from its
        batch's completion (a callback): at 1,000 requests/s a task and four coroutines per request
        were ~5% of the loop. False for anything else, and for any request that would fail:
        ``_answer`` takes those (and repeats the checks to give the typed error)."""
        state, core, batcher = self.state, self.state.core, self.state.batcher
        if not isinstance(msg, dict) or msg.get("op") != "infer" or core is None or batcher is None:
            return False
        nodes, timeout, model = msg.get("nodes"), msg.get("timeout_ms"), msg.get("model")
        if (
            state.draining
            or not isinstance(nodes, np.ndarray)
            or (model is not None and model != state.spec.name)
            or (timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))))
        ):
            return False
        try:
            homo = core.check_nodes(nodes)
            if homo.size and int(homo.max()) >= core.num_nodes:  # added nodes: their owners are asked
                return False
            future = batcher.submit_nowait(homo, None if timeout is None else timeout / 1e3)
        except AsyncGraphError:
            return False
        future.add_done_callback(functools.partial(self._reply, writer, msg.get("id"), time.perf_counter()))
        self._queued.add(future)
        return True

    def _reply(
        self, writer: asyncio.StreamWriter, rid: Any, started: float, future: asyncio.Future[Any]
    ) -> None:
        """Write the answer of a request queued by ``_answer_from_batch`` (its future is done)."""
        self._queued.discard(future)
        exc = future.exception() if not future.cancelled() else asyncio.CancelledError()
        if exc is None:
            rows = np.ascontiguousarray(future.result().numpy())
            reply: dict[str, Any] = {"id": rid, "ok": True, "output": rows}
            outcome = "ok"
        else:
            reply, outcome = _error_reply(rid, exc)
        self.state.metrics.count_request(outcome)
        self.state.metrics.observe_stage("total", time.perf_counter() - started)
        with contextlib.suppress(ConnectionError, RuntimeError):
            write_frame(writer, reply)

    async def _answer(self, msg: Any, writer: asyncio.StreamWriter) -> None:
        state = self.state
        rid = msg.get("id") if isinstance(msg, dict) else None
        outcome = "ok"
        started = time.perf_counter()
        try:
            if not isinstance(msg, dict) or msg.get("op") not in ("infer", "infer_new", "meta"):
                raise InvalidRequestError("a request is a map with 'op' 'infer', 'infer_new' or 'meta'")
            model = msg.get("model")
            if model is not None and model != state.spec.name:
                raise UnknownModelError(f"no model {model!r} here; served: {state.spec.name!r}")
            if msg["op"] == "meta":
                core = state.core
                reply: dict[str, Any] = {
                    "id": rid, "ok": True, "name": state.spec.name, "version": state.spec.version,
                    "fanouts": state.spec.fanouts, "out_dim": None if core is None else core.out_dim,
                }  # fmt: skip
            else:
                if state.draining or state.core is None or state.batcher is None:
                    raise ServerUnavailableError(
                        "not ready: " + ("draining" if state.draining else "starting")
                    )
                nodes = _request_nodes(msg)
                timeout = msg.get("timeout_ms")
                if timeout is not None and (
                    isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                ):
                    raise InvalidRequestError("'timeout_ms' must be a number")
                wait = None if timeout is None else timeout / 1e3
                rows, node_ids = await run_request(state.core, state.batcher, nodes, wait)
                reply = {"id": rid, "ok": True, "output": np.ascontiguousarray(rows.numpy())}
                if node_ids is not None:
                    reply["node_ids"] = node_ids
        except Exception as exc:
            reply, outcome = _error_reply(rid, exc)
        if isinstance(msg, dict) and msg.get("op") in ("infer", "infer_new"):
            state.metrics.count_request(outcome)
            state.metrics.observe_stage("total", time.perf_counter() - started)
        with contextlib.suppress(ConnectionError, RuntimeError):
            write_frame(writer, reply)
            await writer.drain()

    async def close(self, timeout: float) -> None:
        """Stop listening, let running requests answer (within ``timeout``), close connections."""
        if self._server is not None:
            self._server.close()
        pending: list[asyncio.Future[Any]] = [*self._requests, *self._queued]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=1.0)
