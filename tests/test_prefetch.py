"""The L2 prefetch of a layer's cache ahead of its attention (kvbench.kernels.prefetch).

The prefetch instruction is PTX, which the Triton interpreter does not run: here the kernel's
chunking runs in RECORD mode (each chunk's offset and size stored instead of fetched) against
`planned_ranges`, on the caches of every mode; test_pdl checks the compiled PTX; on a GPU the
decode step's bits must not change with it on.
"""

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1" if os.environ.get("KVBENCH_TEST_DEVICE", "cpu") == "cpu" else "0")

import pytest
import torch
import triton
import triton.language as tl
from test_kernels import codec_kwargs, make_cache

from kvbench.kernels.prefetch import CHUNK, LINE, l2_prefetch, planned_ranges, region_table
from kvbench.kernels.reference import FORMATS

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _record_kernel(TABLE, LEN, budget, LOG, N_REGIONS: tl.constexpr, NT: tl.constexpr, LINES: tl.constexpr):
    l2_prefetch(TABLE, LEN, budget, LOG, N_REGIONS, NT, False, LINES, RECORD=True)


def _recorded(table, length, budget, grid, nt, lines=False):
    regions = table.shape[0] - 1
    most = int(table[-1, 0])
    log = torch.full((regions, most, 2), -1, dtype=torch.int64)
    _record_kernel[grid](
        table, torch.tensor([length], dtype=torch.int32), budget, log, N_REGIONS=regions, NT=nt, LINES=lines
    )
    out = []
    for r in range(regions):
        rows = log[r][log[r, :, 0] >= 0].tolist()
        out.append([tuple(x) for x in rows])
    return out


