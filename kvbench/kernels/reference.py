"""Plain PyTorch versions of every kernel in this package.

The tests compare each Triton kernel with the function of the same name here,
and the CPU path calls these directly. Math in float32; nothing here is fast.

Storage formats (token axis at dim 2, slots [0, L) valid):

- fp16: ``k``, ``v`` [B, H, cap, D] in the compute dtype.
- int8: ``k``, ``v`` int8 [B, H, cap, D]; ``scales`` bfloat16 [B, H, cap, 2], K's scale
  at [..., 0] and V's at [..., 1] (`int8_scale`: one 4-byte word per token, which the GPU
  kernel loads once for both); value = q * scale with scale = absmax / 127 rounded to
  bfloat16 (1.0 for a zero vector), the codes taken against the rounded scale.
  The int8 cache stores ``v`` token-major (`token_major`: a [B, H, cap, D] view of
  [B, H, D, padded cap] storage) because the int8 tensor-core dot of p @ V wants
  tokens contiguous; the kernels read either layout, the code here does not care.
- turbo (b = 4 or 3 bits): ``<x>_codes`` uint8 [B, H, cap, b*D/8] and
  ``<x>_scale`` float16 [B, H, cap, 1]. r = s2 * H(s1 * x / ||x||), codes = cell
  of r in the codebook, scale = ||x|| / ||c[codes]||, x_hat = s1 * H(s2 * scale * c[codes]).
  4-bit: byte j = code[2j] | code[2j+1] << 4. 3-bit: group g of 8 codes is the
  24-bit little-endian integer sum_i code[8g+i] << 3i, as 3 bytes.
- turbo4-delegated: ``k`` fp16 for all L tokens; V is cold turbo-4 codes for
  tokens [0, C) plus ``v_hot`` [B, H, hot_cap, D] whose slots [0, L - C) hold tokens [C, L).

The turbo helpers here (codebook, signs) are a minimal independent version for
tests; the kernels take the codebook, boundaries and signs as tensors.
"""

from __future__ import annotations

import math

import torch

MODES = ("fp16", "int8", "turbo4-asym", "turbo3-asym", "turbo4", "turbo4-delegated")
#: mode -> (K format, V format)
FORMATS = {
    "fp16": ("float", "float"),
    "int8": ("int8", "int8"),
    "turbo4-asym": ("float", "turbo4"),
    "turbo3-asym": ("float", "turbo3"),
    "turbo4": ("turbo4", "turbo4"),
    "turbo4-delegated": ("float", "delegated"),
}


