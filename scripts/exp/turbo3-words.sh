#!/usr/bin/env bash
# Twenty-second session: turbo3-asym's code words. Ahead of time (sm_90, triton 3.6, 128-token blocks, 4
# warps, 3 stages) its loop went from 1288 to 965 instructions a block: the centroid tile now reaches shared
# memory in 16 STS.128, not 128 STS.U16 (words loaded as [set, token] tiles, `v3_set_major`), and the 24-bit
# groups spread to nibbles by three mask-and-add steps, not by shifts and bfi per code.
# Variants, in turn on one lease: `old`, the previous commit's package (78bdb35, carried in .gpu/old with scripts/exp, run from there);
# `new`, this tree's defaults; `ss`, new plus turbo4-asym's short split (64-token blocks on 3 stages where
# a split holds two 128-token blocks: 8K, batch 1).
# Prediction: turbo3-asym at 8K, batch 1 +0.2-0.5 points over `old` in every repetition (the split kernel's
# two blocks are ~1/4 shorter; the merge and the launch tail do not change); at 32K, batch 1 +1-2 points; at
# 32K, batch 16 +3-6 points. `ss` within +-0.3 of `new`.
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
TESTS=${TESTS:-"three_bit or (prmt_lookup and turbo3) or (test_decode_attention and turbo3) or (rotated_out and turbo3) or (fused_decode_matches and turbo3)"}
ab_tests tests/test_kernels.py tests/test_fast_decode.py
declare -A V=([old]='{}' [new]='{}' [ss]=$(some turbo3-asym '{"short_split": [64, 3]}'))
RUNS=${RUNS:-"old:8k,32k:1 new:8k,32k:1 ss:8k:1 old:8k,32k:1 new:8k,32k:1 ss:8k:1 old:8k:1 new:8k:1 ss:8k:1 old:32k:16 new:32k:16"}
OLD_TREE=.gpu/old ab_runs "$RUNS" ${MODES:-fp16,turbo3-asym}
(cd $OUT && tar czf turbo3-words.tgz r && rm -rf r)
