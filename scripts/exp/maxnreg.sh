#!/usr/bin/env bash
# Seventeenth session: raw turbo4's split kernel runs 8 warps an SM (241 registers a thread, 4 programs of
# 2 warps; ncu at 32K, batch 1: 1.87 active warps per scheduler, an instruction issued on 51.6% of the
# cycles, short-scoreboard stalls first). `maxnreg` caps its registers (ptxas spills the rest to local
# memory): ahead of time (sm_90, triton 3.8) 168 registers add 95 instructions a 64-token block (83 of them
# local loads and stores) to the 1563, 128 add 187 (162). More programs per SM then fit, and the split
# count must rise to fill them at batch 1 (`programs_per_sm`). Prediction: if the kernel is bound by
# latency at low occupancy, turbo4 gains 10-30% of its attention at batch 1 and 16; if by issue, it loses.
# Variants:
#   def   the defaults (no cap, 66 splits at 32K batch 1, 17 at batch 16)
#   r168  maxnreg 168, >= 6 programs an SM (99 splits at batch 1; batch 16 keeps 17)
#   r128  maxnreg 128, >= 8 programs an SM (132 splits at batch 1)
# RUNS: variant:contexts:batch, in order on one lease. TESTS: a pytest -k selection of the kernel tests, run
# first on compiled kernels under $TEST_CONFIG (the r128 cap).
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
MODES=${MODES:-fp16,turbo4}
export AB_FLAGS="--no-fallback"
declare -A V=(
  [def]='{}'
  [r168]='{"turbo4": {"maxnreg": 168, "programs_per_sm": [6, 16]}}'
  [r128]='{"turbo4": {"maxnreg": 128, "programs_per_sm": [8, 16]}}'
)
if [ -n "${TESTS:-}" ]; then
  KVBENCH_ATTN_CONFIG="${V[r128]}" KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q \
    -p no:cacheprovider tests/test_kernels.py -k "$TESTS" > $OUT/r/tests-r128.txt 2>&1
  echo "tests (r128) rc=$? t=$SECONDS"; tail -3 $OUT/r/tests-r128.txt
fi
RUNS=${RUNS:-"def:32k:1,16 r168:32k:1,16 r128:32k:1,16"}
ab_runs "$RUNS" $MODES
(cd $OUT && tar czf maxnreg.tgz r && rm -rf r)
