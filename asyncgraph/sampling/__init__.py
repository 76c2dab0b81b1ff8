"""Neighbour sampling kernels (pure numpy) run by the partition servers."""

from asyncgraph.sampling.kernel import in_degrees, sample_csc

__all__ = ["in_degrees", "sample_csc"]
