"""PyG's ``DistContext``, and the meeting that turns each node's partition into one served graph.

PyG's deprecated distributed scripts load partition ``node_rank`` on each node
(``LocalGraphStore.from_partition(root, node_rank)``), describe the job with a ``DistContext``
and hand both to ``DistNeighborLoader(..., current_ctx=, master_addr=, master_port=)``, whose
samplers meet over RPC at ``master_addr:master_port``. Here the first such loader of a process
(:func:`connect_partitions`) meets the other nodes through a ``torch.distributed.TCPStore`` at
``master_addr:master_port`` (node rank 0 hosts it): rank 0 makes the job's secret, every node
starts one asyncgraph server for its own partition (``python -m asyncgraph.server``, bound to
the address it reaches ``master_addr`` from, loopback for a loopback master), publishes its
address, and, once every partition has one, connects the process's client to all of them
(``asyncgraph.initialize``). The servers sample and serve the features; the script's
``torch.distributed`` (DDP) is untouched. Each server stops when its process exits (or dies).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncgraph.distributed.context import current_client, initialize
from asyncgraph.errors import InvalidRequestError
from asyncgraph.launch.lifeline import die_with_parent
from asyncgraph.launch.netif import is_loopback, source_address
from asyncgraph.launch.processes import ServerExitedError, server_argv, wait_ready_files
from asyncgraph.launch.servers import subprocess_env

__all__ = ["DistContext", "DistRole", "PartitionRef", "connect_partitions"]

logger = logging.getLogger("asyncgraph.pyg")

#: Seconds to wait for every node (and each server start) when the loader is not told otherwise.
DEFAULT_MEET_TIMEOUT = 300.0


class DistRole:
    """PyG's ``DistRole``: every process of these scripts is a worker (trainer)."""

    WORKER = 1


@dataclass
class DistContext:
    """PyG's ``torch_geometric.distributed.DistContext``: this process's place in the job."""

    rank: int
    global_rank: int
    world_size: int
    global_world_size: int
    group_name: str
    role: int = DistRole.WORKER

    @property
    def worker_name(self) -> str:
        return f"{self.group_name}-{self.rank}"


@dataclass(frozen=True)
class PartitionRef:
    """One partition of a partitioned graph: its config file and its ID."""

    part_config: Path
    part_id: int
    num_parts: int
    graph_name: str


class _Hosted:
    """This process's partition server and the rendezvous stores it must keep alive."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stores: list[Any] = []
        self.workdir: Path | None = None
        atexit.register(self.stop)

    def dir(self) -> Path:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="asyncgraph-pyg-"))
        return self.workdir

    def stop(self) -> None:
        """SIGTERM this process's servers (SIGKILL after 10 s) and remove their folder."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.procs.clear()
        self.stores.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


_HOSTED = _Hosted()


def _serve(ref: PartitionRef, host: str, secret: bytes, clients: int, timeout: float) -> tuple[str, int]:
    """Start this node's server for ``ref`` on ``host`` (a free port); its bound address."""
    work = _HOSTED.dir()
    secret_file = work / "secret"
    secret_file.write_bytes(secret)
    secret_file.chmod(0o600)
    ready, log = work / f"ready{ref.part_id}.json", work / f"server{ref.part_id}.log"
    argv = server_argv(
        ref.part_config, ref.part_id, ready, host=host, num_clients=clients, secret_file=secret_file
    )
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=subprocess_env(),
            preexec_fn=die_with_parent(signal.SIGTERM),
        )  # fmt: skip
    _HOSTED.procs.append(proc)
    try:
        return wait_ready_files([proc], [ready], timeout)[0]
    except (ServerExitedError, TimeoutError) as exc:
        raise InvalidRequestError(
            f"the server for partition {ref.part_id} did not start: {exc}:\n{log.read_text(errors='replace')}"
        ) from None


def _context_of(ctx: Any, ref: PartitionRef) -> tuple[int, int]:
    """``(rank, world_size)`` of a PyG ``DistContext`` (ours or PyG's own), checked against ``ref``."""
    if ctx is None:
        raise InvalidRequestError(
            "partitions loaded with from_partition() need current_ctx=DistContext(...), master_addr= "
            "and master_port= on the loader (or use asyncgraph.DistGraph and asyncgraph.launch)"
        )
    rank, world = int(ctx.rank), int(ctx.world_size)
    if world != ref.num_parts:
        raise InvalidRequestError(
            f"{ref.part_config} has {ref.num_parts} partitions but the DistContext has world_size "
            f"{world}: each node serves one partition (its node_rank)"
        )
    if rank != ref.part_id:
        raise InvalidRequestError(f"node rank {rank} loaded partition {ref.part_id}: load partition {rank}")
    return rank, world


def connect_partitions(
    ref: PartitionRef, ctx: Any, master_addr: Any, master_port: Any, timeout: float | None = None
) -> None:
    """Serve ``ref`` from this node, meet the other nodes at ``master_addr:master_port`` and connect
    this process's client to every partition's server (see the module docstring). Once connected,
    later loaders (another ``master_port``) reuse the client."""
    client = current_client()
    if client is not None:
        if client.graph_name != ref.graph_name:
            raise InvalidRequestError(
                f"this process is connected to graph {client.graph_name!r}, not {ref.graph_name!r}"
            )
        return
    rank, world = _context_of(ctx, ref)
    if master_addr is None or master_port is None:
        raise InvalidRequestError("from_partition() stores need master_addr= and master_port= on the loader")
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    wait = DEFAULT_MEET_TIMEOUT if timeout is None else float(timeout)
    store = TCPStore(
        str(master_addr), int(master_port), world, rank == 0,
        timeout=datetime.timedelta(seconds=wait), wait_for_workers=False,
    )  # fmt: skip
    _HOSTED.stores.append(store)  # rank 0's store must outlive every node's reads
    if rank == 0:
        store.set("asyncgraph/secret", secrets.token_hex(32))
    secret = store.get("asyncgraph/secret")
    master = str(master_addr)
    host = "127.0.0.1" if is_loopback(master) else (source_address(master) or "0.0.0.0")
    addr = _serve(ref, host, secret, world, wait)
    logger.info("partition %d served at %s:%d", ref.part_id, *addr)
    store.set(f"asyncgraph/server/{ref.part_id}", f"{addr[0]} {addr[1]}")
    keys = [f"asyncgraph/server/{p}" for p in range(ref.num_parts)]
    store.wait(keys)
    ip_config = _HOSTED.dir() / "ip_config.txt"
    ip_config.write_text("".join(store.get(k).decode() + "\n" for k in keys))
    initialize(ip_config, secret=secret, connect_timeout=wait)
