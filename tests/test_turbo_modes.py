"""The four turbo KV modes: storage protocol, delegated hot/cold split, attention."""

import pytest
import torch

from kvbench.errors import KvbenchError
from kvbench.kv import registry
from kvbench.kv.base import sdpa
from kvbench.kv.fp16 import FP16Cache
from kvbench.kv.turbo_modes import Turbo4DelegatedCache

MODES = ["turbo4-asym", "turbo3-asym", "turbo4", "turbo4-delegated"]


def make(mode, *, b=2, h=2, d=64, dtype=torch.float32, **kw):
    kw.setdefault("grow_step", 16)
    return registry.get(mode)(batch=b, n_kv_heads=h, head_dim=d, dtype=dtype, device="cpu", **kw)


def kv(t, *, b=2, h=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)


def fill(cache, prefill=(10,), decode=7, seed=0):
    """Prefill chunks then single-token appends; returns the K, V that went in."""
    ks, vs = [], []
    for i, t in enumerate([*prefill] + [1] * decode):
        k, v = kv(t, b=cache.batch, h=cache.n_kv_heads, d=cache.head_dim, seed=seed + i)
        cache.append(k, v)
        ks.append(k)
        vs.append(v)
    return torch.cat(ks, 2), torch.cat(vs, 2)


def rel_err(a, b):
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


# ------------------------------------------------------------------ registry
def test_names_and_aliases_resolve():
    expected = {
        "turbo4-asym": ["fp16+turbo4"],
        "turbo3-asym": ["fp16+turbo3", "turbo3"],
        "turbo4": ["turbo4-sym"],
        "turbo4-delegated": ["fp16+turbo4-delegated"],
    }
    for name, aliases in expected.items():
        for spelling in (name, *aliases, name.upper()):
            assert registry.resolve(spelling) == name
        cls = registry.get(name)
        assert cls.boundary_v_applies and cls.default_boundary_v == 2 and cls.summary


def test_symmetric_turbo4_allowlist():
    res = registry.resolve_for_model("turbo4", "llama")
    assert (res.requested, res.effective) == ("turbo4", "turbo4-asym") and "llama" in res.note
    for family in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):
        res = registry.resolve_for_model("turbo4-sym", family)
        assert (res.effective, res.note) == ("turbo4", "")
    assert registry.resolve_for_model("turbo4", "qwen3").effective == "turbo4-asym"
    forced = registry.resolve_for_model("turbo4", "llama", no_fallback=True)
    assert forced.effective == "turbo4" and "--no-fallback" in forced.note
    assert registry.resolve_for_model("turbo4-asym", "llama").effective == "turbo4-asym"


@pytest.mark.parametrize(
    ("n_layers", "boundary_v", "fp16_layers"),
    [(6, None, {0, 1, 4, 5}), (6, 1, {0, 5}), (6, 0, set()), (6, 9, set(range(6))), (3, 2, {0, 2})],
)
def test_boundary_v_through_build_caches(n_layers, boundary_v, fp16_layers):
    caches = registry.build_caches(
        "turbo3-asym",
        n_layers=n_layers,
        batch=1,
        n_kv_heads=2,
        head_dim=64,
        dtype=torch.float16,
        device="cpu",
        boundary_v=boundary_v,
    )
    assert [c.layer_idx for c in caches] == list(range(n_layers))
    assert {i for i, c in enumerate(caches) if type(c) is FP16Cache} == fp16_layers
    assert all(c.name == "turbo3-asym" for i, c in enumerate(caches) if i not in fp16_layers)


# ------------------------------------------------------------------ protocol
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("d", [96, 48, 100])
def test_refuses_non_power_of_two_head_dim(mode, d):
    with pytest.raises(KvbenchError, match=f"power-of-two head_dim; this model has head_dim={d}"):
        make(mode, d=d)


