"""Shared fixtures: PubMed partitioned once per session, servers started per test module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    from asyncgraph.graph import Graph
    from asyncgraph.partition import partition_graph

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
