"""The launcher's ssh command lines and the environment that crosses them.

``ssh`` runs with ``BatchMode`` (key-based, never a prompt), ``StrictHostKeyChecking=accept-new``
and keep-alives (a silent link ends the channel within ~6 s), then the user's ``--ssh-port``,
``--ssh-username`` and ``--ssh-option`` (DGL's ``--ssh_port`` / ``--ssh_username``). Only what
``--env`` names, and ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` when set here, crosses
to remote processes besides what the launcher sets itself: ssh passes no environment.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from asyncgraph.cli import CliError
from asyncgraph.launch.launcher import LaunchError
from asyncgraph.launch.netif import IFNAME_VARS

__all__ = ["BASE_OPTIONS", "SshCommand", "check_env_item", "forwarded_env"]

BASE_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=accept-new",
    "-o", "ServerAliveInterval=2",
    "-o", "ServerAliveCountMax=3",
)  # fmt: skip
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_item(item: str) -> None:
    """``--env NAME[=VALUE]``: ``CliError`` naming the problem for a bad name."""
    name = item.split("=", 1)[0]
    if not _NAME.match(name):
        raise CliError(f"--env {item!r}: {name!r} is not a variable name")


def forwarded_env(items: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables every process gets: ``--env`` items (``NAME`` takes this environment's
    value) and the gloo/nccl interface variables set here."""
    out = {name: environ[name] for name in IFNAME_VARS if name in environ}
    for item in items:
        check_env_item(item)
        name, sep, value = item.partition("=")
        if sep:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
        else:
            raise CliError(f"--env {name}: not set here; give --env {name}=VALUE")
    return out


@dataclass(frozen=True)
class SshCommand:
    """How to reach a remote host: ``ssh`` with the base and the user's options."""

    port: int | None = None
    user: str | None = None
    options: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SshCommand:
        extra: list[str] = []
        for value in args.ssh_option:
            try:
                extra += shlex.split(value)
            except ValueError as exc:
                raise CliError(f"--ssh-option {value!r}: {exc}") from None
        return cls(args.ssh_port, args.ssh_username, tuple(extra))

    def argv(self, host: str, command: str) -> list[str]:
        """``ssh ... host command``."""
        argv = ["ssh", *BASE_OPTIONS]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        return [*argv, *self.options, host, command]

    def agent(self, host: str, cwd: str, python: str) -> list[str]:
        """The ssh command of an ``asyncgraph.launch.remote`` agent in ``cwd`` on ``host``."""
        command = f"cd {shlex.quote(cwd)} && exec {shlex.quote(python)} -m asyncgraph.launch.remote"
        return self.argv(host, command)

    def free_port(self, host: str, python: str) -> int:
        """A port free on ``host`` right now, at the address ``host`` names (the rendezvous)."""
        code = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])"
        argv = self.argv(host, shlex.join([python, "-c", code, host]))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"ssh {host}: no answer in 60 s asking for a rendezvous port", 1) from None
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            why = done.stderr.strip().splitlines()[-1:] or [f"status {done.returncode}"]
            raise LaunchError(f"ssh {host}: could not pick a rendezvous port: {why[0]}", 1)
        return int(done.stdout.strip())
