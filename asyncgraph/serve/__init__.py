"""Online inference next to the graph (issue 36): ``python -m asyncgraph.serve``.

``artifact`` saves and loads a model folder, ``core`` runs one batch (the loaders' sampling and
pull, then the forward), ``batching`` merges concurrent requests, ``http`` speaks KServe's Open
Inference Protocol v2, ``client`` is the Python client. A layer over the client: it never
imports the server's internals. Nothing is imported here, so the Python client does not pay
for torch.
"""
