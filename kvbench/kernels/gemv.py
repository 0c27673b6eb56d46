"""The decode step's projections at small batch: y = x @ W^T (+ bias) with W [N, K] as
nn.Linear stores it and x [M, K], M <= 16 rows (one token per sequence).

At decode the projections stream the model's weights once per step and do little
math: they are memory-bound GEMVs (at batch 16, GEMMs with 16 rows). One program
owns BLOCK_N output columns for all M rows and walks K in BLOCK_K steps; the rows
are padded to 16 for the tensor-core dot, whose loads Triton pipelines (cp.async,
`num_stages` deep). Each output has one program: no split-K, no atomics, the same
bits every run.

What it adds over cuBLAS is the launch: inside `kernels.launch.programmatic_launch()`
(sm_90+) it starts while the kernel before it is still running, and since its
weights do not depend on that kernel, each program first asks L2 for its first
`PREFETCH_K` columns of weights (`prefetch.global.L2`), then waits for the
previous kernel (`griddepcontrol.wait`) before it reads x. The weight stream thus
starts during the previous kernel's tail instead of after it.

`linear(x, weight, bias)` takes this kernel where it applies (CUDA, 16-bit or fp32
tensors, at most 16 rows, a unit-stride weight) and `F.linear` elsewhere;
`KVBENCH_GEMV=cublas` sends everything to `F.linear`, and `KVBENCH_GEMV=triton` takes
the kernel in the interpreter too (CPU tensors under `TRITON_INTERPRET=1`).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kvbench.kernels.launch import pdl_kwargs, release_dependents, wait_prior
from kvbench.kernels.prefetch import l2_prefetch, launch_args

__all__ = ["GEMV_ENV", "gemv_config", "gemv_enabled", "linear"]

GEMV_ENV = "KVBENCH_GEMV"
PREFETCH_ENV = "KVBENCH_GEMV_PREFETCH_K"
MAX_ROWS = 16
SHARED_BUDGET = 200 * 1024  # bytes of pipelined tiles per program (an H200 SM has 227 KB)
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _prefetch_l2(ptrs):
    """Ask L2 for the 128-byte lines at `ptrs` (no registers filled, nothing waited for)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _gemv_kernel(
    X,
    W,
    B,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PREFETCH_K: tl.constexpr,
    PF_TABLE=None,
    PF_LEN=None,
    pf_budget=0,
    PF_REGIONS: tl.constexpr = 0,
    PF_NT: tl.constexpr = 128,
    PF_EVICT_LAST: tl.constexpr = False,
    PF_LINES: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    # grid: (cdiv(N, BLOCK_N),): one program per BLOCK_N output columns, all M rows
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    w_rows = W + rn.to(tl.int64)[:, None] * stride_wn
    if PDL:
        if PREFETCH_K > 0:  # the weights are not the previous kernel's output: fetch before waiting
            lines = tl.arange(0, PREFETCH_K // 64) * 64  # 64 16-bit elements = one 128-byte line
            last = (N - 1).to(tl.int64) * stride_wn  # rows past N ask for the last row's lines again
            _prefetch_l2(W + tl.minimum(rn.to(tl.int64) * stride_wn, last)[:, None] + lines[None, :])
        if PF_REGIONS > 0:  # the next attention's cache (`kernels.prefetch`), shared out over the programs
            l2_prefetch(PF_TABLE, PF_LEN, pf_budget, PF_TABLE, PF_REGIONS, PF_NT, PF_EVICT_LAST, PF_LINES)
        wait_prior()
        release_dependents()
    rm = tl.arange(0, BLOCK_M)
    mmask = rm < M
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None], other=0.0)
            x = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None], other=0.0)
        else:
            kmask = kk < K
            w = tl.load(w_rows + kk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            x = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        acc = tl.dot(x.to(w.dtype), tl.trans(w), acc, input_precision="ieee" if w.dtype == tl.float32 else "tf32")
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=mmask[:, None] & nmask[None, :]
    )


def gemv_enabled(device: torch.device) -> bool:
    """On by default on CUDA (`KVBENCH_GEMV=cublas` turns it off); in the interpreter only when
    `KVBENCH_GEMV=triton` asks for it (its tests do: interpreted, it would slow every engine test)."""
    want = os.environ.get(GEMV_ENV, "")
    return want == "triton" if device.type != "cuda" else want != "cublas"


