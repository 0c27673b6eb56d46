"""Quantize-on-write: one launch stores the fresh K and V of every (batch, head) in a
cache slot, in the mode's format (see `reference.py` for the formats and the math).

Also the Walsh-Hadamard helpers the decode kernels share, and `rotate` (the query
rotation for turbo K). The WHT of a row of D values runs as log2(D) butterfly stages
(x[i] +- x[i ^ h]) in float32: exact enough to bucketize against the reference, no
tensor-core shape limits, and (unlike broadcast products over an [A, C] view of the row)
no round trips through shared memory.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvbench.kernels.launch import pdl_enter, pdl_kwargs
from kvbench.kernels.reference import FORMATS, int8_scale, token_major_stride

# storage formats: the kernels' constexpr switches (HOT: the fp16 hot window of delegated V)
FORMAT_IDS = {"float": 0, "int8": 1, "turbo4": 2, "turbo3": 3, "hot": 4, "delegated": 5}
FLOAT, INT8, TURBO4, TURBO3, HOT, DELEGATED = (tl.constexpr(i) for i in FORMAT_IDS.values())


@triton.jit
def _wht(x, R: tl.constexpr, D: tl.constexpr, INV_SQRT_D: tl.constexpr):
    """Orthonormal Walsh-Hadamard transform of each row of x [R, D] (float32): log2(D)
    butterfly stages of pairs (reshape, split, join). The reduction kernel with it took 744
    instructions for a turbo V mode, against 904 with the [8, 16] x [16, 16] broadcast-and-sum
    products it replaced (fp16's: 672; sm_90, triton 3.6, ahead of time)."""
    for i in tl.static_range(8):  # stage i pairs x[j] with x[j ^ 2^i]; D <= 256 (wht_params)
        if (1 << i) < D:
            y = tl.permute(tl.reshape(x, [R, D // (2 << i), 2, 1 << i]), (0, 1, 3, 2))
            a, b = tl.split(y)
            x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), [R, D])
    return x * INV_SQRT_D


@triton.jit
def _rint(y):
    """Round half to even (torch.round), exact for |y| < 2^22."""
    f = tl.floor(y)
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    frac = y - f
    return f + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)


@triton.jit
def _store_rows(
    X,
    DST,
    SCALE,
    S1,
    S2,
    CB,
    BND,
    SLOT,
    COLD,
    row0,
    n_rows,
    H,
    T,
    stride_xb,
    stride_xh,
    stride_xt,
    cap,
    stride_d,
    FMT: tl.constexpr,
    TOKEN_MAJOR: tl.constexpr,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):
    """Store rows [row0, row0 + BLOCK_R) of x [B, H, T, D] (row = (b * H + h) * T + t) at token slot + t."""
    rows = row0 + tl.arange(0, BLOCK_R)
    rmask = rows < n_rows
    t = rows % T
    bh = rows // T
    d = tl.arange(0, D)
    src = (bh // H).to(tl.int64) * stride_xb + (bh % H) * stride_xh + t * stride_xt
    x = tl.load(X + src[:, None] + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    slot = tl.load(SLOT)
    if FMT == HOT:
        slot -= tl.load(COLD)
    _quantize_store(x, bh, slot + t, rmask, DST, SCALE, S1, S2, CB, BND, cap, stride_d, FMT, TOKEN_MAJOR, D,
                    BLOCK_R, INV_SQRT_D)  # fmt: skip


@triton.jit
def _quantize_store(
    x,
    bh,
    slots,
    rmask,
    DST,
    SCALE,
    S1,
    S2,
    CB,
    BND,
    cap,
    stride_d,
    FMT: tl.constexpr,
    TOKEN_MAJOR: tl.constexpr,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):
    """Store x [BLOCK_R, D] (float32) in format FMT: row r at token `slots[r]` of cache row
    `bh[r]` (= b * H + h). TOKEN_MAJOR (int8 only): DST's storage is [B, H, D, stride_d]
    (see `reference.token_major`)."""
    d = tl.arange(0, D)
    dst = bh.to(tl.int64) * cap + slots  # token row in [B, H, cap, ...]
    if FMT == FLOAT or FMT == HOT:  # noqa: SIM109 (no `in` on constexprs in triton)
        tl.store(DST + dst[:, None] * D + d[None, :], x.to(DST.dtype.element_ty), mask=rmask[:, None])
    elif FMT == INT8:
        scale = tl.math.div_rn(tl.max(tl.abs(x), 1), 127.0)
        scale = tl.where(scale == 0.0, 1.0, scale)  # zero guard only: a tiny scale stays tiny
        # rounded to bfloat16 (nearest even, on the bits: exact in the interpreter too) before
        # the codes are taken against it, as `reference.quantize_int8` does; stored exactly
        bits = scale.to(tl.uint32, bitcast=True)
        scale = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        q = tl.minimum(tl.maximum(_rint(tl.math.div_rn(x, scale[:, None])), -127.0), 127.0)
        if TOKEN_MAJOR:
            ptr = DST + (bh.to(tl.int64) * D * stride_d + slots)[:, None] + d[None, :] * stride_d
        else:
            ptr = DST + dst[:, None] * D + d[None, :]
        tl.store(ptr, q.to(tl.int8), mask=rmask[:, None])
        tl.store(SCALE + dst * 2, scale, mask=rmask)  # `scales` [B, H, cap, 2]: SCALE is this side's plane
    else:
        BITS: tl.constexpr = 4 if FMT == TURBO4 else 3
        CPG: tl.constexpr = 2 if BITS == 4 else 8  # codes per packed group
        BPG: tl.constexpr = CPG * BITS // 8  # bytes per packed group
        NG: tl.constexpr = D // CPG
        n = tl.sqrt_rn(tl.sum(x * x, 1))
        # R(x / n) as R(x) * (1 / n): one division per row, not one per coordinate (the IEEE
        # division's sequence is what made this write the reduction's longest step), and the
        # rotation does not wait for the norm's reduction. A zero vector divides by 1.
        inv_n = tl.math.div_rn(1.0, tl.where(n == 0.0, 1.0, n))
        r = _wht(x * tl.load(S1 + d)[None, :], BLOCK_R, D, INV_SQRT_D)
        r = r * (tl.load(S2 + d)[None, :] * inv_n[:, None])
        # cell = number of boundaries below r; its centroid picked in registers as the count
        # rises (boundaries ascend), so no gather waits on the count
        idx = tl.zeros([BLOCK_R, D], dtype=tl.int32)
        c = tl.zeros([BLOCK_R, D], dtype=tl.float32) + tl.load(CB)
        for i in tl.static_range((1 << BITS) - 1):
            above = r > tl.load(BND + i)
            idx += above.to(tl.int32)
            c = tl.where(above, tl.load(CB + i + 1).to(tl.float32), c)
        s = tl.math.div_rn(n, tl.sqrt_rn(tl.sum(c * c, 1)))
        tl.store(SCALE + dst, s.to(tl.float16), mask=rmask)
        shifts = tl.arange(0, CPG) * BITS
        word = tl.sum(tl.reshape(idx, [BLOCK_R, NG, CPG]) << shifts[None, None, :], axis=2)
        g = tl.arange(0, NG)
        for k in tl.static_range(BPG):
            ptr = DST + dst[:, None] * (NG * BPG) + (g * BPG + k)[None, :]
            tl.store(ptr, ((word >> (8 * k)) & 255).to(tl.uint8), mask=rmask[:, None])


@triton.jit
def _write_kv_kernel(
    XK,
    XV,
    DK,
    SK,
    S1K,
    S2K,
    CBK,
    BNK,
    DV,
    SV,
    S1V,
    S2V,
    CBV,
    BNV,
    SLOT,
    COLD,
    n_rows,
    H,
    T,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    cap_k,
    cap_v,
    v_stride_d,
    K_FMT: tl.constexpr,
    V_FMT: tl.constexpr,
    V_TOKEN_MAJOR: tl.constexpr,
    D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):
    # grid: (cdiv(B * H * T, BLOCK_R), 2): a block of token-head rows; axis 1 picks K (0) or V (1)
    row0 = tl.program_id(0) * BLOCK_R
    if tl.program_id(1) == 0:
        _store_rows(XK, DK, SK, S1K, S2K, CBK, BNK, SLOT, COLD, row0, n_rows, H, T,
                    stride_kb, stride_kh, stride_kt, cap_k, 0, K_FMT, False, D, BLOCK_R, INV_SQRT_D)  # fmt: skip
    else:
        _store_rows(XV, DV, SV, S1V, S2V, CBV, BNV, SLOT, COLD, row0, n_rows, H, T,
                    stride_vb, stride_vh, stride_vt, cap_v, v_stride_d, V_FMT, V_TOKEN_MAJOR, D, BLOCK_R,
                    INV_SQRT_D)  # fmt: skip


@triton.jit
def _rotate_kernel(
    X, Y, S1, S2, n_rows, stride_x, D: tl.constexpr, BLOCK_R: tl.constexpr, INV_SQRT_D: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # grid: (cdiv(n_rows, BLOCK_R),): one program rotates BLOCK_R rows, y = s2 * H(s1 * x)
    pdl_enter(PDL, False)  # the split grid starts once this kernel is off the SMs
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, D)
    mask = (rows < n_rows)[:, None]
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_x + d[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _wht(x * tl.load(S1 + d)[None, :], BLOCK_R, D, INV_SQRT_D) * tl.load(S2 + d)[None, :]
    tl.store(Y + rows[:, None].to(tl.int64) * D + d[None, :], y, mask=mask)


# ------------------------------------------------------------------- launchers
def wht_params(dim: int) -> dict:
    """Constexpr arguments of `_wht` for head dim `dim` (a power of two)."""
    if dim < 2 or dim & (dim - 1) or dim > 256:
        raise ValueError(f"the Walsh-Hadamard kernels need a power-of-two head dim <= 256, got {dim}")
    return {"INV_SQRT_D": 1.0 / math.sqrt(dim)}


def buffer_layout(kernel: str, key: str, fmt: str, buf: torch.Tensor) -> int | None:
    """How the kernels index cache buffer `key` (of storage format `fmt`): None for a
    contiguous [B, H, cap, W]; P for int8 V stored token-major (`reference.token_major`,
    storage [B, H, D, P]); anything else is refused."""
    if buf.is_contiguous():
        return None
    stride = token_major_stride(buf) if key == "v" and fmt == "int8" else None
    if stride is None:
        raise ValueError(f"{kernel} needs contiguous cache buffers [B, H, capacity, ...] ({key!r} is not)")
    return stride


def device_int(x: torch.Tensor | int, device: torch.device) -> torch.Tensor:
    """A device int32 [1] tensor (pass one to keep launches allocation-free)."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.tensor([x], dtype=torch.int32, device=device)


def rotate(x: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """r = s2 * H(s1 * x) along the last dim, float32 (the query rotation for turbo K)."""
    dim = x.shape[-1]
    rows = x.reshape(-1, dim)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    block_r = 1
    grid = (triton.cdiv(rows.shape[0], block_r),)
    _rotate_kernel[grid](
        rows, out, s1, s2, rows.shape[0], rows.stride(0), D=dim, BLOCK_R=block_r, num_warps=1, **wht_params(dim),
        **pdl_kwargs(rows),
    )  # fmt: skip
    return out


def write_operands(
    kernel: str,
    mode: str,
    buffers: dict[str, torch.Tensor],
    dim: int,
    k_signs=None,
    k_codebook=None,
    k_boundaries=None,
    v_signs=None,
    v_codebook=None,
    v_boundaries=None,
) -> tuple[list, list, dict]:
    """What `_store_rows` needs to store a token of `mode` into `buffers`, for K then V:
    tensors [DK, SK, S1K, S2K, CBK, BNK, DV, SV, S1V, S2V, CBV, BNV] (unused ones are
    stand-ins), sizes [cap_k, cap_v, v_stride_d] and constexprs K_FMT, V_FMT,
    V_TOKEN_MAJOR, INV_SQRT_D. Shared by `write_kv` and the decode reduction that
    appends the fresh token (`decode_attention(..., append=True)`)."""
    kf, vf = FORMATS[mode]

    def side(x, fmt, signs, codebook, bnd):
        if fmt in ("float", "delegated"):
            dst = buffers["v_hot" if fmt == "delegated" else x]
            return [dst, dst, dst, dst, dst, dst], FORMAT_IDS["hot" if fmt == "delegated" else "float"]
        data = buffers[x] if fmt == "int8" else buffers[x + "_codes"]
        if fmt == "int8":  # this side's plane of `scales` (its first element; tokens 2 apart)
            scale = int8_scale(buffers, x)
            return [data, scale, scale, scale, scale, scale], FORMAT_IDS["int8"]
        scale = buffers[x + "_scale"]
        return [data, scale, *signs, codebook, bnd], FORMAT_IDS[fmt]

    k_side, k_fmt = side("k", kf, k_signs, k_codebook, k_boundaries)
    v_side, v_fmt = side("v", vf, v_signs, v_codebook, v_boundaries)
    buffer_layout(kernel, "k", kf, k_side[0])
    v_stride = buffer_layout(kernel, "v", vf, v_side[0])
    turbo = any(f.startswith("turbo") for f in (kf, vf))
    consts = {"K_FMT": k_fmt, "V_FMT": v_fmt, "V_TOKEN_MAJOR": v_stride is not None}
    consts.update(wht_params(dim) if turbo else {"INV_SQRT_D": 1.0})
    return k_side + v_side, [k_side[0].shape[2], v_side[0].shape[2], v_stride or 0], consts


def write_kv(
    mode: str,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    slot: torch.Tensor | int,
    *,
    cold_length: torch.Tensor | int | None = None,
    k_signs: tuple[torch.Tensor, torch.Tensor] | None = None,
    k_codebook: torch.Tensor | None = None,
    k_boundaries: torch.Tensor | None = None,
    v_signs: tuple[torch.Tensor, torch.Tensor] | None = None,
    v_codebook: torch.Tensor | None = None,
    v_boundaries: torch.Tensor | None = None,
    block_r: int = 1,
    num_warps: int = 1,
) -> None:
    """Store T fresh tokens (k_new, v_new [B, H, T, D], or [B, H, D] for T = 1; last dim
    contiguous) into slots [slot, slot + T) of `buffers`, quantized in the mode's format;
    delegated mode writes V into v_hot slots [slot - C, slot - C + T). One launch.

    Turbo sides need their signs (s1, s2) float32 [D], codebook float32 [2^b] and
    boundaries float32 [2^b - 1]. `slot` / `cold_length`: device int32 [1] tensors (or ints).
    One row per single-warp program: its reductions stay in shuffles (3 us for a turbo
    token on an H200, against 8 us with 4 rows on 4 warps).
    """
    if k_new.dim() == 3:
        k_new, v_new = k_new.unsqueeze(2), v_new.unsqueeze(2)
    b, h, t, dim = k_new.shape
    dev = k_new.device
    slot = device_int(slot, dev)
    cold = device_int(cold_length if cold_length is not None else 0, dev)
    for x in (k_new, v_new):
        if x.stride(-1) != 1:
            raise ValueError("write_kv needs k_new / v_new with a contiguous last dim")
    tensors, sizes, consts = write_operands(
        "write_kv", mode, buffers, dim, k_signs, k_codebook, k_boundaries, v_signs, v_codebook, v_boundaries
    )
    n_rows = b * h * t
    grid = (triton.cdiv(n_rows, block_r), 2)
    _write_kv_kernel[grid](
        k_new, v_new, *tensors, slot, cold, n_rows, h, t, *k_new.stride()[:3], *v_new.stride()[:3], *sizes,
        D=dim, BLOCK_R=block_r, num_warps=num_warps, **consts,
    )  # fmt: skip
