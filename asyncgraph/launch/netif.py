"""Which host is this, and which interface reaches the rendezvous: what a multi-host launch must
decide on each host rather than assume.

``torch.distributed``'s gloo and nccl advertise the address this host's *name* resolves to
unless ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name an interface. Stock Debian/Ubuntu map
the name to 127.0.1.1, so peers on other hosts dial a loopback address ("Gloo connectFullMesh
failed ... Connection refused"). :func:`rendezvous_env` picks, on the host it runs on, the
interface whose address routes to ``MASTER_ADDR``, unless the user chose one.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct

__all__ = [
    "IFNAME_VARS",
    "is_loopback",
    "is_this_host",
    "job_address",
    "rendezvous_env",
    "route_interface",
    "source_address",
]

#: The variables naming the interface gloo and nccl use (set by the user: left alone).
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_this_host(host: str) -> bool:
    """Whether ``host`` is this machine: loopback, its own name, or an address one of its
    interfaces holds (a socket can bind it)."""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            return False
    return True


def source_address(target: str, port: int = 9) -> str | None:
    """The local address this host's routing table uses to reach ``target`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(target, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            try:
                sock.connect(sockaddr)
            except OSError:
                continue
            return str(sock.getsockname()[0])
    return None


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def route_interface(target: str) -> str | None:
    """The interface holding the address that reaches ``target`` (``eth0``, ``ib0``...), or None.

    None for a loopback target (nothing to choose) or when no interface holds the address.
    """
    source = source_address(target)
    if source is None:
        return None
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(source).is_loopback:
            return None
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == source:
            return name
    return None


def job_address(host: str, peers: list[str]) -> str:
    """The address to bind and to advertise for ``host`` of a multi-host job, as this host
    resolves it: an address stays as given; a name becomes the address it resolves to, unless
    that is a loopback address (a host's own name on Debian/Ubuntu is 127.0.1.1), in which case
    it is this host's address on the route to the first of ``peers`` that is another host."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        resolved = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError):
        return host  # let the server or client report it
    if not ipaddress.ip_address(resolved).is_loopback:
        return str(resolved)
    for peer in peers:
        if not is_this_host(peer):
            source = source_address(peer)
            if source is not None and not ipaddress.ip_address(source).is_loopback:
                return source
    return str(resolved)


def rendezvous_env(master_addr: str, env: dict[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` for this host, for those ``env`` lacks:
    the interface routing to ``master_addr``. Empty when the user set both or none applies."""
    wanted = [name for name in IFNAME_VARS if name not in env]
    if not wanted:
        return {}
    ifname = route_interface(master_addr)
    return {name: ifname for name in wanted} if ifname else {}


def main(argv: list[str] | None = None) -> int:
    """``python -m asyncgraph.launch.netif [--export] HOST[,HOST...]``: the interface variables
    for this host, routing to the first listed host that is not this one (a job's node list as
    given to every node). Prints ``NAME=VALUE`` lines (``export NAME=VALUE`` with ``--export``,
    for ``eval`` in a job script) for those not already set; nothing when none applies."""
    import argparse
    import os
    import shlex

    parser = argparse.ArgumentParser(prog="python -m asyncgraph.launch.netif", description=main.__doc__)
    parser.add_argument("--export", action="store_true", help="print export lines for a shell's eval")
    parser.add_argument("hosts", nargs="+", help="candidate peers, comma or space separated")
    ns = parser.parse_args(argv)
    peers = [h for arg in ns.hosts for h in arg.split(",") if h]
    for peer in peers:
        if is_this_host(peer):
            continue
        chosen = rendezvous_env(peer, dict(os.environ))
        for name, value in chosen.items():
            print(f"{'export ' if ns.export else ''}{name}={shlex.quote(value)}")
        break
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
