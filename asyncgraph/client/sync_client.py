"""A blocking facade over ``AsyncClient``: one event loop on a daemon thread.

Plain scripts and Jupyter cells call ``client.pull(...)`` without touching asyncio; each call is
handed to the background loop (``EventLoopThread.run``) and waited for. The facade is derived
from ``AsyncClient``, not written beside it: every public method is ``blocking(AsyncClient.x)``
(a coroutine method, run on the loop) or ``mirror(AsyncClient.x)`` (a plain one), so each keeps
its one signature, checked by mypy; the few written here (connecting, ``pull``'s no-hop path,
``tensor_meta``'s cached answer, ``close``) are held to ``AsyncClient``'s signatures by
``tests/test_client_facade.py``, which also proves that no public method is missing.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Concatenate

import torch

from asyncgraph.net.connection import Connection
from asyncgraph.net.tls import TlsConfig
from asyncgraph.partition.book import RangePartitionBook
from asyncgraph.protocol import DEFAULT_MAX_FRAME_SIZE
from asyncgraph.service.base import Partition
from asyncgraph.storage.store import TensorMeta

from .async_client import DEFAULT_CALL_TIMEOUT, AsyncClient
from .forward import P, R
from .loop_thread import EventLoopThread

__all__ = ["SYNC_ONLY", "Client", "EventLoopThread", "blocking", "mirror"]

logger = logging.getLogger("asyncgraph.client")

#: Public names on ``Client``'s class that ``AsyncClient`` lacks: the async client behind
#: the facade, and releases queued from finalizers.
SYNC_ONLY = frozenset({"aio", "async_client", "release_later", "flush_releases"})


def blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Client, P], R]:
    """``Client``'s form of coroutine method ``AsyncClient.x``: run on the loop, waited for."""
    if not inspect.iscoroutinefunction(inspect.unwrap(method)):
        raise TypeError(f"blocking({method.__name__}): not a coroutine method; use mirror")

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.loop.run(method(self._aio, *args, **kwargs))

    functools.update_wrapper(call, method)
    return call


