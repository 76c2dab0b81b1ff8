"""DGL's usual import path for its layers: ``import dgl.nn.pytorch as dglnn`` becomes
``import asyncgraph.nn.pytorch as dglnn`` (the same classes as ``asyncgraph.nn``)."""

from asyncgraph.nn.conv import GraphConv, WeightBasis
from asyncgraph.nn.hetero import HeteroGraphConv, HeteroGraphSAGE
from asyncgraph.nn.sage import GraphSAGE, SAGEConv

__all__ = ["GraphConv", "GraphSAGE", "HeteroGraphConv", "HeteroGraphSAGE", "SAGEConv", "WeightBasis"]
