#!/usr/bin/env bash
# Ninth session, first call (diagnostics, no product code changed): where int8's batch-16 time goes
# (clocks and power), how much a one-plane centroid lookup would buy the turbo kernels (timing
# only, scripts/exp/lut_upper_bound.py), and why the turbo4 split kernel runs at ~1 TB/s (ncu).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import triton, torch; print('torch', torch.__version__, 'triton', triton.__version__)"
# 1. clocks and power during the batch-16, 32K step (fp16 / int8 alternating)
timeout 140 python3 scripts/exp/clock_probe.py --modes fp16,int8,fp16,int8 --seconds 5 > $OUT/clock-probe.txt 2>&1
echo "clock rc=$? t=$SECONDS"; cat $OUT/clock-probe.txt | grep -v Warn
# 2. attention + append alone, the committed (exact) lookup against the one-plane ones (wrong values)
K="scripts/bench_kernels.py --no-check --pdl --append default --modes turbo4,turbo4-asym --shapes 1x32768,16x32768"
for lut in exact g8 g7 exact; do
  TRITON_CACHE_DIR=/tmp/tc-$lut LUT=$lut timeout 100 python3 scripts/exp/lut_upper_bound.py $K > $OUT/kernels-$lut.txt 2>&1
  echo "kernels $lut rc=$? t=$SECONDS"; grep -E "^ +(1|16) +32768 +turbo" $OUT/kernels-$lut.txt
done
# 3. end to end, exact / g7 (timing only): fp16, turbo4 (no fallback), turbo4-asym at 32K
E="--model dummy:llama-3.1-8b --modes fp16,turbo4,turbo4-asym --no-fallback --contexts 32k --batch 1,16 --warmup 8 --gen 48 --repeats 3 --quiet"
for lut in exact g7; do
  TRITON_CACHE_DIR=/tmp/tc-$lut LUT=$lut timeout 120 python3 scripts/exp/lut_upper_bound.py -m kvbench decode-bench $E --out $OUT/e2e-$lut > $OUT/e2e-$lut.log 2>&1
  echo "e2e $lut rc=$? t=$SECONDS"
  python3 -c "import csv,sys; [print(' ', r['kv_cache_mode'], r['batch'], r['decode_tok_s'], r['decode_ratio_vs_fp16']) for r in csv.DictReader(open(sys.argv[1]))]" $OUT/e2e-$lut/bench.csv
done
# 4. ncu: the split kernels at batch 16, 32K and batch 1, 32K (real clocks, not locked)
timeout 200 ncu --clock-control none -k regex:_decode_split_kernel --launch-count 16 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 scripts/bench_kernels.py --once --no-check --modes fp16,int8,turbo4-asym,turbo4 --shapes 16x32768,1x32768 \
  > $OUT/ncu-split.txt 2>&1
echo "ncu rc=$? t=$SECONDS"
grep -E "_decode_split_kernel|Issue Slots Busy|No Eligible|Achieved Occupancy|Registers Per|Memory Throughput|Duration|Warp Cycles Per Issued|SM Frequency|stalled_(long|short|barrier|math|mio|wait|not_sel|dispatch|lg_)" $OUT/ncu-split.txt | head -150
