"""Fused decode kernels (kvbench.kernels.fused_ops) against their PyTorch references.

Runs the Triton kernels under the interpreter on CPU (fp16 and fp32: the
interpreter's bf16 is wrong). On a GPU machine, `KVBENCH_TEST_DEVICE=cuda
TRITON_INTERPRET=0 pytest tests/test_fused_ops.py` runs the same tests on
compiled kernels and CUDA tensors, bf16 included (the two CPU-path tests skip).
Each test draws a fresh seed (printed on failure; set KVBENCH_TEST_SEED to replay
one). Outputs are poisoned with NaN first so an element the kernel never writes
fails the comparison.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1" if os.environ.get("KVBENCH_TEST_DEVICE", "cpu") == "cpu" else "0")

import pytest
import torch

from kvbench.engine.rope import _rotate_half, rope_cos_sin
from kvbench.kernels import fused_ops as fo
from kvbench.kernels import fused_ops_reference as ref

DEVICE = os.environ.get("KVBENCH_TEST_DEVICE", "cpu")
GPU = DEVICE != "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if GPU else [])
# The kernels round where eager PyTorch rounds, so fp16 agrees to the last bit
# except where an fp32 reduction order or rsqrt flips a rounding: one ulp, rarely.
TOL = {torch.float16: dict(atol=1e-3, rtol=2e-3), torch.float32: dict(atol=1e-5, rtol=1e-5)}
TOL[torch.bfloat16] = dict(atol=1e-2, rtol=1.6e-2)
MAX_MISMATCH = {torch.float16: 0.01, torch.float32: 1.0, torch.bfloat16: 0.02}


pytestmark = pytest.mark.usefixtures("on_test_device")  # per test: set at import, it leaked into other files


def _gen() -> tuple[torch.Generator, int]:
    seed = int(os.environ.get("KVBENCH_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    return torch.Generator().manual_seed(seed), seed


def _randn(g, *shape, dtype, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cpu") * scale).to(DEVICE, dtype)


def _randint(g, hi):
    return int(torch.randint(0, hi, (1,), generator=g, device="cpu"))


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def _close(got, exp, dtype, seed, what="", scale=None):
    """`scale`: per element, the size of the terms that sum to it where that sum cancels (RoPE's x cos + x' sin):
    a one-ulp flip in a term is then measured against the terms, not against the smaller result."""
    msg = f"{what} seed={seed}"
    assert got.shape == exp.shape, msg
    assert not torch.isnan(got).any(), f"unwritten (NaN) elements: {msg}"
    if scale is None:
        torch.testing.assert_close(got, exp, **TOL[dtype], msg=lambda m: f"{m}\n{msg}")
    else:
        off = (got.float() - exp.float()).abs()
        allowed = TOL[dtype]["atol"] + TOL[dtype]["rtol"] * torch.maximum(exp.float().abs(), scale.float())
        excess = (off - allowed).flatten()
        assert (excess <= 0).all(), (
            f"{int((excess > 0).sum())} elements off by more than their terms' rounding allows "
            f"(worst {off.flatten()[excess.argmax()]:.3g} against {allowed.flatten()[excess.argmax()]:.3g}): {msg}"
        )
    frac = (got != exp).float().mean().item()
    assert frac <= MAX_MISMATCH[dtype], f"{frac:.3%} of elements differ at all (rounding order?): {msg}"


# ---------------------------------------------------------------------------
# rmsnorm
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "residual"),
    [((3, 1, 576), True), ((5, 100), False), ((2, 1, 4096), True), ((7, 1, 4096), False), ((64, 1, 8192), True)],
)
def test_rmsnorm(dtype, shape, residual):
    g, seed = _gen()
    n = shape[-1]
    x = _randn(g, *shape, dtype=dtype, scale=3.0)
    w = _randn(g, n, dtype=dtype, scale=0.5) + 1
    eps = 1e-5
    if not residual:
        out = _nan(*shape, dtype=dtype)
        y = fo.rmsnorm(x, w, eps, out=out)
        assert y is out
        _close(y, ref.rmsnorm_reference(x, w, eps), dtype, seed)
        _close(fo.rmsnorm(x, w, eps), ref.rmsnorm_reference(x, w, eps), dtype, seed, "fresh out")
        return
    r = _randn(g, *shape, dtype=dtype, scale=3.0)
    exp_y, exp_h = ref.rmsnorm_reference(x, w, eps, r)
    out, h_out = _nan(*shape, dtype=dtype), _nan(*shape, dtype=dtype)
    y, h = fo.rmsnorm(x, w, eps, residual=r, out=out, residual_out=h_out)
    assert y is out and h is h_out
    _close(h, exp_h, dtype, seed, "residual sum")
    assert torch.equal(h, exp_h), f"x + residual must round like torch, seed={seed}"
    _close(y, exp_y, dtype, seed, "norm")
    # Fresh outputs; and in place: the sum written back into the residual buffer.
    y2, h2 = fo.rmsnorm(x, w, eps, residual=r)
    _close(y2, exp_y, dtype, seed, "fresh")
    _close(h2, exp_h, dtype, seed, "fresh h")
    r_inplace = r.clone()
    y3, h3 = fo.rmsnorm(x, w, eps, residual=r_inplace, residual_out=r_inplace)
    assert h3 is r_inplace
    _close(r_inplace, exp_h, dtype, seed, "in place h")
    _close(y3, exp_y, dtype, seed, "in place y")


def test_rmsnorm_strided_rows():
    """A row slice (x[:, -1:] of a prefill) is read through its stride, no copy."""
    g, seed = _gen()
    big = _randn(g, 4, 3, 200, dtype=torch.float16)
    x = big[:, -1:]
    w = _randn(g, 200, dtype=torch.float16) + 1
    out = _nan(4, 1, 200, dtype=torch.float16)
    fo.rmsnorm(x, w, 1e-6, out=out)
    _close(out, ref.rmsnorm_reference(x, w, 1e-6), torch.float16, seed)
    # Non-unit last stride: copied, still right.
    xt = big.transpose(1, 2)[:, :7, :]  # [4, 7, 3], stride(-1) != 1
    w3 = _randn(g, 3, dtype=torch.float16) + 1
    _close(fo.rmsnorm(xt, w3, 1e-6), ref.rmsnorm_reference(xt, w3, 1e-6), torch.float16, seed, "transposed")


# ---------------------------------------------------------------------------
# rope_qk
# ---------------------------------------------------------------------------


def _rope_inputs(g, b, t, hq, hk, d, dtype, pos0=5):
    qkv = _randn(g, b, t, (hq + 2 * hk) * d, dtype=dtype, scale=2.0)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_cos_sin(inv_freq, 1.0, torch.arange(pos0, pos0 + t), dtype)
    return qkv, cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("b", "t", "hq", "hk", "d", "qk_norm"),
    [
        (3, 1, 9, 3, 64, False),  # SmolLM2-135M-like
        (2, 1, 32, 8, 128, False),  # Llama-3.1-8B
        (16, 1, 32, 8, 128, False),  # Llama-3.1-8B, B = 16
        (2, 1, 16, 8, 128, True),  # Qwen3
        (2, 3, 9, 3, 64, True),  # T > 1
        (1, 2, 5, 1, 80, False),  # head_dim not a power of two
    ],
)
def test_rope_qk(dtype, b, t, hq, hk, d, qk_norm):
    """With a q/k norm, an fp32 reduction order or rsqrt may flip one rounding of a normed element; RoPE's
    x cos + x' sin then carries that ulp of x into a result that may have cancelled to far less than x, so q
    and k are measured against their terms' size (seed 1748354912: 0.00195 off at 0.328, from terms of 1.44
    and 1.11)."""
    g, seed = _gen()
    qkv, cos, sin = _rope_inputs(g, b, t, hq, hk, d, dtype, pos0=_randint(g, 4000))
    qn = kn = None
    if qk_norm:
        qn = _randn(g, d, dtype=dtype, scale=0.3) + 1
        kn = _randn(g, d, dtype=dtype, scale=0.3) + 1
    exp = ref.rope_qk_reference(qkv, cos, sin, hq, hk, d, qn, kn, eps=1e-6)
    normed = ref.rope_qk_reference(qkv, torch.ones_like(cos), torch.zeros_like(sin), hq, hk, d, qn, kn, eps=1e-6)
    terms = [x.abs() * cos.abs() + _rotate_half(x).abs() * sin.abs() for x in normed[:2]]
    terms.append(None)  # v: a copy
    out = (_nan(b, hq, t, d, dtype=dtype), _nan(b, hk, t, d, dtype=dtype), _nan(b, hk, t, d, dtype=dtype))
    got = fo.rope_qk(qkv, cos, sin, hq, hk, d, q_norm=qn, k_norm=kn, eps=1e-6, out=out)
    assert all(o is r for o, r in zip(got, out, strict=True))
    for name, gt, ex, scale in zip("qkv", got, exp, terms, strict=True):
        _close(gt, ex, dtype, seed, name, scale)
    assert torch.equal(got[2], exp[2]), "v is a plain copy"
    fresh = fo.rope_qk(qkv, cos, sin, hq, hk, d, q_norm=qn, k_norm=kn, eps=1e-6)
    for name, gt, ex, scale in zip("qkv", fresh, exp, terms, strict=True):
        assert gt.is_contiguous()
        _close(gt, ex, dtype, seed, f"fresh {name}", scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("b", "hq", "hk", "d"), [(2, 32, 8, 128), (3, 9, 3, 64), (1, 5, 1, 16)])
def test_rope_qk_rotates_the_query(dtype, b, hq, hk, d):
    """`q_rot`: RoPE's kernel also writes s2 * H(s1 * q) in float32 for a turbo K, bit for bit what
    the rotation launch (`quantize.rotate`) makes of the stored q, for every q head (poisoned
    buffer; heads not a multiple of the program's), and close to the matrix reference."""
    from kvbench.kernels.quantize import rotate
    from kvbench.kernels.reference import random_signs
    from kvbench.kernels.reference import rotate as rotate_reference

    g, seed = _gen()
    qkv, cos, sin = _rope_inputs(g, b, 1, hq, hk, d, dtype, pos0=_randint(g, 4000))
    s1, s2 = random_signs(d, seed % 1000, DEVICE), random_signs(d, seed % 1000 + 1, DEVICE)
    qr = _nan(b, hq, d, dtype=torch.float32)
    q, k, v = fo.rope_qk(qkv, cos, sin, hq, hk, d, q_rot=(qr, s1, s2))
    exp = ref.rope_qk_reference(qkv, cos, sin, hq, hk, d)
    for name, gt, ex in zip("qkv", (q, k, v), exp, strict=True):
        _close(gt, ex, dtype, seed, name)
    want = rotate(q[:, :, 0], s1, s2)
    assert not qr.isnan().any(), f"seed {seed}: unwritten rows"
    assert torch.equal(qr, want), f"seed {seed}: {(qr - want).abs().max():.3g} from the rotation launch"
    torch.testing.assert_close(qr, rotate_reference(q[:, :, 0], s1, s2), atol=1e-5, rtol=1e-5)


def test_rope_qk_rotation_checked(monkeypatch):
    qkv = torch.zeros(1, 2, 4 * 16)
    cos = sin = torch.zeros(2, 16)
    s = torch.ones(16)
    with pytest.raises(ValueError, match="one token"):
        fo.rope_qk(qkv, cos, sin, 2, 1, 16, q_rot=(torch.zeros(1, 2, 16), s, s))
    with pytest.raises(ValueError, match="power-of-two"):
        fo.rope_qk(torch.zeros(1, 1, 4 * 24), torch.zeros(1, 24), torch.zeros(1, 24), 2, 1, 24,
                   q_rot=(torch.zeros(1, 2, 24), torch.ones(24), torch.ones(24)))  # fmt: skip
    with pytest.raises(ValueError, match="q_rot"):
        fo.rope_qk(qkv[:, :1], cos[:1], sin[:1], 2, 1, 16, q_rot=(torch.zeros(1, 2, 16, dtype=torch.float16), s, s))
    if GPU:  # the rest is the CPU path's
        return
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the PyTorch fallback rotates too
    x = torch.randn(1, 1, 4 * 16)
    qr = torch.full((1, 2, 16), float("nan"))
    q, _, _ = fo.rope_qk(x, cos[:1], sin[:1], 2, 1, 16, q_rot=(qr, s, -s))
    from kvbench.kernels.reference import rotate as rotate_reference

    torch.testing.assert_close(qr, rotate_reference(q[:, :, 0], s, -s))


def test_rope_qk_only_one_norm():
    g, seed = _gen()
    qkv, cos, sin = _rope_inputs(g, 2, 1, 6, 2, 64, torch.float32)
    kn = _randn(g, 64, dtype=torch.float32) + 1
    exp = ref.rope_qk_reference(qkv, cos, sin, 6, 2, 64, None, kn, eps=1e-5)
    got = fo.rope_qk(qkv, cos, sin, 6, 2, 64, k_norm=kn, eps=1e-5)
    for name, gt, ex in zip("qkv", got, exp, strict=True):
        _close(gt, ex, torch.float32, seed, name)


def test_rope_qk_into_cache_slice_strided_input_per_batch_positions():
    """2-D qkv read through a row stride, per-sequence cos/sin [B, 1, D], and
    k/v written straight into a slot of a [B, Hkv, Tmax, D] cache, leaving the
    rest of the cache untouched."""
    g, seed = _gen()
    b, hq, hk, d, tmax, slot = 3, 9, 3, 64, 6, 4
    dtype = torch.float16
    n = (hq + 2 * hk) * d
    big = _randn(g, b, n + 64, dtype=dtype)
    qkv = big[:, :n]  # [B, N], row stride N + 64
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    pos = torch.tensor([3, 100, 2047])
    cs = [rope_cos_sin(inv_freq, 1.0, p[None], dtype) for p in pos]
    cos = torch.stack([c for c, _ in cs])  # [B, 1, D]
    sin = torch.stack([s for _, s in cs])
    kc, vc = _nan(b, hk, tmax, d, dtype=dtype), _nan(b, hk, tmax, d, dtype=dtype)
    q = _nan(b, hq, 1, d, dtype=dtype)
    fo.rope_qk(qkv, cos, sin, hq, hk, d, out=(q, kc[:, :, slot : slot + 1], vc[:, :, slot : slot + 1]))
    eq, ek, ev = ref.rope_qk_reference(qkv, cos, sin, hq, hk, d)
    _close(q, eq, dtype, seed, "q")
    _close(kc[:, :, slot : slot + 1], ek, dtype, seed, "k")
    _close(vc[:, :, slot : slot + 1], ev, dtype, seed, "v")
    others = [i for i in range(tmax) if i != slot]
    assert torch.isnan(kc[:, :, others]).all() and torch.isnan(vc[:, :, others]).all(), "wrote outside the slot"


# ---------------------------------------------------------------------------
# silu_mul
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1, 2 * 1536), (5, 2 * 100), (16, 1, 2 * 14336), (1, 2 * 4097)])
def test_silu_mul(dtype, shape):
    g, seed = _gen()
    x = _randn(g, *shape, dtype=dtype, scale=4.0)
    exp = ref.silu_mul_reference(x)
    out = _nan(*exp.shape, dtype=dtype)
    got = fo.silu_mul(x, out=out)
    assert got is out
    _close(got, exp, dtype, seed)
    _close(fo.silu_mul(x), exp, dtype, seed, "fresh")


