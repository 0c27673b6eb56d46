#!/usr/bin/env bash
# For the next lease (written in the twenty-third session, not run yet): before turbo3-asym may take one-warp
# programs of 32-token blocks at batch > 1 (turbo3-w1.sh: 1.180x -> 1.261x of fp16 at 32K, batch 16), its
# compiled kernels must pass the tests on that shape, and the other shapes must not lose.
# 1. turbo3-asym's kernel tests with the shape forced (KVBENCH_ATTN_CONFIG applies it at every capacity;
#    the interpreter passed the same selection: 27 passed, 4 skipped).
# 2. End to end, in turn: `def` against `w1` at 16K and 8K, batch 16, and at 32K, batch 4 and 1.
# Prediction: 16K, batch 16 +3-6 points; 8K, batch 16 within +-2 (9 splits there, as for turbo4, which lost);
# batch 1 slower (66 -> 132 splits of half the work each; turbo4-asym's shape there is 128 / 4).
source scripts/exp/ab-lib.sh
W1='{"block_n": 32, "num_warps": 1, "num_stages": 2, "deep_stages": null, "programs_per_sm": [8, 32]}'
TESTS=${TESTS:-"turbo3 and (decode_attention or rotated_out or append or three_bit or lazy or prmt)"}
KVBENCH_ATTN_CONFIG=$(some turbo3-asym "$W1") ab_tests tests/test_kernels.py
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [w1]=$(some turbo3-asym "$W1"))
RUNS=${RUNS:-"def:16k:16 w1:16k:16 def:8k:16 w1:8k:16 def:32k:4 w1:32k:4 def:32k:1 w1:32k:1 w1:16k:16 def:16k:16"}
ab_runs "$RUNS" ${MODES:-fp16,turbo3-asym}
(cd $OUT && tar czf turbo3-w1-next.tgz r && rm -rf r)
