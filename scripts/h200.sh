#!/usr/bin/env bash
# The H200 runs behind results/<date>-h200* (see README). The default model travels
# to the GPU machine in two halves (../shared/gpu/stage-model.sh), so the work comes
# in phases; each is one `run` call. Steps:
#   bench   (needs nothing):  decode-bench on dummy:llama-3.1-8b + capacity search (212 s at 8148bd2)
#   audit   (needs the model): audit of the default model at 2K/8K/32K, all checks
#   raw4    (needs the model): audit of raw turbo4 (--no-fallback)
#   ktests  (needs .gpu/whl):  every GPU test file on compiled kernels (bf16, full sizes): ~14 min on one
#                              process; with pytest-xdist carried in .gpu/site (cp -r .venv/lib/python*/
#                              site-packages/{xdist,execnet}* .gpu/site/) it runs on 8 workers: test_kernels.py
#                              alone took 131 s that way on 2026-12-04 (results/2026-12-04g-h200)
#   peers   (needs the model, .gpu/whl): transformers' caches beside kvbench's modes
#   peers8b (needs .gpu/whl):  the same on dummy:llama-3.1-8b (speed)
#   shard1 / shard2: a small sweep on one GPU / sharded over two (`--devices 0,1`)
# Phases as run for results/2026-11-30-h200* (each one `run` call; A, C and E on a
# 2-GPU machine, kind nvidia-h200-x2, steps side by side one per GPU; K then D on one GPU):
#   A (carry .gpu/m0 .gpu/whl):  GPU0 bench (superseded by E) | GPU1 ktests, peers8b
#   B (after A, carry .gpu/m1 .gpu/whl): joins the model; GPU0 audit | GPU1 raw4, peers
#      (superseded: D re-ran the audits after two fixes; B's peers files did not come
#      back from the machine, so C re-ran peers)
#   C (after B, same machine):   GPU1 peers | GPU0 the small sweep on one GPU; then it on two
#   E (no carry): the GPU benchmark alone on one GPU, then sharded over two, then the
#      attention micro-benchmark (scripts/bench_kernels.py) on the current launch defaults
#   K (carry .gpu/m0 .gpu/whl):  ktests
#   D (after K, carry .gpu/m1 .gpu/whl): audit, raw4 and peers-audit side by side (no
#      timing in them, so they may share the GPU)
#   F (carry .gpu/whl; a later session): int8 V token-major: attention alone for both
#      int8 layouts with the tuning sweep, the benchmark on one GPU, the kernel tests
#   G (carry .gpu/whl, after F): the prmt lookup for turbo codes and int8's retuned splits:
#      kernel tests, attention alone (prmt and gather side by side), the benchmark
#   H (no carry; 2026-12-01): 3-bit codes loaded as words; every quantized mode's attention
#      swept over the wide launch grid (small programs, more splits)
#   I (carry .gpu/whl, after H): the defaults chosen from H: kernel tests, attention alone, the benchmark
#   J (carry .gpu/m0 .gpu/whl): quantize-on-write beside the attention (side stream; slower, reverted):
#      kernel and engine tests, the benchmark; then D on the same machine
#   L (carry .gpu/whl): the committed code after J's revert: kernel and engine tests, the benchmark
#   M (carry .gpu/old, a copy of kvbench/ and scripts/ at the previous commit): GPU time per kernel,
#      previous vs new code (2026-12-01, second session; results/2026-12-01b-h200)
#   N (carry .gpu/whl, after M): the same per kernel after M's findings, then the kernel tests
#   P (carry .gpu/whl, after N): the defaults chosen from N: kernel and engine tests, the benchmark,
#      attention with the append alone
#   Q (carry .gpu/m0 .gpu/whl): the turbo write's centroid picked in registers: tests, per kernel, attention
#   R (after Q, same machine, carry .gpu/m1 .gpu/whl): audit + raw turbo4 side by side, then the benchmark
#   S (no carry; 2026-12-01, third session): chunked tile rows for fp16/int8: attention alone, both
#      layouts; GPU time per kernel; the chunked layout's launch sweep (results/2026-12-01c-h200).
#      S and T ran at 5e009fb and 4edf335: their :chunked/:plain variants left with the revert (6bd287d)
#   T (no carry, after S): int8's chunked rows with a block-diagonal p @ V; the fresh token's write at the
#      start of the reduction (wfirst) vs its end, every mode: attention + append alone, per kernel
#   U (carry .gpu/m0, after chunked rows were reverted and fp16/int8 took write_first): per kernel,
#      attention + append alone, the benchmark
#   V (after U, same machine, carry .gpu/m1 .gpu/whl): the audit beside the kernel and engine tests
#   W (carry .gpu/m0): the turbo write with one division per row: per kernel, write tests, the benchmark
#   X (after W, same machine, carry .gpu/m1 .gpu/whl): the turbo modes' audit beside the kernel and engine tests
#   Y (no carry; 2026-12-01, fourth session): int8 with fp16 dots of biased codes beside the integer dots:
#      int8 kernel tests, attention + append alone, the f16 variant's launch sweep, per kernel
#   Z (carry .gpu/m0, after Y; int8 takes the f16 dots): int8's wide launch sweep, the benchmark
#   AA (no carry, after Z): int8's reduction warps per kernel; every mode's split count swept
#   AB (carry .gpu/m0, the defaults from AA): per kernel, attention + append alone, the benchmark
#   AC (after AB, same machine, carry .gpu/m1 .gpu/whl): the full audit and raw turbo4's beside the kernel and engine tests
#   then `step bench` (no carry) at 345cbd0, the same code, for a second reading (results/2026-12-01d-h200/rerun-345cbd0)
#   AD (carry .gpu/m0 .gpu/whl; 2026-12-01, fifth session): programmatic dependent launch: PDL and engine tests,
#      attention + append without and with PDL, the benchmark with PDL and with --no-pdl
#   AE (carry .gpu/m0 .gpu/whl, after AD): RoPE and the query rotation release the split kernel only as they
#      exit: PDL and engine tests, the benchmark with PDL and with --no-pdl
#   AF (carry .gpu/m0), then AG (same machine, carry .gpu/m1 .gpu/whl): the full audit and raw turbo4's beside
#      the kernel, engine and PDL tests, at the code of AE
#   then `step bench` (carry .gpu/m0) and `step raw4` (carry .gpu/m1 .gpu/whl) at c7fa03f: results/2026-12-01e-h200/rerun-c7fa03f,
#      audit-raw-turbo4
#   AH (no carry): batch 1 alone, PDL on / off / on / off, four modes
#   AI (carry .gpu/whl .gpu/old; 2026-12-01, sixth session): the GEMV kernel and delegated's one-accumulator
#      split kernel: GPU tests, cuBLAS against the GEMV kernel with its launch sweep, delegated old against new
#   AJ (no carry, after AI): delegated's launch configs on the new kernel; batch 1 and 16 end to end, GEMV kernel vs cuBLAS
#   AK (carry .gpu/whl, after AJ): the GPU tests (kernels, engine, PDL, GEMV); int8 with 4 pipeline stages vs 3, end to end
#   then `step bench` (carry .gpu/m0) and AM (same machine, carry .gpu/m1 .gpu/whl): the audits beside the GEMV and engine tests
#   AN (no carry, after AM): the benchmark on another lease; delegated at batch 1 on turbo4-asym's program shape
#   2026-12-01, seventh session (results/2026-12-01g-h200): two experiments first, each one call at the commit that
#      holds it: int8 V in contiguous 128-token blocks (timing only, not committed), then c3d76e4's
#      scripts/exp-ao.sh (4-bit V codes token-major; reverted); then AP and AQ below
#   AP (carry .gpu/m0 .gpu/whl): delegated's batch-1 shape: its GPU tests, the benchmark
#   AQ (after AP, same machine, carry .gpu/m1 .gpu/whl): the full audit beside the kernel and engine tests
#   AR (no carry, another lease): the benchmark again; GPU time per kernel at batch 1, 8K and 32K
#   AS (carry .gpu/m0), then AT (same machine, carry .gpu/m1 .gpu/whl): the butterfly WHT: the benchmark, then the
#      full audit beside the kernel and engine tests
#   2026-12-01, eighth session (results/2026-12-01h-h200): first scripts/exp/fold-upper-bound.sh (timing only: the
#      turbo reductions without their transforms or their write), then scripts/exp/profile.sh (GPU time per kernel
#      inside the captured step), both at the working tree of 36174fd; then AU and AV below
#   AU (carry .gpu/m0 .gpu/whl): the merge in one pass past 32 splits, delegated's hot row: the reduction tests on the
#      GPU, the step's profile at 8K, batch 1, one-pass against two-pass merges end to end, the benchmark
#   AV (after AU, same machine, carry .gpu/m1 .gpu/whl): the full audit beside the kernel and engine tests
#   2026-12-02, ninth session (results/2026-12-02-h200): first scripts/exp/diag9.sh (clocks and power at batch 16,
#      the one-plane lookup's upper bound, ncu on the split kernels), then scripts/exp/int8-dots.sh (int8's dots:
#      f16 / mixed / s8), both at the working tree of c00e309 (int8-dots.sh with "mixed" added); then AW and AX below
#   AW (carry .gpu/m0) int8 scores by integer dots ("mixed", now the default): the int8 write replay of a seed that
#      failed once on the GPU, then the benchmark; the model's first half stays for AX
#   AX (after AW, same machine, carry .gpu/m1 .gpu/whl): the audit of fp16 and int8 (the only mode whose numbers
#      changed) beside the kernel and engine tests
# Tenth session (2026-12-02, results/2026-12-02b-h200): scripts/exp/lazy-rescale.sh PART=1 (no carry) on the
#   working tree before the defaults changed; then AY and AZ:
#   AY (carry .gpu/m0) the lazy rescale and deferred sums as defaults: end to end against the eager softmax
#      (lazy-rescale.sh PART=2), then the benchmark; the model's first half stays for AZ
#   AZ (after AY, same machine, carry .gpu/m1 .gpu/whl): the audit of fp16, int8 and turbo3-asym (the modes
#      whose kernels changed) beside the kernel and engine tests
#   then scripts/exp/int8-b16-sweep.sh (no carry): int8's launch shapes end to end at 32K, batch 16
# Eleventh session (2026-12-02, results/2026-12-02c-h200), int8's scales as bf16:
#   BA (carry .gpu/old = b3d70d3's kvbench/, scripts/, configs/, pyproject.toml) at 63e02d6 (two bf16 planes:
#      slower), then scripts/exp/prof-ab.sh (carry .gpu/old; GPU time per kernel, new against old), then BA again
#      at daca6b9 (the scales of a token side by side)
#   BB (after BA, same machine, carry .gpu/m0) the benchmark at daca6b9
#   BC (after BB, same machine, carry .gpu/m1 .gpu/whl) the audit of fp16 and int8 beside the kernel and engine tests
#   BD (carry .gpu/old; another lease) the second reading, fp16 and int8 at 32K, new / old / new / old
# Twelfth session (2026-12-02, results/2026-12-02e-h200), the reduction's tail at 8K, batch 1:
#   scripts/exp/b1-shapes.sh (no carry): the turbo modes' batch-1 launch shapes end to end at 8K
#   scripts/exp/tail-prefetch.sh (no carry): the output GEMV's prefetch and the reduction's early release, end
#      to end at 8K and 32K, batch 1; then with ORDER="base er base er" BATCH=16 CONTEXTS=32k on the same machine
#   BE (no carry) at the commit that makes the early release the default: per-program stamps at 8K, batch 1
#      (scripts/exp/tail_stamps.py), then the benchmark
#   BF (after BE, same machine, carry .gpu/whl): the kernel, engine and PDL tests on compiled kernels (no machine
#      could be started; BG ran them instead)
#   BG (carry .gpu/whl) at the commit whose merge issues every load first, on two warps in every mode: the stamps
#      again (and fp16 on one warp), the benchmark, then the kernel, engine and PDL tests
# Fifteenth session (2026-12-02, results/2026-12-02h-h200), V's inverse rotation folded into W_o:
#   scripts/exp/fold-v.sh (carry .gpu/p0, the first third of the model: with the tree the halves no longer fit
#      in a call) at 6b3f53d: stamps, end-to-end A/B, the new tests on compiled kernels
#   BL (carry .gpu/p0 .gpu/whl) the kernel and engine tests, then the benchmark
#   BM (after BL, same machine, carry .gpu/p1), then BN (same machine, carry .gpu/p2 .gpu/whl): the audit
#   2026-12-02, sixteenth session (results/2026-12-02i-h200; commands in its README): the benchmark and ktests
#      inline at 0953ef7 (no model), then sparse V on dummy Llama-3.1-8B; then the model in two xz halves
#      (`xz -6` of the GGUF split in two, .gpu/q0 then .gpu/q1 + .gpu/whl, joined through python's lzma)
#      for sparse V on the default model, two calls on one machine
# Later sessions list their calls in each results folder's README.md; the audit of every mode at 4979c59
#   (results/2026-12-04-h200) came over as the thirds .gpu/p0, .gpu/p1 (two calls that only copy them to
#   /tmp/kvbench-model), then BN (carry .gpu/p2 .gpu/whl) and `step raw4`, all on one machine.
# On a 1-GPU machine run the steps one at a time: `bash scripts/h200.sh step NAME`.
# The tree travels without .git: pass the commit, e.g.
#   KVBENCH_GIT_COMMIT=$(git rev-parse --short=12 HEAD) bash scripts/h200.sh A
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}
M=/tmp/kvbench-model
G=$M/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $OUT $M

