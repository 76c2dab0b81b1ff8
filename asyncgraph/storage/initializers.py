"""Initial values of a new tensor: validated init specs, filled the same however rows are split.

``create_tensor(..., init={"kind": "normal", "std": 0.1, "seed": 7})`` gives every partition
its share of one global tensor: row r is drawn from a generator keyed by (seed, r //
INIT_BLOCK_ROWS), so the values do not depend on the number of partitions.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.errors import DTypeMismatchError, InvalidRequestError

__all__ = ["INIT_BLOCK_ROWS", "InitSpec", "fill_init", "validate_init"]

InitSpec = Mapping[str, Any]

# Seeded init draws row r from a generator seeded with (seed, r // INIT_BLOCK_ROWS), so the
# global tensor is the same however its rows are split over partitions.
INIT_BLOCK_ROWS = 4096
#: Most values drawn at once (float64: 8 MiB), whatever the rows' size.
INIT_CHUNK = 1 << 20

_INIT_PARAMS: dict[str, dict[str, float | int]] = {
    "zeros": {},
    "uniform": {"low": 0.0, "high": 1.0, "seed": 0},
    "normal": {"mean": 0.0, "std": 1.0, "seed": 0},
}


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def validate_init(init: InitSpec | None, dtype: np.dtype[Any]) -> dict[str, Any]:
    """Check an init spec and fill defaults; InvalidRequestError on anything unknown or bad."""
    if init is None:
        return {"kind": "zeros"}
    if not isinstance(init, Mapping):
        raise InvalidRequestError(f"init must be a mapping like {{'kind': 'zeros'}}, got {init!r}")
    kind = init.get("kind")
    if kind not in _INIT_PARAMS:
        raise InvalidRequestError(f"unknown init kind {kind!r}; expected one of {sorted(_INIT_PARAMS)}")
    allowed = _INIT_PARAMS[kind]
    extra = sorted(set(init) - {"kind"} - set(allowed))
    if extra:
        raise InvalidRequestError(
            f"init kind {kind!r} does not take {extra}; it takes {sorted(allowed) or 'no parameters'}"
        )
    spec: dict[str, Any] = {"kind": kind, **allowed, **{k: init[k] for k in allowed if k in init}}
    for key in allowed:
        value = spec[key]
        if key == "seed":
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) < 0:
                raise InvalidRequestError(f"init seed must be a non-negative integer, got {value!r}")
            spec[key] = int(value)
        else:
            if not _is_real(value):
                raise InvalidRequestError(f"init {key} must be a finite number, got {value!r}")
            spec[key] = float(value)
    if kind == "uniform" and spec["low"] > spec["high"]:
        raise InvalidRequestError(
            f"uniform init needs low <= high, got low={spec['low']} high={spec['high']}"
        )
    if kind == "normal" and spec["std"] < 0:
        raise InvalidRequestError(f"normal init needs std >= 0, got std={spec['std']}")
    if kind != "zeros" and dtype.kind not in "fc":
        raise DTypeMismatchError(f"init kind {kind!r} needs a floating-point tensor, not {dtype}")
    return spec


def fill_init(out: np.ndarray, spec: Mapping[str, Any], row_start: int) -> None:
    """Fill ``out`` (global rows ``row_start ..``) per a validated spec, partition-independently.

    Row r comes from ``default_rng([seed, r // INIT_BLOCK_ROWS])``: each block's stream is
    drawn from the block's first row up to the last row needed here and the prefix sliced off,
    so any split of the rows produces the same global tensor.
    """
    kind = spec["kind"]
    if kind == "zeros":  # new rows are already zero; not touching them keeps the memfd sparse
        return
    n = out.shape[0]
    row_size = math.prod(out.shape[1:])
    if n == 0 or row_size == 0:
        return
    flat = out.reshape(n * row_size)
    row_end = row_start + n
    for block in range(row_start // INIT_BLOCK_ROWS, (row_end - 1) // INIT_BLOCK_ROWS + 1):
        b0 = block * INIT_BLOCK_ROWS
        lo, hi = max(b0, row_start), min(b0 + INIT_BLOCK_ROWS, row_end)
        rng = np.random.default_rng([spec["seed"], block])
        # The block's stream, drawn in pieces of at most INIT_CHUNK values (issue 22: a block
        # of big rows drawn at once took 9.7x a float16 tensor's size); the same values as one
        # draw, since each value takes the next ones from the stream.
        skip = (lo - b0) * row_size  # values of rows before ``lo`` (another partition's)
        total = (hi - b0) * row_size
        dest = (lo - row_start) * row_size
        pos = 0
        while pos < total:
            k = min(INIT_CHUNK, total - pos)
            if kind == "uniform":
                vals = rng.uniform(spec["low"], spec["high"], k)
            else:
                vals = rng.normal(spec["mean"], spec["std"], k)
            a = max(skip - pos, 0)
            if a < k:
                start = dest + pos + a - skip
                flat[start : start + k - a] = vals[a:]
            pos += k
