"""The graph server: one asyncio process per partition (``python -m asyncgraph.server``)."""
