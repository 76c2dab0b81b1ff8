"""``DistEmbedding``: a learnable embedding table sharded over partitions, DGL-like.

Rows live on the servers as a float32 ``DistTensor``. ``emb(ids)`` pulls the rows; with autograd
enabled the result is a fresh leaf tensor with ``requires_grad=True`` and ``(ids, tensor)`` is
recorded in the embedding's trace. A sparse optimizer (``SparseAdagrad`` / ``SparseAdam`` in
``asyncgraph.distributed.optim``) then sends each traced row's gradient to the row's owner, which
applies the update in place: the table never travels to the trainer whole, and no dense gradient
is ever built.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import as_id_array, to_numpy
from asyncgraph.client.sync_client import Client
from asyncgraph.errors import InvalidRequestError

from .checkpoint import load_rows, read_meta, read_rows, save_rows, write_meta, write_rows
from .tensor import DistTensor, InitFunc, resolve_init, uniform_init

_ANON = itertools.count()


def default_embedding_init(name: str) -> dict[str, Any]:
    """The default initialiser of ``DistEmbedding(name=...)``: uniform(-1, 1), seeded by the name.

    DGL's own ``DistEmbedding`` default is zeros, but its examples initialise embeddings with
    ``uniform_(-1, 1)``; that is the default here. The seed is ``crc32(name)``, so every
    trainer (and every run) draws the same table, and two embeddings with different names differ.
    """
    return dict(uniform_init(-1.0, 1.0, seed=zlib.crc32(name.encode())))


class DistEmbedding:
    """A ``[num_embeddings, embedding_dim]`` float32 table sharded by the partition policy.

    ``init_func`` is a named initialiser (``asyncgraph.zeros_init()``, ``uniform_init(...)``,
    ``normal_init(...)``), which servers run, or DGL's callable ``(shape, dtype) -> tensor``, which
    the creating client runs chunk by chunk (see ``DistTensor``). The default is
    ``default_embedding_init(name)``, uniform(-1, 1), not DGL's zeros: it is what DGL's examples
    do by hand, and seeded by the name it draws the same table in every trainer and run; pass
    ``zeros_init()`` for DGL's default. Creating a ``DistEmbedding`` with the same name in several
    trainers gives all of them the same rows (the first creation initialises them).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        name: str | None = None,
        init_func: Mapping[str, Any] | InitFunc | None = None,
        part_policy: Any = None,
        *,
        client: Client | None = None,
    ) -> None:
        for what, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or int(value) < 0:
                raise InvalidRequestError(
                    f"DistEmbedding: {what} must be a non-negative integer, got {value!r}"
                )
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.name = name if name is not None else f"_emb{next(_ANON)}"
        resolve_init(init_func)  # a typed error for anything else, before a tensor is made
        init = init_func if init_func is not None else default_embedding_init(self.name)
        self._tensor = DistTensor(
            (self.num_embeddings, self.embedding_dim),
            torch.float32,
            self.name,
            init=init,
            part_policy=part_policy,
            client=client,
        )
        self._trace: list[tuple[torch.Tensor, torch.Tensor]] = []

    # --- properties -----------------------------------------------------------------------
    @property
    def weight(self) -> DistTensor:
        """The rows, as a ``DistTensor`` (``emb.weight[ids]`` reads without tracing)."""
        return self._tensor

    @property
    def key(self) -> str:
        """The stored tensor's name on the servers (``"node:<name>"`` or ``"edge:<name>"``)."""
        return self._tensor.key

    @property
    def client(self) -> Client:
        return self._tensor.client

    @property
    def policy(self) -> str:
        return self._tensor.policy

    @property
    def shape(self) -> tuple[int, ...]:
        return self._tensor.shape

    @property
    def trace(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(ids, rows)`` of every traced lookup since the last ``step()``/``zero_grad()``."""
        return self._trace

    def reset_trace(self) -> None:
        self._trace = []

    def __len__(self) -> int:
        return self.num_embeddings

    def __repr__(self) -> str:
        return (
            f"DistEmbedding(name={self.name!r}, num_embeddings={self.num_embeddings}, "
            f"embedding_dim={self.embedding_dim}, policy={self.policy!r})"
        )

    # --- lookup -----------------------------------------------------------------------------
    def __call__(self, ids: Any, device: torch.device | str | None = None) -> torch.Tensor:
        """Rows ``ids`` (any order, duplicates allowed); traced for the optimizer under autograd."""
        # stored rows (a table of one node type maps its per-type IDs); the optimizer sends these
        idx = torch.from_numpy(np.array(as_id_array(self._tensor.homo_ids(ids)), dtype=np.int64))
        rows = self.client.pull(self.key, idx).detach()
        if device is not None:
            rows = rows.to(device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._trace.append((idx, rows))
        return rows

    # --- checkpoints --------------------------------------------------------------------------
    def state_dict(self, orig_ids: Any = None) -> dict[str, torch.Tensor]:
        """``{"weight": every row}``, pulled in bounded chunks; with ``orig_ids`` (new -> original
        IDs, from ``partition_graph(..., return_mapping=True)``) row ``i`` is original ID ``i``."""
        return {"weight": torch.from_numpy(read_rows(self.client, self._tensor.meta, orig_ids))}

    def load_state_dict(self, state: Mapping[str, Any], orig_ids: Any = None) -> None:
        """Write ``state["weight"]`` (as ``state_dict`` gives it) into the table, in chunks."""
        if "weight" not in state:
            raise InvalidRequestError(f"{self!r}: state has no 'weight' (keys: {sorted(state)})")
        write_rows(self.client, self._tensor.meta, to_numpy(state["weight"]), orig_ids)

    def save(self, path: str | Path, orig_ids: Any = None) -> None:
        """Write every row to ``path/weight.npy`` (+ ``checkpoint.json``), chunk by chunk."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_rows(self.client, self._tensor.meta, path / "weight.npy", orig_ids)
        info = {"kind": "embedding", "name": self.name, "shape": list(self.shape), "policy": self.policy}
        write_meta(path, {**info, "orig_ids": orig_ids is not None})

    def load(self, path: str | Path, orig_ids: Any = None) -> None:
        """Load a ``save``d table; pass ``orig_ids`` exactly when it was saved with them."""
        path = Path(path)
        info = read_meta(path, "embedding", orig_ids is not None)
        if list(info["shape"]) != list(self.shape):
            raise InvalidRequestError(
                f"{path} holds a table of shape {info['shape']}, {self!r} is {self.shape}"
            )
        load_rows(self.client, self._tensor.meta, path / "weight.npy", orig_ids)
