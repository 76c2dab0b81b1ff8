"""The partition config: one JSON file describing a partitioned graph (pydantic model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from asyncgraph.errors import ForeignPartitionError
from asyncgraph.partition.book import RangePartitionBook

FORMAT_VERSION = 1


def dgl_partition_error(doc: Any, path: str | Path) -> ForeignPartitionError | None:
    """The error to raise when ``doc`` (a parsed JSON file) is a DGL partition config, else None.

    DGL's ``partition_graph`` writes ``graph_name``, ``part_method``, ``num_parts``, ``node_map``,
    ``edge_map`` and one ``part-<i>`` entry per part naming its ``node_feats``, ``edge_feats`` and
    ``part_graph`` files; asyncgraph's config has none of the last three kinds of key.
    """
    if not isinstance(doc, dict) or not ({"node_map", "edge_map"} & set(doc)):
        return None
    parts = [v for k, v in doc.items() if str(k).startswith("part-") and isinstance(v, dict)]
    if not any({"part_graph", "node_feats", "edge_feats"} & set(v) for v in parts):
        return None
    return ForeignPartitionError(
        f"{path} is a DGL partition (dgl.distributed.partition_graph output); asyncgraph cannot serve "
        "it: partition the original graph with `python -m asyncgraph.partition --input GRAPH.npz "
        "--graph-name NAME --num-parts N --out DIR` or `asyncgraph.partition_graph(g, ...)` (or DGL's "
        "chunked input with `python -m asyncgraph.partition --input CHUNKED_DIR --num-parts N --out DIR`)"
    )


class TensorSpec(BaseModel):
    """A stored tensor: numpy dtype string (e.g. ``"float32"``) and row shape (``[]`` for scalars)."""

    model_config = ConfigDict(frozen=True)

    dtype: str
    row_shape: list[int] = Field(default_factory=list)


class PartSpec(BaseModel):
    """One partition: its owned ID ranges and its folder, relative to the JSON file."""

    part_id: int
    node_range: tuple[int, int]
    edge_range: tuple[int, int]
    path: str
    #: SHA-256 of the config and this part's structure files, computed by the partitioner
    #: (``partition/fingerprint.py``); None in configs written before issue 34.
    fingerprint: str | None = None


class PartitionConfig(BaseModel):
    """Everything a server or client needs to know about a partitioned graph."""

    format_version: int = FORMAT_VERSION
    graph_name: str
    num_nodes: int
    num_edges: int
    num_parts: int
    part_method: str
    parts: list[PartSpec]
    node_feats: dict[str, TensorSpec] = Field(default_factory=dict)
    edge_feats: dict[str, TensorSpec] = Field(default_factory=dict)
    #: ID mapping files (relative to the JSON file): ``orig_nids[new_id] == original_id``.
    orig_nids: str | None = None
    orig_eids: str | None = None
    #: ``partition_graph``'s ``num_trainers_per_machine`` (node tensor ``trainer_id`` when > 1).
    num_trainers_per_machine: int = 1
    #: False: no parallel edges (of one relation); a live graph's ``add_edges`` refuses one.
    multigraph: bool = True
    # Heterogeneous graphs only: type names, per-part per-type counts, which tensors each type has.
    ntypes: list[str] | None = None
    canonical_etypes: list[tuple[str, str, str]] | None = None
    ntype_counts: list[list[int]] | None = None
    etype_counts: list[list[int]] | None = None
    ntype_feats: dict[str, list[str]] | None = None
    etype_feats: dict[str, list[str]] | None = None

    def book(self) -> RangePartitionBook:
        nb = [p.node_range[0] for p in self.parts] + [self.parts[-1].node_range[1]]
        eb = [p.edge_range[0] for p in self.parts] + [self.parts[-1].edge_range[1]]
        if self.ntypes is None:
            return RangePartitionBook(nb, eb)
        return RangePartitionBook(
            nb,
            eb,
            ntypes=self.ntypes,
            canonical_etypes=self.canonical_etypes,
            ntype_counts=self.ntype_counts,
            etype_counts=self.etype_counts,
            ntype_feats=self.ntype_feats,
            etype_feats=self.etype_feats,
        )

    @classmethod
    def load(cls, path: str | Path) -> PartitionConfig:
        """The config at ``path``; a DGL partition config raises :class:`ForeignPartitionError`."""
        text = Path(path).read_text()
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None  # pydantic names what is wrong below
        foreign = dgl_partition_error(doc, path)
        if foreign is not None:
            raise foreign
        cfg = cls.model_validate_json(text)
        if cfg.format_version != FORMAT_VERSION:
            raise ValueError(
                f"{path}: partition format version {cfg.format_version} is not supported "
                f"(this asyncgraph reads version {FORMAT_VERSION})"
            )
        return cfg

    def part_dir(self, config_path: str | Path, part_id: int) -> Path:
        """Absolute folder of partition ``part_id`` given where the JSON file lives."""
        return (Path(config_path).parent / self.parts[part_id].path).resolve()
