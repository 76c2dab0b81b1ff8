"""Typed records of what a server says about itself: ``info`` and its shared-memory descriptor.

A server builds a :class:`ServerInfo` once per ``info`` request (its partition service fills the
partition's fields, the handlers this start's, a replica its role) and sends ``to_wire()``, a
plain msgpack map with the same keys as before these records existed; a client reads it back with
``ServerInfo.from_wire``, which checks every field's type, so a malformed answer is one
``ProtocolError`` naming the field rather than a ``KeyError`` deep in the client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncgraph.errors import ProtocolError
from asyncgraph.protocol.messages import PROTOCOL_VERSION

__all__ = ["ServerInfo", "SharedMemoryInfo"]


def _field(
    m: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = dataclasses.MISSING
) -> Any:
    if key not in m or m[key] is None:
        if default is dataclasses.MISSING:
            raise ProtocolError(f"server info lacks {key!r}")
        return default
    value = m[key]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise ProtocolError(f"server info field {key!r} has type {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class SharedMemoryInfo:
    """How a co-located process maps a server's memory: its fd channel's address and token.

    ``writes_via_server``: the server logs every write (WAL), so pushes must go to it rather than
    into the shared memory directly."""

    address: str
    token: bytes
    writes_via_server: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"address": self.address, "token": self.token, "writes_via_server": self.writes_via_server}

    @classmethod
    def from_wire(cls, m: Any) -> SharedMemoryInfo | None:
        """The record of an ``info["shm"]`` map, or None when the server shares no memory."""
        if not m:
            return None
        if not isinstance(m, Mapping):
            raise ProtocolError(f"server info field 'shm' has type {type(m).__name__}")
        return cls(
            _field(m, "address", str),
            bytes(_field(m, "token", bytes)),
            bool(_field(m, "writes_via_server", bool, False)),
        )


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """One server's answer to ``info``: the partition it serves, this start, and its role."""

    graph_name: str
    part_id: int
    num_parts: int
    num_nodes: int
    num_edges: int
    #: The partition book in its wire form (``RangePartitionBook.to_dict``).
    book: dict[str, Any]
    #: Every tensor's meta in its wire form (``TensorMeta.to_dict``).
    tensors: list[dict[str, Any]]
    num_clients: int
    pid: int
    #: The host's boot id: equal on both ends means the same host (shared memory possible).
    boot_id: str
    shm: SharedMemoryInfo | None = None
    #: New at every server start: a change tells a client the server restarted.
    instance: str = ""
    #: The state epoch (last snapshot) served; 0 without a state folder.
    epoch: int = 0
    #: The server logs every write (``--wal``).
    durable: bool = False
    #: "primary" or "replica" (a replica maps its primary's memory).
    role: str = "primary"
    #: Ports of the primary's live replica servers on its host.
    replicas: list[int] = field(default_factory=list)
    #: Which sampling kernel runs: "compiled", "loading" or "numpy".
    sampler: str = "numpy"
    #: The largest frame the server accepts; clients split calls to fit.
    max_frame_size: int | None = None
    #: A replica's primary ("host:port") and that primary's instance.
    primary: str | None = None
    primary_instance: str | None = None
    protocol_version: int = PROTOCOL_VERSION
    #: A live graph (issue 35): whether the partition's structure has an overlay, and the
    #: nodes it added (IDs ``num_nodes + part_id + k * num_parts``, ``k`` below this count).
    live: bool = False
    added_nodes: int = 0

    def to_wire(self) -> dict[str, Any]:
        """The msgpack map sent as the ``info`` result."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["shm"] = self.shm.to_wire() if self.shm is not None else None
        return out

    @classmethod
    def from_wire(cls, m: Any) -> ServerInfo:
        """Check and read an ``info`` result (``ProtocolError`` naming a missing or mistyped field)."""
        if not isinstance(m, Mapping):
            raise ProtocolError(f"server info must be a map, got {type(m).__name__}")
        replicas = _field(m, "replicas", list, [])
        if not all(isinstance(p, int) for p in replicas):
            raise ProtocolError("server info field 'replicas' must list ports")
        return cls(
            graph_name=_field(m, "graph_name", str),
            part_id=_field(m, "part_id", int),
            num_parts=_field(m, "num_parts", int),
            num_nodes=_field(m, "num_nodes", int),
            num_edges=_field(m, "num_edges", int),
            book=dict(_field(m, "book", Mapping)),
            tensors=list(_field(m, "tensors", list)),
            num_clients=_field(m, "num_clients", int),
            pid=_field(m, "pid", int),
            boot_id=_field(m, "boot_id", str),
            shm=SharedMemoryInfo.from_wire(m.get("shm")),
            instance=_field(m, "instance", str, ""),
            epoch=_field(m, "epoch", int, 0),
            durable=_field(m, "durable", bool, False),
            role=_field(m, "role", str, "primary"),
            replicas=list(replicas),
            sampler=_field(m, "sampler", str, "numpy"),
            max_frame_size=_field(m, "max_frame_size", int, None),
            primary=_field(m, "primary", str, None),
            primary_instance=_field(m, "primary_instance", str, None),
            protocol_version=_field(m, "protocol_version", int, PROTOCOL_VERSION),
            live=_field(m, "live", bool, False),
            added_nodes=_field(m, "added_nodes", int, 0),
        )
