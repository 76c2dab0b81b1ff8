#!/usr/bin/env bash
# Install asyncgraph into .venv (CPU build of torch) and run the main job on PubMed:
# partition it, train GraphSAGE standalone (the embedded default: one process, no server),
# then launched on 2 partitions x 2 trainers with DDP. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EPOCHS=${EPOCHS:-40}

echo "== install =="
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet -c constraints-cpu.txt -e '.[dev]'

echo "== partition PubMed (bundled in examples/data) =="
.venv/bin/python -m asyncgraph.partition --input examples/data/pubmed.npz --graph-name pubmed \
    --num-parts 1 --method metis --out data/pubmed1 --overwrite
.venv/bin/python -m asyncgraph.partition --input examples/data/pubmed.npz --graph-name pubmed \
    --num-parts 2 --method metis --balance-train --balance-edges --out data/pubmed2 --overwrite

echo "== train standalone (1 partition, no server) =="
.venv/bin/python examples/train_dist.py --part-config data/pubmed1/pubmed.json --epochs "$EPOCHS" --no-progress

echo "== train launched (2 servers, 2 partitions x 2 trainers, DDP/gloo) =="
.venv/bin/python -m asyncgraph.launch --part-config data/pubmed2/pubmed.json --num-trainers 2 -- \
    .venv/bin/python examples/train_dist.py --epochs "$EPOCHS" --num-threads 1 --no-progress
