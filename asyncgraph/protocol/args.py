"""Argument records of the ops, shared by client and server.

Each op with arguments has a small record: ``Record.decode(args)`` checks a request's argument
map (``InvalidRequestError`` / ``DTypeMismatchError`` naming the op and the argument) and
``record.encode()`` builds it. Which record belongs to which op, and what the op may do, is
declared once in :data:`asyncgraph.protocol.ops.OPS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self

import numpy as np

from asyncgraph.errors import DTypeMismatchError, InvalidNameError, InvalidRequestError

__all__ = [
    "MAX_BARRIER_TIMEOUT",
    "MAX_EPOCH",
    "MAX_NAME_BYTES",
    "AddReplicaArgs",
    "ArgsRecord",
    "BarrierArgs",
    "CreateTensorArgs",
    "DegreesArgs",
    "DeleteTensorArgs",
    "FindEdgesArgs",
    "PullArgs",
    "PushArgs",
    "ReleaseTensorsArgs",
    "SampleArgs",
    "SampleEdgesArgs",
    "SnapshotArgs",
    "SparseUpdateArgs",
    "request_id",
]


#: Largest snapshot epoch a server accepts (``SnapshotArgs``); see ``asyncgraph.server.durable``.
MAX_EPOCH = (1 << 48) - 1
#: Longest tensor, holder or barrier name a server accepts, in UTF-8 bytes (issue 32: 1 MiB names
#: took a server 297 MiB past its budget and into a 250 MiB snapshot manifest).
MAX_NAME_BYTES = 256
#: Longest barrier wait a server accepts, in seconds (a week): every wait ends.
MAX_BARRIER_TIMEOUT = 7 * 24 * 3600.0


class ArgsRecord(Protocol):
    """What every argument record offers: checked decoding of a request's map, and encoding."""

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> Self: ...

    def encode(self) -> dict[str, Any]: ...


def request_id(args: Mapping[str, Any], op: str) -> str | None:
    """The optional client request id of a write (a non-empty str), or None."""
    rid = args.get("rid")
    if rid is None:
        return None
    if not isinstance(rid, str) or not rid or len(rid) > 128:
        raise InvalidRequestError(f"{op}: argument 'rid' must be a non-empty str of at most 128 chars")
    return rid


