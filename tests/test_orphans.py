"""No orphans: a launcher killed by any signal takes its servers, trainers and their children with
it and leaves no launch directory; exit statuses follow the shell convention (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asyncgraph.launch.lifeline import exit_status
from asyncgraph.testing import subprocess_env

LAUNCH = [sys.executable, "-m", "asyncgraph.launch"]

# Each trainer records its pid and starts a grandchild (its own child, which the parent-death
# signal of the trainer does not reach) that records its pid too, then both sleep.
# A pid file appears only once complete (written beside ``out``, then renamed into it): the test
# reads every file it sees.
TRAINER = (
    "import os, pathlib, subprocess, sys, time\n"
    "out = pathlib.Path(sys.argv[1])\n"
    "def record(name, pid):\n"
    "    part = out.parent / ('.' + name)\n"
    "    part.write_text(str(pid))\n"
    "    part.replace(out / name)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "record('grandchild' + os.environ['RANK'], child.pid)\n"
    "record('trainer' + os.environ['RANK'], os.getpid())\n"
    "time.sleep(120)\n"
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(predicate, limit: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {limit} s")


def _start(cora2, tmp_path: Path, script: str = TRAINER) -> tuple[subprocess.Popen[str], Path]:  # type: ignore[no-untyped-def]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    env = {**subprocess_env(), "TMPDIR": str(tmp)}  # the launch directory goes here, where we can see it
    argv = [*LAUNCH, "--part-config", str(cora2.part_config), "--", sys.executable, "-c", script, str(out)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_killed_launcher_leaves_no_process_and_no_secret(cora2, tmp_path: Path, sig: int) -> None:
    launcher, out = _start(cora2, tmp_path)
    pids: list[int] = []
    try:
        _wait_for(
            lambda: len(list(out.glob("trainer*"))) == 2 and len(list(out.glob("grandchild*"))) == 2,
            60,
            "trainers",
        )
        [launch_dir] = (tmp_path / "tmp").glob(".asyncgraph-launch-*")
        assert (launch_dir / "secret").exists()
        servers = [json.loads(p.read_text())["pid"] for p in sorted(launch_dir.glob("server*.ready"))]
        assert len(servers) == 2
        pids = [*servers, *(int(p.read_text()) for p in out.glob("*"))]
        assert len(pids) == 6 and all(_alive(p) for p in pids)
        os.kill(launcher.pid, sig)
        launcher.wait(timeout=30)
        _wait_for(lambda: not any(_alive(p) for p in pids), 20, "every server, trainer and grandchild gone")
        _wait_for(lambda: not launch_dir.exists(), 10, "launch directory removed")
        if sig == signal.SIGHUP:  # handled: everything stopped in order, status 128 + 1
            assert launcher.returncode == 129
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_exit_statuses_follow_the_shell_convention(cora2, tmp_path: Path) -> None:
    killed = "import os, signal, sys\nif os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
    launcher, _ = _start(cora2, tmp_path, killed)
    output, _ = launcher.communicate(timeout=90)
    assert launcher.returncode == 128 + signal.SIGKILL, output[-2000:]
    assert "trainer 1 failed with status 137" in output

    (tmp_path / "term").mkdir()
    launcher, out = _start(cora2, tmp_path / "term")
    _wait_for(lambda: len(list(out.glob("trainer*"))) == 2, 60, "trainers")
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert "got SIGTERM" in output


def test_exit_status_mapping() -> None:
    assert exit_status(0) == 0 and exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 137 and exit_status(-signal.SIGTERM) == 143


@pytest.mark.timeout(60)
def test_sigterm_is_a_clean_requested_stop_for_a_server(cora2, tmp_path: Path) -> None:
    from asyncgraph.testing import start_servers

    group = start_servers(cora2.part_config, tmp_path, num_parts=2)
    try:
        group.kill(0, signal.SIGTERM)
        group.kill(1, signal.SIGKILL)
        assert group.procs[0].returncode == 0
        assert exit_status(group.procs[1].returncode) == 137
    finally:
        group.stop()