@pytest.mark.parametrize("mode", MODES)
def test_append_and_trim_bookkeeping(mode):
    cache = make(mode)
    fill(cache)
    assert (cache.offset, cache.dropped, cache.live) == (17, 0, 17)
    k0, v0 = (x.clone() for x in cache.dequantized())  # fp16 K comes back as a view
    assert k0.shape == v0.shape == (2, 2, 17, 64)

    assert cache.trim_front(3) == 3  # keep=0: the oldest go
    assert (cache.offset, cache.dropped, cache.live) == (17, 3, 14)
    k, v = cache.dequantized()
    assert torch.equal(k, k0[:, :, 3:]) and torch.equal(v, v0[:, :, 3:])

    rows = list(range(3, 17))
    for _ in range(2):  # repeated sink-keeping trims: the first 4 stay
        assert cache.trim_front(2, keep=4) == 2
        del rows[4:6]
        k, v = cache.dequantized()
        assert torch.equal(k, k0[:, :, rows]) and torch.equal(v, v0[:, :, rows])
    assert (cache.offset, cache.dropped, cache.live) == (17, 7, 10)

    # appends after a trim land after the survivors; offset keeps counting
    kn, vn = kv(1, seed=99)
    cache.append(kn, vn)
    assert (cache.offset, cache.live) == (18, 11)
    k, _ = cache.dequantized()
    assert torch.equal(k[:, :, :10], k0[:, :, rows])

    # clamping: n to the live length, keep to live - n
    assert cache.trim_front(100, keep=4) == 11
    assert (cache.offset, cache.live) == (18, 0)
    assert cache.trim_front(1) == 0


@pytest.mark.parametrize("mode", MODES)
def test_growth_keeps_stored_tokens(mode):
    small = make(mode, grow_step=4)
    big = make(mode, capacity=64)
    for c in (small, big):
        fill(c, prefill=(3, 6), decode=5)
    assert small.capacity == 16 and big.capacity == 64
    for a, b in zip(small.dequantized(), big.dequantized(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_reconstruction_against_fp16(mode):
    cache = make(mode)
    k_in, v_in = fill(cache)
    k, v = cache.dequantized()
    if mode == "turbo4":
        assert rel_err(k, k_in) < 0.25
    else:
        assert torch.equal(k, k_in)
    assert rel_err(v, v_in) < (0.35 if mode == "turbo3-asym" else 0.25)


# bytes per token-head at D=128 with 2-byte K (spec table)
PER_TOKEN_HEAD = {"turbo4-asym": 256 + 66, "turbo3-asym": 256 + 50, "turbo4": 66 + 66}


@pytest.mark.parametrize("mode", list(PER_TOKEN_HEAD))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nbytes_matches_spec_table(mode, dtype):
    cache = make(mode, d=128, dtype=dtype, capacity=32)
    fill(cache, prefill=(5,), decode=2, seed=3)
    per = PER_TOKEN_HEAD[mode]
    assert cache.bytes_per_token() == 2 * 2 * per
    assert cache.nbytes() == 2 * 2 * 7 * per
    assert cache.capacity_nbytes() == 2 * 2 * 32 * per


def test_delegated_nbytes_counts_cold_and_hot():
    cache = make("turbo4-delegated", d=128, dtype=torch.float16, capacity=512)
    fill(cache, prefill=(40,), decode=300, seed=5)
    assert (cache.cold_len, cache.hot_len) == (40 + 128, 172)
    bh = 2 * 2
    assert cache.nbytes() == bh * (256 * cache.live + 66 * cache.cold_len + 256 * cache.hot_len)
    assert cache.bytes_per_token() == cache.nbytes() / cache.live
    assert cache.capacity_nbytes() == bh * (512 * (256 + 66) + 257 * 256)  # hot: HOT_MAX + 1 slots


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [None, 12, 4])
def test_copy_from(mode, n):
    src = make(mode)
    fill(src, prefill=(8,), decode=9)
    dst = make(mode)
    dst.copy_from(src, n)
    m = src.live if n is None else n
    assert (dst.offset, dst.live) == (m, m)
    for a, b in zip(dst.dequantized(), src.dequantized(), strict=True):
        assert torch.equal(a, b[:, :, :m])
    with pytest.raises(KvbenchError):
        make("fp16").copy_from(src)


# ------------------------------------------------------------------ attention
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("t", [1, 5])
def test_rotated_attend_equals_reference(mode, t):
    cache = make(mode, h=2)
    fill(cache, prefill=(9,), decode=4)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 6, t, 64, generator=g)  # GQA: 3 query heads per kv head
    k, v = kv(t, seed=8)
    out = cache.attend(q, k, v, 0.125)
    ref = cache.reference_attend(q, k, v, 0.125)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_attend_on_empty_cache_is_causal_sdpa(mode):
    cache = make(mode)
    q = torch.randn(2, 4, 3, 64)
    k, v = kv(3)
    torch.testing.assert_close(cache.attend(q, k, v, 0.125), sdpa(q, k, v, 0.125))


def test_attend_bf16_output_dtype():
    cache = make("turbo4", dtype=torch.bfloat16)
    fill(cache)
    q = torch.randn(2, 2, 1, 64, dtype=torch.bfloat16)
    k, v = (x.bfloat16() for x in kv(1))
    out = cache.attend(q, k, v, 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, cache.reference_attend(q, k, v, 0.125), rtol=0.02, atol=0.02)


