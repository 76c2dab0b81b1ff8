"""Hosts made from Linux network namespaces, for tests of what only happens between machines.

``NetHosts(n)`` (2 by default, up to 4) builds, under a per-run name prefix:

* a bridge ``br0`` held in its own namespace (``<prefix>br``, address 198.18.0.1), and per host
  a namespace ``<prefix>h<i>`` joined to it by a veth pair (``eth0`` inside, 198.18.0.1<i>/24)
  with ``lo`` up. Addresses are in 198.18.0.0/15 only (RFC 2544, reserved for benchmarking);
* per host a mount and UTS namespace (``unshare -m --propagation private -u``) with its own
  host name, a private tmpfs on ``/dev/shm``, a stock-Debian ``/etc/hosts`` (its own name on
  127.0.1.1, the classic ``torch.distributed`` trap; the other hosts by name), an
  ``/etc/ssh/ssh_config`` that trusts the run's throwaway keys, and optionally a private data
  folder (``private_data=True``: ``data_dir`` is a different folder on every host, the
  no-shared-file-system case);
* ``sshd`` (Debian's openssh-server) on port 22 of each host, started inside that mount
  namespace so every session shares it; the working tree is visible on every host, as NFS is.

A host's ``pid`` is its sshd: ``host.argv(cmd)`` runs ``cmd`` inside the host's network, mount
and UTS namespaces (``nsenter``; not ``ip netns exec``, which remounts ``/sys``). Everything
(processes in the namespaces, found by PID through ``/proc/*/ns/net``; namespaces, with their
mounts and links; keys) is removed by ``close()``, which the fixtures call even when a test
fails. ``skip_reason()`` says why these hosts cannot be made here (not root, a tool missing).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "198.18.0"  # inside 198.18.0.0/15 (RFC 2544); never any other range
BRIDGE_ADDR = f"{SUBNET}.1"
TOOLS = ("ip", "nsenter", "unshare", "mount", "ssh", "ssh-keygen", "tc")
SSHD = "/usr/sbin/sshd"


@functools.cache
def skip_reason() -> str | None:
    """Why namespace hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces, mounts); CI runs them as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not Path(SSHD).exists():
        missing.append("sshd")
    if missing:
        return f"multi-host tests need {', '.join(missing)} (run ops/ci/system-deps.sh as root)"
    for target in ("/etc/hosts", "/etc/ssh/ssh_config", "/dev/shm"):
        if not os.path.exists(target):
            return f"multi-host tests bind-mount over {target}, which does not exist here"
    probe = subprocess.run(["unshare", "-n", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:  # a container without CAP_SYS_ADMIN, say
        return f"cannot make network/mount namespaces here: {probe.stderr.strip()}"
    return None


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _netns_inode(pid_or_path: int | str) -> int | None:
    path = f"/proc/{pid_or_path}/ns/net" if isinstance(pid_or_path, int) else pid_or_path
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


@dataclass
class Host:
    """One namespace host: its name (also its host name), address and sshd's PID."""

    name: str
    addr: str
    index: int
    dir: Path
    pid: int = 0
    sshd: subprocess.Popen[bytes] | None = None
    veth: str = ""
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def argv(self, argv: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """``argv`` run inside this host's network, mount and UTS namespaces."""
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        return ["nsenter", "-t", str(self.pid), "-n", "-m", "-u", f"--wd={wd}", "--", *argv]

    def run(self, argv: Sequence[str], timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to its end; its output as text."""
        return subprocess.run(self.argv(argv), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload, no-any-return]

    def popen(self, argv: Sequence[str], **kw: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host (``nsenter`` execs it: the PID is the command's)."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(self.argv(argv), **kw)  # type: ignore[call-overload]
        self.started.append(proc)
        return proc

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.name}"

    def pids(self) -> list[int]:
        """Every process in this host's network namespace, sshd included."""
        inode = _netns_inode(self.netns_path)
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and inode is not None and _netns_inode(int(entry)) == inode:
                found.append(int(entry))
        return found

    def job_pids(self) -> list[int]:
        """Processes in this host other than its daemons (sshd, with a session whose connection
        was cut lingering until TCP gives up; slurmd): a finished job leaves none."""
        return [p for p in self.pids() if p != self.pid and not _is_sshd(p)]


#: Daemons the helpers start in a host (sshd; slurmd with ``SlurmCluster``): not a job's processes.
DAEMONS = tuple(os.path.realpath(p) for p in (SSHD, "/usr/sbin/slurmd"))  # slurmd links to slurmd-wlm


def _is_sshd(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") in DAEMONS
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


class NetHosts:
    """``n`` namespace hosts on one bridge; a context manager that removes them all."""

    def __init__(self, n: int = 2, *, private_data: bool = False, shm_size: str = "512m") -> None:
        if not 1 <= n <= 4:
            raise ValueError(f"1 to 4 hosts, not {n}")
        self.n = n
        self.private_data = private_data
        self.shm_size = shm_size
        self.prefix = "ag" + secrets.token_hex(3)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        self.tmp.chmod(0o755)
        self.bridge_ns = f"{self.prefix}br"
        self.hosts: list[Host] = []
        self.data_dir = self.tmp / "data"  # a different folder on each host with private_data
        self.namespaces: list[str] = []
        self.bridge_started: list[subprocess.Popen[bytes]] = []

    # --- building -------------------------------------------------------------------------
    def __enter__(self) -> NetHosts:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
        keys = self.tmp / "keys"
        keys.mkdir(mode=0o700)
        for key in ("host_key", "client_key"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.prefix, "-f", str(keys / key)])
        shutil.copy(keys / "client_key.pub", keys / "authorized_keys")
        self.hosts = [
            Host(f"{self.prefix}h{i + 1}", f"{SUBNET}.{11 + i}", i, self.tmp / f"h{i + 1}")
            for i in range(self.n)
        ]
        host_pub = (keys / "host_key.pub").read_text().split()[:2]
        names = ",".join(f"{h.addr},{h.name}" for h in self.hosts)
        (keys / "known_hosts").write_text(f"{names},{BRIDGE_ADDR} {' '.join(host_pub)}\n")
        (self.tmp / "ssh_config").write_text(
            "Host *\n"
            f"    IdentityFile {keys / 'client_key'}\n"
            f"    UserKnownHostsFile {keys / 'known_hosts'}\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "    LogLevel ERROR\n"
            "    ConnectTimeout 5\n"
        )
        self.data_dir.mkdir()
        self._bridge()
        for host in self.hosts:
            self._host(host, keys)
        deadline = time.monotonic() + 10
        for host in self.hosts:
            while not self._listening(host.pid, 22):
                assert host.sshd is not None
                if host.sshd.poll() is not None:
                    raise RuntimeError(f"sshd on {host.name} exited with status {host.sshd.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {host.name} not listening after 10 s")
                time.sleep(0.02)

    def _bridge(self) -> None:
        ns = self.bridge_ns
        _run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", ns, "addr", "add", f"{BRIDGE_ADDR}/24", "dev", "br0"])
        _run(["ip", "-n", ns, "link", "set", "br0", "up"])

    def _host(self, host: Host, keys: Path) -> None:
        ns = host.name
        _run(["ip", "netns", "add", ns])
        self.namespaces.append(ns)
        inner, outer = f"{self.prefix}v{host.index}", f"{self.prefix}b{host.index}"
        host.veth = outer
        _run(
            [
                "ip",
                "link",
                "add",
                inner,
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                outer,
                "netns",
                self.bridge_ns,
            ]
        )
        _run(["ip", "-n", ns, "link", "set", inner, "name", "eth0"])
        _run(["ip", "-n", ns, "addr", "add", f"{host.addr}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", self.bridge_ns, "link", "set", outer, "master", "br0", "up"])
        host.dir.mkdir()
        others = "".join(f"{h.addr}\t{h.name}\n" for h in self.hosts if h is not host)
        (host.dir / "hosts").write_text(
            f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n{others}"  # Debian's stock layout
        )
        (host.dir / "sshd_config").write_text(
            "Port 22\n"
            f"ListenAddress {host.addr}\n"
            f"HostKey {keys / 'host_key'}\n"
            f"AuthorizedKeysFile {keys / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PidFile none\n"
            "MaxStartups 200\n"
            "MaxSessions 200\n"
            "LogLevel ERROR\n"
        )
        (host.dir / "data").mkdir()
        mounts = [
            f"mount -t tmpfs -o size={self.shm_size},mode=1777 tmpfs /dev/shm",
            f"mount --bind {host.dir / 'hosts'} /etc/hosts",
            f"mount --bind {self.tmp / 'ssh_config'} /etc/ssh/ssh_config",
        ]
        if self.private_data:
            mounts.append(f"mount --bind {host.dir / 'data'} {self.data_dir}")
        script = " && ".join(
            ["set -e", f"hostname {host.name}", *mounts, f"exec {SSHD} -D -e -f {host.dir / 'sshd_config'}"]
        )
        log = open(host.dir / "sshd.log", "wb")  # noqa: SIM115 - closed with the process
        host.sshd = subprocess.Popen(
            [
                "nsenter",
                f"--net={host.netns_path}",
                "unshare",
                "-m",
                "--propagation",
                "private",
                "-u",
                "sh",
                "-c",
                script,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        host.pid = host.sshd.pid  # nsenter, unshare and sh each exec the next: this is sshd

    @staticmethod
    def _listening(pid: int, port: int) -> bool:
        """Whether the network namespace of ``pid`` has a TCP listener on ``port``."""
        try:
            lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        except OSError:
            return False
        want = f":{port:04X}"
        return any(f[1].endswith(want) and f[3] == "0A" for f in (line.split() for line in lines))

    # --- using ----------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def bridge_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the bridge's namespace (198.18.0.1: a vantage point on every host,
        like a monitoring or control machine on the cluster's network)."""
        return ["nsenter", f"--net=/run/netns/{self.bridge_ns}", "--", *argv]

    def bridge_popen(self, argv: Sequence[str], **kw: object) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the bridge's namespace; ``close()`` kills it."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(self.bridge_argv(argv), **kw)  # type: ignore[call-overload]
        self.bridge_started.append(proc)
        return proc

    def ip_config(self, path: Path, ports: Sequence[int] | None = None, by_name: bool = False) -> Path:
        """An ip_config listing every host's address (its name with ``by_name``; and ``ports``,
        when given), one a line."""
        first = [h.name if by_name else h.addr for h in self.hosts]
        lines = [f"{first[i]} {ports[i]}" if ports else first[i] for i in range(len(self.hosts))]
        path.write_text("\n".join(lines) + "\n")
        return path

    def leftovers(self) -> dict[str, list[str]]:
        """Per host, the command lines of processes other than its sshd (none: nothing leaked)."""
        return {h.name: [f"{p}: {_cmdline(p)}" for p in h.job_pids()] for h in self.hosts if h.job_pids()}

    def link(self, index: int, up: bool) -> None:
        """Take host ``index``'s link down (its bridge end, so the host cannot tell) or up."""
        _run(["ip", "-n", self.bridge_ns, "link", "set", self.hosts[index].veth, "up" if up else "down"])

    def shape(self, index: int, rate: str | None, burst: str = "256kb", latency: str = "50ms") -> None:
        """``tc qdisc tbf`` at ``rate`` (e.g. ``1gbit``) on host ``index``'s egress; None removes it."""
        ns = self.hosts[index].name
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        if rate is not None:
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                  "rate", rate, "burst", burst, "latency", latency])  # fmt: skip

    def shaped_bytes(self, index: int) -> int:
        """Bytes host ``index`` sent through its ``tbf`` qdisc so far (0 without one)."""
        out = _run(
            ["ip", "netns", "exec", self.hosts[index].name, "tc", "-s", "qdisc", "show", "dev", "eth0"]
        ).stdout
        if "tbf" not in out:
            return 0
        words = out.split()
        return int(words[words.index("Sent") + 1])

    # --- removing -------------------------------------------------------------------------
    def close_jobs(self) -> None:
        """Kill every process in the hosts but their sshd listeners (between tests): SIGTERM
        first (agents then remove their secret folders), SIGKILL what is left after 2 s."""
        for host in self.hosts:
            for pid in [p for p in host.pids() if p != host.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and any(p != h.pid for h in self.hosts for p in h.pids()):
            time.sleep(0.05)
        for host in self.hosts:
            for _ in range(50):
                pids = [p for p in host.pids() if p != host.pid]
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)

    def close(self) -> None:
        """Kill every process in the hosts (by PID), delete the namespaces and the keys."""
        self.close_jobs()  # SIGTERM first: agents remove their secret folders
        for host in self.hosts:
            for _ in range(50):
                pids = host.pids()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            for proc in [*host.started, *([host.sshd] if host.sshd else [])]:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        bridge = _netns_inode(f"/run/netns/{self.bridge_ns}")
        for entry in os.listdir("/proc") if bridge is not None else ():
            if entry.isdigit() and _netns_inode(int(entry)) == bridge:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)
        for proc in self.bridge_started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for ns in reversed(self.namespaces):
            _run(["ip", "netns", "del", ns], check=False)
        self.namespaces.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo")


def slurm_skip_reason() -> str | None:
    """Why a Slurm cluster cannot be made on namespace hosts here, or None."""
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        return f"Slurm tests need {', '.join(missing)} (slurm-wlm, munge: ops/ci/system-deps.sh)"
    return None


class SlurmCluster:
    """A real Slurm 22.05 cluster over ``NetHosts``, every daemon started by hand, stopped by PID.

    ``munged`` runs in the root namespace (its socket is a path every namespace reaches) with a
    throwaway key; ``slurmctld`` in the bridge's namespace (198.18.0.1) under its own host name;
    one ``slurmd`` per host, inside the host's namespaces (``nsenter``, which keeps ``/sys`` and
    the cgroup mounts slurmd needs), named by the host's name. ``SLURM_CONF`` names a temporary
    config: root runs everything, no accounting, ``proctrack/linuxproc``, ``task/none``.
    """

    def __init__(self, nh: NetHosts, cpus: int = 4) -> None:
        self.nh = nh
        self.dir = nh.tmp / "slurm"
        self.cpus = cpus
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _daemon(self, argv: list[str], name: str) -> None:
        with open(self.dir / f"{name}.out", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            )

    def start(self) -> None:
        d = self.dir
        for sub in ("", "state", "spool"):
            (d / sub).mkdir(mode=0o755, exist_ok=True)
        key = d / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        sock = d / "munge.sock"
        self._daemon(["munged", "-F", "-f", f"--socket={sock}", f"--key-file={key}",
                      f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                      f"--seed-file={d}/munged.seed"], "munged")  # fmt: skip
        deadline = time.monotonic() + 10
        while not sock.exists():
            if time.monotonic() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"munged did not start: {(d / 'munged.out').read_text(errors='replace')}")
            time.sleep(0.02)
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.addr} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN\n"
            for h in self.nh.hosts
        )
        ctl = f"{self.nh.prefix}ctl"
        (d / "slurm.conf").write_text(
            f"ClusterName={self.nh.prefix}\n"
            f"SlurmctldHost={ctl}({BRIDGE_ADDR})\n"
            f"AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n"
            f"SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nReturnToService=2\n"
            "SchedulerParameters=batch_sched_delay=0\nSlurmdParameters=config_overrides\n"
            "MailProg=/bin/true\nAccountingStorageType=accounting_storage/none\n"
            "JobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/none\n"
            "MpiDefault=none\nSwitchType=switch/none\nKillWait=5\n"
            f"{nodes}PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )
        named = f"hostname {ctl} && exec slurmctld -D -i"  # slurmctld checks its host name
        self._daemon(self.nh.bridge_argv(["unshare", "--uts", "sh", "-c", named]), "slurmctld")
        for host in self.nh.hosts:
            self._daemon(host.argv(["slurmd", "-D"]), f"slurmd-{host.name}")
        deadline = time.monotonic() + 30
        while True:
            done = self.run(0, ["sinfo", "-N", "-h", "-o", "%t"], timeout=10)
            if done.stdout.split().count("idle") == len(self.nh.hosts):
                return
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f.read_text(errors="replace")[-800:] for f in sorted(d.glob("*.log")))
                raise RuntimeError(
                    f"Slurm not idle (sinfo: {done.stdout!r} {done.stderr!r}; exited: {dead}):\n{logs}"
                )
            time.sleep(0.1)

    def run(
        self, index: int, argv: Sequence[str], timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm command (``sbatch``, ``srun``...) on host ``index``, with this cluster's config."""
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            self.nh[index].argv(argv, kw.pop("cwd", None)),  # type: ignore[arg-type]
            env=self.env, capture_output=True, text=True, timeout=timeout, **kw,
        )  # fmt: skip

    def wait_job(self, job_id: str, timeout: float = 300) -> tuple[str, str]:
        """Poll ``scontrol show job`` every 0.2 s (``sbatch --wait`` polls in growing steps of
        seconds) until the job ends; its final ``(JobState, ExitCode)``."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.run(0, ["scontrol", "-o", "show", "job", job_id], timeout=30)
            fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)
            state = fields.get("JobState", "?")
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "?"):
                return state, fields.get("ExitCode", "?")
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state} after {timeout:g} s")
            time.sleep(0.2)

    def close(self) -> None:
        """Stop slurmd, slurmctld and munged by PID (SIGTERM, then SIGKILL)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()
