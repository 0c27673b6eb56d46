#!/usr/bin/env bash
# Twenty-third session, after turbo4-t32.sh (call 2): the tree now gives raw turbo4 the one-warp, 32-token
# shape for caches of >= 16384 slots (`long_shape`, `long_capacity`). Here: turbo4's kernel tests on compiled
# kernels (the long shape included: Llama-3.1-8B's heads at 20K); 16K, where the threshold was not measured
# (`old`: the threshold out of reach); and more splits at 32K, batch 16, where the kernel alone ran 34 splits
# faster than 17 (`s48`, `s64`: 50 and 65 splits, splits of >= 512 tokens).
# Prediction: 16K between 8K (no change) and 32K (+2 / +12 points): +0.5-1.5 at batch 1, +3-8 at batch 16;
# s48 / s64 within +-2 points of `new` (33 splits) at 32K, batch 16.
source scripts/exp/ab-lib.sh
TESTS=${TESTS:-"turbo4 and (decode_attention or prmt or rotated_out or append or long_shape)"}
ab_tests tests/test_kernels.py
export AB_FLAGS="--no-fallback"
splits() { some turbo4 "{\"split_tokens\": 512, \"long_shape\": {\"block_n\": 32, \"num_warps\": 1, \"programs_per_sm\": [8, $1]}}"; }
declare -A V=([new]='{}' [old]=$(some turbo4 '{"long_capacity": 1000000000}') [s48]=$(splits 48) [s64]=$(splits 64))
RUNS=${RUNS:-"old:16k:1 new:16k:1 old:16k:16 new:16k:16 new:32k:16 s48:32k:16 s64:32k:16 new:32k:16 s48:32k:16 s64:32k:16 new:16k:1 old:16k:1 new:16k:16 old:16k:16"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4}
(cd $OUT && tar czf turbo4-long.tgz r && rm -rf r)
