"""``DistTensor``: a tensor whose rows are sharded over partitions by node or edge ranges."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array, to_numpy
from asyncgraph.client.sync_client import Client
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, OutOfRangeError
from asyncgraph.names import split_typed, tensor_key
from asyncgraph.storage.store import TensorMeta

from .context import get_client
from .edge_ids import attach_edge_ids

_ANON = itertools.count()

_TORCH_TO_NUMPY: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.float16: "float16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def numpy_dtype(dtype: torch.dtype | np.dtype[Any] | str | type) -> str:
    """Numpy dtype name for a torch or numpy dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_TO_NUMPY:
            raise DTypeMismatchError(f"dtype {dtype} is not supported by DistTensor")
        return _TORCH_TO_NUMPY[dtype]
    return np.dtype(dtype).name


def torch_dtype(name: str) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=name)).dtype


class Initializer(dict[str, Any]):
    """A named, seeded initialiser that servers run themselves (no code crosses the wire)."""


def zeros_init() -> Initializer:
    return Initializer(kind="zeros")


def uniform_init(low: float = -1.0, high: float = 1.0, seed: int = 0) -> Initializer:
    return Initializer(kind="uniform", low=float(low), high=float(high), seed=int(seed))


def normal_init(mean: float = 0.0, std: float = 1.0, seed: int = 0) -> Initializer:
    return Initializer(kind="normal", mean=float(mean), std=float(std), seed=int(seed))


InitFunc = Callable[[tuple[int, ...], torch.dtype], Any]
#: Rows per ``init_func`` call are bounded so that one call returns at most this many bytes.
INIT_CHUNK_BYTES = 64 << 20
_INIT_FORMS = (
    "None, a named initialiser (zeros_init(), uniform_init(...), normal_init(...) or a mapping "
    "like {'kind': 'zeros'}), or a callable init_func(shape, dtype) -> tensor as in DGL"
)


def resolve_init(init: Any, init_func: Any = None) -> tuple[Mapping[str, Any] | None, InitFunc | None]:
    """Split ``init``/``init_func`` into a named spec (run by servers) or a callable (run here)."""
    if init is not None and init_func is not None:
        raise InvalidRequestError("pass either init or init_func, not both")
    spec = init if init is not None else init_func
    if spec is None or isinstance(spec, Mapping):
        return spec, None
    if callable(spec):
        return None, spec
    raise InvalidRequestError(f"init must be {_INIT_FORMS}; got {spec!r}")


def _checked_cast(arr: np.ndarray, want: np.dtype[Any], name: str) -> np.ndarray:
    """``arr.astype(want)`` within a kind, refusing values the cast would wrap or turn into inf."""
    if want.kind in "iu" and arr.size:
        info = np.iinfo(want)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise DTypeMismatchError(
                f"value {bad} cannot be stored in {name!r} ({want}): outside [{info.min}, {info.max}], "
                "it would wrap around"
            )
        return arr.astype(want)
    with np.errstate(over="ignore"):
        out = arr.astype(want)
    if want.kind == "f" and arr.size:
        overflowed = np.isinf(out) & np.isfinite(arr)
        if overflowed.any():
            bad = arr[overflowed].flat[0].item()
            raise DTypeMismatchError(
                f"value {bad!r} cannot be stored in {name!r} ({want}): beyond its largest finite value "
                f"{np.finfo(want).max}, it would become inf"
            )
    return out


