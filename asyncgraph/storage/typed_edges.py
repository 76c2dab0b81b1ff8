"""The type order of a heterogeneous partition's edges (tensor ``_TYPE_ORDER``), derived on load.

Per-type edge IDs are range-partitioned (part ``p`` owns type ``t``'s IDs from the sum of
``etype_counts`` over earlier parts), and inside a part the edges of one type, in homogeneous ID
order, have consecutive per-type IDs. So sorting a part's edges stably by type lists every
type's edges in per-type ID order, one type after another: the homogeneous ID at position
``book.type_order_positions(k, t)`` is that of per-type edge ``k``. The store computes it from
``_ETYPE`` when it loads a partition (one int64 per edge), so partitions written before it
existed serve it too and the book stays free of per-edge arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from asyncgraph.names import ETYPE, TYPE_ORDER

__all__ = ["type_order", "with_type_order"]


def type_order(etype: np.ndarray, first_eid: int) -> np.ndarray:
    """Homogeneous edge IDs of a part's edges (``etype``: each edge's type, in ID order from
    ``first_eid``) sorted stably by type (vectorised)."""
    order = np.argsort(np.asarray(etype), kind="stable").astype(np.int64, copy=False)
    order += np.int64(first_eid)
    return order


def with_type_order(edge_feats: Mapping[str, Any], first_eid: int) -> Mapping[str, Any]:
    """``edge_feats`` plus ``_TYPE_ORDER`` when the partition is heterogeneous (has ``_ETYPE``)."""
    if ETYPE not in edge_feats or TYPE_ORDER in edge_feats:
        return edge_feats
    return {**edge_feats, TYPE_ORDER: type_order(edge_feats[ETYPE], first_eid)}
