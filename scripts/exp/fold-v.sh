#!/usr/bin/env bash
# Fifteenth session: turbo4-asym, turbo3-asym and turbo4-delegated at 8K, batch 1 were 0.5-0.7% short of fp16.
# Timed per program (fourteenth session), their merge took 1.45-1.76 us at 8K where fp16's, on 32 columns,
# took 0.63: V's inverse rotation needs whole rows after the merge, and moved into the split programs it cost
# ~0.65 us a program. `fold_v` folds the inverse into W_o instead (`engine.fold`): the attention leaves its
# output in V's rotated basis, the reduction rotates the fresh token's V before its wait, and nothing runs
# the inverse. Prediction: each turbo layer's tail falls to fp16's (~1 us a layer, ~0.7% at 8K). Variants:
#   base  the defaults before: fold_v off, whole rows (the reduction inverse-rotates)
#   fold  fold_v on, whole rows
#   def   the new defaults: fold_v on, and 32 columns at batch 1
# RUNS: variant:contexts:batch, in order on one lease, modes $MODES. STAMPS: variants whose per-program stamps
# (scripts/exp/tail_stamps.py) at 8K, batch 1 come first. TESTS: a pytest -k selection of the kernel and engine
# tests, run last on compiled kernels.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
some() { python3 -c "import json,sys; print(json.dumps({m: json.loads(sys.argv[2]) for m in sys.argv[1].split(',')}))" "$1" "$2"; }
T4=turbo4-asym,turbo3-asym,turbo4-delegated,turbo4
MODES=${MODES:-fp16,$T4}
declare -A V=(
  [base]=$(some $T4 '{"fold_v": false, "merge_cols": 0}')
  [fold]=$(some $T4 '{"merge_cols": 0}')
  [def]='{}'
)
for v in ${STAMPS-def base}; do
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "stamps $v skipped: time"; continue; }
  echo "== stamps $v"
  KVBENCH_ATTN_CONFIG="${V[$v]}" timeout 120 python3 scripts/exp/tail_stamps.py --modes fp16,turbo4-asym,turbo3-asym,turbo4-delegated \
    --context 8192 --batch 1 > $OUT/r/stamps-$v.txt 2>&1
  echo "rc=$? t=$SECONDS"; grep -v "^#" $OUT/r/stamps-$v.txt | cut -c1-220
done
RUNS=${RUNS:-"base:8k:1 def:8k:1 fold:8k:1 base:8k:1 def:8k:1 fold:8k:1 base:2k,32k:1 def:2k,32k:1 base:8k,32k:16 def:8k,32k:16"}
n=0
for run in $RUNS; do
  IFS=: read -r v ctx batch <<< "$run"; n=$((n + 1))
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "run $n skipped: time"; continue; }
  KVBENCH_ATTN_CONFIG="${V[$v]}" timeout 120 python3 -m kvbench decode-bench --model dummy:llama-3.1-8b \
    --modes $MODES --contexts $ctx --batch $batch --warmup 8 --gen 64 --repeats 3 --quiet --devices 0 \
    --out $OUT/r/run-$n > $OUT/r/run-$n.log 2>&1
  echo "run $n ($v $ctx B=$batch) rc=$? t=$SECONDS"
  python3 scripts/exp/bench_summary.py $OUT/r/run-$n/bench.csv || tail -5 $OUT/r/run-$n.log
done
if [ -n "${TESTS:-}" ] && [ $SECONDS -lt ${BUDGET_S:-520} ]; then
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout $((${BUDGET_S:-520} + 60 - SECONDS)) python3 -m pytest -q \
    -p no:cacheprovider tests/test_kernels.py tests/test_fast_decode.py -k "$TESTS" > $OUT/r/tests.txt 2>&1
  echo "tests rc=$? t=$SECONDS"; tail -3 $OUT/r/tests.txt
fi
(cd $OUT && tar czf fold-v.tgz r && rm -rf r)
