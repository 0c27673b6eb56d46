#!/usr/bin/env bash
# Twenty-seventh session: the compiled kernels at the split counts `wave` gives (batch 8 at 32K: 33 splits for
# turbo4 and turbo3-asym's long shape), and the long shape's tests, on the GPU (KVBENCH_TEST_DEVICE=cuda).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p $OUT/wave-tests
KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout ${T:-400} python3 -m pytest -q -p no:cacheprovider \
  tests/test_kernels.py -k "B8-Hkv8 or long_shape or L20001 or choose_num_splits" > $OUT/wave-tests/tests.txt 2>&1
echo "tests rc=$? t=$SECONDS"; tail -5 $OUT/wave-tests/tests.txt