# the benchmark of the results: every mode side by side on dummy Llama-3.1-8B, plus the capacity search
SWEEP="--model dummy:llama-3.1-8b --modes all --no-fallback --contexts 2k,8k,32k --batch 1,16 --warmup 8 --gen 64 --repeats 3 --capacity --quiet"

# bench1 PHASE SECONDS: that benchmark on GPU 0 into $OUT/bench, logged in $OUT/PHASE-bench.log
bench1() {
  timeout $2 python3 -m kvbench decode-bench $SWEEP --devices 0 --out $OUT/bench > $OUT/$1-bench.log 2>&1
  echo "bench rc=$?"; tail -3 $OUT/$1-bench.log
}

wheels() {
  [[ -d /tmp/site ]] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
}

step() {
  local t0=$SECONDS
  echo "== $1 on GPU ${CUDA_VISIBLE_DEVICES:-all} at $(date -u +%H:%M:%S)"
  case $1 in
  bench)
    python3 -m kvbench decode-bench --model dummy:tiny --contexts 300 --batch 1,3 --gen 8 --warmup 4 --repeats 1 \
      --out /tmp/smoke --quiet || return 1
    timeout ${BENCH_TIMEOUT:-420} python3 -m kvbench decode-bench $SWEEP --out $OUT/bench ;;
  audit)
    timeout ${AUDIT_TIMEOUT:-480} python3 -m kvbench audit --model $G --modes ${AUDIT_MODES:-all} \
      --contexts 2k,8k,32k --compare-kernels --kv-cap-check 256 --prefix-reuse --niah --ppl --ppl-windows 1 \
      --ppl-chunk 1024 --out $OUT/audit --quiet ;;
  raw4)
    timeout ${RAW4_TIMEOUT:-120} python3 -m kvbench audit --model $G --modes turbo4 --no-fallback \
      --contexts 2k,8k,32k --out $OUT/audit-raw-turbo4 --quiet ;;
  ktests)
    # pytest-xdist carried in .gpu/site (copied from the local .venv; the GPU machine has none): 8 workers
    # compile the kernels in parallel, and the whole selection runs in 2-3 minutes (118-166 s on H100s,
    # results/2026-12-07*-gpu) instead of not fitting one call
    local par=()
    [[ -d .gpu/site/xdist ]] && export PYTHONPATH=$PWD/.gpu/site:$PYTHONPATH && par=(-n ${TEST_WORKERS:-8})
    KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider "${par[@]}" \
      tests/test_kernels.py tests/test_fast_decode.py tests/test_pdl.py tests/test_prefetch.py tests/test_fused_ops.py \
      tests/test_gemv.py > $OUT/gpu-kernel-tests.txt 2>&1
    tail -5 $OUT/gpu-kernel-tests.txt ;;
  peers-audit)
    timeout ${PEERS_AUDIT_TIMEOUT:-200} python3 -m kvbench audit --model $G --modes fp16,int8,turbo4-asym,hf:all \
      --contexts 2k,8k,32k --gen-tokens 32 --out $OUT/peers --quiet ;;
  peers)
    step peers-audit
    timeout ${PEERS_BENCH_TIMEOUT:-150} python3 -m kvbench decode-bench --model $G \
      --modes fp16,int8,turbo4-asym,turbo3-asym,hf:all --contexts 2k,8k,32k --batch 1 --warmup 4 --gen 32 --repeats 3 \
      --out $OUT/peers --quiet ;;
  peers8b)
    timeout ${PEERS_8B_TIMEOUT:-240} python3 -m kvbench decode-bench --model dummy:llama-3.1-8b \
      --modes fp16,int8,turbo4-asym,hf:all --contexts 2k,8k,32k --batch 1 --warmup 4 --gen 32 --repeats 3 \
      --out $OUT/peers-8b --quiet ;;
  shard1|shard2)
    local devices=0 sweep="--model dummy:llama-3.1-8b --modes fp16,int8,turbo4-asym --contexts 2k,8k,32k --batch 1,16 --warmup 4 --gen 32 --repeats 2 --quiet"
    [[ $1 == shard2 ]] && devices=0,1
    timeout ${SHARD_TIMEOUT:-250} python3 -m kvbench decode-bench $sweep --devices $devices --out $OUT/shard-${1#shard}gpu ;;
  esac
  local rc=$?
  echo "== $1 done rc=$rc in $((SECONDS - t0)) s"
}

