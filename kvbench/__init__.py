"""kvbench: audit and benchmark quantized KV caches for LLM inference."""

__version__ = "0.1.0"