def check_name(value: str, op: str, what: str) -> str:
    """``value`` if it is a name a server keeps: at most ``MAX_NAME_BYTES``, printable."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if not value or size > MAX_NAME_BYTES or not value.isprintable():
        shown = ascii(value[:40]) + ("..." if len(value) > 40 else "")
        raise InvalidNameError(
            f"{op}: {what} {shown} ({size} bytes) must be 1 to {MAX_NAME_BYTES} bytes of printable text"
        )
    return value


def _name(args: Mapping[str, Any], op: str, key: str) -> str:
    return check_name(_get(args, op, key, str), op, key)


def _names(values: list[Any], op: str, key: str) -> list[str]:
    if not all(isinstance(v, str) for v in values):
        raise InvalidRequestError(f"{op}: {key} must be a list of names")
    return [check_name(v, op, key) for v in values]


def _edge_dir(args: Mapping[str, Any], op: str) -> str:
    edge_dir = _get(args, op, "edge_dir", str)
    if edge_dir not in ("in", "out"):
        raise InvalidRequestError(f"{op}: edge_dir must be 'in' or 'out', got {edge_dir!r}")
    return str(edge_dir)


def _get(args: Mapping[str, Any], op: str, key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in args:
        raise InvalidRequestError(f"{op}: missing argument {key!r}")
    value = args[key]
    if kind is int and isinstance(value, bool):
        raise InvalidRequestError(f"{op}: argument {key!r} must be int, got bool")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidRequestError(f"{op}: argument {key!r} must be {names}, got {type(value).__name__}")
    return value


def _ids(args: Mapping[str, Any], op: str, key: str = "ids") -> np.ndarray:
    ids: np.ndarray = _get(args, op, key, np.ndarray)
    if ids.dtype.kind not in "iu" or ids.dtype.itemsize not in (4, 8):
        # 4- or 8-byte IDs only (64 KB of uint16 IDs asked for a 183 MB reply)
        raise DTypeMismatchError(
            f"{op}: {key} must be an integer array of 32 or 64 bits (int32 or int64), got dtype {ids.dtype}"
        )
    if ids.ndim != 1:
        raise DTypeMismatchError(f"{op}: {key} must be one-dimensional, got shape {ids.shape}")
    return ids


@dataclass(frozen=True, slots=True)
class PullArgs:
    name: str
    ids: np.ndarray

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> PullArgs:
        return cls(_name(args, "pull", "name"), _ids(args, "pull"))

    def encode(self) -> dict[str, Any]:
        return {"name": self.name, "ids": self.ids}


@dataclass(frozen=True, slots=True)
class PushArgs:
    name: str
    ids: np.ndarray
    values: np.ndarray
    op: str = "assign"

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> PushArgs:
        return cls(
            _name(args, "push", "name"),
            _ids(args, "push"),
            _get(args, "push", "values", np.ndarray),
            _get(args, "push", "op", str) if "op" in args else "assign",
        )

    def encode(self) -> dict[str, Any]:
        return {"name": self.name, "ids": self.ids, "values": self.values, "op": self.op}


@dataclass(frozen=True, slots=True)
class CreateTensorArgs:
    name: str
    policy: str
    shape: list[int]
    dtype: str
    init: dict[str, Any] | None = None
    #: Non-persistent tensors: the client handle holding a reference (see ``ReleaseTensorsArgs``).
    holder: str | None = None

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> CreateTensorArgs:
        op = "create_tensor"
        name = _name(args, op, "name")
        policy = _get(args, op, "policy", str)
        shape = _get(args, op, "shape", list)
        dtype = _get(args, op, "dtype", str)
        init = args.get("init")
        if init is not None and not isinstance(init, dict):
            raise InvalidRequestError("create_tensor: argument 'init' must be a map or nil")
        if policy not in ("node", "edge"):
            raise InvalidRequestError(f"create_tensor: policy must be 'node' or 'edge', got {policy!r}")
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise InvalidRequestError(f"create_tensor: shape must be a list of ints, got {shape!r}")
        holder = args.get("holder")
        if holder is not None and not isinstance(holder, str):
            raise InvalidRequestError("create_tensor: argument 'holder' must be a string or nil")
        if holder is not None:
            check_name(holder, op, "holder")
        return cls(name, policy, shape, dtype, init, holder)

    def encode(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "policy": self.policy,
            "shape": self.shape,
            "dtype": self.dtype,
            "init": self.init,
        }
        if self.holder is not None:
            out["holder"] = self.holder
        return out


@dataclass(frozen=True, slots=True)
class ReleaseTensorsArgs:
    """Drop references ``holder`` took by creating non-persistent tensors: one per name in
    ``names`` (a name may repeat), or all of them when ``all``. A tensor whose last reference goes
    is deleted with its optimizer state."""

    holder: str
    names: list[str]
    all: bool = False

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> ReleaseTensorsArgs:
        op = "release_tensors"
        names = _names(_get(args, op, "names", list), op, "names")
        every = _get(args, op, "all", bool) if "all" in args else False
        return cls(_name(args, op, "holder"), names, bool(every))

    def encode(self) -> dict[str, Any]:
        return {"holder": self.holder, "names": self.names, "all": self.all}


@dataclass(frozen=True, slots=True)
class DeleteTensorArgs:
    name: str

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> DeleteTensorArgs:
        return cls(_name(args, "delete_tensor", "name"))

    def encode(self) -> dict[str, Any]:
        return {"name": self.name}


@dataclass(frozen=True, slots=True)
class AddReplicaArgs:
    """A replica server of this partition announces where it listens (same host, its pid)."""

    port: int
    pid: int
    #: The partition's fingerprint the replica computed (the primary checks it).
    fingerprint: str = ""

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> AddReplicaArgs:
        port = _get(args, "add_replica", "port", int)
        pid = _get(args, "add_replica", "pid", int)
        if not 0 < port <= 65535 or pid <= 0:
            raise InvalidRequestError(f"add_replica: bad port {port} or pid {pid}")
        fingerprint = _get(args, "add_replica", "fingerprint", str) if "fingerprint" in args else ""
        return cls(port, pid, fingerprint[:128])

    def encode(self) -> dict[str, Any]:
        return {"port": self.port, "pid": self.pid, "fingerprint": self.fingerprint}


@dataclass(frozen=True, slots=True)
class BarrierArgs:
    name: str
    timeout: float
    #: The arriving client handle (barriers count distinct clients); None: its connection.
    holder: str | None = None

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> BarrierArgs:
        name = _name(args, "barrier", "name")
        timeout = float(_get(args, "barrier", "timeout", (int, float)))
        if not 0 < timeout <= MAX_BARRIER_TIMEOUT:  # NaN and infinity too: every wait ends
            raise InvalidRequestError(
                f"barrier: timeout must be in (0, {MAX_BARRIER_TIMEOUT:g}] seconds, got {timeout}"
            )
        holder = _name(args, "barrier", "holder") if args.get("holder") is not None else None
        return cls(name, timeout, holder)

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "timeout": float(self.timeout)}
        if self.holder is not None:
            out["holder"] = self.holder
        return out


@dataclass(frozen=True, slots=True)
class SampleArgs:
    """Sample in-edges of ``seeds``; ``features`` (tensor keys) asks the owner to answer with the
    rows of the sampled nodes it owns (the seeds and the sources in its range) as well, and of
    ``feature_ids`` (more IDs it owns, e.g. sources other owners sampled)."""

    seeds: np.ndarray
    fanout: int
    replace: bool = False
    seed: int | None = None
    features: tuple[str, ...] = ()
    feature_ids: np.ndarray | None = None  # more owned IDs whose rows the answer carries

    @classmethod
    def decode(cls, args: Mapping[str, Any], op: str = "sample") -> SampleArgs:
        """Decode; ``op`` names the op in errors (``sample_edges`` shares these arguments)."""
        seeds = _ids(args, op, "seeds")
        fanout = _get(args, op, "fanout", int)
        replace = bool(_get(args, op, "replace", bool)) if "replace" in args else False
        seed = args.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise InvalidRequestError(f"{op}: seed must be an int or nil")
        features: tuple[str, ...] = ()
        if "features" in args:
            features = tuple(_names(_get(args, op, "features", list), op, "features"))
        feature_ids = _ids(args, op, "feature_ids") if "feature_ids" in args else None
        return cls(seeds, fanout, replace, seed, features, feature_ids)

    def encode(self) -> dict[str, Any]:
        out = {"seeds": self.seeds, "fanout": self.fanout, "replace": self.replace, "seed": self.seed}
        if self.features:
            out["features"] = list(self.features)
            if self.feature_ids is not None:
                out["feature_ids"] = self.feature_ids
        return out


@dataclass(frozen=True, slots=True)
class FindEdgesArgs:
    eids: np.ndarray

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> FindEdgesArgs:
        return cls(_ids(args, "find_edges", "eids"))

    def encode(self) -> dict[str, Any]:
        return {"eids": self.eids}


@dataclass(frozen=True, slots=True)
class SparseUpdateArgs:
    name: str
    ids: np.ndarray
    grads: np.ndarray
    spec: dict[str, Any]

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> SparseUpdateArgs:
        op = "sparse_update"
        return cls(
            _name(args, op, "name"),
            _ids(args, op),
            _get(args, op, "grads", np.ndarray),
            _get(args, op, "spec", dict),
        )

    def encode(self) -> dict[str, Any]:
        return {"name": self.name, "ids": self.ids, "grads": self.grads, "spec": self.spec}


@dataclass(frozen=True, slots=True)
class DegreesArgs:
    """In-degrees of owned ``ids``, or this partition's out-edge counts of ``ids``; None: all."""

    ids: np.ndarray | None
    edge_dir: str

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> DegreesArgs:
        op = "degrees"
        ids = _ids(args, op) if args.get("ids") is not None else None
        return cls(ids, _edge_dir(args, op))

    def encode(self) -> dict[str, Any]:
        return {"ids": self.ids, "edge_dir": self.edge_dir}


