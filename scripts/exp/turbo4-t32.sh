#!/usr/bin/env bash
# Twenty-third session, after turbo4-shapes.sh (call 1): attention + append alone, turbo4 ran fastest on
# one-warp programs of 32-token blocks (2 stages): 33.1 us with 132 splits against 36.3 for the default
# (64-token blocks, 2 warps, 66 splits) at 32K, batch 1; 378.9 us with 34 splits against 457.1 (17 splits)
# at batch 16. `t32`: that shape with programs_per_sm (8, 32), i.e. 132 splits at batch 1 and 32 (the
# 1024-token floor of `choose_num_splits`) at 32K, batch 16.
# Prediction: end to end at 32K, +1-2 points of the ratio to fp16 at batch 1 and +5-8 at batch 16; 8K and 2K
# within +-1 point (turbo4 has no target there; a loss would want the shape per context).
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [t32]=$(some turbo4 '{"block_n": 32, "num_warps": 1, "num_stages": 2, "programs_per_sm": [8, 32]}'))
RUNS=${RUNS:-"def:32k:1 t32:32k:1 def:32k:16 t32:32k:16 def:8k:1 t32:8k:1 t32:32k:1 def:32k:1 t32:32k:16 def:32k:16 def:2k:1 t32:2k:1 def:8k:16 t32:8k:16"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4}
(cd $OUT && tar czf turbo4-t32.tgz r && rm -rf r)
