"""``python -m asyncgraph.launch`` across two hosts made from network namespaces (tests/nethosts.py).

Each host has its own network stack, ``/dev/shm``, ``/etc/hosts`` (its name on 127.0.1.1, as
stock Debian has it) and sshd; the working tree is shared, as on a cluster with NFS. The
launcher runs on host 1 and reaches host 2 (and the servers, and gloo) over 198.18.0.0/15.
Skipped where these hosts cannot be made (not root, no ``ip``/``sshd``): CI runs them as root
after ``ops/ci/system-deps.sh``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nethosts import NetHosts, skip_reason

ROOT = Path(__file__).resolve().parent.parent
TRAIN = [sys.executable, "examples/train_dist.py", "--no-progress", "--eval-every", "0"]

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def nethosts() -> Iterator[NetHosts]:
    with NetHosts(2) as nh:
        yield nh


@pytest.fixture(scope="module")
def private_hosts() -> Iterator[NetHosts]:
    """Two hosts sharing no data folder: ``data_dir`` is a different folder on each."""
    with NetHosts(2, private_data=True) as nh:
        yield nh


def _tidy(nh: NetHosts) -> None:
    for host in nh.hosts:
        for proc in host.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        host.started.clear()
    nh.close_jobs()
    for index in range(len(nh.hosts)):
        nh.shape(index, None)


@pytest.fixture
def hosts(nethosts: NetHosts) -> Iterator[NetHosts]:
    """The two hosts; whatever a test left running on them is killed after it (by PID)."""
    yield nethosts
    _tidy(nethosts)


@pytest.fixture
def apart(private_hosts: NetHosts) -> Iterator[NetHosts]:
    """The two hosts without a shared data folder, tidied after each test."""
    yield private_hosts
    _tidy(private_hosts)


class Launched:
    """The launcher running on host 1, its output collected line by line."""

    def __init__(self, nh: NetHosts, argv: list[str], on: int = 0) -> None:
        self.lines: list[str] = []
        self.proc = nh[on].popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, pattern: str, limit: float) -> None:
        deadline = time.monotonic() + limit
        while not any(re.search(pattern, line) for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no line matching {pattern!r}:\n" + self.text)
            time.sleep(0.05)

    def finish(self, limit: float) -> int:
        code = self.proc.wait(timeout=limit)
        self.reader.join(timeout=5)
        return code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def launch_argv(nh: NetHosts, part_config: Path, *extra: str, by_name: bool = False) -> list[str]:
    ip_config = nh.ip_config(nh.tmp / "ip_config.txt", by_name=by_name)  # no ports, as a user writes it
    return [sys.executable, "-m", "asyncgraph.launch", "--part-config", str(part_config),
            "--ip-config", str(ip_config), *extra]  # fmt: skip


def secret_folders() -> list[Path]:
    """The remote agents' private folders (secret, ip_config) in the hosts' /tmp (shared here).
    (The launcher's own folder is test_orphans' business: other local launches on this machine
    make them too.)"""
    return list(Path(tempfile.gettempdir()).glob("asyncgraph-job-*"))


def wait_no_leftovers(nh: NetHosts, limit: float) -> None:
    """No process of the job on any host, and no folder holding its secret, within ``limit`` s."""
    deadline = time.monotonic() + limit
    while nh.leftovers() or secret_folders():
        if time.monotonic() > deadline:
            raise AssertionError(f"outlived the job: {nh.leftovers()} {secret_folders()}")
        time.sleep(0.1)


def visible_anywhere(nh: NetHosts, needle: bytes) -> list[str]:
    """Processes on any host whose argv or environment holds ``needle``."""
    found = []
    for host in nh.hosts:
        for pid in host.pids():
            for what in ("cmdline", "environ"):
                try:
                    if needle in Path(f"/proc/{pid}/{what}").read_bytes():
                        found.append(f"{host.name} pid {pid} {what}")
                except OSError:
                    pass
    return found


def test_readme_launch_trains_across_two_hosts_over_a_100mbit_link(
    hosts: NetHosts, pubmed2, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The README's launched run, unchanged but for --ip-config, over links shaped to 100 Mbit/s
    (tbf): trains, binds the configured addresses, picks the interface routing to MASTER_ADDR
    on each host, keeps the secret off argv/environ/shared files, reports the prefetcher's
    overlap, and leaves no process on either host."""
    for index in range(2):
        hosts.shape(index, "100mbit")
    secret = os.urandom(16).hex()
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    before = set(os.listdir(ROOT))
    argv = launch_argv(
        hosts, pubmed2.part_config, "--secret-file", str(secret_file), "--", *TRAIN, "--epochs", "1"
    )
    run = Launched(hosts, argv)
    run.wait_for(r"\[trainer 0\] DistGraph", 120)
    leaks = visible_anywhere(hosts, secret.encode())
    code = run.finish(180)
    assert code == 0, run.text
    assert "[trainer 0] RESULT" in run.text, run.text  # rank 0 reports for the job
    # co-location as found: its own server's partition through shared memory, host 2's over TCP
    assert "partitions via shared memory [0], via the socket [1]" in run.text, run.text
    assert re.search(r"\[trainer 0\] .*waiting for data [\d.]+ s \([\d.]+% of the epochs\)", run.text)
    assert all(hosts.shaped_bytes(i) > 100_000 for i in range(2))  # the job's traffic crossed the tbf
    assert "role=trainer count=2 exit_codes=0,0 failed=0" in run.text, run.text
    # each server bound the address the ip_config names, not 0.0.0.0
    for index, host in enumerate(hosts.hosts):
        assert re.search(
            rf"\[server {index}\] .*partition {index} on {re.escape(host.addr)}:\d+", run.text
        ), run.text
    # gloo's interface chosen on each host (its name resolves to 127.0.1.1 there)
    assert "trainers on this host: GLOO_SOCKET_IFNAME=eth0" in run.text, run.text
    assert f"trainer 1 on {hosts[1].addr}: GLOO_SOCKET_IFNAME=eth0" in run.text, run.text
    assert leaks == [], leaks
    assert set(os.listdir(ROOT)) == before  # nothing (ready files, secret) put in the shared folder
    wait_no_leftovers(hosts, 5)


