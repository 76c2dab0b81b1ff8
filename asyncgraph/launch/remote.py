"""``python -m asyncgraph.launch.remote``: the launcher's agent on a remote host, one per process.

The launcher runs ``ssh HOST 'cd CWD && exec PYTHON -m asyncgraph.launch.remote'`` and writes
one JSON line (:class:`Job`) on the channel's stdin: the command, its environment and the files
it needs, the job's secret among them. Nothing secret is in argv, the environment or a shared
file: the agent writes the files into a private folder (mode 700, this host's temp folder),
replaces ``@ASYNCGRAPH_DIR@`` in the command and environment with that folder's path, and
starts the command in its own process group. Then:

* the child's stdout and stderr come back over the channel, line by line; the agent's own
  reports are lines starting with ``@asyncgraph-agent `` and a JSON object on stdout
  (``{"ready": [host, port]}`` once the server's ready file is written; ``{"env": {...}}``
  with what it chose for this host);
* **lifeline**: the launcher writes ``ping`` lines every second. EOF (the launcher, its ssh or
  the connection died), a ``stop`` line, SIGTERM/SIGHUP of the agent or ``heartbeat`` seconds
  without a line (a link that went silent) stop the child: SIGTERM to its group, SIGKILL
  after ``grace`` seconds. The child also gets a parent-death signal, so a SIGKILLed agent
  takes it down too;
* the agent exits with the child's status in the shell's convention (128 + N for signal N), so
  ``ssh`` returns it to the launcher, and removes its folder;
* **janitor** (issue 32): a SIGKILLed agent cannot clean up, so before anything is written a
  small process in its own session waits on a pipe only the agent holds. When the agent is
  gone (EOF) without saying ``done``, it SIGKILLs the child's process group (grandchildren
  included, which the parent-death signal does not reach) and removes the folder, so no
  ``secret`` or ``ready.json`` stays behind. It ignores SIGHUP/SIGTERM/SIGINT and holds no
  secret.

On its host it also sets, unless already set, ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` to
the interface that routes to the rendezvous address (``asyncgraph.launch.netif``) and
``OMP_NUM_THREADS`` to this host's cores / trainers here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict

from asyncgraph.launch.lifeline import die_with_parent, exit_status, group_alive
from asyncgraph.launch.netif import rendezvous_env
from asyncgraph.launch.processes import OMP_ENV, local_cores, omp_threads

__all__ = ["AGENT_PREFIX", "DIR_TOKEN", "Job", "main", "parse_report"]

#: Lines the agent writes on stdout for the launcher (the rest is the child's output).
AGENT_PREFIX = "@asyncgraph-agent "
#: Replaced by the agent's private folder in the command and its environment.
DIR_TOKEN = "@ASYNCGRAPH_DIR@"


class Job(BaseModel):
    """What the launcher sends: the first line on the agent's stdin."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str]
    env: dict[str, str] = {}
    #: Files written (mode 600) into the private folder before the command starts, by name.
    files: dict[str, str] = {}
    #: A ready file (name in the folder) to report as ``{"ready": [host, port]}`` once written.
    ready_file: str | None = None
    #: Set the gloo/nccl interface that routes to this address, unless the env names one.
    rendezvous: str | None = None
    #: Set ``OMP_NUM_THREADS`` to cores / this many trainers on this host, unless set.
    omp_share: int | None = None
    grace: float = 5.0
    #: Stop the child after this many seconds without a line from the launcher (0: never).
    heartbeat: float = 10.0


