#!/usr/bin/env bash
# Run every benchmark in turn (not in parallel: they measure the same cores) and keep the logs.
# Results: benchmarks/results/*.json and *.png; logs: benchmarks/results/logs/. About 15-20 min.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOGS=benchmarks/results/logs
mkdir -p "$LOGS" benchmarks/data
[ -f benchmarks/data/synth20.npz ] || $PY -m benchmarks.synthetic --scale 20 --out benchmarks/data/synth20.npz
[ -f benchmarks/data/synth17.npz ] || $PY -m benchmarks.synthetic --scale 17 --out benchmarks/data/synth17.npz
run() { local name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$LOGS/$name.log"; }
run partition_bench $PY -m benchmarks.partition_bench --scale 20
run kernel_bench    $PY -m benchmarks.kernel_bench
run pull_bench      $PY -m benchmarks.pull_bench
run train_bench     $PY -m benchmarks.train_bench
run loadgen_sweep   $PY -m benchmarks.loadgen --sweep --duration 5
run loadgen_overload $PY -m benchmarks.loadgen --overload --overload-factor 2 --partitions 2 --clients 16 --duration 30
run scaling         $PY -m benchmarks.scaling --scales 17,18,19,20 --duration 3
