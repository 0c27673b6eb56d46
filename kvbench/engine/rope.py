"""Rotary position embeddings: default, `llama3`, `yarn` (and whatever else
transformers' `ROPE_INIT_FUNCTIONS` knows), computed from the model config with
transformers' own functions so kvbench and transformers agree bit for bit."""

from __future__ import annotations

import copy

import torch

from kvbench.errors import KvbenchError


def rope_parameters(cfg) -> dict:
    """The RoPE dict in the transformers 5.x shape (`rope_parameters`), read from
    either 5.x configs or 4.x ones (`rope_scaling` + `rope_theta`)."""
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and rp:
        out = dict(rp)
    else:
        out = dict(getattr(cfg, "rope_scaling", None) or {})
        out.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out.pop("type")
    out.setdefault("rope_type", "default")
    return out


def inv_freq_and_scale(cfg, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim/2] float32, cos/sin scale factor)."""
    with torch.device("cpu"):  # also when a model is being built on the meta device
        return _inv_freq_and_scale(cfg, head_dim)


def _inv_freq_and_scale(cfg, head_dim: int) -> tuple[torch.Tensor, float]:
    rp = rope_parameters(cfg)
    kind = rp["rope_type"]
    if kind == "default":
        theta = float(rp["rope_theta"])
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    fn = ROPE_INIT_FUNCTIONS.get(kind)
    if fn is None:
        raise KvbenchError(f"RoPE type '{kind}' is not supported")
    inv, scale = fn(cfg, torch.device("cpu"))
    return inv.float(), float(scale)


def with_yarn(cfg, factor: float, original_max: int):
    """A copy of `cfg` with YaRN scaling by `factor` over `original_max` positions."""
    new = copy.deepcopy(cfg)
    rp = rope_parameters(cfg)
    yarn = {
        "rope_type": "yarn",
        "factor": float(factor),
        "original_max_position_embeddings": int(original_max),
        "rope_theta": rp["rope_theta"],
    }
    if isinstance(getattr(new, "rope_parameters", None), dict):  # transformers 5.x
        new.rope_parameters = dict(yarn)
    else:  # transformers 4.x
        new.rope_scaling = {k: v for k, v in yarn.items() if k != "rope_theta"}
        new.rope_theta = yarn["rope_theta"]
    new.max_position_embeddings = int(original_max * factor)
    return new


def rope_cos_sin(
    inv_freq: torch.Tensor, scale: float, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for `positions` [T] -> [T, head_dim] each (the transformers layout)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D]."""
    return x * cos + _rotate_half(x) * sin
