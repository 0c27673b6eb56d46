"""Time the fused decode kernels (kvbench.kernels.fused_ops) against the eager
PyTorch they replace, on CUDA, at Llama-3.1-8B decode shapes (hidden 4096,
Hq 32, Hkv 8, D 128, intermediate 14336; B = 1 and 16).

Each op is captured 50 times into a CUDA graph and the graph replayed, as the
decode step is: the time per op is launch-to-launch inside a graph (inputs stay
in L2, as they do right after the projection that writes them). A few seconds
of GPU time.

    python scripts/bench_fused_ops.py [--dtype bf16|fp16|fp32] [--check]

`--check` first runs a correctness sweep on the GPU (odd sizes, every dtype,
NaN-poisoned outputs, strided cache-slot outputs) and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from kvbench.engine.rope import rope_cos_sin
from kvbench.kernels import fused_ops as fo
from kvbench.kernels import fused_ops_reference as ref

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {
    torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2),
    torch.float16: dict(atol=1e-3, rtol=2e-3),
    torch.float32: dict(atol=1e-5, rtol=1e-5),
}


def graph_time_us(fn, calls: int = 50, replays: int = 20, repeats: int = 5) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (calls * replays))
    return statistics.median(times)


def cos_sin(d, positions, dtype, dev):
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    return rope_cos_sin(inv_freq.to(dev), 1.0, positions.to(dev), dtype)


def diff(got, exp):
    """(max |got - exp|, fraction of elements not bit-equal, any NaN)."""
    got, exp = (got if isinstance(got, tuple) else (got,)), (exp if isinstance(exp, tuple) else (exp,))
    mx, ne, n, nan = 0.0, 0, 0, False
    for g_, e_ in zip(got, exp, strict=True):
        nan |= bool(torch.isnan(g_).any())
        mx = max(mx, (g_.float() - e_.float()).abs().max().item())
        ne += (g_ != e_).sum().item()
        n += g_.numel()
    return mx, ne / n, nan


def check(dev) -> bool:
    """Correctness sweep on the GPU (compiled Triton, bf16 included)."""
    ok = True
    g = torch.Generator(device=dev).manual_seed(1234)

    def rnd(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(dtype)

    def nan(*shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype, device=dev)

    def verdict(name, dtype, got, exp):
        nonlocal ok
        got_t, exp_t = (got if isinstance(got, tuple) else (got,)), (exp if isinstance(exp, tuple) else (exp,))
        mx, frac, has_nan = diff(got, exp)
        good = not has_nan and (frac <= 0.01 or dtype == torch.float32)
        for g_, e_ in zip(got_t, exp_t, strict=True):
            good &= torch.allclose(g_.float(), e_.float(), **TOL[dtype])
        ok &= good
        print(f"  {'PASS' if good else 'FAIL'} {name:<44} {str(dtype)[6:]:<9} max|d|={mx:.2e} not-bit-equal={frac:.3%}")

    print("correctness on", torch.cuda.get_device_name(dev))
    for dtype in DTYPES.values():
        for shape in [(3, 1, 576), (5, 100), (64, 1, 8192), (16, 1, 4096)]:
            n = shape[-1]
            x, r = rnd(*shape, dtype=dtype, scale=3.0), rnd(*shape, dtype=dtype, scale=3.0)
            w = rnd(n, dtype=dtype, scale=0.5) + 1
            out = nan(*shape, dtype=dtype)
            verdict(f"rmsnorm {shape}", dtype, fo.rmsnorm(x, w, 1e-5, out=out), ref.rmsnorm_reference(x, w, 1e-5))
            out, h = nan(*shape, dtype=dtype), nan(*shape, dtype=dtype)
            got = fo.rmsnorm(x, w, 1e-5, residual=r, out=out, residual_out=h)
            verdict(f"add+rmsnorm {shape}", dtype, got, ref.rmsnorm_reference(x, w, 1e-5, r))
        for b, t, hq, hk, d, qkn in [
            (3, 1, 9, 3, 64, False),
            (16, 1, 32, 8, 128, False),
            (64, 1, 32, 8, 128, True),
            (2, 5, 9, 3, 64, True),
            (1, 2, 5, 1, 80, False),
        ]:
            qkv = rnd(b, t, (hq + 2 * hk) * d, dtype=dtype, scale=2.0)
            cos, sin = cos_sin(d, torch.arange(1000, 1000 + t), dtype, dev)
            qn = rnd(d, dtype=dtype, scale=0.3) + 1 if qkn else None
            kn = rnd(d, dtype=dtype, scale=0.3) + 1 if qkn else None
            out = (nan(b, hq, t, d, dtype=dtype), nan(b, hk, t, d, dtype=dtype), nan(b, hk, t, d, dtype=dtype))
            got = fo.rope_qk(qkv, cos, sin, hq, hk, d, q_norm=qn, k_norm=kn, eps=1e-6, out=out)
            exp = ref.rope_qk_reference(qkv, cos, sin, hq, hk, d, qn, kn, eps=1e-6)
            verdict(f"rope_qk B{b} T{t} Hq{hq} Hkv{hk} D{d} qknorm={qkn}", dtype, got, exp)
        # k/v straight into a cache slot, strided 2-D qkv, per-sequence positions.
        b, hq, hk, d, tmax, slot = 4, 32, 8, 128, 9, 6
        n = (hq + 2 * hk) * d
        qkv = rnd(b, n + 128, dtype=dtype)[:, :n]
        cs = [cos_sin(d, torch.tensor([p]), dtype, dev) for p in (0, 7, 300, 9000)]
        cos, sin = torch.stack([c for c, _ in cs]), torch.stack([s for _, s in cs])
        kc, vc, q = nan(b, hk, tmax, d, dtype=dtype), nan(b, hk, tmax, d, dtype=dtype), nan(b, hq, 1, d, dtype=dtype)
        fo.rope_qk(qkv, cos, sin, hq, hk, d, out=(q, kc[:, :, slot : slot + 1], vc[:, :, slot : slot + 1]))
        exp = ref.rope_qk_reference(qkv, cos, sin, hq, hk, d)
        verdict("rope_qk into cache slot", dtype, (q, kc[:, :, slot : slot + 1], vc[:, :, slot : slot + 1]), exp)
        rest = [i for i in range(tmax) if i != slot]
        if not (torch.isnan(kc[:, :, rest]).all() and torch.isnan(vc[:, :, rest]).all()):
            print("  FAIL rope_qk wrote outside the cache slot")
            ok = False
        for shape in [(3, 1, 2 * 1536), (5, 2 * 100), (16, 1, 2 * 14336), (64, 1, 2 * 14336), (1, 2 * 4097)]:
            x = rnd(*shape, dtype=dtype, scale=4.0)
            out = nan(*shape[:-1], shape[-1] // 2, dtype=dtype)
            verdict(f"silu_mul {shape}", dtype, fo.silu_mul(x, out=out), ref.silu_mul_reference(x))
    # With out= buffers the launchers must not allocate (CUDA-graph friendly).
    dtype, b = torch.bfloat16, 4
    x, r, w = rnd(b, 1, 4096, dtype=dtype), rnd(b, 1, 4096, dtype=dtype), rnd(4096, dtype=dtype)
    y, h = torch.empty_like(x), torch.empty_like(x)
    qkv = rnd(b, 1, 48 * 128, dtype=dtype)
    cos, sin = cos_sin(128, torch.tensor([5]), dtype, dev)
    qkv_out = tuple(torch.empty(b, n, 1, 128, dtype=dtype, device=dev) for n in (32, 8, 8))
    gu, act = rnd(b, 1, 2 * 14336, dtype=dtype), torch.empty(b, 1, 14336, dtype=dtype, device=dev)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    fo.rmsnorm(x, w, 1e-5, out=y)
    fo.rmsnorm(x, w, 1e-5, residual=r, out=y, residual_out=h)
    fo.rope_qk(qkv, cos, sin, 32, 8, 128, q_norm=w[:128], k_norm=w[:128], out=qkv_out)
    fo.silu_mul(gu, out=act)
    torch.cuda.synchronize()
    n_alloc = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    print(f"  {'PASS' if n_alloc == 0 else 'FAIL'} allocations with out= buffers: {n_alloc}")
    return ok and n_alloc == 0


def bench(dev, dtype) -> None:
    print(
        f"\nLlama-3.1-8B decode shapes, {str(dtype)[6:]}, {torch.cuda.get_device_name(dev)}; µs per op in a CUDA graph"
    )
    print(f"{'op':<20}{'B':>4}{'torch µs':>11}{'fused µs':>11}{'speedup':>9}{'max|d|':>11}{'not-bit-eq':>12}")
    for b in (1, 16):
        bench_batch(dev, dtype, b)


def bench_batch(dev, dtype, b) -> None:
    """One B: each op fused vs eager, then a Llama layer's worth (2 add+norm, rope, silu)."""
    hidden, hq, hk, d, inter, eps = 4096, 32, 8, 128, 14336, 1e-5
    x = torch.randn(b, 1, hidden, device=dev).to(dtype)
    r = torch.randn(b, 1, hidden, device=dev).to(dtype)
    w = (torch.randn(hidden, device=dev) * 0.1 + 1).to(dtype)
    y, h = torch.empty_like(x), torch.empty_like(x)
    qkv = torch.randn(b, 1, (hq + 2 * hk) * d, device=dev).to(dtype)
    cos, sin = cos_sin(d, torch.tensor([1234]), dtype, dev)
    qn = (torch.randn(d, device=dev) * 0.1 + 1).to(dtype)
    kn = (torch.randn(d, device=dev) * 0.1 + 1).to(dtype)
    qkv_out = tuple(torch.empty(b, n, 1, d, dtype=dtype, device=dev) for n in (hq, hk, hk))
    gu = torch.randn(b, 1, 2 * inter, device=dev).to(dtype)
    act = torch.empty(b, 1, inter, dtype=dtype, device=dev)
    cases = [
        (
            "rmsnorm",
            lambda: ref.rmsnorm_reference(x, w, eps),
            lambda: fo.rmsnorm(x, w, eps, out=y),
        ),
        (
            "add+rmsnorm",
            lambda: ref.rmsnorm_reference(x, w, eps, r),
            lambda: fo.rmsnorm(x, w, eps, residual=r, out=y, residual_out=h),
        ),
        (
            "rope_qk",
            lambda: ref.rope_qk_reference(qkv, cos, sin, hq, hk, d),
            lambda: fo.rope_qk(qkv, cos, sin, hq, hk, d, out=qkv_out),
        ),
        (
            "qk_norm+rope_qk",
            lambda: ref.rope_qk_reference(qkv, cos, sin, hq, hk, d, qn, kn, eps),
            lambda: fo.rope_qk(qkv, cos, sin, hq, hk, d, q_norm=qn, k_norm=kn, eps=eps, out=qkv_out),
        ),
        (
            "silu_mul",
            lambda: ref.silu_mul_reference(gu),
            lambda: fo.silu_mul(gu, out=act),
        ),
    ]
    times = {}
    for name, f_ref, f_fused in cases:
        exp = f_ref()
        got = f_fused()
        mx, frac, _ = diff(tuple(t.clone() for t in got) if isinstance(got, tuple) else got.clone(), exp)
        t_ref, t_fused = graph_time_us(f_ref), graph_time_us(f_fused)
        times[name] = (t_ref, t_fused)
        print(f"{name:<20}{b:>4}{t_ref:>11.2f}{t_fused:>11.2f}{t_ref / t_fused:>8.1f}x{mx:>11.2e}{frac:>12.3%}")
    layer = [times[k] for k in ("add+rmsnorm", "add+rmsnorm", "rope_qk", "silu_mul")]
    t_ref, t_fused = sum(t for t, _ in layer), sum(t for _, t in layer)
    print(
        f"{'= per layer':<20}{b:>4}{t_ref:>11.2f}{t_fused:>11.2f}{t_ref / t_fused:>8.1f}x   (x32 layers: {32 * (t_ref - t_fused):.0f} µs saved per step)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--check", action="store_true", help="correctness sweep on the GPU first")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA (the CPU tests run the kernels under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    ok = check(dev) if args.check else True
    bench(dev, DTYPES[args.dtype])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
