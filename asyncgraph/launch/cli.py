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
    ENV_HOLDER,
    ENV_HOLDER_KEY_FILE,
    ENV_IP_CONFIG,
    ENV_PART_CONFIG,
    ENV_RECONNECT_WINDOW,
    ENV_SECRET_FILE,
)
from asyncgraph.launch.launcher import Launcher, LaunchError, Proc, Signalled, raise_signalled
from asyncgraph.launch.netif import is_loopback, is_this_host, job_address, rendezvous_env
from asyncgraph.launch.processes import (
    LOCAL_HOSTS,
    OMP_ENV,
    free_port,
    local_cores,
    omp_threads,
    parse_gpus,
    plan_trainers,
    replica_args,
    server_argv,
)
from asyncgraph.launch.remote import DIR_TOKEN, Job
from asyncgraph.launch.sshcmd import SshCommand, check_env_item, forwarded_env
from asyncgraph.partition.config import PartitionConfig
from asyncgraph.protocol.handshake import holder_key

_DESCRIPTION = "Start servers and trainers, locally or over ssh."


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m asyncgraph.launch", description=_DESCRIPTION)
    parser.add_argument(
        "--part-config", type=Path, required=True, help="partition JSON written by partition_graph"
    )
    parser.add_argument(
        "--num-trainers",
        type=int,
        default=None,
        help="trainers per partition (default 1; with --num-gpus-per-host: one per GPU of each host)",
    )
    parser.add_argument(
        "--num-gpus-per-host",
        default=None,
        help="GPUs of each host, a count or 'auto' (torch.cuda.device_count() here): one trainer per "
        "GPU of each host however many partitions it serves, on cuda:LOCAL_RANK, with nccl",
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
    hosts = parser.add_argument_group("multi-host (ssh)")
    hosts.add_argument(
        "--master-addr",
        help="torch.distributed rendezvous address (default: the first trainer host of the ip_config)",
    )
    hosts.add_argument("--master-port", type=int, help="rendezvous port (default: a free one on that host)")
    hosts.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="set (or pass on from here) a variable in every server and trainer, across ssh too "
        "(DGL's --extra_envs); GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME set here always cross",
    )
    hosts.add_argument("--ssh-port", type=int, help="ssh port of the remote hosts (DGL's --ssh_port)")
    hosts.add_argument("--ssh-username", help="user on the remote hosts (DGL's --ssh_username)")
    hosts.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPTS",
        help="extra ssh arguments, split like a shell does (repeatable): --ssh-option='-i ~/.ssh/k'",
    )
    hosts.add_argument(
        "--remote-part-config",
        action="append",
        default=[],
        metavar="[HOST=]PATH",
        help="the partition JSON's path on remote hosts (staged there with python -m "
        "asyncgraph.launch.stage --dest); HOST=PATH for one host (repeatable); default: "
        "--part-config's path (a shared file system)",
    )
    hosts.add_argument(
        "--bind-all",
        action="store_true",
        help="remote servers bind 0.0.0.0 instead of the address the ip_config names",
    )
    hosts.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=10.0,
        help="seconds a remote process lives on without a heartbeat from the launcher (0: until its "
        "ssh channel closes)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer command")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Start everything, wait, stop everything; bad arguments: one line on stderr and status 2."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, "launch")
    return run_main(PROG, lambda: _launch(args))


PROG = "python -m asyncgraph.launch"


