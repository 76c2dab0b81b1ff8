"""One rule for lazy exports: a package names ``attribute -> "module"`` (or ``"module:name"`` for
an alias) and gets a module ``__getattr__`` / ``__dir__`` that import on first use.

Packages export lazily so that a server process (or ``python -m asyncgraph.launch.health``) never
imports torch or the client stack it does not use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, targets: Mapping[str, str], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``targets`` is imported from its
    module on first access and cached in the package's namespace; names in ``submodules`` are
    the package's own submodules, imported on access."""
    subs = frozenset(submodules)

    def getattr_(name: str) -> Any:
        if name in subs:
            return importlib.import_module(f"{package}.{name}")
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, real = target.partition(":")
        value = getattr(importlib.import_module(module), real or name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *targets, *subs})

    return getattr_, dir_
