import pytest
import torch

from kvbench.kv.int8 import Int8Cache, dequantize_int8, quantize_int8


def _check_within_step(x):
    q, s = quantize_int8(x)
    xh = dequantize_int8(q, s, torch.float32)
    step = x.abs().amax(-1, keepdim=True) / 127
    err = (xh - x.float()).abs()
    assert (err <= step * (1 + 1e-5) + 1e-30).all(), (err / step.clamp_min(1e-30)).max()
    return q, s, xh


@pytest.mark.parametrize("magnitude", [1e-30, 1e-3, 1e-6, 1.0, 300.0])
def test_every_coordinate_within_one_step(seed, magnitude):
    x = torch.randn(2, 3, 17, 64) * magnitude
    _check_within_step(x)


def test_adversarial_inputs(seed):
    x = torch.randn(4, 128) * 1e-3
    x[0, 5] = 50.0  # one huge outlier
    x[1] = torch.where(torch.arange(128) % 2 == 0, 1e-4, -1e-4)  # mixed signs, tiny
    x[2] = 0.0
    x[2, 0] = 1e-7
    _, s, _ = _check_within_step(x)
    # a tiny nonzero scale stays tiny: no floor (bf16 keeps float32's range; rounding within 2^-8)
    assert s.dtype == torch.bfloat16
    assert s[1].item() == pytest.approx(1e-4 / 127, rel=2**-8)
    assert s[2].item() == pytest.approx(1e-7 / 127, rel=2**-8)
    x[3] = 0.0
    x[3, :3] = torch.tensor([1e-30, -3e-31, 2e-32])  # below fp16's smallest subnormal by far
    _, s, xh = _check_within_step(x)
    assert 0 < s[3].item() < 1e-31 and xh[3, 0].item() == pytest.approx(1e-30, rel=1e-2)


def test_zero_token_comes_back_exact_zeros():
    x = torch.zeros(3, 64)
    _, s, xh = _check_within_step(x)
    assert torch.equal(xh, torch.zeros_like(xh))
    assert (s == 1.0).all()  # the zero guard, and only there


def test_old_scale_floor_would_fail():
    """The seed engine's `scale = max(scale, 1.0)` rounds small values to integers."""
    x = torch.randn(8, 64) * 0.05
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp_min(1.0)
    floored = torch.round(x / scale).clamp(-127, 127) * scale
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((floored - x).abs() > step).any()  # the old behaviour breaks the bound ...
    _check_within_step(x)  # ... which ours keeps


def test_cache_roundtrip_and_bytes(seed):
    c = Int8Cache(batch=1, n_kv_heads=2, head_dim=128, dtype=torch.float16, device="cpu")
    k, v = torch.randn(1, 2, 10, 128).half(), torch.randn(1, 2, 10, 128).half()
    c.append(k, v)
    kh, _ = c.dequantized()
    step = k.float().abs().amax(-1, keepdim=True) / 127
    assert ((kh.float() - k.float()).abs() <= step * 1.01 + 1e-3).all()
    # 128 int8 + 2-byte scale per token-head, for K and V, 2 heads
    assert c.bytes_per_token() == 2 * 2 * (128 + 2)
    assert c.nbytes() == 10 * 2 * 2 * (128 + 2)


def test_growth_trim_and_decode_track_fp16(seed):
    """Prefill across a storage-growth boundary, trim with sinks, then decode
    appends: int8 stays within one quantization step of fp16 holding the same tokens."""
    from kvbench.kv.fp16 import FP16Cache

    kw = dict(batch=2, n_kv_heads=3, head_dim=64, dtype=torch.float32, device="cpu", grow_step=16)
    q8, ref = Int8Cache(**kw), FP16Cache(**kw)
    for t in (20, 15):  # 35 tokens: crosses the 16- and 32-token growth steps
        k, v = torch.randn(2, 3, t, 64), torch.randn(2, 3, t, 64)
        q8.append(k, v)
        ref.append(k, v)
    for c in (q8, ref):
        c.trim_front(10, keep=4)
    for _ in range(20):
        k, v = torch.randn(2, 3, 1, 64) * 1e-3, torch.randn(2, 3, 1, 64) * 50
        q8.append(k, v)
        ref.append(k, v)
    assert q8.live == ref.live == 45 and q8.offset == ref.offset == 55 and q8.capacity >= 45
    for got, want in zip(q8.dequantized(), ref.dequantized()):
        step = want.abs().amax(-1, keepdim=True) / 127
        assert ((got - want).abs() <= step * (1 + 1e-5)).all()
