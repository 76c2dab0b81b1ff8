"""Typed forwarding of a method to a part of an object, for classes composed of parts.

``AsyncClient`` offers its parts' methods (``pull = forward("reads", TensorReads.pull)``) and
the blocking ``Client`` wraps ``AsyncClient``'s the same way (``sync_client.blocking``): each
signature is written once, where the method is implemented, and mypy checks every caller
against it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

__all__ = ["P", "R", "forward"]

P = ParamSpec("P")
R = TypeVar("R")


def forward(part: str, method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method that calls ``method`` on ``self.<part>`` (same signature, docstring and result:
    a coroutine method forwards its coroutine unawaited, so the forward costs no extra frame)."""

    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(getattr(self, part), *args, **kwargs)

    functools.update_wrapper(call, method)
    return call
