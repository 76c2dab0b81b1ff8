"""The partition config: one JSON file describing a partitioned graph (pydantic model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from asyncgraph.partition.book import RangePartitionBook

FORMAT_VERSION = 1


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
        cfg = cls.model_validate_json(Path(path).read_text())
        if cfg.format_version != FORMAT_VERSION:
            raise ValueError(
                f"{path}: partition format version {cfg.format_version} is not supported "
                f"(this asyncgraph reads version {FORMAT_VERSION})"
            )
        return cfg

    def part_dir(self, config_path: str | Path, part_id: int) -> Path:
        """Absolute folder of partition ``part_id`` given where the JSON file lives."""
        return (Path(config_path).parent / self.parts[part_id].path).resolve()
