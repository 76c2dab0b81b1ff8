"""The on-disk layout of a partitioned graph, spelled once for ``partition_graph`` and the reader.

::

    out/<graph_name>.json               PartitionConfig
    out/orig_nids.npy                   int64 [num_nodes]: original ID of every new node ID
    out/orig_eids.npy                   int64 [num_edges]: original ID of every new edge ID
    out/part<p>/indptr.npy              int64 [n_owned + 1]
    out/part<p>/indices.npy             int64 [e_owned], global source IDs
    out/part<p>/eids.npy                int64 [e_owned], global edge IDs
    out/part<p>/node_feat/<name>.npy    rows of owned nodes
    out/part<p>/edge_feat/<name>.npy    rows of owned edges
    out/part<p>/node_feat/<ntype>/<name>.npy        heterogeneous: rows of owned nodes of the type
    out/part<p>/edge_feat/<src:rel:dst>/<name>.npy  heterogeneous: rows of owned edges of the type
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ORIG_EIDS_FILE", "ORIG_NIDS_FILE", "PartFiles", "config_file", "part_dir_name"]

#: The ID mappings ``partition_graph`` writes beside the config (``orig_nids[new] == old``).
ORIG_NIDS_FILE = "orig_nids.npy"
ORIG_EIDS_FILE = "orig_eids.npy"


def config_file(out: Path, graph_name: str) -> Path:
    """The JSON config of graph ``graph_name`` partitioned into folder ``out``."""
    return out / f"{graph_name}.json"


def part_dir_name(part_id: int) -> str:
    """Partition ``part_id``'s folder, relative to the config (``PartSpec.path``)."""
    return f"part{part_id}"


@dataclass(frozen=True)
class PartFiles:
    """The files of one partition folder."""

    folder: Path

    @property
    def indptr(self) -> Path:
        return self.folder / "indptr.npy"

    @property
    def indices(self) -> Path:
        return self.folder / "indices.npy"

    @property
    def eids(self) -> Path:
        return self.folder / "eids.npy"

    @property
    def node_feat_dir(self) -> Path:
        return self.folder / "node_feat"

    @property
    def edge_feat_dir(self) -> Path:
        return self.folder / "edge_feat"

    def node_feat(self, name: str) -> Path:
        return self.node_feat_dir / f"{name}.npy"

    def edge_feat(self, name: str) -> Path:
        return self.edge_feat_dir / f"{name}.npy"