def parse_report(line: str) -> dict[str, Any] | None:
    """An agent report line's object, or None for any other line."""
    if not line.startswith(AGENT_PREFIX):
        return None
    try:
        value = json.loads(line[len(AGENT_PREFIX) :])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class _Agent:
    def __init__(self, job: Job, stdin: IO[str], janitor: int = -1) -> None:
        self.job = job
        self.janitor = janitor  # the janitor's pipe: told the child's process group
        self.stdin = stdin
        self.stop = threading.Event()
        self.why = ""
        self.last_line = time.monotonic()
        self.out_lock = threading.Lock()

    def report(self, **fields: object) -> None:
        self.write(sys.stdout, AGENT_PREFIX + json.dumps(fields) + "\n")

    def write(self, sink: IO[str], text: str) -> None:
        with self.out_lock, contextlib.suppress(OSError, ValueError):
            sink.write(text)
            sink.flush()

    def watch_stdin(self) -> None:
        for line in self.stdin:
            self.last_line = time.monotonic()
            if line.strip() == "stop":
                self.why = "stop requested"
                break
        else:
            self.why = "launcher gone (its channel closed)"
        self.stop.set()

    def pump(self, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            self.write(sink, raw.decode(errors="replace"))
        stream.close()

    def run(self, folder: Path) -> int:
        job = self.job
        for name, text in job.files.items():
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"file name {name!r} is not a plain name")
            path = folder / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
        token = str(folder)
        argv = [a.replace(DIR_TOKEN, token) for a in job.argv]
        env = {**os.environ, **{k: v.replace(DIR_TOKEN, token) for k, v in job.env.items()}}
        chosen: dict[str, str] = {}
        if job.rendezvous is not None:
            chosen.update(rendezvous_env(job.rendezvous, env))
        if job.omp_share is not None and OMP_ENV not in env:
            chosen[OMP_ENV] = str(omp_threads(local_cores(), job.omp_share))
        if chosen:
            self.report(env=chosen)
        env.update(chosen)
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        if self.janitor >= 0:
            with contextlib.suppress(OSError):
                os.write(self.janitor, f" {child.pid}\n".encode())  # its group, should we die
        pumps = [
            threading.Thread(target=self.pump, args=(child.stdout, sys.stdout), daemon=True),
            threading.Thread(target=self.pump, args=(child.stderr, sys.stderr), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self.watch_stdin, daemon=True).start()
        ready = folder / job.ready_file if job.ready_file else None
        while child.poll() is None and not self.stop.is_set():
            if ready is not None and ready.exists():
                with contextlib.suppress(ValueError, OSError, KeyError):
                    info = json.loads(ready.read_text())
                    self.report(ready=[str(info["host"]), int(info["port"])])
                    ready = None
            if job.heartbeat > 0 and time.monotonic() - self.last_line > job.heartbeat:
                self.why = f"no word from the launcher for {job.heartbeat:g} s"
                break
            self.stop.wait(0.02)
        if child.poll() is None:
            self.write(sys.stderr, f"[agent] {self.why}; stopping pid {child.pid}\n")
            _stop_group(child, job.grace)
        code = child.wait()
        # Whatever the child left in its group (a server's workers, a trainer's loaders) goes too.
        _stop_group(child, 0.0)
        for pump in pumps:
            pump.join(timeout=2)
        return exit_status(code)


def _stop_group(child: subprocess.Popen[bytes], grace: float) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(child.pid):
        child.poll()
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


#: The janitor (stdlib only, so it starts fast): argv is the pipe's read end and the folder.
_JANITOR = """
import os, shutil, signal, sys, time
for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
fd, folder, said = int(sys.argv[1]), sys.argv[2], b""
while chunk := os.read(fd, 256):
    said += chunk
words = said.split()
if b"done" not in words:
    groups = [int(w) for w in words if w.isdigit()]
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while groups and time.monotonic() < deadline:
        try:
            os.killpg(groups[-1], 0)
        except OSError:
            break
        time.sleep(0.02)
shutil.rmtree(folder, ignore_errors=True)
"""


def _start_janitor(folder: Path) -> int:
    """Start the janitor of ``folder``; returns the pipe's write end (the agent's alone)."""
    read_end, write_end = os.pipe()  # both close-on-exec: the child never holds them
    try:
        subprocess.Popen(
            [sys.executable, "-c", _JANITOR, str(read_end), str(folder)],
            pass_fds=(read_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a kill of the agent's group leaves it
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return write_end


def main() -> int:
    """Read the job, run it, return its status (2: an unreadable job line)."""
    line = sys.stdin.readline()
    try:
        job = Job.model_validate_json(line)
    except ValueError as exc:
        print(f"asyncgraph.launch.remote: bad job line: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="asyncgraph-job-"))
    try:
        janitor = _start_janitor(folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    agent = _Agent(job, sys.stdin, janitor)

    def stop_on_signal(signum: int, frame: object) -> None:
        agent.why = f"got {signal.Signals(signum).name}"
        agent.stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on_signal)
    try:
        return agent.run(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.write(janitor, b" done\n")  # cleaned up here: the janitor only exits
        os.close(janitor)


if __name__ == "__main__":
    sys.exit(main())
