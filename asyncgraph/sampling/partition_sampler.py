"""Sampling over one partition's store: global seeds in, global (src, dst, eid) out.

Shared by the server (remote seeds) and the client (seeds of a co-located or standalone
partition, sampled in-process through shared memory), so both give identical results.
"""

from __future__ import annotations

import numpy as np

from asyncgraph.sampling.kernel import sample_csc
from asyncgraph.storage.store import PartitionStore


def sample_partition(
    store: PartitionStore, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
) -> dict[str, np.ndarray]:
    """Sample in-edges of global ``seeds`` owned by ``store``; the RNG is keyed by (seed, part)."""
    local = store.book.nid2localnid(seeds, store.part_id)
    rng = np.random.default_rng(None if seed is None else [seed, store.part_id])
    src, pos, eids = sample_csc(store.indptr, store.indices, store.eids, local, fanout, replace, rng)
    dst = np.asarray(seeds, dtype=np.int64)[pos]
    return {"src": src, "dst": dst, "eids": eids}
