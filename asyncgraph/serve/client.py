"""``asyncgraph.InferenceClient`` (blocking) and ``AsyncInferenceClient``: ask a serving process
(``python -m asyncgraph.serve``) for the model's output rows of some nodes.

The URL picks the transport: ``tcp://host:port`` the msgpack protocol (``--msgpack-port``:
arrays by reference, requests pipelined on one connection), ``http://host:port`` KServe's Open
Inference Protocol v2 (``--port``). Errors come back typed: ``OverloadedError`` (queue full:
retry later), ``RequestTimeoutError`` (deadline), ``OutOfRangeError`` (unknown node),
``UnknownModelError``, ``ServerUnavailableError`` (draining, starting, or unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import numpy as np

from asyncgraph.errors import (
    AsyncGraphError,
    InvalidRequestError,
    ProtocolError,
    ServerUnavailableError,
    error_from_code,
)
from asyncgraph.serve.wire import FrameReader, write_frame

__all__ = ["AsyncInferenceClient", "InferenceClient", "NewNodesAnswer"]

_MAX_ANSWER = 1 << 30


def _ids(nodes: Any) -> np.ndarray:
    if hasattr(nodes, "detach"):  # a torch tensor (torch is not imported here)
        nodes = nodes.detach().cpu().numpy()
    arr = np.asarray(nodes)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise InvalidRequestError(f"nodes must be a 1-D array of integer IDs, got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.int64)


class NewNodesAnswer(NamedTuple):
    """An inductive request's answer: the model's rows and, when stored, the new node IDs."""

    output: np.ndarray
    node_ids: np.ndarray | None


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _numpy(x: Any) -> np.ndarray:
    """``x`` (a tensor on any device, an array, a list) as a numpy array."""
    return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)


def _neighbour_runs(neighbors: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(flat neighbours, offsets)``: ``neighbors`` is one ID list per new node, or a flat array
    with ``offsets`` (``n + 1`` values) saying where each node's run starts."""
    if offsets is None:
        runs = [np.asarray(_numpy(r), dtype=np.int64).reshape(-1) for r in neighbors]
        counts = [r.size for r in runs]
        flat = np.concatenate(runs) if runs else np.empty(0, dtype=np.int64)
        offs = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    else:
        flat, offs = _numpy(neighbors), _numpy(offsets)
    for arr, what in ((flat, "neighbors"), (offs, "offsets")):
        if arr.size and (arr.dtype.kind not in "iu" or arr.ndim != 1):
            raise InvalidRequestError(f"{what} must be 1-D integer IDs, got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(flat, dtype=np.int64), np.ascontiguousarray(offs, dtype=np.int64)


class AsyncInferenceClient:
    """One connection to a serving process; ``await infer(nodes)`` -> float32 rows ``[n, d]``."""

    def __init__(self, url: str, model: str | None = None, *, timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("tcp", "http") or parts.hostname is None or parts.port is None:
            raise InvalidRequestError(f"url must be tcp://host:port or http://host:port, got {url!r}")
        self.url = url
        self.scheme = parts.scheme
        self.host, self.port = parts.hostname, parts.port
        self.model = model
        self.timeout = timeout
        self._lock = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._receiver: asyncio.Task[None] | None = None
        self._http: Any = None  # aiohttp.ClientSession, made on first use

    async def infer(self, nodes: Any, *, timeout: float | None = None) -> np.ndarray:
        """The model's output rows for ``nodes`` (IDs, or ``{ntype: per-type IDs}`` on a typed
        graph; repeats allowed), in that order (a dict's types in its order)."""
        ids: Any = {str(t): _ids(v) for t, v in nodes.items()} if isinstance(nodes, dict) else _ids(nodes)
        count = sum(v.size for v in ids.values()) if isinstance(ids, dict) else ids.size
        wait = self.timeout if timeout is None else timeout
        if self.scheme == "http":
            return await self._infer_http(ids, wait)
        reply = await self._call(
            {"op": "infer", "model": self.model, "nodes": ids, "timeout_ms": wait * 1e3}, wait
        )
        out = reply.get("output")
        if not isinstance(out, np.ndarray) or out.ndim != 2 or out.shape[0] != count:
            raise ProtocolError("the answer has no [n, d] 'output' array")
        return out

    async def infer_new(
        self,
        features: Any,
        neighbors: Any,
        offsets: Any = None,
        *,
        ntype: str | None = None,
        store: bool = False,
        timeout: float | None = None,
    ) -> NewNodesAnswer:
        """The model's rows for new nodes (inductive: not in the graph): ``features[i]`` is node
        ``i``'s input row, its in-neighbours (existing node IDs) ``neighbors[i]`` (or
        ``neighbors[offsets[i]:offsets[i + 1]]`` of a flat array). ``store=True`` adds the nodes
        and edges to the live graph after the answer and returns their IDs.

        A typed graph: the new nodes are of type ``ntype`` (default: the model's target type)
        and ``neighbors`` is ``{etype: lists or flat per-type source IDs}`` (each relation
        ending at ``ntype``), ``offsets`` then ``{etype: offsets}`` for the flat ones."""
        if isinstance(neighbors, dict):
            if offsets is not None and not isinstance(offsets, dict):
                raise InvalidRequestError("with neighbours per relation, offsets is {etype: offsets}")
            offs_of = offsets or {}
            per_rel = {str(r): _neighbour_runs(v, offs_of.get(r)) for r, v in neighbors.items()}
            flat: Any = {r: v[0] for r, v in per_rel.items()}
            offs: Any = {r: v[1] for r, v in per_rel.items()}
        else:
            flat, offs = _neighbour_runs(neighbors, offsets)
        feats = np.ascontiguousarray(_numpy(features))
        wait = self.timeout if timeout is None else timeout
        if self.scheme == "http":
            return await self._infer_new_http(feats, flat, offs, store, wait, ntype)
        request = {"op": "infer_new", "model": self.model, "features": feats, "neighbors": flat,
                   "offsets": offs, "store": store, "timeout_ms": wait * 1e3}  # fmt: skip
        if ntype is not None:
            request["ntype"] = ntype
        reply = await self._call(request, wait)
        out, ids = reply.get("output"), reply.get("node_ids")
        if not isinstance(out, np.ndarray) or out.ndim != 2 or out.shape[0] != feats.shape[0]:
            raise ProtocolError("the answer has no [n, d] 'output' array")
        return NewNodesAnswer(out, ids if isinstance(ids, np.ndarray) else None)

    async def metadata(self) -> dict[str, Any]:
        """The served model's name, version, fanouts and output width."""
        if self.scheme == "http":
            return await self._get_json(f"/v2/models/{self.model}")
        return await self._call({"op": "meta", "model": self.model}, self.timeout)

    # --- msgpack ---------------------------------------------------------------------------
    async def _open(self) -> None:
        async with self._lock:
            if self._writer is not None and not self._writer.is_closing():
                return
            try:
                reader, self._writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.timeout
                )
            except (OSError, TimeoutError) as exc:
                raise ServerUnavailableError(f"cannot reach {self.url}: {exc}") from None
            self._receiver = asyncio.ensure_future(self._receive(reader))

    async def _receive(self, reader: asyncio.StreamReader) -> None:
        error: AsyncGraphError = ServerUnavailableError(f"{self.url} closed the connection")
        frames = FrameReader(reader, _MAX_ANSWER)
        try:
            while (msg := await frames.next()) is not None:
                if not isinstance(msg, dict):
                    raise ProtocolError("an answer is not a map")
                rid = msg.get("id")
                fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
                if fut is None:
                    if msg.get("ok") is False:  # about the connection (a protocol error)
                        error = error_from_code(str(msg.get("code")), str(msg.get("error")))
                    continue
                if not fut.done():
                    fut.set_result(msg)
        except (ProtocolError, ConnectionError) as exc:
            error = exc if isinstance(exc, ProtocolError) else ServerUnavailableError(f"{self.url}: {exc}")
        finally:
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()

    async def _call(self, request: dict[str, Any], wait: float) -> dict[str, Any]:
        await self._open()
        assert self._writer is not None
        self._next_id += 1
        rid = request["id"] = self._next_id
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[rid] = fut
        # the server answers a late request with its own typed timeout; this bound is a backstop
        # (a timer, not wait_for: no task per request)
        timer = loop.call_later(wait + 1.0, _expire, fut)
        try:
            write_frame(self._writer, request)
            await self._writer.drain()
            reply = await fut
        except TimeoutError:
            raise ServerUnavailableError(f"{self.url} did not answer within {wait + 1.0:.1f} s") from None
        except ConnectionError as exc:
            raise ServerUnavailableError(f"{self.url}: {exc}") from None
        finally:
            timer.cancel()
            self._pending.pop(rid, None)
        if not reply.get("ok"):
            raise error_from_code(str(reply.get("code")), str(reply.get("error")))
        return reply

    # --- HTTP ------------------------------------------------------------------------------
    async def _session(self) -> Any:
        if self._http is None:
            import aiohttp

            self._http = aiohttp.ClientSession(f"http://{self.host}:{self.port}")
        return self._http

    async def _infer_http(self, ids: np.ndarray | dict[str, np.ndarray], wait: float) -> np.ndarray:
        if self.model is None:
            raise InvalidRequestError("an http:// client needs the model's name (model=...)")
        named = list(ids.items()) if isinstance(ids, dict) else [("nodes", ids)]
        body = {
            "inputs": [
                {"name": name, "datatype": "INT64", "shape": [int(v.size)], "data": v.tolist()}
                for name, v in named
            ],
            "parameters": {"timeout_ms": wait * 1e3},
        }
        doc = await self._post_json(f"/v2/models/{self.model}/infer", body, wait)
        try:
            (out,) = doc["outputs"]
            return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed inference answer: {exc}") from None

    async def _infer_new_http(
        self, feats: np.ndarray, flat: Any, offs: Any, store: bool, wait: float, ntype: str | None = None
    ) -> NewNodesAnswer:
        if self.model is None:
            raise InvalidRequestError("an http:// client needs the model's name (model=...)")
        if feats.dtype.kind != "f":
            feats = feats.astype(np.float32)
        ftype = {"float16": "FP16", "float64": "FP64"}.get(str(feats.dtype), "FP32")
        runs = flat.items() if isinstance(flat, dict) else [(None, flat)]

        def ints(name: str, arr: np.ndarray) -> dict[str, Any]:
            return {"name": name, "datatype": "INT64", "shape": [int(arr.size)], "data": arr.tolist()}

        inputs = [{"name": "features", "datatype": ftype, "shape": list(feats.shape),
                   "data": feats.reshape(-1).tolist()}]  # fmt: skip
        for rel, ids in runs:  # per relation on a typed graph: neighbors:<etype>
            tail = "" if rel is None else f":{rel}"
            inputs += [ints(f"neighbors{tail}", ids),
                       ints(f"neighbor_offsets{tail}", offs if rel is None else offs[rel])]  # fmt: skip
        params: dict[str, Any] = {"timeout_ms": wait * 1e3, "store": store}
        if ntype is not None:
            params["ntype"] = ntype
        body = {"inputs": inputs, "parameters": params}
        doc = await self._post_json(f"/v2/models/{self.model}/infer", body, wait)
        try:
            outputs = {o["name"]: o for o in doc["outputs"]}
            out = outputs["output"]
            rows = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
            ids = outputs.get("node_ids")
            return NewNodesAnswer(rows, None if ids is None else np.asarray(ids["data"], dtype=np.int64))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed inference answer: {exc}") from None

    async def _post_json(self, path: str, body: Any, wait: float) -> dict[str, Any]:
        import aiohttp

        session = await self._session()
        try:
            async with session.post(path, json=body, timeout=aiohttp.ClientTimeout(total=wait + 1.0)) as resp:
                return self._checked(resp.status, await resp.text())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerUnavailableError(f"{self.url}: {type(exc).__name__}: {exc}") from None

    async def _get_json(self, path: str) -> dict[str, Any]:
        import aiohttp

        session = await self._session()
        try:
            async with session.get(path, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                return self._checked(resp.status, await resp.text())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerUnavailableError(f"{self.url}: {type(exc).__name__}: {exc}") from None

    def _checked(self, status: int, text: str) -> dict[str, Any]:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = {"error": text[:200]}
        if status == 200 and isinstance(doc, dict):
            return doc
        message = str(doc.get("error", f"HTTP {status}")) if isinstance(doc, dict) else f"HTTP {status}"
        code = str(doc.get("code", "")) if isinstance(doc, dict) else ""
        if 400 <= status < 500 and code in ("", "too_large"):
            return_error: AsyncGraphError = InvalidRequestError(message)
        else:
            return_error = error_from_code(code or "internal", message)
        raise return_error

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(BaseException):
                await self._receiver
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> AsyncInferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class InferenceClient:
    """The blocking client: ``AsyncInferenceClient`` run on a loop thread of its own."""

    def __init__(self, url: str, model: str | None = None, *, timeout: float = 10.0) -> None:
        from asyncgraph.client.loop_thread import EventLoopThread

        self._loop = EventLoopThread(name="asyncgraph-inference")
        self._aio = AsyncInferenceClient(url, model, timeout=timeout)
        self._closed = threading.Event()

    def infer(self, nodes: Sequence[int] | np.ndarray | Any, *, timeout: float | None = None) -> np.ndarray:
        """The model's output rows for ``nodes``, in that order (float32 ``[n, d]``)."""
        return self._loop.run(self._aio.infer(nodes, timeout=timeout))

    def infer_new(
        self,
        features: Any,
        neighbors: Any,
        offsets: Any = None,
        *,
        ntype: str | None = None,
        store: bool = False,
        timeout: float | None = None,
    ) -> NewNodesAnswer:
        """``AsyncInferenceClient.infer_new``: rows for new nodes from their features and
        in-neighbours (per relation on a typed graph; ``store=True``: also added to the live
        graph; their IDs returned)."""
        return self._loop.run(
            self._aio.infer_new(features, neighbors, offsets, ntype=ntype, store=store, timeout=timeout)
        )

    def metadata(self) -> dict[str, Any]:
        return self._loop.run(self._aio.metadata())

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            with contextlib.suppress(Exception):
                self._loop.run(self._aio.close(), timeout=5.0)
            self._loop.stop()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
