"""Sparse optimizers for ``DistEmbedding``: ``SparseAdagrad`` and ``SparseAdam``, DGL-like.

``step()`` gathers, per embedding, the IDs and gradients of every lookup traced since the last
step, and sends ONE ``sparse_update`` per embedding: the client splits it by owner, and each
owner applies the update to its rows and their optimizer state under its write lock (see
``asyncgraph.kernels.sparse_optim``). That is one round trip per server per step, and trainers sharing
an embedding never race (no pull-modify-push). Duplicate IDs within a step add up, as autograd
does for a dense ``torch.nn.Embedding``.

Optimizer state is stored next to the rows, as tensors named ``<key>#adagrad_state`` or
``<key>#adam_m`` / ``#adam_v`` / ``#adam_step`` (created with zeros when the optimizer is made),
so every trainer of the job shares it, as in DGL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from asyncgraph.errors import InvalidRequestError
from asyncgraph.kernels.sparse_optim import state_tensor_metas, validate_spec

from .embedding import DistEmbedding


class SparseOptimizer:
    """Base class: ``step()`` sends the traced gradients and clears the trace; ``zero_grad()``."""

    kind: str = ""

    def __init__(self, params: Sequence[DistEmbedding], spec: dict[str, Any]) -> None:
        params = list(params)
        if not params:
            raise InvalidRequestError(f"{type(self).__name__}: params is empty")
        for p in params:
            if not isinstance(p, DistEmbedding):
                raise InvalidRequestError(
                    f"{type(self).__name__} optimizes DistEmbedding objects, got {type(p).__name__}"
                )
        keys = [p.key for p in params]
        if len(set(keys)) != len(keys):
            raise InvalidRequestError(f"{type(self).__name__}: an embedding is listed twice in params")
        self._spec = validate_spec({"kind": self.kind, **spec})
        self.params = params
        for p in params:  # state on every partition from the start (idempotent across trainers)
            meta = p.client.tensor_meta(p.key)
            for s in state_tensor_metas(meta, self.kind):
                p.client.create_tensor(s.name, s.policy, list(s.shape), s.dtype, {"kind": "zeros"})

    @property
    def lr(self) -> float:
        return float(self._spec["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        self._spec = validate_spec({**self._spec, "lr": value})

    @property
    def spec(self) -> dict[str, Any]:
        """The update rule sent to the servers (a copy)."""
        return dict(self._spec)

    def step(self) -> None:
        """Apply one update to every row looked up (with autograd on) since the last step."""
        try:
            for emb in self.params:
                ids: list[torch.Tensor] = []
                grads: list[torch.Tensor] = []
                for idx, rows in emb.trace:
                    if rows.grad is None:
                        continue
                    ids.append(idx)
                    grads.append(rows.grad.detach().to("cpu", torch.float32).reshape(rows.shape[0], -1))
                if not ids:
                    continue
                all_ids = torch.cat(ids).numpy()
                all_grads = np.ascontiguousarray(torch.cat(grads).numpy()).reshape(
                    (all_ids.size, *emb.shape[1:])
                )
                emb.client.sparse_update(emb.key, all_ids, all_grads, self._spec)
        finally:
            for emb in self.params:
                emb.reset_trace()

    def zero_grad(self) -> None:
        """Drop the gradients of every traced lookup, as ``torch.optim.Optimizer.zero_grad`` does.

        Call it before the forward pass or between forward and backward: lookups stay traced
        (with no gradient) until the next ``step()``, which sends what backward produced and then
        clears the trace. ``emb.reset_trace()`` forgets the lookups themselves.
        """
        for emb in self.params:
            for _, rows in emb.trace:
                rows.grad = None


class SparseAdagrad(SparseOptimizer):
    """Adagrad on the rows touched in each step: ``state += g**2; w -= lr * g / (sqrt(state) + eps)``."""

    kind = "adagrad"

    def __init__(self, params: Sequence[DistEmbedding], lr: float, eps: float = 1e-10) -> None:
        super().__init__(params, {"lr": lr, "eps": eps})


class SparseAdam(SparseOptimizer):
    """Adam on the rows touched in each step, with a per-row step count for bias correction (as DGL)."""

    kind = "adam"

    def __init__(
        self,
        params: Sequence[DistEmbedding],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})
