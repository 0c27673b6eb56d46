#!/usr/bin/env bash
# Twelfth session: turbo4-asym, turbo3-asym and turbo4-delegated at 8K, batch 1 miss 1.0x of fp16 by 0.4-0.5%
# (the reduction's tail, eighth session). Their launch shape at batch 1 was chosen on attention alone; this
# sweeps it end to end, where the tail counts. Each run times fp16 and the three modes at 8K (CONTEXTS),
# batch 1, with KVBENCH_ATTN_CONFIG giving each mode its own variant (a Latin square: every mode meets every
# variant once; runs 1 and last are the defaults). Variants:
#   a  the defaults (128-token blocks, 4 warps, 2 stages, ~2 programs per SM: 33 splits of 2 blocks)
#   b  a: the reduction on 4 warps (it merges 33 splits on 2)
#   c  64-token blocks, 4 warps, 3 stages (33 splits of 4 blocks)
#   d  64-token blocks, 2 warps, 3 stages (33 splits of 4 blocks)
#   e  64-token blocks, 2 warps, 3 stages, ~4 programs per SM (66 splits of 2 blocks)
#   f  64-token blocks, 4 warps, 2 stages, ~3 programs per SM (50 splits of 3 blocks)
#   g  128-token blocks, 4 warps, 2 stages, ~4 programs per SM (66 splits of 1 block)
# RUNS overrides the plan ("t4a t3a del" per run, space-separated triples joined by commas).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
declare -A V=(
  [a]='{}'
  [b]='{"reduce_warps": 4}'
  [c]='{"block_n": 64, "num_warps": 4, "num_stages": 3}'
  [d]='{"block_n": 64, "num_warps": 2, "num_stages": 3}'
  [e]='{"block_n": 64, "num_warps": 2, "num_stages": 3, "programs_per_sm": [4, 16]}'
  [f]='{"block_n": 64, "num_warps": 4, "num_stages": 2, "programs_per_sm": [3, 16]}'
  [g]='{"block_n": 128, "num_warps": 4, "num_stages": 2, "programs_per_sm": [4, 16]}'
)
RUNS=${RUNS:-"a a a,b c d,c d e,d e f,e f g,f g b,g b c,a a a"}
E="--model dummy:llama-3.1-8b --modes fp16,turbo4-asym,turbo3-asym,turbo4-delegated --contexts ${CONTEXTS:-8k}
   --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
n=0
IFS=, read -ra plan <<< "$RUNS"
for triple in "${plan[@]}"; do
  read -r x y z <<< "$triple"; n=$((n + 1))
  cfg="{\"turbo4-asym\": ${V[$x]}, \"turbo3-asym\": ${V[$y]}, \"turbo4-delegated\": ${V[$z]}}"
  [ $SECONDS -gt ${BUDGET_S:-500} ] && { echo "run $n skipped: time"; continue; }
  KVBENCH_ATTN_CONFIG="$cfg" timeout 90 python3 -m kvbench decode-bench $E --out $OUT/r/run-$n > $OUT/r/run-$n.log 2>&1
  echo "run $n ($x $y $z) rc=$? t=$SECONDS"
  python3 scripts/exp/bench_summary.py $OUT/r/run-$n/bench.csv
done
(cd $OUT && tar czf b1-shapes.tgz r && rm -rf r)
