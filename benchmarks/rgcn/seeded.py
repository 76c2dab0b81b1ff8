"""Run a training script with torch/numpy/random seeded from ``RGCN_SEED`` (unset: unseeded).

``python seeded.py SCRIPT ARGS...`` seeds, then runs SCRIPT as ``__main__`` with ARGS: DGL's
examples have no seed, and this seeds them without editing them. Needs only torch and numpy, so it
runs in the DGL venv as well as ours. ``RGCN_DGL21=1`` makes DGL 2.1 offer the newer scripts'
``dgl.distributed.DistNodeDataLoader``; ``RGCN_OURS_STANDALONE=1`` makes asyncgraph ignore
``--ip-config`` as DGL does under ``DGL_DIST_MODE=standalone``."""

from __future__ import annotations

import os
import random
import runpy
import sys

import numpy as np
import torch

if __name__ == "__main__":
    seed = os.environ.get("RGCN_SEED")
    if seed is not None:
        random.seed(int(seed))
        np.random.seed(int(seed))
        torch.manual_seed(int(seed))
    if os.environ.get("RGCN_DGL21") == "1":  # DGL 2.1 has the loader only under dgl.dataloading
        import dgl
        import dgl.distributed

        dgl.distributed.DistNodeDataLoader = dgl.dataloading.DistNodeDataLoader  # type: ignore[attr-defined]
        mid = os.environ.get("DGLBENCH_MACHINE_ID")  # ../shared/peers/dgl/launch_local.py's emulated machine
        if mid is not None:  # every emulated machine is 127.0.0.1: DGL would take all for machine 0
            from dgl.distributed import rpc_client

            rpc_client.get_local_machine_id = lambda _namebook: int(mid)
        if "--standalone" in sys.argv:  # DGL's SparseAdam asks the process group for its backend
            import tempfile

            init = f"file://{tempfile.mkdtemp()}/pg"
            torch.distributed.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    if os.environ.get("RGCN_OURS_STANDALONE") == "1":  # as DGL_DIST_MODE=standalone: ignore ip_config
        import asyncgraph.distributed as agd

        init = agd.initialize
        agd.initialize = lambda ip_config=None, **kw: init(None, **kw)  # type: ignore[assignment,misc]
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
