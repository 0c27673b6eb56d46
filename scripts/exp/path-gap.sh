#!/usr/bin/env bash
# Twenty-sixth session: the audit's kernel check taken apart (scripts/exp/path_gap.py), then raw turbo4's
# audit again (its runs.csv did not come back on 2026-12-04). The default model comes over in thirds:
# carry .gpu/p0, then .gpu/p1 (each call: mkdir -p /tmp/kvbench-model && cp .gpu/pN/* /tmp/kvbench-model/),
# then this script with carry .gpu/p2 .gpu/whl on the same machine.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=/tmp/kvbench-model G=/tmp/kvbench-model/SmolLM2-135M-Instruct.Q4_1.gguf
cp .gpu/p2/* $M/
[[ -f $M/part00 && -f $M/part01 && -f $M/part02 ]] || { echo "a third of the model is missing"; exit 3; }
cat $M/part0* > $G && sha256sum $G
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
mkdir -p $OUT/path-gap
timeout ${GAP_TIMEOUT:-420} python3 scripts/exp/path_gap.py --model $G --contexts ${GAP_CONTEXTS:-2048,32768} \
  --json $OUT/path-gap/path-gap.json > $OUT/path-gap/path-gap.txt 2>&1
echo "path_gap rc=$? t=$SECONDS"; grep -v "^#" $OUT/path-gap/path-gap.txt | tail -60
timeout ${RAW4_TIMEOUT:-100} python3 -m kvbench audit --model $G --modes turbo4 --no-fallback \
  --contexts 2k,8k,32k --out $OUT/audit-raw-turbo4 --quiet > $OUT/raw4.log 2>&1
echo "raw4 rc=$? t=$SECONDS"; tail -3 $OUT/raw4.log
(cd $OUT && tar czf all.tgz path-gap audit-raw-turbo4 raw4.log)
