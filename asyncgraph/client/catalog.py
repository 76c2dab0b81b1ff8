"""The client's tensor catalog: which tensors exist, their metadata, and their life cycle.

``TensorCatalog`` is the part of ``AsyncClient`` that creates, lists, releases and deletes
tensors on every partition and keeps their ``TensorMeta`` (names, shapes, dtypes, policies) in the
client's ``ClientState``, so reads and writes validate without a round trip. Creating, deleting
or releasing a tensor drops this client's feature cache of it (``TensorReads.build_cache``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asyncgraph.errors import PartialTensorError, UnknownTensorError
from asyncgraph.storage.store import TensorMeta

from .scatter import broadcast
from .state import ClientState

__all__ = ["TensorCatalog"]


class TensorCatalog:
    """Tensor metadata and life cycle over every partition (a part of ``AsyncClient``)."""

    def __init__(self, state: ClientState) -> None:
        self.state = state

    @property
    def num_partitions(self) -> int:
        return self.state.num_partitions

    def tensor_names(self) -> list[str]:
        return sorted(self.state.metas)

    def cached_meta(self, name: str) -> TensorMeta | None:
        return self.state.metas.get(name)

    async def tensor_meta(self, name: str) -> TensorMeta:
        meta = self.state.metas.get(name)
        if meta is None:
            await self.refresh_tensors()
            meta = self.state.metas.get(name)
        if meta is None:
            raise UnknownTensorError(f"no tensor named {name!r}; known: {sorted(self.state.metas)}")
        return meta

    async def refresh_tensors(self) -> list[TensorMeta]:
        metas = await self.state.partitions[0].list_tensors()
        self.state.metas.clear()
        self.remember(metas)
        return list(self.state.metas.values())

    def remember(self, metas: Sequence[TensorMeta]) -> None:
        """Record metadata a server sent (its ``info``, a listing)."""
        for meta in metas:
            self.state.metas[meta.name] = meta

    # --- life cycle ---------------------------------------------------------------------------
    async def create_tensor(
        self,
        name: str,
        policy: str,
        shape: Sequence[int],
        dtype: str,
        init: Mapping[str, Any] | None = None,
    ) -> TensorMeta:
        """Create (or get, if identical) a tensor sharded by node or edge ranges on every partition."""
        meta, _ = await self.create_tensor_parts(name, policy, shape, dtype, init)
        return meta

    async def _refuse_partial_tensor(self, name: str) -> None:
        """``PartialTensorError`` if ``name`` exists on some partitions only, never half data.

        Trainers creating the same tensor at once see it partly present for a moment, so a
        partial view is re-checked a few times (~0.7 s in all) before it counts as lost state.
        """
        for attempt in range(4):
            present = await broadcast(self.state.partitions, lambda p: p.list_tensors())
            have = [any(m.name == name for m in metas) for metas in present]
            if all(have) or not any(have):
                return
            if attempt < 3:
                await asyncio.sleep(0.1 * (attempt + 1))
        where = [i for i, h in enumerate(have) if h]
        raise PartialTensorError(
            f"tensor {name!r} exists on partitions {where} only, of {self.num_partitions}: "
            "a server lost it (restarted without its state?); delete it and create it again"
        )

    async def create_tensor_parts(
        self,
        name: str,
        policy: str,
        shape: Sequence[int],
        dtype: str,
        init: Mapping[str, Any] | None = None,
        persistent: bool = True,
    ) -> tuple[TensorMeta, list[int]]:
        """``create_tensor``, also returning the partitions on which this call created the tensor.

        ``persistent=False`` takes a reference as this client's ``holder``; the servers delete the
        tensor when ``release_tensors`` has dropped every holder's references.
        """
        self.state.caches.pop(name, None)
        dims = [int(d) for d in shape]
        dt = np.dtype(dtype).name
        spec = dict(init) if init else None
        if self.num_partitions > 1:
            await self._refuse_partial_tensor(name)
        holder = None if persistent else self.state.holder
        if holder is not None:
            self.state.holding = True  # close() releases them
        out = await broadcast(
            self.state.partitions, lambda p: p.create_tensor(name, policy, dims, dt, spec, holder)
        )
        self.state.metas[name] = out[0][0]
        return out[0][0], [
            p.part_id for p, (_, created) in zip(self.state.partitions, out, strict=True) if created
        ]

    async def delete_tensor(self, name: str) -> None:
        self.state.caches.pop(name, None)
        await broadcast(self.state.partitions, lambda p: p.delete_tensor(name))
        self.state.metas.pop(name, None)

    async def release_tensors(self, names: Sequence[str], every: bool = False) -> list[str]:
        """Drop this client's references to non-persistent tensors (one per name, or all)."""
        listed = list(names)
        if every:
            self.state.holding = False
        out = await broadcast(
            self.state.partitions, lambda p: p.release_tensors(self.state.holder, listed, every)
        )
        deleted = sorted({n for part in out for n in part})
        for name in deleted:
            self.state.metas.pop(name, None)
            self.state.caches.pop(name, None)
        return deleted
