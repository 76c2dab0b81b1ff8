"""In-memory graph container used as the input of offline partitioning.

A :class:`Graph` is a directed graph with ``num_nodes`` nodes, edges ``src[i] -> dst[i]`` (edge ID
``i``) and named node/edge tensors whose first dimension is ``num_nodes`` / ``num_edges``.
Everything is stored as numpy (torch tensors are converted without copying where possible) so
the partitioner can work on it with vectorised numpy.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from asyncgraph.arrays import to_numpy as as_numpy
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError, ShapeMismatchError
from asyncgraph.names import DEFAULT_ETYPE, DEFAULT_NTYPE, DEFAULT_RELATION

IdArray = npt.NDArray[np.int64]


def to_numpy(value: Any, name: str) -> np.ndarray[Any, Any]:
    """Convert a numpy array, torch tensor or sequence to a numpy array (no copy when possible)."""
    try:
        arr = as_numpy(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{name} cannot be converted to an array: {exc}") from exc
    if arr.dtype == object:
        raise DTypeMismatchError(f"{name} has dtype object; expected a numeric array")
    return arr


def _ids(value: Any, name: str) -> IdArray:
    """Validate and convert an edge endpoint array to 1-D int64."""
    arr = to_numpy(value, name)
    if arr.dtype.kind not in "iu":
        raise DTypeMismatchError(f"{name} must hold integer node IDs, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ShapeMismatchError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise OutOfRangeError(f"{name} holds IDs larger than int64 can represent")
    return arr.astype(np.int64, copy=False)


class Count(int):
    """An int that may also be called: ``g.num_nodes`` and DGL's ``g.num_nodes()`` both work."""

    def __call__(self) -> int:
        return int(self)


class TensorDict(dict[str, np.ndarray[Any, Any]]):
    """``ndata``/``edata``: assigning a torch tensor, list or array stores a checked numpy array."""

    def __init__(self, rows: int, kind: str, what: str) -> None:
        super().__init__()
        self._rows, self._kind, self._what = rows, kind, what

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise InvalidRequestError(
                f"{self._kind} name {name!r} is not valid: it must be a non-empty string usable as a "
                "file name (no '/', no leading '.')"
            )
        arr = to_numpy(value, f"{self._kind}[{name!r}]")
        if arr.ndim == 0 or arr.shape[0] != self._rows:
            raise ShapeMismatchError(
                f"{self._kind}[{name!r}] has shape {arr.shape}; its first dimension must be "
                f"{self._what}={self._rows}"
            )
        super().__setitem__(name, arr)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value


