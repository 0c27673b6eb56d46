#!/usr/bin/env bash
# Ninth session, second call: int8's dots at batch 16 under the 700 W power cap. The first call
# (diag9.sh) found int8's batch-16 step at the cap (SM clock ~1.82 GHz, reason 0x4 SW power cap)
# while fp16's is not; "mixed" (integer dots for the scores, no conversion of K codes; fp16 dots
# of biased codes for V) compiles to 761 instructions a block against f16's 928. Here: the int8
# GPU tests, attention alone per dot, clocks and power per dot, end to end f16 against mixed.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/r
KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
  -k "int8" > $OUT/r/gpu-int8-tests.txt 2>&1; echo "tests rc=$? t=$SECONDS"; tail -2 $OUT/r/gpu-int8-tests.txt
timeout 120 python3 scripts/bench_kernels.py --no-check --pdl --append default --modes fp16,int8:f16,int8:mixed,int8:s8 \
  --shapes 1x8192,1x32768,16x32768 > $OUT/r/kernels.txt 2>&1; echo "kernels rc=$? t=$SECONDS"
grep -E "^ +(1|16) +(8192|32768) " $OUT/r/kernels.txt | cut -c1-64
timeout 200 python3 scripts/exp/clock_probe.py --seconds 4 --modes \
  fp16,int8:int8_dot=f16,int8:int8_dot=mixed,int8:int8_dot=s8,fp16,int8:int8_dot=mixed,int8:int8_dot=f16,turbo4-asym,turbo4-delegated \
  > $OUT/r/clock-probe.txt 2>&1; echo "clock rc=$? t=$SECONDS"; grep -v -i warn $OUT/r/clock-probe.txt
E="--model dummy:llama-3.1-8b --modes fp16,int8 --contexts 8k,32k --batch 1,16 --warmup 8 --gen 64 --repeats 3 --quiet"
n=0
for v in f16 mixed f16 mixed; do
  n=$((n + 1)); KVBENCH_ATTN_CONFIG="{\"int8\": {\"int8_dot\": \"$v\"}}" timeout 100 python3 -m kvbench decode-bench $E \
    --out $OUT/r/e2e-$n-$v > $OUT/r/e2e-$n-$v.log 2>&1; echo "e2e $n $v rc=$? t=$SECONDS"
  python3 -c "import csv,sys; [print(' ', r['context_tokens'], r['batch'], r['kv_cache_mode'], r['decode_tok_s'], r['decode_ratio_vs_fp16']) for r in csv.DictReader(open(sys.argv[1])) if r['kv_cache_mode'] == 'int8']" $OUT/r/e2e-$n-$v/bench.csv
done
(cd $OUT && tar czf int8-dots.tgz r && rm -rf r)
