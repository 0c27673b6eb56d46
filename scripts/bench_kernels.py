#!/usr/bin/env python
"""Micro-benchmark of the decode-attention kernels on a CUDA GPU (written for an H200).

    python scripts/bench_kernels.py            # check, then time every mode (about 1 min)
    python scripts/bench_kernels.py --tune     # also sweep num_splits / BLOCK_N / warps / stages (2-3 min)

1. Checks every kernel against its PyTorch reference on random data (fp16 and bf16,
   poisoned slots past L) and prints the max relative error.
2. Times one layer's decode attention (Hq=32, Hkv=8, D=128, bf16) per mode and
   shape, replaying a CUDA graph over enough cache copies that the KV bytes do not
   sit in L2; prints time (median) and the bandwidth achieved on the bytes the
   format actually stores for the L tokens, and writes $OUT/kernels.csv when OUT is set.
torch SDPA on the fp16 cache is the baseline the fp16 kernel must match.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import itertools
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvbench.kernels import reference as ref
from kvbench.kernels.decode_attention import (
    DecodeWorkspace,
    _decode_split_kernel,
    choose_num_splits,
    decode_attention,
    default_config,
    launch_stages,
)
from kvbench.kernels.launch import programmatic_launch
from kvbench.kernels.quantize import write_kv

HQ, HKV, D = 32, 8, 128
SHAPES = [(1, 8192), (1, 32768), (16, 32768)]  # (batch, context)
HOT = 200  # delegated: tokens in the fp16 hot window
L2_BYTES = 60 << 20


def codecs(dim, device):
    """Turbo parameters per side: signs, codebook (fp32 and fp16) and boundaries."""
    out = {}
    for side, seeds in (("k", (11, 12)), ("v", (21, 22))):
        signs = tuple(ref.random_signs(dim, s, device) for s in seeds)
        for bits in (3, 4):
            cb = ref.lloyd_max_codebook(bits, dim).to(device)
            out[side, bits] = (signs, cb, ref.codebook_boundaries(cb).to(device))
    return out


def mode_kwargs(mode, cod):
    vbits = 3 if mode == "turbo3-asym" else 4
    (ks, kcb, kb), (vs, vcb, vb) = cod["k", 4], cod["v", vbits]
    return {"k_signs": ks, "k_codebook": kcb, "k_boundaries": kb, "v_signs": vs, "v_codebook": vcb, "v_boundaries": vb}


def attn_kwargs(kw):
    return {k: v for k, v in kw.items() if not k.endswith("boundaries")}


def quantized_cache(mode, b, cap, length, cold, dtype, kw, device):
    """Real quantized random tokens (via the write kernel's reference), poison past L."""
    kf, vf = ref.FORMATS[mode]
    x = {s: torch.randn(b, HKV, cap, D, device=device, dtype=dtype) for s in "kv"}
    bufs = {}
    for side, fmt in (("k", kf), ("v", vf)):
        if fmt == "float":
            bufs[side] = x[side]
        elif fmt == "int8":
            bufs[side], scale = ref.quantize_int8(x[side])
            ref.set_int8_scale(bufs, side, scale)
            if side == "v":  # as the int8 cache stores it
                bufs[side] = ref.token_major(bufs[side].shape, torch.int8, device).copy_(bufs[side])
        else:
            bits = 3 if fmt == "turbo3" else 4
            signs, cb, bnd = kw[side + "_signs"], kw[side + "_codebook"], kw[side + "_boundaries"]
            bufs[side + "_codes"], bufs[side + "_scale"] = ref.quantize_turbo(x[side], cb.float(), bnd, *signs, bits)
        if fmt == "delegated":
            bufs["v_hot"] = torch.full((b, HKV, 256, D), float("nan"), device=device, dtype=dtype)
            bufs["v_hot"][:, :, : length - cold] = x["v"][:, :, cold:length]
    for key, buf in bufs.items():
        if key != "v_hot" and buf.is_floating_point():
            buf[:, :, length:] = float("nan")
    return bufs


def check(device, cod):
    print("== correctness vs reference (max |out - ref| / max |ref|) ==")
    ok = True
    b, cap, length, group = 2, 1100, 1000, HQ // HKV
    for dtype, mode in itertools.product((torch.float16, torch.bfloat16), ref.MODES):
        kw = mode_kwargs(mode, cod)
        cold = length - 150
        bufs = quantized_cache(mode, b, cap, length, cold, dtype, kw, device)
        q = 3 * torch.randn(b, HKV * group, D, device=device, dtype=dtype)
        kn, vn = torch.randn(2, b, HKV, D, device=device, dtype=dtype)
        out = torch.full_like(q, float("nan"))
        args = (mode, q, kn, vn, bufs, torch.tensor([length], dtype=torch.int32, device=device), 1 / math.sqrt(D))
        decode_attention(
            *args, cold_length=torch.tensor([cold], dtype=torch.int32, device=device), out=out, **attn_kwargs(kw)
        )
        want = ref.decode_attention(*args, cold_length=cold, **attn_kwargs(kw))
        err = ((out.float() - want.float()).abs().max() / want.float().abs().max()).item()
        tol = 4e-3 if dtype == torch.float16 else 2e-2
        ok &= err < tol
        # quantize-on-write: fresh tokens into slot L, compared with the reference write
        got, exp = ({k: t.clone() for k, t in bufs.items()} for _ in range(2))
        slot = torch.tensor([length - 3], dtype=torch.int32, device=device)
        k3, v3 = torch.randn(2, b, HKV, 3, D, device=device, dtype=dtype)
        write_kv(mode, k3, v3, got, slot, cold_length=torch.tensor([cold]).int().to(device), **kw)
        ref.write_kv(mode, k3, v3, exp, length - 3, cold_length=cold, **kw)
        bad = []
        for key in got:
            a, e = got[key], exp[key]
            if a.dtype == torch.uint8:
                frac = (
                    (
                        ref.unpack_codes(a, 4 if key.startswith("k") or mode != "turbo3-asym" else 3)
                        != ref.unpack_codes(e, 4 if key.startswith("k") or mode != "turbo3-asym" else 3)
                    )
                    .float()
                    .mean()
                    .item()
                )
                if frac > 1e-4:
                    bad.append(f"{key} {frac:.1e} codes differ")
            elif (
                not torch.equal(a.isnan(), e.isnan())
                or (a.float() - e.float()).nan_to_num().abs().max() > 1e-3 * e.float().nan_to_num().abs().max()
            ):
                bad.append(key)
        ok &= not bad
        print(
            f"{str(dtype)[6:]:9} {mode:17} attention {err:.1e} {'ok' if err < tol else 'FAIL'}   write_kv {'ok' if not bad else 'FAIL ' + ', '.join(bad)}"
        )
    return ok


def random_cache(mode, b, length, dtype, device, int8_v="token-major"):
    """Cache of capacity L filled with random bytes of the right kinds (timing only);
    int8 V token-major as the int8 cache stores it, or row-major ([B, H, cap, D])."""
    kf, vf = ref.FORMATS[mode]
    bufs = {}
    for side, fmt in (("k", kf), ("v", vf)):
        shape = (b, HKV, length)
        if fmt == "float":
            bufs[side] = torch.randn(*shape, D, device=device, dtype=dtype)
        elif fmt == "int8":
            bufs[side] = torch.randint(-127, 128, (*shape, D), device=device, dtype=torch.int8)
            if side == "v" and int8_v == "token-major":
                bufs[side] = ref.token_major(bufs[side].shape, torch.int8, device).copy_(bufs[side])
            ref.set_int8_scale(bufs, side, torch.rand(*shape, 1, device=device) / 64)
        else:
            bits = 3 if fmt == "turbo3" else 4
            bufs[side + "_codes"] = torch.randint(0, 256, (*shape, D * bits // 8), device=device, dtype=torch.uint8)
            bufs[side + "_scale"] = (torch.rand(*shape, 1, device=device) * 4).half()
        if fmt == "delegated":
            bufs["v_hot"] = torch.randn(b, HKV, 256, D, device=device, dtype=dtype)
    return bufs


def kv_bytes(mode, bufs, length, cold):
    """Bytes of the stored format the kernel must read for L tokens."""
    total = 0
    for key, buf in bufs.items():
        per_token = buf[:, :, :1].numel() * buf.element_size()
        if key == "v_hot":
            n = length - cold
        elif key.startswith("v_") and ref.FORMATS[mode][1] == "delegated":
            n = cold
        else:
            n = length
        total += per_token * n
    return total


def time_graph(calls, reps=15):
    """Median microseconds per call of `calls` (a list of closures), replayed in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls[:2]:
            c()  # compile / warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def compiled_split_kernels():
    """{id: compiled kernel} of every variant of the split kernel compiled so far."""
    try:
        return {id(k): k for entry in _decode_split_kernel.device_caches.values() for k in entry[0].values()}
    except (AttributeError, IndexError, TypeError):  # another triton's cache layout: no resource report
        return {}


RESOURCES = {}  # (mode, config) -> "regs=.. spills=.. smem=.." of its split kernel


def resources(kernels):
    """Registers per thread, spilled registers and shared memory of the first of `kernels`."""
    for k in kernels:
        try:
            return f"regs={k.n_regs} spills={k.n_spills} smem={k.metadata.shared // 1024}K"
        except AttributeError:
            return ""
    return ""


def copies_for(nbytes):
    return max(1, min(16, math.ceil(4 * L2_BYTES / nbytes)))


VARIANTS = {  # name suffixes (after ":", joined by "+") -> decode_attention launch overrides
    "wfirst": {"write_first": True},
    "wlast": {"write_first": False},
    "s8": {"int8_dot": "s8"},  # int8: integer dots of split operands
    "f16": {"int8_dot": "f16"},  # int8: fp16 dots of biased codes
    "mixed": {"int8_dot": "mixed"},  # int8: integer dots for the scores, fp16 dots of biased codes for V
    "rw1": {"reduce_warps": 1},  # warps per reduction program (2 and 4 merge 64 splits per pass, 1 merges 32)
    "rw2": {"reduce_warps": 2},
    "rw4": {"reduce_warps": 4},
    "lazy": {"rescale_tau": 8.0},  # the online softmax rescales only when a row's maximum rose by > 8 (log2)
    "eager": {"rescale_tau": 0.0},  # ... at every block
    "defer": {"defer_sums": True},  # the weights summed per element, over tokens once after the loop
    "nodefer": {"defer_sums": False},
}


VARIANTS_KEYS = {k for v in VARIANTS.values() for k in v}
LAUNCH_ARGS = set(inspect.signature(decode_attention).parameters)  # the knobs a launch takes as arguments


def kernel_mode(name):
    """A timed kernel's (mode, int8 V layout, turbo lookup, launch overrides): "int8-rowmajor"
    is int8 with V stored [B, H, cap, D]; "<turbo mode>@gather" times the codebook gather
    instead of prmt; "<mode>:wfirst" / ":wlast" force where the reduction stores the fresh
    token, "int8:s8" / "int8:f16" the int8 kernel's dots (`VARIANTS`, joined by "+";
    otherwise the mode's defaults)."""
    name, _, opts = name.partition(":")
    over = {}
    for opt in filter(None, opts.split("+")):
        over.update(VARIANTS[opt])
    if name == "int8-rowmajor":
        return "int8", "row-major", None, over
    mode, _, lut = name.partition("@")
    return mode, "token-major", lut or None, over


def l2_missing_caches(mode, b, length, dtype, device, int8_v="token-major"):
    """Random caches of one shape, enough of them that cycling through misses L2, and the
    KV bytes one of them holds for the L tokens."""
    probe = random_cache(mode, b, length, dtype, device, int8_v)
    nbytes = kv_bytes(mode, probe, length, length - HOT)
    return [probe] + [
        random_cache(mode, b, length, dtype, device, int8_v) for _ in range(copies_for(nbytes) - 1)
    ], nbytes


def write_target(mode, b, dtype, device):
    """A 4096-slot cache and the device slot / cold length a decode token's write goes to."""
    bufs = random_cache(mode, b, 4096, dtype, device)
    slot = torch.tensor([4000], dtype=torch.int32, device=device)
    cold = torch.tensor([3900], dtype=torch.int32, device=device)
    return bufs, slot, cold


REDUCE_WARPS = None  # --reduce-warps: the reduction kernel's warps (None: the mode's default)


def append_args(append):
    """decode_attention's arguments for an --append choice (see main), and --reduce-warps."""
    out = {"reduce_warps": REDUCE_WARPS}
    if append == "none":
        return out
    return {**out, "append": True, "fuse_append": {"default": None, "fused": True, "launch": False}[append]}


def bench_mode(name, b, length, dtype, device, cod, configs, append="none"):
    """[(config, us)] for each tuning config of one mode and shape. With an append, the
    caches hold L - 1 tokens and each call also stores the fresh one into slot L - 1."""
    mode, int8_v, lut, over = kernel_mode(name)
    kw = mode_kwargs(mode, cod) if append != "none" else attn_kwargs(mode_kwargs(mode, cod))
    kw.update(append_args(append), **over)
    cold = length - HOT
    caches, nbytes = l2_missing_caches(mode, b, length, dtype, device, int8_v)
    q = torch.randn(b, HQ, D, device=device, dtype=dtype)
    kn, vn = torch.randn(2, b, HKV, D, device=device, dtype=dtype)
    out = torch.empty_like(q)
    dl = torch.tensor([length - (append != "none")], dtype=torch.int32, device=device)
    dc = torch.tensor([cold], dtype=torch.int32, device=device)
    results = []
    for cfg in configs:
        ws = DecodeWorkspace.for_cache(mode, q, HKV, length, cfg["num_splits"], cfg["block_n"])
        tune = {k: v for k, v in cfg.items() if k not in ("num_splits", "nearest")}
        if tune["num_stages"] is None:  # the launcher's rule, resolved here to be printed
            base = {**default_config(mode, batch=b, capacity=length), "block_n": cfg["block_n"]}
            tune["num_stages"] = launch_stages(base, b * HKV * ws.num_splits, math.ceil(length / ws.num_splits), device)

        def call(bufs, ws=ws, tune=tune):
            return lambda: decode_attention(
                mode,
                q,
                kn,
                vn,
                bufs,
                dl,
                1 / math.sqrt(D),
                cold_length=dc,
                out=out,
                workspace=ws,
                lut=lut,
                **kw,
                **tune,
            )

        before = compiled_split_kernels()
        try:
            us = time_graph([call(c) for c in caches])
        except triton.runtime.errors.OutOfResources:  # a tuning config past the shared memory: skipped
            if cfg is configs[0]:
                raise
            continue
        results.append(({**cfg, **tune, "num_splits": ws.num_splits}, us))
        key = (name, tuple(sorted(tune.items())))
        if key not in RESOURCES:
            RESOURCES[key] = resources(k for i, k in compiled_split_kernels().items() if i not in before)
        results[-1][0]["resources"] = RESOURCES[key]
    return results, nbytes


def bench_sdpa(b, length, dtype, device, backend=None, pad=0, grouped=False):
    """(us, KV bytes of the L tokens) of torch SDPA over a [B, Hkv, L, D] fp16 cache, under torch's
    own backend choice or `backend` (a `torch.nn.attention.SDPBackend`). `pad` > 0: over L + pad
    slots with a boolean mask hiding the last `pad`, as a CUDA graph that serves every step of a
    growing cache would have to call it (its length lives on the device). `grouped`: each KV head's
    query heads as a query sequence [B, Hkv, G, D] (scripts/exp/fp16_sdpa.py), not `enable_gqa`."""
    nbytes = 2 * b * HKV * length * D * torch.finfo(dtype).bits // 8
    q = torch.randn(b, HQ, 1, D, device=device, dtype=dtype)
    if grouped:
        q = q.view(b, HKV, HQ // HKV, D)
    slots = length + pad
    kvs = [torch.randn(2, b, HKV, slots, D, device=device, dtype=dtype) for _ in range(copies_for(nbytes))]
    mask = (torch.arange(slots, device=device) < length).view(1, 1, 1, slots) if pad else None
    calls = [
        lambda kv=kv: F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, enable_gqa=not grouped)
        for kv in kvs
    ]
    if backend is None:
        return time_graph(calls), nbytes
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return time_graph(calls), nbytes


def sdpa_choice(b, length, dtype, device, pad=0, grouped=False):
    """The backend torch's SDPA dispatch picks for this shape (a private torch call; "?" where it is missing)."""
    from torch.nn.attention import SDPBackend

    q = torch.empty(*((b, HKV, HQ // HKV) if grouped else (b, HQ, 1)), D, device=device, dtype=dtype)
    k = torch.empty(b, HKV, length + pad, D, device=device, dtype=dtype)
    mask = torch.ones(1, 1, 1, length + pad, dtype=torch.bool, device=device) if pad else None
    try:
        choice = torch._fused_sdp_choice(q, k, k, mask, 0.0, False, scale=None, enable_gqa=not grouped)
        return SDPBackend(choice).name
    except (AttributeError, RuntimeError, TypeError, ValueError) as exc:
        return f"? ({type(exc).__name__})"


def sdpa_backends(shapes, dtype, device, pad=64):
    """torch SDPA at each shape: its own choice, then each fused backend forced, unmasked and over `pad`
    more slots behind a mask (what a captured step over a growing cache would call), with `enable_gqa` and
    with each KV head's query heads as a query sequence ("grouped"); rows for kernels.csv."""
    from torch.nn.attention import SDPBackend

    backends = [("auto", None)] + [
        (name.lower(), getattr(SDPBackend, name))
        for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
        if hasattr(SDPBackend, name)
    ]
    rows = []
    print(f"\n== torch SDPA per backend, one layer (us; masked, grouped: over L + {pad} slots, a boolean mask) ==")
    print(
        f"{'batch':>5} {'context':>7} {'backend':19} {'plain':>8} {'masked':>8} {'grouped':>8}  torch's choice (each)"
    )
    for b, length in shapes:
        picked = " / ".join(sdpa_choice(b, length, dtype, device, p, g) for p, g in ((0, 0), (pad, 0), (pad, 1)))
        for name, backend in backends:
            cells = []
            for label, p, grouped in (("plain", 0, False), ("masked", pad, False), ("grouped", pad, True)):
                try:
                    us, nbytes = bench_sdpa(b, length, dtype, device, backend, p, grouped)
                except RuntimeError as exc:  # this backend does not take the shape (or the mask)
                    cells.append(f"{'-':>8}")
                    print(f"        {name} {label}: {str(exc).splitlines()[0][:160]}")
                    continue
                cells.append(f"{us:8.1f}")
                kernel = f"torch-sdpa-{name}" + ("" if label == "plain" else f"-{label}")
                rows.append({"batch": b, "context": length, "kernel": kernel, "us": us, "kv_bytes": nbytes})
            print(f"{b:5} {length:7} {name:19} {' '.join(cells)}  {picked if name == 'auto' else ''}")
    return rows


def bench_write(mode, b, dtype, device, cod, **tune):
    """Microseconds for one decode step's quantize-on-write of K and V (T = 1)."""
    kw = mode_kwargs(mode, cod)
    bufs, slot, cold = write_target(mode, b, dtype, device)
    kn, vn = torch.randn(2, b, HKV, D, device=device, dtype=dtype)
    return time_graph([lambda: write_kv(mode, kn, vn, bufs, slot, cold_length=cold, **kw, **tune)] * 20)


def tuning_grid(grid, splits, shape=(128, 4)):
    """Launch configs to sweep around the default split count. "default": splits / 2, x1, x2
    x BLOCK_N 64/128 x 4/8 warps x 2/3 stages. "wide" adds small programs (1-2 warps, 32-64
    token blocks) and up to 4x the splits: more, lighter programs per SM, whose reductions
    stay inside a warp. "splits": the mode's own program `shape` (BLOCK_N, warps) at split
    counts from 1/2 to 2x the default (and the default +- 1)."""
    if grid == "default":
        shapes = [(n, w) for n in (64, 128) for w in (4, 8)]
        counts = (max(1, splits // 2), splits, 2 * splits)
    elif grid == "splits":
        shapes = [shape]
        counts = {max(1, round(splits * f)) for f in (0.5, 0.75, 1, 1.25, 1.5, 2)}
        counts |= {max(1, splits - 1), splits + 1}
    elif grid == "rows":  # fp16/int8: 2-8 warps, 64-256 token blocks
        shapes = [(n, w) for n in (64, 128, 256) for w in (2, 4, 8) if (n, w) != (64, 8)]
        counts = (max(1, splits // 2), splits, 2 * splits)
    else:
        shapes = [(32, 1), (64, 1), (64, 2), (128, 2), (128, 4), (128, 8)]
        counts = (splits, 2 * splits, 4 * splits)
    return [
        {"num_splits": s, "block_n": n, "num_warps": w, "num_stages": st}
        for s, (n, w), st in itertools.product(sorted(set(counts)), shapes, (2, 3))
    ]


def explicit_config(spec, b, length, programs_per_sm, nearest, device, min_tokens=1024, wave=0):
    """{num_splits, block_n, num_warps, num_stages} from "BLOCK_N/WARPS/STAGES[/SPLITS]"."""
    n, w, st, *rest = (int(v) for v in spec.split("/"))
    splits = (
        rest[0] if rest else choose_num_splits(b, HKV, length, n, device, programs_per_sm, nearest, min_tokens, wave)
    )
    return {"num_splits": splits, "block_n": n, "num_warps": w, "num_stages": st}


def profile_parts(name, b, length, dtype, device, cod, reps=10, append="none"):
    """Mean GPU time of each kernel of one layer's decode step (split, reduce, query
    rotation, write) at the launch defaults, from torch.profiler over eager calls that
    rotate through enough cache copies to miss L2. Launch gaps are not in these times.
    append "none": a separate write_kv into another cache; else decode_attention appends
    the fresh token itself (`append_args`), a fused write showing up in the reduce.
    `name` as in `kernel_mode` (a lookup or write-order variant; int8 V token-major)."""
    mode, _, lut, over = kernel_mode(name)
    kw = mode_kwargs(mode, cod)
    cold = length - HOT
    caches, _ = l2_missing_caches(mode, b, length, dtype, device)
    q = torch.randn(b, HQ, D, device=device, dtype=dtype)
    kn, vn = torch.randn(2, b, HKV, D, device=device, dtype=dtype)
    out = torch.empty_like(q)
    ws = DecodeWorkspace.for_cache(mode, q, HKV, length)
    wbufs, slot, wcold = write_target(mode, b, dtype, device)
    live = torch.tensor([length - (append != "none")], dtype=torch.int32, device=device)
    dcold = torch.tensor([cold], dtype=torch.int32, device=device)

    def step(bufs):
        codec = kw if append != "none" else attn_kwargs(kw)
        decode_attention(mode, q, kn, vn, bufs, live, 1 / math.sqrt(D), cold_length=dcold, out=out, workspace=ws,
                         lut=lut, **codec, **{**append_args(append), **over})  # fmt: skip
        if append == "none":
            write_kv(mode, kn, vn, wbufs, slot, cold_length=wcold, **kw)

    for c in caches:
        step(c)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for c in caches:
                step(c)
        torch.cuda.synchronize()
    parts = {}
    for e in prof.key_averages():
        total = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        for part in ("split", "reduce", "rotate", "write"):
            if f"_{part}" in e.key and e.count:
                parts[part] = parts.get(part, 0.0) + total / e.count
    return parts


def write_csv(rows, final=False):
    """$OUT/kernels.csv of the rows so far (rewritten after every shape, so a run cut short by a time
    limit keeps what it timed); nothing without OUT."""
    out_dir = os.environ.get("OUT")
    if not out_dir:
        return
    path = Path(out_dir) / "kernels.csv"
    fields = [
        "batch",
        "context",
        "kernel",
        "us",
        "kv_bytes",
        "tb_s",
        "num_splits",
        "block_n",
        "num_warps",
        "num_stages",
    ]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "tb_s": r["kv_bytes"] / r["us"] / 1e6})
    if final:
        print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tune", action="store_true", help="sweep num_splits x BLOCK_N x num_warps x num_stages")
    ap.add_argument(
        "--modes",
        default=",".join(ref.MODES),
        help="comma list of modes (int8-rowmajor: int8 with V stored [B, H, cap, D])",
    )
    ap.add_argument(
        "--grid",
        choices=("default", "wide", "rows", "splits"),
        default="default",
        help="the --tune sweep (see tuning_grid)",
    )
    ap.add_argument("--shapes", default=",".join(f"{b}x{n}" for b, n in SHAPES), help="comma list of BATCHxCONTEXT")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--once", action="store_true", help="one plain call per mode and shape (for a profiler), no timing")
    ap.add_argument(
        "--parts", action="store_true", help="GPU time per kernel of a layer's step (torch.profiler), then exit"
    )
    ap.add_argument(
        "--append",
        choices=("none", "default", "fused", "launch"),
        default="none",
        help="also store the fresh token as the engine does: none (attention alone; the write is timed on its "
        "own), default (the mode's default), fused (in the reduction kernel), launch (a write_kv launch after it)",
    )
    ap.add_argument("--reduce-warps", type=int, help="warps of the reduction kernel (default: the mode's)")
    ap.add_argument(
        "--configs",
        help="with --tune: time these launch configs instead of a grid, comma list of BLOCK_N/WARPS/STAGES[/SPLITS] "
        "(SPLITS default: the mode's), e.g. 64/2/3,128/4/2",
    )
    ap.add_argument(
        "--pdl", action="store_true", help="launch with programmatic dependent launch, as the decode step does"
    )
    ap.add_argument(
        "--sdpa-backends",
        action="store_true",
        help="also time torch SDPA under each fused backend: plain, over 64 more slots behind a mask, and masked "
        "with each KV head's query heads as a query sequence (grouped; scripts/exp/fp16_sdpa.py's call)",
    )
    args = ap.parse_args()
    with programmatic_launch(args.pdl):
        run(args)


def run(args):
    global REDUCE_WARPS
    REDUCE_WARPS = args.reduce_warps
    device = torch.device("cuda")
    torch.manual_seed(0)
    cod = codecs(D, device)
    props = torch.cuda.get_device_properties(device)
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    dtype = torch.bfloat16
    modes = args.modes.split(",")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.once:
        for (b, length), mode in itertools.product(shapes, modes):
            kw = attn_kwargs(mode_kwargs(mode, cod))
            kw["rotated_out"] = bool(default_config(mode, batch=b)["fold_v"])  # as the decode step launches it
            bufs = random_cache(mode, b, length, dtype, device)
            q = torch.randn(b, HQ, D, device=device, dtype=dtype)
            kn, vn = torch.randn(2, b, HKV, D, device=device, dtype=dtype)
            for _ in range(2):  # the first call compiles
                decode_attention(mode, q, kn, vn, bufs, length, 1 / math.sqrt(D), cold_length=length - HOT, **kw)
            torch.cuda.synchronize()
        return
    if args.parts:
        print("\n== GPU time per kernel of one layer's decode step, us (torch.profiler; launch gaps not included) ==")
        print(f"append: {args.append}, reduce warps: {args.reduce_warps or 'default'}")
        print(f"{'batch':>5} {'context':>7} {'mode':17} {'split':>7} {'reduce':>7} {'rotate':>7} {'write':>7}")
        for (b, length), mode in itertools.product(shapes, modes):
            p = profile_parts(mode, b, length, dtype, device, cod, append=args.append)
            cols = " ".join(f"{p[k]:7.2f}" if k in p else f"{'-':>7}" for k in ("split", "reduce", "rotate", "write"))
            print(f"{b:5} {length:7} {mode:17} {cols}")
        return
    if not args.no_check:
        check(device, cod)
    rows = []
    print(
        f"\n== decode attention, one layer: Hq={HQ}, Hkv={HKV}, D={D}, bf16, CUDA graphs; append: {args.append}, PDL: {'on' if args.pdl else 'off'} =="
    )
    print(f"{'batch':>5} {'context':>7} {'kernel':17} {'us':>8} {'TB/s':>6} {'vs sdpa':>7}  config")
    for b, length in shapes:
        sdpa_us, sdpa_bytes = bench_sdpa(b, length, dtype, device)
        rows.append({"batch": b, "context": length, "kernel": "torch-sdpa-fp16", "us": sdpa_us, "kv_bytes": sdpa_bytes})
        print(f"{b:5} {length:7} {'torch-sdpa-fp16':17} {sdpa_us:8.1f} {sdpa_bytes / sdpa_us / 1e6:6.2f} {1:7.2f}")
        for mode in modes:
            cfg = default_config(kernel_mode(mode)[0], batch=b, capacity=length)
            pps, nearest, floor = cfg.pop("programs_per_sm"), cfg.pop("nearest", False), cfg["split_tokens"]
            wave = cfg["wave"]  # read here: not a launch argument, so the filter below drops it
            not_split_knobs = ("deep_stages", "deep_any_occupancy", "fuse_append", "reduce_warps", "hot_in_budget")
            not_split_knobs += tuple(VARIANTS_KEYS)
            for key in not_split_knobs:
                cfg.pop(key, None)
            # as the decode step launches it: a turbo V's output left rotated where it folds W_o (`fold_v`);
            # the other knobs (`maxnreg`, `splits`, `early_release`, ...) decode_attention reads from the config
            cfg["rotated_out"] = bool(cfg.pop("fold_v", False))
            cfg = {k: v for k, v in cfg.items() if k in LAUNCH_ARGS}
            cfg["num_stages"] = None  # as the launcher picks it (launch_stages)
            default_splits = choose_num_splits(b, HKV, length, cfg["block_n"], device, pps, nearest, floor, wave)
            configs = [{"num_splits": None, **cfg}]
            if args.tune and args.configs:
                configs += [
                    explicit_config(c, b, length, pps, nearest, device, floor, wave) for c in args.configs.split(",")
                ]
            elif args.tune:
                configs += tuning_grid(args.grid, default_splits, (cfg["block_n"], cfg["num_warps"]))
            configs = [{"rotated_out": cfg["rotated_out"], **c} for c in configs]
            try:
                results, nbytes = bench_mode(mode, b, length, dtype, device, cod, configs, args.append)
            except Exception as exc:  # keep timing the other modes; report the failure
                print(f"{b:5} {length:7} {mode:17} FAILED: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            (cfg0, us0), (cfg, us) = results[0], min(results, key=lambda r: r[1])
            for label, c, t in [("default", cfg0, us0)] + ([("tuned", cfg, us)] if args.tune else []):
                rows.append({"batch": b, "context": length, "kernel": mode if label == "default" else f"{mode} (tuned)",
                             "us": t, "kv_bytes": nbytes, **c})  # fmt: skip
                cfg_s = " ".join(f"{k}={v}" for k, v in c.items() if k != "resources") + f"  {c['resources']}"
                name = mode if label == "default" else "  tuned"
                print(f"{b:5} {length:7} {name:17} {t:8.1f} {nbytes / t / 1e6:6.2f} {sdpa_us / t:7.2f}  {cfg_s}")
            if args.tune:  # splits/BLOCK_N/warps/stages of the five fastest (of every one given by --configs)
                top = sorted(results[1:], key=lambda r: r[1])[: None if args.configs else 5]
                print(
                    f"        top {len(top)}:",
                    "; ".join(f"{'/'.join(str(v) for k, v in c.items() if k != 'resources')} {t:.1f}" for c, t in top),
                )
        write_csv(rows)
    if args.sdpa_backends:
        rows += sdpa_backends(shapes, dtype, device)
        write_csv(rows)
    print("\n== quantize-on-write of one decode token (K and V, all heads), one layer ==")
    for b in sorted({b for b, _ in shapes}):
        line = "  ".join(
            f"{mode} {bench_write(mode, b, dtype, device, cod):.1f}" for mode in modes if mode in ref.MODES
        )
        print(f"batch {b:3}: us  {line}")
        if args.tune:
            for block_r, warps in itertools.product((1, 2, 4), (1, 2)):
                t = bench_write("turbo4", b, dtype, device, cod, block_r=block_r, num_warps=warps)
                print(f"   turbo4 write block_r={block_r} num_warps={warps}: {t:.1f} us")
    write_csv(rows, final=True)


if __name__ == "__main__":
    main()
