"""Per-request work limits of a server, checked before anything is allocated.

A request is a few hundred bytes; what it asks for can be gigabytes (a sample with
``fanout=400000``, a ``(N, 10**9)`` tensor, a pull of every row of a wide tensor). A server
checks each request's size from its arguments alone (rows × row bytes, the exact number of
edges a sample can return, a tensor's local bytes) and refuses one over a limit with
``InvalidRequestError`` naming the limit and the server option that sets it. In-process callers
(standalone, co-located shared memory) own the memory they ask for and run without limits.

Defaults (server options in parentheses):

* ``max_reply_bytes``: the server's ``--max-frame-size`` less ``REPLY_OVERHEAD``, i.e. any
  reply that fits a frame. The client splits larger pulls and pushes into calls that fit.
* ``max_sampled_edges`` (``--max-sampled-edges``): 8 Mi edges per sample request (~200 MB reply).
* ``max_tensor_bytes`` (``--max-tensor-bytes``): one tensor's rows on this server, by default
  the machine's physical memory; a single row must also fit ``max_reply_bytes`` (a row that no
  reply can carry could never be read).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from asyncgraph.errors import InvalidRequestError
from asyncgraph.protocol.framing import DEFAULT_MAX_FRAME_SIZE

__all__ = [
    "DEFAULT_MAX_SAMPLED_EDGES",
    "REPLY_OVERHEAD",
    "WorkLimits",
    "physical_memory",
    "sample_bound",
]

REPLY_OVERHEAD = 64 * 1024
"""Bytes of a frame kept for the envelope (ids, keys, array headers) around the rows it carries."""

DEFAULT_MAX_SAMPLED_EDGES = 1 << 23


def physical_memory() -> int:
    """This machine's physical memory in bytes (1 TiB if the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def sample_bound(indptr: np.ndarray, local_seeds: np.ndarray, fanout: int, replace: bool) -> int:
    """The exact number of edges a sample of ``local_seeds`` returns at most (vectorised)."""
    deg = indptr[local_seeds + 1] - indptr[local_seeds]
    if fanout < 0:
        return int(deg.sum())
    if replace:
        return int(np.count_nonzero(deg)) * fanout
    return int(np.minimum(deg, fanout).sum())


@dataclass(frozen=True)
class WorkLimits:
    """The most one request may ask of a server (see the module docstring for defaults)."""

    max_reply_bytes: int = DEFAULT_MAX_FRAME_SIZE - REPLY_OVERHEAD
    max_sampled_edges: int = DEFAULT_MAX_SAMPLED_EDGES
    max_tensor_bytes: int = 0  # 0: physical memory

    @classmethod
    def for_frame_size(
        cls,
        max_frame_size: int,
        *,
        max_sampled_edges: int = DEFAULT_MAX_SAMPLED_EDGES,
        max_tensor_bytes: int = 0,
    ) -> WorkLimits:
        """Limits of a server whose frames carry at most ``max_frame_size`` bytes."""
        return cls(max(max_frame_size - REPLY_OVERHEAD, 1), max_sampled_edges, max_tensor_bytes)

    @property
    def tensor_bytes(self) -> int:
        return self.max_tensor_bytes or physical_memory()

    def check_rows(self, what: str, num_rows: int, row_bytes: int) -> None:
        """A pull (or push) of ``num_rows`` rows of ``row_bytes`` each must fit one reply."""
        total = num_rows * row_bytes
        if total > self.max_reply_bytes:
            raise InvalidRequestError(
                f"{what}: {num_rows} rows x {row_bytes} bytes = {total} bytes is over this server's "
                f"per-request limit of {self.max_reply_bytes} bytes (set by --max-frame-size); "
                "split the request (AsyncClient does this by itself)"
            )

    def check_sample(self, num_seeds: int, fanout: int, bound: int) -> None:
        """A sample that can return ``bound`` edges must stay within ``max_sampled_edges``."""
        if bound > self.max_sampled_edges:
            raise InvalidRequestError(
                f"sample of {num_seeds} seeds with fanout {fanout} can return {bound} edges, over "
                f"this server's limit of {self.max_sampled_edges} sampled edges per request "
                "(--max-sampled-edges); sample fewer seeds per call or a smaller fanout"
            )

    def check_tensor(self, name: str, local_shape: tuple[int, ...], dtype: np.dtype[np.generic]) -> None:
        """A new tensor's rows here, and each single row, must fit the limits."""
        row_bytes = math.prod(local_shape[1:]) * dtype.itemsize
        if row_bytes > self.max_reply_bytes:
            raise InvalidRequestError(
                f"tensor {name!r}: one row of shape {list(local_shape[1:])} {dtype} is {row_bytes} bytes, "
                f"over this server's per-request limit of {self.max_reply_bytes} bytes (--max-frame-size)"
            )
        total = local_shape[0] * row_bytes
        if total > self.tensor_bytes:
            raise InvalidRequestError(
                f"tensor {name!r}: {local_shape[0]} local rows x {row_bytes} bytes = {total} bytes is over "
                f"this server's limit of {self.tensor_bytes} bytes per tensor (--max-tensor-bytes)"
            )
