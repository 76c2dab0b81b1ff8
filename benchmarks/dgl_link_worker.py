"""DGL 2.1's side of ``benchmarks.link_bench_dgl``; runs under DGL's venv (imports dgl, not asyncgraph).

Modes (``python dgl_link_worker.py MODE ...``):

* ``partition NPZ OUT``: PubMed from our ``.npz`` into a ``DGLGraph`` (``feat``, ``label``,
  ``train_mask``), ``dgl.distributed.partition_graph`` into 2 parts (metis, 1 hop), graph
  name ``pubmed``.
* ``launch IP_CONFIG PART_CONFIG SSH_PORT SECONDS EPOCHS BATCH``: a minimal stand-in for DGL's
  ``tools/launch.py`` (not in the wheel), run on the first host: over ``ssh -p SSH_PORT`` to
  every host of the ip_config (this one too) it starts one server (``DGL_ROLE=server``) and one
  trainer (``DGL_ROLE=client``) with the environment DGL's launch.py sets, plus ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` (the first host) for gloo, and
  ``GLOO_SOCKET_IFNAME=eth0`` (DGL does not pick the interface: on a host whose name resolves to
  127.0.0.1 gloo fails without it). Waits for the trainers, then the servers (rank 0 shuts them
  down); every ssh session it opened is ended on the way out. Passes the trainers' output on.
* ``server`` / ``trainer SECONDS EPOCHS BATCH`` (started by ``launch`` over ssh): the trainer of
  rank 0 (first host) pulls ``feat`` rows of the OTHER host's partition only (1k, 10k, 100k
  rows, uniform IDs, sequential calls for SECONDS each: every byte crosses that host's link, as
  in ``link_bench``) and runs ``sample_neighbors`` of 1,024 seeds of that partition, fanout 10;
  then both trainers train GraphSAGE (2 ``SAGEConv`` mean, hidden 64, fanouts [25, 10], batch
  BATCH, dropout 0.5, Adam lr 0.01 wd 5e-4: ``examples/train_dist.py``'s set-up) with DDP for
  EPOCHS epochs over ``node_split(train_mask)``. Rank 0 prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_PORT = 30050


def _partition(npz: str, out: str) -> None:
    import dgl
    import numpy as np
    import torch

    data = np.load(npz)
    g = dgl.graph((torch.from_numpy(data["src"]), torch.from_numpy(data["dst"])), num_nodes=len(data["feat"]))
    g.ndata["feat"] = torch.from_numpy(data["feat"])
    g.ndata["label"] = torch.from_numpy(data["label"])
    g.ndata["train_mask"] = torch.from_numpy(data["train_mask"])
    dgl.distributed.partition_graph(g, "pubmed", 2, out, part_method="metis", num_hops=1)


def _ssh(host: str, port: int, env: dict[str, str], argv: list[str]) -> subprocess.Popen[bytes]:
    """``argv`` on ``host`` over ssh in this directory with ``env`` exported (as DGL's launch.py:
    ``ssh -p PORT HOST 'cd WORKSPACE; (export ...; CMD)'``)."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    remote = f"cd {shlex.quote(os.getcwd())}; (export {exports}; exec {shlex.join(argv)})"
    return subprocess.Popen(["ssh", "-p", str(port), host, remote], stdin=subprocess.DEVNULL)


def _launch(ip_config: str, part_config: str, ssh_port: int, trainer_args: list[str]) -> int:
    with open(ip_config) as f:
        hosts = [line.split()[0] for line in f if line.strip()]
    common = {
        "DGL_IP_CONFIG": ip_config,
        "DGL_NUM_SERVER": "1",
        "DGL_NUM_CLIENT": str(len(hosts)),
        "DGL_CONF_PATH": part_config,
        "DGL_GRAPH_FORMAT": "csc",
        "DGL_NUM_SAMPLER": "0",
        "OMP_NUM_THREADS": "1",
    }
    me = [sys.executable, os.path.abspath(__file__)]
    servers = [
        _ssh(h, ssh_port, {**common, "DGL_ROLE": "server", "DGL_SERVER_ID": str(i)}, [*me, "server"])
        for i, h in enumerate(hosts)
    ]
    trainers = []
    for rank, host in enumerate(hosts):
        env = {**common, "DGL_ROLE": "client", "DGL_DIST_MODE": "distributed", "DGL_GROUP_ID": "0",
               "RANK": str(rank), "WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": hosts[0],
               "MASTER_PORT": str(SERVER_PORT + 100), "GLOO_SOCKET_IFNAME": "eth0"}  # fmt: skip
        trainers.append(_ssh(host, ssh_port, env, [*me, "trainer", part_config, *trainer_args]))
    rc = 0
    try:
        deadline = time.time() + 600
        while any(t.poll() is None for t in trainers):
            if any(t.poll() not in (None, 0) for t in trainers) or time.time() > deadline:
                rc = 1
                break
            time.sleep(0.2)
        rc = rc or max(t.returncode or 0 for t in trainers)
        end = time.time() + 20
        while time.time() < end and any(s.poll() is None for s in servers):
            time.sleep(0.2)
    finally:
        for proc in trainers + servers:  # our ssh clients: sshd hangs up the remote side
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in trainers + servers:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return rc


