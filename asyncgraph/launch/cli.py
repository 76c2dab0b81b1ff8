"""``python -m asyncgraph.launch``: the launcher's command line (see :mod:`asyncgraph.launch.launcher`
for what it does with the processes it starts)."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path

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
from asyncgraph.launch.launcher import Launcher, LaunchError, Proc, Signalled, raise_signalled
from asyncgraph.launch.processes import (
    LOCAL_HOSTS,
    OMP_ENV,
    free_port,
    local_cores,
    omp_threads,
    parse_gpus,
    replica_args,
    server_argv,
    ssh_argv,
)
from asyncgraph.partition.config import PartitionConfig

_DESCRIPTION = "Start servers and trainers, locally or over ssh."


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m asyncgraph.launch", description=_DESCRIPTION)
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
    previous = {sig: signal.signal(sig, raise_signalled) for sig in (signal.SIGTERM, signal.SIGHUP)}
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
    except Signalled as exc:
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
