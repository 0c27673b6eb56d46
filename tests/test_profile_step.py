"""scripts/profile_step.py's bookkeeping (the profile itself needs a CUDA GPU)."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "profile_step.py"


@pytest.fixture(scope="module")
def prof():
    spec = importlib.util.spec_from_file_location("profile_step", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_union_counts_overlap_once(prof):
    # PDL overlaps kernels: [0, 10) and [5, 12) are busy 12 us, not 17; [3, 4) lies inside
    assert prof.union_us([(5.0, 12.0), (0.0, 10.0), (3.0, 4.0)]) == 12.0
    assert prof.union_us([(0.0, 1.0), (2.0, 4.0)]) == 3.0  # a 1 us gap is not busy
    assert prof.union_us([]) == 0.0


def test_kernel_families(prof):
    assert prof.family("_decode_split_kernel") == "attn split"
    assert prof.family("_decode_reduce_kernel") == "attn reduce"
    assert prof.family("_gemv_kernel") == "gemv"
    assert prof.family("_rmsnorm_kernel") == "rmsnorm"
    long = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    assert prof.family(long) == long[:48]  # unknown kernels keep their own (shortened) name
