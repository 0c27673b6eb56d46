"""Model shapes: `ModelArgs` read from a transformers config, and dummy presets.

Configs are always transformers `PretrainedConfig` objects (from `AutoConfig`
or built from a preset), so RoPE scaling and the parity tests use exactly the
numbers transformers would.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kvbench.errors import KvbenchError

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")

# Real shapes of real models (random weights: vLLM's "dummy" load format).
PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        tie_word_embeddings=False,
    ),
    "llama-3.2-1b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    ),
    "mistral-7b": dict(
        model_type="mistral",
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    "smollm2-135m": dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    # For tests: small enough for CPU, head_dim a power of two for the turbo modes.
    "tiny": dict(
        model_type="llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=6,  # the default --boundary-v 2 leaves layers 2-3 quantized
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
}


def preset_config(name: str):
    """A transformers config object with the preset's shapes."""
    from transformers import AutoConfig

    if name not in PRESETS:
        raise KvbenchError(f"unknown dummy preset '{name}' (presets: {', '.join(PRESETS)})")
    kwargs = copy.deepcopy(PRESETS[name])
    model_type = kwargs.pop("model_type")
    return AutoConfig.for_model(model_type, **kwargs)


@dataclass
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    norm_eps: float
    attention_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    hf_config: Any  # the transformers config (RoPE parameters live there)

    @classmethod
    def from_hf(cls, cfg) -> ModelArgs:
        mt = getattr(cfg, "model_type", "")
        if mt not in SUPPORTED_FAMILIES:
            raise KvbenchError(f"model family '{mt}' is not supported (supported: {', '.join(SUPPORTED_FAMILIES)})")
        n_heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
        if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
            raise KvbenchError(f"activation '{cfg.hidden_act}' is not supported (SwiGLU with silu only)")
        bias = bool(getattr(cfg, "attention_bias", False)) or mt == "qwen2"
        return cls(
            model_type=mt,
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            n_layers=cfg.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(cfg, "num_key_value_heads", None) or n_heads,
            head_dim=head_dim,
            norm_eps=cfg.rms_norm_eps,
            attention_bias=bias,
            qk_norm=mt == "qwen3",
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            max_position_embeddings=cfg.max_position_embeddings,
            hf_config=cfg,
        )

    def kv_bytes_per_token_fp16(self, elem: int = 2) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem
