"""PyG's and PyTorch's loader keyword arguments, as asyncgraph's PyG loaders take them.

A PyG script passes ``NeighborLoader``/``LinkNeighborLoader``'s arguments, which include
PyTorch ``DataLoader``'s and those of PyG's deprecated distributed loaders. What maps onto the
prefetch engine is honoured: ``num_workers`` (PyTorch: that many processes, each
``prefetch_factor`` batches ahead) becomes the prefetch depth ``num_workers x prefetch_factor``
(batches are prepared concurrently on the client's event loop, by the servers and the
co-located stores, not in worker processes); ``pin_memory`` pins each batch's tensors when CUDA
is available and no ``device`` is given (with ``device='cuda'`` batches already go through
pinned staging). The rest have no counterpart here and are ignored with one log line each;
an argument neither PyG's nor PyTorch's is a ``TypeError``, as Python's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["IGNORED", "LoaderOptions", "loader_options"]

logger = logging.getLogger("asyncgraph.pyg")

#: Accepted and ignored, with why (one log line each when given).
IGNORED: dict[str, str] = {
    "persistent_workers": "there are no worker processes to keep",
    "filter_per_worker": "features are pulled with each batch's sample",
    "timeout": "the client's call_timeout bounds every request",
    "worker_init_fn": "there are no worker processes",
    "multiprocessing_context": "there are no worker processes",
    "generator": "use seed= (batches are keyed by seed, epoch and index)",
    "in_order": "batches are delivered in order",
    "pin_memory_device": "pass device=",
    "current_ctx": "used only to connect from_partition() stores; else asyncgraph.initialize() did",
    "master_addr": "used only to connect from_partition() stores; else initialize()/launch did",
    "master_port": "used only to connect from_partition() stores; else initialize()/launch did",
    "channel": "batches come from the prefetch engine",
    "concurrency": "use prefetch= (batches prepared concurrently)",
    "async_sampling": "sampling is always asynchronous",
    "rpc_worker_names": "there is no RPC group",
    "dist_sampler": "sampling is done by asyncgraph's servers",
    "custom_cls": "batches are Data / HeteroData",
    "transform_sampler_output": "transform the batch instead (transform=)",
    "is_sorted": "edges are sorted by the partitioner",
    "directed": "samples are directional",
    "input_id": "input_id is each seed's position in input_nodes",
    "with_edge": "e_id is always carried",
}


@dataclass
class LoaderOptions:
    """What the engine honours of PyG's and PyTorch's arguments."""

    num_workers: int
    prefetch: int
    pin_memory: bool


def loader_options(
    loader: str,
    prefetch: int,
    num_workers: int,
    pin_memory: bool,
    prefetch_factor: int | None,
    kwargs: dict[str, Any],
) -> LoaderOptions:
    """Check and map PyG's loader arguments (see the module docstring)."""
    unknown = sorted(k for k in kwargs if k not in IGNORED)
    if unknown:
        raise TypeError(f"{loader}() got unexpected keyword argument(s) {unknown}")
    for key in kwargs:
        logger.info("%s: %s=%r is accepted and ignored (%s)", loader, key, kwargs[key], IGNORED[key])
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    if prefetch_factor is not None and (
        isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1
    ):
        raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")
    depth = prefetch
    if num_workers > 0:
        depth = max(prefetch, num_workers * (2 if prefetch_factor is None else prefetch_factor))
        logger.info(
            "%s: num_workers=%d prepares up to %d batches ahead on the event loop (no worker processes)",
            loader,
            num_workers,
            depth,
        )
    elif prefetch_factor is not None:
        logger.info("%s: prefetch_factor is accepted and ignored without num_workers (use prefetch=)", loader)
    return LoaderOptions(num_workers=num_workers, prefetch=depth, pin_memory=bool(pin_memory))
