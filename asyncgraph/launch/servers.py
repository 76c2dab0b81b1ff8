"""Start local servers for a partition config on ephemeral loopback ports (``spawn_trainers``,
tests, benchmarks, examples).

``start_servers(part_config, workdir, num_parts=2)`` starts one ``python -m asyncgraph.server``
per partition with the launcher's command line, waits for their ready files and returns a
:class:`ServerGroup` that stops only the processes it started. The servers import the same
``asyncgraph`` as the caller (its parent folder leads their ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from asyncgraph.launch.lifeline import die_with_parent
from asyncgraph.launch.processes import ServerExitedError, replica_args, server_argv, wait_ready_files

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def subprocess_env() -> dict[str, str]:
    """This environment with ``PYTHONPATH`` led by the folder holding this ``asyncgraph``."""
    rest = os.environ.get("PYTHONPATH")
    path = str(PACKAGE_ROOT) if not rest else f"{PACKAGE_ROOT}{os.pathsep}{rest}"
    return {**os.environ, "PYTHONPATH": path}


@dataclass
class ServerGroup:
    """Server processes started by :func:`start_servers`, one per partition, and their addresses."""

    procs: list[subprocess.Popen[bytes]]
    addresses: list[tuple[str, int]]
    workdir: Path
    secret: bytes | None = None
    logs: list[Path] = field(default_factory=list)
    argvs: list[list[str]] = field(default_factory=list)
    ready_files: list[Path] = field(default_factory=list)
    #: Every process's bound address: the primaries (``addresses``), then the replicas.
    bound: list[tuple[str, int]] = field(default_factory=list)

    def ip_config(self) -> Path:
        """Write ``ip_config.txt`` (one ``host port`` per line) into the work folder."""
        path = self.workdir / "ip_config.txt"
        path.write_text("".join(f"{h} {p}\n" for h, p in self.addresses))
        return path

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to server ``index`` and wait for it to exit."""
        proc = self.procs[index]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def restart(self, index: int, timeout: float = 60.0) -> None:
        """Start server ``index`` again (after it died or was killed) on the port it had."""
        proc = self.procs[index]
        if proc.poll() is None:
            raise RuntimeError(f"server {index} is still running")
        argv = list(self.argvs[index])
        argv[argv.index("--port") + 1] = str(self.bound[index][1])
        ready = self.ready_files[index]
        ready.unlink(missing_ok=True)
        with open(self.logs[index], "ab") as fh:
            self.procs[index] = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, env=subprocess_env()
            )
        try:
            wait_ready_files([self.procs[index]], [ready], timeout)
        except (ServerExitedError, TimeoutError) as exc:
            raise RuntimeError(f"restarting server {index}: {exc}:\n{self.log_text(index)}") from None

    def stop(self) -> None:
        """SIGTERM every live server, SIGKILL those still running after 10 s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def log_text(self, index: int) -> str:
        """What server ``index`` printed so far."""
        return self.logs[index].read_text(errors="replace")


def start_servers(
    part_config: Path,
    workdir: Path,
    *,
    num_parts: int,
    num_clients: int = 1,
    secret: bytes | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 60.0,
    ports: list[int] | None = None,
    num_servers: int = 1,
) -> ServerGroup:
    """Start one server per partition on 127.0.0.1 and wait until each is ready.

    ``ports`` binds partition ``p`` to ``ports[p]`` (for clients told the addresses before the
    servers start); by default every server picks a free port. ``num_servers > 1`` adds that
    many processes per partition less one, as replicas of its server (``procs[num_parts:]``,
    partition by partition); ``addresses`` stays the primaries'.
    """
    if ports is not None and len(ports) != num_parts:
        raise ValueError(f"{len(ports)} ports given for {num_parts} partitions")
    if num_servers < 1:
        raise ValueError(f"num_servers must be at least 1, got {num_servers}")
    workdir.mkdir(parents=True, exist_ok=True)
    secret_file = None
    if secret is not None:
        secret_file = workdir / "secret"
        secret_file.write_bytes(secret)
    env = subprocess_env()
    group = ServerGroup([], [], workdir, secret)

    def spawn(name: str, argv: list[str], ready: Path) -> None:
        log = workdir / f"{name}.log"
        group.ready_files.append(ready)
        group.logs.append(log)
        group.argvs.append(argv)
        with open(log, "wb") as fh:
            group.procs.append(
                subprocess.Popen(
                    argv,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    preexec_fn=die_with_parent(signal.SIGTERM),  # a killed test run leaves no server
                )
            )

    def wait(first: int) -> list[tuple[str, int]]:
        try:
            return wait_ready_files(group.procs[first:], group.ready_files[first:], timeout)
        except ServerExitedError as exc:
            raise RuntimeError(f"{exc}:\n{group.log_text(first + exc.index)}") from None
        except TimeoutError as exc:
            logs = "\n".join(group.log_text(i) for i in range(len(group.procs)))
            raise RuntimeError(f"{exc}:\n{logs}") from None

    try:
        for part_id in range(num_parts):
            ready = workdir / f"ready{part_id}.json"
            ready.unlink(missing_ok=True)
            argv = server_argv(
                part_config,
                part_id,
                ready,
                port=ports[part_id] if ports is not None else 0,
                num_clients=num_clients,
                secret_file=secret_file,
                extra_args=extra_args or (),
            )
            spawn(f"server{part_id}", argv, ready)
        group.addresses = wait(0)
        group.bound = list(group.addresses)
        for part_id in range(num_parts):
            for k in range(1, num_servers):
                ready = workdir / f"ready{part_id}.{k}.json"
                ready.unlink(missing_ok=True)
                argv = server_argv(
                    part_config,
                    part_id,
                    ready,
                    num_clients=num_clients,
                    secret_file=secret_file,
                    extra_args=replica_args(extra_args or ()),
                    replica_of=group.addresses[part_id],
                )
                spawn(f"server{part_id}.{k}", argv, ready)
        if num_servers > 1:
            group.bound += wait(num_parts)
    except BaseException:
        group.stop()
        raise
    return group


def shm_entries() -> set[str]:
    """Entries in /dev/shm that look like ours (there should never be any: servers use memfds)."""
    try:
        return {name for name in os.listdir("/dev/shm") if "asyncgraph" in name}
    except FileNotFoundError:
        return set()
