"""Sampling over one partition's store: global seeds in, global (src, dst, eid) out.

Shared by the server (remote seeds) and the client (seeds of a co-located or standalone
partition, sampled in-process through shared memory), so both give identical results.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

import numpy as np

from asyncgraph.kernels import compiled
from asyncgraph.kernels.sampling import FLOYD_MAX_FANOUT, sample_csc
from asyncgraph.storage.store import PartitionStore

_MASK64 = (1 << 64) - 1
_local = threading.local()


def _splitmix64(x: int) -> int:
    """SplitMix64's output function: a well-mixed 64-bit word from any 64-bit word."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _seed_key(seed: int) -> int:
    """``seed`` (any Python int) folded into one word, a 64-bit word at a time."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ ((seed >> 64) & _MASK64))


def keyed_rng(seed: int | None, part_id: int) -> np.random.Generator:
    """A generator keyed by ``(seed, part_id)``: the same key gives the same stream anywhere.

    ``default_rng([seed, part])`` hashes its key through ``SeedSequence`` (tens of microseconds,
    a sizeable share of a small sampling request), so the PCG64 state and stream are derived
    from the key with SplitMix64 instead and set on a per-thread bit generator. The generator is
    only valid until the next call on the same thread. ``seed=None`` draws from one generator
    per thread and process, seeded from OS entropy once (``default_rng()`` per call spends
    ~0.2 ms gathering entropy); a forked child seeds its own.
    """
    if seed is None:
        pid = os.getpid()
        fresh: tuple[int, np.random.Generator] | None = getattr(_local, "entropy_rng", None)
        if fresh is None or fresh[0] != pid:
            fresh = (pid, np.random.default_rng())
            _local.entropy_rng = fresh
        return fresh[1]
    bit_generator: np.random.PCG64 | None = getattr(_local, "bit_generator", None)
    if bit_generator is None:
        bit_generator = np.random.PCG64(0)
        _local.bit_generator = bit_generator
    bit_generator.state = _keyed_state(seed, part_id)
    return np.random.Generator(bit_generator)


def keyed_words(seed: int, rows: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """The uint64 word of each ``(seed, rows[i], counters[i])``: SplitMix64 over the key folded
    in a word at a time, so a draw keyed by a node's position needs no generator per node."""
    key = np.uint64(_seed_key(seed))
    folded = _splitmix64_array(key ^ rows.astype(np.uint64))
    return _splitmix64_array(folded ^ counters.astype(np.uint64))


def _splitmix64_array(x: np.ndarray) -> np.ndarray:
    """``_splitmix64`` of every word of a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@functools.lru_cache(maxsize=1024)
def _keyed_state(seed: int, part_id: int) -> Any:  # numpy types it as a private TypedDict
    """The PCG64 state keyed by ``(seed, part_id)`` (cached: online inference samples every
    batch with the same seed; the setter copies it, so sharing one dict is safe)."""
    h = _splitmix64(_seed_key(seed) ^ (part_id & _MASK64))
    lo = _splitmix64(h ^ 0x5851F42D4C957F2D)
    inc = (_splitmix64(lo) << 65 | _splitmix64(h ^ lo) << 1 | 1) & ((1 << 128) - 1)
    return {
        "bit_generator": "PCG64",
        "state": {"state": h << 64 | lo, "inc": inc},
        "has_uint32": 0,
        "uinteger": 0,
    }


def sample_partition(
    store: PartitionStore, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
) -> dict[str, np.ndarray]:
    """Sample in-edges of global ``seeds`` owned by ``store``; the RNG is keyed by (seed, part)."""
    local = store.book.nid2localnid(seeds, store.part_id)
    rng = keyed_rng(seed, store.part_id)
    if (
        not replace
        and type(fanout) is int
        and 0 < fanout <= FLOYD_MAX_FANOUT
        and local.size
        and _all_int64(store.indptr, store.indices, store.eids, local)
        and compiled.ready()
    ):
        # the compiled pass gathers src, dst and eids itself: sample_csc's output, fewer passes
        global_seeds = np.asarray(seeds, dtype=np.int64)
        src, dst, eids = compiled.uniform_edges(
            store.indptr, store.indices, store.eids, local, global_seeds, fanout, rng
        )
        return {"src": src, "dst": dst, "eids": eids}
    src, pos, eids = sample_csc(store.indptr, store.indices, store.eids, local, fanout, replace, rng)
    dst = np.asarray(seeds, dtype=np.int64)[pos]
    return {"src": src, "dst": dst, "eids": eids}


def _all_int64(*arrays: np.ndarray) -> bool:
    return all(type(a) is np.ndarray and a.dtype == np.int64 and a.ndim == 1 for a in arrays)
