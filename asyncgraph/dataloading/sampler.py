"""Multi-layer neighbour sampling into blocks (DGL's ``NeighborSampler``), transport-agnostic.

The sampler only decides *what* to sample; ``sample_fn`` (supplied by the client/dataloader)
fetches the in-edges of a set of global seeds, typically by fanning out to the partition servers
that own them. Layers are sampled from the output seeds inwards, so ``fanouts[-1]`` is used
first, and each block's source nodes become the next layer's seeds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from asyncgraph.dataloading.block import Block, to_block
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError
from asyncgraph.partition.book import as_id_array

__all__ = ["LAYERS_PER_BATCH_SEED", "NeighborSampler", "SampleFn", "layer_seed"]

# (seeds_global int64, fanout) -> (src_global, dst_global, eids_global)
SampleFn = Callable[[np.ndarray, int], Awaitable[tuple[np.ndarray, np.ndarray, np.ndarray]]]


LAYERS_PER_BATCH_SEED = 8
"""Seeds of consecutive batches are this far apart, so each of up to 8 layers gets its own."""


def layer_seed(batch_seed: int, layer: int) -> int:
    """The sampling seed of ``layer`` of the batch seeded ``batch_seed`` (one rule for every loader:
    the homogeneous and the typed sample-and-pull paths, and the cache warm-up)."""
    return batch_seed * LAYERS_PER_BATCH_SEED + layer


class NeighborSampler:
    """Samples ``len(fanouts)`` layers of in-neighbours; ``fanouts[0]`` is the input layer's.

    ``replace`` records whether sampling is with replacement; ``sample_fn`` receives only
    ``(seeds, fanout)``, so whoever builds the ``sample_fn`` passes ``sampler.replace`` on to the
    servers.
    """

    def __init__(self, fanouts: Sequence[Any], replace: bool = False, prob: str | None = None) -> None:
        fanout_list = list(fanouts)
        if not fanout_list:
            raise InvalidRequestError("fanouts must name at least one layer")
        # Heterogeneous graphs: a layer's fanout may be a dict {edge type: fanout} (checked against
        # the graph's edge types when sampling); ``etype_fanouts`` keeps them as given.
        self.etype_fanouts: list[Any] = list(fanout_list)
        if any(isinstance(f, Mapping) for f in fanout_list):
            for f in fanout_list:
                for v in f.values() if isinstance(f, Mapping) else [f]:
                    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < -1:
                        raise InvalidRequestError(f"fanouts must be integers >= -1, got {v!r}")
            fanout_list = [-1 if isinstance(f, Mapping) else f for f in fanout_list]
        for f in fanout_list:
            if isinstance(f, bool) or not isinstance(f, (int, np.integer)):
                raise DTypeMismatchError(f"fanouts must be integers, got {f!r}")
            if int(f) < -1:
                raise InvalidRequestError(f"fanout must be -1 (all in-edges) or >= 0, got {f}")
        self.fanouts: list[int] = [int(f) for f in fanout_list]
        self.replace: bool = bool(replace)
        if prob is not None and not isinstance(prob, str):
            raise DTypeMismatchError(f"prob must name an edge tensor (str), got {prob!r}")
        #: DGL's ``prob``: an edge tensor's name; edges are drawn with probability proportional
        #: to it, never when it is 0 (DGL's ``mask`` is a 0/1 ``prob``). Sampled by the owners.
        self.prob: str | None = prob

    async def sample_blocks(
        self, sample_fn: SampleFn, seeds: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, list[Block]]:
        """Returns (input_nodes, output_nodes(seeds), blocks) with blocks outermost layer first.

        ``blocks[0]`` consumes ``input_nodes`` and ``blocks[-1]`` produces ``seeds``; for every
        ``i``, ``blocks[i].dstnodes == blocks[i + 1].srcnodes``. Seeds must be unique.
        """
        output_nodes = as_id_array(seeds, "seeds")
        current = output_nodes
        blocks: list[Block] = []
        for fanout in reversed(self.fanouts):
            src, dst, eids = await sample_fn(current, fanout)
            block = to_block(src, dst, current, eids)
            blocks.append(block)
            current = block.srcnodes.cpu().numpy()
        blocks.reverse()
        return current, output_nodes, blocks

    def __repr__(self) -> str:
        extra = f", prob={self.prob!r}" if self.prob is not None else ""
        return f"NeighborSampler(fanouts={self.fanouts}, replace={self.replace}{extra})"