def remote_configs(
    items: list[str], part_config: Path, hosts: list[tuple[str, int]]
) -> tuple[str, dict[str, str]]:
    """``--remote-part-config`` values: the path for every remote host, and per-host paths.

    ``CliError`` for a host the ip_config does not list, a repeated host or a relative path.
    """
    default, per_host = str(part_config), {}
    named = {h for h, _ in hosts}
    for item in items:
        host, sep, path = item.rpartition("=")
        if not Path(path).is_absolute():
            raise CliError(f"--remote-part-config {item!r}: the path must be absolute")
        if not sep:
            default = path
        elif host not in named:
            raise CliError(f"--remote-part-config {item!r}: {host} is not a host of the ip_config")
        elif host in per_host:
            raise CliError(f"--remote-part-config: {host} is given twice")
        else:
            per_host[host] = path
    return default, per_host


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
    if args.num_trainers is not None and args.num_trainers < 1:
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
    for item in args.env:
        check_env_item(item)
    if args.heartbeat_timeout < 0:
        raise CliError("--heartbeat-timeout must be at least 0 (0: no heartbeat)")
    if args.ssh_port is not None and not 0 < args.ssh_port < 65536:
        raise CliError(f"--ssh-port {args.ssh_port} is not a port")

    default_remote, per_host = remote_configs(args.remote_part_config, part_config, hosts)
    launcher = Launcher(ready_timeout=args.ready_timeout)
    local = {host: is_this_host(host) for host, _ in hosts}
    names = [host for host, _ in hosts]
    all_local = all(local.values())
    # Across hosts, bind and advertise addresses, not names: a host's own name is 127.0.1.1 on
    # Debian/Ubuntu (netif.job_address); on one host the names are fine as they are.
    address = {host: host if all_local else job_address(host, names) for host in names}
    # Trainers per host follow its GPUs, so every name of one machine counts as that machine:
    # all local names as the first, a remote name as its address.
    first_local = next((h for h in names if local[h]), "")
    machine = {h: first_local if local[h] else address[h] for h in names}
    name_of = {machine[h]: h for h in reversed(names)}  # a machine's first name in the ip_config
    try:
        slots = plan_trainers(
            [machine[h] for h in names], per_partition=args.num_trainers, gpus_per_host=gpus
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    world_size = len(slots)
    trainer_hosts = [name_of[slot.host] for slot in slots]
    ssh = SshCommand.from_args(args)
    forwarded = forwarded_env(args.env, os.environ)
    # Remote hosts get the secret, ip_config and readiness over their ssh channel: the launch
    # folder (local processes' secret and ready files) stays on this host.
    workdir = Path(tempfile.mkdtemp(prefix=".asyncgraph-launch-"))
    previous = {sig: signal.signal(sig, raise_signalled) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        launcher.start_watchdog(workdir)
        secret_file = args.secret_file
        if secret_file is None:
            secret_file = workdir / "secret"
            secret_file.write_text(secrets.token_hex(32))
            secret_file.chmod(0o600)
        try:  # it travels to remote hosts as text in the agent's job line
            secret_text = secret_file.read_bytes().decode() if not all(local.values()) else ""
        except UnicodeDecodeError:
            raise CliError(f"--secret-file {secret_file}: not text; use a hex or base64 secret") from None
        # Trainers get their holder's key, not the secret (issue 32): servers require holder keys.
        cluster_secret = secret_file.read_bytes().strip()
        server_args = [*args.server_arg, "--require-holder-keys"]
        base_env = {**os.environ, **forwarded}
        trainer_env = {**{k: v for k, v in os.environ.items() if k != ENV_SECRET_FILE}, **forwarded}
        cwd = os.getcwd()
        remote_secret, remote_ready = f"{DIR_TOKEN}/secret", f"{DIR_TOKEN}/ready.json"
        servers: list[Proc] = []

        def spawn_server(index: int, port: int) -> Proc:
            """Server ``index``: partition ``index``'s primary, or (from ``num_parts`` on) a replica."""
            part_id = index if index < num_parts else (index - num_parts) // (args.num_servers - 1)
            host = hosts[part_id][0]
            replica_of = None
            if index >= num_parts:  # on the primary's host, at the address it bound
                replica_of = ("127.0.0.1" if args.bind_all else address[host], bound[part_id][1])
            extra = server_args if replica_of is None else replica_args(server_args)
            if local[host]:
                ready = workdir / f"server{index}.ready"
                ready.unlink(missing_ok=True)
                argv_server = server_argv(
                    part_config, part_id, ready, host=address[host], port=port, num_clients=world_size,
                    secret_file=secret_file, python=args.python, extra_args=extra, replica_of=replica_of,
                )  # fmt: skip
                return launcher.spawn("server", index, argv_server, base_env, ready_file=ready)
            argv_server = server_argv(
                Path(per_host.get(host, default_remote)), part_id, Path(remote_ready),
                host="0.0.0.0" if args.bind_all else address[host],
                port=port, num_clients=world_size, secret_file=Path(remote_secret), python=args.python,
                extra_args=extra, replica_of=replica_of,
            )  # fmt: skip
            job = Job(
                argv=argv_server,
                env=forwarded,
                files={"secret": secret_text},
                ready_file="ready.json",
                grace=launcher.grace,
                heartbeat=args.heartbeat_timeout,
            )
            return launcher.spawn(
                "server", index, ssh.agent(host, cwd, args.python), base_env, remote=(host, job)
            )

        bound: list[tuple[str, int]] = []
        for part_id, (_host, port) in enumerate(hosts):
            servers.append(spawn_server(part_id, port))
        bound += launcher.wait_ready(servers)
        if args.num_servers > 1:  # replicas map their primary's memory: start them once it is up
            for index in range(num_parts, num_parts * args.num_servers):
                servers.append(spawn_server(index, 0))
            bound += launcher.wait_ready(servers[num_parts:])

        def restart_server(index: int) -> Proc:
            """The same server again on the port it had (a primary from its state folder), once ready."""
            proc = spawn_server(index, bound[index][1])
            launcher.wait_ready([proc])
            return proc

        # Trainers dial each partition's host address (a server may have bound 0.0.0.0).
        addresses = [(address[h], p) for (h, _), (_, p) in zip(hosts, bound[:num_parts], strict=True)]
        ip_config_text = IpConfig.parse("\n".join(f"{h} {p}" for h, p in addresses)).dump()
        ip_config = workdir / "ip_config.txt"
        ip_config.write_text(ip_config_text)
        master_addr = args.master_addr or hosts[0][0]
        if not all_local:
            master_addr = job_address(master_addr, names)
        elif args.master_addr is None and hosts[0][0] in LOCAL_HOSTS:
            master_addr = "127.0.0.1"
        master_local = is_this_host(master_addr)
        if args.master_port is not None:
            master_port = args.master_port
        elif master_local:
            master_port = free_port(master_addr)
        else:
            master_port = ssh.free_port(master_addr, args.python)
        local_count = sum(local[h] for h in trainer_hosts)
        user_omp = OMP_ENV in base_env
        local_omp = str(omp_threads(local_cores(), local_count))
        if not user_omp and local_count:
            print(
                f"[launcher] {OMP_ENV}={local_omp} for each of {local_count} trainers on this host "
                f"({local_cores()} cores; set {OMP_ENV} to choose)",
                file=sys.stderr,
                flush=True,
            )
        local_rendezvous = {} if is_loopback(master_addr) else rendezvous_env(master_addr, base_env)
        if local_rendezvous and local_count:
            chosen = " ".join(f"{k}={v}" for k, v in local_rendezvous.items())
            print(
                f"[launcher] trainers on this host: {chosen} (routes to {master_addr})",
                file=sys.stderr,
                flush=True,
            )
        trainers: list[Proc] = []
        for rank, (slot, host) in enumerate(zip(slots, trainer_hosts, strict=True)):
            holder = f"rank{rank}-{secrets.token_hex(4)}"
            key_hex = holder_key(cluster_secret, holder).hex()
            env = {
                ENV_HOLDER: holder,
                ENV_PART_CONFIG: str(part_config) if local[host] else per_host.get(host, default_remote),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(slot.local_rank),  # distinct on its host: its GPU's index
                "LOCAL_WORLD_SIZE": str(slot.local_world_size),
                ENV_DDP_BACKEND: "nccl" if gpus is not None else "gloo",
                ENV_DEVICE: slot.device,
                "PYTHONUNBUFFERED": "1",
            }
            if args.restart_servers:
                env[ENV_RECONNECT_WINDOW] = str(args.reconnect_window)
            if local[host]:
                key_file = workdir / f"holder-{rank}.key"
                with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                    f.write(key_hex)
                env.update({ENV_IP_CONFIG: str(ip_config), ENV_HOLDER_KEY_FILE: str(key_file)})
                if not user_omp:
                    env[OMP_ENV] = local_omp
                env.update(local_rendezvous)
                trainers.append(launcher.spawn("trainer", rank, command, {**trainer_env, **env}))
            else:
                env[ENV_IP_CONFIG] = f"{DIR_TOKEN}/ip_config.txt"
                env[ENV_HOLDER_KEY_FILE] = f"{DIR_TOKEN}/holder_key"
                if user_omp:
                    env[OMP_ENV] = base_env[OMP_ENV]
                job = Job(
                    argv=command,
                    env={**forwarded, **env},
                    files={"holder_key": key_hex, "ip_config.txt": ip_config_text},
                    rendezvous=None if is_loopback(master_addr) else master_addr,
                    omp_share=None if user_omp else slot.local_world_size,
                    grace=launcher.grace,
                    heartbeat=args.heartbeat_timeout,
                )
                agent = ssh.agent(host, cwd, args.python)
                trainers.append(launcher.spawn("trainer", rank, agent, trainer_env, remote=(host, job)))
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