def token_major(shape, dtype, device, pad: int = 256) -> torch.Tensor:
    """An empty [B, H, cap, D] buffer whose storage is [B, H, D, P] (P = cap rounded up
    to `pad`): each channel's tokens are contiguous. Indexing, copies and the reference
    code see an ordinary [B, H, cap, D] tensor."""
    b, h, cap, d = shape
    padded = -(-max(cap, 1) // pad) * pad
    return torch.empty((b, h, d, padded), dtype=dtype, device=device).transpose(2, 3)[:, :, :cap]


def token_major_stride(buf: torch.Tensor) -> int | None:
    """P if `buf` [B, H, cap, D] is laid out as `token_major` makes it (storage
    [B, H, D, P], P >= cap), else None."""
    if buf.dim() != 4 or buf.shape[3] < 2:
        return None
    b, h, cap, d = buf.shape
    p = buf.stride(3)
    dense = buf.stride(2) == 1 and p >= cap and buf.stride(1) == d * p and (b == 1 or buf.stride(0) == h * d * p)
    return p if dense else None


def _as_int(x: torch.Tensor | int | None) -> int:
    return int(x.reshape(-1)[0]) if isinstance(x, torch.Tensor) else int(x or 0)


# ------------------------------------------------------------------- rotation
def hadamard(dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Orthonormal Sylvester Walsh-Hadamard matrix, float32: H[i, j] = (-1)^popcount(i & j) / sqrt(dim)."""
    i = torch.arange(dim)
    bits = torch.bitwise_and(i[:, None], i[None, :])
    parity = torch.zeros_like(bits)
    while bits.any():
        parity ^= bits & 1
        bits = bits >> 1
    return ((1 - 2 * parity).double() / math.sqrt(dim)).float().to(device)


def random_signs(dim: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (1 - 2 * torch.randint(0, 2, (dim,), generator=g, device="cpu")).float().to(device)


def rotate(x: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """r = s2 * H(s1 * x) along the last dim, float32 (also the query rotation for turbo K)."""
    return s2 * ((s1 * x.float()) @ hadamard(x.shape[-1], x.device))


def unrotate(r: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    return s1 * ((s2 * r.float()) @ hadamard(r.shape[-1], r.device))


# ------------------------------------------------------------------- codebook
def lloyd_max_codebook(bits: int, dim: int, iters: int = 2000) -> torch.Tensor:
    """Centroids (ascending, float32) of the Lloyd-Max quantizer for N(0, 1/dim)."""
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    levels = 1 << bits
    c = normal.icdf((torch.arange(levels, dtype=torch.float64) + 0.5) / levels)
    inf = torch.tensor([math.inf], dtype=torch.float64)
    for _ in range(iters):
        edges = torch.cat([-inf, (c[1:] + c[:-1]) / 2, inf])
        pdf = torch.exp(-0.5 * edges**2) / math.sqrt(2 * math.pi)
        cdf = normal.cdf(edges)
        c = (pdf[:-1] - pdf[1:]) / (cdf[1:] - cdf[:-1])
    return (c / math.sqrt(dim)).float()


def codebook_boundaries(codebook: torch.Tensor) -> torch.Tensor:
    """Cell edges: midpoints of consecutive centroids (computed in float64, stored float32)."""
    c = codebook.double()
    return ((c[1:] + c[:-1]) / 2).float()


# -------------------------------------------------------------------- packing
def pack_codes(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (int, < 2^bits) -> uint8 [..., bits*D/8]."""
    idx = idx.to(torch.int32)
    if bits == 4:
        return (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8)
    g = idx.unflatten(-1, (-1, 8))
    word = sum(g[..., i] << (3 * i) for i in range(8))
    return torch.stack([word & 255, (word >> 8) & 255, word >> 16], -1).flatten(-2).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 [..., bits*D/8] -> codes int64 [..., D]."""
    p = packed.to(torch.int64)
    if bits == 4:
        return torch.stack([p & 15, p >> 4], -1).flatten(-2)
    b = p.unflatten(-1, (-1, 3))
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    return torch.stack([(word >> (3 * i)) & 7 for i in range(8)], -1).flatten(-2)


# ----------------------------------------------------------- quantize / dequantize
def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (int8 [..., D], bfloat16 scale [..., 1]); scale 1.0 only for an all-zero vector.

    The scale absmax / 127 is rounded to bfloat16 (nearest even, relative error <= 2^-8)
    first and the codes are taken against the rounded scale, so every coordinate stays
    within one step: within half a rounded step (<= 0.502 of absmax / 127), and the largest
    lands within 127 / (1 - 2^-8) = 127.498, which rounds to 127. bfloat16 keeps float32's
    exponent range, so no scale underflows (float16 would flush those below 6e-8 to zero:
    a floor of its own)."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale).to(torch.bfloat16)
    return torch.round(xf / scale.float()).clamp(-127, 127).to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()


def int8_scales(shape: tuple[int, int, int], device) -> torch.Tensor:
    """An int8 cache's scale sidecar for [B, H, cap] tokens: bfloat16 [B, H, cap, 2]."""
    return torch.empty((*shape, 2), dtype=torch.bfloat16, device=device)


def int8_scale(buffers: dict[str, torch.Tensor], x: str) -> torch.Tensor:
    """The [B, H, cap, 1] view of side `x` ("k" or "v") in an int8 cache's `scales`."""
    return buffers["scales"][..., :1] if x == "k" else buffers["scales"][..., 1:]


def set_int8_scale(buffers: dict[str, torch.Tensor], x: str, scale: torch.Tensor) -> None:
    """Fill side `x` of `buffers["scales"]` (allocated on first use) with `scale` [B, H, cap, 1]."""
    buffers.setdefault("scales", int8_scales(scale.shape[:3], scale.device))
    int8_scale(buffers, x).copy_(scale)


def turbo_rotated(x: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, n): the rotated unit vector and the norm; what the quantizer bucketizes."""
    xf = x.float()
    n = xf.square().sum(-1, keepdim=True).sqrt()
    return rotate(xf / torch.where(n == 0, torch.ones_like(n), n), s1, s2), n


def quantize_turbo(
    x: torch.Tensor, codebook: torch.Tensor, boundaries: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (packed codes uint8 [..., bits*D/8], float16 scale [..., 1])."""
    r, n = turbo_rotated(x, s1, s2)
    idx = torch.bucketize(r, boundaries.to(r.device))  # = number of boundaries strictly below r
    c = codebook.float().to(r.device)[idx]
    return pack_codes(idx, bits), (n / c.square().sum(-1, keepdim=True).sqrt()).to(torch.float16)


def dequantize_turbo_rotated(packed: torch.Tensor, scale: torch.Tensor, codebook: torch.Tensor, bits: int):
    """scale * c[codes] in the rotated basis, float32."""
    return scale.float() * codebook.float().to(packed.device)[unpack_codes(packed, bits)]


def dequantize_turbo(packed, scale, codebook, s1, s2, bits) -> torch.Tensor:
    return unrotate(dequantize_turbo_rotated(packed, scale, codebook, bits), s1, s2)


# --------------------------------------------------------------- whole cache
def dequantize_cache(
    mode: str,
    buffers: dict[str, torch.Tensor],
    length,
    *,
    cold_length=None,
    k_signs=None,
    k_codebook=None,
    v_signs=None,
    v_codebook=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored tokens [0, L) as float32 K, V [B, H, L, D]."""
    n = _as_int(length)
    kf, vf = FORMATS[mode]
    b = {key: t[:, :, :n] for key, t in buffers.items() if key != "v_hot"}
    if kf == "float":
        k = b["k"].float()
    elif kf == "int8":
        k = dequantize_int8(b["k"], int8_scale(b, "k"))
    else:
        k = dequantize_turbo(b["k_codes"], b["k_scale"], k_codebook, *k_signs, 4)
    if vf == "float":
        v = b["v"].float()
    elif vf == "int8":
        v = dequantize_int8(b["v"], int8_scale(b, "v"))
    elif vf in ("turbo4", "turbo3"):
        v = dequantize_turbo(b["v_codes"], b["v_scale"], v_codebook, *v_signs, int(vf[-1]))
    else:  # delegated: cold codes for [0, C), hot slots [0, L - C) for [C, L)
        c = _as_int(cold_length)
        cold = b["v_codes"][:, :, :c], b["v_scale"][:, :, :c]
        v = torch.cat([dequantize_turbo(*cold, v_codebook, *v_signs, 4), buffers["v_hot"][:, :, : n - c].float()], 2)
    return k, v


def sparse_weights(p: torch.Tensor, tau: float) -> torch.Tensor:
    """Sparse V: softmax weights `p` with every weight below `tau` set to 0 (for the product
    with V only; nothing is renormalised). tau = 0: `p` itself."""
    return p if tau <= 0 else torch.where(p >= tau, p, torch.zeros_like(p))


def decode_attention(
    mode: str,
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    length,
    sm_scale: float,
    *,
    cold_length=None,
    k_signs=None,
    k_codebook=None,
    v_signs=None,
    v_codebook=None,
    out: torch.Tensor | None = None,
    rotated_out: bool = False,
    sparse_v: float = 0.0,
    q_stored_dtype: torch.dtype | None = None,
    **_tuning,
) -> torch.Tensor:
    """One decode step: q [B, Hq, D] attends to stored tokens [0, L) (through the
    mode's storage) plus the fresh k_new, v_new [B, Hkv, D] (exact). Softmax in float32.
    Returns [B, Hq, D] in q's dtype (written into `out` when given); with `rotated_out`
    (turbo V) in V's rotated basis, s2 * H(s1 * o). `sparse_v` = tau > 0: V is skipped
    wherever the softmax weight is below tau (`sparse_weights`). `q_stored_dtype` (e.g.
    float16) rounds q to that dtype for the stored tokens' scores only, as a kernel whose
    dots take q in it does (the fresh token's score keeps q exact); for turbo K the rounding
    is of the rotated query s2 * H(s1 * q), which is what turbo K's dots take."""
    k, v = dequantize_cache(
        mode,
        buffers,
        length,
        cold_length=cold_length,
        k_signs=k_signs,
        k_codebook=k_codebook,
        v_signs=v_signs,
        v_codebook=v_codebook,
    )
    k = torch.cat([k, k_new.float().unsqueeze(2)], 2)
    v = torch.cat([v, v_new.float().unsqueeze(2)], 2)
    bsz, hq, d = q.shape
    g = hq // k.shape[1]
    qg = q.float().view(bsz, k.shape[1], g, d)
    scores = torch.einsum("bhgd,bhtd->bhgt", qg, k)
    if q_stored_dtype is not None:
        if FORMATS[mode][0] == "turbo4":  # turbo K's dots take q rotated into K's basis: rounded there
            qs = unrotate(rotate(qg, *k_signs).to(q_stored_dtype), *k_signs)
        else:
            qs = qg.to(q_stored_dtype).float()
        scores[..., :-1] = torch.einsum("bhgd,bhtd->bhgt", qs, k[:, :, :-1])
    p = sparse_weights(torch.softmax(scores * sm_scale, -1), sparse_v)
    o = torch.einsum("bhgt,bhtd->bhgd", p, v).reshape(bsz, hq, d)
    if rotated_out:
        if not FORMATS[mode][1].startswith(("turbo", "delegated")):
            raise ValueError(f"rotated_out needs a mode whose V is rotated (turbo or delegated V), not {mode}")
        o = rotate(o, *v_signs)
    o = o.to(q.dtype)
    if out is None:
        return o
    out.copy_(o)
    return out


def write_kv(
    mode: str,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    slot,
    *,
    cold_length=None,
    k_signs=None,
    k_codebook=None,
    k_boundaries=None,
    v_signs=None,
    v_codebook=None,
    v_boundaries=None,
    **_tuning,
) -> None:
    """Store T fresh tokens (k_new, v_new [B, H, T, D], or [B, H, D] for T = 1) into
    slots [slot, slot + T) of every buffer (delegated: V into v_hot slots [slot - C, ...))."""
    if k_new.dim() == 3:
        k_new, v_new = k_new.unsqueeze(2), v_new.unsqueeze(2)
    s, t = _as_int(slot), k_new.shape[2]
    kf, vf = FORMATS[mode]
    for x, fmt, signs, cb, bnd in (
        ("k", kf, k_signs, k_codebook, k_boundaries),
        ("v", vf, v_signs, v_codebook, v_boundaries),
    ):
        src = k_new if x == "k" else v_new
        if fmt == "float":
            buffers[x][:, :, s : s + t] = src
        elif fmt == "delegated":
            c = s - _as_int(cold_length)
            buffers["v_hot"][:, :, c : c + t] = src
        elif fmt == "int8":
            buffers[x][:, :, s : s + t], int8_scale(buffers, x)[:, :, s : s + t] = quantize_int8(src)
        else:
            codes, scale = quantize_turbo(src, cb, bnd, *signs, int(fmt[-1]))
            buffers[x + "_codes"][:, :, s : s + t], buffers[x + "_scale"][:, :, s : s + t] = codes, scale
