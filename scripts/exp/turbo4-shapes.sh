#!/usr/bin/env bash
# Twenty-third session: raw turbo4's launch shape, measured again. Its default (64-token blocks, 2 warps,
# 2 stages; 2026-12-01 wide sweep) predates `lut_regs`, `dot_fence` and `hoist_lut`, which changed its
# registers and loop. Ahead of time now (sm_90, triton 3.6, `scripts/sass_loop.py --modes turbo4`):
#   block/warps  registers  loop  warp instr per (token, kv head)  warps an SM (registers)
#   64/2 (def)   219        1369  42.8                             8
#   64/4         162         752  47.0                             12
#   32/2         168         738  46.1                             12
#   32/4         126         429  53.6                             16
#   64/8         100         417  52.1                             16
# At batch 1 the kernel issues on ~51% of its cycles with 2 warps a scheduler (ncu, seventeenth session), so
# 1.5-2x the warps may pay for 8-25% more instructions.
# Prediction: 64/4 or 32/2 5-15% off turbo4's attention at 32K, batch 1 (end to end +1-3 points of the ratio
# to fp16); at batch 16, where it issues on 56% of cycles and is closer to issue-bound, within +-5%.
# Part 1: attention + append alone (scripts/bench_kernels.py --tune --configs, PDL), every shape;
# part 2: end to end, the shapes in turn on one lease.
source scripts/exp/ab-lib.sh
if [ -z "${SKIP_TUNE:-}" ]; then
  for shape in 1x32768:"66 50 33 99 132" 16x32768:"17 34"; do
    IFS=: read -r sh splits <<< "$shape"
    cfgs=""
    for s in $splits; do for c in 64/2/2 64/4/2 64/4/3 32/2/2 32/2/3 32/4/2 64/8/2 32/1/2 16/2/2; do
      cfgs="$cfgs${cfgs:+,}$c/$s"; done; done
    timeout 200 python3 scripts/bench_kernels.py --tune --modes turbo4 --shapes $sh --no-check --pdl \
      --append default --configs "$cfgs" > $OUT/r/tune-$sh.txt 2>&1
    echo "tune $sh rc=$? t=$SECONDS"; grep -E "turbo4|tuned|top" $OUT/r/tune-$sh.txt | cut -c1-900
  done
fi
export AB_FLAGS="--no-fallback"
shape() { some turbo4 "{\"block_n\": $1, \"num_warps\": $2, \"num_stages\": 2, \"programs_per_sm\": [$3, 16]}"; }
declare -A V=([def]='{}' [w4]=$(shape 64 4 3) [b32]=$(shape 32 2 6) [b32w4]=$(shape 32 4 4) [w8]=$(shape 64 8 2))
RUNS=${RUNS:-"def:32k:1 w4:32k:1 b32:32k:1 def:32k:16 w4:32k:16 b32:32k:16 b32w4:32k:1 w8:32k:1 b32w4:32k:16 w8:32k:16"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4}
(cd $OUT && tar czf turbo4-shapes.tgz r && rm -rf r)
