"""Ask L2 for a layer's KV cache while the QKV projection still streams its weights.

In the GPU decode step (PDL, sm_90+) the RoPE kernel's programs start as soon as the QKV
GEMV's have (they wait for its output, q and k). The tokens the attention's split kernel
will read, [0, L) of every cache plane, were written in earlier steps, so the RoPE programs
can name them to L2 before they wait: one `cp.async.bulk.prefetch.L2` per `CHUNK` bytes
of a plane (asynchronous: nothing lands in registers, nothing is waited for). The DRAM
reads of the cache then overlap the GEMV's weight stream instead of following it, and
the split kernel reads L2.

A cache is described to the kernel by a small device table (`region_table`), one row
per buffer: its address, its planes (contiguous runs of tokens: one per batch row and
kv head, or per channel of int8's token-major V), the bytes between planes and per
token, and the tokens a plane holds. The prefetch covers min(L, tokens) tokens of every
plane, and only when the whole of it fits in `budget` bytes (at 32K, or at batch 16,
a layer's cache is larger than L2, and what a budget would keep is read back anyway).
The QKV GEMV's programs can do the same instead (`linear(..., prefetch=...)`), in bulk or
one 128-byte line at a time.

Off by default (`default_config`'s `l2_prefetch_mb=0`): measured end to end on the H200,
every variant made every mode slower, fp16 most (docs/kernel-notes.md, thirteenth session).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvbench.kernels.quantize import buffer_layout

__all__ = ["CHUNK", "LINE", "POLICIES", "l2_prefetch", "launch_args", "planned_ranges", "region_table"]

CHUNK = 16384  # bytes per bulk prefetch (a multiple of 16, as the instruction needs)
_CHUNK = tl.constexpr(CHUNK)
LINE = 128  # bytes per line prefetch (LINES)
_LINE = tl.constexpr(LINE)
POLICIES = ("normal", "evict_last")


@triton.jit
def _bulk_prefetch(addr, size, ok, EVICT_LAST: tl.constexpr):
    """One `cp.async.bulk.prefetch.L2` of `size` bytes at `addr` per element where `ok`."""
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b64 pol; setp.ne.b32 p, $1, 0; "
            "createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
            "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$2], $3, pol; } // $0",
            "=r,r,l,r", [ok.to(tl.int32), addr, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $1, 0; @p cp.async.bulk.prefetch.L2.global [$2], $3; } // $0",
            "=r,r,l,r", [ok.to(tl.int32), addr, size.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


@triton.jit
def _line_prefetch(addr, ok):
    """One `prefetch.global.L2` of the 128-byte line at `addr` per element where `ok`."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $1, 0; @p prefetch.global.L2 [$2]; } // $0",
        "=r,r,l", [ok.to(tl.int32), addr], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _plane_bytes(TABLE, r, length):
    """Region r's bytes to fetch per plane: min(L, tokens) tokens, up to a multiple of 16."""
    stride = tl.load(TABLE + r * 5 + 2)
    tok = tl.load(TABLE + r * 5 + 3)
    n = tl.minimum(length, tl.load(TABLE + r * 5 + 4)) * tok
    return tl.minimum((n + 15) // 16 * 16, stride)


@triton.jit
def l2_prefetch(
    TABLE, LEN, budget, LOG, N_REGIONS: tl.constexpr, NT: tl.constexpr, EVICT_LAST: tl.constexpr,
    LINES: tl.constexpr = False, RECORD: tl.constexpr = False,
):  # fmt: skip
    """Called by every program of a (1- or 2-D) grid: together they ask L2 for every region's
    first min(L, tokens) tokens of each plane, NT chunks at a time per program, unless the
    total exceeds `budget` bytes. TABLE: `region_table`'s rows (address, planes, bytes between
    planes, bytes per token, tokens per plane). LINES: one `prefetch.global.L2` per 128-byte
    line instead of a bulk prefetch per CHUNK bytes (EVICT_LAST then unused). RECORD (tests):
    store each chunk's (offset from the region's address, size) into LOG[region, chunk] instead
    (the Triton interpreter runs no PTX)."""
    pid = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64)
    n_prog = (tl.num_programs(0) * tl.num_programs(1)).to(tl.int64)
    length = tl.load(LEN).to(tl.int64)
    total = length * 0
    for r in tl.static_range(N_REGIONS):
        total += tl.load(TABLE + r * 5 + 1) * _plane_bytes(TABLE, r, length)
    if total <= budget:
        lane = tl.arange(0, NT).to(tl.int64)
        chunk: tl.constexpr = _LINE if LINES else _CHUNK
        for r in tl.static_range(N_REGIONS):
            base = tl.load(TABLE + r * 5)
            planes = tl.load(TABLE + r * 5 + 1)
            stride = tl.load(TABLE + r * 5 + 2)
            n = _plane_bytes(TABLE, r, length)
            per_plane = (n + chunk - 1) // chunk
            count = planes * per_plane
            for c0 in range(pid * NT, count, n_prog * NT):
                idx = c0 + lane
                ok = idx < count
                plane = idx // tl.maximum(per_plane, 1)
                off = (idx - plane * per_plane) * chunk
                size = tl.minimum(n - off, chunk)
                if RECORD:
                    slot = LOG + (r * tl.load(TABLE + N_REGIONS * 5) + idx) * 2
                    tl.store(slot, plane * stride + off, mask=ok)
                    tl.store(slot + 1, size, mask=ok)
                elif LINES:
                    _line_prefetch(base + plane * stride + off, ok)
                else:
                    _bulk_prefetch(base + plane * stride + off, size, ok, EVICT_LAST)