def _server() -> None:
    import dgl

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])


def _timed(fn, pool: list, seconds: float) -> tuple[int, float, list[float]]:
    lat: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(lat) < 3:
        t = time.perf_counter()
        fn(pool[len(lat) % len(pool)])
        lat.append(time.perf_counter() - t)
    return len(lat), time.perf_counter() - t0, lat


def _trainer(part_config: str, seconds: float, epochs: int, batch: int) -> None:
    import dgl
    import dgl.nn.pytorch as dglnn
    import numpy as np
    import torch as th
    import torch.nn.functional as F
    from torch import nn

    th.set_num_threads(1)
    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])
    th.distributed.init_process_group(backend="gloo")
    rank, world = th.distributed.get_rank(), th.distributed.get_world_size()
    g = dgl.distributed.DistGraph("pubmed", part_config=part_config)
    gpb = g.get_partition_book()
    out: dict = {"rank": rank, "world": world}
    if rank == 0:
        other = gpb.partid2nids(1 - gpb.partid)  # the other host's partition: all pulls remote
        feat = g.ndata["feat"]
        row_bytes = int(feat.shape[1]) * 4
        gen = th.Generator().manual_seed(1)
        feat[other[:1000]]  # warm up
        out["pull"] = {}
        for size in (1_000, 10_000, 100_000):
            pool = [other[th.randint(0, len(other), (size,), generator=gen)] for _ in range(4)]
            calls, wall, lat = _timed(lambda ids: feat[ids], pool, seconds)
            out["pull"][str(size)] = {"rows_s": calls * size / wall, "calls": calls,
                                      "bytes_s": calls * size * row_bytes / wall,
                                      "p50_ms": 1e3 * float(np.median(lat))}  # fmt: skip
        seeds = [other[th.randint(0, len(other), (1024,), generator=gen)] for _ in range(4)]
        calls, wall, _ = _timed(lambda s: dgl.distributed.sample_neighbors(g, s, 10), seeds, seconds)
        out["sample_req_s"] = calls / wall

    class SAGE(nn.Module):
        def __init__(self, i: int, h: int, o: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList([dglnn.SAGEConv(i, h, "mean"), dglnn.SAGEConv(h, o, "mean")])
            self.dropout = nn.Dropout(0.5)

        def forward(self, blocks: list, x: th.Tensor) -> th.Tensor:
            h = x
            for li, (layer, block) in enumerate(zip(self.layers, blocks, strict=True)):
                h = layer(block, h)
                if li != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    th.distributed.barrier()
    th.manual_seed(0)
    train = dgl.distributed.node_split(g.ndata["train_mask"], gpb, force_even=True)
    labels = g.ndata["label"]
    classes = int(labels[0 : g.num_nodes()].max()) + 1
    loader = dgl.dataloading.DistNodeDataLoader(
        g, train, dgl.dataloading.NeighborSampler([25, 10]), batch_size=batch, shuffle=True
    )
    model = th.nn.parallel.DistributedDataParallel(SAGE(g.ndata["feat"].shape[1], 64, classes))
    opt = th.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    times, compute = [], 0.0
    for _ in range(epochs):
        t0 = time.perf_counter()
        for input_nodes, seeds, blocks in loader:
            x = g.ndata["feat"][input_nodes]
            y = labels[seeds].long()
            t1 = time.perf_counter()
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            compute += time.perf_counter() - t1
        times.append(time.perf_counter() - t0)
    out["epoch_s"], out["compute_s"] = times, compute / epochs
    every = [None] * world
    th.distributed.all_gather_object(every, out)
    if rank == 0:
        result = every[0]
        result["epoch_s_per_rank"] = [sum(r["epoch_s"]) / epochs for r in every]
        result["compute_s_per_rank"] = [r["compute_s"] for r in every]
        print("RESULT " + json.dumps(result), flush=True)
    th.distributed.barrier()
    th.distributed.destroy_process_group()


def main() -> int:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "partition":
        _partition(args[0], args[1])
    elif mode == "launch":
        return _launch(args[0], args[1], int(args[2]), args[3:])
    elif mode == "server":
        _server()
    elif mode == "trainer":
        _trainer(args[0], float(args[1]), int(args[2]), int(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
