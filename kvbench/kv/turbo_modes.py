"""The four turbo modes: rotated, Lloyd-Max codebook-quantized K and/or V.

Quantized tokens are stored as packed codes (`<x>_codes`) plus one fp16 scale
per token-head (`<x>_scale`); full-precision ones in the compute dtype (`k`,
`v_hot`). The storage format is in `kvbench.kv.turbo`.

`attend` never inverse-rotates a cached token: it rotates the query once into
K's basis and scores s_t * <q_rot, c[idx_t]>, and for V sums p_t * s_t * c[idx_t]
in V's basis and inverse-rotates one vector per query. This is the shape a fused
kernel takes; `reference_attend` (dequantize everything, then SDPA) checks it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.errors import KvbenchError
from kvbench.kernels.reference import sparse_weights
from kvbench.kv import turbo
from kvbench.kv.base import KVCache, sdpa
from kvbench.kv.registry import register


class TurboCache(KVCache):
    """K and V each either kept in the compute dtype (bits None) or turbo-quantized."""

    k_bits: ClassVar[int | None] = None
    v_bits: ClassVar[int | None] = 4
    boundary_v_applies = True
    default_boundary_v = 2

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rotations = {x: turbo.Rotation(self.head_dim, turbo.SEEDS[x], self.device) for x in "kv"}

    def _check_shape(self):
        for bits in (self.k_bits, self.v_bits):
            if bits is not None:
                turbo.check_dim(self.head_dim, bits)

    def _allocate(self, capacity):
        out = {}
        for x, bits in (("k", self.k_bits), ("v", self.v_bits)):
            out.update(self._side_buffers(x, bits, capacity))
        return out

    def _side_buffers(self, x, bits, capacity):
        shape = (self.batch, self.n_kv_heads, capacity)
        dev = self.device
        if bits is None:
            return {x: torch.empty((*shape, self.head_dim), dtype=self.dtype, device=dev)}
        return {
            f"{x}_codes": torch.empty((*shape, turbo.packed_dim(self.head_dim, bits)), dtype=torch.uint8, device=dev),
            f"{x}_scale": torch.empty((*shape, 1), dtype=torch.float16, device=dev),
        }

    def _write(self, x, bits, start, t):
        """Store `t` tokens of one side into slots [start, start + T)."""
        sl = slice(start, start + t.shape[2])
        if bits is None:
            self.buffers[x][:, :, sl] = t
        else:
            codes, scale = turbo.quantize(t, bits, self.rotations[x])
            self.buffers[f"{x}_codes"][:, :, sl] = codes
            self.buffers[f"{x}_scale"][:, :, sl] = scale

    def _read(self, x, bits, start, end, rotated=False):
        """Slots [start, end) of one side: dequantized (compute dtype), or s * c[idx] (float32)."""
        if bits is None:
            return self.buffers[x][:, :, start:end]
        codes = self.buffers[f"{x}_codes"][:, :, start:end]
        scale = self.buffers[f"{x}_scale"][:, :, start:end]
        if rotated:
            return turbo.dequantize_rotated(codes, scale, bits, self.head_dim)
        return turbo.dequantize(codes, scale, bits, self.rotations[x], self.dtype)

    @property
    def kernel_mode(self) -> str:
        return self.name

    def kernel_args(self) -> dict:
        args = {}
        for x, bits in (("k", self.k_bits), ("v", self.v_bits)):
            if bits is not None:
                rot = self.rotations[x]
                args[f"{x}_signs"] = (rot.s1, rot.s2)
                args[f"{x}_codebook"] = turbo.codebook(bits, self.head_dim, self.device)
                args[f"{x}_boundaries"] = turbo.boundaries(bits, self.head_dim, self.device)
        return args

    def _store(self, start, k, v):
        if self.use_triton():
            from kvbench.kernels.quantize import write_kv

            write_kv(self.name, k.contiguous(), v.contiguous(), self.buffers, start, **self.kernel_args())
            return
        self._write("k", self.k_bits, start, k)
        self._write("v", self.v_bits, start, v)

    def _load(self, start, end):
        return self._read("k", self.k_bits, start, end), self._read("v", self.v_bits, start, end)

    def _stored_v(self):
        """The live V as (start, end, float32 values, in V's rotated basis?) segments."""
        rotated = self.v_bits is not None
        return [(0, self.live, self._read("v", self.v_bits, 0, self.live, rotated).float(), rotated)]

    def attend(self, q, k, v, scale):
        live = self.live
        if not live:
            return sdpa(q, k, v, scale, self.sparse_v)
        if q.shape[2] > 16:  # prefill chunks: dequantize once and use fused SDPA (same result)
            return self.reference_attend(q, k, v, scale)
        hq, t = q.shape[1], q.shape[2]
        # [B, H_kv, group, T, D]: query head h reads kv head h // group.
        qf = q.float().unflatten(1, (self.n_kv_heads, hq // self.n_kv_heads))
        if self.k_bits is None:
            q_stored, k_stored = qf, self._read("k", None, 0, live).float()
        else:
            q_stored, k_stored = self.rotations["k"].rotate(qf), self._read("k", self.k_bits, 0, live, True)
        scores_fresh = qf @ k.float().unsqueeze(2).transpose(-1, -2)
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = torch.cat(
            [q_stored @ k_stored.unsqueeze(2).transpose(-1, -2), scores_fresh.masked_fill(causal, -torch.inf)], -1
        )
        p = torch.softmax(scores * scale, dim=-1)
        if t == 1:
            p = sparse_weights(p, self.sparse_v)
        out = p[..., live:] @ v.float().unsqueeze(2)
        for start, end, vals, rotated in self._stored_v():
            if end == start:
                continue
            part = p[..., start:end] @ vals.unsqueeze(2)
            out = out + (self.rotations["v"].unrotate(part) if rotated else part)
        return out.flatten(1, 2).to(q.dtype)


@register
class Turbo4AsymCache(TurboCache):
    name = "turbo4-asym"
    aliases = ("fp16+turbo4",)
    summary = "K in the compute dtype, V rotated + 4-bit Lloyd-Max codes with an fp16 norm per token-head"


@register
class Turbo3AsymCache(TurboCache):
    name = "turbo3-asym"
    aliases = ("fp16+turbo3", "turbo3")
    summary = "K in the compute dtype, V rotated + 3-bit Lloyd-Max codes with an fp16 norm per token-head"
    v_bits = 3


@register
class Turbo4Cache(TurboCache):
    name = "turbo4"
    aliases = ("turbo4-sym",)
    summary = "K and V rotated + 4-bit Lloyd-Max codes (allowlisted model families only; else turbo4-asym)"
    k_bits = 4
    # Quantized K wrecks softmax on most dense models; only these families tolerate it.
    allowlist = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
    fallback = "turbo4-asym"


@register
class Turbo4DelegatedCache(TurboCache):
    """K in the compute dtype; V split into a cold turbo-4-bit body and a hot fp16 window.

    Live token i is cold slot i for i < cold_len, else hot slot i - cold_len.
    Every append lands in hot; the first single-token append (start of decode)
    folds the whole prefill into cold, and after each append the oldest FOLD hot
    tokens fold into cold while hot holds more than HOT_MAX, so the hot buffer
    never needs more than HOT_MAX slots.
    """

    name = "turbo4-delegated"
    aliases = ("fp16+turbo4-delegated",)
    summary = "K in the compute dtype, V: last 129-256 tokens fp16, older ones rotated + 4-bit codes"
    HOT_MAX: ClassVar[int] = 256
    FOLD: ClassVar[int] = 128

    def __init__(self, **kwargs) -> None:
        self.cold_len = 0
        self.decoding = False
        super().__init__(**kwargs)

    @property
    def hot_len(self) -> int:
        return self.live - self.cold_len

    def _allocate(self, capacity):
        out = self._side_buffers("k", None, capacity)
        out.update(self._side_buffers("v", 4, capacity))
        # +1: the fused decode step writes a token before the host folds
        out.update(self._side_buffers("v_hot", None, min(capacity, self.HOT_MAX) + 1))
        return out

    def _to_cold(self, v):
        if v.shape[2]:
            self._write("v", 4, self.cold_len, v)
            self.cold_len += v.shape[2]

    def _fold(self, n, hot_len):
        """Move the oldest `n` of `hot_len` hot tokens into cold."""
        hot = self.buffers["v_hot"]
        self._to_cold(hot[:, :, :n])
        _drop(hot, 0, n, hot_len)

    def _store(self, start, k, v):
        t = k.shape[2]
        self.buffers["k"][:, :, start : start + t] = k
        hot_len = self.hot_len  # offset has not advanced yet
        if t == 1 and not self.decoding:
            self.decoding = True
            self._fold(hot_len, hot_len)
            hot_len = 0
        total = hot_len + t
        n_fold = 0 if total <= self.HOT_MAX else self.FOLD * -(-(total - self.HOT_MAX) // self.FOLD)
        # Same end state as "append to hot, then fold FOLD at a time", without
        # ever holding more than HOT_MAX hot tokens.
        from_hot = min(n_fold, hot_len)
        self._fold(from_hot, hot_len)
        hot_len -= from_hot
        self._to_cold(v[:, :, : n_fold - from_hot])
        rest = v[:, :, n_fold - from_hot :]
        self.buffers["v_hot"][:, :, hot_len : hot_len + rest.shape[2]] = rest

    def attend(self, q, k, v, scale):
        if q.shape[2] == 1:  # the start of decode folds the prefill before it is attended
            self.begin_decode()
        return super().attend(q, k, v, scale)

    def reference_attend(self, q, k, v, scale):
        if q.shape[2] == 1:
            self.begin_decode()
        return super().reference_attend(q, k, v, scale)

    def pretend_filled(self, n):
        super().pretend_filled(n)
        self.cold_len, self.decoding = n, True

    def begin_decode(self):
        if not self.decoding:
            self.decoding = True
            self._fold(self.hot_len, self.hot_len)

    def after_fused_append(self):
        self.offset += 1
        while self.hot_len > self.HOT_MAX:
            self._fold(self.FOLD, self.hot_len)

    def _load(self, start, end):
        cold = self._read("v", 4, 0, self.cold_len)
        v = torch.cat([cold, self.buffers["v_hot"][:, :, : self.hot_len]], dim=2)
        return self.buffers["k"][:, :, start:end], v[:, :, start:end]

    def _stored_v(self):
        return [
            (0, self.cold_len, self._read("v", 4, 0, self.cold_len, rotated=True), True),
            (self.cold_len, self.live, self.buffers["v_hot"][:, :, : self.hot_len].float(), False),
        ]

    def trim_front(self, n, keep=0):
        live, cold = self.live, self.cold_len
        n = max(0, min(n, live))
        keep = max(0, min(keep, live - n))
        if n == 0:
            return 0
        # The dropped range [keep, keep + n) split into its cold and hot parts.
        c0, c1 = min(keep, cold), min(keep + n, cold)
        h0, h1 = max(keep, cold) - cold, max(keep + n, cold) - cold
        _drop(self.buffers["k"], keep, keep + n, live)
        _drop(self.buffers["v_codes"], c0, c1, cold)
        _drop(self.buffers["v_scale"], c0, c1, cold)
        _drop(self.buffers["v_hot"], h0, h1, live - cold)
        self.cold_len -= c1 - c0
        self.dropped += n
        return n

    def nbytes(self):
        per = self._bytes_per_token_by_buffer()
        cold = per["v_codes"] + per["v_scale"]
        return per["k"] * self.live + cold * self.cold_len + per["v_hot"] * self.hot_len

    def bytes_per_token(self):
        """Average over the live tokens (K + cold or hot V); an empty cache reports a cold token."""
        if self.live:
            return self.nbytes() / self.live
        per = self._bytes_per_token_by_buffer()
        return float(per["k"] + per["v_codes"] + per["v_scale"])

    def copy_from(self, other, n_tokens=None):
        if type(other) is not type(self):
            raise KvbenchError(f"cannot adopt a {other.name} cache into a {self.name} cache")
        n = other.live if n_tokens is None else min(n_tokens, other.live)
        if other.dropped and n < other.live:
            raise KvbenchError("cannot share a partial prefix of a trimmed cache")
        cold = min(n, other.cold_len)
        self._ensure(n)
        for key, count in (("k", n), ("v_codes", cold), ("v_scale", cold), ("v_hot", n - cold)):
            self.buffers[key][:, :, :count] = other.buffers[key][:, :, :count]
        self.cold_len = cold
        self.decoding = other.decoding and n == other.live
        self.dropped = other.dropped if n == other.live else 0
        self.offset = self.dropped + n


def _drop(buf, a, b, end):
    """Remove slots [a, b) of the first `end`, shifting the rest down."""
    if b > a:
        buf[:, :, a : end - (b - a)] = buf[:, :, b:end].clone()
