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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncgraph.arrays import to_numpy
from asyncgraph.errors import InvalidRequestError
from asyncgraph.kernels.sparse_optim import state_tensor_metas, validate_spec
from asyncgraph.storage.store import TensorMeta

from .checkpoint import load_rows, read_meta, read_rows, save_rows, write_meta, write_rows
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

    # --- checkpoints --------------------------------------------------------------------------
    def _states(self, emb: DistEmbedding) -> list[tuple[str, TensorMeta]]:
        """``(short name, meta)`` of ``emb``'s state tensors, e.g. ``("adam_m", ...)``."""
        metas = state_tensor_metas(emb.client.tensor_meta(emb.key), self.kind)
        return [(m.name[len(emb.key) + 1 :], m) for m in metas]

    @staticmethod
    def _orig(orig_ids: Any, emb: DistEmbedding) -> Any:
        return orig_ids.get(emb.name) if isinstance(orig_ids, Mapping) else orig_ids

    def state_dict(self, orig_ids: Any = None) -> dict[str, Any]:
        """``{"kind", "spec", "state": {embedding name: {"adam_m": rows, ...}}}``, every row pulled in
        chunks; ``orig_ids`` (one mapping, or one per embedding name) orders rows by original ID."""
        state = {
            emb.name: {
                short: torch.from_numpy(read_rows(emb.client, meta, self._orig(orig_ids, emb)))
                for short, meta in self._states(emb)
            }
            for emb in self.params
        }
        return {"kind": self.kind, "spec": self.spec, "state": state}

    def load_state_dict(self, state: Mapping[str, Any], orig_ids: Any = None) -> None:
        """Write optimizer state from ``state_dict()`` output (hyperparameters stay as constructed)."""
        if state.get("kind") != self.kind:
            raise InvalidRequestError(
                f"{type(self).__name__}: state is for {state.get('kind')!r}, not {self.kind!r}"
            )
        for emb in self.params:
            rows = state.get("state", {}).get(emb.name)
            if rows is None:
                raise InvalidRequestError(
                    f"{type(self).__name__}: state has no entry for embedding {emb.name!r}"
                )
            for short, meta in self._states(emb):
                write_rows(emb.client, meta, to_numpy(rows[short]), self._orig(orig_ids, emb))

    def save(self, path: str | Path, orig_ids: Any = None) -> None:
        """Write every state row to ``path/<embedding>.<state>.npy`` (+ ``checkpoint.json``)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for emb in self.params:
            for short, meta in self._states(emb):
                save_rows(emb.client, meta, path / f"{emb.name}.{short}.npy", self._orig(orig_ids, emb))
        shapes = {emb.name: list(emb.shape) for emb in self.params}
        info = {"kind": f"sparse_{self.kind}", "spec": self.spec, "embeddings": shapes}
        write_meta(path, {**info, "orig_ids": orig_ids is not None})

    def load(self, path: str | Path, orig_ids: Any = None) -> None:
        """Load ``save``d state into this optimizer's embeddings (matched by name)."""
        path = Path(path)
        info = read_meta(path, f"sparse_{self.kind}", orig_ids is not None)
        for emb in self.params:
            if list(info["embeddings"].get(emb.name, [])) != list(emb.shape):
                raise InvalidRequestError(f"{path} has no state for {emb!r} (it has {info['embeddings']})")
            for short, meta in self._states(emb):
                load_rows(emb.client, meta, path / f"{emb.name}.{short}.npy", self._orig(orig_ids, emb))


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
