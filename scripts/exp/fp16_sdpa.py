"""A plugin mode for experiments: `fp16-sdpa`, the fp16 cache whose captured decode step attends through
torch's own SDPA instead of kvbench's split kernel, so an end-to-end fp16 baseline on torch's attention
can be timed beside kvbench's (the spec asks for both where they differ).

    kvbench decode-bench --plugin scripts/exp/fp16_sdpa.py --modes fp16,fp16-sdpa,int8 --batch 16 ...

The captured step serves every decode step of a growing cache, and its live length L lives on the device,
so SDPA reads every slot of the cache behind a boolean mask (slots <= L; the fresh token is stored in slot
L first), each KV head's query heads taken as a query sequence of that length. The cache holds the context plus the benchmark's warm-up and timed tokens, so at 32K the mask
hides well under 1% of the slots; a masked call may take a different SDPA backend than a plain one
(`scripts/bench_kernels.py --sdpa-backends` times both). Storage, prefill and the reference path are
fp16's; only the fused decode differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.kv.fp16 import FP16Cache
from kvbench.kv.registry import register


@register
class FP16SdpaCache(FP16Cache):
    name = "fp16-sdpa"
    aliases = ()
    summary = "fp16 storage; the fused decode step attends through torch SDPA over a masked cache (experiment)"

    def fused_decode(self, q, k, v, length, cold, workspace, scale, rotated_out=False, q_rotated=None):
        if rotated_out or q_rotated is not None or self.sparse_v:
            raise ValueError("fp16-sdpa: a plain fp16 step only (no rotation, no sparse V)")
        kb, vb = self.buffers["k"], self.buffers["v"]
        slot = length.long()  # [1] on the device: where the fresh token goes
        kb.index_copy_(2, slot, k.unsqueeze(2))
        vb.index_copy_(2, slot, v.unsqueeze(2))
        mask = self._slots <= slot  # [1, 1, 1, cap]: stored tokens and the fresh one (`_slots`: begin_decode's)
        # each KV head's query group as a short query sequence [B, Hkv, G, D] (heads kv * G + g share KV head kv):
        # no GQA argument, which not every fused backend takes beside a mask
        b, hq, d = q.shape
        qg = q.view(b, self.n_kv_heads, hq // self.n_kv_heads, d)
        out = F.scaled_dot_product_attention(qg, kb, vb, attn_mask=mask, scale=scale)
        return out.reshape(b, hq, d)

    def begin_decode(self) -> None:
        super().begin_decode()
        # the mask hides the slots past L, but 0 x NaN is NaN: a never-written slot (torch.empty) must be finite
        for name in ("k", "v"):
            self.buffers[name][:, :, self.live :].zero_()
        cap = self.buffers["k"].shape[2]
        self._slots = torch.arange(cap, device=self.buffers["k"].device).view(1, 1, 1, cap)
