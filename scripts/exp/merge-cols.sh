#!/usr/bin/env bash
# Fourteenth session: turbo4-asym, turbo3-asym and turbo4-delegated at 8K, batch 1 are 0.2-0.45% short of fp16.
# Timed per program (twelfth session), a turbo layer's reduction merges 33 splits in 1.45-1.81 us on two warps
# (cross-warp reductions, then V's inverse rotation) where fp16's 17 splits take 1.04 us on one. `merge_cols`
# splits the reduction over D instead: a program per (query head, 32 columns), one warp, every row of the
# merge in one pass with no barrier; a turbo V's inverse rotation (which needs whole rows) moves into the split
# programs, on their query group's 4 rows (+128 instructions after the loop, sm_90, triton 3.6). Variants:
#   off  the defaults (whole rows)
#   c32  merge_cols 32 in every mode        c64  merge_cols 64 in every mode
#   t32  merge_cols 32 in the three turbo modes only (fp16 and int8 at their defaults)
#   rows whole rows in every mode (the defaults before fp16 took 32 columns at batch 1)
#   f32  merge_cols 32 for fp16 (its default at batch 1 since; at batch 16 an experiment)
# RUNS: variant:contexts:batch:modes, run in order on one lease (M5 stands for the five modes). STAMPS: variants
# whose per-program stamps (scripts/exp/tail_stamps.py) at 8K, batch 1 come first.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
some() { python3 -c "import json,sys; print(json.dumps({m: json.loads(sys.argv[2]) for m in sys.argv[1].split(',')}))" "$1" "$2"; }
M5=fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated
T3=turbo4-asym,turbo3-asym,turbo4-delegated
declare -A V=(
  [off]='{}'
  [c32]=$(some $M5 '{"merge_cols": 32}')
  [c64]=$(some $M5 '{"merge_cols": 64}')
  [t32]=$(some $T3 '{"merge_cols": 32}')
  [rows]=$(some $M5 '{"merge_cols": 0}')
  [f32]='{"fp16": {"merge_cols": 32}}'
)
for v in ${STAMPS-c32 off}; do
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "stamps $v skipped: time"; continue; }
  echo "== stamps $v"
  KVBENCH_ATTN_CONFIG="${V[$v]}" timeout 120 python3 scripts/exp/tail_stamps.py --modes fp16,$T3 --context 8192 \
    --batch 1 > $OUT/r/stamps-$v.txt 2>&1
  echo "rc=$? t=$SECONDS"; grep -v "^#" $OUT/r/stamps-$v.txt | cut -c1-220
done
RUNS=${RUNS:-"off:8k:1:M5 c32:8k:1:M5 t32:8k:1:M5 c64:8k:1:M5 off:8k:1:M5 c32:8k:1:M5 t32:8k:1:M5 c64:8k:1:M5
  off:2k,32k:1:M5 c32:2k,32k:1:M5"}
n=0
for run in $RUNS; do
  IFS=: read -r v ctx batch modes <<< "$run"; n=$((n + 1)); [ "$modes" = M5 ] && modes=$M5
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "run $n skipped: time"; continue; }
  KVBENCH_ATTN_CONFIG="${V[$v]}" timeout 120 python3 -m kvbench decode-bench --model dummy:llama-3.1-8b \
    --modes $modes --contexts $ctx --batch $batch --warmup 8 --gen 64 --repeats 3 --quiet --devices 0 \
    --out $OUT/r/run-$n > $OUT/r/run-$n.log 2>&1
  echo "run $n ($v $ctx B=$batch) rc=$? t=$SECONDS"
  python3 scripts/exp/bench_summary.py $OUT/r/run-$n/bench.csv || tail -5 $OUT/r/run-$n.log
done
if [ -n "${TESTS:-}" ] && [ $SECONDS -lt ${BUDGET_S:-520} ]; then
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout $((${BUDGET_S:-520} + 60 - SECONDS)) python3 -m pytest -q \
    -p no:cacheprovider tests/test_kernels.py -k "$TESTS" > $OUT/r/tests.txt 2>&1
  echo "tests rc=$? t=$SECONDS"; tail -3 $OUT/r/tests.txt
fi
(cd $OUT && tar czf merge-cols.tgz r && rm -rf r)