# ------------------------------------------------------------------ delegated
def expected_split(steps):
    """The fold rule written out naively: append to hot, fold at decode start and while hot > 256."""
    cold = hot = 0
    decoding = False
    out = []
    for t in steps:
        if t == 1 and not decoding:
            decoding, cold, hot = True, cold + hot, 0
        hot += t
        while hot > Turbo4DelegatedCache.HOT_MAX:
            cold, hot = cold + Turbo4DelegatedCache.FOLD, hot - Turbo4DelegatedCache.FOLD
        out.append((cold, hot))
    return out


def test_delegated_fold_rule_over_a_long_run():
    steps = [100, 300, 37] + [1] * 650
    cache = make("turbo4-delegated", b=1, d=64, grow_step=128)
    ref = FP16Cache(batch=1, n_kv_heads=2, head_dim=64, dtype=torch.float32, device="cpu")
    seen = []
    for i, t in enumerate(steps):
        k, v = kv(t, b=1, seed=i)
        cache.append(k, v)
        ref.append(k, v)
        seen.append((cache.cold_len, cache.hot_len))
        assert cache.buffers["v_hot"].shape[2] <= 257
    assert seen == expected_split(steps)
    assert seen[:3] == [(0, 100), (256, 144), (256, 181)]
    assert seen[3] == (437, 1)  # decode start folds the whole prefill
    assert all(129 <= hot <= 256 for _, hot in seen[3 + 256 :])

    k, v = cache.dequantized()
    k_ref, v_ref = ref.dequantized()
    assert torch.equal(k, k_ref) and torch.equal(cache.buffers["k"][:, :, : cache.live], k_ref)
    cold = cache.cold_len
    assert torch.equal(v[:, :, cold:], v_ref[:, :, cold:])
    assert rel_err(v[:, :, :cold], v_ref[:, :, :cold]) < 0.25

    q = torch.randn(1, 4, 1, 64)
    kn, vn = kv(1, b=1, seed=1000)
    torch.testing.assert_close(cache.attend(q, kn, vn, 0.125), cache.reference_attend(q, kn, vn, 0.125))


@pytest.mark.parametrize(
    ("n", "keep", "split"),
    [
        (3, 0, (37, 10)),  # all in cold
        (5, 4, (35, 10)),  # cold, after the sinks
        (6, 36, (36, 8)),  # crosses cold -> hot
        (4, 42, (40, 6)),  # all in hot
        (12, 38, (38, 0)),  # to the end
        (44, 4, (4, 2)),  # sinks kept, nearly everything else gone
    ],
)
def test_delegated_trim_across_the_boundary(n, keep, split):
    cache = make("turbo4-delegated")
    ref = make("fp16")
    for c in (cache, ref):
        fill(c, prefill=(40,), decode=10)
    assert (cache.cold_len, cache.hot_len) == (40, 10)
    k0, v0 = (x.clone() for x in cache.dequantized())
    cache.trim_front(n, keep)
    ref.trim_front(n, keep)
    assert (cache.cold_len, cache.hot_len) == split
    assert cache.live == ref.live == 50 - n and cache.offset == 50
    rows = [i for i in range(50) if not keep <= i < keep + n]
    k, v = cache.dequantized()
    k_ref, v_ref = ref.dequantized()
    assert torch.equal(k, k_ref) and torch.equal(k, k0[:, :, rows])
    assert torch.equal(v, v0[:, :, rows])  # cold codes/scales and hot moved in lockstep
    cold = cache.cold_len
    assert torch.equal(v[:, :, cold:], v_ref[:, :, cold:])
    if cold:
        assert rel_err(v[:, :, :cold], v_ref[:, :, :cold]) < 0.25
    assert torch.equal(v[:, :, :keep], v0[:, :, :keep])  # the sinks stay

    # the fold rule carries on from the trimmed state
    fill(cache, prefill=(), decode=260, seed=50)
    assert cache.hot_len <= 256 and cache.cold_len + cache.hot_len == cache.live
    q = torch.randn(2, 2, 1, 64)
    kn, vn = kv(1, seed=77)
    torch.testing.assert_close(cache.attend(q, kn, vn, 0.125), cache.reference_attend(q, kn, vn, 0.125))


def test_delegated_single_tokens_from_empty():
    cache = make("turbo4-delegated", b=1)
    fill(cache, prefill=(), decode=300)
    assert (cache.cold_len, cache.hot_len) == (128, 172)
