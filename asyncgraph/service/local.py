"""A partition's ops over a store in this process: the server's request handlers and the
client's ``LocalPartition`` (``asyncgraph.client.local``) run the same code, so standalone and
served results are equal by construction."""

from __future__ import annotations

import operator
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from asyncgraph.arrays import unique_sorted
from asyncgraph.errors import InvalidRequestError
from asyncgraph.kernels.edge_queries import OutIndex, degrees, sample_edges
from asyncgraph.kernels.edges import find_edges_partition
from asyncgraph.kernels.partition_sampling import sample_partition
from asyncgraph.kernels.sparse_optim import apply_sparse_update
from asyncgraph.protocol.info import ServerInfo, SharedMemoryInfo
from asyncgraph.protocol.ops import SampleEdgesArgs
from asyncgraph.service.base import SampledRows
from asyncgraph.service.limits import WorkLimits, sample_bound
from asyncgraph.service.live import LiveStructure
from asyncgraph.storage.store import PartitionStore, PendingTensor, Policy, TensorMeta

__all__ = ["PartitionService", "boot_id"]


def boot_id() -> str:
    """An identifier of this host's running kernel: equal boot IDs mean 'same machine'."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return socket.gethostname()


class PartitionService:
    """The ops of one partition over its store, synchronous: a server runs each request with it.

    ``limits`` (a server's) bounds what one request may ask for, checked before anything is
    allocated; ``None`` (in-process callers, who own the memory they ask for) checks nothing.
    """

    def __init__(
        self,
        store: PartitionStore,
        *,
        num_clients: int = 1,
        shm: SharedMemoryInfo | None = None,
        limits: WorkLimits | None = None,
    ) -> None:
        self.store = store
        self.num_clients = num_clients
        self.shm = shm
        self.limits = limits
        self._out_index: OutIndex | None = None
        self._refs: dict[str, dict[str, int]] = {}  # non-persistent tensor -> holder -> references
        #: Added and removed edges (issue 35); reads go through it once the graph was updated.
        self.live = LiveStructure(store)

    @property
    def out_index(self) -> OutIndex:
        """This partition's edges grouped by source (built on first use)."""
        if self._out_index is None:
            self._out_index = OutIndex.build(self.store)
        return self._out_index

    def info(self) -> ServerInfo:
        """The partition's identity, book and tensors, and how to reach its memory (a server
        completes the record with what belongs to its start: instance, epoch, role, ...)."""
        store = self.store
        overlay = store.overlay
        return ServerInfo(
            added_nodes=overlay.nodes if overlay is not None else 0,
            live=overlay is not None or bool(getattr(store, "live_elsewhere", False)),
            graph_name=store.graph_name,
            part_id=store.part_id,
            num_parts=store.book.num_partitions(),
            num_nodes=store.book.num_nodes,
            num_edges=store.book.num_edges,
            book=store.book.to_dict(),
            tensors=[meta.to_dict() for meta in store.list_tensors()],
            num_clients=self.num_clients,
            pid=os.getpid(),
            boot_id=boot_id(),
            shm=self.shm,
        )

    def list_tensors(self) -> list[TensorMeta]:
        return self.store.list_tensors()

    def pull(self, name: str, ids: np.ndarray) -> np.ndarray:
        limits = self.limits
        if limits is not None:
            row_bytes = self.store.row_bytes(name)  # cached per tensor; UnknownTensorError first
            num_rows = ids.size if type(ids) is np.ndarray else int(np.size(ids))
            if num_rows * row_bytes > limits.max_reply_bytes:
                limits.check_rows(f"pull from {name!r}", num_rows, row_bytes)  # raises, naming the limit
        return self.store.pull(name, ids)

    def pull_into(self, name: str, ids: np.ndarray, out: np.ndarray, where: np.ndarray | None) -> int:
        """``pull`` into ``out[where]`` with each row copied once; the host bytes copied."""
        return self.store.pull_into(name, ids, out, where)

    def push(self, name: str, ids: np.ndarray, values: np.ndarray, op: str = "assign") -> None:
        self.store.push(name, ids, values, op)

    def create_tensor(
        self,
        name: str,
        policy: str,
        shape: list[int],
        dtype: str,
        init: dict[str, Any] | None = None,
        holder: str | None = None,
    ) -> tuple[TensorMeta, bool]:
        """The tensor's meta, and whether this call created it (False: it existed already).

        With a ``holder`` the tensor is non-persistent: a tensor created that way is reference
        counted (one reference per call, by holder) and deleted when ``release_tensors`` drops
        the last one; getting an existing non-persistent tensor adds a reference, getting a
        persistent one adds none.
        """
        if self.limits is not None:
            self._check_tensor_size(name, policy, shape, dtype)
        existed = self.store.has_tensor(name)
        meta = self.store.create_tensor(name, cast(Policy, policy), shape, dtype, init)
        self._hold(name, holder, existed)
        return meta, not existed

    def finish_create(self, pending: PendingTensor, holder: str | None = None) -> tuple[TensorMeta, bool]:
        """Publish a filled ``begin_create`` tensor: its meta and whether this call created it."""
        name = pending.tensor.meta.name
        existed = self.store.has_tensor(name)
        meta = self.store.finish_create(pending)
        self._hold(name, holder, existed)
        return meta, not existed

    def _hold(self, name: str, holder: str | None, existed: bool) -> None:
        if holder is not None and (not existed or name in self._refs):
            held = self._refs.setdefault(name, {})
            held[holder] = held.get(holder, 0) + 1

    def begin_create(
        self, name: str, policy: str, shape: list[int], dtype: str, init: dict[str, Any] | None = None
    ) -> TensorMeta | PendingTensor:
        """``create_tensor`` in steps (``PartitionStore.begin_create``), so a server can fill off-loop."""
        if self.limits is not None:
            self._check_tensor_size(name, policy, shape, dtype)
        return self.store.begin_create(name, cast(Policy, policy), shape, dtype, init)

    def _check_tensor_size(self, name: str, policy: str, shape: list[int], dtype: str) -> None:
        """Refuse a tensor over the limits before the store allocates it (bad shapes: the store says)."""
        assert self.limits is not None
        try:
            dims = tuple(operator.index(d) for d in shape)
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            return
        if not dims or any(d < 0 for d in dims) or policy not in ("node", "edge"):
            return
        book, part = self.store.book, self.store.part_id
        lo, hi = book.node_range(part) if policy == "node" else book.edge_range(part)
        self.limits.check_tensor(name, (hi - lo, *dims[1:]), dt)

    def delete_tensor(self, name: str) -> None:
        self.store.delete_tensor(name)
        self._refs.pop(name, None)

    def references(self) -> dict[str, dict[str, int]]:
        """A copy of the reference counts of non-persistent tensors: tensor -> holder -> count
        (what a snapshot keeps, so that restored tensors are still freed by their holders)."""
        return {name: dict(held) for name, held in self._refs.items()}

    def load_references(self, refs: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the reference counts with ``refs`` (from a snapshot), for tensors that exist."""
        self._refs = {
            str(name): {str(h): int(c) for h, c in held.items() if int(c) > 0}
            for name, held in refs.items()
            if self.store.has_tensor(str(name))
        }
        self._refs = {name: held for name, held in self._refs.items() if held}

    def release_tensors(self, holder: str, names: list[str], every: bool = False) -> list[str]:
        """Drop ``holder``'s references (one per name, or all); returns the tensors deleted."""
        drops: dict[str, int] = {}
        if every:
            drops = {n: held[holder] for n, held in self._refs.items() if holder in held}
        for n in names:
            drops[n] = drops.get(n, 0) + 1
        deleted: list[str] = []
        for name, count in drops.items():
            held = self._refs.get(name)
            if held is None or holder not in held:
                continue  # not a reference this holder has (already released, or persistent)
            held[holder] -= count
            if held[holder] <= 0:
                del held[holder]
            if not held:
                del self._refs[name]
                state = [m.name for m in self.store.list_tensors() if m.name.startswith(name + "#")]
                for key in [name, *state]:
                    if self.store.has_tensor(key):
                        self.store.delete_tensor(key)
                        deleted.append(key)
        return deleted

    def sample(
        self, seeds: np.ndarray, fanout: int, replace: bool, seed: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        limits = self.limits
        if self.live.active:  # checks its own bound: seeds may be added nodes
            return self.live.sample(seeds, fanout, replace, seed, limits)
        if (
            limits is not None
            and isinstance(fanout, int)
            and (fanout == -1 or seeds.size * fanout > limits.max_sampled_edges)
        ):
            # over the cheap bound: count what the seeds' degrees allow (invalid seeds raise here)
            local = self.store.book.nid2localnid(seeds, self.store.part_id)
            limits.check_sample(local.size, fanout, sample_bound(self.store.indptr, local, fanout, replace))
        self.live.check_mapped("sample")
        out = sample_partition(self.store, seeds, fanout, replace, seed)
        return out["src"], out["dst"], out["eids"]

    def sample_with_features(
        self,
        seeds: np.ndarray,
        fanout: int,
        replace: bool,
        seed: int | None,
        features: Sequence[str],
        extra: np.ndarray | None = None,
    ) -> SampledRows:
        """``sample`` plus the rows of ``features`` of the sampled nodes this partition owns
        (its seeds and the sources in its range) and of ``extra`` owned IDs, so they need no
        pull of their own (see ``carried_rows``)."""
        src, dst, eids = self.sample(seeds, fanout, replace, seed)
        ids, rows = self.carried_rows(seeds, src, features, extra)
        return SampledRows(src, dst, eids, ids, rows)

    def carried_rows(
        self, seeds: np.ndarray, src: np.ndarray, features: Sequence[str], extra: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The owned IDs among ``seeds``, sampled sources ``src`` and ``extra`` (sorted, unique)
        and their rows of each node tensor in ``features``: what a sample answer carries.

        An ``extra`` ID this partition does not own, or a feature that is not a node tensor, is
        rejected. With ``limits``, an answer whose rows would not fit one reply carries no rows
        (empty IDs): the client then pulls them, split to fit, like any rows not carried.
        """
        metas = [self.store.tensor_meta(name) for name in features]
        for meta in metas:
            if meta.policy != "node":
                raise InvalidRequestError(f"sample: feature {meta.name!r} is not a node tensor")
        lo, hi = self.store.node_range
        owned_src = src[(src >= lo) & (src < hi)]
        parts = [np.asarray(seeds, dtype=np.int64), owned_src]
        if extra is not None:
            parts.append(np.asarray(extra, dtype=np.int64))
        ids = unique_sorted(np.concatenate(parts))
        limits = self.limits
        if limits is not None:
            row_bytes = sum(self.store.row_bytes(m.name) for m in metas)
            if 3 * 8 * src.size + ids.size * (8 + row_bytes) > limits.max_reply_bytes:
                if extra is not None:
                    self.store.book.nid2localnid(np.asarray(extra, dtype=np.int64), self.store.part_id)
                return ids[:0], [np.empty((0, *m.row_shape), dtype=m.dtype) for m in metas]
        return ids, [self.store.pull(name, ids) for name in features]

    def find_edges(self, eids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.live.active:
            return self.live.find_edges(eids)
        self.live.check_mapped("find_edges")
        return find_edges_partition(self.store, eids)

    def add_edges(
        self, src: np.ndarray, dst: np.ndarray, rid: str | None = None, data: Mapping[str, Any] | None = None
    ) -> np.ndarray:
        """Append edges ``src -> dst`` (every ``dst`` owned here) with rows ``data`` of edge
        tensors: their new global edge IDs."""
        return self.live.add_edges(src, dst, rid, data)

    def add_nodes(
        self, num: int, rid: str | None = None, data: Mapping[str, Any] | None = None
    ) -> np.ndarray:
        """Add ``num`` nodes owned here with rows ``data`` of node tensors: their new global
        IDs (``N_base + p + k * P``)."""
        return self.live.add_nodes(num, rid, data)

    def compact(self) -> dict[str, float]:
        """Fold the live overlay into a new CSC (``service/live_compact.py``); what it did."""
        from asyncgraph.service.live_compact import compact_now

        return compact_now(self.live)

    def remove_edges(self, eids: np.ndarray) -> None:
        """Remove the live edges ``eids`` owned here (``UnknownEdgeError`` if one is not live)."""
        self.live.remove_edges(eids)

    def sparse_update(self, name: str, ids: np.ndarray, grads: np.ndarray, spec: Mapping[str, Any]) -> None:
        apply_sparse_update(self.store, name, ids, grads, spec)

    def degrees(self, ids: np.ndarray | None, edge_dir: str) -> np.ndarray:
        if self.live.active and edge_dir == "in":
            return self.live.in_degrees(ids)
        if self.live.active and edge_dir == "out":
            return self.live.out_degrees(lambda: self.out_index, ids)
        self.live.check_mapped("degrees")
        return degrees(self.store, self.out_index if edge_dir == "out" else None, ids, edge_dir)

    def sample_edges(self, args: SampleEdgesArgs) -> dict[str, np.ndarray]:
        if self.live.active and args.etype_fanouts is None and args.etype_probs is None:
            return self.live.sample_edges(lambda: self.out_index, args)
        if self.live.active:
            if args.edge_dir != "in" or args.replace:
                raise InvalidRequestError("per-edge-type fanouts need edge_dir='in' and replace=False")
            return self.live.sample_typed(args)
        self.live.check_mapped("sample_edges")
        out_index = self.out_index if args.edge_dir == "out" else None
        return sample_edges(
            self.store,
            out_index,
            args.seeds,
            args.fanout,
            edge_dir=args.edge_dir,
            replace=args.replace,
            seed=args.seed,
            prob=args.prob,
            exclude=args.exclude,
            etype_fanouts=args.etype_fanouts,
            etype_probs=args.etype_probs,
        )
