#!/usr/bin/env bash
# Twenty-first session: turbo4-asym and turbo3-asym still sit 0.0-0.2 points under fp16 at 8K, batch 1
# (results/2026-12-03d-h200). The twelfth session swept their batch-1 launch shape end to end (b1-shapes.sh)
# when the merge was two warps over 33 splits (1.6-1.8 us); since then V's rotation is folded into W_o and
# the merge runs on 32-column programs (fp16's), and the loops are shorter (dot_fence, hoist_lut). More,
# smaller programs cost the merge less now. Ahead of time (sm_90, triton 3.6, fence and hoist on):
#   def  128-token blocks, 4 warps, 2 stages, 33 splits of 2 blocks: 164 registers, 72 KB shared -> 2 an SM
#   c4   64-token blocks, 4 warps, 3 stages, ~4 programs an SM (66 splits of 2 blocks): 126 registers,
#        54 KB shared, 604 instructions a block -> 4 an SM, 16 warps (new)
#   e    64-token blocks, 2 warps, 3 stages, ~4 programs an SM (66 splits of 2 blocks): 166 registers (12th: e)
#   c    64-token blocks, 4 warps, 3 stages, 33 splits of 4 blocks (12th: c)
# Prediction: c4 closes 0.1-0.5 points at 8K (more warps in flight for a latency-bound split); c and e within
# +-0.5 of def. 32K in the same runs (the variants change its split count too: 66 instead of 33).
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
M=turbo4-asym,turbo3-asym
declare -A V=([def]='{}'
  [c4]=$(some $M '{"block_n": 64, "num_warps": 4, "num_stages": 3, "programs_per_sm": [4, 16]}')
  [e]=$(some $M '{"block_n": 64, "num_warps": 2, "num_stages": 3, "programs_per_sm": [4, 16]}')
  [c]=$(some $M '{"block_n": 64, "num_warps": 4, "num_stages": 3}'))
RUNS=${RUNS:-"def:8k,32k:1 c4:8k,32k:1 e:8k,32k:1 c:8k,32k:1 c4:8k,32k:1 def:8k,32k:1 c4:8k:1 def:8k:1"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4-asym,turbo3-asym}
(cd $OUT && tar czf b1-shapes2.tgz r && rm -rf r)