def launch_args(prefetch: tuple | None, num_warps: int, pdl: bool) -> dict:
    """The PF_* arguments of a kernel that calls `l2_prefetch` (RoPE, the GEMV), from a
    `prefetch=(table, L, budget, evict_last, lines)` argument; none without PDL."""
    if prefetch is None or not pdl:
        return {}
    table, length, budget, evict_last, by_line = prefetch
    return {
        "PF_TABLE": table,
        "PF_LEN": length,
        "pf_budget": int(budget),
        "PF_REGIONS": table.shape[0] - 1,
        "PF_NT": 32 * num_warps,
        "PF_EVICT_LAST": bool(evict_last),
        "PF_LINES": bool(by_line),
    }


def _region(buf: torch.Tensor, token_major: int | None) -> tuple[int, int, int, int, int] | None:
    """(address, planes, bytes between planes, bytes per token, tokens per plane) of a cache
    buffer [B, H, cap, ...], or None where the bulk prefetch's 16-byte alignment does not hold."""
    es = buf.element_size()
    if token_major is not None:  # int8 V stored [B, H, D, P]: every channel's tokens contiguous
        b, h, cap, d = buf.shape
        row = (b * h * d, token_major * es, es, token_major)
    else:
        b, h, cap = buf.shape[:3]
        tok = math.prod(buf.shape[3:]) * es
        row = (b * h, cap * tok, tok, cap)
    if buf.data_ptr() % 16 or row[1] % 16:
        return None
    return (buf.data_ptr(), *row)


def region_table(mode_fmt_v: str, buffers: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The prefetch table of a cache's `buffers` (storage format of V: `mode_fmt_v`), int64
    [R + 1, 5] on their device; the last row holds a region's most chunks (lines; for RECORD logs).
    None when no buffer qualifies."""
    rows = []
    for key, buf in buffers.items():
        r = _region(buf, buffer_layout("l2_prefetch", key, mode_fmt_v, buf))
        if r is not None:
            rows.append(r)
    if not rows:
        return None
    dev = next(iter(buffers.values())).device
    most = max(p * triton.cdiv(s, LINE) for _, p, s, _, _ in rows)  # (LINES chunks: the finer)
    return torch.tensor([*rows, (most, 0, 0, 0, 0)], dtype=torch.int64, device=dev)


def planned_ranges(table: torch.Tensor, length: int, budget: int, chunk: int = CHUNK) -> list[set[tuple[int, int]]]:
    """What `l2_prefetch` should ask for (the tests' reference): per region, the set of
    (offset from its address, size) chunks."""
    rows = table[:-1].tolist()
    plans, total = [], 0
    for _, planes, stride, tok, cap in rows:
        n = min(-(-min(length, cap) * tok // 16) * 16, stride)
        total += planes * n
        chunks = set()
        for p in range(planes):
            for off in range(0, n, chunk):
                chunks.add((p * stride + off, min(n - off, chunk)))
        plans.append(chunks)
    return plans if total <= budget else [set() for _ in rows]
