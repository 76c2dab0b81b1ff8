"""The server's executor of the op table: decode a request's arguments, run the op on this
server's partition.

The dispatch is derived from :data:`asyncgraph.protocol.ops.OPS`: every write goes through
:class:`~asyncgraph.server.writes.WritePath` (dedup, apply, log, acknowledge), every other op to
the method named like it. Handlers see only Python values and numpy arrays (never bytes or
sockets), and ops run in ``PartitionService``, the same code a client runs for its local
partitions, so a bad request raises a typed error and changes nothing, and served results equal
standalone ones. Synchronous handlers run to completion on the event loop, which makes every
request atomic with respect to every other request of this server; the store's lock extends that
to co-located clients writing through shared memory.

Ops marked ``offload`` may run in a worker thread so other clients keep being served: filling a
new tensor's initial values (over ``OFFLOAD_INIT_BYTES``; the tensor is published only once
filled, and a second create of the same name waits for the first) and samples that can return
more than ``OFFLOAD_SAMPLE_EDGES`` edges (they only read the immutable graph structure).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph import failpoints
from asyncgraph.errors import InvalidRequestError, UnknownOpError
from asyncgraph.kernels import compiled
from asyncgraph.protocol.args import (
    AddReplicaArgs,
    BarrierArgs,
    CreateTensorArgs,
    DegreesArgs,
    DeleteTensorArgs,
    FindEdgesArgs,
    PullArgs,
    PushArgs,
    ReleaseTensorsArgs,
    SampleArgs,
    SampleEdgesArgs,
    SnapshotArgs,
    SparseUpdateArgs,
    request_id,
)
from asyncgraph.protocol.info import ServerInfo, SharedMemoryInfo
from asyncgraph.protocol.ops import OPS, Op
from asyncgraph.server.barriers import Barriers
from asyncgraph.server.compactor import Compactor
from asyncgraph.server.durable import DurableState
from asyncgraph.server.leases import HolderLeases
from asyncgraph.server.live_handlers import live_applies
from asyncgraph.server.peers import bound_holder, current_connection
from asyncgraph.server.replica_registry import ReplicaRegistry
from asyncgraph.server.writes import WritePath
from asyncgraph.service.limits import WorkLimits
from asyncgraph.service.local import PartitionService
from asyncgraph.storage.store import PartitionStore, PendingTensor, TensorMeta

if TYPE_CHECKING:
    from asyncgraph.server.metrics import ServerMetrics

Handler = Callable[[Mapping[str, Any]], Any]

OFFLOAD_INIT_BYTES = 8 << 20
"""A new tensor whose initial values take more bytes than this is filled in a worker thread."""
OFFLOAD_SAMPLE_EDGES = 1 << 18
"""A sample that can return more edges than this (seeds x fanout, or x the mean in-degree for
fanout -1) runs in a worker thread."""

__all__ = ["Barriers", "Handler", "RequestHandlers"]

log = logging.getLogger("asyncgraph.server")


def _log_failure(task: asyncio.Future[Any]) -> None:
    """Log a background write's failure (a lease's release that waited for a snapshot)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("releasing an expired holder's references failed: %s", task.exception())