def test_staged_without_shared_files_then_sigkilled_mid_epoch_leaves_nothing(
    apart: NetHosts, pubmed2
) -> None:  # type: ignore[no-untyped-def]
    """No shared data folder: ``stage`` copies each partition to its host only, the job trains
    from the staged copies; SIGKILL of the launcher mid-epoch leaves no process on any host."""
    ip_config = apart.ip_config(apart.tmp / "ip_config.txt")
    dest = apart.data_dir
    stage = [sys.executable, "-m", "asyncgraph.launch.stage", "--part-config", str(pubmed2.part_config),
             "--ip-config", str(ip_config), "--dest", str(dest),
             "--ssh-port", "22", "--ssh-option=-o ConnectTimeout=9"]  # fmt: skip
    done = apart[0].run(stage, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    for index, host in enumerate(apart.hosts):
        listing = host.run(["ls", str(dest)]).stdout.split()
        assert f"part{index}" in listing and f"part{1 - index}" not in listing, listing
    assert os.listdir(dest) == []  # nothing landed in the folder this (root) namespace sees
    staged = dest / pubmed2.part_config.name
    # host 2 names its copy by another path (a link to its own data folder): per-host paths win
    # over the (here useless) path given for every remote host
    alt = apart[1].dir / "alt"
    alt.symlink_to(dest)
    paths = ["--remote-part-config", "/nonexistent/pubmed.json",
             "--remote-part-config", f"{apart[1].addr}={alt / staged.name}"]  # fmt: skip
    run = Launched(apart, launch_argv(apart, staged, *paths, "--", *TRAIN, "--epochs", "200"))
    run.wait_for(r"\[trainer 0\] epoch +0 ", 120)
    assert apart[1].job_pids(), "the job runs on host 2"
    run.proc.send_signal(signal.SIGKILL)
    run.finish(10)
    wait_no_leftovers(apart, 10)


def sleeper(rank_fails: int | None = None, status: int = 3) -> list[str]:
    """A trainer command that sleeps (and, on ``rank_fails``, exits with ``status`` at once)."""
    code = "import os, sys, time\n"
    if rank_fails is not None:
        code += f"if os.environ['RANK'] == '{rank_fails}': print('failing', flush=True); sys.exit({status})\n"
    code += "print('sleeping', flush=True); time.sleep(120)\n"
    return [sys.executable, "-c", code]


def test_failed_remote_trainer_stops_every_process(hosts: NetHosts, cora2) -> None:  # type: ignore[no-untyped-def]
    run = Launched(hosts, launch_argv(hosts, cora2.part_config, "--", *sleeper(rank_fails=1)))
    assert run.finish(60) == 3, run.text
    assert "trainer 1 failed with status 3" in run.text
    wait_no_leftovers(hosts, 5)


def test_env_ssh_options_and_a_remote_rendezvous_from_the_second_host(hosts: NetHosts, cora2) -> None:  # type: ignore[no-untyped-def]
    """Launched from host 2 with an ip_config of host *names* (each host's own name is 127.0.1.1
    there, as on stock Debian): servers bind, and trainers dial and rendezvous at, the names'
    real addresses; host 1 (first) is remote and holds the rendezvous, whose port is asked for
    over ssh; --env and the ssh options reach every process; a replica server per partition
    starts on each host, beside its primary."""
    show = (
        "import os; e = os.environ; print('seen', e.get('AG_FLAG'), e.get('AG_KEEP'), e['RANK'], "
        "e['MASTER_ADDR'], e['MASTER_PORT'], e.get('GLOO_SOCKET_IFNAME'))"
    )
    argv = launch_argv(
        hosts, cora2.part_config, "--num-servers", "2", "--env", "AG_FLAG=on", "--env", "AG_KEEP",
        "--ssh-port", "22", "--ssh-username", "root", "--ssh-option=-o ConnectTimeout=7",
        "--", sys.executable, "-c", show, by_name=True,
    )  # fmt: skip
    run = Launched(hosts, ["env", "AG_KEEP=kept", *argv], on=1)
    assert run.finish(60) == 0, run.text
    master = hosts[0].addr
    assert "role=server count=4" in run.text, run.text  # 2 primaries + 2 replicas, all ready
    for index, host in enumerate(hosts.hosts):
        assert re.search(rf"\[server {index}\] .*partition {index} on {re.escape(host.addr)}:\d+", run.text)
    for rank in (0, 1):
        found = re.search(rf"\[trainer {rank}\] seen on kept {rank} {re.escape(master)} (\d+) eth0", run.text)
        assert found and 1024 <= int(found.group(1)) < 65536, run.text
    wait_no_leftovers(hosts, 5)


def test_host_cut_off_stops_its_processes_by_heartbeat(hosts: NetHosts, cora2) -> None:  # type: ignore[no-untyped-def]
    """Host 2's link goes down (no FIN, no RST): its agent hears no heartbeat and stops the job
    there; the launcher, whose ssh keep-alives fail, stops the rest."""
    argv = launch_argv(hosts, cora2.part_config, "--heartbeat-timeout", "2", "--", *sleeper())
    run = Launched(hosts, argv)
    run.wait_for(r"\[trainer 1\] sleeping", 60)
    hosts.link(1, up=False)
    try:
        deadline = time.monotonic() + 8
        while hosts[1].job_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not hosts[1].job_pids(), hosts.leftovers()
    finally:
        hosts.link(1, up=True)
    assert run.finish(30) != 0
    wait_no_leftovers(hosts, 10)


def test_four_hosts_have_their_own_shm_and_leave_nothing_when_a_test_fails() -> None:
    """The helper itself: 4 hosts reach each other over ssh, each has a private /dev/shm, and
    everything (processes, namespaces, mounts, keys) is gone after a failure inside the block."""
    marker = f"ag-shm-{os.getpid()}"
    with pytest.raises(RuntimeError, match="a test failed"), NetHosts(4) as nh:
        names = [h.name for h in nh.hosts]
        tmp = nh.tmp
        done = nh[0].run(["ssh", nh[3].addr, f"hostname && touch /dev/shm/{marker}"])
        assert done.returncode == 0 and done.stdout.strip() == nh[3].name, done.stderr
        assert nh[3].run(["ls", "/dev/shm"]).stdout.split() == [marker]
        assert marker not in nh[0].run(["ls", "/dev/shm"]).stdout and not Path("/dev/shm", marker).exists()
        sleeper = nh[1].popen(["sleep", "300"])
        raise RuntimeError("a test failed")
    assert sleeper.poll() is not None  # killed by PID, not left running
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names) and nh.bridge_ns not in listed
    assert not tmp.exists()
    assert marker not in Path("/proc/mounts").read_text() and str(tmp) not in Path("/proc/mounts").read_text()


@pytest.mark.parametrize("how", ["sigint", "dropped_ssh"])
def test_sigint_or_a_dropped_ssh_connection_stops_every_process(hosts: NetHosts, cora2, how: str) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C of the launcher (status 130), or the ssh connection of the remote trainer killed
    (its agent reads EOF and stops the trainer there; the launcher sees its ssh die and stops the
    rest):
    no process of the job on either host."""
    import psutil

    run = Launched(hosts, launch_argv(hosts, cora2.part_config, "--", *sleeper()))
    run.wait_for(r"\[trainer 1\] sleeping", 60)
    if how == "sigint":
        run.proc.send_signal(signal.SIGINT)
        assert run.finish(30) == 130, run.text
    else:
        ssh = [p for p in psutil.Process(run.proc.pid).children() if p.name() == "ssh"]
        newest = max(ssh, key=lambda p: p.create_time())  # the trainer's: started after the server's
        newest.kill()
        assert run.finish(30) == 128 + signal.SIGKILL, run.text  # the ssh client's status
        assert "trainer 1 failed with status 137" in run.text
    wait_no_leftovers(hosts, 10)
