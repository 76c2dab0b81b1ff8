"""Split masked node/edge IDs among trainers, preferring each trainer's own partition (DGL-style).

Trainers map to partitions as in DGL: with ``world_size`` trainers and ``num_parts``
partitions, trainer ``r`` belongs to partition ``r * num_parts // world_size``, so consecutive
ranks form one contiguous group per partition. A partition no trainer belongs to (only when
``world_size < num_parts``) is served by trainer ``p * world_size // num_parts``.

Every rank computes the same global assignment from the same inputs, without communication or
randomness, so the shares are disjoint and together cover the mask:

* ``force_even=True``: trainer ``r`` gets exactly ``N // world_size`` IDs, plus one for
  ``r < N % world_size``. Each partition's selected IDs are first split evenly among the
  partition's trainers, up to their quotas (an even split never exceeds a quota); the IDs left
  over in over-full partitions (in ascending order) then fill the under-full trainers in rank
  order. This keeps the largest possible share of IDs local.
* ``force_even=False``: each trainer gets the selected IDs of its partition, split evenly (in
  ascending order) among the partition's trainers; sizes follow the mask.

The mask may be a ``DistTensor`` (e.g. ``g.ndata["train_mask"]``): it is pulled by owner range
in bounded chunks (with ``force_even=False`` only the ranges this trainer can get), and its
client's partition book is used when none is given. Without a book, a plain mask uses the book
of the graph this process is initialised for when the sizes match, else one partition.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from asyncgraph.arrays import to_numpy
from asyncgraph.errors import DTypeMismatchError, InvalidRequestError, ShapeMismatchError
from asyncgraph.partition.book import RangePartitionBook

from .context import current_client, rank_world
from .tensor import DistTensor

__all__ = ["edge_split", "node_split", "split_masks"]

IdArray = npt.NDArray[np.int64]

log = logging.getLogger("asyncgraph")


_PULL_CHUNK = 1 << 24  # mask rows per pull


def _pull_mask(mask: DistTensor, bounds: IdArray, parts: IdArray | None) -> np.ndarray:
    """The rows of a DistTensor mask over the ranges of ``parts`` (all when None), zeros elsewhere."""
    if len(mask.shape) != 1:
        raise ShapeMismatchError(f"mask must be one-dimensional, got shape {mask.shape}")
    out = np.zeros(len(mask), dtype=np.dtype(mask.meta.dtype))
    wanted = range(bounds.size - 1) if parts is None else parts.tolist()
    for p in wanted:
        for lo in range(int(bounds[p]), int(bounds[p + 1]), _PULL_CHUNK):
            hi = min(int(bounds[p + 1]), lo + _PULL_CHUNK)
            out[lo:hi] = mask.client.pull(mask.key, np.arange(lo, hi, dtype=np.int64)).numpy()
    return out


def _current_book(size: int, kind: str) -> RangePartitionBook | None:
    """The book of the graph this process is initialised for, if its ``kind`` count is ``size``."""
    client = current_client()
    if client is None:
        return None
    book = client.book
    return book if (book.num_nodes if kind == "node" else book.num_edges) == size else None


def _mask_array(mask: Any) -> npt.NDArray[np.bool_]:
    """A 1-D numpy bool mask from a bool (or 0/1 integer) numpy array, tensor or list."""
    arr = to_numpy(mask)
    if arr.ndim != 1:
        raise ShapeMismatchError(f"mask must be one-dimensional, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        return arr.astype(np.bool_, copy=False)
    if arr.dtype.kind in "iu":
        return np.asarray(arr != 0, dtype=np.bool_)
    raise DTypeMismatchError(f"mask must be boolean (or 0/1 integers), got dtype {arr.dtype}")


def _trainer_parts(rank: int, world: int, num_parts: int) -> IdArray:
    """Partitions whose IDs trainer ``rank`` may get with ``force_even=False``."""
    parts = np.arange(num_parts, dtype=np.int64)
    trainer_part = np.arange(world, dtype=np.int64) * num_parts // world
    orphan = ~np.isin(parts, trainer_part)
    mine: IdArray = parts[(parts == trainer_part[rank]) | (orphan & (parts * world // num_parts == rank))]
    return mine


def _even_cuts(total: IdArray, k: IdArray, j: IdArray) -> tuple[IdArray, IdArray]:
    """Bounds ``[lo, hi)`` of part ``j`` when ``total`` items are split into ``k`` even parts."""
    base, extra = total // k, total % k
    lo = j * base + np.minimum(j, extra)
    return lo, lo + base + (j < extra)


def _trainer_order(ids: IdArray, bounds: IdArray, trainer_ids: Any) -> IdArray:
    """``ids`` (sorted) reordered by (partition, trainer ID, ID): each partition stays one slice."""
    if isinstance(trainer_ids, DistTensor):
        full = _pull_mask(trainer_ids, trainer_ids.client.book.bounds(trainer_ids.policy), None)
    else:
        full = to_numpy(trainer_ids)
    if full.ndim != 1 or full.size != int(bounds[-1]):
        raise ShapeMismatchError(
            f"trainer IDs must be one per ID ({int(bounds[-1])}), got shape {tuple(full.shape)}"
        )
    if full.dtype.kind not in "iu":
        raise DTypeMismatchError(f"trainer IDs must be integers, got dtype {full.dtype}")
    part = np.searchsorted(bounds, ids, side="right") - 1
    order = np.lexsort((ids, full[ids], part))
    out: IdArray = ids[order]
    return out


def _split(
    mask: Any,
    book: RangePartitionBook | None,
    rank: int | None,
    world_size: int | None,
    force_even: bool,
    kind: str,
    type_bounds: IdArray | None = None,
    trainer_ids: Any = None,
) -> torch.Tensor:
    """Shared implementation of ``node_split``/``edge_split`` (``type_bounds``: per-type ranges)."""
    rank, world = rank_world(rank, world_size)
    if isinstance(mask, DistTensor):
        if mask.policy != kind:
            raise InvalidRequestError(
                f"{kind}_split needs a {kind} mask; {mask!r} is sharded by {mask.policy}s"
            )
        book = book if book is not None else mask.client.book
        mb = book.bounds(kind)
        if int(mb[-1]) != len(mask):
            raise ShapeMismatchError(f"{kind} mask has {len(mask)} entries but the book has {int(mb[-1])}")
        n_parts = mb.size - 1
        mine = None if force_even else _trainer_parts(rank, world, n_parts)
        mask = _pull_mask(mask, mb, mine)
    sel = _mask_array(mask)
    if book is None and type_bounds is None:
        book = _current_book(sel.size, kind)
    bounds = type_bounds if type_bounds is not None else None if book is None else book.bounds(kind)
    if bounds is None:
        bounds = np.array([0, sel.size], dtype=np.int64)
    elif int(bounds[-1]) != sel.size:
        raise ShapeMismatchError(
            f"{kind} mask has {sel.size} entries but the partition book has {int(bounds[-1])} {kind}s"
        )
    ids = np.flatnonzero(sel).astype(np.int64)
    if trainer_ids is not None:
        ids = _trainer_order(ids, bounds, trainer_ids)
    num_parts = bounds.size - 1
    ranks = np.arange(world, dtype=np.int64)
    parts = np.arange(num_parts, dtype=np.int64)

    # ids are sorted and partitions are ID ranges, so each partition is one slice of ids
    part_off = np.searchsorted(ids, bounds).astype(np.int64)
    part_count = np.diff(part_off)
    trainer_part = ranks * num_parts // world
    group_lo = np.searchsorted(trainer_part, parts, side="left")  # first trainer of each partition
    group_size = np.searchsorted(trainer_part, parts, side="right") - group_lo
    orphan = group_size == 0  # partitions without trainers (world < num_parts)
    group_lo = np.where(orphan, parts * world // num_parts, group_lo)
    group_size = np.where(orphan, 1, group_size)
    own = trainer_part[rank]

    if not force_even:
        mine = np.flatnonzero((parts == own) | (orphan & (group_lo == rank)))
        lo, hi = _even_cuts(part_count[mine], group_size[mine], rank - group_lo[mine])
        pieces = [ids[part_off[p] + a : part_off[p] + b] for p, a, b in zip(mine, lo, hi, strict=True)]
        return torch.from_numpy(np.sort(np.concatenate(pieces)) if pieces else np.empty(0, np.int64))

    n = ids.size
    quota = n // world + (ranks < n % world)
    cum_quota = np.concatenate([[0], np.cumsum(quota)])
    capacity = np.where(orphan, 0, cum_quota[group_lo + group_size] - cum_quota[group_lo])  # per partition
    take = np.minimum(part_count, capacity)
    # local share of every trainer: an even split of its partition's first ``take`` IDs
    p_of = trainer_part
    local_lo, local_hi = _even_cuts(take[p_of], group_size[p_of], ranks - group_lo[p_of])
    local_count = local_hi - local_lo
    # leftovers (IDs past ``take`` in each partition), ascending, fill the deficits in rank order
    deficit = quota - local_count
    fill_off = np.concatenate([[0], np.cumsum(deficit)])
    rank_in_part = np.arange(n, dtype=np.int64) - np.repeat(part_off[:-1], part_count)
    leftovers = ids[rank_in_part >= np.repeat(take, part_count)]
    start = int(part_off[own])
    share = np.concatenate(
        [
            ids[start + int(local_lo[rank]) : start + int(local_hi[rank])],
            leftovers[int(fill_off[rank]) : int(fill_off[rank + 1])],
        ]
    )
    return torch.from_numpy(np.sort(share))


def node_split(
    mask: Any,
    partition_book: RangePartitionBook | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    force_even: bool = True,
    seed: int = 0,
    ntype: str | None = None,
    node_trainer_ids: Any = None,
) -> torch.Tensor:
    """Sorted int64 global node IDs of this rank's share of the nodes selected by ``mask``.

    With ``ntype`` (heterogeneous graphs) ``mask`` covers that type's nodes and the result is
    per-type IDs, split by the book's per-type ranges (each trainer gets its partition's nodes).

    ``mask`` is a bool array/tensor/``DistTensor`` over all global node IDs.
    ``partition_book=None`` means the mask's (or the initialised graph's) book, else one
    partition. ``rank``/``world_size`` default to torch.distributed (if initialised), else the
    launcher's environment (torchrun or srun, see ``asyncgraph.env.process_rank``), else 0/1.
    See the module docstring for the
    assignment; it is deterministic, so ``seed`` is accepted for DGL-style call sites only and
    does not change the result. ``node_trainer_ids`` (DGL's; e.g. ``g.ndata["trainer_id"]``
    written by ``partition_graph(..., num_trainers_per_machine=T)``) orders each partition's IDs
    by trainer before the even split, so trainer ``k`` of a partition gets its own sub-range.
    """
    if ntype is not None:
        from .hetero import NodeTypeTensor

        book: RangePartitionBook | None
        if isinstance(mask, NodeTypeTensor):
            book = partition_book or mask.book
            mask = mask[slice(None)]
        else:
            client = current_client()
            book = partition_book or (client.book if client is not None else None)
        if book is None:
            raise InvalidRequestError("node_split(ntype=...) needs a partition book or an initialised graph")
        tb = book.ntype_bounds(ntype)
        return _split(mask, None, rank, world_size, force_even, "node", type_bounds=tb)
    return _split(mask, partition_book, rank, world_size, force_even, "node", trainer_ids=node_trainer_ids)


def edge_split(
    mask: Any,
    partition_book: RangePartitionBook | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    force_even: bool = True,
    seed: int = 0,
    edge_trainer_ids: Any = None,
    etype: Any = None,
) -> torch.Tensor:
    """Sorted int64 global edge IDs of this rank's share of the edges selected by ``mask``.

    Same rules as ``node_split``, over edge IDs and the book's edge ranges. With ``etype``
    (heterogeneous graphs) ``mask`` covers that type's edges and the result is per-type edge IDs,
    split over the type's per-partition ranges (``partid2eids(p, etype)``).
    """
    if etype is not None:
        book: RangePartitionBook | None
        if isinstance(mask, DistTensor) and mask.etype is not None:
            book = partition_book or mask.client.book
            mask = mask[slice(None)]
        else:
            client = current_client()
            book = partition_book or (client.book if client is not None else None)
        if book is None:
            raise InvalidRequestError("edge_split(etype=...) needs a partition book or an initialised graph")
        tb = book.etype_bounds(etype)
        return _split(mask, None, rank, world_size, force_even, "edge", type_bounds=tb)
    return _split(mask, partition_book, rank, world_size, force_even, "edge", trainer_ids=edge_trainer_ids)


def split_masks(
    g: Any,
    names: Sequence[str] = ("train_mask", "val_mask", "test_mask"),
    rank: int | None = None,
    world_size: int | None = None,
    force_even: bool = True,
) -> dict[str, torch.Tensor]:
    """This rank's ``node_split`` share of each named node mask that ``g`` (a ``DistGraph``) has.

    Real data sets often come with a train mask only: a mask the graph lacks is left out of the
    result (callers skip what it was for) and named in one warning, on rank 0 only, so a run says
    once what it skipped.
    """
    missing = [name for name in names if name not in g.ndata]
    rank, world = rank_world(rank, world_size)
    if missing and rank == 0:
        log.warning(
            "graph %r has no %s; skipping what needs %s",
            getattr(g, "graph_name", "?"),
            ", ".join(missing),
            "it" if len(missing) == 1 else "them",
        )
    book = g.get_partition_book()
    return {
        name: node_split(g.ndata[name], book, rank=rank, world_size=world, force_even=force_even)
        for name in names
        if name not in missing
    }
