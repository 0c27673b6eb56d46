#!/usr/bin/env bash
# Twenty-seventh session: the float32 gap between the kernel check's paths taken apart by the writes
# (scripts/exp/write_gap.py). The default model comes over in thirds: carry .gpu/p0, then .gpu/p1 (each call:
# mkdir -p /tmp/kvbench-model && cp .gpu/pN/* /tmp/kvbench-model/), then this script with carry .gpu/p2 .gpu/whl
# on the same machine.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=/tmp/kvbench-model G=/tmp/kvbench-model/SmolLM2-135M-Instruct.Q4_1.gguf
cp .gpu/p2/* $M/
[[ -f $M/part00 && -f $M/part01 && -f $M/part02 ]] || { echo "a third of the model is missing"; exit 3; }
cat $M/part0* > $G && sha256sum $G
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null
mkdir -p $OUT/write-gap
timeout ${GAP_TIMEOUT:-500} python3 scripts/exp/write_gap.py --model $G --contexts ${GAP_CONTEXTS:-2048,32768} \
  --json $OUT/write-gap/write-gap.json > $OUT/write-gap/write-gap.txt 2>&1
echo "write_gap rc=$? t=$SECONDS"; tail -50 $OUT/write-gap/write-gap.txt
