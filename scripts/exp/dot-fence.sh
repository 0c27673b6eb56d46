#!/usr/bin/env bash
# Nineteenth session: triton 3.6 gives the dots of a turbo lookup's centroid tile kWidth 4 (the layout of
# 8-bit operands; fp16's dots get 2): walking back from the operands it meets the lookup's tl.join and
# halves the 16-bit width it finds. The weights P then reach the PV dot through shared memory and ~100
# moves a block. `dot_fence` passes the tile through an opaque copy (`_dot_fence`): kWidth 2. Ahead of time
# (sm_90, triton 3.6) the loops shrink: turbo4-asym 1180 -> 1084 instructions (IMAD 265 -> 140), turbo3-asym
# 1463 -> 1326, delegated's cold loop 1137 -> 1040, turbo4 1665 -> 1511; registers rise for turbo4-asym
# (164 -> 254), delegated (230 -> 255) and turbo4 (223 -> 253), fall for turbo3-asym (233 -> 168).
# Prediction: the turbo modes' attention 3-8% faster where the loop's latency dominates (batch 1); at
# batch 16 the extra registers may cost occupancy. End to end ~0.3-0.8 points of the ratio at 8K, batch 1.
# Variants: fence (on), base (off). RUNS: variant:contexts:batch, in order on one lease. TESTS: run first on
# compiled kernels, with the fence on.
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
export AB_FLAGS="--no-fallback"
CODED=turbo4,turbo4-asym,turbo3-asym,turbo4-delegated
declare -A V=([fence]=$(some $CODED '{"dot_fence": true}') [base]=$(some $CODED '{"dot_fence": false}'))
KVBENCH_ATTN_CONFIG="${V[fence]}" ab_tests tests/test_kernels.py
RUNS=${RUNS:-"fence:8k,32k:1 base:8k,32k:1 fence:8k,32k:1 base:8k,32k:1"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4-asym,turbo3-asym,turbo4-delegated,turbo4}
(cd $OUT && tar czf dot-fence.tgz r && rm -rf r)
