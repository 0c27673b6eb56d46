#!/usr/bin/env bash
# Seventeenth session: what raw turbo4's attention costs against what its targets allow (1.12x of fp16 at
# 32K batch 1, 2.0x at batch 16). 1. attention + append alone, fp16 / turbo4 / turbo4-asym at the launch
# defaults (scripts/bench_kernels.py, CUDA graphs, PDL); 2. ncu on the split kernels of fp16 and turbo4 at
# 32K, batch 16 and 1 (real clocks): duration, issue, occupancy and the warp instructions executed, from
# which scripts/exp/turbo4_budget.py takes instructions per (token, kv head).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
timeout 150 python3 scripts/bench_kernels.py --no-check --pdl --append default --modes fp16,turbo4,turbo4-asym \
  --shapes 1x32768,16x32768 > $OUT/kernels.txt 2>&1
echo "kernels rc=$? t=$SECONDS"; grep -E "^ +(1|16) +32768" $OUT/kernels.txt
timeout 240 ncu --clock-control none -k regex:_decode_split_kernel --launch-count 8 \
  --section SpeedOfLight --section Occupancy --section SchedulerStats --section LaunchStats \
  --metrics smsp__inst_executed.sum,sm__cycles_active.avg \
  python3 scripts/bench_kernels.py --once --no-check --modes fp16,turbo4 --shapes 16x32768,1x32768 \
  > $OUT/ncu-split.txt 2>&1
echo "ncu rc=$? t=$SECONDS"
grep -E "_decode_split_kernel \(|inst_executed|Duration|One or More Eligible|Achieved Occupancy|Registers Per|DRAM Throughput|SM Frequency" $OUT/ncu-split.txt
