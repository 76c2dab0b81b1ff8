"""What a stored tensor is: its sharding policy and metadata, shared by the store and its exports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from asyncgraph.errors import InvalidRequestError

__all__ = ["Policy", "TensorMeta", "check_policy"]

Policy = Literal["node", "edge"]


def check_policy(policy: Any) -> Policy:
    """``policy`` itself when it is "node" or "edge", else InvalidRequestError."""
    if policy not in ("node", "edge"):
        raise InvalidRequestError(f"unknown partition policy {policy!r}; expected 'node' or 'edge'")
    return cast(Policy, policy)


@dataclass(frozen=True)
class TensorMeta:
    """A stored tensor's name, sharding policy, GLOBAL shape and numpy dtype name."""

    name: str
    policy: Policy
    shape: tuple[int, ...]  # shape[0] == num_nodes or num_edges of the whole graph
    dtype: str  # numpy dtype name, e.g. "float32"

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    def to_dict(self) -> dict[str, Any]:
        """msgpack-able form."""
        return {"name": self.name, "policy": self.policy, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorMeta:
        return cls(
            name=str(data["name"]),
            policy=check_policy(data["policy"]),
            shape=tuple(int(d) for d in data["shape"]),
            dtype=str(data["dtype"]),
        )
