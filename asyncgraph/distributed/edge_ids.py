"""Typed edge IDs read where the edges live: the ``EdgeIdMap`` a ``DistGraph`` gives its book.

The book turns per-type edge IDs into positions of each partition's type order by a range
computation; the owners hold ``_TYPE_ORDER`` (derived on load, ``asyncgraph.storage.typed_edges``)
and ``_ETYPE`` / ``_TYPE_EID`` (written by ``partition_graph``), read like any edge tensor: over
shared memory for a co-located partition, in-process standalone, one pull per owner otherwise.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from asyncgraph.arrays import IdArray, as_id_array
from asyncgraph.client.sync_client import Client
from asyncgraph.names import ETYPE, TYPE_EID, TYPE_ORDER, tensor_key
from asyncgraph.partition.book import RangePartitionBook

__all__ = ["ClientEdgeIds", "attach_edge_ids", "homo_eids_async", "per_etype_async"]

_ORDER, _ETYPE, _TEID = (
    tensor_key("edge", TYPE_ORDER),
    tensor_key("edge", ETYPE),
    tensor_key("edge", TYPE_EID),
)


class ClientEdgeIds:
    """``EdgeIdMap`` over a client: pulls ``_TYPE_ORDER`` or ``_ETYPE`` + ``_TYPE_EID``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def homo_eids(self, positions: IdArray) -> IdArray:
        out: IdArray = self._client.pull(_ORDER, positions).numpy().astype(np.int64, copy=False)
        return out

    def per_etype(self, eids: IdArray) -> tuple[IdArray, IdArray]:
        et = self._client.pull(_ETYPE, eids).numpy().astype(np.int64, copy=False)
        te = self._client.pull(_TEID, eids).numpy().astype(np.int64, copy=False)
        return et, te


def attach_edge_ids(client: Client) -> RangePartitionBook:
    """The client's book, with an ``EdgeIdMap`` reading through ``client`` (set once)."""
    book = client.book
    if book.is_hetero and book.edge_id_map is None:
        book.edge_id_map = ClientEdgeIds(client)
    return book


async def homo_eids_async(aio: Any, ids: Any, etype: Any) -> IdArray:
    """``book.map_to_homo_eid`` from code on the client's loop (an ``AsyncClient``)."""
    book: RangePartitionBook = aio.book
    if not book.is_hetero:
        return book.map_to_homo_eid(ids, etype)
    positions = book.type_order_positions(as_id_array(ids, "eids"), etype)
    rows = await aio.pull_numpy(_ORDER, positions)
    out: IdArray = np.asarray(rows, dtype=np.int64)
    return out


async def per_etype_async(aio: Any, eids: IdArray) -> tuple[IdArray, IdArray]:
    """``book.map_to_per_etype`` from code on the client's loop."""
    book: RangePartitionBook = aio.book
    if not book.is_hetero:
        return book.map_to_per_etype(eids)
    et, te = await asyncio.gather(aio.pull_numpy(_ETYPE, eids), aio.pull_numpy(_TEID, eids))
    return np.asarray(et, dtype=np.int64), np.asarray(te, dtype=np.int64)
