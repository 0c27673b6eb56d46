"""The GPU decode step: every layer with fused Triton kernels, captured once as
a CUDA graph per (mode, batch, capacity) and replayed.

Nothing in the captured step depends on a Python value that changes between
steps: the live length L, the delegated cold length C and the RoPE position
live in one small device tensor (`state`) that the step itself advances, and
each cache's storage is preallocated (no growth on the hot path), so the host
can queue steps far ahead of the GPU. Host-side bookkeeping (offsets, the
delegated hot->cold fold, KV-cap trims) runs between replays; only when it
changes what the device holds (a fold every 128 steps, a trim) is `state`
written again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.engine.fold import fold_output
from kvbench.engine.rope import rope_cos_sin


def fused_supported(caches: list) -> bool:
    return all(getattr(c, "kernel_mode", None) for c in caches)


class FastDecoder:
    """Greedy decode of a batch, one token per `step`, through fused kernels.

    `step(tok)` feeds tokens [B, 1] (or, with None, the previous step's argmax)
    and returns the logits [B, V] (float32, a static buffer: copy to keep).
    """

    def __init__(
        self,
        model,
        caches: list,
        batch: int,
        *,
        cuda_graphs: bool = True,
        cap=None,
        pdl: bool = True,
        gemv: bool = True,
    ) -> None:
        from kvbench.kernels.decode_attention import DecodeWorkspace

        self.model = model
        self.caches = caches
        self.batch = batch
        self.cap = cap
        dev = model.device
        a = model.args
        self.use_graphs = cuda_graphs and dev.type == "cuda"
        self.pdl = pdl  # Triton kernels launched with programmatic dependent launch (sm_90+; see kernels.launch)
        self.gemv = gemv  # projections through kernels.gemv (else cuBLAS via F.linear)
        self.graph = None
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.state = torch.zeros(3, dtype=torch.int32, device=dev)  # L, C, position
        self._advance = torch.tensor([1, 0, 1], dtype=torch.int32, device=dev)
        self._device_state: tuple | None = None  # what `state` holds once queued work has run
        self.logits = None
        self.next_tok = None
        # one scratch workspace per storage format (layers run in sequence, so they share)
        self.workspaces = {}
        q_like = torch.empty(batch, a.n_heads, a.head_dim, dtype=model.dtype, device=dev)
        for c in caches:
            c.reserve(c.capacity)  # storage is fixed from here on
            if c.kernel_mode not in self.workspaces:
                self.workspaces[c.kernel_mode] = DecodeWorkspace.for_cache(
                    c.kernel_mode, q_like, a.n_kv_heads, c.capacity
                )
        with torch.inference_mode():  # a fold writes into buffers that a capped prefill may have grown in
            for c in caches:  # inference mode (inference tensors: no in-place update outside it)
                c.begin_decode()
        # per layer: the QKV GEMV's and RoPE's extra arguments, where one of them asks L2 for the
        # attention's cache ahead of it (`kernels.prefetch`; off by default)
        self.prefetch = [self._prefetch_args(c) for c in caches]
        # layer -> V's signs, where the step folds a turbo V's inverse rotation into W_o (`engine.fold`)
        self.wo_fold = self._signs_where("v_signs", "fold_v")
        # layer -> (the workspace's rotated-query buffer, K's signs), where RoPE's kernel rotates the query
        # for a turbo K (`q_rot_in_rope`) and the attention launches no rotation of its own
        self.q_rot = {
            i: (self.workspaces[caches[i].kernel_mode].q_rot, *signs)
            for i, signs in self._signs_where("k_signs", "q_rot_in_rope").items()
        }
        self.steps = 0

    def _signs_where(self, signs_key: str, knob: str) -> dict:
        """layer -> its cache's rotation signs `signs_key` ("k_signs" / "v_signs"), for the layers whose
        cache has them and whose mode's launch config turns `knob` on at this batch."""
        from kvbench.kernels.decode_attention import default_config

        out = {}
        for i, c in enumerate(self.caches):
            signs = c.kernel_args().get(signs_key)
            if signs is not None and default_config(c.kernel_mode, batch=self.batch)[knob]:
                out[i] = signs
        return out

    def _prefetch_args(self, cache) -> tuple[dict, dict]:
        from kvbench.kernels.decode_attention import l2_prefetch_args

        if not self.pdl or self.model.device.type != "cuda":
            return {}, {}
        gemv_kw, rope_kw = l2_prefetch_args(cache.kernel_mode, cache.buffers, self.batch, self.state[0:1])
        return (gemv_kw if self.gemv else {}), rope_kw

    # ------------------------------------------------------------- the step body
    def _body(self) -> None:
        from kvbench.kernels.launch import programmatic_launch

        with programmatic_launch(self.pdl):
            self._layers()

    def _layers(self) -> None:
        from kvbench.kernels.fused_ops import rmsnorm, rope_qk, silu_mul
        from kvbench.kernels.gemv import linear

        if not self.gemv:
            linear = F.linear

        m = self.model
        a = m.args
        b = self.batch
        pos = self.state[2:3]
        length, cold = self.state[0:1], self.state[1:2]
        x = m.tok_embeddings(self.tok)  # [B, 1, H]
        cos, sin = rope_cos_sin(m.inv_freq, m.rope_scale, pos, x.dtype)
        residual = None
        for i, (layer, cache, (gemv_kw, rope_kw)) in enumerate(zip(m.layers, self.caches, self.prefetch, strict=True)):
            at = layer.attn
            if residual is None:
                h, residual = rmsnorm(x, layer.attn_norm.weight, layer.attn_norm.eps), x
            else:
                h, residual = rmsnorm(x, layer.attn_norm.weight, layer.attn_norm.eps, residual=residual)
            qkv = linear(h, at.wqkv.weight, at.wqkv.bias, **gemv_kw)
            qn = at.q_norm.weight if at.q_norm is not None else None
            kn = at.k_norm.weight if at.k_norm is not None else None
            eps = at.q_norm.eps if at.q_norm is not None else 1e-6
            q_rot = self.q_rot.get(i)
            q, k, v = rope_qk(
                qkv,
                cos,
                sin,
                a.n_heads,
                a.n_kv_heads,
                a.head_dim,
                q_norm=qn,
                k_norm=kn,
                eps=eps,
                q_rot=q_rot,
                **rope_kw,
            )
            o = cache.fused_decode(
                q[:, :, 0],
                k[:, :, 0],
                v[:, :, 0],
                length,
                cold,
                self.workspaces[cache.kernel_mode],
                at.scale,
                rotated_out=i in self.wo_fold,
                q_rotated=q_rot[0] if q_rot else None,
            )  # with `rotated_out`, W_o holds V's inverse rotation (`engine.fold`)
            x = linear(o.reshape(b, 1, a.n_heads * a.head_dim), at.wo.weight)
            h, residual = rmsnorm(x, layer.ffn_norm.weight, layer.ffn_norm.eps, residual=residual)
            x = linear(silu_mul(linear(h, layer.ffn.w13.weight)), layer.ffn.w2.weight)
        h, _ = rmsnorm(x, m.norm.weight, m.norm.eps, residual=residual)
        w = m.tok_embeddings.weight if m.output is None else m.output.weight
        logits = linear(h[:, 0], w).float()
        if self.logits is None:
            self.logits, self.next_tok = logits, logits.argmax(-1, keepdim=True)
        else:
            self.logits.copy_(logits)
            torch.argmax(logits, -1, keepdim=True, out=self.next_tok)
        self.state.add_(self._advance)  # the token is stored: L and the position advance
        self.tok.copy_(self.next_tok)  # greedy: the next input, unless the host feeds one

    # ------------------------------------------------------------------ stepping
    def _host_state(self) -> tuple[int, int, int]:
        c0 = self.caches[0]
        cold = next((c.cold_len for c in self.caches if hasattr(c, "cold_len")), 0)
        return (c0.live, cold, c0.offset)

    def _sync_state(self) -> None:
        want = self._host_state()
        if want != self._device_state:  # first step, a fold or a trim: rare
            self.state.copy_(torch.tensor(want, dtype=torch.int32))
            self._device_state = want

    @torch.inference_mode()
    def step(self, tok: torch.Tensor | None = None) -> torch.Tensor:
        if self.cap is not None:
            self.cap.before(self.caches, 1)
        for c in self.caches:
            if c.live + 1 > c.capacity:
                raise RuntimeError(f"decode past the preallocated capacity ({c.capacity} tokens)")
        self._sync_state()
        if self.wo_fold:  # this decoder's W_o (a no-op while it holds the fold)
            fold_output(self.model, self, self.wo_fold)
        if tok is not None:
            self.tok.copy_(tok)
        if self.graph is not None:
            self.graph.replay()
        elif self.use_graphs and self.steps >= 2:  # Triton compiled and autotuned by now
            self._capture()
            self.graph.replay()
        else:
            self._body()
        live, cold, pos = self._device_state
        self._device_state = (live + 1, cold, pos + 1)
        for c in self.caches:
            c.after_fused_append()
        if self.cap is not None:
            self.cap.after(self.caches)
        self.steps += 1
        return self.logits

    def _capture(self) -> None:
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._body()
        self.graph = g
