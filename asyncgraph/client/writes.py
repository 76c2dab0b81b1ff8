"""The client's writes of tensor rows: pushes and sparse optimizer steps, run on the owners.

Each is validated in full (IDs, dtype, row shape) before any partition is written, so a bad
write changes nothing; then it drops this client's feature cache of the tensor and is split by
owner through the partition book.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.arrays import as_id_array, check_rows
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError
from asyncgraph.kernels.sparse_optim import check_finite_grads, validate_spec
from asyncgraph.protocol.ops import Op

from .catalog import TensorCatalog
from .edge_routing import owner_positions
from .scatter import scatter, take
from .state import ClientState

__all__ = ["TensorWrites"]


class TensorWrites:
    """Pushes and sparse optimizer steps over every partition (a part of ``AsyncClient``)."""

    def __init__(self, state: ClientState, catalog: TensorCatalog) -> None:
        self.state = state
        self.catalog = catalog

    async def push(self, name: str, ids: Any, values: Any, op: str = "assign") -> None:
        """Write rows: ``op="assign"`` replaces, ``"add"`` accumulates (duplicates add up).

        Everything is validated before any partition is written, so a bad push changes nothing.
        """
        if op not in ("assign", "add"):
            raise InvalidRequestError(f"push: op must be 'assign' or 'add', got {op!r}")
        self.state.forget_cache(name)
        meta = await self.catalog.tensor_meta(name)
        gids = as_id_array(ids)
        _, vals = check_rows(f"push to {name!r}", gids, values, dtype=meta.dtype, row_shape=meta.row_shape)
        parts = owner_positions(self.state.book, gids, meta.policy)
        await scatter(
            self.state.partitions,
            parts,
            Op.PUSH,
            lambda p, pos: p.push(name, take(gids, pos), take(vals, pos), op),
        )

    async def sparse_update(self, name: str, ids: Any, grads: Any, spec: Mapping[str, Any]) -> None:
        """One sparse optimizer step on rows ``ids`` of float tensor ``name``, run on the owners.

        ``spec`` is ``{"kind": "adagrad", "lr": ..., "eps": ...}`` or ``{"kind": "adam", "lr": ...,
        "betas": [b1, b2], "eps": ...}`` (see ``asyncgraph.kernels.sparse_optim``); ``grads`` has the
        tensor's dtype and shape ``(len(ids), *row_shape)``; duplicate IDs' gradients are summed.
        Each owner reads, updates and writes its rows and their optimizer state under its write
        lock: one round trip per server, and concurrent trainers never lose an update. A
        co-located partition is updated through its server (an attached store cannot create the
        state tensors). Everything is validated before any partition is touched.
        """
        self.state.forget_cache(name)
        opts = validate_spec(spec)
        meta = await self.catalog.tensor_meta(name)
        if np.dtype(meta.dtype).kind != "f":
            raise DTypeMismatchError(
                f"sparse_update {name!r}: the tensor is {meta.dtype}; optimizers need a floating-point tensor"
            )
        gids = as_id_array(ids)
        what, row_shape = f"sparse_update {name!r}", meta.row_shape
        _, grad = check_rows(what, gids, grads, dtype=meta.dtype, row_shape=row_shape, values_name="grads")
        check_finite_grads(what, gids, grad)  # refused before any partition applies it
        parts = owner_positions(self.state.book, gids, meta.policy)
        await scatter(
            self.state.partitions,
            parts,
            Op.SPARSE_UPDATE,
            lambda p, pos: p.sparse_update(name, take(gids, pos), take(grad, pos), opts),
        )
