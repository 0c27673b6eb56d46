"""`int8`: per-token, per-head absmax quantization with a 16-bit scale sidecar.

scale = absmax / 127, except that an all-zero vector (scale exactly 0) uses 1.0.
The seed engine's defect was `scale = max(scale, 1.0)`: real K/V absmax is far
below 127, so that floor rounded every value to an integer and greedy decoding
collapsed. A tiny nonzero scale stays tiny here. Scales are bfloat16: 2 bytes per
token-head like the spec's fp16 sidecar, with float32's exponent range, so that no
magnitude underflows (fp16 would flush scales below 6e-8 to zero). The scale is
rounded first and the codes are taken against it, so every coordinate stays within
one step. At D=128 a token-head costs 128 + 2 bytes against 256 for fp16 (1.97x).
The K and V scales of a token-head sit side by side (`scales` [B, H, cap, 2]), so the
GPU kernel reads both in one 4-byte load that its pipeline can prefetch (two 2-byte
loads could not be: cp.async moves at least 4 bytes, and on the H200 the int8 step at
32K, batch 16 ran 12% slower with separate bfloat16 scale planes).
(Until 2026-12-02 the scales were float32, 128 + 4 bytes, 1.94x.) V codes are stored
token-major (`kernels.reference.token_major`): only the GPU kernels see the difference.
"""

from __future__ import annotations

import torch

from kvbench.kernels.reference import int8_scale, int8_scales, quantize_int8, token_major
from kvbench.kv.base import KVCache
from kvbench.kv.registry import register

__all__ = ["Int8Cache", "dequantize_int8", "quantize_int8"]


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


@register
class Int8Cache(KVCache):
    name = "int8"
    aliases = ("i8",)
    summary = "per-token absmax int8 K and V with a bf16 scale per token-head"
    kernel_mode = "int8"

    def _allocate(self, capacity):
        b, h, d = self.batch, self.n_kv_heads, self.head_dim
        dev = self.device
        return {
            "k": torch.empty((b, h, capacity, d), dtype=torch.int8, device=dev),
            # tokens contiguous per channel: the layout the GPU kernel's p @ V dot reads fastest
            "v": token_major((b, h, capacity, d), torch.int8, dev),
            "scales": int8_scales((b, h, capacity), dev),  # K's at [..., 0], V's at [..., 1]
        }

    def _store(self, start, k, v):
        if self.use_triton():
            from kvbench.kernels.quantize import write_kv

            write_kv("int8", k.contiguous(), v.contiguous(), self.buffers, start)
            return
        t = k.shape[2]
        sl = slice(start, start + t)
        for name, x in (("k", k), ("v", v)):
            q, s = quantize_int8(x)
            self.buffers[name][:, :, sl] = q
            int8_scale(self.buffers, name)[:, :, sl] = s

    def _load(self, start, end):
        b = self.buffers
        k = dequantize_int8(b["k"][:, :, start:end], int8_scale(b, "k")[:, :, start:end], self.dtype)
        v = dequantize_int8(b["v"][:, :, start:end], int8_scale(b, "v")[:, :, start:end], self.dtype)
        return k, v
