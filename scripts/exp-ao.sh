# phase AO (2026-12-01, seventh session): 4-bit V codes token-major, decoded in the dot's layout
export PYTHONPATH=$PWD
M="turbo4-asym,turbo4-asym-rowmajor,turbo4,turbo4-rowmajor,fp16"
S=1x2048,1x8192,1x32768,16x32768
timeout 200 python scripts/bench_kernels.py --pdl --append default --modes $M --shapes $S > $OUT/kernels-a.txt 2>&1
echo "a rc=$?"; grep -v "^batch\|write\|^\s*$" $OUT/kernels-a.txt | tail -34
KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_kernels.py -k "decode or write or turbo" > $OUT/gpu-kernel-tests.txt 2>&1; echo "tests rc=$?"; tail -4 $OUT/gpu-kernel-tests.txt
M2="turbo4-rowmajor,turbo4,turbo4-asym-rowmajor,turbo4-asym"
timeout 150 python scripts/bench_kernels.py --no-check --pdl --append default --modes $M2 --shapes $S > $OUT/kernels-b.txt 2>&1
echo "b rc=$?"; grep -v "^batch\|write\|^\s*$" $OUT/kernels-b.txt | tail -22
