"""TurboQuant / PolarQuant vector quantization shared by the turbo modes.

One vector x of length D (a power of two) is stored as packed codebook indices
plus one fp16 scalar:

    n = ||x||;  u = x / n  (n == 0 divides by 1: a zero vector stays zero)
    r = s2 * H(s1 * u)          random rotation: every coordinate ~ N(0, 1/D)
    idx = cell of r in the Lloyd-Max codebook c for N(0, 1/D)
    s = n / ||c[idx]||          norm correction
    x_hat = s1 * H(s2 * (s * c[idx]))

H is the orthonormal Walsh-Hadamard matrix (symmetric, self-inverse) and s1,
s2 are +-1 vectors from `sign_vector(D, seed)` with the seeds in `SEEDS` (K and
V use different ones). The storage format below is what the Triton kernels read:

    4-bit codes: D/2 bytes, byte j = code[2j] | code[2j+1] << 4
    3-bit codes: 3D/8 bytes; group g of 8 codes is the 24-bit little-endian
                 integer sum_i code[8g+i] << 3i, stored as bytes (bits 0-7,
                 8-15, 16-23)
    scale:       float16 [..., 1]
"""

from __future__ import annotations

import functools
import itertools
import math
from statistics import NormalDist

import torch

from kvbench.errors import KvbenchError

#: (s1, s2) generator seeds for the sign vectors of K and V
SEEDS = {"k": (0x5EED_0001, 0x5EED_0002), "v": (0x5EED_0003, 0x5EED_0004)}


def check_dim(dim: int, bits: int) -> None:
    """Refuse head dims the format cannot hold; padding would change what is measured."""
    if dim < 2 or dim & (dim - 1):
        raise KvbenchError(
            f"turbo modes need a power-of-two head_dim; this model has head_dim={dim} (no silent padding)"
        )
    if bits == 3 and dim % 8:
        raise KvbenchError(f"3-bit turbo packing needs head_dim divisible by 8; this model has head_dim={dim}")


def packed_dim(dim: int, bits: int) -> int:
    """Bytes one packed vector of `dim` codes takes."""
    return dim * bits // 8


# ------------------------------------------------------------------- rotation
def sign_vector(dim: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """+1/-1 float32 vector: 1 - 2 * randint(0, 2, (dim,)) from a CPU generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (dim,), generator=g, device="cpu")
    return (1 - 2 * bits).float().to(device)


@functools.cache
def hadamard_matrix(dim: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Orthonormal Sylvester Walsh-Hadamard matrix: H[i, j] = (-1)^popcount(i & j) / sqrt(dim)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(dim)).to(device=device, dtype=dtype)


def wht(x: torch.Tensor) -> torch.Tensor:
    """Walsh-Hadamard transform along the last dim (its own inverse)."""
    return x @ hadamard_matrix(x.shape[-1], x.device, x.dtype)


class Rotation:
    """The orthogonal map r = s2 * H(s1 * x) and its inverse, in float32."""

    def __init__(self, dim: int, seeds: tuple[int, int], device: torch.device | str = "cpu") -> None:
        self.dim = dim
        self.s1 = sign_vector(dim, seeds[0], device)
        self.s2 = sign_vector(dim, seeds[1], device)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        return self.s2 * wht(self.s1 * x.float())

    def unrotate(self, r: torch.Tensor) -> torch.Tensor:
        return self.s1 * wht(self.s2 * r.float())


# ------------------------------------------------------------------- codebook
_SQRT2 = math.sqrt(2.0)


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def lloyd_max_step(centroids: list[float]) -> list[float]:
    """One Lloyd iteration for N(0, 1): cells split at centroid midpoints, each
    centroid moves to the conditional mean of its cell, (pdf(a) - pdf(b)) / P(a < X < b)."""
    edges = [-math.inf, *((a + b) / 2 for a, b in itertools.pairwise(centroids)), math.inf]
    return [
        (_pdf(a) - _pdf(b)) / (0.5 * (math.erf(b / _SQRT2) - math.erf(a / _SQRT2)))
        for a, b in itertools.pairwise(edges)
    ]


@functools.cache
def _lloyd_max(bits: int) -> tuple[float, ...]:
    levels = 1 << bits
    c = [NormalDist().inv_cdf((i + 0.5) / levels) for i in range(levels)]
    for _ in range(100_000):
        nxt = lloyd_max_step(c)
        done = max(abs(a - b) for a, b in zip(c, nxt, strict=True)) < 1e-12
        c = nxt
        if done:
            break
    return tuple(c)


def lloyd_max_codebook(bits: int) -> torch.Tensor:
    """The 2^bits optimal (MSE) scalar quantizer outputs for N(0, 1), ascending, float32."""
    return torch.tensor(_lloyd_max(bits), dtype=torch.float32)


@functools.cache
def codebook(bits: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Centroids for a rotated unit vector's coordinates, ~N(0, 1/dim)."""
    return (torch.tensor(_lloyd_max(bits), dtype=torch.float64) / math.sqrt(dim)).float().to(device)


@functools.cache
def boundaries(bits: int, dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Cell edges (centroid midpoints) for `torch.bucketize`."""
    c = torch.tensor(_lloyd_max(bits), dtype=torch.float64) / math.sqrt(dim)
    return ((c[1:] + c[:-1]) / 2).float().to(device)


# -------------------------------------------------------------------- packing
def pack4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., D] (values < 16) -> [..., D/2]."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def pack3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., D] (values < 8, D % 8 == 0) -> [..., 3D/8]."""
    groups = codes.to(torch.int32).unflatten(-1, (-1, 8))
    word = sum(groups[..., i] << (3 * i) for i in range(8))
    return torch.stack([word & 0xFF, (word >> 8) & 0xFF, word >> 16], dim=-1).flatten(-2).to(torch.uint8)


def unpack3(packed: torch.Tensor) -> torch.Tensor:
    b = packed.to(torch.int32).unflatten(-1, (-1, 3))
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    return torch.stack([(word >> (3 * i)) & 7 for i in range(8)], dim=-1).flatten(-2).to(torch.uint8)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    return pack4(codes) if bits == 4 else pack3(codes)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    return unpack4(packed) if bits == 4 else unpack3(packed)


# ------------------------------------------------------------ quantize / load
def quantize(x: torch.Tensor, bits: int, rotation: Rotation) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (packed codes uint8 [..., D*bits/8], scale float16 [..., 1])."""
    xf = x.float()
    n = xf.norm(dim=-1, keepdim=True)
    r = rotation.rotate(xf / torch.where(n == 0, torch.ones_like(n), n))
    dim = x.shape[-1]
    idx = torch.bucketize(r, boundaries(bits, dim, x.device))
    c = codebook(bits, dim, x.device)[idx]
    # No codebook entry is 0, so ||c[idx]|| > 0 and a zero vector gets s = 0.
    s = n / c.norm(dim=-1, keepdim=True)
    return pack(idx.to(torch.uint8), bits), s.to(torch.float16)


def dequantize_rotated(packed: torch.Tensor, scale: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """s * c[idx] in the rotated basis (float32): what a fused kernel works with."""
    idx = unpack(packed, bits).long()
    return scale.float() * codebook(bits, dim, packed.device)[idx]


def dequantize(
    packed: torch.Tensor, scale: torch.Tensor, bits: int, rotation: Rotation, dtype: torch.dtype
) -> torch.Tensor:
    return rotation.unrotate(dequantize_rotated(packed, scale, bits, rotation.dim)).to(dtype)
