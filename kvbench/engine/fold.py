"""V's inverse rotation folded into the output projection (the GPU decode path, turbo V modes).

A turbo V cache stores each token's V rotated, r = s2 * H(s1 * v) (`kv.turbo.Rotation`), so the
attention's weighted sum comes out in the rotated basis and must be turned back, o = s1 * H(s2 * r),
before W_o. That inverse is linear, so it can ride on W_o instead (the trick QuaRot and SpinQuant use
for their rotations): for each query head's block of columns, W_o o = W_o' r with
W_o' = W_o diag(s1) H diag(s2), i.e. every row of the block rotated forward, s2 * H(s1 * w). The
attention kernel then leaves its output rotated (`decode_attention(rotated_out=True)`) and no program
runs the inverse transform; only the weights' rounding to the model's dtype changes.

The fold is done in place on the shared model, so that no second copy of W_o takes memory the
benchmark counts: the first fused step of a decoder that wants it (`fold_output`) saves each folded
layer's W_o on the host and overwrites it; anything that needs the plain weights back (the model's own
forward, a state dict for a peer) calls `unfold_output` first, which restores them bit for bit. One
decoder owns the fold at a time; a decoder whose weights were unfolded or refolded by another folds
again at its next step.
"""

from __future__ import annotations

import weakref

import torch

from kvbench.kv.turbo import wht

# model attribute: (weak reference to the owner, {layer: host copy of the plain W_o}, {layer: V's signs
# folded in}) or None. Weak: a decoder holds its caches (GBs at long contexts), and the model must not keep
# one alive after its run (the first version did, and the benchmark's peak memory grew by a cache's size)
_STATE = "_kvbench_wo_fold"


def folded_weight(
    w: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor, out: torch.Tensor | None = None, chunk: int = 64
) -> torch.Tensor:
    """W_o [H, Hq * D] with every head's block of D columns rotated forward, s2 * H(s1 * w), in
    float32 and rounded once to w's dtype, into `out` (which may be w itself); `chunk` rows at a
    time, so the float32 temporaries stay small next to the memory a benchmark measures (256 rows of
    Llama-3.1-8B's W_o added 0.026 GB to the peak on the H200; 64 rows, a quarter of that)."""
    d = s1.shape[-1]
    out = torch.empty_like(w) if out is None else out
    for r0 in range(0, w.shape[0], chunk):
        rows = w[r0 : r0 + chunk].float().view(-1, w.shape[1] // d, d)
        out[r0 : r0 + chunk] = (s2 * wht(s1 * rows)).view(rows.shape[0], -1).to(w.dtype)
    return out


def fold_owner(model) -> object | None:
    """The decoder whose fold W_o holds now (None: plain, or its decoder is gone)."""
    state = getattr(model, _STATE, None)
    return state[0]() if state else None


def is_folded(model) -> bool:
    return bool(getattr(model, _STATE, None))


def fold_output(model, owner: object, signs: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Make `owner`'s fold current: W_o of each layer i in `signs` rotated with V's (s1, s2) of
    that layer's cache, the others plain. A no-op while `owner` holds it already."""
    state = getattr(model, _STATE, None)
    if state and state[0]() is owner:
        return
    if state and _same_signs(state[2], signs):  # another decoder of the same rotations: hand it over
        setattr(model, _STATE, (weakref.ref(owner), *state[1:]))
        return
    unfold_output(model)
    saved = {}
    with torch.no_grad():
        for i, (s1, s2) in signs.items():
            w = model.layers[i].attn.wo.weight
            saved[i] = w.detach().to("cpu", copy=True)
            folded_weight(w, s1.to(w.device, torch.float32), s2.to(w.device, torch.float32), out=w)
    setattr(model, _STATE, (weakref.ref(owner), saved, dict(signs)))


def _same_signs(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a[i], b[i], strict=True)) for i in a
    )


def unfold_output(model) -> None:
    """Put every folded W_o back as it was (exactly: from the host copies). Cheap when none is."""
    state = getattr(model, _STATE, None)
    if not state:
        return
    with torch.no_grad():
        for i, w in state[1].items():
            model.layers[i].attn.wo.weight.copy_(w)
    setattr(model, _STATE, None)
