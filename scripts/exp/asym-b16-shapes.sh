#!/usr/bin/env bash
# Twenty-third session, after turbo4-long.sh: raw turbo4 gained 17% of its attention at 32K, batch 16 from
# one-warp programs of 32-token blocks and 34 splits (fuller waves; turbo4-shapes.sh). The other coded modes'
# batch-16 shapes (64-token blocks, 2 warps, up to 16 programs an SM) are as old. A lead for a later session,
# not a change: attention + append alone at 32K, batch 16, the default and one- and two-warp shapes at 33-34
# splits. Prediction: one-warp shapes within +-10% of the defaults (the fp16 K tile makes these programs
# heavier: more registers, fewer programs an SM, so the wave arithmetic differs).
source scripts/exp/ab-lib.sh
timeout ${TUNE_S:-150} python3 scripts/bench_kernels.py --tune --modes ${MODES:-turbo4-asym,turbo3-asym,turbo4-delegated} \
  --shapes 16x32768 --no-check --pdl --append default --configs "${CONFIGS:-32/1/2/34,64/1/2/34,32/2/2/34,64/2/2/34}" \
  > $OUT/r/tune-16x32768.txt 2>&1
echo "tune rc=$? t=$SECONDS"; grep -E "^ +16 |tuned|top" $OUT/r/tune-16x32768.txt | cut -c1-400
(cd $OUT && tar czf asym-b16-shapes.tgz r && rm -rf r)
