"""`fp16`: the baseline. K and V are stored as they arrive, in the compute dtype."""

from __future__ import annotations

import torch

from kvbench.kv.base import KVCache
from kvbench.kv.registry import register


@register
class FP16Cache(KVCache):
    name = "fp16"
    aliases = ("f16", "bf16", "baseline")
    summary = "K and V stored unchanged in the model's compute dtype (the reference)"
    kernel_mode = "fp16"

    def _allocate(self, capacity):
        shape = (self.batch, self.n_kv_heads, capacity, self.head_dim)
        return {
            "k": torch.empty(shape, dtype=self.dtype, device=self.device),
            "v": torch.empty(shape, dtype=self.dtype, device=self.device),
        }

    def _store(self, start, k, v):
        t = k.shape[2]
        self.buffers["k"][:, :, start : start + t] = k
        self.buffers["v"][:, :, start : start + t] = v

    def _load(self, start, end):
        return self.buffers["k"][:, :, start:end], self.buffers["v"][:, :, start:end]