class RequestHandlers:
    """All ops this server answers, keyed by ``Op``."""

    def __init__(
        self,
        store: PartitionStore,
        *,
        num_clients: int,
        shm_address: str | None = None,
        shm_token: bytes | None = None,
        on_shutdown: Callable[[], None] | None = None,
        limits: WorkLimits | None = None,
        max_frame_size: int | None = None,
        metrics: ServerMetrics | None = None,
        durable: DurableState | None = None,
    ) -> None:
        self.store = store
        self.max_frame_size = max_frame_size
        self.metrics = metrics
        self.durable = durable
        #: Changes at every start: clients compare it to learn that the server restarted.
        self.instance = uuid.uuid4().hex
        shm = (
            SharedMemoryInfo(shm_address, shm_token)
            if shm_address is not None and shm_token is not None
            else None
        )
        self.partition = PartitionService(store, num_clients=num_clients, shm=shm, limits=limits)
        self.barriers = Barriers(num_clients, room=self._barrier_room)
        live = self.partition.live  # a live graph's overlay counts against the budget too
        store.rules.held_elsewhere = lambda: self.barriers.held_bytes + live.held_bytes()
        self.replicas = ReplicaRegistry()
        #: Holder leases (``--holder-lease``, server/leases.py; set by the server; None: off).
        self.leases: HolderLeases | None = None
        #: Verifies an ``add_replica`` before it is listed (set by the server; None: trusted).
        self.replica_check: Callable[[AddReplicaArgs, str | None], Awaitable[None]] | None = None
        self._creating: dict[str, asyncio.Future[None]] = {}
        self.on_shutdown = on_shutdown
        self.started = time.time()
        self.requests_served = 0
        self.compactor = Compactor(self.partition.live, durable)  # a live graph's (issue 35)
        self.write_path = WritePath(
            {
                Op.PUSH: self._apply_push,
                Op.CREATE_TENSOR: self._apply_create_tensor,
                Op.DELETE_TENSOR: self._apply_delete_tensor,
                Op.RELEASE_TENSORS: self._apply_release_tensors,
                Op.SPARSE_UPDATE: self._apply_sparse_update,
                **live_applies(self.partition, metrics, self.compactor),
            },
            durable,
        )
        self.compactor.write_path = self.write_path
        if durable is not None:
            durable.references = self.partition.references
            durable.live = self.partition.live
        #: The dispatch, derived from the op table: writes through the write path, unless the op
        #: has a handler of its own (create: it may fill off the loop first).
        self.ops: dict[str, Handler] = {}
        for spec in OPS.values():
            own = getattr(self, spec.op.value, None)
            if spec.writes and own is None:
                self.ops[spec.op] = functools.partial(self.write_path.submit, spec.op)
            else:
                assert own is not None, f"no handler for {spec.op}"
                self.ops[spec.op] = own

    def replay(self, op: str, args: Mapping[str, Any]) -> None:
        """Apply one logged write again (at start-up, after the snapshot)."""
        self.write_path.replay(op, args)

    @property
    def writes(self) -> int:
        """Acknowledged writes since start."""
        return self.write_path.writes

    @property
    def log_failure(self) -> str | None:
        """Why the write-ahead log stopped taking writes, or None."""
        return self.write_path.log_failure

    @property
    def epoch(self) -> int:
        """The state epoch (last snapshot) this server serves; 0 without a state folder."""
        return self.durable.epoch if self.durable is not None else 0

    def lookup(self, op: str) -> Handler:
        handler = self.ops.get(op)
        if handler is None:
            raise UnknownOpError(f"unknown op {op!r}; this server knows {sorted(self.ops)}")
        return handler

    # --- metadata -----------------------------------------------------------------------
    def describe(self) -> ServerInfo:
        """What ``info`` answers: the partition's description completed with this start's
        instance and epoch, the frame limit clients split calls to fit, and the replicas."""
        return dataclasses.replace(
            self.partition.info(),
            instance=self.instance,
            epoch=self.epoch,
            durable=self.durable is not None and self.durable.use_wal,
            max_frame_size=self.max_frame_size,
            role="primary",
            replicas=self.replicas.live(),
            sampler=compiled.state(),
        )

    def info(self, args: Mapping[str, Any]) -> dict[str, Any]:
        return self.describe().to_wire()

    def add_replica(self, args: Mapping[str, Any]) -> list[int] | Awaitable[list[int]]:
        """A replica server on this host announces its port; returns the live replicas' ports.

        With a ``replica_check`` (servers set one) only a proven replica is listed: it presents
        the partition's fingerprint and answers on its port as a replica of this primary."""
        a = AddReplicaArgs.decode(args)
        if self.partition.shm is None:
            raise InvalidRequestError(
                "add_replica: this server runs without shared memory, so no replica can map its data"
            )
        if self.replica_check is not None:
            peer = getattr(current_connection(), "peer", None)
            return self._add_checked(a, self.replica_check(a, peer))
        return self.replicas.add(a.port, a.pid)

    async def _add_checked(self, a: AddReplicaArgs, check: Awaitable[None]) -> list[int]:
        await check
        return self.replicas.add(a.port, a.pid)

    def live_replicas(self) -> list[int]:
        """Ports of announced replicas whose process still runs."""
        return self.replicas.live()

    def list_tensors(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [meta.to_dict() for meta in self.partition.list_tensors()]

    def compact(self, args: dict[str, Any]) -> Awaitable[dict[str, float]]:
        """Fold the live overlay into a new CSC (``server/compactor.py``)."""
        return self.compactor.request(args)  # type: ignore[no-any-return]

    def ping(self, args: Mapping[str, Any]) -> float:
        return time.time()

    def stats(self, args: Mapping[str, Any]) -> dict[str, Any]:
        import psutil

        proc = psutil.Process()
        cpu = proc.cpu_times()
        return {
            "rss": proc.memory_info().rss,
            "cpu_user": cpu.user,
            "cpu_system": cpu.system,
            "uptime": time.time() - self.started,
            "requests_served": self.requests_served,
            **self.partition.live.stats(),  # a live graph's overlay (issue 35)
        }

    # --- tensors ------------------------------------------------------------------------
    def pull(self, args: Mapping[str, Any]) -> np.ndarray:
        a = PullArgs.decode(args)
        rows = self.partition.pull(a.name, a.ids)
        if self.metrics is not None:
            self.metrics.rows_out += len(rows)
        return rows

    def _apply_push(self, a: PushArgs, retried: bool) -> None:
        self.partition.push(a.name, a.ids, a.values, a.op)
        if self.metrics is not None:
            self.metrics.rows_in += len(a.ids)

    def create_tensor(self, args: Mapping[str, Any]) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Create (or get) a tensor; an init over ``OFFLOAD_INIT_BYTES`` is filled off the loop."""
        a = CreateTensorArgs.decode(args)
        if a.holder is not None:  # a reference is taken as the connection's holder, no other
            bound_holder(Op.CREATE_TENSOR, a.holder)
        self.write_path.check_healthy(Op.CREATE_TENSOR)
        if self.leases is not None:  # the holder's lease follows its connections
            self.leases.bind(a.holder, current_connection())
        if a.name in self._creating:
            return self._create_after(args, a)
        rid = request_id(args, Op.CREATE_TENSOR)
        if rid is not None and rid in self.write_path.requests:  # a retry: get, no new reference
            created: dict[str, Any] | Awaitable[dict[str, Any]] = self.write_path.submit(
                Op.CREATE_TENSOR, args, a
            )
            return created
        pending = self.partition.begin_create(a.name, a.policy, a.shape, a.dtype, a.init)
        if isinstance(pending, TensorMeta) or not pending.needs_fill or pending.nbytes <= OFFLOAD_INIT_BYTES:
            if not isinstance(pending, TensorMeta):
                pending.discard()  # small or lazy (zeros): created inline by the one write path
            created = self.write_path.submit(Op.CREATE_TENSOR, args, a)
            return created  # the dict, or once the shared fsync is done under --wal-fsync always
        done = asyncio.get_running_loop().create_future()
        self._creating[a.name] = done
        return self._fill_off_loop(args, a, pending, done)

    def _apply_create_tensor(self, a: CreateTensorArgs, retried: bool) -> dict[str, Any]:
        holder = None if retried else a.holder
        meta, created = self.partition.create_tensor(a.name, a.policy, a.shape, a.dtype, a.init, holder)
        return {**meta.to_dict(), "created": created}

    async def _fill_off_loop(
        self, args: Mapping[str, Any], a: CreateTensorArgs, pending: PendingTensor, done: asyncio.Future[None]
    ) -> dict[str, Any]:
        fill = asyncio.ensure_future(asyncio.to_thread(pending.fill))
        try:
            await asyncio.shield(fill)
        except asyncio.CancelledError:
            # the requester went away: the thread still writes the rows, drop them once it is done
            fill.add_done_callback(lambda _: self._abandon(a.name, pending, done))
            raise
        except BaseException:
            self._abandon(a.name, pending, done)
            raise
        try:
            await self.write_path.wait_writable()  # published and logged after a snapshot in progress
            meta, created = self.partition.finish_create(pending, a.holder)  # discards itself on error
            durable = self.write_path.logged(Op.CREATE_TENSOR, args)
            result = {**meta.to_dict(), "created": created}
            if durable is not None:
                await self.write_path.when_durable(Op.CREATE_TENSOR, durable, None)
            return result
        finally:
            self._end_create(a.name, done)

    def _abandon(self, name: str, pending: PendingTensor, done: asyncio.Future[None]) -> None:
        pending.discard()
        self._end_create(name, done)

    def _end_create(self, name: str, done: asyncio.Future[None]) -> None:
        if self._creating.get(name) is done:
            del self._creating[name]
        if not done.done():
            done.set_result(None)

    async def _create_after(self, args: Mapping[str, Any], a: CreateTensorArgs) -> dict[str, Any]:
        """The same name is being created: wait for that, then create (usually: get) it."""
        while a.name in self._creating:
            await asyncio.shield(self._creating[a.name])
        result = self.create_tensor(args)
        if inspect.isawaitable(result):
            return await result
        return result

    def release_tensors(self, args: Mapping[str, Any]) -> Any:
        """Drop a holder's references (a write: logged, applied once); binds its lease first."""
        a = ReleaseTensorsArgs.decode(args)
        bound_holder(Op.RELEASE_TENSORS, a.holder)  # only one's own references
        if self.leases is not None:
            self.leases.bind(a.holder, current_connection())
        return self.write_path.submit(Op.RELEASE_TENSORS, args, a)

    def release_holder(self, holder: str) -> Any:
        """Drop every reference of ``holder`` (its lease expired), through the write path: logged
        (once a snapshot in progress is written: then a task). A holder with no reference (every
        client names its holder in its hello) has nothing to release: no record is logged."""
        if not any(holder in held for held in self.partition.references().values()):
            return []
        result = self.write_path.submit(Op.RELEASE_TENSORS, {"holder": holder, "names": [], "all": True})
        if not inspect.isawaitable(result):
            return result
        task = asyncio.ensure_future(result)
        task.add_done_callback(_log_failure)
        return task

    def _apply_delete_tensor(self, a: DeleteTensorArgs, retried: bool) -> None:
        self.partition.delete_tensor(a.name)

    def _apply_release_tensors(self, a: ReleaseTensorsArgs, retried: bool) -> list[str]:
        return self.partition.release_tensors(a.holder, a.names, a.all)

    def snapshot(self, args: Mapping[str, Any]) -> Awaitable[dict[str, Any]]:
        """Write this server's state as snapshot ``epoch`` (needs ``--state-dir``).

        The rows are streamed to disk off the event loop; writes wait until they are.
        """
        a = SnapshotArgs.decode(args)
        durable = self.durable
        if durable is None:
            raise InvalidRequestError("snapshot: this server was started without --state-dir")

        async def run() -> dict[str, Any]:
            path = await durable.snapshot_async(self.store, a.epoch)
            if failpoints.enabled:
                failpoints.hit("snapshot.before_ack")
            return {"epoch": a.epoch, "path": str(path)}

        return run()

    # --- coordination -------------------------------------------------------------------
    def barrier(self, args: Mapping[str, Any]) -> Awaitable[int]:
        a = BarrierArgs.decode(args)
        holder = bound_holder(Op.BARRIER, a.holder)  # one connection is one client, its hello's
        if self.leases is not None:
            self.leases.bind(holder, current_connection())
        return self.barriers.arrive(a.name, a.timeout, holder, current_connection())

    def _barrier_room(self, need: int) -> None:
        """A waiting barrier arrival counts against the memory budget (issue 32)."""
        self.store.rules.check_room("a waiting barrier arrival", need, self.store.memory_bytes())

    def shutdown(self, args: Mapping[str, Any]) -> None:
        if self.on_shutdown is not None:
            asyncio.get_running_loop().call_soon(self.on_shutdown)

    # --- structure ----------------------------------------------------------------------
    def sample(self, args: Mapping[str, Any]) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Sample in-edges of owned seeds; with ``features``, the answer also carries the rows of
        the sampled nodes this partition owns (``ids``, ``rows``: one array per feature)."""
        a = SampleArgs.decode(args)
        num_seeds = a.seeds.size  # a 1-D integer array (SampleArgs.decode)
        # fanout -1 takes every in-edge: assume the partition's mean in-degree per seed
        per_seed = (
            a.fanout
            if a.fanout >= 0
            else max(1, self.store.indices.size // max(1, self.store.indptr.size - 1))
        )
        big = num_seeds * per_seed > OFFLOAD_SAMPLE_EDGES
        if big:
            return self._sample_off_loop(a)
        return self._answer(a, self.partition.sample(a.seeds, a.fanout, a.replace, a.seed))

    async def _sample_off_loop(self, a: SampleArgs) -> dict[str, Any]:
        edges = await asyncio.to_thread(self.partition.sample, a.seeds, a.fanout, a.replace, a.seed)
        return self._answer(a, edges)  # carried rows are read back on the loop, like pulls

    def _answer(self, a: SampleArgs, edges: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[str, Any]:
        src, dst, eids = edges
        out: dict[str, Any] = {"src": src, "dst": dst, "eids": eids}
        if a.features:
            ids, rows = self.partition.carried_rows(a.seeds, src, a.features, a.feature_ids)
            out["ids"], out["rows"] = ids, rows
            if self.metrics is not None:
                self.metrics.rows_out += int(ids.size)
        return out

    def find_edges(self, args: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Global ``src``/``dst`` of edge IDs this partition owns (OutOfRangeError otherwise)."""
        src, dst = self.partition.find_edges(FindEdgesArgs.decode(args).eids)
        return {"src": src, "dst": dst}

    def degrees(self, args: Mapping[str, Any]) -> np.ndarray:
        a = DegreesArgs.decode(args)
        return self.partition.degrees(a.ids, a.edge_dir)

    def sample_edges(self, args: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return self.partition.sample_edges(SampleEdgesArgs.decode(args))

    # --- sparse optimizers --------------------------------------------------------------
    def _apply_sparse_update(self, a: SparseUpdateArgs, retried: bool) -> None:
        """One Adagrad/Adam step on owned rows, applied here under the store's write lock."""
        self.partition.sparse_update(a.name, a.ids, a.grads, a.spec)
        if self.metrics is not None:
            self.metrics.rows_in += len(a.ids)
