#!/usr/bin/env bash
# Nineteenth session, written for the next lease (not run yet): `dot_fence` raised turbo4-asym's registers from
# 164 to 254 (4% slower at batch 16), because with the fence triton 3.6's pipeliner turns the prmt table's 8
# word loads, inside the block loop, into asynchronous copies through shared memory in every block.
# `hoist_lut` loads them once before the loop. Ahead of time (sm_90, triton 3.6), fence -> fence + hoist:
# turbo4-asym 1084 -> 1035 instructions, 254 -> 164 registers; turbo3-asym 1326 -> 1296; delegated's cold
# loop 1040 -> 978 (255 -> 232 registers); turbo4 1511 -> 1369 (253 -> 219). Without the fence, hoisting
# changes nothing (the compiler hoisted the loads itself).
# Prediction: with fence + hoist everywhere, turbo4-asym at batch 16 back to >= its no-fence ratio (1.09x at
# 32K) and up to 1-2 points above it; turbo4 +1-3% at batch 16; at 8K, batch 1 +0.1-0.3 points for the
# three turbo modes. Variants: fh (fence and hoist for every coded mode at every batch), def (the defaults).
# RUNS: variant:contexts:batch, in order on one lease. TESTS: run first on compiled kernels.
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
export AB_FLAGS="--no-fallback"
CODED=turbo4,turbo4-asym,turbo3-asym,turbo4-delegated
declare -A V=([fh]=$(some $CODED '{"dot_fence": true, "hoist_lut": true}') [def]='{}')
ab_tests tests/test_kernels.py
RUNS=${RUNS:-"fh:8k,32k:1 def:8k,32k:1 fh:8k,32k:1 def:8k,32k:1 fh:32k:16 def:32k:16 fh:32k:16 def:32k:16"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4-asym,turbo3-asym,turbo4-delegated,turbo4}
(cd $OUT && tar czf hoist-lut.tgz r && rm -rf r)