class Graph:
    """A directed graph with node and edge tensors (numpy, int64 IDs).

    ``ndata[name]`` has first dimension ``num_nodes``; ``edata[name]`` has first dimension
    ``num_edges`` (row ``i`` belongs to edge ``src[i] -> dst[i]``). Torch tensors are accepted
    everywhere (also assigned later, ``g.ndata["feat"] = tensor``) and stored as numpy.
    ``num_nodes``/``num_edges`` are ints that can also be called, as DGL's methods.
    """

    def __init__(
        self,
        num_nodes: int,
        src: Any,
        dst: Any,
        ndata: Mapping[str, Any] | None = None,
        edata: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)):
            raise InvalidRequestError(f"num_nodes must be an int, got {type(num_nodes).__name__}")
        if num_nodes < 0:
            raise InvalidRequestError(f"num_nodes must be >= 0, got {num_nodes}")
        self._num_nodes = int(num_nodes)
        self._src = _ids(src, "src")
        self._dst = _ids(dst, "dst")
        if self._src.shape != self._dst.shape:
            raise ShapeMismatchError(
                f"src and dst must have the same length, got {self._src.size} and {self._dst.size}"
            )
        for name, arr in (("src", self._src), ("dst", self._dst)):
            if arr.size:
                lo, hi = int(arr.min()), int(arr.max())
                if lo < 0 or hi >= self._num_nodes:
                    bad = lo if lo < 0 else hi
                    raise OutOfRangeError(
                        f"{name} holds node ID {bad}, outside [0, {self._num_nodes}) (num_nodes)"
                    )
        self._ndata = self._tensors(ndata, self._num_nodes, "ndata", "num_nodes")
        self._edata = self._tensors(edata, self.num_edges, "edata", "num_edges")

    @staticmethod
    def _tensors(data: Mapping[str, Any] | None, rows: int, kind: str, what: str) -> TensorDict:
        """Convert a mapping of tensors to numpy, checking names and first dimensions."""
        out = TensorDict(rows, kind, what)
        for name, value in (data or {}).items():
            out[name] = value
        return out

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_npz(cls, path: str | Path) -> Graph:
        """Load the bundled npz layout: ``src``/``dst`` edges, other arrays as node/edge tensors.

        The node count is the first dimension of the node arrays (or ``num_nodes`` if stored,
        or ``max ID + 1`` when there are none). An array whose first dimension is the node count
        goes to ``ndata``; otherwise one whose first dimension is the edge count goes to ``edata``.
        """
        path = Path(path)
        if not path.is_file():
            raise InvalidRequestError(f"graph file {path} does not exist")
        try:
            data = np.load(path, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("it holds a single array, not an npz archive")
            with data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as exc:
            reason = "it is empty" if path.stat().st_size == 0 else str(exc) or type(exc).__name__
            raise InvalidRequestError(
                f"graph file {path} is not a readable .npz archive ({reason}); truncated or not an npz?"
            ) from None
        for key in ("src", "dst"):
            if key not in arrays:
                raise InvalidRequestError(f"{path}: missing array {key!r} (have {sorted(arrays)})")
        src = arrays.pop("src")
        dst = arrays.pop("dst")
        num_edges = int(src.shape[0]) if src.ndim else 0
        stored_n = arrays.pop("num_nodes", None)
        if stored_n is not None:
            num_nodes = int(stored_n)
        else:
            firsts = [int(a.shape[0]) for a in arrays.values() if a.ndim and a.shape[0] != num_edges]
            if firsts:
                num_nodes = firsts[0]
            elif arrays:  # every array has num_edges rows: ambiguous only if N == E
                num_nodes = int(next(iter(arrays.values())).shape[0])
            else:
                num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
        ndata: dict[str, Any] = {}
        edata: dict[str, Any] = {}
        for key, arr in arrays.items():
            if arr.ndim and arr.shape[0] == num_nodes:
                ndata[key] = arr
            elif arr.ndim and arr.shape[0] == num_edges:
                edata[key] = arr
            else:
                raise ShapeMismatchError(
                    f"{path}: array {key!r} has shape {arr.shape}; its first dimension is neither "
                    f"num_nodes={num_nodes} nor num_edges={num_edges}"
                )
        return cls(num_nodes, src, dst, ndata, edata)

    # --- properties ---------------------------------------------------------------------------
    @property
    def num_nodes(self) -> Count:
        """Number of nodes; node IDs are ``0 .. num_nodes-1`` (also callable: ``num_nodes()``)."""
        return Count(self._num_nodes)

    @property
    def num_edges(self) -> Count:
        """Number of (directed) edges; edge IDs are ``0 .. num_edges-1`` (also callable)."""
        return Count(self._src.size)

    def number_of_nodes(self) -> int:
        return self._num_nodes

    # A homogeneous graph is a heterogeneous one with a single node and edge type (DGL's names).
    @property
    def ntypes(self) -> list[str]:
        return [DEFAULT_NTYPE]

    @property
    def etypes(self) -> list[str]:
        return [DEFAULT_RELATION]

    @property
    def canonical_etypes(self) -> list[tuple[str, str, str]]:
        return [DEFAULT_ETYPE]

    def number_of_edges(self) -> int:
        return int(self._src.size)

    @property
    def src(self) -> IdArray:
        """Source node of each edge (int64)."""
        return self._src

    @property
    def dst(self) -> IdArray:
        """Destination node of each edge (int64)."""
        return self._dst

    @property
    def ndata(self) -> TensorDict:
        """Node tensors by name (first dimension ``num_nodes``)."""
        return self._ndata

    @property
    def edata(self) -> TensorDict:
        """Edge tensors by name (first dimension ``num_edges``)."""
        return self._edata

    def edges(self) -> tuple[IdArray, IdArray]:
        """``(src, dst)`` of every edge, in edge-ID order."""
        return self._src, self._dst

    def in_degrees(self) -> IdArray:
        """In-degree of every node (int64)."""
        return np.bincount(self._dst, minlength=self._num_nodes).astype(np.int64, copy=False)

    def out_degrees(self) -> IdArray:
        """Out-degree of every node (int64)."""
        return np.bincount(self._src, minlength=self._num_nodes).astype(np.int64, copy=False)

    def __repr__(self) -> str:
        return (
            f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
            f"ndata={sorted(self._ndata)}, edata={sorted(self._edata)})"
        )


def graph(
    data: tuple[Any, Any],
    num_nodes: int | None = None,
    *,
    ndata: Mapping[str, Any] | None = None,
    edata: Mapping[str, Any] | None = None,
    idtype: Any = None,
    device: Any = None,
) -> Graph:
    """``dgl.graph((src, dst), num_nodes=N)``: a ``Graph`` (``num_nodes`` defaults to max ID + 1).

    ``idtype``/``device`` are accepted for DGL call sites; IDs are int64 on the CPU.
    """
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise InvalidRequestError("graph() takes the edges as a pair (src, dst)")
    src, dst = _ids(data[0], "src"), _ids(data[1], "dst")
    if num_nodes is None:
        num_nodes = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1
    return Graph(num_nodes, src, dst, ndata, edata)
