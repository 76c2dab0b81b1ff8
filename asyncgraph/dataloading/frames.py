"""What DGL scripts do with a block or pair graph besides reading its edges: per-side data frames
that answer ``dgl.NID`` / ``dgl.EID``, ``local_scope()``/``local_var()``, and ``apply_edges`` /
``update_all`` with ``asyncgraph.function`` built-ins or a Python callable over all edges at once.

Everything is vectorised over edges: one gather per endpoint side, one ``index_add`` or
``scatter_reduce`` per reduction.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from asyncgraph import function as fn
from asyncgraph.errors import InvalidRequestError, UnknownTensorError

__all__ = ["ID_FIELD", "EdgeBatch", "Frame", "GraphOps"]

ID_FIELD = "_ID"  # DGL's dgl.NID / dgl.EID


class Frame(dict[str, Any]):
    """A side's data (``srcdata``, ``dstdata``, ``ndata``, ``edata``): a plain dict that also
    answers ``"_ID"`` (DGL's ``dgl.NID``/``dgl.EID``) with that side's global IDs, unless set.

    The IDs are not an entry: iterating and copying give only the stored fields.
    """

    def __init__(self, data: Any = (), ids: torch.Tensor | None = None) -> None:
        super().__init__(data)
        self.ids = ids

    def __missing__(self, key: str) -> Any:
        if key == ID_FIELD and self.ids is not None:
            return self.ids
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or (key == ID_FIELD and self.ids is not None)

    def get(self, key: str, default: Any = None) -> Any:
        if key == ID_FIELD and not super().__contains__(key):
            return self.ids if self.ids is not None else default
        return super().get(key, default)

    def copy(self) -> Frame:
        return Frame(self, self.ids)


class EdgeBatch:
    """What a callable passed to ``apply_edges`` sees: every edge at once (DGL's ``EdgeBatch``)."""

    def __init__(self, src: dict[str, Any], dst: dict[str, Any], data: dict[str, Any]) -> None:
        self.src, self.dst, self.data = src, dst, data


class _Gathered(dict[str, Any]):
    """Rows of a frame's fields gathered for the edges' endpoints, on first access."""

    def __init__(self, frame: dict[str, Any], index: torch.Tensor) -> None:
        super().__init__()
        self._frame, self._index = frame, index

    def __missing__(self, key: str) -> Any:
        value = self._frame[key][self._index.to(self._frame[key].device)]
        self[key] = value
        return value


class GraphOps:
    """Mixin for graph-like objects that give ``_endpoints()`` (local src, local dst), their node
    counts and the frames ``_src_frame`` / ``_dst_frame`` / ``_edge_frame``."""

    def _endpoints(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _num_dst(self) -> int:
        raise NotImplementedError

    def _src_frame(self) -> Frame:
        raise NotImplementedError

    def _dst_frame(self) -> Frame:
        raise NotImplementedError

    def _edge_frame(self) -> Frame:
        raise NotImplementedError

    def _set_frames(self, frames: tuple[Frame, ...]) -> None:
        raise NotImplementedError

    def _frames(self) -> tuple[Frame, ...]:
        raise NotImplementedError

    is_block = False

    @contextmanager
    def local_scope(self) -> Iterator[None]:
        """Fields set inside are dropped on exit (the previous frames come back)."""
        saved = self._frames()
        self._set_frames(tuple(f.copy() for f in saved))
        try:
            yield
        finally:
            self._set_frames(saved)

    def local_var(self) -> Any:
        """A shallow copy whose frames are copies: fields set on it do not reach ``self``."""
        out = copy.copy(self)
        out._set_frames(tuple(f.copy() for f in self._frames()))
        return out

    def _side(self, side: str, name: str, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """A field of side ``u``/``v``/``e``, one row per edge."""
        sides = {"u": (self._src_frame(), src), "v": (self._dst_frame(), dst)}
        frame, index = sides.get(side, (self._edge_frame(), None))
        if name not in frame:
            where = {"u": "source", "v": "destination", "e": "edge"}[side]
            raise UnknownTensorError(f"no {where} field {name!r}; fields: {sorted(frame)}")
        value: torch.Tensor = frame[name]
        return value if index is None else value[index.to(value.device)]

    def _message(self, func: Any) -> tuple[str, torch.Tensor]:
        src, dst = self._endpoints()
        if isinstance(func, fn.CopyMessage):
            return func.out, self._side(func.side, func.field, src, dst)
        if isinstance(func, fn.BinaryMessage):
            a = self._side(func.lhs, func.lhs_field, src, dst)
            b = self._side(func.rhs, func.rhs_field, src, dst)
            if func.op == "dot":
                return func.out, (a * b).sum(-1, keepdim=True)
            if func.op == "add":
                return func.out, a + b
            if func.op == "sub":
                return func.out, a - b
            if func.op == "mul":
                return func.out, a * b
            return func.out, a / b
        raise InvalidRequestError(f"not a message function: {func!r}")

    def apply_edges(self, func: Any) -> None:
        """Compute edge fields: ``func`` is a built-in (``fn.u_dot_v(...)``) or a callable
        taking an :class:`EdgeBatch` and returning ``{name: tensor [E, ...]}``."""
        if callable(func) and not isinstance(func, (fn.BinaryMessage, fn.CopyMessage)):
            src, dst = self._endpoints()
            batch = EdgeBatch(
                _Gathered(self._src_frame(), src), _Gathered(self._dst_frame(), dst), self._edge_frame()
            )
            call: MessageFn = func
            out = call(batch)
            if not isinstance(out, dict):
                raise InvalidRequestError("an apply_edges function must return a dict of edge tensors")
            self._edge_frame().update(out)
            return
        name, value = self._message(func)
        self._edge_frame()[name] = value

    def update_all(self, message_func: Any, reduce_func: Any) -> None:
        """Send ``message_func`` along every edge and reduce at the destinations into
        ``dstdata[reduce_func.out]`` (``fn.sum``/``mean``/``max``/``min``; zeros without in-edges)."""
        if not isinstance(reduce_func, fn.Reduce):
            raise InvalidRequestError(f"not a reduce function: {reduce_func!r}")
        name, msg = self._message(message_func)
        if reduce_func.msg != name:
            raise InvalidRequestError(f"reduce reads message {reduce_func.msg!r}, the message is {name!r}")
        _, dst = self._endpoints()
        dst = dst.to(msg.device)
        n = self._num_dst()
        shape = (n, *msg.shape[1:])
        op = reduce_func.op
        if op in ("sum", "mean"):
            out = msg.new_zeros(shape).index_add(0, dst, msg)
            if op == "mean":
                deg = torch.bincount(dst, minlength=n).clamp(min=1).to(msg.dtype)
                out = out / deg.view(-1, *([1] * (msg.dim() - 1)))
        else:
            index = dst.view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
            reduce = "amax" if op == "max" else "amin"
            out = msg.new_zeros(shape).scatter_reduce(0, index, msg, reduce=reduce, include_self=False)
        self._dst_frame()[reduce_func.out] = out


MessageFn = Callable[[EdgeBatch], dict[str, torch.Tensor]]
