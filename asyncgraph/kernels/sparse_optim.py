"""Sparse optimizer updates applied where the rows live: pure numpy over a ``PartitionStore``.

``apply_sparse_update`` is what the server's ``sparse_update`` op (and a standalone client, in
process) runs: it validates the whole request, sums the gradients of duplicate IDs, then, holding
the store's write lock, reads the rows and their optimizer state, updates both and writes them
back. Because the read-modify-write happens on the owner under one lock, concurrent trainers
updating the same tensor never lose an update (no pull-modify-push race).

Optimizer state lives in the same store as ordinary tensors, next to the parameter rows, so it is
sharded exactly like them and can be pulled (e.g. for a checkpoint) like any tensor:

- Adagrad: ``f"{name}#adagrad_state"``: the running sum of squared gradients, same shape.
- Adam: ``f"{name}#adam_m"``, ``f"{name}#adam_v"`` (same shape) and ``f"{name}#adam_step"``
  (int64 ``[num_rows]``: each row's own step count, used for its bias correction, as DGL's
  ``SparseAdam`` does).

State tensors are float32 for float16/float32 parameters and float64 for float64 ones; they are
created with zeros (idempotently) by the first update that needs them. Update rules, per touched
row, with ``g`` the summed gradient of that row in this request:

- Adagrad: ``state += g**2; w -= lr * g / (sqrt(state) + eps)`` (``torch.optim.Adagrad``).
- Adam: ``step += 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g**2;
  w -= lr * (m / (1 - b1**step)) / (sqrt(v / (1 - b2**step)) + eps)``.

Every rejection is a typed ``InvalidRequestError`` raised before anything is created or written;
NaN or infinite gradients, or an update that would overflow to them, are ``NonFiniteError``
(a non-finite row or state would stay non-finite for good).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.arrays import check_rows
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, NonFiniteError, TensorExistsError
from asyncgraph.names import ADAGRAD_STATE_SUFFIX, ADAM_M_SUFFIX, ADAM_STEP_SUFFIX, ADAM_V_SUFFIX
from asyncgraph.storage.protect import check_optimizable
from asyncgraph.storage.store import PartitionStore, TensorMeta

__all__ = [
    "ADAGRAD_STATE_SUFFIX",
    "ADAM_M_SUFFIX",
    "ADAM_STEP_SUFFIX",
    "ADAM_V_SUFFIX",
    "apply_sparse_update",
    "check_finite_grads",
    "state_tensor_metas",
    "validate_spec",
]


_DEFAULTS: dict[str, dict[str, Any]] = {
    "adagrad": {"lr": None, "eps": 1e-10},
    "adam": {"lr": None, "eps": 1e-8, "betas": (0.9, 0.999)},
}


def _real(value: Any, what: str) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(float(value)):
        raise InvalidRequestError(f"sparse_update spec: {what} must be a finite number, got {value!r}")
    return float(value)


def validate_spec(spec: Any) -> dict[str, Any]:
    """Check an optimizer spec and fill defaults; ``InvalidRequestError`` on anything bad.

    ``{"kind": "adagrad", "lr": 0.1, "eps": 1e-10}`` or
    ``{"kind": "adam", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}``; ``lr`` is required,
    ``eps`` and ``betas`` default as shown. The result is msgpack-able (``betas`` a list).
    """
    if not isinstance(spec, Mapping):
        raise InvalidRequestError(
            f"sparse_update spec must be a mapping like {{'kind': 'adam', 'lr': 0.01}}, got {spec!r}"
        )
    kind = spec.get("kind")
    if kind not in _DEFAULTS:
        raise InvalidRequestError(
            f"sparse_update spec: unknown kind {kind!r}; expected one of {sorted(_DEFAULTS)}"
        )
    allowed = _DEFAULTS[kind]
    extra = sorted(str(k) for k in set(spec) - {"kind"} - set(allowed))
    if extra:
        raise InvalidRequestError(
            f"sparse_update spec: kind {kind!r} does not take {extra}; it takes {sorted(allowed)}"
        )
    if "lr" not in spec:
        raise InvalidRequestError(f"sparse_update spec: kind {kind!r} needs a learning rate 'lr'")
    lr = _real(spec["lr"], "lr")
    eps = _real(spec.get("eps", allowed["eps"]), "eps")
    if not lr > 0:
        raise InvalidRequestError(f"sparse_update spec: lr must be > 0, got {lr}")
    if not eps > 0:
        raise InvalidRequestError(f"sparse_update spec: eps must be > 0, got {eps}")
    out: dict[str, Any] = {"kind": kind, "lr": lr, "eps": eps}
    if kind == "adam":
        betas = spec.get("betas", allowed["betas"])
        if isinstance(betas, (str, bytes)) or not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise InvalidRequestError(f"sparse_update spec: betas must be a pair of numbers, got {betas!r}")
        b1, b2 = (_real(b, "betas") for b in betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise InvalidRequestError(f"sparse_update spec: betas must lie in [0, 1), got {[b1, b2]}")
        out["betas"] = [b1, b2]
    return out


def _state_dtype(dtype: str) -> str:
    return "float64" if np.dtype(dtype).itemsize > 4 else "float32"


def state_tensor_metas(meta: TensorMeta, kind: str) -> list[TensorMeta]:
    """The optimizer state tensors ``kind`` keeps for parameter tensor ``meta``."""
    sdt = _state_dtype(meta.dtype)
    if kind == "adagrad":
        return [TensorMeta(meta.name + ADAGRAD_STATE_SUFFIX, meta.policy, meta.shape, sdt)]
    if kind == "adam":
        return [
            TensorMeta(meta.name + ADAM_M_SUFFIX, meta.policy, meta.shape, sdt),
            TensorMeta(meta.name + ADAM_V_SUFFIX, meta.policy, meta.shape, sdt),
            TensorMeta(meta.name + ADAM_STEP_SUFFIX, meta.policy, meta.shape[:1], "int64"),
        ]
    raise InvalidRequestError(f"sparse_update spec: unknown kind {kind!r}")


def _dedup(local: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique local rows (sorted) and the sum of each one's gradients (sort-based, vectorised)."""
    order = np.argsort(local, kind="stable")
    ordered = local[order]
    first = np.empty(ordered.size, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    g = grads[order]
    if starts.size == ordered.size:
        return ordered, g
    if g[0].size == 0:  # zero-sized rows: nothing to sum
        return ordered[starts], g[starts]
    summed: np.ndarray = np.add.reduceat(g, starts, axis=0)
    return ordered[starts], summed


def check_finite_grads(what: str, ids: np.ndarray, grads: np.ndarray) -> None:
    """``NonFiniteError`` naming the first ID whose gradient holds NaN or inf (client and server
    both check, so a multi-partition update is refused before any partition applies it)."""
    finite = np.isfinite(grads)
    if not finite.all():
        bad = int(np.flatnonzero(~finite.reshape(len(grads), -1).all(axis=1))[0])
        raise NonFiniteError(
            f"{what}: gradient of ID {int(np.asarray(ids)[bad])} is not finite (NaN or inf); "
            "nothing was applied"
        )


def _check_finite(name: str, *arrays: np.ndarray) -> None:
    """Refuse an update whose new rows or state overflowed (summed or squared gradients)."""
    for a in arrays:
        if not np.isfinite(a).all():
            raise NonFiniteError(
                f"sparse_update {name!r}: the update overflows to a non-finite value "
                "(gradients too large for the tensor's dtype); nothing was applied"
            )


def apply_sparse_update(
    store: PartitionStore, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]
) -> None:
    """Apply one Adagrad/Adam step to rows ``ids`` (global, owned by ``store``) of tensor ``name``.

    ``grads`` must have the tensor's dtype and shape ``(len(ids), *row_shape)``; gradients of
    duplicate IDs are summed first (as autograd does for a dense embedding). Validation happens
    before anything is created or written; the update itself runs under ``store.lock.write()``.
    """
    opts = validate_spec(spec)
    meta = store.tensor_meta(name)
    check_optimizable(name, store.rules.base)  # embeddings only
    dtype = np.dtype(meta.dtype)
    if dtype.kind != "f":
        raise DTypeMismatchError(
            f"sparse_update {name!r}: the tensor is {meta.dtype}; optimizers need a floating-point tensor"
        )
    local, g = check_rows(
        f"sparse_update {name!r}",
        ids,
        grads,
        dtype=meta.dtype,
        row_shape=meta.row_shape,
        owned=store.node_range if meta.policy == "node" else store.edge_range,
        owner=f"graph {store.graph_name!r} partition {store.part_id}",
        policy=meta.policy,
        values_name="grads",
    )
    check_finite_grads(f"sparse_update {name!r}", ids, g)
    states = state_tensor_metas(meta, opts["kind"])
    for s in states:
        if store.has_tensor(s.name):
            have = store.tensor_meta(s.name)
            if have != s:
                raise TensorExistsError(
                    f"sparse_update {name!r}: state tensor {s.name!r} exists as shape {list(have.shape)} "
                    f"{have.dtype} ({have.policy}); the optimizer needs shape {list(s.shape)} "
                    f"{s.dtype} ({s.policy})"
                )
        elif store.attached:
            raise InvalidRequestError(
                f"sparse_update {name!r}: state tensor {s.name!r} does not exist and an attached store "
                "cannot create it; send the update through the server"
            )
    if local.size == 0:
        return
    cdt = np.dtype(_state_dtype(meta.dtype))
    uniq, gsum = _dedup(local, g.astype(cdt, copy=False))
    for s in states:  # zeros, idempotent: only the first update creates them
        store.create_tensor(s.name, s.policy, s.shape, s.dtype)
    rows = store.local_rows(name)
    lr, eps = opts["lr"], opts["eps"]
    with store.lock.write():
        w = rows[uniq].astype(cdt, copy=False)
        if opts["kind"] == "adagrad":
            acc = store.local_rows(states[0].name)
            st = acc[uniq]
            st += gsum * gsum
            w -= lr * (gsum / (np.sqrt(st) + eps))
            _check_finite(name, w.astype(rows.dtype, copy=False), st)
            acc[uniq] = st
        else:
            b1, b2 = opts["betas"]
            m_rows, v_rows, step_rows = (store.local_rows(s.name) for s in states)
            step = step_rows[uniq] + 1
            m = b1 * m_rows[uniq] + (1.0 - b1) * gsum
            v = b2 * v_rows[uniq] + (1.0 - b2) * (gsum * gsum)
            bshape = (uniq.size,) + (1,) * (gsum.ndim - 1)
            bc1 = (1.0 - np.power(b1, step.astype(np.float64))).astype(cdt).reshape(bshape)
            bc2 = (1.0 - np.power(b2, step.astype(np.float64))).astype(cdt).reshape(bshape)
            w -= lr * (m / bc1) / (np.sqrt(v / bc2) + eps)
            _check_finite(name, w.astype(rows.dtype, copy=False), m, v)
            m_rows[uniq] = m
            v_rows[uniq] = v
            step_rows[uniq] = step
        rows[uniq] = w
