"""A graph declared without parallel edges (``partition_graph(..., multigraph=False)``, issue
35): ``add_edges`` of an edge that is live already, or twice in one call, is a typed error that
changes nothing, on real servers and standalone; a removed edge may be added again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import asyncgraph
from asyncgraph import DistGraph
from asyncgraph.client import Client
from asyncgraph.errors import DuplicateEdgeError
from asyncgraph.testing import start_servers

N = 200


def ring() -> asyncgraph.Graph:
    """``i -> i+1`` and ``i -> i+7`` (mod N): no parallel edges."""
    src = np.concatenate([np.arange(N), np.arange(N)])
    dst = np.concatenate([(np.arange(N) + 1) % N, (np.arange(N) + 7) % N])
    return asyncgraph.graph((src, dst), num_nodes=N)


@pytest.fixture(scope="module")
def simple_parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("simple")
    asyncgraph.partition_graph(ring(), "ring", 2, out, part_method="random", multigraph=False)
    return out / "ring.json"


def test_partitioning_checks_the_declaration(tmp_path: Path) -> None:
    g = asyncgraph.graph((np.array([0, 1, 0]), np.array([1, 2, 1])), num_nodes=3)
    with pytest.raises(DuplicateEdgeError, match="0 -> 1"):
        asyncgraph.partition_graph(g, "dup", 1, tmp_path / "out", multigraph=False)
    assert not (tmp_path / "out").exists()
    asyncgraph.partition_graph(g, "dup", 1, tmp_path / "ok")  # a multigraph by default
    hetero = asyncgraph.heterograph(  # the same pair under two relations is no parallel edge
        {("a", "r", "a"): ([0], [1]), ("a", "s", "a"): ([0], [1])}, {"a": 2}
    )
    asyncgraph.partition_graph(hetero, "h", 1, tmp_path / "h", multigraph=False)


@pytest.fixture(scope="module")
def graphs(simple_parts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[DistGraph]]:
    group = start_servers(
        simple_parts, tmp_path_factory.mktemp("run"), num_parts=2, extra_args=["--log-level", "WARNING"]
    )
    clients = [Client.standalone(simple_parts), Client.connect(group.addresses, use_shared_memory=False)]
    try:
        yield [DistGraph("ring", client=c) for c in clients]
    finally:
        for c in clients:
            c.close()
        group.stop()


def _live(g: DistGraph) -> int:
    """How many live edges the graph lists (base + added - removed)."""
    return int(g.edges()[0].numel())


@pytest.mark.timeout(120)
def test_parallel_edges_are_refused_and_change_nothing(graphs: list[DistGraph]) -> None:
    for g in graphs:
        assert _live(g) == 2 * N
        with pytest.raises(DuplicateEdgeError, match="5 -> 6"):  # a base edge
            g.add_edges([10, 5], [30, 6])
        with pytest.raises(DuplicateEdgeError, match="3 -> 50"):  # twice in one call
            g.add_edges([3, 4, 3], [50, 51, 50])
        assert _live(g) == 2 * N  # nothing added
        new = g.add_edges([3, 4], [50, 51])
        with pytest.raises(DuplicateEdgeError, match="4 -> 51"):  # a live added edge
            g.add_edges([4], [51])
        g.remove_edges(new[1:])
        again = g.add_edges([4], [51])  # removed, so it may come back (a new ID)
        assert int(again[0]) != int(new[1])
        base = g.find_edges([0])
        g.remove_edges([0])
        g.add_edges(base[0], base[1])  # a removed base edge too
        with pytest.raises(DuplicateEdgeError):
            g.add_edges(base[0], base[1])
        assert _live(g) == 2 * N + 2  # 3 -> 50 and 4 -> 51 (again); edge 0 back under a new ID