@functools.cache
def gemv_config(n: int, k: int, device: torch.device, elem_bytes: int = 2) -> dict:
    """Launch knobs for an [N, K] weight (at any row count up to MAX_ROWS), from a sweep on the H200
    (scripts/bench_gemv.py --tune, results/2026-12-01f-h200): K in 256-column steps, deep
    pipelines, and programs big enough in shared memory (120-165 KB) that one fits per SM.
    Smaller programs, three to an SM, ran up to 30% slower with PDL at 16 rows: launched
    while the kernel before still ran, they were spread unevenly over the SMs.

    | N | BLOCK_N x stages | programs |
    |---|---|---|
    | <= 4096 (o, down) | 32 x 6 | 128 at N = 4096 |
    | <= 8192 (qkv) | 64 x 4 | 96 at N = 6144 |
    | more (gate_up, lm_head) | 64 x 3 | 448 at N = 28672 |
    """
    if n <= 4096:
        block_n, stages = 32, 6
    elif n <= 8192:
        block_n, stages = 64, 4
    else:
        block_n, stages = 64, 3
    block_k = 256 if k >= 256 else max(16, triton.next_power_of_2(k))
    # fp32 tiles are twice the bytes: fewer stages keep a program within SHARED_BUDGET
    per_stage = (block_n + MAX_ROWS) * block_k * elem_bytes
    stages = max(1, min(stages, _shared_budget(device) // per_stage))
    # `KVBENCH_GEMV_PREFETCH_K` (experiments): the prefetched columns per row, for every projection
    prefetch = int(os.environ.get(PREFETCH_ENV) or 2 * block_k)
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": 4, "num_stages": stages, "PREFETCH_K": prefetch}


@functools.cache
def _shared_budget(device: torch.device) -> int:
    """SHARED_BUDGET, or less on a GPU whose programs may take less (16 KB left for the rest)."""
    if device.type != "cuda":
        return SHARED_BUDGET
    optin = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 0)
    return min(SHARED_BUDGET, optin - 16 * 1024) if optin else SHARED_BUDGET


def _applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    if not (weight.is_cuda or _INTERPRETED) or not gemv_enabled(weight.device):
        return False
    if weight.dim() != 2 or weight.stride(1) != 1 or weight.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    rows = x.numel() // max(1, x.shape[-1])
    return x.dtype == weight.dtype and x.shape[-1] == weight.shape[1] and 0 < rows <= MAX_ROWS


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    prefetch: tuple | None = None,
    **knobs,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, through the GEMV kernel where it applies (see the module doc).

    `out` (x's leading shape by N, x's dtype, contiguous) receives the result when given.
    `knobs` override `gemv_config` (BLOCK_N, BLOCK_K, num_warps, num_stages, PREFETCH_K).
    `prefetch=(table, L, budget, evict_last, lines)`: under PDL the programs also ask L2 for an
    attention's cache before they wait (`kernels.prefetch`)."""
    if not _applies(x, weight):
        y = F.linear(x, weight, bias)
        return y if out is None else out.copy_(y)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if out is not None and (out.shape != (*x.shape[:-1], n) or out.dtype != x.dtype or not out.is_contiguous()):
        raise ValueError(f"out: expected a contiguous {(*x.shape[:-1], n)} {x.dtype} tensor, got {tuple(out.shape)}")
    y = out.view(m, n) if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    cfg = {**gemv_config(n, k, weight.device, weight.element_size()), **knobs}
    pdl = pdl_kwargs(x)
    if not pdl["PDL"]:
        cfg["PREFETCH_K"] = 0
    lines = min(cfg["PREFETCH_K"], k) // 64  # whole 128-byte lines inside each row, a power of two of them
    cfg["PREFETCH_K"] = 64 * (1 << (lines.bit_length() - 1)) if lines else 0
    pf = launch_args(prefetch, cfg["num_warps"], pdl["PDL"])
    _gemv_kernel[(triton.cdiv(n, cfg["BLOCK_N"]),)](
        x2, weight, bias if bias is not None else weight, y, m, n, k, x2.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=MAX_ROWS, EVEN_K=k % cfg["BLOCK_K"] == 0, HAS_BIAS=bias is not None, **cfg, **pf, **pdl,
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)
