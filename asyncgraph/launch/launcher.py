"""``python -m asyncgraph.launch``: start servers and trainers, locally or over ssh.

Locally it starts one server per partition on 127.0.0.1 (ephemeral ports, a fresh shared
secret), waits until each has written its ready file, then starts ``num_trainers`` trainers per
partition with everything ``asyncgraph.initialize`` and ``torch.distributed`` need in their
environment. Every line a process prints is prefixed with its role and rank. When a process
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

With ``--num-gpus-per-host N`` (or ``auto``: ``torch.cuda.device_count()`` on this host) there
is one trainer per GPU: ``N`` trainers per partition (one partition per host, as DGL deploys),
trainer ``LOCAL_RANK`` uses ``cuda:LOCAL_RANK``, and ``ASYNCGRAPH_DDP_BACKEND=nccl``; otherwise
trainers get ``cpu`` and ``gloo``. ``auto`` on a host without GPUs is an error (use
``--num-trainers`` for CPU trainers).

With ``--ip-config`` naming other hosts, servers and trainers are started there with ``ssh``
(key-based, non-interactive), in the same working directory; the secret file must be reachable
at the same path on every host (a shared file system, as DGL's launcher assumes).
"""

from __future__ import annotations

import contextlib
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
from asyncgraph.launch.processes import (
    ServerExitedError,
    wait_ready_files,
)


@dataclass
class Proc:
    """A process the launcher started."""

    role: str
    rank: int
    popen: subprocess.Popen[bytes]
    pumps: list[threading.Thread] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

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
        self._watchdog: subprocess.Popen[bytes] | None = None

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
    def spawn(self, role: str, rank: int, argv: Sequence[str], env: dict[str, str]) -> Proc:
        popen = subprocess.Popen(
            list(argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so we can stop its children too
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        self._tell_watchdog(f"pgid {popen.pid}")
        proc = Proc(role, rank, popen)
        for stream, sink in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
            assert stream is not None
            pump = threading.Thread(target=self._pump, args=(proc.label, stream, sink), daemon=True)
            pump.start()
            proc.pumps.append(pump)
        self.procs.append(proc)
        return proc

    def _pump(self, label: str, stream: IO[bytes], sink: IO[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            with self._print_lock:
                print(f"[{label}] {line}", file=sink, flush=True)
        stream.close()

    def stop_all(self) -> None:
        """SIGTERM every live process group we started, then SIGKILL after a grace period."""
        live = [p for p in self.procs if p.popen.poll() is None]
        for proc in live:
            _signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for proc in live:
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc.popen, signal.SIGKILL)
                proc.popen.wait(timeout=5)
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
            failed = sum(1 for c in codes if c not in (0, -signal.SIGTERM, None))
            shown = " ".join("?" if c is None else str(c) for c in codes)
            lines.append(
                f"role={role} count={len(procs)} exit_codes={shown.replace(' ', ',')} "
                f"failed={failed} wall_s={wall:.1f}"
            )
        return lines

    # --- waiting ---------------------------------------------------------------------------
    def wait_ready(self, servers: list[Proc], ready_files: list[Path]) -> list[tuple[str, int]]:
        try:
            return wait_ready_files([p.popen for p in servers], ready_files, self.ready_timeout)
        except ServerExitedError as exc:
            status = exit_status(exc.status)
            raise LaunchError(
                f"{servers[exc.index].label} exited with status {status} before it was ready", status or 1
            ) from None
        except TimeoutError as exc:
            raise LaunchError(str(exc), 1) from None

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
