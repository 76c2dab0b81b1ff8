"""``sample_neighbors`` over a DistGraph: each owner samples its seeds, all concurrently."""

from __future__ import annotations

from typing import Any

import torch

from asyncgraph.errors import InvalidRequestError

from .graph import DistGraph


def sample_neighbors(
    g: DistGraph,
    seeds: Any,
    fanout: int,
    replace: bool = False,
    edge_dir: str = "in",
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample up to ``fanout`` in-edges of every seed; returns global ``(src, dst, eid)``.

    Without replacement a seed with in-degree <= fanout keeps all its in-edges, otherwise a
    uniform subset of ``fanout``; with replacement it gets exactly ``fanout`` draws; fanout -1
    keeps every in-edge. The same ``seed`` gives the same sample. Seeds of a co-located (or
    standalone) partition are sampled in-process through shared memory.
    """
    if edge_dir != "in":
        raise InvalidRequestError(
            f"edge_dir={edge_dir!r} is not supported: partitions store in-edges; sample on the reversed graph"
        )
    return g.sample_neighbors(seeds, fanout, replace=replace, seed=seed)
