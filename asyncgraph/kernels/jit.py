"""Numba kernels loaded in the background, so no request or batch waits for a compiler.

Importing numba and loading a kernel set from numba's on-disk cache (``cache=True``) takes ~1 s
here; compiling it takes seconds more and holds the GIL (and with it an event loop) that long.
A ``BackgroundJit`` therefore builds its set on a daemon thread (``warm_up``) after compiling it
into the cache in a child process, once per machine and source (a marker file beside numba's
index says it is done). Until the set is ``ready()`` callers take their numpy path. Without
numba, or with ``ASYNCGRAPH_NO_JIT=1``, it never becomes ready. The server's sampling kernels
(``kernels.compiled``) and the loaders' relabelling (``dataloading.relabel_kernel``) are two sets.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from asyncgraph.env import ENV_NO_JIT

__all__ = ["BackgroundJit", "disabled"]

K = TypeVar("K")


def disabled() -> bool:
    """True when ``ASYNCGRAPH_NO_JIT`` is set (to anything but 0): numpy paths only."""
    return os.environ.get(ENV_NO_JIT, "") not in ("", "0")


class BackgroundJit(Generic[K]):
    """One set of compiled kernels (``K``, what ``build`` returns), loaded in the background.

    ``module`` and ``builder`` name the module-level function that compiles every signature the
    callers use and returns the set (``None`` without numba): a child process runs it to fill
    the on-disk cache, then this process runs it to load the set.
    """

    def __init__(self, module: str, builder: str) -> None:
        self.module = module
        self.builder = builder
        self.kernels: K | None = None
        self.started = False
        self.loader_done = threading.Event()
        self._lock = threading.Lock()

    def _build(self) -> K | None:
        build: Callable[[], K | None] = getattr(importlib.import_module(self.module), self.builder)
        return build()

    def marker(self) -> Path:
        """A file saying this source's kernels are in numba's on-disk cache (next to its index)."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            numba_version = version("numba")
        except PackageNotFoundError:
            numba_version = "none"
        source = importlib.import_module(self.module).__file__
        assert source is not None
        key = Path(source).read_bytes() + sys.version.encode() + numba_version.encode()
        digest = hashlib.sha256(key).hexdigest()[:16]
        return Path(source).parent / "__pycache__" / f"{Path(source).stem}-ready-{digest}"

    def _prime_cache(self) -> None:
        """Compile into the on-disk cache in a child process, unless already done for this source.

        In a child, compiling costs this process nothing but the wait, and the in-process build
        then only loads the cache. Best effort: a failed or unwritable cache leaves the
        in-process build to compile.
        """
        if self.marker().exists():
            return
        code = f"from {self.module} import {self.builder}; {self.builder}()"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [sys.executable, "-c", code],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=300,
                check=True,
            )

    def _load(self) -> None:
        try:
            self._prime_cache()
            kernels = self._build()
            with self._lock:
                self.kernels = kernels
            if kernels is not None:
                with contextlib.suppress(OSError):
                    self.marker().touch()
        finally:
            self.loader_done.set()

    def warm_up(self) -> None:
        """Load the set on a daemon thread (once per process; a no-op when disabled)."""
        with self._lock:
            if self.started or disabled():
                return
            self.started = True
        threading.Thread(target=self._load, name="asyncgraph-jit", daemon=True).start()

    def ready(self) -> bool:
        """True once the set is loaded; starts loading it on first call."""
        if self.kernels is None:
            self.warm_up()
            return False
        return True

    def state(self) -> str:
        """``"compiled"`` (loaded), ``"loading"`` (started, not done yet) or ``"numpy"``
        (disabled, not started, or failed to load): which path a caller gets now."""
        if self.kernels is not None:
            return "compiled"
        if self.started and not self.loader_done.is_set():
            return "loading"
        return "numpy"

    def wait_ready(self, timeout: float) -> bool:
        """Start loading and wait up to ``timeout`` s for the set (benchmarks that measure the
        steady state, tests); False if it did not load (disabled, no numba, too slow)."""
        if disabled():
            return False
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() >= deadline or (self.started and self.loader_done.is_set()):
                return self.ready()
            time.sleep(0.02)
        return True
