"""The client behind a PyG store or sampler, valid in whichever process uses it.

PyG's loaders take ``num_workers``: PyTorch's ``DataLoader`` then runs ``collate_fn`` (sampling,
feature reads) in worker processes, forked (Linux default) or spawned (the store and sampler
pickled). A ``Client`` is neither: its event loop runs on a thread of the process that made
it, which a forked child does not have (a call waits forever), and its locks do not pickle.
:class:`ClientLink` holds the client and the recipe it was made from (``ClientState.origin``,
as loader workers use it in ``dataloading/worker_main.py``). Asked for its client in another
process, it opens that process's own, once, shared by every store and sampler made over the
same client: connections to the same servers with the same options (the secret or holder key
included), or standalone partitions mapped rather than loaded again (a forked child uses the
memory it inherited; a spawned one maps the parent's stores through fd exporters started
when the link is pickled, as ``dataloading/workers.py`` does). Pickled state holds the
client's secret: it is for a worker process of this host, never for a file.
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from typing import Any

from asyncgraph.client.sync_client import Client
from asyncgraph.partition.book import RangePartitionBook

__all__ = ["ClientLink", "LinkedStore"]

_KEYS: weakref.WeakKeyDictionary[Client, str] = weakref.WeakKeyDictionary()
_OPENED: dict[str, tuple[int, Client]] = {}  # key -> (pid, a child process's own client)
_EXPORTS: dict[str, tuple[list[Any], list[tuple[str, bytes]]]] = {}  # key -> (exporters, exports)
_LOCK = threading.Lock()


def _key_of(client: Client) -> str:
    with _LOCK:
        key = _KEYS.get(client)
        if key is None:
            key = _KEYS[client] = uuid.uuid4().hex
        return key


def _exports(key: str, client: Client) -> list[tuple[str, bytes]]:
    """fd exporters of a standalone client's stores (started once, kept while the process runs)."""
    from asyncgraph.storage.fdpass import FdExporter

    with _LOCK:
        if key not in _EXPORTS:
            exporters, exports = [], []
            for part in client.partitions:
                store = part.store
                if store is None:
                    raise RuntimeError(f"partition {part.part_id} is not held in this process")
                exporter = FdExporter(store, label=f"pyg.p{part.part_id}")
                client.loop.run(exporter.start())
                exporters.append(exporter)
                exports.append((exporter.address, exporter.token))
            _EXPORTS[key] = (exporters, exports)
        return _EXPORTS[key][1]


def _open(
    origin: dict[str, Any], inherited: Client | None, exports: list[tuple[str, bytes]] | None
) -> Client:
    """This process's client like the one ``origin`` describes (see the module docstring)."""
    kind = origin.get("kind")
    if kind == "servers":
        options = {k: v for k, v in origin.items() if k not in ("kind", "servers")}
        return Client.connect(origin["servers"], **options)
    if kind == "standalone":
        if inherited is not None:  # forked: the stores' memory is this process's too
            from asyncgraph.client.async_client import AsyncClient
            from asyncgraph.client.local import LocalPartition
            from asyncgraph.client.loop_thread import EventLoopThread
            from asyncgraph.service.local import PartitionService

            old = inherited.async_client
            stores = [p.store for p in old.partitions]
            parts = [LocalPartition(PartitionService(s)) for s in stores if s is not None]
            aio = AsyncClient(old.graph_name, old.book, parts)
            aio.catalog.remember(parts[0].service.list_tensors())
            aio.state.origin = dict(origin)
            return Client(aio, EventLoopThread())
        if exports is not None:
            client = Client.attached(origin["part_config"], exports)
            client.async_client.state.origin = dict(origin)
            return client
    raise RuntimeError(f"cannot open a client in this process from {kind!r}")


class ClientLink:
    """A ``Client`` that follows its user into forked and spawned processes (see the module)."""

    def __init__(self, client: Client) -> None:
        self.key = _key_of(client)
        self.origin: dict[str, Any] = dict(client.async_client.state.origin)
        self._exports: list[tuple[str, bytes]] | None = None
        self._inherited: Client | None = client
        self._pid = os.getpid()

    @property
    def client(self) -> Client:
        """This process's client (opened on first use in a process other than the maker's)."""
        pid = os.getpid()
        if pid == self._pid and self._inherited is not None:
            return self._inherited
        opened = _OPENED.get(self.key)
        if opened is not None and opened[0] == pid:
            return opened[1]
        with _LOCK:
            opened = _OPENED.get(self.key)
            if opened is None or opened[0] != pid:
                # a grandchild forked from a child inherits that child's own client
                inherited = opened[1] if opened is not None else self._inherited
                opened = (pid, _open(self.origin, inherited, self._exports))
                _OPENED[self.key] = opened
            return opened[1]

    def __getstate__(self) -> dict[str, Any]:
        exports = self._exports
        if exports is None and self.origin.get("kind") == "standalone":
            exports = _exports(self.key, self.client)
        return {"key": self.key, "origin": self.origin, "exports": exports}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.key = state["key"]
        self.origin = state["origin"]
        self._exports = state["exports"]
        self._inherited = None
        self._pid = -1


class LinkedStore:
    """What PyG's stores over a ``ClientLink`` share: this process's client, its book, a
    ``DistGraph`` over it, and pickling without the graph (the link carries the client)."""

    _link: ClientLink
    _graph: Any

    @property
    def client(self) -> Client:
        """This process's client (a worker process opens its own)."""
        return self._link.client

    @property
    def book(self) -> RangePartitionBook:
        return self.client.book

    @property
    def graph(self) -> Any:
        """The ``DistGraph`` (in a worker process, one over that process's client)."""
        from asyncgraph.dataloading.fetch import client_of

        if self._graph is None or client_of(self._graph) is not self.client:
            from asyncgraph.distributed import DistGraph

            self._graph = DistGraph(self.client.graph_name, client=self.client)
        return self._graph

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_graph"] = None  # a DistGraph holds a client: the link carries it instead
        return state
