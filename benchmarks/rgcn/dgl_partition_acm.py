"""ACM as the RGCN test builds it (tests/test_dgl_examples.py::_partition_acm), partitioned by DGL 2.1.

Run in the DGL venv: ``python dgl_partition_acm.py ACM_NPZ OUT_DIR NUM_PARTS``."""

from __future__ import annotations

import sys

import dgl
import numpy as np
import torch

if __name__ == "__main__":
    npz, out, nparts = sys.argv[1], sys.argv[2], int(sys.argv[3])
    z = np.load(npz)
    bits = np.unpackbits(z["words:paper"], axis=1)[:, : int(z["num_words"])].astype(np.float32)
    pa = tuple(torch.from_numpy(z[f"{e}:paper:written-by:author"]) for e in ("src", "dst"))
    ps = tuple(torch.from_numpy(z[f"{e}:paper:has-subject:subject"]) for e in ("src", "dst"))
    g = dgl.heterograph(
        {
            ("paper", "written-by", "author"): pa,
            ("author", "writes", "paper"): (pa[1], pa[0]),
            ("paper", "has-subject", "subject"): ps,
            ("subject", "subject-of", "paper"): (ps[1], ps[0]),
        },
        num_nodes_dict={t: int(z[f"num_nodes:{t}"]) for t in ("paper", "author", "subject")},
    )
    paper = g.nodes["paper"].data
    paper["feat"] = torch.from_numpy(bits / np.maximum(bits.sum(1, keepdims=True), 1.0))
    paper["labels"] = torch.from_numpy(z["label:paper"].astype(np.int64))
    for k in ("train_mask", "val_mask", "test_mask"):
        paper[k] = torch.from_numpy(z[f"{k}:paper"].astype(bool))
    dgl.distributed.partition_graph(g, "acm", nparts, out, part_method="random" if nparts > 1 else "metis")