@dataclass(frozen=True, slots=True)
class SampleEdgesArgs:
    """Sampling with options: direction, edge weights (an edge tensor's name), excluded edge IDs."""

    seeds: np.ndarray
    fanout: int
    edge_dir: str = "in"
    replace: bool = False
    seed: int | None = None
    prob: str | None = None
    exclude: np.ndarray | None = None
    # Heterogeneous graphs: a fanout per edge type (index = the type's position in the book's
    # canonical_etypes); each seed gets up to that many in-edges of each type.
    etype_fanouts: np.ndarray | None = None
    # With etype_fanouts: a weight tensor per edge type (DGL's per-type ``prob``; nil: uniform).
    etype_probs: list[str | None] | None = None

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> SampleEdgesArgs:
        op = "sample_edges"
        base = SampleArgs.decode(args, op)
        prob = args.get("prob")
        if prob is not None and not isinstance(prob, str):
            raise InvalidRequestError(f"{op}: prob must be an edge tensor name or nil")
        if prob is not None:
            check_name(prob, op, "prob")
        exclude = _ids(args, op, "exclude") if args.get("exclude") is not None else None
        fanouts = _ids(args, op, "etype_fanouts") if args.get("etype_fanouts") is not None else None
        edge_dir = _edge_dir(args, op)
        probs = args.get("etype_probs")
        if probs is not None and (
            not isinstance(probs, list) or not all(p is None or isinstance(p, str) for p in probs)
        ):
            raise InvalidRequestError(f"{op}: etype_probs must be a list of edge tensor names or nil")
        for p in probs or []:
            if p is not None:
                check_name(p, op, "etype_probs")
        if probs is not None and (fanouts is None or len(probs) != fanouts.size or prob is not None):
            raise InvalidRequestError(f"{op}: etype_probs needs etype_fanouts of its length and no prob")
        return cls(base.seeds, base.fanout, edge_dir, base.replace, base.seed, prob, exclude, fanouts, probs)

    def encode(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "fanout": self.fanout,
            "edge_dir": self.edge_dir,
            "replace": self.replace,
            "seed": self.seed,
            "prob": self.prob,
            "exclude": self.exclude,
            "etype_fanouts": self.etype_fanouts,
            "etype_probs": self.etype_probs,
        }


@dataclass(frozen=True, slots=True)
class SnapshotArgs:
    """Write a snapshot of this server's state as ``epoch`` (every server gets the same one)."""

    epoch: int

    @classmethod
    def decode(cls, args: Mapping[str, Any]) -> SnapshotArgs:
        epoch = _get(args, "snapshot", "epoch", int)
        if not 1 <= epoch <= MAX_EPOCH:  # bounded, so epoch + 1 always encodes
            raise InvalidRequestError(f"snapshot: epoch must be in [1, {MAX_EPOCH}], got {epoch}")
        return cls(epoch)

    def encode(self) -> dict[str, Any]:
        return {"epoch": self.epoch}
