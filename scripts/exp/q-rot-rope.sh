#!/usr/bin/env bash
# Seventeenth session: raw turbo4 scores against the rotated query, s2 * H(s1 * q), which a launch of its own
# computed between RoPE and the split kernel (~1.4 us of GPU time a layer at batch 1, and one more kernel
# boundary under PDL). `q_rot_in_rope` has RoPE's kernel write it beside q (the same float32 butterflies).
# Prediction: turbo4 gains 1-2% at batch 1 (2-3.5 us a layer over 28 layers), ~0.3% at batch 16; fp16 the same.
# Variants: rope (RoPE rotates), launch (the rotation launch, the default so far).
# RUNS: variant:contexts:batch, in order on one lease. TESTS: run first on compiled kernels.
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
MODES=${MODES:-fp16,turbo4}
export AB_FLAGS="--no-fallback"
declare -A V=([rope]='{"turbo4": {"q_rot_in_rope": true}}' [launch]='{"turbo4": {"q_rot_in_rope": false}}')
if [ -n "${TESTS:-}" ]; then
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/test_fused_ops.py tests/test_fast_decode.py tests/test_kernels.py -k "$TESTS" > $OUT/r/tests.txt 2>&1
  echo "tests rc=$? t=$SECONDS"; tail -3 $OUT/r/tests.txt
fi
RUNS=${RUNS:-"rope:2k,8k,32k:1 launch:2k,8k,32k:1 rope:2k,8k,32k:1 launch:2k,8k,32k:1 rope:32k:16 launch:32k:16"}
ab_runs "$RUNS" $MODES
(cd $OUT && tar czf q-rot-rope.tgz r && rm -rf r)
