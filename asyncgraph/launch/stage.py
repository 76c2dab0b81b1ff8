"""``python -m asyncgraph.launch.stage``: copy each partition to the host that serves it, verified.

Partition ``p`` goes to the host on line ``p`` of the ip_config (the order servers and trainers
read it in), together with the partition JSON and a SHA-256 manifest, under ``--dest`` on that
host; a host serving several partitions gets all of them, and no host gets a partition it does
not serve. Loopback and this machine's own names are copied in Python; other hosts with
``rsync`` over ``ssh`` (``scp`` when rsync is not installed here), key-based and
non-interactive like ``asyncgraph.launch``.

The manifest (``<config stem>.sha256``, ``sha256sum`` format, paths relative to the config) is
written next to the source config and copied with it. After copying, the destination recomputes
every checksum (locally in Python, remotely with ``sha256sum`` over ssh) and any difference fails
the run. ``sha256sum -c --ignore-missing <stem>.sha256`` re-checks a staged copy later.

Only regular files inside the partitioning are staged: a partition folder or ID mapping file
that is not a plain relative path, or a symbolic link anywhere in a partition folder, is refused
before anything is copied (``stage_files.py``), and copies never follow links.

Exit status: 0 staged and verified; 1 a copy or ssh command failed; 2 a bad partition config or
ip_config, a missing source file, a path leaving the partitioning, a link, or a checksum
mismatch. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from asyncgraph.cli import Parser, configure_logging, one_line
from asyncgraph.client.ipconfig import IpConfig
from asyncgraph.launch.stage_files import (
    StageError,
    build_manifest,
    check_part_path,
    compare,
    manifest_name,
    mapping_files,
    parse_sha256sum,
    part_files,
    sha256_file,
    write_manifest,
)
from asyncgraph.partition.config import PartitionConfig

__all__ = ["StageError", "build_manifest", "is_local_host", "main", "plan", "stage"]

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new")
#: Remote destinations are passed through the remote shell by scp (and old rsync): keep them plain.
_SAFE_REMOTE_PATH = re.compile(r"^/[A-Za-z0-9_./@%+=,-]*$")


@dataclass(frozen=True)
class HostPlan:
    """What one host receives: its partitions' folders (relative to the config's folder)."""

    host: str
    part_ids: tuple[int, ...]
    part_paths: tuple[str, ...]
    local: bool

    def target(self, user: str | None) -> str:
        """The ssh target, ``[user@]host`` (IPv6 addresses need no brackets for ssh)."""
        return f"{user}@{self.host}" if user else self.host

    def copy_target(self, user: str | None, path: PurePosixPath) -> str:
        """``[user@]host:path`` for rsync/scp, which need IPv6 addresses in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{user}@{host}:{path}" if user else f"{host}:{path}"


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine: a loopback address or this machine's own name."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    return host in {"localhost", socket.gethostname(), socket.getfqdn()}


def plan(config: PartitionConfig, ip_config: IpConfig) -> list[HostPlan]:
    """Group partitions by the host serving them (line ``p`` of the ip_config serves ``p``)."""
    hosts = [host for host, _ in ip_config.addresses()]
    if len(hosts) != config.num_parts or len(config.parts) != config.num_parts:
        raise StageError(
            f"the ip_config lists {len(hosts)} servers for {config.num_parts} partitions "
            "(one line per partition, in partition order)",
            2,
        )
    by_host: dict[str, list[int]] = {}
    for name in (config.orig_nids, config.orig_eids):
        if name:
            check_part_path(name, -1, "the ID mapping file")
    for part_id, host in enumerate(hosts):
        if config.parts[part_id].part_id != part_id:
            raise StageError(f"partition entry {part_id} has part_id {config.parts[part_id].part_id}", 2)
        check_part_path(config.parts[part_id].path, part_id)
        by_host.setdefault(host, []).append(part_id)
    return [
        HostPlan(
            host,
            tuple(ids),
            tuple(config.parts[i].path for i in ids),
            is_local_host(host),
        )
        for host, ids in by_host.items()
    ]


def host_files(config_path: Path, config: PartitionConfig, host: HostPlan) -> list[str]:
    """The files one host must end up with: the config, its ID mappings and its partitions' files."""
    names = [config_path.name, *mapping_files(config_path, config)]
    for part_id in host.part_ids:
        names += part_files(config_path, config, part_id)
    return names


