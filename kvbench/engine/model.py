"""A Llama-family decoder (Llama 2/3/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2).

gpt-fast's shape: config -> RMSNorm, Attention, FeedForward, Block, Transformer.
The model never knows which KV mode it holds: each layer calls its cache's
`attend` (past through the mode's storage, the fresh chunk at full precision)
then `append`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kvbench.engine.config import ModelArgs
from kvbench.engine.fold import unfold_output
from kvbench.engine.rope import apply_rope, inv_freq_and_scale, rope_cos_sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Same order of operations as transformers: normalise in fp32, scale in dtype.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = (
            a.n_heads,
            a.n_kv_heads,
            a.head_dim,
        )
        qkv_out = (a.n_heads + 2 * a.n_kv_heads) * a.head_dim
        self.wqkv = nn.Linear(a.hidden_size, qkv_out, bias=a.attention_bias)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.hidden_size, bias=False)
        self.q_norm = RMSNorm(a.head_dim, a.norm_eps) if a.qk_norm else None
        self.k_norm = RMSNorm(a.head_dim, a.norm_eps) if a.qk_norm else None
        self.scale = a.head_dim**-0.5

    def forward(self, x, cos, sin, cache, record=None):
        b, t, _ = x.shape
        hq, hk, d = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.wqkv(x).split([hq * d, hk * d, hk * d], dim=-1)
        q = q.view(b, t, hq, d)
        k = k.view(b, t, hk, d)
        v = v.view(b, t, hk, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        if record is not None:
            record.append((k, v))
        out = cache.attend(q, k, v, self.scale)
        cache.append(k, v)
        return self.wo(out.transpose(1, 2).reshape(b, t, hq * d))


class FeedForward(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.w13 = nn.Linear(a.hidden_size, 2 * a.intermediate_size, bias=False)  # gate | up
        self.w2 = nn.Linear(a.intermediate_size, a.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(a.hidden_size, a.norm_eps)
        self.attn = Attention(a)
        self.ffn_norm = RMSNorm(a.hidden_size, a.norm_eps)
        self.ffn = FeedForward(a)

    def forward(self, x, cos, sin, cache, record=None):
        h = x + self.attn(self.attn_norm(x), cos, sin, cache, record)
        return h + self.ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.hidden_size, a.norm_eps)
        self.output = None if a.tie_word_embeddings else nn.Linear(a.hidden_size, a.vocab_size, bias=False)
        inv_freq, self.rope_scale = inv_freq_and_scale(a.hf_config, a.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def set_rope(self, hf_config) -> None:
        """Switch RoPE scaling (e.g. YaRN for a context past the trained length)."""
        inv_freq, self.rope_scale = inv_freq_and_scale(hf_config, self.args.head_dim)
        self.inv_freq = inv_freq.to(self.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        caches: list,
        *,
        last_only: bool = False,
        record: list | None = None,
    ) -> torch.Tensor:
        """tokens [B, T], positions [T] (absolute, drive RoPE) -> float32 logits.

        `last_only` returns only the last position's logits ([B, 1, V]).
        `record`, when a list, receives each layer's fresh (K, V) after RoPE.
        """
        unfold_output(self)  # the plain W_o, should a fused decoder have folded V's rotation into it
        x = self.tok_embeddings(tokens)
        cos, sin = rope_cos_sin(self.inv_freq, self.rope_scale, positions, x.dtype)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, cos, sin, cache, record)
        if last_only:
            x = x[:, -1:]
        x = self.norm(x)
        w = self.tok_embeddings.weight if self.output is None else self.output.weight
        return F.linear(x, w).float()
