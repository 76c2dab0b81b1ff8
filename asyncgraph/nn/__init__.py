"""GNN layers and models that consume ``Block``s (``asyncgraph.nn.pytorch``: DGL's import path)."""

from asyncgraph.nn import pytorch
from asyncgraph.nn.conv import GraphConv, WeightBasis
from asyncgraph.nn.hetero import HeteroGraphConv, HeteroGraphSAGE
from asyncgraph.nn.sage import GraphSAGE, SAGEConv

__all__ = [
    "GraphConv",
    "GraphSAGE",
    "HeteroGraphConv",
    "HeteroGraphSAGE",
    "SAGEConv",
    "WeightBasis",
    "pytorch",
]