@pytest.mark.skipif(not INTERPRETED, reason="RECORD runs in the interpreter (CPU tensors)")
@pytest.mark.parametrize("mode", list(FORMATS))
def test_prefetch_chunks_cover_every_plane_once(mode, seed):
    """Every region's chunks, over all programs of a 2-D grid, are exactly the planned ones
    (each once): [0, min(L, tokens)) of every plane, rounded up to 16 bytes; nothing past a
    plane; nothing at all over the budget."""
    g = torch.Generator().manual_seed(seed)
    b, hkv, dim = int(torch.randint(1, 3, (1,), generator=g)), 2, 64
    cap = 1000 + int(torch.randint(0, 700, (1,), generator=g)) // 16 * 16  # not a multiple of the chunk
    bufs = make_cache(mode, b, hkv, dim, cap, cap - 3, cap - 300, torch.float16, codec_kwargs(mode, dim))
    table = region_table(FORMATS[mode][1], bufs)
    assert table is not None and table.shape[1] == 5
    for length in (0, 5, cap // 3 + 1, cap):
        want = planned_ranges(table, length, 1 << 40)
        got = _recorded(table, length, 1 << 40, (2, 3), 16)
        for chunks, expect, (_, planes, stride, tok, tokens) in zip(got, want, table[:-1].tolist(), strict=True):
            assert len(chunks) == len(set(chunks)) == len(expect), (mode, length)
            assert set(chunks) == expect
            assert all(0 < size <= CHUNK and size % 16 == 0 and off % 16 == 0 for off, size in chunks)
            per_plane = sum(size for _, size in chunks) // max(planes, 1)
            assert per_plane == min(-(-min(length, tokens) * tok // 16) * 16, stride)
    # line by line (128-byte chunks): the same bytes
    for length in (7, cap // 2):
        got = _recorded(table, length, 1 << 40, (3, 1), 64, lines=True)
        assert [set(c) for c in got] == planned_ranges(table, length, 1 << 40, LINE)
        assert all(len(c) == len(set(c)) for c in got)
    # one byte short of the whole: nothing
    full = sum(sum(s for _, s in c) for c in planned_ranges(table, cap, 1 << 40))
    assert all(not c for c in _recorded(table, cap, full - 1, (1, 2), 32))
    assert sum(len(c) for c in _recorded(table, cap, full, (1, 2), 32)) > 0


@pytest.mark.skipif(not INTERPRETED, reason="host-side, on CPU tensors")
@pytest.mark.parametrize("mode", list(FORMATS))
def test_region_table_describes_the_buffers(mode):
    """A row per buffer; its planes tile the buffer's storage exactly (int8's token-major V
    by channel, the rest by batch row and kv head)."""
    b, hkv, dim, cap = 2, 3, 64, 160
    bufs = make_cache(mode, b, hkv, dim, cap, 100, 60, torch.float16, codec_kwargs(mode, dim))
    table = region_table(FORMATS[mode][1], bufs)
    rows = table[:-1].tolist()
    assert len(rows) == len(bufs)
    for (addr, planes, stride, tok, tokens), (key, buf) in zip(rows, bufs.items(), strict=True):
        assert addr == buf.data_ptr()
        assert planes * stride == buf.untyped_storage().nbytes() - (addr - buf.untyped_storage().data_ptr())
        # delegated's hot window holds its own few slots (all fetched: tokens <= L)
        assert tokens * tok <= stride and tokens >= buf.shape[2] and (tokens >= cap or key == "v_hot")
    assert int(table[-1, 0]) == max(p * -(-s // LINE) for _, p, s, _, _ in rows)


@pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(), reason="compiled kernels on a GPU only")
@pytest.mark.parametrize("policy", [False, True])
def test_prefetch_same_bits_on_gpu(policy, seed):
    """Under PDL, the QKV GEMV and RoPE, either of them asking L2 for a real cache (int8's
    token-major V, delegated's four buffers; in bulk, evict-last or not, or by line), give the bits
    they give without, and the cache is untouched."""
    from kvbench.kernels.fused_ops import rope_qk
    from kvbench.kernels.gemv import linear
    from kvbench.kernels.launch import programmatic_launch

    hq, hkv, dim, cap = 32, 8, 128, 2100
    torch.set_default_device("cuda")
    try:
        for mode in ("int8", "turbo4-delegated"):
            bufs = make_cache(mode, 2, hkv, dim, cap, 2000, 1900, torch.float16, codec_kwargs(mode, dim))
            before = {k: v.clone() for k, v in bufs.items()}
            table = region_table(FORMATS[mode][1], bufs)
            length = torch.tensor([2000], dtype=torch.int32)
            x = torch.randn(2, 1, 4096, dtype=torch.float16)
            w = torch.randn((hq + 2 * hkv) * dim, 4096, dtype=torch.float16) / 64
            cos, sin = torch.randn(1, dim, dtype=torch.float16), torch.randn(1, dim, dtype=torch.float16)
            outs = []
            for where, pf in ((None, None), ("rope", (table, length, 1 << 40, policy, False)),
                              ("gemv", (table, length, 1 << 40, False, policy))):  # fmt: skip
                with programmatic_launch():
                    qkv = linear(x, w, prefetch=pf if where == "gemv" else None)
                    outs.append(rope_qk(qkv, cos, sin, hq, hkv, dim, prefetch=pf if where == "rope" else None))
            torch.cuda.synchronize()
            for other in outs[1:]:
                for a, b in zip(outs[0], other, strict=True):
                    assert torch.equal(a, b)
            for k, v in bufs.items():  # bit for bit (the poison past L is NaN)
                assert torch.equal(v.contiguous().view(torch.uint8), before[k].contiguous().view(torch.uint8)), k
    finally:
        torch.set_default_device(None)


def test_launch_args_only_under_pdl():
    """The PF_* launch arguments: none without a table or without PDL; else the table's regions
    (its last row is the log size) and one lane per thread."""
    from kvbench.kernels.prefetch import launch_args

    table = torch.zeros(4, 5, dtype=torch.int64)
    length = torch.tensor([3], dtype=torch.int32)
    assert launch_args(None, 4, True) == {} and launch_args((table, length, 10, False, True), 4, False) == {}
    args = launch_args((table, length, 2.0**20, True, False), 4, True)
    assert args["PF_REGIONS"] == 3 and args["PF_NT"] == 128 and args["pf_budget"] == 2**20
    assert args["PF_TABLE"] is table and args["PF_LEN"] is length
    assert args["PF_EVICT_LAST"] is True and args["PF_LINES"] is False


def test_l2_prefetch_args_by_config(monkeypatch):
    """Off by default ({}, {}); `l2_prefetch_mb` and `l2_prefetch_from` give the GEMV or RoPE the
    `prefetch` argument (a table of the cache's buffers); a bad choice is a one-line error."""
    from kvbench.kernels.decode_attention import l2_prefetch_args

    bufs = make_cache("int8", 1, 2, 64, 160, 100, 60, torch.float16, codec_kwargs("int8", 64))
    length = torch.tensor([100], dtype=torch.int32)
    assert l2_prefetch_args("int8", bufs, 1, length) == ({}, {})
    for where, lines in (("gemv", True), ("rope", False)):
        cfg = {"l2_prefetch_mb": 2, "l2_prefetch_from": where, "l2_prefetch_lines": lines}
        monkeypatch.setenv("KVBENCH_ATTN_CONFIG", json.dumps({"int8": cfg}))
        gemv_kw, rope_kw = l2_prefetch_args("int8", bufs, 1, length)
        table, got_len, budget, evict_last, by_line = (gemv_kw if where == "gemv" else rope_kw)["prefetch"]
        assert (rope_kw if where == "gemv" else gemv_kw) == {}
        assert table.shape[0] == len(bufs) + 1 and got_len is length and budget == 2 * 2**20
        assert evict_last is False and by_line is lines
    monkeypatch.setenv("KVBENCH_ATTN_CONFIG", json.dumps({"int8": {"l2_prefetch_from": "split"}}))
    with pytest.raises(ValueError, match="l2_prefetch_from"):
        l2_prefetch_args("int8", bufs, 1, length)
