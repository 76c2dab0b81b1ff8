"""The loader's feature caches, shared with its workers through sealed memfds.

A loader built with ``feature_cache_bytes`` holds the rows of remote nodes most likely to be
needed (``fetch.build_feature_cache``). With ``num_workers``, the batches are pulled in the
workers, so the cache must be there too: once per host, not once per worker. ``share_caches``
moves each cache of the loader's client into memfds sealed read-only (the loader's own client
then reads those same pages) and describes them; a worker maps them read-only
(``adopt_caches``) and installs them in its client, whose pulls into a slot then copy a cached
row once, from the cache, and ask the owners only for the misses.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.cache import FeatureCache
from asyncgraph.storage.memfd import SharedArray

__all__ = ["adopt_caches", "cache_fds", "share_caches"]


def _shared_copy(label: str, array: np.ndarray) -> SharedArray:
    shared = SharedArray.create(label, array.shape, array.dtype, final=False)
    if array.size:
        shared.array[...] = array
    shared.seal(read_only=True)
    return shared


def share_caches(client: AsyncClient) -> tuple[list[dict[str, Any]], list[SharedArray]]:
    """Every feature cache of ``client`` moved into read-only memfds: the specs a worker maps
    (``adopt_caches``) and the arrays, to keep open as long as the workers run. The client's
    caches are replaced by views of the shared pages, so the host holds each cached row once."""
    specs: list[dict[str, Any]] = []
    arrays: list[SharedArray] = []
    for name, cache in list(client.state.caches.items()):
        ids = _shared_copy(f"cache.{name}.ids", np.ascontiguousarray(cache.ids, dtype=np.int64))
        rows = _shared_copy(f"cache.{name}.rows", np.ascontiguousarray(cache.rows))
        arrays += [ids, rows]
        client.state.caches[name] = FeatureCache(name, ids.array, rows.array)
        specs.append(
            {
                "name": name,
                "ids_fd": ids.fd,
                "rows_fd": rows.fd,
                "size": int(cache.ids.size),
                "row_shape": tuple(int(d) for d in cache.rows.shape[1:]),
                "dtype": str(cache.rows.dtype),
            }
        )
    return specs, arrays


def cache_fds(specs: list[dict[str, Any]]) -> tuple[int, ...]:
    """The descriptors a worker process must inherit to map ``specs``."""
    return tuple(fd for s in specs for fd in (s["ids_fd"], s["rows_fd"]))


def adopt_caches(client: AsyncClient, specs: list[dict[str, Any]], *, inherited: bool) -> list[SharedArray]:
    """Map the loader's shared caches read-only and install them in ``client`` (a worker's).

    ``inherited``: the descriptors were passed to this process (a worker process) and are
    closed here once mapped; a worker thread maps duplicates of the loader's own. Returns the
    mappings, to keep alive as long as the client reads them."""
    kept: list[SharedArray] = []
    for s in specs:
        size, row_shape = int(s["size"]), tuple(int(d) for d in s["row_shape"])
        ids = SharedArray.from_fd(os.dup(s["ids_fd"]), (size,), np.dtype(np.int64), writable=False)
        rows = SharedArray.from_fd(os.dup(s["rows_fd"]), (size, *row_shape), s["dtype"], writable=False)
        if inherited:
            os.close(s["ids_fd"])
            os.close(s["rows_fd"])
        kept += [ids, rows]
        client.state.caches[str(s["name"])] = FeatureCache(str(s["name"]), ids.array, rows.array)
    return kept
