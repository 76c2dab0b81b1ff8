"""``python -m asyncgraph.launch``: start servers and trainers, locally or over ssh.

Locally it starts one server per partition on 127.0.0.1 (ephemeral ports, a fresh shared
secret), waits until each has written its ready file, then starts ``num_trainers`` trainers per
partition with everything ``asyncgraph.initialize`` and ``torch.distributed`` need in their
environment. Every line a process prints is prefixed with its role and rank. When a process
fails, on Ctrl-C, or when every trainer has finished, it stops every process it started and exits
with the failing process's status in the shell's convention (128 + N for a process killed by
signal N; 0 when all trainers succeeded); SIGINT, SIGTERM and SIGHUP of the launcher stop
everything and exit 130, 143 and 129.

No orphans (``asyncgraph.lifeline``): every child gets a parent-death signal (SIGTERM) and a
watchdog process holds a pipe from the launcher, so even a SIGKILLed launcher takes its servers,
trainers and their children down within the grace period, and the launch directory (secret,
ready files, ip_config) is removed when the job ends however it ends.
Unless ``OMP_NUM_THREADS`` is set, each trainer gets ``OMP_NUM_THREADS`` = its host's cores /
trainers on that host (at least 1), as torchrun does, so co-located trainers do not
oversubscribe the cores.

With ``--num-gpus-per-host N`` (or ``auto``: ``torch.cuda.device_count()`` on this host) there
is one trainer per GPU: ``N`` trainers per partition (one partition per host, as DGL deploys),
trainer ``LOCAL_RANK`` uses ``cuda:LOCAL_RANK``, and ``ASYNCGRAPH_DDP_BACKEND=nccl``; otherwise
trainers get ``cpu`` and ``gloo``. ``auto`` on a host without GPUs is an error (use
``--num-trainers`` for CPU trainers).

With ``--ip-config`` naming other hosts, servers and trainers are started there with ``ssh``
(key-based, non-interactive), in the same working directory; the secret file must be reachable
at the same path on every host (a shared file system, as DGL's launcher assumes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from asyncgraph.cli import CliError, Parser, configure_logging, part_config_checked, run_main
from asyncgraph.client.ipconfig import IpConfig
from asyncgraph.env import (
    ENV_DDP_BACKEND,
    ENV_DEVICE,
    ENV_IP_CONFIG,
    ENV_PART_CONFIG,
    ENV_RECONNECT_WINDOW,
    ENV_SECRET_FILE,
)
from asyncgraph.lifeline import die_with_parent, exit_status
from asyncgraph.partition.config import PartitionConfig
from asyncgraph.processes import (
    LOCAL_HOSTS,
    OMP_ENV,
    ServerExitedError,
    free_port,
    local_cores,
    omp_threads,
    parse_gpus,
    replica_args,
    server_argv,
    ssh_argv,
    wait_ready_files,
)


@dataclass
class Proc:
    """A process the launcher started."""

    role: str
    rank: int
    popen: subprocess.Popen[bytes]
    pumps: list[threading.Thread] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def poll(self) -> int | None:
        """The exit status once it has exited (noting when), else None."""
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}"


class Launcher:
    """Owns every process it starts and stops them all on the way out."""

    def __init__(self, *, ready_timeout: float = 60.0, grace: float = 5.0) -> None:
        self.procs: list[Proc] = []
        self.ready_timeout = ready_timeout
        self.grace = grace
        self._print_lock = threading.Lock()
        self._watchdog: subprocess.Popen[bytes] | None = None

    # --- the watchdog ----------------------------------------------------------------------
    def start_watchdog(self, launch_dir: Path) -> None:
        """Start the process that cleans up after us if we die (see ``asyncgraph.lifeline``)."""
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncgraph.lifeline",
                "--dir",
                str(launch_dir),
                "--grace",
                str(self.grace),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or hang-up of our group must not take it first
        )

    def _tell_watchdog(self, line: str) -> None:
        dog = self._watchdog
        if dog is not None and dog.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                dog.stdin.write(line.encode() + b"\n")
                dog.stdin.flush()

    def stop_watchdog(self) -> None:
        """We cleaned up ourselves: tell the watchdog so and let it go."""
        dog = self._watchdog
        if dog is None:
            return
        self._tell_watchdog("done")
        with contextlib.suppress(OSError, ValueError):
            assert dog.stdin is not None
            dog.stdin.close()
        try:
            dog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            dog.kill()
            dog.wait(timeout=5)
        self._watchdog = None

    # --- processes -------------------------------------------------------------------------
    def spawn(self, role: str, rank: int, argv: Sequence[str], env: dict[str, str]) -> Proc:
        popen = subprocess.Popen(
            list(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so we can stop its children too
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        self._tell_watchdog(f"pgid {popen.pid}")
        proc = Proc(role, rank, popen)
        for stream, sink in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
            assert stream is not None
            pump = threading.Thread(target=self._pump, args=(proc.label, stream, sink), daemon=True)
            pump.start()
            proc.pumps.append(pump)
        self.procs.append(proc)
        return proc

    def _pump(self, label: str, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._print_lock:
                print(f"[{label}] {line}", file=sink, flush=True)
        stream.close()

    def stop_all(self) -> None:
        """SIGTERM every live process group we started, then SIGKILL after a grace period."""
        live = [p for p in self.procs if p.popen.poll() is None]
        for proc in live:
            _signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for proc in live:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.popen, signal.SIGKILL)
                proc.popen.wait(timeout=5)
        for proc in self.procs:
            proc.poll()
            for pump in proc.pumps:
                pump.join(timeout=2)

    def summary(self) -> list[str]:
        """One line per role: how many, their exit statuses (negative: killed by that signal,
        -15 is the launcher's SIGTERM at the end) and wall time from first start to last exit."""
        lines = []
        for role in dict.fromkeys(p.role for p in self.procs):
            procs = [p for p in self.procs if p.role == role]
            codes = [p.popen.returncode for p in procs]
            ends = [p.ended for p in procs if p.ended is not None]
            wall = (max(ends) if ends else time.monotonic()) - min(p.started for p in procs)
            failed = sum(1 for c in codes if c not in (0, -signal.SIGTERM, None))
            shown = " ".join("?" if c is None else str(c) for c in codes)
            lines.append(
                f"role={role} count={len(procs)} exit_codes={shown.replace(' ', ',')} "
                f"failed={failed} wall_s={wall:.1f}"
            )
        return lines

    # --- waiting ---------------------------------------------------------------------------
    def wait_ready(self, servers: list[Proc], ready_files: list[Path]) -> list[tuple[str, int]]:
        try:
            return wait_ready_files([p.popen for p in servers], ready_files, self.ready_timeout)
        except ServerExitedError as exc:
            status = exit_status(exc.status)
            raise LaunchError(
                f"{servers[exc.index].label} exited with status {status} before it was ready", status or 1
            ) from None
        except TimeoutError as exc:
            raise LaunchError(str(exc), 1) from None

    def wait_trainers(
        self,
        trainers: list[Proc],
        servers: list[Proc],
        restart: Callable[[int], Proc] | None = None,
        restarts: int = 0,
    ) -> int:
        """Block until all trainers end (0) or one fails / a server dies (its status).

        With ``restart`` and ``restarts > 0``, a dead server is started again (``restart(i)``
        returns it once ready) up to ``restarts`` times in all, instead of stopping the job.
        """
        remaining = set(range(len(trainers)))
        while remaining:
            for i in sorted(remaining):
                code = trainers[i].poll()
                if code is None:
                    continue
                remaining.discard(i)
                if code != 0:
                    code = exit_status(code)
                    self._say(f"{trainers[i].label} failed with status {code}; stopping every process")
                    return code
            for index, proc in enumerate(servers):
                code = proc.poll()
                if code is not None and remaining:
                    if restart is not None and restarts > 0:
                        restarts -= 1
                        self._say(f"{proc.label} exited with status {code}; restarting it from its state")
                        servers[index] = restart(index)
                        continue
                    code = exit_status(code)
                    self._say(f"{proc.label} exited with status {code} while trainers ran; stopping")
                    return code or 1
            time.sleep(0.05)
        return 0

    def _say(self, message: str) -> None:
        with self._print_lock:
            print(f"[launcher] {message}", file=sys.stderr, flush=True)


class LaunchError(RuntimeError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Signalled(BaseException):
    """The launcher received a terminating signal (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise _Signalled(signum)


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m asyncgraph.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part-config", type=Path, required=True, help="partition JSON written by partition_graph"
    )
    parser.add_argument("--num-trainers", type=int, default=None, help="trainers per partition (default 1)")
    parser.add_argument(
        "--num-gpus-per-host",
        default=None,
        help="one trainer per GPU: a count or 'auto' (torch.cuda.device_count() here); sets nccl",
    )
    parser.add_argument(
        "--num-servers",
        type=int,
        default=1,
        help="server processes per partition (DGL's num_servers): the first loads the partition, "
        "the others are replicas on its host that map its memory and share its reads and pushes",
    )
    parser.add_argument(
        "--ip-config", type=Path, help="servers' hosts (and ports) in partition order; default local"
    )
    parser.add_argument("--secret-file", type=Path, help="shared secret (default: a fresh random one)")
    parser.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds to wait for every server's ready file"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter for the servers")
    parser.add_argument("--server-arg", action="append", default=[], help="extra argument for every server")
    parser.add_argument(
        "--restart-servers",
        type=int,
        default=0,
        metavar="N",
        help="restart a dead server (on its port, from its --state-dir) up to N times in all "
        "instead of stopping the job; needs --server-arg=--state-dir=DIR. Replicas "
        "(--num-servers > 1) exit when their primary dies and count as restarts too",
    )
    parser.add_argument(
        "--reconnect-window",
        type=float,
        default=60.0,
        help="with --restart-servers: seconds trainers keep reconnecting to a restarting server",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer command")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Start everything, wait, stop everything; bad arguments: one line on stderr and status 2."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, "launch")
    return run_main(PROG, lambda: _launch(args))


PROG = "python -m asyncgraph.launch"


def _launch(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise CliError("give the trainer command after --")
    if args.num_servers < 1:
        raise CliError(f"--num-servers {args.num_servers}: at least one server per partition")
    try:
        gpus = parse_gpus(args.num_gpus_per_host)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if gpus is not None and args.num_trainers not in (None, gpus):
        raise CliError(
            f"--num-trainers {args.num_trainers} contradicts --num-gpus-per-host {gpus} (one trainer per GPU)"
        )
    num_trainers = gpus if gpus is not None else (1 if args.num_trainers is None else args.num_trainers)
    if num_trainers < 1:
        raise CliError("--num-trainers must be at least 1")
    if args.restart_servers < 0:
        raise CliError("--restart-servers must be at least 0")
    if args.restart_servers and not any(a.startswith("--state-dir") for a in args.server_arg):
        raise CliError(
            "--restart-servers needs servers with a state folder (--server-arg=--state-dir=DIR): "
            "a server restarted without one comes back without the job's tensors"
        )
    part_config = args.part_config.resolve()
    config: PartitionConfig = part_config_checked(part_config)
    num_parts = config.num_parts
    world_size = num_parts * num_trainers
    hosts: list[tuple[str, int]]
    if args.ip_config is not None:
        if not args.ip_config.is_file():
            raise CliError(f"--ip-config {args.ip_config} does not exist")
        hosts = IpConfig.load(args.ip_config).addresses()
        if len(hosts) != num_parts:
            raise CliError(f"{args.ip_config} lists {len(hosts)} servers for {num_parts} partitions")
    else:
        hosts = [("127.0.0.1", 0)] * num_parts
    if args.secret_file is not None and not args.secret_file.is_file():
        raise CliError(f"--secret-file {args.secret_file} does not exist")

    launcher = Launcher(ready_timeout=args.ready_timeout)
    # Remote hosts read the secret and write their ready files here, so with ssh it must be on
    # the shared file system (the working directory), not this host's /tmp.
    remote = any(host not in LOCAL_HOSTS for host, _ in hosts)
    workdir = Path(tempfile.mkdtemp(prefix=".asyncgraph-launch-", dir=os.getcwd() if remote else None))
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        launcher.start_watchdog(workdir)
        secret_file = args.secret_file
        if secret_file is None:
            secret_file = workdir / "secret"
            secret_file.write_text(secrets.token_hex(32))
            secret_file.chmod(0o600)
        base_env = dict(os.environ)
        cwd = os.getcwd()
        servers: list[Proc] = []
        ready_files: list[Path] = []

        def spawn_server(index: int, port: int) -> Proc:
            """Server ``index``: partition ``index``'s primary, or (from ``num_parts`` on) a replica."""
            part_id = index if index < num_parts else (index - num_parts) // (args.num_servers - 1)
            host = hosts[part_id][0]
            ready = ready_files[index]
            ready.unlink(missing_ok=True)
            replica_of = None
            if index >= num_parts:  # on the primary's host: reach it over loopback when remote
                primary_port = bound[part_id][1]
                replica_of = (host if host in LOCAL_HOSTS else "127.0.0.1", primary_port)
            argv_server = server_argv(
                part_config,
                part_id,
                ready,
                host=host if host in LOCAL_HOSTS else "0.0.0.0",
                port=port,
                num_clients=world_size,
                secret_file=secret_file,
                python=args.python,
                extra_args=args.server_arg if replica_of is None else replica_args(args.server_arg),
                replica_of=replica_of,
            )
            if host in LOCAL_HOSTS:
                return launcher.spawn("server", index, argv_server, base_env)
            return launcher.spawn("server", index, ssh_argv(host, argv_server, {}, cwd), base_env)

        bound: list[tuple[str, int]] = []
        for part_id, (_host, port) in enumerate(hosts):
            ready_files.append(workdir / f"server{part_id}.ready")
            servers.append(spawn_server(part_id, port))
        addresses = launcher.wait_ready(servers, ready_files)
        bound += addresses
        if args.num_servers > 1:  # replicas map their primary's memory: start them once it is up
            for index in range(num_parts, num_parts * args.num_servers):
                ready_files.append(workdir / f"server{index}.ready")
                servers.append(spawn_server(index, 0))
            bound += launcher.wait_ready(servers[num_parts:], ready_files[num_parts:])

        def restart_server(index: int) -> Proc:
            """The same server again on the port it had (a primary from its state folder), once ready."""
            ready_files[index].unlink(missing_ok=True)  # the dead one's: wait for the new one's
            proc = spawn_server(index, bound[index][1])
            launcher.wait_ready([proc], [ready_files[index]])
            return proc

        if args.ip_config is not None:  # remote servers bind 0.0.0.0; trainers use the configured host
            addresses = [(h, p) for (h, _), (_, p) in zip(hosts, addresses, strict=True)]
        ip_config = workdir / "ip_config.txt"
        ip_config.write_text(IpConfig.parse("\n".join(f"{h} {p}" for h, p in addresses)).dump())
        master_addr = hosts[0][0] if hosts[0][0] not in LOCAL_HOSTS else "127.0.0.1"
        master_port = free_port()
        trainer_hosts = [hosts[rank // num_trainers][0] for rank in range(world_size)]
        local_count = sum(h in LOCAL_HOSTS for h in trainer_hosts)
        user_omp = OMP_ENV in base_env
        local_omp = str(omp_threads(local_cores(), local_count))
        if not user_omp and local_count:
            print(
                f"[launcher] {OMP_ENV}={local_omp} for each of {local_count} trainers on this host "
                f"({local_cores()} cores; set {OMP_ENV} to choose)",
                file=sys.stderr,
                flush=True,
            )
        trainers: list[Proc] = []
        for rank in range(world_size):
            part_id = rank // num_trainers
            local_rank = rank % num_trainers
            host = hosts[part_id][0]
            env = {
                ENV_IP_CONFIG: str(ip_config),
                ENV_SECRET_FILE: str(secret_file),
                ENV_PART_CONFIG: str(part_config),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(local_rank),
                ENV_DDP_BACKEND: "nccl" if gpus is not None else "gloo",
                ENV_DEVICE: f"cuda:{local_rank}" if gpus is not None else "cpu",
                "ASYNCGRAPH_ROLE": "trainer",
                "ASYNCGRAPH_PART_ID": str(part_id),
                "PYTHONUNBUFFERED": "1",
            }
            if args.restart_servers:
                env[ENV_RECONNECT_WINDOW] = str(args.reconnect_window)
            if host in LOCAL_HOSTS:
                if not user_omp:
                    env[OMP_ENV] = local_omp
                trainers.append(launcher.spawn("trainer", rank, command, {**base_env, **env}))
            else:
                if user_omp:
                    env[OMP_ENV] = base_env[OMP_ENV]
                share = None if user_omp else trainer_hosts.count(host)
                remote_argv = ssh_argv(host, command, env, cwd, omp_share=share)
                trainers.append(launcher.spawn("trainer", rank, remote_argv, base_env))
        return launcher.wait_trainers(trainers, servers, restart_server, args.restart_servers)
    except LaunchError as exc:
        print(f"[launcher] {exc}", file=sys.stderr, flush=True)
        return exc.status
    except KeyboardInterrupt:
        print("[launcher] interrupted; stopping every process", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except _Signalled as exc:
        name = signal.Signals(exc.signum).name
        print(f"[launcher] got {name}; stopping every process", file=sys.stderr, flush=True)
        return 128 + exc.signum
    finally:
        launcher.stop_all()
        for line in launcher.summary():
            print(f"[launcher] summary {line}", file=sys.stderr, flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(workdir, ignore_errors=True)
        launcher.stop_watchdog()


if __name__ == "__main__":
    sys.exit(main())
