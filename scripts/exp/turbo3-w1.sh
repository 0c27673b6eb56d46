#!/usr/bin/env bash
# Twenty-third session, after asym-b16-shapes.sh (call 5): turbo3-asym's attention + append alone at 32K,
# batch 16 took 328.7 us on one-warp programs of 32-token blocks with 34 splits against 369.1 for its defaults
# (128-token blocks, 4 warps, 3 stages, 9 splits). End to end, `w1` (that shape, 2 stages, programs_per_sm
# (8, 32): 33 splits) against the defaults, in turn. Run as one inline command in call 6; this is it.
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [w1]=$(some turbo3-asym '{"block_n": 32, "num_warps": 1, "num_stages": 2, "deep_stages": null, "programs_per_sm": [8, 32]}'))
RUNS=${RUNS:-"def:32k:16 w1:32k:16 def:32k:16 w1:32k:16"}
BUDGET_S=${BUDGET_S:-100} ab_runs "$RUNS" ${MODES:-fp16,turbo3-asym}
(cd $OUT && tar czf t3-w1.tgz r && rm -rf r)
