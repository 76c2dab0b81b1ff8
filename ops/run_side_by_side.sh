#!/usr/bin/env bash
# DGL 2.1 and asyncgraph on the same graph, one after the other (never at the same time), same day.
#   1. DGL's peer harness (../shared/peers/dgl/run_all.sh, large graph: 2^20 nodes, 10.58M edges)
#   2. its results -> benchmarks/results/dgl_reference.json (benchmarks.dgl_reference)
#   3. our partition, pull, train and fixed-cost benchmarks on the very graph DGL's harness generated, with
#      --dgl-results so they print same-day ratios
#   4. GraphSAGE compute on the same blocks, ours and DGL's in turn (benchmarks.compute_vs_dgl)
#   5. layer-wise inference of every node (2-layer GraphSAGE mean, 128 -> 256 -> 50, batch 4096):
#      DGL's example inference() (benchmarks/dgl_inference_worker.py, DGL's venv, its launcher:
#      1 machine x 1 trainer on its 1-partition graph, 2 machines x 1 trainer on its METIS 2-way),
#      then ours (benchmarks.inference_bench, 1 and 2 trainers, one partition per trainer)
# Needs the DGL venv of ../shared/peers/dgl/README.md under $DGLBENCH_ROOT. About 20 min.
#   SKIP_DGL=1 reuses the newest DGL run of today; SKIP_GEN=1 is passed to the harness.
# --links (root; issue 24 §5): instead, DGL 2.1 launched over ssh on 2 namespace hosts with tbf-shaped
#   links (benchmarks.link_bench_dgl), then ours on the same kind of hosts (benchmarks.link_bench):
#   pulls of 1k/10k/100k remote rows, sampling, epochs; LINK_RATES (default 1gbit). About 3 min.
#   ONLY=inference runs step 5 alone (generating DGL's graph and partitions if they are missing);
#   BATCH=100000 sets its batch size on both sides (default 4096; DGL's example evaluates in 100000).
# Step 5 takes /tmp/asyncgraph-bench.lock for each run itself: do not wrap this script in flock
# (NO_LOCK=1 skips the lock, e.g. on a machine of your own).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${DGLBENCH_ROOT:?set DGLBENCH_ROOT (see ../shared/peers/dgl/README.md)}
PEER=${DGL_PEER_DIR:-../shared/peers/dgl}
PY=.venv/bin/python
LOGS=benchmarks/results/logs
mkdir -p "$LOGS" benchmarks/data
run() { local name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$LOGS/$name.log"; }
if [ "${1:-}" = "--links" ]; then
  STAMP=$(date -u +%Y%m%d_%H%M)
  # shellcheck disable=SC2086
  run "link_dgl_$STAMP" $PY -m benchmarks.link_bench_dgl --rates ${LINK_RATES:-1gbit} --epochs 20
  # shellcheck disable=SC2086
  run "link_ours_$STAMP" $PY -m benchmarks.link_bench --hosts 2 --rates ${LINK_RATES:-1gbit} --seconds 4 \
      --epochs 20 --num-threads 1  # one torch thread per trainer, as DGL's (OMP_NUM_THREADS=1)
  exit 0
fi
LOCK=(flock -x /tmp/asyncgraph-bench.lock)
[ "${NO_LOCK:-0}" = 1 ] && LOCK=()
inference() {  # step 5; each run under the shared benchmark lock, one after the other
  local data=$ROOT/data/large dglpy=$ROOT/venv/bin/python out=$LOGS/dgl_inference.jsonl
  [ -f "$data/graph.bin" ] || "$dglpy" "$PEER/gen_data.py" --size large --out "$data"
  for spec in metis:2 random:1; do
    local m=${spec%:*} n=${spec#*:}
    [ -f "$data/part_$m$n/bench.json" ] || "$dglpy" "$PEER/partition.py" --graph "$data/graph.bin" \
      --out "$data/part_$m$n" --method "$m" --parts "$n"
  done
  local npz=benchmarks/data/dgl20.npz
  [ -f "$npz" ] || "$dglpy" "$PEER/to_npz.py" "$data/graph.bin" "$npz"
  : > "$out"
  for spec in 1:part_random1 2:part_metis2; do
    local m=${spec%%:*} cfg=$data/${spec#*:}/bench.json
    echo "== DGL layer-wise inference, $m trainer(s)"
    "${LOCK[@]}" timeout 900 "$dglpy" "$PEER/launch_local.py" --machines "$m" \
      --part-config "$cfg" --timeout 800 --logdir "$LOGS/dgl_inference_$m" -- \
      "$PWD/benchmarks/dgl_inference_worker.py" --part-config "$cfg" --batch-size "${BATCH:-4096}" \
      2>&1 | tee -a "$LOGS/dgl_inference.log" | grep '"dgl_inference"' | tee -a "$out"
  done
  echo "== ours"
  # partitions balanced by in-edges, as DGL's METIS 2-way (balance_edges=True)
  "${LOCK[@]}" $PY -m benchmarks.inference_bench --graph "$npz" --trainers 1 2 --balance-edges \
    --batch-size "${BATCH:-4096}" --dgl-results "$out" 2>&1 | tee "$LOGS/inference_bench_dgl20.log"
}
if [ "${ONLY:-}" = inference ]; then inference; exit 0; fi
if [ "${SKIP_DGL:-0}" != 1 ]; then
  echo "== DGL harness"
  bash "$PEER/run_all.sh" 2>&1 | tee "$LOGS/dgl_harness.log"
fi
RUN=$(find "$ROOT/results" -maxdepth 1 -name "large-$(date +%Y%m%d)-*" | sort | tail -1)
$PY -m benchmarks.dgl_reference "$RUN" --out benchmarks/results/dgl_reference.json > /dev/null
NPZ=benchmarks/data/dgl20.npz
[ -f "$NPZ" ] || "$ROOT/venv/bin/python" "$PEER/to_npz.py" "$ROOT/data/large/graph.bin" "$NPZ"
REF=(--dgl-results benchmarks/results/dgl_reference.json)
run partition_bench_dgl20 $PY -m benchmarks.partition_bench --graph "$NPZ" --parts 2 \
    --out benchmarks/results/partition_bench_dgl20.json
run pull_bench_dgl20 $PY -m benchmarks.pull_bench --graph "$NPZ" "${REF[@]}" \
    --out benchmarks/results/pull_bench_dgl20.json
run train_bench_dgl20 $PY -m benchmarks.train_bench --graph "$NPZ" "${REF[@]}" \
    --out benchmarks/results/train_bench_dgl20.json --png benchmarks/results/train_bench_dgl20.png
run fixed_cost_dgl20 $PY -m benchmarks.fixed_cost --graph "$NPZ" --calls 1000 \
    --out benchmarks/results/fixed_cost_dgl20.json
run compute_vs_dgl $PY -m benchmarks.compute_vs_dgl --rounds 4
inference
