# DGL's distributed node-classification tutorial, partition part (dgl/tutorials/dist/
# 1_node_classification.py, DGL 2.x; code blocks of "Partition a graph" in order), copied with
# `import dgl` -> `import asyncgraph as dgl`. Lines that differ from DGL's text (marked `# differs`):
#   - the dataset lines: DGL loads ogbn-products with `ogb`; here the shipped npz (path in argv[1])
#     is loaded into `dgl.graph((src, dst), num_nodes=)` with its features as ndata['feat'] (as
#     ogb's graph carries them), labels as `labels`, and the split from its masks instead of
#     `data.get_idx_split()`;
#   - `num_parts=4` -> `num_parts=2`;
#   - the tutorial shows partition_graph twice (without, then with return_mapping=True, both into
#     4part_data); only the second is run, and `node_emb` (undefined in the tutorial, "assume the
#     trained node embeddings are stored in node_emb") is a random tensor.
import os
import sys  # differs
os.environ['DGLBACKEND'] = 'pytorch'
import asyncgraph as dgl
import torch as th
import numpy as np  # differs
data = np.load(sys.argv[1])  # differs
graph = dgl.graph((th.from_numpy(data['src']), th.from_numpy(data['dst'])), num_nodes=len(data['label']))  # differs
graph.ndata['feat'] = th.from_numpy(data['feat'])  # differs
labels = th.from_numpy(data['label'])  # differs
graph.ndata['labels'] = labels

train_nid, val_nid, test_nid = [th.from_numpy(np.flatnonzero(data[k])) for k in ('train_mask', 'val_mask', 'test_mask')]  # differs
train_mask = th.zeros((graph.num_nodes(),), dtype=th.bool)
train_mask[train_nid] = True
val_mask = th.zeros((graph.num_nodes(),), dtype=th.bool)
val_mask[val_nid] = True
test_mask = th.zeros((graph.num_nodes(),), dtype=th.bool)
test_mask[test_nid] = True
graph.ndata['train_mask'] = train_mask
graph.ndata['val_mask'] = val_mask
graph.ndata['test_mask'] = test_mask

node_emb = th.randn(graph.num_nodes(), 16)  # differs
nmap, emap = dgl.distributed.partition_graph(graph, graph_name='ogbn-products',
                                             num_parts=2,  # differs
                                             out_path='4part_data',
                                             balance_ntypes=graph.ndata['train_mask'],
                                             balance_edges=True,
                                             return_mapping=True)
orig_node_emb = th.zeros(node_emb.shape, dtype=node_emb.dtype)
orig_node_emb[nmap] = node_emb
