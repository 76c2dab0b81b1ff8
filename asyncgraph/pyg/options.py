"""PyG's and PyTorch's loader keyword arguments, as asyncgraph's PyG loaders take them.

A PyG script passes ``NeighborLoader``/``LinkNeighborLoader``'s arguments, which include
PyTorch ``DataLoader``'s and those of PyG's deprecated distributed loaders. What maps onto
asyncgraph's loaders is honoured: ``num_workers=N`` (PyTorch: that many processes, each
``prefetch_factor`` batches ahead) starts N asyncgraph loader worker processes
(``dataloading/workers.py``) that sample, relabel and gather each batch's rows into memory the
training process maps, with up to ``N x prefetch_factor`` batches requested ahead; they are
started with the loader and persist until ``close()`` (or the loader is collected).
``worker_mode="thread"`` runs them on threads of this process, and ``worker_mode="loop"`` keeps
the earlier behaviour: no workers, ``num_workers x prefetch_factor`` batches prepared
concurrently on the client's event loop. ``pin_memory`` pins each batch's tensors when CUDA is
available and no ``device`` is given (with ``device='cuda'`` batches already go through pinned
memory: the workers' slots or the staging pool). The rest have no counterpart here and are
ignored with one log line each; an argument neither PyG's nor PyTorch's is a ``TypeError``, as
Python's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["IGNORED", "WORKER_MODES", "LoaderOptions", "loader_options"]

logger = logging.getLogger("asyncgraph.pyg")

#: Accepted and ignored, with why (one log line each when given).
IGNORED: dict[str, str] = {
    "persistent_workers": "the workers persist for the loader's life (started with it, stopped by close())",
    "filter_per_worker": "features are pulled with each batch's sample, where the batch is built",
    "timeout": "the client's call_timeout bounds every request",
    "worker_init_fn": "asyncgraph's workers run its batch recipes only, no user code",
    "multiprocessing_context": "workers start as fresh interpreters (python -m ...worker_main), never forked",
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


#: ``worker_mode`` values: worker processes, worker threads, or none (the client's event loop).
WORKER_MODES = ("process", "thread", "loop")


@dataclass
class LoaderOptions:
    """What the engine honours of PyG's and PyTorch's arguments."""

    num_workers: int  # as asked (PyTorch's attribute)
    workers: int  # loader workers to start (0: batches built on the event loop)
    worker_mode: str  # "process" or "thread" (the engine's)
    prefetch: int
    pin_memory: bool


def loader_options(
    loader: str,
    prefetch: int,
    num_workers: int,
    pin_memory: bool,
    prefetch_factor: int | None,
    kwargs: dict[str, Any],
    worker_mode: str = "process",
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
    if worker_mode not in WORKER_MODES:
        raise ValueError(f"worker_mode must be one of {WORKER_MODES}, got {worker_mode!r}")
    depth = prefetch
    if num_workers > 0:
        depth = max(prefetch, num_workers * (2 if prefetch_factor is None else prefetch_factor))
        where = {"process": "in worker processes", "thread": "in worker threads"}.get(
            worker_mode, "on the event loop (worker_mode='loop')"
        )
        logger.info(
            "%s: num_workers=%d prepares up to %d batches ahead %s", loader, num_workers, depth, where
        )
    elif prefetch_factor is not None:
        logger.info("%s: prefetch_factor is accepted and ignored without num_workers (use prefetch=)", loader)
    in_workers = num_workers > 0 and worker_mode != "loop"
    return LoaderOptions(
        num_workers=num_workers,
        workers=num_workers if in_workers else 0,
        worker_mode="process" if worker_mode == "loop" else worker_mode,
        prefetch=depth,
        pin_memory=bool(pin_memory),
    )
