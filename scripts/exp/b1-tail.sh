#!/usr/bin/env bash
# Twentieth session: turbo4-asym and turbo3-asym sit 0.1-0.2% under fp16 at 8K, batch 1 with fence and hoist
# (results/2026-12-03d-h200). Of what they lose a layer, ~1 us was the merge of 33 splits on two warps
# (twelfth session). Two cheap knobs, alternating on one lease at 8K, batch 1: the fresh token stored before
# the merge (`write_first`, fp16's and int8's choice; 0.1-0.7 us slower for turbo in 2026-12-01c, before the
# loads-first merge and early release), the merge on one warp in two passes (`reduce_warps` 1), and 25 splits
# (`s25`: 3 blocks a split, 200 programs; the hoist shortened the loop by 12% since 17 splits lost 2 points).
# Prediction: within +-0.1 point of the defaults; adopt only a variant ahead in every repetition.
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
M=turbo4-asym,turbo3-asym
declare -A V=([def]='{}' [wf]=$(some $M '{"write_first": true}') [rw1]=$(some $M '{"reduce_warps": 1}')
  [s25]=$(some $M '{"splits": 25}'))
RUNS=${RUNS:-"def:8k:1 wf:8k:1 rw1:8k:1 s25:8k:1 def:8k:1 wf:8k:1 rw1:8k:1 s25:8k:1 def:8k:1 wf:8k:1 rw1:8k:1 s25:8k:1"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4-asym,turbo3-asym}
(cd $OUT && tar czf b1-tail.tgz r && rm -rf r)