# kernels_then_bench PHASE: at the launch defaults, GPU time per kernel and attention + append alone,
# then the benchmark (the model's first half left in $M for the phase after)
kernels_then_bench() {
  cp .gpu/m0/* $M/
  timeout ${PARTS_TIMEOUT:-100} python3 scripts/bench_kernels.py --parts --shapes 1x2048,1x32768,16x32768 \
    --append default > $OUT/parts.txt 2>&1; echo "parts rc=$?"; grep -v warn $OUT/parts.txt | tail -20
  timeout ${KERNELS_TIMEOUT:-100} python3 scripts/bench_kernels.py --no-check --append default > $OUT/kernels.txt 2>&1
  echo "kernels rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels.txt | tail -22
  bench1 $1 ${BENCH1_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench $1-bench.log parts.txt kernels.txt kernels.csv)
}

# join_model: the model's second half (carried now) joins the first (left on this machine by an earlier call)
join_model() {
  [[ -d .gpu/m1 ]] && cp .gpu/m1/* $M/
  [[ -f $M/part00 && -f $M/part01 ]] || { echo "a model half is missing: carry .gpu/m0, then .gpu/m1 on the same machine"; exit 3; }
  cat $M/part0* > $G && sha256sum $G
}

# pdl_tests: the PDL and engine tests on compiled kernels (CUDA graphs), the model's first half staged
pdl_tests() {
  cp .gpu/m0/* $M/ && wheels
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout ${PDL_TESTS_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider \
    tests/test_pdl.py tests/test_fast_decode.py > $OUT/gpu-pdl-tests.txt 2>&1; tail -3 $OUT/gpu-pdl-tests.txt
}

# bench_pdl_pair PHASE: the benchmark with PDL (the default), then with --no-pdl (no capacity search, which
# PDL does not change) into $OUT/bench-nopdl
bench_pdl_pair() {
  bench1 $1 ${BENCH1_TIMEOUT:-240}
  timeout ${NOPDL_TIMEOUT:-200} python3 -m kvbench decode-bench ${SWEEP/--capacity/} --no-pdl --devices 0 \
    --out $OUT/bench-nopdl > $OUT/$1-bench-nopdl.log 2>&1; echo "bench --no-pdl rc=$?"; tail -2 $OUT/$1-bench-nopdl.log
}

# audit_beside_tests PHASE FIRST [raw4]: the model's second half joins the first (left by phase FIRST on
# this machine), then the full audit (and raw turbo4's) runs beside the kernel and engine tests
audit_beside_tests() {
  [[ -f $M/part00 ]] || { echo "part00 missing: the machine was not the one of phase $2"; exit 3; }
  join_model && wheels
  local saved=(audit gpu-kernel-tests.txt)
  (step audit > $OUT/$1-audit.log 2>&1) & (TEST_TIMEOUT=${TEST_TIMEOUT:-300} step ktests > $OUT/$1-ktests.log 2>&1) &
  if [[ ${3:-} == raw4 ]]; then (step raw4 > $OUT/$1-raw4.log 2>&1) & saved+=(audit-raw-turbo4); fi
  wait; cat $OUT/$1-*.log | grep -v '^\s*$' | tail -16
  (cd $OUT && tar czf all.tgz "${saved[@]}" "$1"-*.log)
}

case "${1:-}" in
BL)
  cp .gpu/p0/* $M/; TEST_TIMEOUT=${TEST_TIMEOUT:-330} step ktests; bench1 BL ${BENCH1_TIMEOUT:-240}
  (cd $OUT && tar czf all.tgz bench BL-bench.log gpu-kernel-tests.txt) ;;
BM) cp .gpu/p1/* $M/ && ls -la $M ;;
BN)
  cp .gpu/p2/* $M/
  [[ -f $M/part00 && -f $M/part01 && -f $M/part02 ]] || { echo "a third of the model is missing: run BL, BM, BN on one machine"; exit 3; }
  cat $M/part0* > $G && sha256sum $G && wheels
  step audit > $OUT/BN-audit.log 2>&1; tail -4 $OUT/BN-audit.log
  (cd $OUT && tar czf all.tgz audit BN-audit.log) ;;
step) shift
  [[ $1 == audit || $1 == raw4 || $1 == peers* ]] && [[ ! -f $G ]] && join_model
  [[ $1 == ktests || $1 == peers* || $1 == audit || $1 == raw4 ]] && wheels
  [[ $1 == bench && -d .gpu/m0 ]] && cp .gpu/m0/* $M/  # an old layout of the model's parts; unused by the sweep
  step "$1" ;;
A)
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv
  cp .gpu/m0/* $M/ && wheels
  (CUDA_VISIBLE_DEVICES=0 step bench > $OUT/A-gpu0.log 2>&1) &
  (export CUDA_VISIBLE_DEVICES=1; step ktests; step peers8b) > $OUT/A-gpu1.log 2>&1 &
  wait; cat $OUT/A-gpu0.log $OUT/A-gpu1.log | grep -v '^\s*$' | tail -40 ;;
B)
  [[ -f $M/part00 ]] || { echo "part00 missing: the machine was not the one of phase A"; exit 3; }
  cp .gpu/m1/* $M/ && cat $M/part0* > $G && sha256sum $G && wheels
  (CUDA_VISIBLE_DEVICES=0 step audit > $OUT/B-gpu0.log 2>&1) &
  (export CUDA_VISIBLE_DEVICES=1; step raw4; step peers) > $OUT/B-gpu1.log 2>&1 &
  wait; cat $OUT/B-gpu0.log $OUT/B-gpu1.log | grep -v '^\s*$' | tail -40 ;;
C)
  [[ -f $G ]] || { echo "the model is missing: run C on the machine of phase B"; exit 3; }
  wheels
  (export CUDA_VISIBLE_DEVICES=1; step peers > $OUT/C-peers.log 2>&1) &
  step shard1 > $OUT/C-1gpu.log 2>&1
  wait; step shard2 > $OUT/C-2gpu.log 2>&1
  tail -n 3 $OUT/C-*.log
  (cd $OUT && tar czf all.tgz peers shard-1gpu shard-2gpu C-*.log) ;;
E)
  timeout ${E1_TIMEOUT:-270} python3 -m kvbench decode-bench $SWEEP --devices 0 --out $OUT/bench-1gpu > $OUT/E-1gpu.log 2>&1; echo "1 GPU rc=$?"
  timeout ${E2_TIMEOUT:-200} python3 -m kvbench decode-bench $SWEEP --devices 0,1 --out $OUT/bench-2gpu > $OUT/E-2gpu.log 2>&1; echo "2 GPUs rc=$?"
  timeout ${KB_TIMEOUT:-100} python3 scripts/bench_kernels.py --no-check > $OUT/kernels.txt 2>&1; echo "kernels rc=$?"
  tail -3 $OUT/E-*.log; tail -40 $OUT/kernels.txt
  (cd $OUT && tar czf all.tgz bench-1gpu bench-2gpu E-*.log kernels.*) ;;
F)  # int8 V stored token-major: attention alone (both layouts, tuned), the benchmark, kernel tests
  timeout ${KT_TIMEOUT:-170} python3 scripts/bench_kernels.py --modes fp16,int8,int8-rowmajor --tune > $OUT/kernels-int8-tune.txt 2>&1
  echo "kernels rc=$?"; grep -v "^  *top 5" $OUT/kernels-int8-tune.txt | tail -25
  bench1 F ${F_TIMEOUT:-230}
  wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-150} step ktests
  (cd $OUT && tar czf all.tgz bench kernels-int8-tune.txt F-bench.log gpu-kernel-tests.txt) ;;
G)  # prmt codebook lookup for the turbo kernels, int8 splits retuned: kernel tests, attention alone
    # (turbo modes with the prmt lookup and with the gather), the benchmark on one GPU
  wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-150} step ktests
  timeout ${KB_TIMEOUT:-150} python3 scripts/bench_kernels.py \
    --modes fp16,int8,turbo4-asym,turbo4-asym@gather,turbo3-asym,turbo3-asym@gather,turbo4,turbo4@gather,turbo4-delegated,turbo4-delegated@gather \
    > $OUT/kernels.txt 2>&1; echo "kernels rc=$?"; tail -42 $OUT/kernels.txt
  bench1 G ${G_TIMEOUT:-230}
  (cd $OUT && tar czf all.tgz bench kernels.txt kernels.csv G-bench.log gpu-kernel-tests.txt) ;;
H)  # launch sweep after the 3-bit word loads: attention alone, every quantized mode, the wide grid
  timeout ${KT_TIMEOUT:-540} python3 scripts/bench_kernels.py --tune --grid wide \
    --modes int8,turbo4-asym,turbo3-asym,turbo4,turbo4-delegated 2>&1 | tee $OUT/kernels-wide.txt | grep -v "top 5"
  echo "kernels rc=$?" ;;
I)  # the launch defaults chosen from H: kernel tests, attention alone at the defaults, the benchmark
  wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-170} step ktests
  timeout ${KB_TIMEOUT:-100} python3 scripts/bench_kernels.py --no-check > $OUT/kernels.txt 2>&1; echo "kernels rc=$?"
  grep -v "^batch\|turbo4 write" $OUT/kernels.txt | tail -24
  bench1 I ${I_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench kernels.txt kernels.csv I-bench.log gpu-kernel-tests.txt) ;;
J)  # run as L, plus the model's first half staged for D (on 2026-12-01 with the write on a side
    # stream, since reverted); the benchmark's log is J-bench.log
  cp .gpu/m0/* $M/ && wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-200} step ktests
  bench1 J ${J_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench J-bench.log gpu-kernel-tests.txt) ;;
L)  # the final code of 2026-12-01: kernel and engine tests on the GPU, the benchmark
  wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-200} step ktests
  bench1 L ${L_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench L-bench.log gpu-kernel-tests.txt) ;;
M)  # 2026-12-01, second session: int8 scales prefetched, the fresh token's write inside the reduction kernel, the
    # reduction's warps: GPU time per kernel, the previous code (a copy of 532a3bf in .gpu/old) first
  SH=1x2048,1x32768,16x32768
  timeout ${M_TIMEOUT:-150} python3 .gpu/old/scripts/bench_kernels.py --parts --shapes $SH > $OUT/parts-old.txt 2>&1
  echo "old rc=$?"
  for a in default launch; do
    timeout ${M_TIMEOUT:-150} python3 scripts/bench_kernels.py --parts --shapes $SH --append $a > $OUT/parts-$a.txt 2>&1
    echo "$a rc=$?"
  done
  for w in 1 2; do
    timeout ${M_TIMEOUT:-150} python3 scripts/bench_kernels.py --parts --shapes $SH --append default --reduce-warps $w \
      --modes int8,turbo4-asym,turbo3-asym,turbo4,turbo4-delegated > $OUT/parts-rw$w.txt 2>&1
    echo "reduce warps $w rc=$?"
  done
  grep -hv "warn" $OUT/parts-*.txt ;;
N)  # after M: int8 scales loaded as before, the fused write moved to the end of the reduction
    # (K by the group's first program, V by its last): GPU time per kernel at 4, 1 and 2 reduction
    # warps; the kernel and engine tests
  SH=1x2048,1x32768,16x32768
  for w in 4 1 2; do
    timeout ${M_TIMEOUT:-150} python3 scripts/bench_kernels.py --parts --shapes $SH --append default --reduce-warps $w \
      > $OUT/parts-rw$w.txt 2>&1
    echo "reduce warps $w rc=$?"
  done
  grep -hv "warn" $OUT/parts-*.txt
  wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-220} step ktests ;;
P)  # after N: one-warp reductions that store the fresh token themselves (the new defaults): kernel
    # and engine tests, the benchmark, attention + append alone per mode (CUDA graphs)
  wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-220} step ktests
  bench1 P ${P_TIMEOUT:-260}
  timeout ${KB_TIMEOUT:-100} python3 scripts/bench_kernels.py --no-check --append default > $OUT/kernels.txt 2>&1
  echo "kernels rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels.txt | tail -24
  (cd $OUT && tar czf all.tgz bench P-bench.log gpu-kernel-tests.txt kernels.txt kernels.csv) ;;
Q)  # after P (carry .gpu/m0 .gpu/whl): the turbo write picks its centroid in registers; the kernel
    # and engine tests, GPU time per kernel, attention + append alone per mode (CUDA graphs)
  cp .gpu/m0/* $M/ && wheels; TEST_TIMEOUT=${TEST_TIMEOUT:-220} step ktests
  timeout ${M_TIMEOUT:-150} python3 scripts/bench_kernels.py --parts --shapes 1x2048,1x32768,16x32768 \
    --append default > $OUT/parts.txt 2>&1; echo "parts rc=$?"; grep -v warn $OUT/parts.txt
  timeout ${KB_TIMEOUT:-120} python3 scripts/bench_kernels.py --no-check --append default > $OUT/kernels.txt 2>&1
  echo "kernels rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels.txt | tail -24 ;;
R)  # after Q, same machine (carry .gpu/m1 .gpu/whl): the audit and raw turbo4's side by side, then the benchmark
  [[ -f $M/part00 ]] || { echo "part00 missing: the machine was not the one of phase Q"; exit 3; }
  cp .gpu/m1/* $M/ && cat $M/part0* > $G && sha256sum $G && wheels
  (step audit > $OUT/R-audit.log 2>&1) & (step raw4 > $OUT/R-raw4.log 2>&1) &
  wait; cat $OUT/R-*.log | grep -v '^\s*$' | tail -12
  bench1 R ${R_TIMEOUT:-240}
  (cd $OUT && tar czf all.tgz audit audit-raw-turbo4 bench R-*.log) ;;
S)  # 2026-12-01, third session: chunked tile rows for fp16/int8 (no carry). Attention alone, both
    # row layouts side by side and checked against the reference; the chunked layout's launch sweep;
    # GPU time per kernel with the append, both layouts
  SH=1x2048,1x8192,1x32768,16x32768
  timeout ${S1_TIMEOUT:-170} python3 scripts/bench_kernels.py --modes fp16:plain,fp16:chunked,int8:plain,int8:chunked \
    --shapes $SH --append default > $OUT/kernels-rows.txt 2>&1; echo "kernels rc=$?"
  grep -v "^batch\|turbo4 write" $OUT/kernels-rows.txt | tail -30
  timeout ${S2_TIMEOUT:-90} python3 scripts/bench_kernels.py --parts --append default --shapes 1x2048,1x32768,16x32768 \
    --modes fp16:plain,fp16:chunked,int8:plain,int8:chunked > $OUT/parts-rows.txt 2>&1; echo "parts rc=$?"
  grep -v warn $OUT/parts-rows.txt | tail -14
  timeout ${S3_TIMEOUT:-270} python3 scripts/bench_kernels.py --no-check --tune --grid rows --append default \
    --modes int8:chunked,fp16:chunked --shapes 1x8192,1x32768,16x32768 > $OUT/kernels-rows-tune.txt 2>&1
  echo "tune rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels-rows-tune.txt | tail -24 ;;
T)  # after S: int8's chunked rows with one block-diagonal p @ V dot over the whole V tile, and the fresh
    # token stored at the start of the reduction (wfirst) vs its end: attention + append alone, per kernel
  SH=1x2048,1x8192,1x32768,16x32768
  V=fp16,fp16:wfirst,int8:plain,int8:chunked,int8:chunked+wfirst,turbo4-asym,turbo4-asym:wfirst,turbo3-asym
  V=$V,turbo3-asym:wfirst,turbo4,turbo4:wfirst,turbo4-delegated,turbo4-delegated:wfirst
  timeout ${T1_TIMEOUT:-200} python3 scripts/bench_kernels.py --modes $V --shapes $SH --append default \
    > $OUT/kernels-t.txt 2>&1; echo "kernels rc=$?"
  grep -v "^batch\|turbo4 write" $OUT/kernels-t.txt | tail -60
  timeout ${T2_TIMEOUT:-120} python3 scripts/bench_kernels.py --parts --append default --shapes 1x2048,1x32768,16x32768 \
    --modes $V > $OUT/parts-t.txt 2>&1; echo "parts rc=$?"; grep -v warn $OUT/parts-t.txt | tail -42
  timeout ${T3_TIMEOUT:-150} python3 scripts/bench_kernels.py --no-check --tune --grid rows --append default \
    --modes int8:chunked --shapes 1x32768,16x32768 > $OUT/kernels-t-tune.txt 2>&1
  echo "tune rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels-t-tune.txt | tail -12 ;;
U)  # the final code of 2026-12-01's third session (carry .gpu/m0): GPU time per kernel, attention + append
    # alone, the benchmark
  kernels_then_bench U ;;
V)  # after U, same machine (carry .gpu/m1 .gpu/whl): the audit and the kernel and engine tests side by side
  audit_beside_tests V U ;;
W)  # after V (carry .gpu/m0): the turbo write without a division per coordinate: GPU time per kernel,
    # the write and append tests on compiled kernels, the benchmark
  cp .gpu/m0/* $M/
  timeout ${W1_TIMEOUT:-100} python3 scripts/bench_kernels.py --parts --shapes 1x2048,1x32768,16x32768 \
    --append default > $OUT/parts.txt 2>&1; echo "parts rc=$?"; grep -v warn $OUT/parts.txt | tail -20
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    -k "write or append" > $OUT/gpu-write-tests.txt 2>&1; tail -2 $OUT/gpu-write-tests.txt
  bench1 W ${W_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench W-bench.log parts.txt gpu-write-tests.txt) ;;
X)  # after W, same machine (carry .gpu/m1 .gpu/whl): the audit of the turbo modes (quality and the kernel
    # check) beside the kernel and engine tests
  [[ -f $M/part00 ]] || { echo "part00 missing: the machine was not the one of phase W"; exit 3; }
  cp .gpu/m1/* $M/ && cat $M/part0* > $G && sha256sum $G && wheels
  (timeout 300 python3 -m kvbench audit --model $G --modes fp16,turbo4-asym,turbo3-asym,turbo4,turbo4-delegated \
    --contexts 2k,8k,32k --compare-kernels --kv-cap-check 256 --out $OUT/audit --quiet > $OUT/X-audit.log 2>&1; echo "audit rc=$?") &
  (TEST_TIMEOUT=300 step ktests > $OUT/X-ktests.log 2>&1) &
  wait; cat $OUT/X-*.log | grep -v '^\s*$' | tail -12
  (cd $OUT && tar czf all.tgz audit X-*.log gpu-kernel-tests.txt) ;;
Y)  # 2026-12-01, fourth session (no carry): int8 with fp16 dots of biased codes (int8:f16) beside the
    # integer dots (int8:s8): the int8 kernel tests compiled, attention + append alone, the f16 variant's
    # launch sweep, GPU time per kernel
  SH=1x2048,1x8192,1x32768,16x32768
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    -k "int8" > $OUT/gpu-int8-tests.txt 2>&1; tail -3 $OUT/gpu-int8-tests.txt
  timeout ${Y1_TIMEOUT:-120} python3 scripts/bench_kernels.py --modes fp16,int8:s8,int8:f16 --shapes $SH \
    --append default > $OUT/kernels-y.txt 2>&1; echo "kernels rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels-y.txt | tail -16
  timeout ${Y2_TIMEOUT:-60} python3 scripts/bench_kernels.py --parts --append default --shapes 1x2048,1x32768,16x32768 \
    --modes fp16,int8:s8,int8:f16 > $OUT/parts-y.txt 2>&1; echo "parts rc=$?"; grep -v warn $OUT/parts-y.txt | tail -12
  timeout ${Y3_TIMEOUT:-200} python3 scripts/bench_kernels.py --no-check --tune --append default \
    --modes int8:f16 --shapes 1x8192,1x32768,16x32768 > $OUT/kernels-y-tune.txt 2>&1
  echo "tune rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels-y-tune.txt | tail -12 ;;
Z)  # after Y (carry .gpu/m0): int8 takes the f16 dots by default: the wide launch sweep of int8, the benchmark
  cp .gpu/m0/* $M/
  timeout ${Z1_TIMEOUT:-150} python3 scripts/bench_kernels.py --no-check --tune --grid wide --append default \
    --modes int8 --shapes 1x2048,1x32768,16x32768 > $OUT/kernels-z-tune.txt 2>&1
  echo "tune rc=$?"; grep -v "^batch\|turbo4 write" $OUT/kernels-z-tune.txt | tail -14
  bench1 Z ${Z_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench Z-bench.log kernels-z-tune.txt) ;;
AA)  # after Z (no carry): reductions of 1 / 2 / 4 warps for int8 (2 and 4 merge 64 splits a pass), per kernel;
    # every mode's split count swept around its default (its own program shape), attention + append alone
  timeout ${AA1_TIMEOUT:-90} python3 scripts/bench_kernels.py --parts --append default --shapes 1x2048,1x8192,1x32768,16x32768 \
    --modes fp16,int8:rw1,int8:rw2,int8:rw4,turbo4-asym:rw1,turbo4-asym:rw2 > $OUT/parts-aa.txt 2>&1; echo "parts rc=$?"
  grep -v warn $OUT/parts-aa.txt | tail -26
  timeout ${AA2_TIMEOUT:-330} python3 scripts/bench_kernels.py --no-check --tune --grid splits --append default \
    --shapes 1x2048,1x8192,1x32768,16x8192,16x32768 > $OUT/kernels-aa-tune.txt 2>&1
  echo "tune rc=$?"; grep "top 5\|^ *[0-9]* *[0-9]* [a-z]" $OUT/kernels-aa-tune.txt | grep -v "turbo4 write" | tail -80 ;;
AB)  # after AA (carry .gpu/m0): the defaults chosen from AA (one-block splits allowed, turbo3-asym's third
    # stage at any occupancy): GPU time per kernel, attention + append alone, the benchmark
  kernels_then_bench AB ;;
AC)  # after AB, same machine (carry .gpu/m1 .gpu/whl): the full audit and raw turbo4's beside the kernel and engine tests
  audit_beside_tests AC AB raw4 ;;
AD)  # 2026-12-01, fifth session (carry .gpu/m0 .gpu/whl): programmatic dependent launch (PDL). The PDL and
    # engine tests compiled (CUDA graphs); attention + append alone without and with PDL; the benchmark with
    # PDL (the default), then without (--no-pdl; no capacity search, which PDL does not change)
  pdl_tests
  for p in off on; do
    timeout ${AD2_TIMEOUT:-70} python3 scripts/bench_kernels.py --no-check --append default --shapes 1x2048,1x8192,1x32768,16x32768 \
      $([[ $p == on ]] && echo --pdl) > $OUT/kernels-pdl-$p.txt 2>&1; echo "kernels pdl $p rc=$?"
    grep -v "^batch\|turbo4 write\|sdpa" $OUT/kernels-pdl-$p.txt | cut -c1-50 | tail -26
  done
  bench_pdl_pair AD
  (cd $OUT && tar czf all.tgz bench bench-nopdl AD-*.log gpu-pdl-tests.txt kernels-pdl-*.txt) ;;
AE)  # after AD (carry .gpu/m0 .gpu/whl): RoPE and the query rotation no longer release the split kernel early;
    # the PDL and engine tests compiled, the benchmark with PDL, then without
  pdl_tests
  bench_pdl_pair AE
  (cd $OUT && tar czf all.tgz bench bench-nopdl AE-*.log gpu-pdl-tests.txt) ;;
AH)  # after AG (no carry): batch 1 alone, PDL on / off / on / off, to see how much int8's and delegated's
    # batch-1 ratios (3-4% lower in the rerun at c7fa03f than in AE) move between runs on one lease
  B1="--model dummy:llama-3.1-8b --modes fp16,int8,turbo4-asym,turbo4-delegated --contexts 2k,8k,32k --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
  for r in on1 off1 on2 off2; do
    timeout 120 python3 -m kvbench decode-bench $B1 $([[ $r == off* ]] && echo --no-pdl) --out $OUT/b1-$r > $OUT/AH-$r.log 2>&1
    echo "$r rc=$?"
  done
  (cd $OUT && tar czf all.tgz b1-* AH-*.log) ;;
AI)  # 2026-12-01, sixth session (carry .gpu/whl .gpu/old, a copy of kvbench/ and scripts/ at the previous commit):
    # the GEMV kernel and delegated's one-accumulator split kernel: their tests on the GPU, cuBLAS against the
    # GEMV kernel (with the launch sweep), delegated's attention + append old against new
  wheels
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gemv.py \
    tests/test_fast_decode.py tests/test_pdl.py "tests/test_kernels.py::test_delegated_hot_cold_split" \
    "tests/test_kernels.py::test_delegated_decode_geometry" > $OUT/gpu-tests-ai.txt 2>&1; tail -3 $OUT/gpu-tests-ai.txt
  timeout 200 python3 scripts/bench_gemv.py --tune > $OUT/gemv.txt 2>&1; echo "gemv rc=$?"; grep -v "^ *$" $OUT/gemv.txt | tail -45
  D1="--no-check --append default --pdl --modes turbo4-delegated,turbo4-asym --shapes 1x2048,1x8192,1x32768,16x32768"
  (cd .gpu/old && PYTHONPATH=$PWD timeout 80 python3 scripts/bench_kernels.py $D1 > $OUT/kernels-old.txt 2>&1); echo "old rc=$?"
  timeout 100 python3 scripts/bench_kernels.py $D1 --tune --configs 64/2/3,128/4/2,128/4/3 > $OUT/kernels-new.txt 2>&1
  echo "new rc=$?"; grep -v "^batch\|write\|warn" $OUT/kernels-old.txt $OUT/kernels-new.txt | tail -40
  (cd $OUT && tar czf all.tgz *.txt) ;;
AJ)  # after AI (no carry): delegated's launch configs with the new kernel; batch 1 and 16 end to end with the
    # GEMV kernel (the tuned configs of AI) and with cuBLAS, one run after the other
  D1="--no-check --append default --pdl --modes turbo4-delegated,turbo4-asym --shapes 1x2048,1x8192,1x32768,16x32768"
  timeout 120 python3 scripts/bench_kernels.py $D1 --tune --configs 64/2/3,64/2/4,128/4/2,128/4/3 > $OUT/kernels-new.txt 2>&1
  echo "new rc=$?"; grep -v "^batch\|write\|warn" $OUT/kernels-new.txt | tail -24
  B2="--model dummy:llama-3.1-8b --modes fp16,int8,turbo4-asym,turbo4-delegated --contexts 2k,8k,32k --batch 1,16 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
  for g in triton cublas; do
    KVBENCH_GEMV=$g timeout 200 python3 -m kvbench decode-bench $B2 --out $OUT/b-$g > $OUT/AJ-$g.log 2>&1; echo "$g rc=$?"
  done
  (cd $OUT && tar czf all.tgz b-* AJ-*.log kernels-new.txt) ;;
AK)  # after AJ (carry .gpu/whl): the kernel, engine, PDL and GEMV tests; int8 with a 4th pipeline stage (107 KB of
    # shared memory: at most 2 programs per SM) against 3 (74 KB: 3 fit), end to end, alternating
  wheels
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 260 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    tests/test_fast_decode.py tests/test_pdl.py tests/test_gemv.py > $OUT/gpu-kernel-tests.txt 2>&1; tail -3 $OUT/gpu-kernel-tests.txt
  B3="--model dummy:llama-3.1-8b --modes fp16,int8 --contexts 2k,8k,32k --batch 1,16 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
  for v in s3a s4a s3b s4b; do
    cfg=$([[ $v == s4* ]] && echo '{"int8": {"num_stages": 4}}')
    KVBENCH_ATTN_CONFIG=$cfg timeout 100 python3 -m kvbench decode-bench $B3 --out $OUT/int8-$v > $OUT/AK-$v.log 2>&1; echo "$v rc=$?"
  done
  (cd $OUT && tar czf all.tgz int8-* AK-*.log gpu-kernel-tests.txt) ;;
AM)  # after `step bench` (carry .gpu/m0) on the same machine (carry .gpu/m1 .gpu/whl): the full audit and raw
    # turbo4's beside the GEMV and engine tests on the GPU (fp32 too: the fp32 GEMV's depth is capped since AK)
  [[ -f $M/part00 ]] || { echo "part00 missing: the machine was not the one of the bench step"; exit 3; }
  join_model && wheels
  (step audit > $OUT/AM-audit.log 2>&1) & (step raw4 > $OUT/AM-raw4.log 2>&1) &
  (KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gemv.py \
    tests/test_fast_decode.py tests/test_pdl.py > $OUT/gpu-gemv-engine-tests.txt 2>&1) &
  wait; cat $OUT/AM-*.log | grep -v '^\s*$' | tail -12; tail -3 $OUT/gpu-gemv-engine-tests.txt
  (cd $OUT && tar czf all.tgz audit audit-raw-turbo4 AM-*.log gpu-gemv-engine-tests.txt) ;;
AN)  # after AM (no carry): the benchmark again on another lease; then batch 1 with delegated on turbo4-asym's
    # program shape (128-token blocks, 4 warps, 2 stages), which was faster alone at batch 1 and slower at 16 (AJ)
  timeout ${BENCH_TIMEOUT:-240} python3 -m kvbench decode-bench $SWEEP --out $OUT/bench > $OUT/AN-bench.log 2>&1; echo "bench rc=$?"
  KVBENCH_ATTN_CONFIG='{"turbo4-delegated": {"block_n": 128, "num_warps": 4, "num_stages": 2}}' timeout 90 \
    python3 -m kvbench decode-bench --model dummy:llama-3.1-8b --modes fp16,turbo4-delegated --contexts 2k,8k,32k \
    --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --out $OUT/delegated-128-4-2 > $OUT/AN-delegated.log 2>&1
  echo "delegated rc=$?"; (cd $OUT && tar czf all.tgz bench delegated-128-4-2 AN-*.log) ;;
AP)  # (carry .gpu/m0 .gpu/whl; 2026-12-01, seventh session) delegated on turbo4-asym's program shape at batch 1 (now
    # its default there): its kernel and engine tests on the GPU, then the benchmark; the model's first half stays for AQ
  cp .gpu/m0/* $M/ && wheels
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    tests/test_fast_decode.py -k delegated > $OUT/gpu-delegated-tests.txt 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu-delegated-tests.txt
  bench1 AP ${BENCH1_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench AP-bench.log gpu-delegated-tests.txt) ;;
AQ)  # after AP, same machine (carry .gpu/m1 .gpu/whl): the full audit beside the kernel and engine tests
  audit_beside_tests AQ AP ;;
AR)  # after AQ (no carry): the benchmark again (a second reading of the same code), then GPU time per kernel at
    # batch 1, 8K, where turbo4-asym and turbo3-asym still trail fp16
  bench1 AR ${BENCH1_TIMEOUT:-260}
  timeout 100 python3 scripts/bench_kernels.py --parts --shapes 1x8192,1x32768 --append default --pdl \
    --modes fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated > $OUT/parts.txt 2>&1; echo "parts rc=$?"; tail -12 $OUT/parts.txt
  (cd $OUT && tar czf all.tgz bench AR-bench.log parts.txt) ;;
AS)  # (carry .gpu/m0) the Walsh-Hadamard transform as butterfly stages: the benchmark; the model's first half stays
  cp .gpu/m0/* $M/ && bench1 AS ${BENCH1_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench AS-bench.log) ;;
AT)  # after AS, same machine (carry .gpu/m1 .gpu/whl): the full audit beside the kernel and engine tests
  audit_beside_tests AT AS ;;
AU)  # (carry .gpu/m0 .gpu/whl; eighth session) the reductions merge up to 64 splits in one pass (2 warps past 32),
    # delegated's hot split in one row: the reduction's GPU tests, the captured step's profile, then at batch 1 the
    # one-pass merge against the two-pass one (1 warp, forced), then the benchmark; the model's first half stays for AV
  cp .gpu/m0/* $M/ && wheels
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
    -k "many_splits or delegated or reduce_warps or B1-Hkv8" > $OUT/gpu-reduce-tests.txt 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu-reduce-tests.txt
  timeout 120 python3 scripts/profile_step.py --modes fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated \
    --context 8192 --batch 1 > $OUT/profile-8k-b1.txt 2>&1; echo "profile rc=$?"
  timeout 90 python3 scripts/profile_step.py --modes fp16,int8 --context 32768 --batch 16 --steps 10 \
    > $OUT/profile-32k-b16.txt 2>&1; echo "profile b16 rc=$?"
  rw1='{"int8": {"reduce_warps": 1}, "turbo4-asym": {"reduce_warps": 1}, "turbo3-asym": {"reduce_warps": 1}, "turbo4-delegated": {"reduce_warps": 1}}'
  B4="--model dummy:llama-3.1-8b --modes fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated --contexts 8k,32k --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
  for v in one1 two1 one2; do
    KVBENCH_ATTN_CONFIG=$([[ $v == two* ]] && echo "$rw1" || echo '{}') timeout 100 python3 -m kvbench decode-bench $B4 \
      --out $OUT/merge-$v > $OUT/AU-$v.log 2>&1; echo "$v rc=$?"
  done
  bench1 AU ${BENCH1_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench merge-* AU-*.log gpu-reduce-tests.txt profile-*.txt) ;;
AV)  # after AU, same machine (carry .gpu/m1 .gpu/whl): the full audit beside the kernel and engine tests
  audit_beside_tests AV AU ;;
AW)  # (carry .gpu/m0; ninth session) int8 scores by integer dots: the write replay, then the benchmark
  cp .gpu/m0/* $M/
  KVBENCH_TEST_DEVICE=cuda timeout 60 python3 scripts/exp/int8_write_check.py 2870484150 20 > $OUT/int8-write-check.txt 2>&1
  echo "write check rc=$?"; grep -c ": ok" $OUT/int8-write-check.txt; grep -v ": ok" $OUT/int8-write-check.txt | tail -12
  bench1 AW ${BENCH1_TIMEOUT:-300}
  (cd $OUT && tar czf all.tgz bench AW-bench.log int8-write-check.txt) ;;
AX)  # after AW, same machine (carry .gpu/m1 .gpu/whl): the fp16 and int8 audit beside the kernel and engine tests
  AUDIT_MODES=fp16,int8 AUDIT_TIMEOUT=360 audit_beside_tests AX AW ;;
AY)  # (carry .gpu/m0; tenth session) the online softmax's lazy rescale and deferred sums as the new defaults
    # (fp16, int8, turbo3-asym): end to end against the old eager softmax, then the benchmark
  cp .gpu/m0/* $M/
  PART=2 timeout ${AY1_TIMEOUT:-360} bash scripts/exp/lazy-rescale.sh
  bench1 AY ${BENCH1_TIMEOUT:-220}
  (cd $OUT && tar czf all.tgz bench AY-bench.log lazy-rescale-2.tgz) ;;
AZ)  # after AY, same machine (carry .gpu/m1 .gpu/whl): the audit of the modes whose kernels changed beside the
    # kernel and engine tests
  AUDIT_MODES=fp16,int8,turbo3-asym AUDIT_TIMEOUT=360 audit_beside_tests AZ AY ;;
BA)  # (carry .gpu/old; eleventh session) int8's scales as bf16: old (.gpu/old, float32 scales) against new end to
    # end, attention alone and the clock probe (scripts/exp/bf16-scales.sh). The tree (17 MB of it results) and
    # a model half no longer fit one call's 64 MiB beside .gpu/old, so the model comes in BB and BC
  timeout ${BA_TIMEOUT:-560} bash scripts/exp/bf16-scales.sh ;;
BB)  # after BA, same machine (carry .gpu/m0): the benchmark; the model's first half staged for BC
  cp .gpu/m0/* $M/
  bench1 BB ${BENCH1_TIMEOUT:-220}
  (cd $OUT && tar czf all.tgz bench BB-bench.log) ;;
BC)  # after BB, same machine (carry .gpu/m1 .gpu/whl): the fp16 and int8 audit beside the kernel, engine and PDL tests
  AUDIT_MODES=fp16,int8 AUDIT_TIMEOUT=360 audit_beside_tests BC BB ;;
BD)  # (carry .gpu/old; another lease) a second reading: fp16 and int8 at 32K, new / old / new / old
  ORDER="N O N O" CONTEXTS=32k ONLY_E2E=1 timeout 300 bash scripts/exp/bf16-scales.sh ;;
BE)  # (no carry; twelfth session) per-program global-timer stamps at 8K (and 32K), batch 1, then the benchmark
  timeout 200 python3 scripts/exp/tail_stamps.py --context 8192 --batch 1 > $OUT/stamps-8k-b1.txt 2>&1
  echo "stamps rc=$? t=$SECONDS"; cat $OUT/stamps-8k-b1.txt
  timeout 100 python3 scripts/exp/tail_stamps.py --context 32768 --batch 1 --modes fp16,turbo4-asym,int8 \
    > $OUT/stamps-32k-b1.txt 2>&1; echo "stamps rc=$? t=$SECONDS"; cat $OUT/stamps-32k-b1.txt
  bench1 BE ${BENCH1_TIMEOUT:-260}
  (cd $OUT && tar czf all.tgz bench BE-bench.log stamps-*.txt) ;;
BG)  # (carry .gpu/whl; twelfth session) the merge's loads first, two warps: stamps, benchmark, tests
  timeout 120 python3 scripts/exp/tail_stamps.py --context 8192 --batch 1 > $OUT/stamps-8k-b1.txt 2>&1
  echo "stamps rc=$? t=$SECONDS"; cat $OUT/stamps-8k-b1.txt
  KVBENCH_ATTN_CONFIG='{"fp16": {"reduce_warps": 1}}' timeout 60 python3 scripts/exp/tail_stamps.py --context 8192 \
    --batch 1 --modes fp16 > $OUT/stamps-8k-b1-fp16-1warp.txt 2>&1; echo "stamps rc=$? t=$SECONDS"
  cat $OUT/stamps-8k-b1-fp16-1warp.txt
  timeout 80 python3 scripts/exp/tail_stamps.py --context 32768 --batch 1 --modes fp16,turbo4-asym,int8 \
    > $OUT/stamps-32k-b1.txt 2>&1; echo "stamps rc=$? t=$SECONDS"; cat $OUT/stamps-32k-b1.txt
  bench1 BG ${BENCH1_TIMEOUT:-200}
  (cd $OUT && tar czf all.tgz bench BG-bench.log stamps-*.txt)
  wheels && TEST_TIMEOUT=$((560 - SECONDS)) step ktests ;;
BH)  # (carry .gpu/whl; thirteenth session) the benchmark at the final commit, then the GPU tests
  bench1 BH ${BENCH1_TIMEOUT:-240}
  (cd $OUT && tar czf all.tgz bench BH-bench.log)
  wheels && TEST_TIMEOUT=$((570 - SECONDS)) step ktests ;;
BI)  # (no carry; fourteenth session) fp16 at batch 16 with merge_cols 32 against whole rows, then the benchmark
  STAMPS= BUDGET_S=150 RUNS="off:8k,32k:16:fp16 f32:8k,32k:16:fp16 off:8k,32k:16:fp16 f32:8k,32k:16:fp16" \
    bash scripts/exp/merge-cols.sh
  bench1 BI ${BENCH1_TIMEOUT:-300}
  (cd $OUT && tar czf all.tgz bench BI-bench.log) ;;
BK)  # (carry .gpu/whl; after BI/BJ showed the reduction's runtime branch) fp16 at batch 1, whole rows against
  # merge_cols 32, alternating; the benchmark; the PDL tests and the append tests as time allows
  STAMPS= BUDGET_S=110 RUNS="rows:2k,8k,32k:1:fp16 off:2k,8k,32k:1:fp16 rows:2k,8k,32k:1:fp16 off:2k,8k,32k:1:fp16" \
    bash scripts/exp/merge-cols.sh
  bench1 BK ${BENCH1_TIMEOUT:-240}
  (cd $OUT && tar czf all.tgz bench BK-bench.log)
  wheels && KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout $((${TESTS_UNTIL:-390} - SECONDS)) python3 -m pytest -q \
    -p no:cacheprovider tests/test_pdl.py tests/test_kernels.py -k "pdl or append_stores or merge_columns" \
    > $OUT/gpu-kernel-tests.txt 2>&1; echo "tests rc=$?"; tail -4 $OUT/gpu-kernel-tests.txt ;;
BJ)  # (carry .gpu/whl) the GPU tests
  wheels && TEST_TIMEOUT=$((570 - SECONDS)) step ktests ;;
BF)  # after BE, same machine (carry .gpu/whl): the kernel, engine and PDL tests on compiled kernels
  wheels && TEST_TIMEOUT=${TEST_TIMEOUT:-330} step ktests ;;
AF)  # after AE (carry .gpu/m0): the model's first half staged for AG
  nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; cp .gpu/m0/* $M/ && ls $M ;;
AG)  # after AF, same machine (carry .gpu/m1 .gpu/whl): the full audit and raw turbo4's beside the kernel, engine and PDL tests
  audit_beside_tests AG AF raw4 ;;
CQ)  # (carry .gpu/qN, one call each for N = 0, 1, 2, back to back on one machine) a quarter of the model:
    # the tracked tree (~34 MB by 2026-12-06) leaves a call room for a quarter of the GGUF, not a half.
    # KTESTS=1 (carry .gpu/whl .gpu/site too): then every GPU test file (`step ktests`)
  cp .gpu/q*/* $M/ && ls -la $M
  if [[ ${KTESTS:-0} == 1 ]]; then wheels && TEST_TIMEOUT=${TEST_TIMEOUT:-420} step ktests; fi ;;
CR)  # after three CQ calls (carry .gpu/q3 .gpu/whl): the full audit and raw turbo4's side by side
  cp .gpu/q3/* $M/
  [[ $(ls $M/part0* 2>/dev/null | wc -l) == 4 ]] || { echo "a quarter of the model is missing: run CQ three times first"; exit 3; }
  join_model && wheels
  (step audit > $OUT/CR-audit.log 2>&1) & (step raw4 > $OUT/CR-raw4.log 2>&1) &
  wait; cat $OUT/CR-*.log | grep -v '^\s*$' | tail -12
  (cd $OUT && tar czf all.tgz audit audit-raw-turbo4 CR-*.log) ;;
K)
  cp .gpu/m0/* $M/ && wheels && step ktests ;;
D)
  [[ -f $M/part00 ]] || { echo "part00 missing: the machine was not the one of phase K"; exit 3; }
  cp .gpu/m1/* $M/ && cat $M/part0* > $G && sha256sum $G && wheels
  (step audit > $OUT/D-audit.log 2>&1) & (step raw4 > $OUT/D-raw4.log 2>&1) & (step peers-audit > $OUT/D-peers.log 2>&1) &
  wait; cat $OUT/D-*.log | grep -v '^\s*$' | tail -30
  (cd $OUT && tar czf all.tgz audit audit-raw-turbo4 peers D-*.log) ;;
*) echo "usage: scripts/h200.sh A|B|C|E|K|D|F|G|H|I|J|L|M|N|P|Q|R|S|T|U|V|W|X|Y|Z|AA|AB|AC|AD|AE|AF|AG|AH|AI|AJ|AK|AM|AN|AP|AQ|AR|AS|AT|AU|AV|AW|AX|AY|AZ|BA|BB|BC|BD|BE|BF|BG|CQ|CR|step NAME"; exit 2 ;;
esac
rc=$?  # the phase's own status (the listing below used to replace it)
[[ -n $(ls -A $OUT) ]] && ls -la $OUT/*
exit $rc
