"""Request handlers: decode a request's arguments and run the op on this server's partition.

Handlers see only Python values and numpy arrays (never bytes or sockets). Arguments are decoded
by the op's record (``asyncgraph.protocol.ops``) and the op runs in ``PartitionService``, the same
code a client runs for its local partitions, so a bad request raises a typed error and changes
nothing, and served results equal standalone ones. Synchronous handlers run to completion on the
event loop, which makes every request atomic with respect to every other request of this server;
the store's lock extends that to co-located clients writing through shared memory.

Two kinds of request may be long and run in a worker thread instead, so other clients keep being
served: filling a new tensor's initial values (over ``OFFLOAD_INIT_BYTES``; the tensor is
published only once filled, and a second create of the same name waits for the first) and
samples that can return more than ``OFFLOAD_SAMPLE_EDGES`` edges (they only read the immutable
graph structure).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from asyncgraph.errors import InvalidRequestError, StateLogError, UnknownOpError
from asyncgraph.kernels import compiled
from asyncgraph.launch.processes import process_alive
from asyncgraph.protocol.ops import (
    AddReplicaArgs,
    BarrierArgs,
    CreateTensorArgs,
    DegreesArgs,
    DeleteTensorArgs,
    FindEdgesArgs,
    Op,
    PullArgs,
    PushArgs,
    ReleaseTensorsArgs,
    SampleArgs,
    SampleEdgesArgs,
    SnapshotArgs,
    SparseUpdateArgs,
    request_id,
)
from asyncgraph.server.barriers import Barriers  # issue 22: counts distinct clients
from asyncgraph.server.durable import DurableState, RequestLog
from asyncgraph.server.leases import HolderLeases
from asyncgraph.server.peers import current_connection
from asyncgraph.service.limits import WorkLimits
from asyncgraph.service.local import PartitionService
from asyncgraph.storage.store import PartitionStore, PendingTensor, TensorMeta

log = logging.getLogger("asyncgraph.server")

if TYPE_CHECKING:
    from asyncgraph.server.metrics import ServerMetrics

Handler = Callable[[Mapping[str, Any]], Any]

OFFLOAD_INIT_BYTES = 8 << 20
"""A new tensor whose initial values take more bytes than this is filled in a worker thread."""
OFFLOAD_SAMPLE_EDGES = 1 << 18
"""A sample that can return more edges than this (seeds x fanout, or x the mean in-degree for
fanout -1) runs in a worker thread."""

__all__ = ["Barriers", "Handler", "RequestHandlers"]


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
        self.requests = durable.requests if durable is not None else RequestLog()
        #: Changes at every start: clients compare it to learn that the server restarted.
        self.instance = uuid.uuid4().hex
        self.writes = 0  # acknowledged writes since start (periodic snapshots skip idle periods)
        #: Set when the write-ahead log failed: every later write is refused (``StateLogError``).
        self.log_failure: str | None = None
        shm = (
            {"address": shm_address, "token": shm_token}
            if shm_address is not None and shm_token is not None
            else None
        )
        self.partition = PartitionService(store, num_clients=num_clients, shm=shm, limits=limits)
        self.barriers = Barriers(num_clients)
        self._creating: dict[str, asyncio.Future[None]] = {}
        self.on_shutdown = on_shutdown
        self.started = time.time()
        self.requests_served = 0
        self.ops: dict[str, Handler] = {
            Op.INFO: self.info,
            Op.PULL: self.pull,
            Op.PUSH: self.push,
            Op.CREATE_TENSOR: self.create_tensor,
            Op.DELETE_TENSOR: self.delete_tensor,
            Op.RELEASE_TENSORS: self.release_tensors,
            Op.LIST_TENSORS: self.list_tensors,
            Op.BARRIER: self.barrier,
            Op.SAMPLE: self.sample,
            Op.FIND_EDGES: self.find_edges,
            Op.STATS: self.stats,
            Op.PING: self.ping,
            Op.SHUTDOWN: self.shutdown,
            Op.SPARSE_UPDATE: self.sparse_update,
            Op.DEGREES: self.degrees,
            Op.SAMPLE_EDGES: self.sample_edges,
            Op.SNAPSHOT: self.snapshot,
            Op.ADD_REPLICA: self.add_replica,
        }
        #: Replica servers of this partition on this host: port -> pid (``add_replica``).
        self.replicas: dict[int, int] = {}
        #: Holder leases (``--holder-lease``, server/leases.py; set by the server; None: off).
        self.leases: HolderLeases | None = None
        #: Verifies an ``add_replica`` before it is listed (set by the server; None: trusted).
        self.replica_check: Callable[[AddReplicaArgs, str | None], Awaitable[None]] | None = None
        # Writes without logging or request ids: what a request and a log replay both apply.
        self._apply: dict[str, Handler] = {
            Op.PUSH: self._push,
            Op.CREATE_TENSOR: self._create_tensor,
            Op.DELETE_TENSOR: self._delete_tensor,
            Op.SPARSE_UPDATE: self._sparse_update,
        }

    def replay(self, op: str, args: Mapping[str, Any]) -> None:
        """Apply one logged write again (at start-up, after the snapshot)."""
        self._apply[op](args)

    def _write(self, op: str, args: Mapping[str, Any]) -> Any:
        """Apply a write once per request id, log it, then let the reply go out."""
        rid = request_id(args, op)
        if rid is not None and rid in self.requests and op != Op.CREATE_TENSOR:
            return None  # applied before; the client retried after losing our reply
        self.check_log_healthy(op)
        result = self._apply[op](args)
        durable = self._logged(op, args, rid)
        if durable is not None:
            return self._when_durable(op, durable, result)
        return result

    def _logged(self, op: str, args: Mapping[str, Any], rid: str | None = None) -> Awaitable[None] | None:
        """Count an applied write, log it (WAL) and remember its request id.

        Returns what to await before acknowledging (the shared fsync of ``--wal-fsync always``).
        """
        rid = rid if rid is not None else request_id(args, op)
        self.writes += 1
        durable = None
        if self.durable is not None:
            try:
                durable = self.durable.log(op, args, rid)
            except OSError as exc:
                raise self._log_failed(op, exc) from None
        if rid is not None:
            self.requests.add(rid)
        return durable

    def _log_failed(self, op: str, exc: OSError) -> StateLogError:
        self.log_failure = f"{op} could not be logged: {exc}"
        log.critical("write-ahead log failed (%s); refusing writes until restarted", exc)
        return StateLogError(
            f"{self.log_failure}; it may be applied in memory but is not durable, and this "
            "server refuses writes until it is restarted from its state"
        )

    async def _when_durable(self, op: str, durable: Awaitable[None], result: Any) -> Any:
        """``result`` once the write's log record is on disk."""
        try:
            await durable
        except OSError as exc:
            raise self._log_failed(op, exc) from None
        return result

    def check_log_healthy(self, op: str) -> None:
        """``StateLogError`` once the write-ahead log has failed: memory is ahead of the log, so a
        later write (or a retry of the failed one) must not be applied and acknowledged."""
        if self.log_failure is not None:
            raise StateLogError(
                f"{op} refused: this server's write-ahead log failed earlier ({self.log_failure}); "
                "restart it from its state"
            )

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
    def info(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The partition's description, this server's start (instance, epoch) and frame limit."""
        info = self.partition.info()
        info["instance"] = self.instance
        info["epoch"] = self.epoch
        info["durable"] = self.durable is not None and self.durable.use_wal
        if self.max_frame_size is not None:
            info["max_frame_size"] = self.max_frame_size  # clients split calls to fit
        info["role"] = "primary"
        info["replicas"] = self.live_replicas()
        info["sampler"] = compiled.state()
        return info

    def add_replica(self, args: Mapping[str, Any]) -> list[int] | Awaitable[list[int]]:
        """A replica server on this host announces its port; returns the live replicas' ports."""
        a = AddReplicaArgs.decode(args)
        if self.partition.shm is None:
            raise InvalidRequestError(
                "add_replica: this server runs without shared memory, so no replica can map its data"
            )
        if self.replica_check is not None:  # issue 22: only a proven replica (server/replica_check.py)
            peer = getattr(current_connection(), "peer", None)
            return self._add_checked(a, self.replica_check(a, peer))
        self.replicas[a.port] = a.pid
        log.info("replica server pid %d on port %d", a.pid, a.port)
        return self.live_replicas()

    async def _add_checked(self, a: AddReplicaArgs, check: Awaitable[None]) -> list[int]:
        await check
        self.replicas[a.port] = a.pid
        log.info("replica server pid %d on port %d (verified)", a.pid, a.port)
        return self.live_replicas()

    def live_replicas(self) -> list[int]:
        """Ports of announced replicas whose process still runs (dead ones are forgotten)."""
        for port, pid in list(self.replicas.items()):
            if not process_alive(pid):
                del self.replicas[port]
        return sorted(self.replicas)

    def list_tensors(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [meta.to_dict() for meta in self.partition.list_tensors()]

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
        }

    # --- tensors ------------------------------------------------------------------------
    def pull(self, args: Mapping[str, Any]) -> np.ndarray:
        a = PullArgs.decode(args)
        rows = self.partition.pull(a.name, a.ids)
        if self.metrics is not None:
            self.metrics.rows_out += len(rows)
        return rows

    def push(self, args: Mapping[str, Any]) -> Any:
        return self._write(Op.PUSH, args)  # the shared fsync to await under --wal-fsync always

    def _push(self, args: Mapping[str, Any]) -> None:
        a = PushArgs.decode(args)
        self.partition.push(a.name, a.ids, a.values, a.op)
        if self.metrics is not None:
            self.metrics.rows_in += len(a.ids)

    def create_tensor(self, args: Mapping[str, Any]) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Create (or get) a tensor; an init over ``OFFLOAD_INIT_BYTES`` is filled off the loop."""
        a = CreateTensorArgs.decode(args)
        self.check_log_healthy(Op.CREATE_TENSOR)
        if self.leases is not None:  # issue 22: the holder's lease follows its connections
            self.leases.bind(a.holder, current_connection())
        if a.name in self._creating:
            return self._create_after(args)
        pending = self.partition.begin_create(a.name, a.policy, a.shape, a.dtype, a.init)
        if isinstance(pending, TensorMeta) or not pending.needs_fill or pending.nbytes <= OFFLOAD_INIT_BYTES:
            if not isinstance(pending, TensorMeta):
                pending.discard()  # small or lazy (zeros): created inline by the one write path
            created: dict[str, Any] | Awaitable[dict[str, Any]] = self._write(Op.CREATE_TENSOR, args)
            return created  # the dict, or once the shared fsync is done under --wal-fsync always
        done = asyncio.get_running_loop().create_future()
        self._creating[a.name] = done
        return self._fill_off_loop(args, a, pending, done)

    def _create_tensor(self, args: Mapping[str, Any]) -> dict[str, Any]:
        a = CreateTensorArgs.decode(args)
        meta, created = self.partition.create_tensor(a.name, a.policy, a.shape, a.dtype, a.init, a.holder)
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
            meta, created = self.partition.finish_create(pending, a.holder)  # discards itself on error
            durable = self._logged(Op.CREATE_TENSOR, args)
            result = {**meta.to_dict(), "created": created}
            if durable is not None:
                await self._when_durable(Op.CREATE_TENSOR, durable, None)
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

    async def _create_after(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The same name is being created: wait for that, then create (usually: get) it."""
        name = CreateTensorArgs.decode(args).name
        while name in self._creating:
            await asyncio.shield(self._creating[name])
        result = self.create_tensor(args)
        if inspect.isawaitable(result):
            return await result
        return result

    def delete_tensor(self, args: Mapping[str, Any]) -> Any:
        return self._write(Op.DELETE_TENSOR, args)

    def _delete_tensor(self, args: Mapping[str, Any]) -> None:
        self.partition.delete_tensor(DeleteTensorArgs.decode(args).name)

    def release_tensors(self, args: Mapping[str, Any]) -> list[str]:
        a = ReleaseTensorsArgs.decode(args)
        if self.leases is not None:
            self.leases.bind(a.holder, current_connection())
        return self.partition.release_tensors(a.holder, a.names, a.all)

    def release_holder(self, holder: str) -> Any:
        """Drop every reference of ``holder`` (its lease expired), through the request path."""
        return self.ops[Op.RELEASE_TENSORS]({"holder": holder, "names": [], "all": True})

    def snapshot(self, args: Mapping[str, Any]) -> Awaitable[dict[str, Any]]:
        """Write this server's state as snapshot ``epoch`` (needs ``--state-dir``).

        The rows are copied at once; the files are written off the event loop.
        """
        a = SnapshotArgs.decode(args)
        durable = self.durable
        if durable is None:
            raise InvalidRequestError("snapshot: this server was started without --state-dir")

        async def run() -> dict[str, Any]:
            path = await durable.snapshot_async(self.store, a.epoch)
            return {"epoch": a.epoch, "path": str(path)}

        return run()

    # --- coordination -------------------------------------------------------------------
    def barrier(self, args: Mapping[str, Any]) -> Awaitable[int]:
        a = BarrierArgs.decode(args)
        if self.leases is not None:
            self.leases.bind(a.holder, current_connection())
        return self.barriers.arrive(a.name, a.timeout, a.holder, current_connection())

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
    def sparse_update(self, args: Mapping[str, Any]) -> Any:
        """One Adagrad/Adam step on owned rows, applied here under the store's write lock."""
        return self._write(Op.SPARSE_UPDATE, args)

    def _sparse_update(self, args: Mapping[str, Any]) -> None:
        a = SparseUpdateArgs.decode(args)
        self.partition.sparse_update(a.name, a.ids, a.grads, a.spec)
        if self.metrics is not None:
            self.metrics.rows_in += len(a.ids)