class DistTensor:
    """Rows sharded by the partition book; ``t[ids]`` pulls, ``t[ids] = v`` pushes.

    Creating a DistTensor with the same name, shape and dtype in several trainers gives all of
    them the same server tensor; a different shape or dtype under that name is an error.
    ``init`` (or DGL's keyword ``init_func``) is a named initialiser the servers run, or DGL's
    callable ``(shape, dtype) -> tensor``: no code crosses the wire, the client that creates the
    tensor calls it for each partition it created, in chunks of at most ``INIT_CHUNK_BYTES``, and
    pushes the rows (a client that attaches to an existing tensor does not). As in DGL, other
    trainers should pass a barrier before reading rows initialised that way.

    Indexing: a plain integer follows Python (``t[-1]`` is the last row, ``t[-N - 1]`` raises
    ``OutOfRangeError``), as for a list or a torch tensor; an array, list or tensor of IDs holds
    global node/edge IDs, which must lie in ``[0, N)`` (a negative ID is ``OutOfRangeError``,
    as in DGL). Writing: values are cast to the tensor's dtype within a kind (int to int, float
    to float); a cast that would change a value's magnitude is ``DTypeMismatchError`` and writes
    nothing: integers outside the target's range (they would wrap) and finite floats beyond the
    target's largest finite value (they would become inf). Rounding to the nearest representable
    float is the usual float semantics; inf and nan are stored as given.
    """

    def __init__(
        self,
        shape: Sequence[int],
        dtype: torch.dtype | str | np.dtype[Any],
        name: str | None = None,
        init: Mapping[str, Any] | InitFunc | None = None,
        persistent: bool = False,
        part_policy: Any = None,
        *,
        init_func: InitFunc | Mapping[str, Any] | None = None,
        client: Client | None = None,
        attach: bool = False,
    ) -> None:
        self._client = client if client is not None else get_client()
        shape = tuple(int(d) for d in shape)
        book = self._client.book
        self.ntype: str | None = None
        self.etype: tuple[str, str, str] | None = None
        policy: str | None = part_policy if isinstance(part_policy, str | None) else None
        if not isinstance(part_policy, str | None):  # DGL's NodePartitionPolicy / EdgePartitionPolicy
            self.ntype = getattr(part_policy, "ntype", None)
            self.etype = getattr(part_policy, "etype", None)
            policy = str(getattr(part_policy, "kind", part_policy))
        part_policy = policy
        if part_policy is None and book.is_hetero and shape and shape[0] != book.num_nodes:
            typed = [t for t in book.ntypes if book.num_nodes_of(t) == shape[0]]
            etyped = [c for c in book.canonical_etypes if book.num_edges_of(c) == shape[0]]
            if len(typed) == 1:  # DGL picks the one policy of that size: a node type's
                part_policy, self.ntype = "node", typed[0]
            elif not typed and len(etyped) == 1 and shape[0] != book.num_edges:  # or an edge type's
                part_policy, self.etype = "edge", etyped[0]
        if self.etype is not None:
            want = book.num_edges_of(self.etype)
            if part_policy != "edge" or not shape or shape[0] != want:
                raise InvalidRequestError(
                    f"a tensor of edge type {self.etype} has {want} rows and the edge policy, got "
                    f"shape {shape} and policy {part_policy!r}"
                )
            shape = (book.num_edges, *shape[1:])  # stored over every edge; typed IDs mapped
        if self.ntype is not None:
            if part_policy != "node" or not shape or shape[0] != book.num_nodes_of(self.ntype):
                raise InvalidRequestError(
                    f"a tensor of node type {self.ntype!r} has {book.num_nodes_of(self.ntype)} rows "
                    f"and the node policy, got shape {shape} and policy {part_policy!r}"
                )
            shape = (book.num_nodes, *shape[1:])  # stored over every node; typed IDs mapped
        if part_policy is None:
            if shape and shape[0] == book.num_nodes:
                part_policy = "node"
            elif shape and shape[0] == book.num_edges:
                part_policy = "edge"
            else:
                raise InvalidRequestError(
                    f"cannot infer the partition policy of shape {shape}: the first dimension must be "
                    f"num_nodes ({book.num_nodes}) or num_edges ({book.num_edges}); pass part_policy"
                )
        if part_policy not in ("node", "edge"):
            raise InvalidRequestError(f"part_policy must be 'node' or 'edge', got {part_policy!r}")
        spec, func = resolve_init(init, init_func)
        self.name = name if name is not None else f"_anon{next(_ANON)}"
        self.persistent = bool(persistent)
        self.policy: str = part_policy
        self.key = tensor_key(part_policy, self.name)
        if attach:
            self._meta = self._client.tensor_meta(self.key)
        else:
            dt = numpy_dtype(dtype)
            self._meta, created = self._client.create_tensor_parts(
                self.key, part_policy, shape, dt, spec, persistent=self.persistent
            )
            if not self.persistent:  # DGL: freed when the last handle goes
                weakref.finalize(self, self._client.release_later, self.key)
            try:
                for part in created:
                    if func is not None:
                        self._run_init_func(func, part)
            except BaseException:
                self._client.delete_tensor(self.key)  # a failed init_func leaves no half-made tensor
                raise

    def _run_init_func(self, func: InitFunc, part: int) -> None:
        """Fill partition ``part``'s rows with ``func(shape, dtype)``, chunk by chunk."""
        book = self._client.book
        lo, hi = book.node_range(part) if self.policy == "node" else book.edge_range(part)
        row_shape = tuple(self._meta.shape[1:])
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * np.dtype(self._meta.dtype).itemsize)
        step = max(1, INIT_CHUNK_BYTES // row_bytes)
        for start in range(lo, hi, step):
            stop = min(hi, start + step)
            want = (stop - start, *row_shape)
            values = func(want, self.dtype)
            got = tuple(getattr(values, "shape", ()))
            if got != want:
                raise InvalidRequestError(
                    f"init_func of {self.name!r} returned shape {got} for a request of shape {want}"
                )
            self._client.push(self.key, np.arange(start, stop, dtype=np.int64), self._cast(values), "assign")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as a handle (name, policy, node or edge type), re-attached to the unpickling
        process's client: ``torch.save(dist_tensor)`` and passing one to another trainer work."""
        return _reattach, (self.policy, self.name, self.ntype, self.etype)

    @classmethod
    def _attach(cls, client: Client, meta: TensorMeta) -> DistTensor:
        policy, _, name = meta.name.partition(":")
        return cls(meta.shape, meta.dtype, name, part_policy=policy, client=client, attach=True)

    # --- properties -----------------------------------------------------------------------
    @property
    def client(self) -> Client:
        """The client this tensor reads and writes through."""
        return self._client

    @property
    def meta(self) -> TensorMeta:
        """The stored tensor's description (key, policy, global shape, dtype)."""
        return self._meta

    @property
    def shape(self) -> tuple[int, ...]:
        if self.ntype is not None:
            return (self._client.book.num_nodes_of(self.ntype), *self._meta.shape[1:])
        if self.etype is not None:
            return (self._client.book.num_edges_of(self.etype), *self._meta.shape[1:])
        return tuple(self._meta.shape)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self._meta.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        typed = f", ntype={self.ntype!r}" if self.ntype else f", etype={self.etype!r}" if self.etype else ""
        return (
            f"DistTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
            f"policy={self.policy!r}{typed})"
        )

    # --- access ----------------------------------------------------------------------------
    def _ids(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return self.homo_ids(np.arange(start, stop, step, dtype=np.int64))
        if isinstance(index, int | np.integer):
            if not -len(self) <= int(index) < len(self):
                raise OutOfRangeError(
                    f"index {int(index)} out of range for {self.name!r} of length {len(self)}"
                )
            return self.homo_ids(np.array([int(index) % len(self)], dtype=np.int64))
        return self.homo_ids(index)

    def homo_ids(self, ids: Any) -> Any:
        """The stored rows of ``ids``: per-type IDs mapped to homogeneous ones for a tensor of
        one node or edge type (``OutOfRangeError`` outside ``[0, len)``), else ``ids`` as given."""
        if self.ntype is None and self.etype is None:
            return ids
        tid = as_id_array(ids, "ids")
        if tid.size and (int(tid.min()) < 0 or int(tid.max()) >= len(self)):
            bad = int(tid.min()) if int(tid.min()) < 0 else int(tid.max())
            kind = f"{self.ntype} node" if self.ntype is not None else f"{self.etype} edge"
            raise OutOfRangeError(f"{kind} ID {bad} out of range [0, {len(self)}) of {self.name!r}")
        if self.etype is not None:
            if split_typed(self.name) is not None:  # stored per type: rows in type order
                return self._client.book.type_order_positions(tid, self.etype)
            return attach_edge_ids(self._client).map_to_homo_eid(tid, self.etype)
        return self._client.book.map_to_homo_nid(tid, self.ntype)

    def __getitem__(self, index: Any) -> torch.Tensor:
        rows = self._client.pull(self.key, self._ids(index))
        if isinstance(index, int | np.integer):
            return rows[0]
        return rows

    def __setitem__(self, index: Any, values: Any) -> None:
        ids = self._ids(index)
        n = len(ids) if not isinstance(ids, torch.Tensor) else int(ids.numel())
        self._client.push(self.key, ids, self._cast(self._broadcast(values, n)), "assign")

    def push(self, ids: Any, values: Any, op: str = "assign") -> None:
        """Write rows; ``op="add"`` accumulates (duplicate IDs add up) atomically on the owners."""
        self._client.push(self.key, self.homo_ids(ids), self._cast(values), op)

    def _cast(self, values: Any) -> np.ndarray:
        arr = to_numpy(values)
        want = np.dtype(self._meta.dtype)
        if arr.dtype != want:
            if arr.dtype.kind != want.kind and not (arr.dtype.kind in "iu" and want.kind in "iu"):
                raise DTypeMismatchError(
                    f"values of dtype {arr.dtype} cannot be stored in {self.name!r} ({want})"
                )
            arr = _checked_cast(arr, want, self.name)
        return arr

    def _broadcast(self, values: Any, n: int) -> Any:
        arr = values if isinstance(values, torch.Tensor) else np.asarray(values)
        row_shape = tuple(self.shape[1:])
        if tuple(arr.shape) == row_shape or arr.ndim == 0:
            target = (n, *row_shape)
            if isinstance(arr, torch.Tensor):
                return arr.expand(target).contiguous()
            return np.broadcast_to(arr, target).copy()
        return arr

    def count_nonzero(self, chunk_rows: int = 1 << 20) -> int:
        """Non-zero elements of the whole tensor (DGL's ``count_nonzero``): read in chunks of
        ``chunk_rows`` rows, so memory stays bounded whatever the tensor's size."""
        n = len(self)
        step = max(1, int(chunk_rows))
        return sum(
            int(np.count_nonzero(to_numpy(self[start : min(start + step, n)]))) for start in range(0, n, step)
        )

    def delete(self) -> None:
        """Remove the tensor from every server."""
        self._client.delete_tensor(self.key)


def _reattach(policy: str, name: str, ntype: str | None = None, etype: Any = None) -> DistTensor:
    """A handle on the existing tensor ``name`` through this process's client (unpickling)."""
    client = get_client()
    out = DistTensor._attach(client, client.tensor_meta(tensor_key(policy, name)))
    out.ntype = ntype
    out.etype = tuple(etype) if etype is not None else None
    return out
