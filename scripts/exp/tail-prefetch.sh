#!/usr/bin/env bash
# Twelfth session: the reduction's tail at 8K, batch 1. The output GEMV after the attention asks L2 for its
# first PREFETCH_K (512) weight columns before it waits, but it launches only once the reduction has waited
# for the split kernel (the reduction releases it after its wait). Variants, end to end, every mode at 8K and
# 32K, batch 1 (CONTEXTS, BATCH):
#   base  as committed
#   pN    every projection prefetches N columns per row (KVBENCH_GEMV_PREFETCH_K)
#   er    the reduction releases the GEMV first thing (early_release in KVBENCH_ATTN_CONFIG, every mode)
#   erpN  both
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
ER='{"fp16": {"early_release": true}, "int8": {"early_release": true}, "turbo4-asym": {"early_release": true},
 "turbo3-asym": {"early_release": true}, "turbo4": {"early_release": true}, "turbo4-delegated": {"early_release": true}}'
E="--model dummy:llama-3.1-8b --modes ${MODES:-all} --no-fallback --contexts ${CONTEXTS:-8k,32k} --batch ${BATCH:-1}
   --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
n=0
for v in ${ORDER:-base p2048 er erp2048 p4096 p1024 base}; do
  n=$((n + 1))
  [ $SECONDS -gt ${BUDGET_S:-500} ] && { echo "run $n $v skipped: time"; continue; }
  cfg='{}'; pf=''
  case $v in er*) cfg=$ER ;; esac
  case $v in *p[0-9]*) pf=${v##*p} ;; esac
  KVBENCH_ATTN_CONFIG="$cfg" KVBENCH_GEMV_PREFETCH_K="$pf" timeout 120 python3 -m kvbench decode-bench $E \
    --out $OUT/r/run-$n-$v > $OUT/r/run-$n-$v.log 2>&1
  echo "run $n $v rc=$? t=$SECONDS"
  python3 scripts/exp/bench_summary.py $OUT/r/run-$n-$v/bench.csv
done
(cd $OUT && tar czf tail-prefetch.tgz r && rm -rf r)
