"""Fused Triton kernels for the decode step's elementwise work (one launch each
where eager PyTorch takes several):

- `rmsnorm`: RMSNorm over the last dim, optionally fused with the residual add
  before it (h = x + residual, written back, then normalised).
- `rope_qk`: split of the fused qkv projection into q, k, v [B, H, T, D],
  optional per-head q/k RMSNorm (Qwen3), RoPE (rotate_half layout) on q and k.
- `silu_mul`: silu(gate) * up from the fused gate|up projection.

Each kernel rounds to the model dtype where the eager PyTorch code in
`kvbench.engine.model` does (references in `fused_ops_reference`), and is
compiled with fp fusion off so no multiply-add contracts past such a rounding:
16-bit results agree with eager bit for bit but for a rare last-bit flip (fp32
reduction order, approximate rsqrt/exp).

Inside `kernels.launch.programmatic_launch()` each kernel launches with programmatic
dependent launch (sm_90+): it waits for the previous kernel before touching memory.

Launchers take inputs with any strides (a copy only if the last dim is not
unit-stride), never allocate when the `out=` buffers are given (CUDA-graph
friendly) and never synchronise. Tensors that are neither on CUDA nor under
`TRITON_INTERPRET=1` take the PyTorch reference.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kvbench.kernels import fused_ops_reference as ref
from kvbench.kernels.launch import pdl_enter, pdl_kwargs
from kvbench.kernels.prefetch import l2_prefetch, launch_args
from kvbench.kernels.quantize import _wht, wht_params
from kvbench.kernels.reference import rotate as rotate_reference

__all__ = ["rmsnorm", "rope_qk", "silu_mul"]

# One row of RMSNorm lives in registers in one program; past this the tile spills.
MAX_RMSNORM_DIM = 16384


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _rows_in(t: torch.Tensor, n: int) -> torch.Tensor:
    """t [..., n] as a [rows, n] tensor with a unit last stride; a view when the
    leading dims collapse (also for slices such as x[:, -1:]), else a copy."""
    t = _unit_last(t)
    try:
        return t.view(-1, n)
    except RuntimeError:
        return t.reshape(-1, n)


def _rows_out(t: torch.Tensor, n: int, name: str) -> torch.Tensor:
    """Like `_rows_in` for an output buffer: a view or an error, never a copy."""
    try:
        v = t.view(-1, n)
    except RuntimeError:
        v = None
    if v is None or (n > 1 and v.stride(1) != 1):
        raise ValueError(f"{name}: buffer of shape {tuple(t.shape)} and strides {t.stride()} is not a [rows, {n}] view")
    return v


def _check_out(t: torch.Tensor, shape, dtype: torch.dtype, device, name: str) -> None:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device:
        raise ValueError(
            f"{name}: expected {tuple(shape)} {dtype} on {device}, got {tuple(t.shape)} {t.dtype} on {t.device}"
        )


# ---------------------------------------------------------------------------
# RMSNorm (+ residual add)
# ---------------------------------------------------------------------------


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    r_ptr,
    h_ptr,
    w_ptr,
    y_ptr,
    N,
    s_x,
    s_r,
    s_h,
    s_y,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    dt = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * s_x + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + row * s_r + cols, mask=m, other=0.0).to(tl.float32)
        # torch adds in fp32 and rounds once to the dtype: so do we.
        h = (x + r).to(dt)
        tl.store(h_ptr + row * s_h + cols, h, mask=m)
        x = h.to(tl.float32)
    var = tl.sum(x * x, axis=0) / N
    rstd = tl.rsqrt(var + eps)
    y = (x * rstd).to(dt).to(tl.float32)  # normalised in fp32, cast to dtype
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * s_y + cols, (y * w).to(y_ptr.dtype.element_ty), mask=m)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [..., N] over N with `weight` [N].

    Without `residual`: returns norm(x). With `residual` (same shape and dtype
    as x): h = x + residual (rounded to the dtype), returns (norm(h), h); h goes
    into `residual_out` when given (may be `residual` or `x` itself: each row is
    read whole before it is written). `out` may also alias x. The output dtype
    is that of `weight * x` (the dtype when the weight is in it).
    """
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight: expected ({n},), got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError("residual must have x's shape and dtype")
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    if out is not None:
        _check_out(out, x.shape, out_dtype, x.device, "out")
    if residual_out is not None:
        _check_out(residual_out, x.shape, x.dtype, x.device, "residual_out")

    if not _use_triton(x):
        res = ref.rmsnorm_reference(x, weight, eps, residual)
        y, h = res if residual is not None else (res, None)
        if out is not None:
            y = out.copy_(y)
        if h is not None and residual_out is not None:
            h = residual_out.copy_(h)
        return y if residual is None else (y, h)

    block = triton.next_power_of_2(n)
    if block > MAX_RMSNORM_DIM:
        raise ValueError(f"rmsnorm: last dim {n} > {MAX_RMSNORM_DIM}")
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out if residual is None else (out, residual_out)

    x2 = _rows_in(x, n)
    y2 = _rows_out(out, n, "out")
    if residual is not None:
        r2 = _rows_in(residual, n)
        h2 = _rows_out(residual_out, n, "residual_out")
    else:
        r2 = h2 = x2  # unused (HAS_RES=False)
    w = _unit_last(weight)
    _rmsnorm_kernel[(x2.shape[0],)](
        x2,
        r2,
        h2,
        w,
        y2,
        n,
        x2.stride(0),
        r2.stride(0),
        h2.stride(0),
        y2.stride(0),
        float(eps),
        HAS_RES=residual is not None,
        BLOCK=block,
        num_warps=max(1, min(16, block // 256)),
        enable_fp_fusion=False,
        **pdl_kwargs(x2),
    )
    return out if residual is None else (out, residual_out)


# ---------------------------------------------------------------------------
# qkv split + q/k RMSNorm + RoPE
# ---------------------------------------------------------------------------


@triton.jit
def _rope_qk_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    T,
    HQ,
    HKV,
    D,
    eps,
    s_xb,
    s_xt,
    s_cb,
    s_ct,
    s_sb,
    s_st,
    s_qb,
    s_qh,
    s_qt,
    s_kb,
    s_kh,
    s_kt,
    s_vb,
    s_vh,
    s_vt,
    HAS_QN: tl.constexpr,
    HAS_KN: tl.constexpr,
    HB: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PF_TABLE=None,
    PF_LEN=None,
    pf_budget=0,
    PF_REGIONS: tl.constexpr = 0,
    PF_NT: tl.constexpr = 128,
    PF_EVICT_LAST: tl.constexpr = False,
    PF_LINES: tl.constexpr = False,
    PDL: tl.constexpr = False,
    QR_ptr=None,
    S1_ptr=None,
    S2_ptr=None,
    s_rb=0,
    s_rh=0,
    QROT: tl.constexpr = False,
    INV_SQRT_D: tl.constexpr = 1.0,
):
    # One program: one token (b, t) x HB consecutive heads of the [q | k | v]
    # head axis (a contiguous chunk of the qkv row). QROT (T = 1, BLOCK_D = D): the q heads
    # also leave rotated for a turbo K, s2 * H(s1 * q) in float32, into QR [B, Hq, D].
    if PDL and PF_REGIONS > 0:  # the attention's cache is not the QKV GEMV's output: ask L2 for it first
        l2_prefetch(PF_TABLE, PF_LEN, pf_budget, PF_TABLE, PF_REGIONS, PF_NT, PF_EVICT_LAST, PF_LINES)
    pdl_enter(PDL, False)  # the attention's split grid starts once this kernel is off the SMs
    pid = tl.program_id(0)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    h = (tl.program_id(1) * HB + tl.arange(0, HB)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    half = D // 2
    dp = tl.where(d < half, d + half, d - half)  # rotate_half partner column
    dm = d < D
    is_q = h < HQ
    is_k = (h >= HQ) & (h < HQ + HKV)
    is_v = (h >= HQ + HKV) & (h < HQ + 2 * HKV)
    m = (h < HQ + 2 * HKV)[:, None] & dm[None, :]
    dt = qkv_ptr.dtype.element_ty

    row = qkv_ptr + b * s_xb + t * s_xt + h[:, None] * D
    x = tl.load(row + d[None, :], mask=m, other=0.0).to(tl.float32)
    xp = tl.load(row + dp[None, :], mask=m, other=0.0).to(tl.float32)
    v_val = x

    if HAS_QN or HAS_KN:
        # Per-head RMSNorm over D, like RMSNorm: fp32, cast, times weight in dtype.
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        xn = (x * rstd).to(dt).to(tl.float32)
        xpn = (xp * rstd).to(dt).to(tl.float32)
        if HAS_QN:
            w = tl.load(qw_ptr + d, mask=dm, other=0.0).to(tl.float32)[None, :]
            wp = tl.load(qw_ptr + dp, mask=dm, other=0.0).to(tl.float32)[None, :]
            x = tl.where(is_q[:, None], (xn * w).to(dt).to(tl.float32), x)
            xp = tl.where(is_q[:, None], (xpn * wp).to(dt).to(tl.float32), xp)
        if HAS_KN:
            w = tl.load(kw_ptr + d, mask=dm, other=0.0).to(tl.float32)[None, :]
            wp = tl.load(kw_ptr + dp, mask=dm, other=0.0).to(tl.float32)[None, :]
            x = tl.where(is_k[:, None], (xn * w).to(dt).to(tl.float32), x)
            xp = tl.where(is_k[:, None], (xpn * wp).to(dt).to(tl.float32), xp)

    # x * cos + rotate_half(x) * sin, each product and the sum rounded to dtype.
    c = tl.load(cos_ptr + b * s_cb + t * s_ct + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + b * s_sb + t * s_st + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    sign = tl.where(d < half, -1.0, 1.0)[None, :]
    a = (x * c).to(dt).to(tl.float32)
    r = ((sign * xp) * s).to(dt).to(tl.float32)
    y = (a + r).to(dt)

    col = d[None, :]
    hh = h[:, None]
    tl.store(q_ptr + b * s_qb + hh * s_qh + t * s_qt + col, y, mask=m & is_q[:, None])
    tl.store(k_ptr + b * s_kb + (hh - HQ) * s_kh + t * s_kt + col, y, mask=m & is_k[:, None])
    tl.store(v_ptr + b * s_vb + (hh - HQ - HKV) * s_vh + t * s_vt + col, v_val.to(dt), mask=m & is_v[:, None])
    if QROT:  # as `quantize.rotate` does from the stored q: the same float32 butterflies per row
        s1 = tl.load(S1_ptr + d).to(tl.float32)[None, :]
        s2 = tl.load(S2_ptr + d).to(tl.float32)[None, :]
        yr = _wht(y.to(tl.float32) * s1, HB, BLOCK_D, INV_SQRT_D) * s2
        tl.store(QR_ptr + b * s_rb + hh * s_rh + col, yr, mask=m & is_q[:, None])


def _cos_strides(c: torch.Tensor, b: int, t: int, d: int, name: str) -> tuple[int, int]:
    if c.dim() == 2 and tuple(c.shape) == (t, d):
        return 0, c.stride(0)
    if c.dim() == 3 and c.shape[0] in (1, b) and tuple(c.shape[1:]) == (t, d):
        return (c.stride(0) if c.shape[0] == b and b > 1 else 0), c.stride(1)
    raise ValueError(f"{name}: expected [{t}, {d}] or [{b}, {t}, {d}], got {tuple(c.shape)}")


def rope_qk(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    prefetch: tuple | None = None,
    q_rot: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused qkv projection [B, T, (Hq + 2 Hkv) * D] (or [B, N] for T = 1)
    -> (q [B, Hq, T, D], k [B, Hkv, T, D], v [B, Hkv, T, D]) in one launch.

    q and k get RoPE (rotate_half layout; cos/sin [T, D] as from
    `rope_cos_sin`, or [B, T, D] for per-sequence positions), after a per-head
    RMSNorm over D with `q_norm` / `k_norm` weights [D] when given (Qwen3,
    with `eps`). `out=(q, k, v)` writes into preallocated tensors of those
    shapes with any strides (e.g. a slice of a [B, H, Tmax, D] cache) as long as
    the last one is 1; fresh outputs are contiguous. All in qkv's dtype.

    `prefetch=(table, L, budget, evict_last, lines)`: under PDL, before waiting for the QKV
    GEMV, the programs ask L2 for the attention's cache (`kernels.prefetch`: a `region_table`,
    the device length L, a byte budget, the L2 policy, line by line or in bulk); ignored
    without PDL.

    `q_rot=(out, s1, s2)`: also writes the rotated query a turbo K scores against (T = 1, head_dim
    a power of two), out[b, h] = s2 * H(s1 * q[b, h, 0]) in float32 ([B, Hq, D], unit last stride),
    exactly as `quantize.rotate(q[:, :, 0], s1, s2)` computes it, so the decode step needs no
    launch of its own for it.
    """
    hq, hk, d = n_heads, n_kv_heads, head_dim
    if d % 2:
        raise ValueError(f"head_dim must be even, got {d}")
    q3 = qkv[:, None] if qkv.dim() == 2 else qkv
    if q3.dim() != 3 or q3.shape[-1] != (hq + 2 * hk) * d:
        raise ValueError(f"qkv: expected [B, T, {(hq + 2 * hk) * d}], got {tuple(qkv.shape)}")
    bsz, t, _ = q3.shape
    shapes = ((bsz, hq, t, d), (bsz, hk, t, d), (bsz, hk, t, d))
    if out is not None:
        for o, shp, name in zip(out, shapes, ("q", "k", "v"), strict=True):
            _check_out(o, shp, qkv.dtype, qkv.device, f"out[{name}]")
            if o.stride(-1) != 1 and d > 1:
                raise ValueError(f"out[{name}] needs a unit last stride")
    for wname, wt in (("q_norm", q_norm), ("k_norm", k_norm)):
        if wt is not None and tuple(wt.shape) != (d,):
            raise ValueError(f"{wname}: expected ({d},), got {tuple(wt.shape)}")

    if q_rot is not None:
        wht_params(d)  # a power of two <= 256, else a clear error
        if t != 1:
            raise ValueError(f"q_rot: one token per sequence (decode), got {t}")
        _check_out(q_rot[0], (bsz, hq, d), torch.float32, qkv.device, "q_rot[0]")
        if q_rot[0].stride(-1) != 1:
            raise ValueError("q_rot[0] needs a unit last stride")

    if not _use_triton(qkv):
        res = ref.rope_qk_reference(q3, cos, sin, hq, hk, d, q_norm, k_norm, eps)
        if out is not None:
            res = tuple(o.copy_(r) for o, r in zip(out, res, strict=True))
        if q_rot is not None:
            q_rot[0].copy_(rotate_reference(res[0][:, :, 0], q_rot[1], q_rot[2]))
        return res

    if out is None:
        out = tuple(torch.empty(shp, dtype=qkv.dtype, device=qkv.device) for shp in shapes)
    q_o, k_o, v_o = out
    if q3.numel() == 0:
        return q_o, k_o, v_o
    q3 = _unit_last(q3)
    cos, sin = _unit_last(cos), _unit_last(sin)
    s_cb, s_ct = _cos_strides(cos, bsz, t, d, "cos")
    s_sb, s_st = _cos_strides(sin, bsz, t, d, "sin")
    qw = _unit_last(q_norm) if q_norm is not None else q3
    kw = _unit_last(k_norm) if k_norm is not None else q3

    block_d = triton.next_power_of_2(d)
    n_rows = hq + 2 * hk
    hb = min(triton.next_power_of_2(n_rows), max(1, 1024 // block_d))
    grid = (bsz * t, triton.cdiv(n_rows, hb))
    warps = 4 if hb * block_d >= 1024 else 2
    pdl = pdl_kwargs(q3)
    pf = launch_args(prefetch, warps, pdl["PDL"])
    _rope_qk_kernel[grid](
        q3,
        cos,
        sin,
        qw,
        kw,
        q_o,
        k_o,
        v_o,
        t,
        hq,
        hk,
        d,
        float(eps),
        q3.stride(0),
        q3.stride(1),
        s_cb,
        s_ct,
        s_sb,
        s_st,
        q_o.stride(0),
        q_o.stride(1),
        q_o.stride(2),
        k_o.stride(0),
        k_o.stride(1),
        k_o.stride(2),
        v_o.stride(0),
        v_o.stride(1),
        v_o.stride(2),
        HAS_QN=q_norm is not None,
        HAS_KN=k_norm is not None,
        HB=hb,
        BLOCK_D=block_d,
        **pf,
        **_q_rot_args(q_rot, d),
        num_warps=warps,
        enable_fp_fusion=False,  # else x*cos + r contracts to one fma: one rounding, not eager's two
        **pdl,
    )
    return q_o, k_o, v_o


def _q_rot_args(q_rot, d: int) -> dict:
    if q_rot is None:
        return {}
    out, s1, s2 = q_rot
    return dict(QR_ptr=out, S1_ptr=s1, S2_ptr=s2, s_rb=out.stride(0), s_rh=out.stride(1), QROT=True, **wht_params(d))


# ---------------------------------------------------------------------------
# silu(gate) * up
# ---------------------------------------------------------------------------


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, n_inter, s_x, s_y, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < n_inter
    dt = x_ptr.dtype.element_ty
    g = tl.load(x_ptr + row * s_x + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * s_x + n_inter + cols, mask=m, other=0.0).to(tl.float32)
    # F.silu computes x / (1 + exp(-x)) in fp32 and rounds; the product rounds again.
    s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(y_ptr + row * s_y + cols, (s * u).to(y_ptr.dtype.element_ty), mask=m)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [..., 2I] (gate first, then up) -> silu(gate) * up [..., I]."""
    n2 = gate_up.shape[-1]
    if n2 % 2:
        raise ValueError(f"gate_up: last dim must be even, got {n2}")
    inter = n2 // 2
    shape = (*gate_up.shape[:-1], inter)
    if out is not None:
        _check_out(out, shape, gate_up.dtype, gate_up.device, "out")

    if not _use_triton(gate_up):
        y = ref.silu_mul_reference(gate_up)
        return y if out is None else out.copy_(y)

    if out is None:
        out = torch.empty(shape, dtype=gate_up.dtype, device=gate_up.device)
    if gate_up.numel() == 0:
        return out
    x2 = _rows_in(gate_up, n2)
    y2 = _rows_out(out, inter, "out")
    rows = x2.shape[0]
    # Aim for ~2 waves of programs on a 132-SM GPU, 256..2048 columns each.
    block = min(2048, max(256, triton.next_power_of_2(triton.cdiv(rows * inter, 264))))
    block = min(block, max(256, triton.next_power_of_2(inter)))
    grid = (rows, triton.cdiv(inter, block))
    _silu_mul_kernel[grid](
        x2,
        y2,
        inter,
        x2.stride(0),
        y2.stride(0),
        BLOCK=block,
        num_warps=max(1, block // 256),
        enable_fp_fusion=False,
        **pdl_kwargs(x2),
    )
    return out