class Stager:
    """Runs (or, dry, prints) the copy and verify steps for each host."""

    def __init__(
        self,
        config_path: Path,
        config: PartitionConfig,
        dest: Path,
        *,
        ssh_user: str | None = None,
        dry_run: bool = False,
        transfer: str | None = None,
        ssh_options: Sequence[str] = (),
    ) -> None:
        self.config_path = config_path
        #: ssh's options here, then the user's (``-o Port=N`` form: scp spells ``-p`` ``-P``)
        self.ssh_options = (*SSH_OPTIONS, *ssh_options)
        self.config = config
        self.dest = dest
        self.ssh_user = ssh_user
        self.dry_run = dry_run
        self.transfer = transfer or ("rsync" if shutil.which("rsync") else "scp")
        self.src_root = config_path.parent
        self.manifest_file = self.src_root / manifest_name(config_path)

    def say(self, line: str) -> None:
        print(line, flush=True)

    def run(self, argv: Sequence[str], what: str) -> str:
        """Run a command (or print it when dry); fail with status 1 naming ``what``."""
        if self.dry_run:
            self.say(shlex.join(argv))
            return ""
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise StageError(f"{what}: cannot run {argv[0]}: {exc.strerror}", 1) from None
        if done.returncode != 0:
            detail = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
            raise StageError(f"{what} failed: {detail}", 1)
        return done.stdout

    # --- local ------------------------------------------------------------------------------
    def stage_local(self, host: HostPlan, manifest: dict[str, str]) -> None:
        dest = self.dest.resolve() if not self.dry_run else self.dest
        if self.dry_run:
            parts = ", ".join(host.part_paths)
            self.say(
                f"# {host.host} is this machine: copy {self.config_path.name}, {parts} and the "
                f"manifest from {self.src_root} to {dest} in Python, then verify SHA-256 there"
            )
            return
        if dest == self.src_root.resolve():  # staging onto the source itself: nothing to copy
            self.say(f"{host.host}: {dest} is the source folder; verifying only")
        else:
            try:
                dest.mkdir(parents=True, exist_ok=True)
                for path in host.part_paths:  # links were refused (part_files); none is followed
                    shutil.copytree(self.src_root / path, dest / path, symlinks=True, dirs_exist_ok=True)
                shutil.copy2(self.config_path, dest / self.config_path.name)
                for name in mapping_files(self.config_path, self.config):
                    (dest / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(self.src_root / name, dest / name)
                shutil.copy2(self.manifest_file, dest / self.manifest_file.name)
            except OSError as exc:
                raise StageError(f"{host.host}: copy to {dest} failed: {exc}", 1) from None
        expected = {n: manifest[n] for n in host_files(self.config_path, self.config, host)}
        found = {n: sha256_file(dest / n) for n in expected if (dest / n).is_file()}
        compare(host.host, expected, found)
        self.say(f"{host.host}: partitions {_ids(host)} staged to {dest}, {len(expected)} files verified")

    # --- remote -----------------------------------------------------------------------------
    def ssh(self, host: HostPlan, command: str) -> list[str]:
        return ["ssh", *self.ssh_options, host.target(self.ssh_user), command]

    def copy_argv(self, host: HostPlan, src: Path, dest_rel: str, is_dir: bool) -> list[str]:
        remote = host.copy_target(self.ssh_user, PurePosixPath(self.dest, dest_rel))
        if self.transfer == "rsync":
            # -r recursive, -t times (so a re-run skips unchanged files); links are refused before
            # (part_files), and without -L or -l rsync would skip one rather than follow it
            # --partial keeps half-sent big files for the next run; a trailing / copies the contents.
            ssh = shlex.join(["ssh", *self.ssh_options])
            source = f"{src}/" if is_dir else str(src)
            return ["rsync", "-rt", "--partial", "-e", ssh, source, remote + ("/" if is_dir else "")]
        # scp -r copies a folder into an existing one as a subfolder: copy to its parent.
        if is_dir:
            remote = host.copy_target(self.ssh_user, PurePosixPath(self.dest, dest_rel).parent)
        return ["scp", "-p", *self.ssh_options, *(["-r"] if is_dir else []), str(src), remote]

    def stage_remote(self, host: HostPlan, manifest: dict[str, str], names: list[str]) -> None:
        if not _SAFE_REMOTE_PATH.match(str(self.dest)):
            raise StageError(
                f"--dest {self.dest} for remote host {host.host}: use an absolute path without spaces "
                "or shell characters",
                2,
            )
        dirs = [str(self.dest)] + [str(self.dest / p) for p in host.part_paths]
        what = f"{host.host}: creating {self.dest}"
        self.run(self.ssh(host, "mkdir -p -- " + " ".join(shlex.quote(d) for d in dirs)), what)
        for path in host.part_paths:
            argv = self.copy_argv(host, self.src_root / path, path, is_dir=True)
            self.run(argv, f"{host.host}: copying {path}")
        for file in (self.config_path, self.manifest_file):
            self.run(self.copy_argv(host, file, file.name, is_dir=False), f"{host.host}: copying {file.name}")
        for name in mapping_files(self.config_path, self.config):
            argv = self.copy_argv(host, self.src_root / name, name, is_dir=False)
            self.run(argv, f"{host.host}: copying {name}")
        # Recompute on the destination; sha256sum prints "<hex>  <name>" for each file it can read
        # and exits 1 if any is missing, which compare() then names (so do not fail on its status).
        command = f"cd {shlex.quote(str(self.dest))} && sha256sum -- " + " ".join(map(shlex.quote, names))
        argv = self.ssh(host, command + " || true")
        output = self.run(argv, f"{host.host}: verifying checksums")
        if self.dry_run:
            return
        compare(host.host, {n: manifest[n] for n in names}, parse_sha256sum(output))
        self.say(f"{host.host}: partitions {_ids(host)} staged to {self.dest}, {len(names)} files verified")

    def stage(self, hosts: list[HostPlan]) -> None:
        if self.dry_run:  # list the files (so missing ones still fail) but hash nothing
            manifest = {n: "" for h in hosts for n in host_files(self.config_path, self.config, h)}
            self.say(f"# write the SHA-256 manifest {self.manifest_file}")
        else:
            manifest = build_manifest(self.config_path, self.config)
            try:
                write_manifest(self.manifest_file, manifest)
            except OSError as exc:
                raise StageError(
                    f"cannot write the manifest {self.manifest_file}: {exc.strerror}", 2
                ) from None
        for host in hosts:
            if host.local:
                self.stage_local(host, manifest)
            else:
                self.stage_remote(host, manifest, host_files(self.config_path, self.config, host))


def _ids(host: HostPlan) -> str:
    return ",".join(map(str, host.part_ids))


def stage(
    part_config: Path,
    ip_config: Path,
    dest: Path,
    *,
    ssh_user: str | None = None,
    dry_run: bool = False,
    transfer: str | None = None,
    ssh_options: Sequence[str] = (),
) -> None:
    """Stage every partition to its host and verify it; raises ``StageError`` on failure.

    ``ssh_options`` go to every ssh, rsync's ssh and scp (``-o Port=2222``, ``-i KEY``...)."""
    try:
        config = PartitionConfig.load(part_config)
    except FileNotFoundError:
        raise StageError(f"partition config {part_config} does not exist", 2) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "document"
        raise StageError(f"partition config {part_config} is invalid: {where}: {first['msg']}", 2) from None
    except (OSError, ValueError) as exc:
        raise StageError(f"partition config {part_config}: {exc}", 2) from None
    try:
        ips = IpConfig.load(ip_config)
    except FileNotFoundError:
        raise StageError(f"ip_config {ip_config} does not exist", 2) from None
    except (OSError, ValueError) as exc:
        raise StageError(f"ip_config: {exc}".splitlines()[0], 2) from None
    hosts = plan(config, ips)
    stager = Stager(
        part_config.absolute(),
        config,
        dest,
        ssh_user=ssh_user,
        dry_run=dry_run,
        transfer=transfer,
        ssh_options=ssh_options,
    )
    stager.stage(hosts)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m asyncgraph.launch.stage", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--part-config", type=Path, required=True, help="partition JSON file")
    parser.add_argument("--ip-config", type=Path, required=True, help="servers in partition order")
    parser.add_argument("--dest", type=Path, required=True, help="folder on every host (absolute)")
    parser.add_argument(
        "--ssh-user", "--ssh-username", help="user for ssh/rsync to remote hosts (default: ssh's)"
    )
    parser.add_argument("--ssh-port", type=int, help="ssh port of the remote hosts (default: ssh's)")
    parser.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPTS",
        help="extra ssh arguments, split like a shell does (repeatable), as the launcher takes them",
    )
    parser.add_argument("--transfer", choices=["rsync", "scp"], help="default: rsync if installed")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, copy nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, "stage")
    if not args.dest.is_absolute():
        print(f"stage: --dest {args.dest} must be an absolute path", file=sys.stderr)
        return 2
    try:
        options = [word for value in args.ssh_option for word in shlex.split(value)]
    except ValueError as exc:
        print(f"stage: --ssh-option: {exc}", file=sys.stderr)
        return 2
    if args.ssh_port is not None:
        if not 0 < args.ssh_port < 65536:
            print(f"stage: --ssh-port {args.ssh_port} is not a port", file=sys.stderr)
            return 2
        options = ["-o", f"Port={args.ssh_port}", *options]
    try:
        stage(
            args.part_config,
            args.ip_config,
            args.dest,
            ssh_user=args.ssh_user,
            dry_run=args.dry_run,
            transfer=args.transfer,
            ssh_options=options,
        )
    except StageError as exc:
        print(f"stage: {exc}", file=sys.stderr)
        return exc.status
    except OSError as exc:  # e.g. an unreadable source file while hashing
        print(f"stage: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
