"""Triton decode-attention and quantize-on-write kernels, each with the PyTorch
reference it is tested against (the reference is also the CPU path)."""
