# The code snippets of DGL's user guide, "7.2 Distributed APIs" (dgl/docs/source/guide/
# distributed-apis.rst, DGL 2.x), in the guide's order, with `import dgl` -> `import asyncgraph as dgl`.
# Lines that differ from the guide's text (marked `# differs`):
#   - definitions the guide leaves to the reader: numpy import, `lr1`, `lr2`, `model`, `nids`,
#     `batch_size`, and `train_nid` (the guide computes it only in its last section);
#   - the graph name 'graph_name' -> 'ogbn-products' (what the tutorial's partition script wrote);
#   - `loss = model(feats)` -> `.sum()` added (the guide's model is a stand-in returning a loss);
#   - in `sample_blocks` the guide's indentation is broken (`return blocks` inside the loop, the
#     dataloader inside the function after the return); here the return ends the function and the
#     dataloader follows it, as the text intends;
#   - `...` loop bodies count the batches, and a last line prints what ran, for the test to read.
import asyncgraph as dgl
import torch as th
import numpy as np  # differs
lr1, lr2, batch_size = 0.05, 0.01, 32  # differs

dgl.distributed.initialize('ip_config.txt')
th.distributed.init_process_group(backend='gloo')

g = dgl.distributed.DistGraph('ogbn-products')  # differs

print(g.num_nodes())

g.ndata['train_mask']  # <dgl.distributed.dist_graph.DistTensor at 0x7fec820937b8>
g.ndata['train_mask'][0]  # tensor([1], dtype=torch.uint8)

tensor = dgl.distributed.DistTensor((g.num_nodes(), 10), th.float32, name='test')

g.ndata['feat'] = tensor

data = g.ndata['feat'][[1, 2, 3]]
print(data)
g.ndata['feat'][[3, 4, 5]] = data

def initializer(shape, dtype):
    arr = th.zeros(shape, dtype=dtype)
    arr.uniform_(-1, 1)
    return arr
emb = dgl.distributed.DistEmbedding(g.num_nodes(), 10, init_func=initializer)

model = th.nn.Linear(10, 1)  # differs
train_nid = dgl.distributed.node_split(g.ndata['train_mask'])  # differs
nids = train_nid  # differs
sparse_optimizer = dgl.distributed.SparseAdagrad([emb], lr=lr1)
optimizer = th.optim.Adam(model.parameters(), lr=lr2)
feats = emb(nids)
loss = model(feats).sum()  # differs
loss.backward()
optimizer.step()
sparse_optimizer.step()

def sample_blocks(seeds):
    seeds = th.LongTensor(np.asarray(seeds))
    blocks = []
    for fanout in [10, 25]:
        frontier = dgl.distributed.sample_neighbors(g, seeds, fanout, replace=True)
        block = dgl.to_block(frontier, seeds)
        seeds = block.srcdata[dgl.NID]
        blocks.insert(0, block)
    return blocks  # differs (indentation)
dataloader = dgl.distributed.DistDataLoader(dataset=train_nid,  # differs (indentation)
                                            batch_size=batch_size,
                                            collate_fn=sample_blocks,
                                            shuffle=True)
low_level = 0  # differs
for batch in dataloader:
    low_level += 1  # differs

sampler = dgl.sampling.MultiLayerNeighborSampler([10, 25])
dataloader = dgl.distributed.DistNodeDataLoader(g, train_nid, sampler,
                                             batch_size=batch_size, shuffle=True)
high_level = 0  # differs
for batch in dataloader:
    high_level += 1  # differs

train_nids = dgl.distributed.node_split(g.ndata['train_mask'])
print('guide snippets ran: {} trainer nodes, {} + {} batches, blocks {}'.format(  # differs
    len(train_nids), low_level, high_level, len(batch.blocks)))  # differs