def mirror(method: Callable[Concatenate[AsyncClient, P], R]) -> Callable[Concatenate[Client, P], R]:
    """``Client``'s form of plain method ``AsyncClient.x``: called on the caller's thread."""
    if inspect.iscoroutinefunction(inspect.unwrap(method)):
        raise TypeError(f"mirror({method.__name__}): a coroutine method must be wrapped by blocking")

    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(self._aio, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


class Client:
    """Blocking client: the same operations as ``AsyncClient``, with the same signatures."""

    def __init__(self, aio: AsyncClient, loop: EventLoopThread) -> None:
        self._aio = aio
        self.loop = loop
        self._releases: collections.deque[str] = collections.deque()  # appended from any thread

    @classmethod
    def connect(
        cls,
        servers: Sequence[tuple[str, int]],
        *,
        graph_name: str | None = None,
        secret: bytes | None = None,
        connect_timeout: float = 30.0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        use_shared_memory: bool = True,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_inflight: int = 32,
        local_partitions: Sequence[int] | None = None,
        reconnect_window: float | None = None,
        use_replicas: bool = True,
        tls: TlsConfig | None = None,
        holder: str | None = None,
        holder_key: bytes | None = None,
    ) -> Client:
        """``AsyncClient.connect`` on a new loop thread (stopped again if connecting fails)."""
        loop = EventLoopThread()
        try:
            aio = loop.run(
                AsyncClient.connect(
                    servers,
                    graph_name=graph_name,
                    secret=secret,
                    connect_timeout=connect_timeout,
                    call_timeout=call_timeout,
                    use_shared_memory=use_shared_memory,
                    max_frame_size=max_frame_size,
                    max_inflight=max_inflight,
                    local_partitions=local_partitions,
                    reconnect_window=reconnect_window,
                    use_replicas=use_replicas,
                    tls=tls,
                    holder=holder,
                    holder_key=holder_key,
                )
            )
        except BaseException:
            loop.stop()
            raise
        return cls(aio, loop)

    @classmethod
    def standalone(cls, part_config: str | Path) -> Client:
        """Every partition of ``part_config`` held in this process: no server, same API."""
        return cls(AsyncClient.standalone(part_config), EventLoopThread())

    @classmethod
    def attached(cls, part_config: str | Path, exports: Sequence[tuple[str, bytes]]) -> Client:
        """``AsyncClient.attached`` (another process's standalone stores, mapped) on a new loop thread."""
        return cls(AsyncClient.attached(part_config, exports), EventLoopThread())

    @property
    def async_client(self) -> AsyncClient:
        """The ``AsyncClient`` behind this facade, for coroutines run on ``loop`` (the loaders'
        pipelines); anything else has a blocking method here."""
        return self._aio

    @property
    def aio(self) -> AsyncClient:
        """``async_client`` (the older name)."""
        return self._aio

    # --- the shared state -------------------------------------------------------------------
    @property
    def graph_name(self) -> str:
        return self._aio.graph_name

    @property
    def book(self) -> RangePartitionBook:
        return self._aio.book

    @property
    def partitions(self) -> list[Partition]:
        """One ``Partition`` per partition ID, in order."""
        return self._aio.partitions

    @property
    def connections(self) -> list[Connection]:
        """The connections to the servers (empty when standalone)."""
        return self._aio.connections

    @property
    def call_timeout(self) -> float:
        return self._aio.call_timeout

    @property
    def num_clients(self) -> int:
        """Clients the servers expect (their ``--num-clients``)."""
        return self._aio.num_clients

    @property
    def holder(self) -> str:
        """Who holds this client's references to non-persistent tensors on the servers."""
        return self._aio.holder

    @property
    def num_partitions(self) -> int:
        return self._aio.num_partitions

    @property
    def is_standalone(self) -> bool:
        """True when every partition is held in this process (no server)."""
        return self._aio.is_standalone

    local_partitions = mirror(AsyncClient.local_partitions)
    info = blocking(AsyncClient.info)

    # --- tensor catalog ---------------------------------------------------------------------
    tensor_names = mirror(AsyncClient.tensor_names)
    cached_meta = mirror(AsyncClient.cached_meta)
    refresh_tensors = blocking(AsyncClient.refresh_tensors)
    create_tensor = blocking(AsyncClient.create_tensor)
    create_tensor_parts = blocking(AsyncClient.create_tensor_parts)
    delete_tensor = blocking(AsyncClient.delete_tensor)
    release_tensors = blocking(AsyncClient.release_tensors)

    def tensor_meta(self, name: str) -> TensorMeta:
        """``AsyncClient.tensor_meta``, answered on this thread when the metadata is known."""
        meta = self._aio.cached_meta(name)
        return meta if meta is not None else self.loop.run(self._aio.tensor_meta(name))

    def release_later(self, name: str) -> None:
        """Queue the release of one reference to non-persistent tensor ``name``; never blocks.

        Safe from any thread, a garbage-collection finalizer on the loop thread included: the
        name is queued and a flush is scheduled on the loop.
        """
        self._releases.append(name)
        if self.loop.loop.is_closed():
            return
        flush = self._flush_releases()
        try:
            asyncio.run_coroutine_threadsafe(flush, self.loop.loop)
        except RuntimeError:  # the loop is shutting down; close() releases everything anyway
            flush.close()

    async def _flush_releases(self) -> None:
        names: list[str] = []
        while self._releases:
            names.append(self._releases.popleft())
        if not names:
            return
        try:
            await self._aio.release_tensors(names)
        except Exception as exc:  # a finalizer has nobody to raise to
            logger.warning("releasing tensors %s failed: %s", names, exc)

    def flush_releases(self) -> None:
        """Send the queued releases now (they are otherwise sent as soon as the loop runs)."""
        self.loop.run(self._flush_releases())

    # --- reads and writes of rows -------------------------------------------------------------
    def pull(self, name: str, ids: Any) -> torch.Tensor:
        """``AsyncClient.pull``; rows a partition in this process can give without the loop
        (``pull_here``) are read on this thread, with no hop to the loop thread."""
        rows = self._aio.pull_here(name, ids)
        if rows is not None:
            return torch.from_numpy(rows)
        return self.loop.run(self._aio.pull(name, ids))

    pull_numpy = blocking(AsyncClient.pull_numpy)
    pull_here = mirror(AsyncClient.pull_here)
    remote_ids = mirror(AsyncClient.remote_ids)
    build_cache = blocking(AsyncClient.build_cache)
    feature_cache = mirror(AsyncClient.feature_cache)
    drop_cache = mirror(AsyncClient.drop_cache)
    push = blocking(AsyncClient.push)
    sparse_update = blocking(AsyncClient.sparse_update)

    # --- structure ----------------------------------------------------------------------------
    sample_neighbors = blocking(AsyncClient.sample_neighbors)
    sample_with_features = blocking(AsyncClient.sample_with_features)
    sample_edges = blocking(AsyncClient.sample_edges)
    sample_etypes = blocking(AsyncClient.sample_etypes)
    degrees = blocking(AsyncClient.degrees)
    find_edges = blocking(AsyncClient.find_edges)
    live_edges = blocking(AsyncClient.live_edges)
    added_nodes = blocking(AsyncClient.added_nodes)
    add_edges = blocking(AsyncClient.add_edges)
    remove_edges = blocking(AsyncClient.remove_edges)
    add_nodes = blocking(AsyncClient.add_nodes)

    # --- coordination -------------------------------------------------------------------------
    barrier = blocking(AsyncClient.barrier)
    snapshot = blocking(AsyncClient.snapshot)
    compact = blocking(AsyncClient.compact)
    retries = mirror(AsyncClient.retries)
    server_stats = blocking(AsyncClient.server_stats)
    shutdown_servers = blocking(AsyncClient.shutdown_servers)

    def close(self) -> None:
        """Release every non-persistent tensor reference of this client, disconnect, and stop
        the loop thread."""
        try:
            self._releases.clear()
            try:
                self.loop.run(self._aio.release_tensors([], every=True), timeout=10)
            except Exception as exc:  # servers already gone: nothing left to free
                logger.debug("releasing tensors at close failed: %s", exc)
            self.loop.run(self._aio.close(), timeout=10)
        finally:
            self.loop.stop()