def test_silu_mul_strided_and_extremes():
    g, seed = _gen()
    big = _randn(g, 4, 3, 2 * 300, dtype=torch.float16, scale=4.0)
    x = big[:, -1:]
    x[0, 0, :6] = torch.tensor([-80.0, 80.0, 0.0, -0.0, 1e-4, -20.0], dtype=torch.float16)
    _close(fo.silu_mul(x), ref.silu_mul_reference(x), torch.float16, seed)


# ---------------------------------------------------------------------------
# launcher contracts
# ---------------------------------------------------------------------------


@pytest.mark.skipif(GPU, reason="the CPU path")
def test_cpu_fallback_without_interpreter(monkeypatch):
    """Off CUDA and without the interpreter the launchers take the reference."""
    g, _ = _gen()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = _randn(g, 2, 1, 64, dtype=torch.float32)
    w = _randn(g, 64, dtype=torch.float32)
    out = _nan(2, 1, 64, dtype=torch.float32)
    assert fo.rmsnorm(x, w, 1e-6, out=out) is out
    torch.testing.assert_close(out, ref.rmsnorm_reference(x, w, 1e-6))
    _, h = fo.rmsnorm(x, w, 1e-6, residual=x)
    torch.testing.assert_close(h, x + x)
    qkv, cos, sin = _rope_inputs(g, 2, 1, 4, 2, 16, torch.float32)
    for gt, ex in zip(fo.rope_qk(qkv, cos, sin, 4, 2, 16), ref.rope_qk_reference(qkv, cos, sin, 4, 2, 16), strict=True):
        torch.testing.assert_close(gt, ex)
    torch.testing.assert_close(fo.silu_mul(qkv), ref.silu_mul_reference(qkv))


def test_bad_out_buffers_raise():
    x = torch.zeros(2, 64)
    w = torch.ones(64)
    with pytest.raises(ValueError):
        fo.rmsnorm(x, w, 1e-6, out=torch.zeros(2, 63))
    with pytest.raises(ValueError):
        fo.rmsnorm(x, w, 1e-6, out=torch.zeros(64, 2).t())  # not a row-major view
    with pytest.raises(ValueError):
        fo.silu_mul(x, out=torch.zeros(2, 32, dtype=torch.float16))
    with pytest.raises(ValueError):
        fo.rope_qk(
            torch.zeros(1, 1, 4 * 16),
            torch.zeros(1, 16),
            torch.zeros(1, 16),
            2,
            1,
            16,
            out=(torch.zeros(1, 2, 1, 16),) * 3,
        )
