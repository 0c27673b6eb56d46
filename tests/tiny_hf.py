"""Shared by the tests that build tiny random Hugging Face models (parity, peers)."""

# A tiny Llama-family config; each test adds its family's keys.
BASE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
