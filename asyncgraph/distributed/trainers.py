"""Trainer placement: the device and DDP backend of this trainer, and DGL's multi-GPU pattern.

``trainer_device()`` / ``ddp_backend()`` read what the launcher (or :func:`spawn_trainers`)
exported (``ASYNCGRAPH_DEVICE``, ``ASYNCGRAPH_DDP_BACKEND``), falling back to ``cuda:LOCAL_RANK``
and nccl when CUDA is available, else ``cpu`` and gloo. ``resolve_device(choice)`` turns a
trainer's ``--device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) into its device: a bare
``cuda`` is this trainer's own GPU, never every trainer's ``cuda:0``.

``spawn_trainers(fn, nprocs, part_config)`` is the tutorial's ``torch.multiprocessing.spawn``
over one machine's data: it starts one server per partition on loopback (ephemeral ports, a fresh
secret), spawns ``nprocs`` trainers with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, their device, their
holder key (not the secret: servers require holder keys, as the launcher's do) and
the servers' addresses in their environment, initialises asyncgraph and the DDP process group in
each (unless ``initialize=False``), calls ``fn(rank, *args)``, and stops every server and removes
its files afterwards, also when a trainer fails (the failure is re-raised).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from asyncgraph.env import (
    ENV_DDP_BACKEND,
    ENV_DEVICE,
    ENV_HOLDER,
    ENV_HOLDER_KEY_FILE,
    ENV_IP_CONFIG,
    ENV_PART_CONFIG,
)

__all__ = ["ddp_backend", "resolve_device", "spawn_trainers", "trainer_device"]


def ddp_backend(device: torch.device | None = None) -> str:
    """The torch.distributed backend for this trainer. Given its ``device``, the backend follows
    it: nccl on CUDA, gloo elsewhere (nccl only moves CUDA tensors; a trainer that picked its
    own GPU in a CPU launch still gets nccl). Without one: ``$ASYNCGRAPH_DDP_BACKEND`` (the
    launcher's choice), else nccl when :func:`trainer_device` is CUDA, else gloo."""
    if device is not None:
        return "nccl" if device.type == "cuda" else "gloo"
    chosen = os.environ.get(ENV_DDP_BACKEND)
    if chosen:
        return chosen
    return "nccl" if trainer_device().type == "cuda" else "gloo"


def trainer_device() -> torch.device:
    """This trainer's device: ``$ASYNCGRAPH_DEVICE``, else ``cuda:LOCAL_RANK`` (mod GPUs) or cpu."""
    chosen = os.environ.get(ENV_DEVICE)
    if chosen:
        return torch.device(chosen)
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_device(choice: str = "auto") -> torch.device:
    """The device a trainer's ``--device`` names. ``auto``: :func:`trainer_device` (the
    launcher's choice); ``cuda``: this trainer's GPU (``$ASYNCGRAPH_DEVICE`` when that is a
    CUDA device, else ``cuda:LOCAL_RANK``), so co-located trainers never share ``cuda:0``;
    anything else torch names (``cpu``, ``cuda:N``) as given; ``ValueError`` for what it does not."""
    if choice == "auto":
        return trainer_device()
    try:
        device = torch.device(choice)
    except RuntimeError:
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {choice!r}") from None
    if device.type == "cuda" and device.index is None:
        launched = os.environ.get(ENV_DEVICE, "")
        if launched.startswith("cuda:"):
            return torch.device(launched)
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _devices(device: str, nprocs: int) -> list[str]:
    """One device string per rank for ``device`` = ``auto``, ``cpu`` or ``cuda``."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if gpus > 0 else "cpu"
    if device == "cpu":
        return ["cpu"] * nprocs
    if device != "cuda":
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if gpus == 0:
        raise RuntimeError("spawn_trainers(device='cuda'): no CUDA device on this machine")
    return [f"cuda:{rank % gpus}" for rank in range(nprocs)]


def _trainer_main(
    rank: int,
    fn: Callable[..., Any],
    env: dict[str, str],
    devices: list[str],
    initialize: bool,
    args: tuple[Any, ...],
    credentials: list[dict[str, str]] | None = None,
) -> None:
    """Entry point of one spawned trainer (module level, so ``spawn`` can pickle it)."""
    os.environ.update(env)
    if credentials is not None:  # this rank's holder and key file (no cluster secret)
        os.environ.pop("ASYNCGRAPH_SECRET_FILE", None)
        os.environ.update(credentials[rank])
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), ENV_DEVICE: devices[rank]})
    if "OMP_NUM_THREADS" not in os.environ:  # the machine's cores shared among its trainers
        from asyncgraph.launch.processes import omp_threads

        torch.set_num_threads(omp_threads(os.cpu_count() or 1, len(devices)))
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not initialize:
        fn(rank, *args)
        return
    import torch.distributed as dist

    from asyncgraph.distributed import context

    context.initialize()
    try:
        dist.init_process_group(env[ENV_DDP_BACKEND], rank=rank, world_size=int(env["WORLD_SIZE"]))
        try:
            fn(rank, *args)
        finally:
            dist.destroy_process_group()
    finally:
        context.finalize()


def spawn_trainers(
    fn: Callable[..., Any],
    nprocs: int,
    part_config: str | Path,
    args: Sequence[Any] = (),
    *,
    device: str = "auto",
    initialize: bool = True,
    ready_timeout: float = 60.0,
    workdir: str | Path | None = None,
) -> None:
    """Serve ``part_config`` on this machine and run ``fn(rank, *args)`` in ``nprocs`` trainers.

    ``fn`` must be picklable (a module-level function). ``device``: ``auto`` (one GPU per rank
    when CUDA is available, else CPU), ``cpu`` or ``cuda``; the backend is nccl on CUDA, gloo on
    CPU. With ``initialize`` each trainer has called ``asyncgraph.initialize()`` and
    ``torch.distributed.init_process_group`` before ``fn`` (and tears both down after).
    """
    from torch.multiprocessing.spawn import spawn

    from asyncgraph.launch.processes import free_port
    from asyncgraph.launch.servers import start_servers
    from asyncgraph.partition.config import PartitionConfig

    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    devices = _devices(device, nprocs)
    part_config = Path(part_config).resolve()
    num_parts = PartitionConfig.load(part_config).num_parts
    own_dir = workdir is None
    folder = Path(tempfile.mkdtemp(prefix="asyncgraph-spawn-")) if workdir is None else Path(workdir)
    try:
        secret = secrets.token_hex(32).encode()
        group = start_servers(
            part_config, folder, num_parts=num_parts, num_clients=nprocs, secret=secret,
            timeout=ready_timeout, extra_args=["--require-holder-keys"],
        )  # fmt: skip
        try:
            credentials = [_holder_key_file(folder, secret, rank) for rank in range(nprocs)]
            env = {
                ENV_IP_CONFIG: str(group.ip_config()),
                ENV_PART_CONFIG: str(part_config),
                ENV_DDP_BACKEND: "nccl" if devices[0].startswith("cuda") else "gloo",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
                "WORLD_SIZE": str(nprocs),
            }
            spawn(  # type: ignore[no-untyped-call]
                _trainer_main,
                args=(fn, env, devices, initialize, tuple(args), credentials),
                nprocs=nprocs,
                join=True,
            )
        finally:
            group.stop()
    finally:
        if own_dir:
            shutil.rmtree(folder, ignore_errors=True)


def _holder_key_file(folder: Path, secret: bytes, rank: int) -> dict[str, str]:
    """Trainer ``rank``'s holder and the file (mode 600) holding its key: what it connects with
    instead of the secret, as the launcher's trainers do (issue 32)."""
    from asyncgraph.protocol.handshake import holder_key

    holder = f"rank{rank}-{secrets.token_hex(4)}"
    path = folder / f"holder-{rank}.key"
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(holder_key(secret, holder).hex())
    return {ENV_HOLDER: holder, ENV_HOLDER_KEY_FILE: str(path)}
