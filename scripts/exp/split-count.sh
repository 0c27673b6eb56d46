#!/usr/bin/env bash
# EXPERIMENT: at 8K, batch 1, the quantized modes with ~1 program per SM (17 splits, as fp16) against their
# default ~2 (33 splits); 32K and batch 16 keep their split counts under both (see choose_num_splits).
set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lo1='{"int8": {"programs_per_sm": [1, 2]}, "turbo4-asym": {"programs_per_sm": [1, 16]}, "turbo3-asym": {"programs_per_sm": [1, 8]}, "turbo4-delegated": {"programs_per_sm": [1, 16]}}'
B="--model dummy:llama-3.1-8b --modes fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated --contexts 8k --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
for v in d1 s1 d2 s2; do
  KVBENCH_ATTN_CONFIG=$([[ $v == s* ]] && echo "$lo1" || echo '{}') timeout 80 python3 -m kvbench decode-bench $B \
    --out $OUT/split-$v > $OUT/split-$v.log 2>&1; echo "$v rc=$? t=$SECONDS"
done
python3 - <<'P'
import csv, os
out = os.environ["OUT"]
for v in ("d1", "s1", "d2", "s2"):
    rows = list(csv.DictReader(open(f"{out}/split-{v}/bench.csv")))
    base = {r["context_tokens"]: float(r["decode_tok_s"]) for r in rows if r["kv_cache_mode"] == "fp16"}
    print(v, " ".join(f'{r["kv_cache_mode"]}={float(r["decode_tok_s"]):.1f}({float(r["decode_tok_s"]) / base[r["context_tokens"]]:.4f})' for r in rows))
P
