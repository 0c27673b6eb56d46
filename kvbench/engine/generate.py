"""Prefill, one decode step, greedy decoding and teacher forcing (gpt-fast's names).

Every function drives a list of per-layer caches. The absolute position of the
next token is the caches' `offset`; an optional `KVCap` trims the caches (with
attention sinks) so the live length never exceeds `max_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCap:
    """`--max-kv-size N --keep K`: a rotating window that keeps the first K tokens."""

    max_size: int
    keep: int = 4

    def before(self, caches: list, incoming: int) -> None:
        live = caches[0].live
        excess = live + incoming - self.max_size
        if excess > 0:
            n = min(excess, max(0, live - self.keep))
            if n:
                for c in caches:
                    c.trim_front(n, self.keep)

    def after(self, caches: list) -> None:
        live = caches[0].live
        if live > self.max_size:
            for c in caches:
                c.trim_front(live - self.max_size, self.keep)


def _positions(caches: list, t: int, device) -> torch.Tensor:
    start = caches[0].offset
    return torch.arange(start, start + t, device=device)


@torch.inference_mode()
def forward_chunk(
    model,
    tokens: torch.Tensor,
    caches: list,
    cap: KVCap | None = None,
    *,
    last_only=True,
    record=None,
):
    """Run T tokens through the model, trimming around it when capped."""
    if cap is not None:
        cap.before(caches, tokens.shape[1])
    logits = model(
        tokens,
        _positions(caches, tokens.shape[1], tokens.device),
        caches,
        last_only=last_only,
        record=record,
    )
    if cap is not None:
        cap.after(caches)
    return logits


@torch.inference_mode()
def prefill(
    model,
    tokens: torch.Tensor,
    caches: list,
    chunk: int = 2048,
    cap: KVCap | None = None,
    on_chunk=None,
):
    """tokens [B, T] -> logits of the last position [B, V]. `chunk=0`: one pass."""
    t = tokens.shape[1]
    step = t if chunk <= 0 else chunk
    logits = None
    for s in range(0, t, step):
        logits = forward_chunk(model, tokens[:, s : s + step], caches, cap)
        if on_chunk:
            on_chunk(min(s + step, t))
    return logits[:, -1]


@torch.inference_mode()
def decode_one_token(model, token: torch.Tensor, caches: list, cap: KVCap | None = None) -> torch.Tensor:
    """token [B, 1] -> next-token logits [B, V]."""
    return forward_chunk(model, token, caches, cap)[:, -1]


def make_stepper(
    model,
    caches,
    cap: KVCap | None = None,
    *,
    fused: bool = False,
    cuda_graphs: bool = True,
    pdl: bool = True,
    gemv: bool = True,
):
    """A function token [B, 1] -> next-token logits [B, V] (a fresh tensor).

    `fused`: the GPU path (Triton kernels, one CUDA graph per decoder); else the
    reference path through each cache's `attend`.
    """
    if fused:
        from kvbench.engine.fast_decode import FastDecoder

        dec = FastDecoder(model, caches, caches[0].batch, cuda_graphs=cuda_graphs, cap=cap, pdl=pdl, gemv=gemv)
        return lambda tok: dec.step(tok).clone()
    return lambda tok: decode_one_token(model, tok, caches, cap)


@torch.inference_mode()
def greedy_decode(model, first_logits, caches, n: int, cap: KVCap | None = None, on_token=None, step=None):
    """Greedy continuation of n tokens from the prefill's last logits.

    Returns (tokens [B, n], logits [B, n, V] for each emitted position).
    """
    step = step or make_stepper(model, caches, cap)
    tok = first_logits.argmax(-1, keepdim=True)
    tokens, logits = [tok], [first_logits]
    for i in range(n - 1):
        lg = step(tok)
        tok = lg.argmax(-1, keepdim=True)
        tokens.append(tok)
        logits.append(lg)
        if on_token:
            on_token(i + 1)
    return torch.cat(tokens, 1), torch.stack(logits, 1)


@torch.inference_mode()
def teacher_forced(
    model,
    first_logits,
    caches,
    forced: torch.Tensor,
    cap: KVCap | None = None,
    on_token=None,
    step=None,
):
    """Logits at each position when the sequence `forced` [B, n] is fed back one
    decode step at a time (the decode path, not a prefill): [B, n, V]."""
    step = step or make_stepper(model, caches, cap)
    logits = [first_logits]
    for i in range(forced.shape[1] - 1):
        logits.append(step(forced[:, i : i + 1]))
        if on_token:
            on_token(i + 1)
    return torch.stack(logits, 1)
