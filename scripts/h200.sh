#!/usr/bin/env bash
# The H200 runs behind results/<date>-h200 (see README). Two phases, because the
# default model travels to the GPU machine in two halves (../shared/gpu/stage-model.sh):
#   phase 1 (carry .gpu/m0):           decode-bench on dummy:llama-3.1-8b, capacity search
#   phase 2 (carry .gpu/m1, .gpu/whl): audit of the default model at 2K/8K/32K
#   phase k (carry .gpu/whl, staged by scripts/stage-gpu-extras.sh): the kernel
#            tests on compiled kernels (bf16 and full-size cases included)
#   phase p (after 1 and 2 on the same warm machine; carry .gpu/whl): peers, i.e.
#            transformers' own caches beside kvbench's modes (audit + decode-bench)
# The tree travels without .git: pass the commit, e.g.
#   KVBENCH_GIT_COMMIT=$(git rev-parse --short=12 HEAD) bash scripts/h200.sh 1
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}
M=/tmp/kvbench-model
case "${1:-}" in
k)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  mkdir -p $OUT
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
    tests/test_kernels.py 2>&1 | tee $OUT/gpu-kernel-tests.txt
  ;;
p)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  G=$M/SmolLM2-135M-Instruct.Q4_1.gguf
  timeout ${PEERS_AUDIT_TIMEOUT:-200} python3 -m kvbench audit --model $G --modes fp16,int8,turbo4-asym,hf:all \
    --contexts 2k,8k,32k --gen-tokens 32 --out $OUT/peers --quiet
  timeout ${PEERS_BENCH_TIMEOUT:-150} python3 -m kvbench decode-bench --model $G \
    --modes fp16,int8,turbo4-asym,turbo3-asym,hf:all --contexts 2k,8k,32k --batch 1 --warmup 4 --gen 32 --repeats 3 \
    --out $OUT/peers --quiet
  timeout ${PEERS_8B_TIMEOUT:-200} python3 -m kvbench decode-bench --model dummy:llama-3.1-8b \
    --modes fp16,int8,turbo4-asym,hf:all --contexts 2k,8k,32k --batch 1 --warmup 4 --gen 32 --repeats 3 \
    --out $OUT/peers-8b --quiet
  ;;
1)
  mkdir -p $M && cp .gpu/m0/* $M/
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -m kvbench decode-bench --model dummy:tiny --contexts 300 --batch 1,3 --gen 8 --warmup 4 --repeats 1 \
    --out /tmp/smoke --quiet || exit 1
  timeout ${BENCH_TIMEOUT:-420} python3 -m kvbench decode-bench --model dummy:llama-3.1-8b --modes all --no-fallback \
    --contexts 2k,8k,32k --batch 1,16 --warmup 8 --gen 64 --repeats 3 --capacity --out $OUT/bench --quiet
  ;;
2)
  cp .gpu/m1/* $M/ && cat $M/part0* > $M/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  timeout ${AUDIT_TIMEOUT:-400} python3 -m kvbench audit --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --modes all \
    --contexts 2k,8k,32k --compare-kernels --kv-cap-check 256 --prefix-reuse --niah --ppl --ppl-windows 1 \
    --ppl-chunk 1024 --out $OUT/audit --quiet
  timeout 120 python3 -m kvbench audit --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --modes turbo4 --no-fallback \
    --contexts 2k,8k,32k --out $OUT/audit-raw-turbo4 --quiet
  ;;
esac
ls -la $OUT/*
