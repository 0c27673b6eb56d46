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
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
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
  ab_stamps $v "${V[$v]}" fp16,$T3
done
RUNS=${RUNS:-"off:8k:1:M5 c32:8k:1:M5 t32:8k:1:M5 c64:8k:1:M5 off:8k:1:M5 c32:8k:1:M5 t32:8k:1:M5 c64:8k:1:M5
  off:2k,32k:1:M5 c32:2k,32k:1:M5"}
n=0
for run in $RUNS; do
  IFS=: read -r v ctx batch modes <<< "$run"; n=$((n + 1)); [ "$modes" = M5 ] && modes=$M5
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "run $n skipped: time"; continue; }
  ab_run $n "${V[$v]}" $ctx $batch $modes $v
done
ab_tests tests/test_kernels.py
(cd $OUT && tar czf merge-cols.tgz r && rm -rf r)
