"""Shared fixtures: PubMed partitioned once per session, servers started per test module."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data"


@dataclass
class PartitionedGraph:
    """A partitioned dataset with the original arrays and the new->original ID mapping."""

    part_config: Path
    num_parts: int
    raw: dict[str, np.ndarray]
    orig_nids: np.ndarray
    orig_eids: np.ndarray

    def original_rows(self, key: str, new_ids: np.ndarray) -> np.ndarray:
        return self.raw[key][self.orig_nids[np.asarray(new_ids, dtype=np.int64)]]


def _partition(name: str, num_parts: int, out: Path, method: str = "metis") -> PartitionedGraph:
    from asyncgraph.partition import partition_graph
    from asyncgraph.partition.graph import Graph

    raw = dict(np.load(DATA / f"{name}.npz"))
    graph = Graph.from_npz(DATA / f"{name}.npz")
    orig_nids, orig_eids = partition_graph(
        graph, name, num_parts, out, part_method=method, return_mapping=True
    )
    return PartitionedGraph(
        out / f"{name}.json", num_parts, raw, np.asarray(orig_nids), np.asarray(orig_eids)
    )


@pytest.fixture(scope="session")
def pubmed2(tmp_path_factory: pytest.TempPathFactory) -> PartitionedGraph:
    return _partition("pubmed", 2, tmp_path_factory.mktemp("pubmed2") / "out")


@pytest.fixture(scope="session")
def pubmed1(tmp_path_factory: pytest.TempPathFactory) -> PartitionedGraph:
    return _partition("pubmed", 1, tmp_path_factory.mktemp("pubmed1") / "out")


@pytest.fixture(scope="session")
def cora2(tmp_path_factory: pytest.TempPathFactory) -> PartitionedGraph:
    return _partition("cora", 2, tmp_path_factory.mktemp("cora2") / "out")


@pytest.fixture(scope="module")
def served(pubmed2: PartitionedGraph, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two PubMed servers (``asyncgraph.testing.ServerGroup``) for the tests of one module."""
    from asyncgraph.testing import start_servers

    group = start_servers(pubmed2.part_config, tmp_path_factory.mktemp("served"), num_parts=2)
    yield group
    group.stop()


@pytest.fixture(params=["served", "standalone"])
def g(request: pytest.FixtureRequest, pubmed2: PartitionedGraph) -> Iterator[Any]:
    """A ``DistGraph`` of PubMed, once over the module's servers and once standalone."""
    import asyncgraph

    if request.param == "served":
        asyncgraph.initialize(request.getfixturevalue("served").ip_config())
        graph = asyncgraph.DistGraph("pubmed")
    else:
        asyncgraph.initialize()
        graph = asyncgraph.DistGraph("pubmed", part_config=pubmed2.part_config)
    yield graph
    asyncgraph.finalize()
