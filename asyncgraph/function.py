"""DGL's built-in message and reduce functions (``dgl.function``, imported as ``fn``).

``fn.u_dot_v("h", "h", "score")`` and friends are descriptions, not code: a block or pair graph's
``apply_edges`` / ``update_all`` (``asyncgraph.dataloading.frames.GraphOps``) evaluates them with
one vectorised gather per side and one ``index_add`` / ``scatter_reduce`` per reduction, never a
Python loop over edges. Names and output shapes follow DGL: ``*_dot_*`` gives ``[E, 1]``; the
other binary ops broadcast elementwise; ``copy_u``/``copy_e`` copy a field onto the edges.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from asyncgraph.errors import InvalidRequestError

__all__ = [
    "BinaryMessage",
    "CopyMessage",
    "Reduce",
    "copy_e",
    "copy_edge",
    "copy_src",
    "copy_u",
    "e_add_u",
    "e_add_v",
    "e_dot_u",
    "e_dot_v",
    "e_mul_u",
    "e_mul_v",
    "max",
    "mean",
    "min",
    "sum",
    "u_add_e",
    "u_add_v",
    "u_div_e",
    "u_div_v",
    "u_dot_e",
    "u_dot_v",
    "u_mul_e",
    "u_mul_v",
    "u_sub_e",
    "u_sub_v",
    "v_add_e",
    "v_add_u",
    "v_div_u",
    "v_dot_e",
    "v_dot_u",
    "v_mul_e",
    "v_mul_u",
    "v_sub_u",
]

_SIDES = ("u", "v", "e")
_OPS = ("add", "sub", "mul", "div", "dot")
_REDUCERS = ("sum", "mean", "max", "min")


@dataclass(frozen=True)
class BinaryMessage:
    """``out = lhs_field of side lhs <op> rhs_field of side rhs`` per edge (sides: u, v, e)."""

    lhs: str
    op: str
    rhs: str
    lhs_field: str
    rhs_field: str
    out: str


@dataclass(frozen=True)
class CopyMessage:
    """``out = field of side`` per edge (``copy_u``: the source's, ``copy_e``: the edge's)."""

    side: str
    field: str
    out: str


@dataclass(frozen=True)
class Reduce:
    """Reduce the messages ``msg`` arriving at each destination into its field ``out``."""

    op: str
    msg: str
    out: str


def _binary(lhs: str, op: str, rhs: str) -> Callable[[str, str, str], BinaryMessage]:
    if lhs not in _SIDES or rhs not in _SIDES or op not in _OPS:
        raise InvalidRequestError(f"unknown message function {lhs}_{op}_{rhs}")

    def make(lhs_field: str, rhs_field: str, out: str) -> BinaryMessage:
        return BinaryMessage(lhs, op, rhs, lhs_field, rhs_field, out)

    make.__name__ = f"{lhs}_{op}_{rhs}"
    make.__doc__ = f"Edge message ``{lhs}.lhs_field {op} {rhs}.rhs_field`` stored as edge field ``out``."
    return make


def copy_u(u: str, out: str) -> CopyMessage:
    """Message: the source node's field ``u``."""
    return CopyMessage("u", u, out)


def copy_e(e: str, out: str) -> CopyMessage:
    """Message: the edge's field ``e``."""
    return CopyMessage("e", e, out)


copy_src = copy_u  # DGL's older names
copy_edge = copy_e


def sum(msg: str, out: str) -> Reduce:
    """Reduce: sum of the incoming messages (zeros for a node without in-edges)."""
    return Reduce("sum", msg, out)


def mean(msg: str, out: str) -> Reduce:
    """Reduce: mean of the incoming messages (zeros for a node without in-edges)."""
    return Reduce("mean", msg, out)


def max(msg: str, out: str) -> Reduce:
    """Reduce: elementwise max of the incoming messages (zeros without in-edges)."""
    return Reduce("max", msg, out)


def min(msg: str, out: str) -> Reduce:
    """Reduce: elementwise min of the incoming messages (zeros without in-edges)."""
    return Reduce("min", msg, out)


u_add_v = _binary("u", "add", "v")
u_sub_v = _binary("u", "sub", "v")
u_mul_v = _binary("u", "mul", "v")
u_div_v = _binary("u", "div", "v")
u_dot_v = _binary("u", "dot", "v")
v_add_u = _binary("v", "add", "u")
v_sub_u = _binary("v", "sub", "u")
v_mul_u = _binary("v", "mul", "u")
v_div_u = _binary("v", "div", "u")
v_dot_u = _binary("v", "dot", "u")
u_add_e = _binary("u", "add", "e")
u_sub_e = _binary("u", "sub", "e")
u_mul_e = _binary("u", "mul", "e")
u_div_e = _binary("u", "div", "e")
u_dot_e = _binary("u", "dot", "e")
v_add_e = _binary("v", "add", "e")
v_mul_e = _binary("v", "mul", "e")
v_dot_e = _binary("v", "dot", "e")
e_add_u = _binary("e", "add", "u")
e_add_v = _binary("e", "add", "v")
e_mul_u = _binary("e", "mul", "u")
e_mul_v = _binary("e", "mul", "v")
e_dot_u = _binary("e", "dot", "u")
e_dot_v = _binary("e", "dot", "v")
REDUCERS = _REDUCERS
