"""``python -m asyncgraph.launch``: start servers and trainers, locally or over ssh.

Locally it starts one server per partition on 127.0.0.1 (ephemeral ports, a fresh shared
secret), waits until each has written its ready file, then starts the trainers
(``processes.plan_trainers``) with everything ``asyncgraph.initialize`` and ``torch.distributed``
need in their environment. Every line a process prints is prefixed with its role and rank. When a process
fails, on Ctrl-C, or when every trainer has finished, it stops every process it started and exits
with the failing process's status in the shell's convention (128 + N for a process killed by
signal N; 0 when all trainers succeeded); SIGINT, SIGTERM and SIGHUP of the launcher stop
everything and exit 130, 143 and 129.

No orphans (``asyncgraph.launch.lifeline``): every child gets a parent-death signal (SIGTERM) and a
watchdog process holds a pipe from the launcher, so even a SIGKILLed launcher takes its servers,
trainers and their children down within the grace period, and the launch directory (secret,
ready files, ip_config) is removed when the job ends however it ends.
Unless ``OMP_NUM_THREADS`` is set, each trainer gets ``OMP_NUM_THREADS`` = its host's cores /
trainers on that host (at least 1), as torchrun does, so co-located trainers do not
oversubscribe the cores.

CPU trainers: ``--num-trainers T`` per partition (default 1). With ``--num-gpus-per-host N`` (or
``auto``: ``torch.cuda.device_count()`` on this host, taken for every host) there is one trainer
per GPU of each host, ``N`` on every host however many partitions it serves (each trainer
reaches every partition), or ``T`` per partition when ``--num-trainers`` is given, refused
(exit 2, naming both numbers) where a host would get more trainers than GPUs. ``LOCAL_RANK``
counts the trainers of one host (all local names are one host), trainer ``LOCAL_RANK`` uses
``cuda:LOCAL_RANK`` and ``ASYNCGRAPH_DDP_BACKEND=nccl``; otherwise trainers get ``cpu`` and
``gloo``. ``auto`` on a host without GPUs is an error (use ``--num-trainers`` for CPU trainers).

With ``--ip-config`` naming other hosts, servers and trainers are started there with ``ssh``
(key-based, non-interactive), in the same working directory, each under an agent
(``asyncgraph.launch.remote``) that gets its job, the secret included, over the ssh channel's
stdin, reports the server's readiness back over it, and stops its process when the channel
closes or goes silent (a heartbeat every second): no shared file system is needed for the
secret, ready files or ip_config, and no process outlives the job on any host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from asyncgraph.launch.lifeline import die_with_parent, exit_status
from asyncgraph.launch.remote import Job, parse_report

#: Seconds between the heartbeats the launcher writes to each remote agent.
HEARTBEAT_INTERVAL = 1.0


@dataclass
class Proc:
    """A process the launcher started."""

    role: str
    rank: int
    popen: subprocess.Popen[bytes]
    pumps: list[threading.Thread] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    #: A remote process's host (it runs under ``asyncgraph.launch.remote`` over ssh), else None.
    host: str | None = None
    #: Where a local server writes its ready file.
    ready_file: Path | None = None
    #: The server's bound ``(host, port)`` once ready (its ready file, or its agent's report).
    ready: tuple[str, int] | None = None

    def poll(self) -> int | None:
        """The exit status once it has exited (noting when), else None."""
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank}"


class Launcher:
    """Owns every process it starts and stops them all on the way out."""

    def __init__(self, *, ready_timeout: float = 60.0, grace: float = 5.0) -> None:
        self.procs: list[Proc] = []
        self.ready_timeout = ready_timeout
        self.grace = grace
        self._print_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._heartbeat: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- the watchdog ----------------------------------------------------------------------
    def start_watchdog(self, launch_dir: Path) -> None:
        """Start the process that cleans up after us if we die (see ``asyncgraph.launch.lifeline``)."""
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncgraph.launch.lifeline",
                "--dir",
                str(launch_dir),
                "--grace",
                str(self.grace),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or hang-up of our group must not take it first
        )

    def _tell_watchdog(self, line: str) -> None:
        dog = self._watchdog
        if dog is not None and dog.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                dog.stdin.write(line.encode() + b"\n")
                dog.stdin.flush()

    def stop_watchdog(self) -> None:
        """We cleaned up ourselves: tell the watchdog so and let it go."""
        dog = self._watchdog
        if dog is None:
            return
        self._tell_watchdog("done")
        with contextlib.suppress(OSError, ValueError):
            assert dog.stdin is not None
            dog.stdin.close()
        try:
            dog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            dog.kill()
            dog.wait(timeout=5)
        self._watchdog = None

    # --- processes -------------------------------------------------------------------------
    def spawn(
        self,
        role: str,
        rank: int,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        ready_file: Path | None = None,
        remote: tuple[str, Job] | None = None,
    ) -> Proc:
        """Start ``argv``; with ``remote=(host, job)``, ``argv`` is the ssh command of an agent
        on ``host`` and ``job`` is written to its stdin, which stays open as its lifeline."""
        popen = subprocess.Popen(
            list(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL if remote is None else subprocess.PIPE,
            start_new_session=True,  # its own process group, so we can stop its children too
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        self._tell_watchdog(f"pgid {popen.pid}")
        proc = Proc(role, rank, popen, ready_file=ready_file)
        if remote is not None:
            proc.host = remote[0]
            self._send(proc, remote[1].model_dump_json())
            self._start_heartbeat()
        for stream, sink in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
            assert stream is not None
            pump = threading.Thread(target=self._pump, args=(proc, stream, sink), daemon=True)
            pump.start()
            proc.pumps.append(pump)
        self.procs.append(proc)
        return proc

    def _send(self, proc: Proc, line: str) -> None:
        """A line to a remote process's agent (lost quietly if the channel is gone)."""
        pipe = proc.popen.stdin
        if pipe is not None:
            with self._send_lock, contextlib.suppress(OSError, ValueError):
                pipe.write(line.encode() + b"\n")
                pipe.flush()

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, daemon=True)
            self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stopping.wait(HEARTBEAT_INTERVAL):
            for proc in list(self.procs):
                if proc.host is not None and proc.popen.poll() is None:
                    self._send(proc, "ping")

    def _pump(self, proc: Proc, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            report = parse_report(line) if proc.host is not None else None
            if report is not None:
                if "ready" in report:
                    host, port = report["ready"]
                    proc.ready = (str(host), int(port))
                if "env" in report:
                    chosen = " ".join(f"{k}={v}" for k, v in report["env"].items())
                    self._say(f"{proc.label} on {proc.host}: {chosen}")
                continue
            with self._print_lock:
                print(f"[{proc.label}] {line}", file=sink, flush=True)
        stream.close()

    def stop_all(self) -> None:
        """SIGTERM every live process group we started, then SIGKILL after a grace period."""
        live = [p for p in self.procs if p.popen.poll() is None]
        for proc in live:
            if proc.host is None:
                _signal_group(proc.popen, signal.SIGTERM)
            else:  # its agent stops it (SIGTERM, SIGKILL after the same grace) and reports back
                self._send(proc, "stop")
                with contextlib.suppress(OSError, ValueError):
                    assert proc.popen.stdin is not None
                    proc.popen.stdin.close()
        deadline = time.monotonic() + self.grace
        for proc in live:
            # a remote agent gets its own grace plus a moment to say so over ssh
            extra = 0.0 if proc.host is None else 2.0
            try:
                proc.popen.wait(timeout=max(0.0, deadline + extra - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.popen, signal.SIGKILL)
                proc.popen.wait(timeout=5)
        self._stopping.set()
        for proc in self.procs:
            proc.poll()
            for pump in proc.pumps:
                pump.join(timeout=2)

    def summary(self) -> list[str]:
        """One line per role: how many, their exit statuses (negative: killed by that signal,
        -15 is the launcher's SIGTERM at the end) and wall time from first start to last exit."""
        lines = []
        for role in dict.fromkeys(p.role for p in self.procs):
            procs = [p for p in self.procs if p.role == role]
            codes = [p.popen.returncode for p in procs]
            ends = [p.ended for p in procs if p.ended is not None]
            wall = (max(ends) if ends else time.monotonic()) - min(p.started for p in procs)
            stopped = (0, -signal.SIGTERM, 128 + signal.SIGTERM, None)  # 143: a remote one we stopped
            failed = sum(1 for c in codes if c not in stopped)
            shown = " ".join("?" if c is None else str(c) for c in codes)
            lines.append(
                f"role={role} count={len(procs)} exit_codes={shown.replace(' ', ',')} "
                f"failed={failed} wall_s={wall:.1f}"
            )
        return lines

    # --- waiting ---------------------------------------------------------------------------
    def wait_ready(self, servers: list[Proc]) -> list[tuple[str, int]]:
        """Every server's bound ``(host, port)`` once each is ready: a local one's ready file, a
        remote one's report over its channel. ``LaunchError`` if one exits first or time runs out."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            for proc in servers:
                if proc.ready is None and proc.ready_file is not None and proc.ready_file.exists():
                    with contextlib.suppress(ValueError, OSError, KeyError):
                        info = json.loads(proc.ready_file.read_text())
                        proc.ready = (str(info["host"]), int(info["port"]))
                code = proc.poll()
                if code is not None and proc.ready is None:
                    for pump in proc.pumps:  # its last words first
                        pump.join(timeout=2)
                    status = exit_status(code)
                    where = f" on {proc.host}" if proc.host else ""
                    raise LaunchError(
                        f"{proc.label}{where} exited with status {status} before it was ready", status or 1
                    )
            if all(p.ready is not None for p in servers):
                return [p.ready for p in servers if p.ready is not None]
            if time.monotonic() > deadline:
                late = ", ".join(p.label for p in servers if p.ready is None)
                raise LaunchError(f"servers not ready after {self.ready_timeout:g} s: {late}", 1)
            time.sleep(0.01)

    def wait_trainers(
        self,
        trainers: list[Proc],
        servers: list[Proc],
        restart: Callable[[int], Proc] | None = None,
        restarts: int = 0,
    ) -> int:
        """Block until all trainers end (0) or one fails / a server dies (its status).

        With ``restart`` and ``restarts > 0``, a dead server is started again (``restart(i)``
        returns it once ready) up to ``restarts`` times in all, instead of stopping the job.
        """
        remaining = set(range(len(trainers)))
        while remaining:
            for i in sorted(remaining):
                code = trainers[i].poll()
                if code is None:
                    continue
                remaining.discard(i)
                if code != 0:
                    code = exit_status(code)
                    self._say(f"{trainers[i].label} failed with status {code}; stopping every process")
                    return code
            for index, proc in enumerate(servers):
                code = proc.poll()
                if code is not None and remaining:
                    if restart is not None and restarts > 0:
                        restarts -= 1
                        self._say(f"{proc.label} exited with status {code}; restarting it from its state")
                        servers[index] = restart(index)
                        continue
                    code = exit_status(code)
                    self._say(f"{proc.label} exited with status {code} while trainers ran; stopping")
                    return code or 1
            time.sleep(0.05)
        return 0

    def _say(self, message: str) -> None:
        with self._print_lock:
            print(f"[launcher] {message}", file=sys.stderr, flush=True)


class LaunchError(RuntimeError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Signalled(BaseException):
    """The launcher received a terminating signal (SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def raise_signalled(signum: int, frame: object) -> None:
    raise Signalled(signum)


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)
