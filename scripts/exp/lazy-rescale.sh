#!/usr/bin/env bash
# Tenth session: the split kernel's online softmax, rescaled only when a row's maximum rose by more
# than 8 (log2 units; `rescale_tau`), and its weights summed per element and over tokens once after
# the loop (`defer_sums`: no cross-warp reduction per block). Ahead of time (sm_90, triton 3.6,
# scripts/sass_loop.py, instructions a block on the path taken when no rescale is due):
#   fp16 621 -> 592 (lazy) -> 587 (lazy + defer), int8 759 -> 741 -> 719, turbo4-asym 1178 -> 1161,
#   turbo4 1895 -> 1863; defer takes 3-4 of 9-14 barriers a block off and adds registers (int8 133 -> 206).
# Usage: PART=1 (GPU tests, attention alone, end to end A B C: the working tree before the defaults
# changed) or PART=2 (after they did: D, the new defaults, against A, end to end D A D A; called by
# phase AY of scripts/h200.sh).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/r
ALL="fp16 int8 turbo4-asym turbo3-asym turbo4 turbo4-delegated"
cfg() {  # JSON for KVBENCH_ATTN_CONFIG: $1 = lazy modes' knobs, $2 = knobs of fp16 and int8
  local out="" m
  for m in $ALL; do
    case $m in fp16|int8) k="$2" ;; *) k="$1" ;; esac
    out="$out\"$m\": {$k}, "
  done
  echo "{${out%, }}"
}
A=""
B=$(cfg '"rescale_tau": 8.0' '"rescale_tau": 8.0')
C=$(cfg '"rescale_tau": 8.0' '"rescale_tau": 8.0, "defer_sums": true')
D=""  # PART=2: the defaults (fp16 and int8 lazy and deferred, turbo3-asym lazy, the rest eager)
[ "$PART" = 2 ] && A=$(cfg '"rescale_tau": 0.0, "defer_sums": false' '"rescale_tau": 0.0, "defer_sums": false')
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
E="--model dummy:llama-3.1-8b --modes all --no-fallback --contexts 8k,32k --batch 1,16 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
e2e() {
  for v in "$@"; do
    n=$((n + 1)); eval "conf=\$$v"
    KVBENCH_ATTN_CONFIG="$conf" timeout 120 python3 -m kvbench decode-bench $E --out $OUT/r/e2e-$PART-$n-$v \
      > $OUT/r/e2e-$PART-$n-$v.log 2>&1; echo "e2e $n $v rc=$? t=$SECONDS"
    python3 -c "
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r['decode_tok_s']]
print('  ' + ' '.join(f\"{r['kv_cache_mode']}@{int(r['context_tokens'])//1024}k/{r['batch']}={float(r['decode_tok_s']):.1f}({float(r['decode_ratio_vs_fp16'] or 1):.3f})\" for r in rows))
" $OUT/r/e2e-$PART-$n-$v/bench.csv
  done
}
n=0
if [ "$PART" = 1 ]; then
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    -k "lazy_rescale" > $OUT/r/gpu-tests-lazy.txt 2>&1; echo "tests lazy rc=$? t=$SECONDS"; tail -1 $OUT/r/gpu-tests-lazy.txt
  KVBENCH_ATTN_CONFIG="$C" KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernels.py -k "test_decode_attention or append_stores" > $OUT/r/gpu-tests-C.txt 2>&1
  echo "tests C rc=$? t=$SECONDS"; tail -1 $OUT/r/gpu-tests-C.txt
  K=""; for m in $ALL; do K="$K,$m:eager+nodefer,$m:lazy"; done; K="${K#,},fp16:lazy+defer,int8:lazy+defer"
  timeout 150 python3 scripts/bench_kernels.py --no-check --pdl --append default --modes "$K" \
    --shapes 1x8192,1x32768,16x32768 > $OUT/r/kernels.txt 2>&1; echo "kernels rc=$? t=$SECONDS"
  grep -E "^ +(1|16) +(8192|32768) " $OUT/r/kernels.txt | cut -c1-60
  e2e A B C
else
  e2e D A D A
fi
(cd $OUT && tar czf lazy-rescale-$PART.tgz r && rm -rf r)
