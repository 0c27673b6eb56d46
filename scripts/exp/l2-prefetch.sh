#!/usr/bin/env bash
# Thirteenth session: turbo4-asym, turbo3-asym and turbo4-delegated at 8K, batch 1 miss 1.0x of fp16 by 0.3-0.6%.
# Their split kernel reads ~21 MB a layer in 11.4 us (1.9 TB/s: latency-bound, two programs an SM), fp16's 33.5 MB
# in 10.9 us. Here the RoPE kernel asks L2 for the layer's cache while the QKV GEMV still streams its weights
# (kernels/prefetch.py; `l2_prefetch_mb`), so the split kernel reads L2. Variants, every mode alike:
#   off   the defaults (no prefetch)
#   pf    prefetch when the layer's cache is <= 40 MiB (8K, batch 1: every mode, fp16 included)
#   last  pf with the lines marked evict-last in L2
#   gb    from the QKV GEMV's programs instead (96 of them at batch 1, not RoPE's 6), in bulk
#   gl    gb, one line prefetch per 128-byte line
# Runs (the first call) alternate off / pf / last twice at 8K, then off / pf at 2K; then fp16 alone with 16
# splits against its default 17 (136 programs on 132 SMs: 4 start late) at 2K / 8K / 32K. The second call:
# RUNS="off:8k:M5 gb:8k:M5 gl:8k:M5 ..." (M5 stands for the five modes).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
all() { python3 -c "import json,sys; print(json.dumps({m: json.loads(sys.argv[1]) for m in
  ['fp16','int8','turbo4-asym','turbo3-asym','turbo4-delegated']}))" "$1"; }
declare -A V=(
  [off]='{}'
  [pf]=$(all '{"l2_prefetch_mb": 40}')
  [last]=$(all '{"l2_prefetch_mb": 40, "l2_prefetch_policy": "evict_last"}')
  [gb]=$(all '{"l2_prefetch_mb": 40, "l2_prefetch_from": "gemv"}')
  [gl]=$(all '{"l2_prefetch_mb": 40, "l2_prefetch_from": "gemv", "l2_prefetch_lines": true}')
  [s16]='{"fp16": {"splits": 16}}'
)
M5=fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated
RUNS=${RUNS:-"off:8k:$M5 pf:8k:$M5 last:8k:$M5 off:8k:$M5 pf:8k:$M5 last:8k:$M5 off:2k:$M5 pf:2k:$M5
  off:2k,8k,32k:fp16 s16:2k,8k,32k:fp16 off:2k,8k,32k:fp16 s16:2k,8k,32k:fp16"}
n=0
for run in $RUNS; do
  IFS=: read -r v ctx modes <<< "$run"; n=$((n + 1)); [ "$modes" = M5 ] && modes=$M5
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "run $n skipped: time"; continue; }
  KVBENCH_ATTN_CONFIG="${V[$v]}" timeout 100 python3 -m kvbench decode-bench --model dummy:llama-3.1-8b \
    --modes $modes --contexts $ctx --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0 \
    --out $OUT/r/run-$n > $OUT/r/run-$n.log 2>&1
  echo "run $n ($v $ctx) rc=$? t=$SECONDS"
  python3 scripts/exp/bench_summary.py $OUT/r/run-$n/bench.csv || tail -5 $OUT/r/run-$n.log
done
(cd $OUT && tar czf l2-prefetch.tgz r && rm -rf r)
