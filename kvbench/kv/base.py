"""The KV-cache protocol every mode implements, and the bookkeeping they share.

One `KVCache` object holds one layer's keys and values for a batch. A mode is a
subclass that says how tokens are stored (`_allocate`, `_store`) and read back
(`_load`); growth, front trimming with attention sinks, byte accounting and the
reference attention live here, once, so no mode re-implements them.

Shapes: K and V arrive as ``[B, H_kv, T, D]``; every storage buffer keeps the
token axis at dim 2 (codes ``[B, H, T, D/2]``, scales ``[B, H, T, 1]``...), which
is what lets trimming and growth treat all buffers alike.
"""

from __future__ import annotations

import contextlib
import copy
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kvbench.errors import KvbenchError
from kvbench.kernels.reference import sparse_weights


class KVCache:
    """Base class: storage bookkeeping plus the reference (PyTorch) attention."""

    #: canonical mode name, e.g. ``"int8"``
    name: ClassVar[str] = ""
    #: other spellings accepted on the command line
    aliases: ClassVar[tuple[str, ...]] = ()
    #: one line for ``--help`` and the report
    summary: ClassVar[str] = ""
    #: whether boundary-V protection (fp16 first/last layers) applies to this mode
    boundary_v_applies: ClassVar[bool] = False
    #: the storage format's name in `kvbench.kernels` (None: no fused GPU path; the
    #: mode then decodes through the reference `attend` without CUDA graphs)
    kernel_mode: ClassVar[str | None] = None

    def __init__(
        self,
        *,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        capacity: int = 0,
        grow_step: int = 256,
        layer_idx: int = 0,
        kernel: str = "reference",
        sparse_v: float = 0.0,
    ) -> None:
        self.batch = batch
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.grow_step = max(1, grow_step)
        self.layer_idx = layer_idx
        self.kernel = kernel
        # sparse V (`--sparse-v-threshold`): decode steps skip V where the softmax weight is below it
        self.sparse_v = sparse_v
        self.offset = 0  # absolute position of the next token (drives RoPE); only grows
        self.dropped = 0  # tokens removed by front trims so far
        self.capacity = 0
        self.buffers: dict[str, torch.Tensor] = {}
        self._check_shape()
        if capacity:
            self.reserve(capacity)

    # ----------------------------------------------------------------- modes override
    def _check_shape(self) -> None:
        """Refuse head dims the mode cannot store (raise KvbenchError)."""

    def _allocate(self, capacity: int) -> dict[str, torch.Tensor]:
        """Fresh storage buffers for `capacity` tokens (token axis at dim 2)."""
        raise NotImplementedError

    def _store(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write T tokens into slots ``[start, start + T)``."""
        raise NotImplementedError

    def _load(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots ``[start, end)`` as K, V in the compute dtype (dequantized)."""
        raise NotImplementedError

    # ------------------------------------------------------------------- bookkeeping
    @property
    def live(self) -> int:
        """Tokens actually stored (= offset - dropped)."""
        return self.offset - self.dropped

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` tokens, keeping what is stored (never shrinks)."""
        if capacity <= self.capacity:
            return
        fresh = self._allocate(capacity)
        n = self.live
        for key, buf in self.buffers.items():
            if n:
                fresh[key][:, :, :n] = buf[:, :, :n]
        self.buffers = fresh
        self.capacity = capacity

    def _ensure(self, needed: int) -> None:
        if needed > self.capacity:
            steps = -(-needed // self.grow_step)
            self.reserve(steps * self.grow_step)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store T new tokens after the live ones; `offset` advances by T."""
        t = k.shape[2]
        start = self.live
        self._ensure(start + t)
        self._store(start, k, v)
        self.offset += t

    def trim_front(self, n: int, keep: int = 0) -> int:
        """Drop `n` tokens, keeping the first `keep` (attention sinks). Returns n dropped.

        `offset` does not move, so RoPE positions of the survivors are unchanged.
        """
        live = self.live
        n = max(0, min(n, live))
        keep = max(0, min(keep, live - n))
        if n == 0:
            return 0
        for buf in self.buffers.values():
            tail = buf[:, :, keep + n : live].clone()
            buf[:, :, keep : live - n] = tail
        self.dropped += n
        return n

    # ----------------------------------------------------------------------- memory
    def nbytes(self) -> int:
        """Bytes the live tokens occupy in every buffer and sidecar."""
        return sum(self._bytes_per_token_by_buffer().values()) * self.live

    def capacity_nbytes(self) -> int:
        """Bytes allocated (all buffers at capacity)."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def bytes_per_token(self) -> float:
        """Bytes one token (all heads, whole batch) costs in this layer."""
        return float(sum(self._bytes_per_token_by_buffer().values()))

    def _bytes_per_token_by_buffer(self) -> dict[str, int]:
        if not self.buffers:
            self.reserve(1)
        out = {}
        for key, b in self.buffers.items():
            per_slot = b.numel() // max(1, b.shape[2])
            out[key] = per_slot * b.element_size()
        return out

    # -------------------------------------------------------------------- attention
    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All live tokens as full-precision K, V ``[B, H_kv, live, D]``."""
        return self._load(0, self.live)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention of `q` over the stored tokens plus the fresh chunk (`k`, `v`).

        The fresh chunk is used at full precision and causally; stored tokens
        are seen through the mode's storage. Call before `append(k, v)`.
        q: ``[B, H_q, T, D]`` -> ``[B, H_q, T, D]``.
        """
        return self.reference_attend(q, k, v, scale)

    def reference_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if self.live:
            pk, pv = self.dequantized()
            k = torch.cat([pk.to(k.dtype), k], dim=2)
            v = torch.cat([pv.to(v.dtype), v], dim=2)
        return sdpa(q, k, v, scale, self.sparse_v)

    # ------------------------------------------------- fused GPU decode (Triton kernels)
    def kernel_args(self) -> dict:
        """Extra arguments of the kernels for this format (signs, codebooks)."""
        return {}

    def use_triton(self) -> bool:
        return self.kernel == "triton" and self.kernel_mode is not None and self.device.type == "cuda"

    def fused_decode(self, q, k, v, length, cold, workspace, scale, rotated_out=False, q_rotated=None):
        """Attention of one decode token over L stored tokens plus itself, then its
        quantize-on-write into slot L; L (and C) are device tensors. q [B, Hq, D],
        k/v [B, Hkv, D]. The host calls `after_fused_append` afterwards. `rotated_out`:
        the output in a turbo V's rotated basis (its caller folded the inverse into W_o);
        `q_rotated`: a turbo K's rotated query, computed by the caller (RoPE's kernel)."""
        from kvbench.kernels.decode_attention import decode_attention

        # The write runs in the attention's reduction kernel (`append=True`), or right after
        # it on the same stream. Beside it on a side stream (tried on the H200 at 98d7b72) it
        # made decode slower, most at batch 16 (int8 at 32K: 1.44x -> 1.25x of fp16), likely
        # by taking SM slots from the attention's grid.
        return decode_attention(
            self.kernel_mode, q, k, v, self.buffers, length, scale, cold_length=cold, workspace=workspace,
            append=True, rotated_out=rotated_out, sparse_v=self.sparse_v, q_rotated=q_rotated, **self.kernel_args(),
        )  # fmt: skip

    def pretend_filled(self, n: int) -> None:
        """Mark `n` tokens live without writing them (memory-capacity probes only)."""
        self.reserve(n)
        self.offset, self.dropped = n, 0

    def begin_decode(self) -> None:
        """Called once before fused decoding starts."""

    def after_fused_append(self) -> None:
        """Host bookkeeping after a fused step wrote one token."""
        self.offset += 1

    # ----------------------------------------------------------- snapshots and reuse
    def clone(self) -> KVCache:
        """An independent copy (modes keep every tensor in `self.buffers`)."""
        new = copy.copy(self)
        new.buffers = {k: _clone_layout(v) for k, v in self.buffers.items()}
        return new

    def copy_from(self, other: KVCache, n_tokens: int | None = None) -> None:
        """Adopt the first `n_tokens` stored tokens of a cache of the same mode."""
        if type(other) is not type(self):
            raise KvbenchError(f"cannot adopt a {other.name} cache into a {self.name} cache")
        n = other.live if n_tokens is None else min(n_tokens, other.live)
        if other.dropped and n < other.live:
            raise KvbenchError("cannot share a partial prefix of a trimmed cache")
        self._ensure(n)
        for key, buf in other.buffers.items():
            self.buffers[key][:, :, :n] = buf[:, :, :n]
        self.dropped = other.dropped if n == other.live else 0
        self.offset = self.dropped + n

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(layer={self.layer_idx}, live={self.live}, offset={self.offset}, "
            f"capacity={self.capacity})"
        )


def _clone_layout(x: torch.Tensor) -> torch.Tensor:
    """A copy with x's strides (`clone` makes a padded view such as int8's token-major V contiguous)."""
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x)


#: the backends the reference attention's decode steps may use on a GPU: every one but cuDNN's. On the H200
#: (torch 2.11, cuDNN 9.19) torch picked cuDNN for the default model's bf16 decode, and it was not reproducible:
#: one process gave other greedy tokens at 32K than another that had run a 2K or 8K prompt first, from the same
#: prefill bit for bit, so the audit's 8K / 32K kernel-check KLs moved from run to run
#: (scripts/exp/history_probe.py, results/2026-12-04d-h200). Without cuDNN the tokens were the same after any
#: history. Prefill chunks keep torch's choice: cuDNN's prefill repeated bit for bit on every machine and
#: history tried, and the math backend it would fall back to (a mask and grouped query heads rule out the
#: others) holds a [heads, chunk, context] score matrix, 8.6 GB a layer for an 8B model at 32K.
REFERENCE_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, sparse_v: float = 0.0) -> torch.Tensor:
    """Scaled dot-product attention where the last T keys are the queries' own
    chunk (causal, aligned bottom-right) and every earlier key is visible. A decode
    step (T = 1) with `sparse_v` > 0 skips V wherever the softmax weight is below it.
    A decode step on a GPU runs on `REFERENCE_SDPA_BACKENDS` only."""
    t, s = q.shape[2], k.shape[2]
    if t == 1 and (sparse_v > 0 or (q.device.type == "cpu" and q.dtype != torch.float32)):
        return _decode_attention_cpu(q, k, v, scale, sparse_v)
    mask = None
    if t > 1:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(s - t)
    gqa = q.shape[1] != k.shape[1]
    with reference_backends(q.device, decode=t == 1):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def reference_backends(device: torch.device, decode: bool):
    """The scope `sdpa` calls torch's attention in: `REFERENCE_SDPA_BACKENDS` for a decode step on a GPU,
    torch's choice otherwise."""
    if decode and device.type == "cuda":
        return sdpa_kernel(list(REFERENCE_SDPA_BACKENDS))
    return contextlib.nullcontext()


def _decode_attention_cpu(q, k, v, scale, sparse_v=0.0):
    """One query token by grouped matmuls in fp32 (on CPU torch's SDPA takes ~10x longer for a
    single bf16 query: measured 2.3 ms vs 0.5 ms at 4K keys), with sparse V when asked."""
    b, hq, _, d = q.shape
    hk = k.shape[1]
    qg = q.float().view(b, hk, hq // hk, d)
    p = sparse_weights(torch.softmax((qg @ k.float().transpose(-1, -2)) * scale, dim=-1), sparse_v)
    return (p @ v.float()).view(b, hq, 1, d).to(q.dtype)
