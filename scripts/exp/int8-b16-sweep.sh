#!/usr/bin/env bash
# Tenth session, last call: int8's launch shape at 32K, batch 16, end to end under the 700 W power cap,
# with the lazy rescale and deferred sums (a5c495e). The shapes were chosen on attention alone before
# (scripts/bench_kernels.py --tune); here each runs the whole decode step beside fp16, default first and
# again in the middle. One decode-bench per shape (KVBENCH_ATTN_CONFIG, in each row's notes).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/r
E="--model dummy:llama-3.1-8b --modes fp16,int8 --contexts 32k --batch 16 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
n=0
for v in '' '"num_warps": 8' '"block_n": 64' '"num_stages": 2' '' '"programs_per_sm": [3, 3]' '"num_stages": 4' '"block_n": 256'; do
  n=$((n + 1)); conf=""; [ -n "$v" ] && conf="{\"int8\": {$v}}"
  KVBENCH_ATTN_CONFIG="$conf" timeout 60 python3 -m kvbench decode-bench $E --out $OUT/r/s$n > $OUT/r/s$n.log 2>&1
  echo "s$n {$v} rc=$? t=$SECONDS"
  python3 -c "
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print('   ', r['kv_cache_mode'], r['decode_tok_s'], r['decode_ratio_vs_fp16'], r['status'])
" $OUT/r/s$n/bench.csv 2>/dev/null
  [ $SECONDS -gt 330 ] && break
done
(cd $OUT && tar czf int8-b16-sweep.tgz r && rm -rf r)
