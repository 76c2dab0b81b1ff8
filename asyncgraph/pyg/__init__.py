"""asyncgraph as PyG's distributed backend (``pip install asyncgraph[pyg]``).

PyG's remote-backend interface over a ``DistGraph`` (:class:`DistFeatureStore`,
:class:`DistGraphStore`), PyG's ``BaseSampler`` with the sampling done by asyncgraph's servers
(:class:`DistNeighborSampler`: ``torch_geometric.loader.NodeLoader``/``LinkLoader`` take it), and
prefetching loaders that yield PyG ``Data``/``HeteroData`` (:class:`DistNeighborLoader`,
:class:`DistLinkNeighborLoader`: the names of PyG's deprecated distributed loaders). Needs
``torch_geometric`` only (pure Python); no pyg-lib or torch-sparse.
"""

from __future__ import annotations

try:
    import torch_geometric  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("asyncgraph.pyg needs torch_geometric: pip install 'asyncgraph[pyg]'") from exc

from .attrs import PYG_ALIASES
from .dist_context import DistContext, DistRole
from .feature_store import DistFeatureStore
from .graph_store import DistGraphStore
from .in_memory import LinkNeighborLoader, NeighborLoader
from .link_loader import DistLinkNeighborLoader
from .loader import DistNeighborLoader
from .local_stores import LocalFeatureStore, LocalGraphStore
from .sampler import DistNeighborSampler, sample_hops

__all__ = [
    "PYG_ALIASES",
    "DistContext",
    "DistFeatureStore",
    "DistGraphStore",
    "DistLinkNeighborLoader",
    "DistNeighborLoader",
    "DistNeighborSampler",
    "DistRole",
    "LinkNeighborLoader",
    "LocalFeatureStore",
    "LocalGraphStore",
    "NeighborLoader",
    "sample_hops",
]
