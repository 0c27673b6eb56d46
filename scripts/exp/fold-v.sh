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
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
T4=turbo4-asym,turbo3-asym,turbo4-delegated,turbo4
MODES=${MODES:-fp16,$T4}
declare -A V=(
  [base]=$(some $T4 '{"fold_v": false, "merge_cols": 0}')
  [fold]=$(some $T4 '{"merge_cols": 0}')
  [def]='{}'
)
for v in ${STAMPS-def base}; do
  ab_stamps $v "${V[$v]}" fp16,turbo4-asym,turbo3-asym,turbo4-delegated
done
RUNS=${RUNS:-"base:8k:1 def:8k:1 fold:8k:1 base:8k:1 def:8k:1 fold:8k:1 base:2k,32k:1 def:2k,32k:1 base:8k,32k:16 def:8k,32k:16"}
ab_runs "$RUNS" $MODES
ab_tests tests/test_kernels.py tests/test_fast_decode.py
(cd $OUT && tar czf fold-v.tgz r && rm -rf r)
