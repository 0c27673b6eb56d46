"""The decode projections' GEMV kernel (kvbench.kernels.gemv) against float64 matmul.

Under TRITON_INTERPRET=1 on the CPU machine (fp16 and fp32: the interpreter computes
bf16 wrongly), with `KVBENCH_TEST_DEVICE=cuda` on a GPU (bf16 too). Fresh seeds, sizes
that are not multiples of the blocks, outputs poisoned with NaN before the call.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1" if os.environ.get("KVBENCH_TEST_DEVICE", "cpu") == "cpu" else "0")

import random

import pytest
import torch
import torch.nn.functional as F

from kvbench.kernels import gemv
from kvbench.kernels.gemv import MAX_ROWS, SHARED_BUDGET, gemv_config, linear

DEVICE = torch.device(os.environ.get("KVBENCH_TEST_DEVICE", "cpu"))
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])
# fresh each session, the same in every pytest-xdist worker (conftest.py sets the session's seed)
_rng = random.Random(os.environ.get("KVBENCH_TEST_RUN_SEED"))
SEEDS = [_rng.randrange(2**31) for _ in range(3)]


@pytest.fixture(autouse=True)
def _kernel_in_the_interpreter(monkeypatch):
    monkeypatch.setenv("KVBENCH_GEMV", "triton")


def reference(x, w, b):
    y = F.linear(x.double(), w.double(), None if b is None else b.double())
    return y


def tolerance(dtype, k):
    # 16-bit output rounding plus fp32 accumulation over k terms
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype] * (1 + k / 4096)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "rows,n,k,bias",
    [(1, 37, 300, False), (3, 100, 256, True), (16, 65, 1000, True), (7, 16, 64, False), (1, 200, 513, True)],
)
def test_linear_matches_float64(seed, dtype, rows, n, k, bias):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 1, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, dtype)
    b = torch.randn(n, generator=g).to(DEVICE, dtype) if bias else None
    out = torch.full((rows, 1, n), float("nan"), dtype=dtype, device=DEVICE)
    y = linear(x, w, b, out=out)
    assert y.data_ptr() == out.data_ptr() and y.shape == (rows, 1, n)
    assert not torch.isnan(y).any(), f"seed {seed}: outputs left unwritten"
    want = reference(x, w, b)
    err = ((y.double() - want).abs() / (want.abs() + 1)).max().item()
    assert err < tolerance(dtype, k), f"seed {seed}: max error {err:.2e}"


@pytest.mark.parametrize("knobs", [{"BLOCK_N": 32, "BLOCK_K": 64}, {"BLOCK_N": 16, "BLOCK_K": 512, "num_stages": 2}])
def test_linear_launch_knobs(knobs):
    """Other block shapes give the same result (ragged K and N under both)."""
    x = torch.randn(5, 777, device=DEVICE, dtype=torch.float16)
    w = torch.randn(90, 777, device=DEVICE, dtype=torch.float16) / 28
    err = (linear(x, w, **knobs).double() - reference(x, w, None)).abs().max().item()
    assert err < 2e-2


def test_linear_falls_back_where_it_does_not_apply(monkeypatch):
    """More rows than the kernel takes, a transposed weight, mixed dtypes and KVBENCH_GEMV=cublas
    all go to F.linear, with the same results."""
    calls = []
    monkeypatch.setattr(gemv, "_gemv_kernel", _Spy(gemv._gemv_kernel, calls))
    w = torch.randn(24, 40, device=DEVICE, dtype=torch.float32)
    for x, weight in [
        (torch.randn(MAX_ROWS + 1, 40, device=DEVICE), w),
        (torch.randn(2, 40, device=DEVICE), torch.randn(40, 24, device=DEVICE).t()),
        (torch.randn(2, 40, device=DEVICE, dtype=torch.float16), w),
    ]:
        if x.dtype != weight.dtype:
            with pytest.raises(RuntimeError):
                linear(x, weight)
            continue
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight))
    assert calls == []
    monkeypatch.setenv("KVBENCH_GEMV", "cublas")
    linear(torch.randn(2, 40, device=DEVICE), w)
    assert calls == []
    monkeypatch.setenv("KVBENCH_GEMV", "triton")
    linear(torch.randn(2, 40, device=DEVICE), w)
    assert len(calls) == 1


def test_linear_rejects_a_wrong_out_buffer():
    x = torch.randn(2, 64, device=DEVICE, dtype=torch.float16)
    w = torch.randn(32, 64, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="out"):
        linear(x, w, out=torch.empty(2, 31, device=DEVICE, dtype=torch.float16))


def test_gemv_config_fits_shared_memory():
    """The pipelined weight and x tiles of every Llama-3.1-8B projection stay within the
    budget in 16-bit and in fp32 (on the H200, fp32 at the 16-bit depth asked for 240 KB)."""
    for n, k in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (576, 576)]:
        for elem in (2, 4):
            c = gemv_config(n, k, torch.device("cpu"), elem)
            assert (c["BLOCK_N"] + MAX_ROWS) * c["BLOCK_K"] * elem * c["num_stages"] <= SHARED_BUDGET, (n, k, elem)


class _Spy:
    """Counts launches of a Triton kernel (kernel[grid](...))."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(grid)
        return self.kernel[grid]
