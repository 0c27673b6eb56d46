"""Plain PyTorch references for the fused decode kernels in `fused_ops`.

Each reference does exactly what the model in `kvbench.engine.model` does, in
the same order of operations (so in the same rounding): the Triton kernels are
tested against these, and these are the CPU path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.engine.rope import apply_rope


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # kvbench.engine.model.RMSNorm.forward: normalise in fp32, scale in dtype.
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def rmsnorm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; with `residual`, (norm(x + residual), x + residual)."""
    if residual is None:
        return _rmsnorm(x, weight, eps)
    h = x + residual
    return _rmsnorm(h, weight, eps), h


def rope_qk_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv [B, T, (Hq + 2 Hkv) * D] (or [B, N] for T = 1), cos/sin [T, D] or
    [B, T, D] -> q [B, Hq, T, D], k [B, Hkv, T, D] (per-head RMSNorm if given,
    then RoPE), v [B, Hkv, T, D]; as `Attention.forward` does it."""
    if qkv.dim() == 2:
        qkv = qkv[:, None]
    b, t, _ = qkv.shape
    hq, hk, d = n_heads, n_kv_heads, head_dim
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q = q.view(b, t, hq, d)
    k = k.view(b, t, hk, d)
    v = v.view(b, t, hk, d)
    if q_norm is not None:
        q = _rmsnorm(q, q_norm, eps)
    if k_norm is not None:
        k = _rmsnorm(k, k_norm, eps)
    if cos.dim() == 3:  # per-sequence positions: [B, T, D] -> [B, 1, T, D]
        cos, sin = cos[:, None], sin[:, None]
    q = apply_rope(q.transpose(1, 2), cos, sin)
    k = apply_rope(k.transpose(1, 2), cos, sin)
    return q.contiguous(), k.contiguous(), v.transpose(1, 2).contiguous()


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2I] (gate | up) -> silu(gate) * up [..., I], as `FeedForward`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
