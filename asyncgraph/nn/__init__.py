"""GNN layers and models that consume ``Block``s."""

from asyncgraph.nn.hetero import HeteroGraphConv, HeteroGraphSAGE
from asyncgraph.nn.sage import GraphSAGE, SAGEConv

__all__ = ["GraphSAGE", "HeteroGraphConv", "HeteroGraphSAGE", "SAGEConv"]
