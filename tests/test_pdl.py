"""Programmatic dependent launch (kvbench.kernels.launch).

A kernel launched with PDL may start while the previous kernel still runs, so it must
not touch memory before `griddepcontrol.wait`. On the CPU machine the kernels are
compiled for sm_90 (triton's bundled ptxas, no GPU) and their PTX is checked for that
order; on a GPU (`KVBENCH_TEST_DEVICE=cuda`) the decode kernels also run with and
without PDL, in CUDA graphs, and must give the same bits.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1" if os.environ.get("KVBENCH_TEST_DEVICE", "cpu") == "cpu" else "0")

import pytest
import torch

from kvbench.kernels.launch import pdl_active, pdl_kwargs, programmatic_launch

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("KVBENCH_TEST_DEVICE", "cpu")

# Compiled in a fresh interpreter: kernels defined under TRITON_INTERPRET=1 cannot be compiled.
PTX_PROBE = textwrap.dedent(
    """
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/scripts"]
    from sass_loop import compile_reduce, compile_split
    from kvbench.kernels.fused_ops import _rmsnorm_kernel, _rope_qk_kernel, _silu_mul_kernel
    from kvbench.kernels.gemv import _gemv_kernel
    from kvbench.kernels.quantize import _rotate_kernel, wht_params

    def plain(fn, consts, warps):
        sig = {}
        for n in fn.arg_names:
            if n in consts:
                sig[n] = "constexpr"
            elif n in ("PF_TABLE", "PF_LEN", "pf_budget"):
                sig[n] = {"PF_TABLE": "*i64", "PF_LEN": "*i32", "pf_budget": "i64"}[n]
            elif n.endswith("_ptr") or n in ("X", "Y", "S1", "S2", "W", "B"):
                sig[n] = "*fp32" if n in ("Y", "S1", "S2") else "*bf16"
            else:
                sig[n] = "fp32" if n == "eps" else "i32"
        src = ASTSource(fn, sig, consts)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})

    out = {}
    for pdl in (False, True):
        kernels = {
            "rmsnorm": plain(_rmsnorm_kernel, {"HAS_RES": True, "BLOCK": 1024, "PDL": pdl}, 4),
            "rope_qk": plain(_rope_qk_kernel, {"HAS_QN": False, "HAS_KN": False, "HB": 8, "BLOCK_D": 64,
                                               "PF_REGIONS": 0, "PF_NT": 64, "PF_EVICT_LAST": False, "PF_LINES": False,
                                               "PDL": pdl}, 2),
            "rope_qk_pf": plain(_rope_qk_kernel, {"HAS_QN": False, "HAS_KN": False, "HB": 8, "BLOCK_D": 64,
                                                  "PF_REGIONS": 3, "PF_NT": 64, "PF_EVICT_LAST": False, "PF_LINES": False,
                                                  "PDL": pdl}, 2),
            "rope_qk_pf_last": plain(_rope_qk_kernel, {"HAS_QN": False, "HAS_KN": False, "HB": 8, "BLOCK_D": 64,
                                                       "PF_REGIONS": 2, "PF_NT": 64, "PF_EVICT_LAST": True, "PF_LINES": False,
                                                       "PDL": pdl}, 2),
            "gemv_pf": plain(_gemv_kernel, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 128, "EVEN_K": True,
                                            "HAS_BIAS": True, "PREFETCH_K": 256 if pdl else 0, "PF_REGIONS": 2,
                                            "PF_NT": 128, "PF_EVICT_LAST": False, "PF_LINES": True, "PDL": pdl}, 4),
            "silu_mul": plain(_silu_mul_kernel, {"BLOCK": 512, "PDL": pdl}, 2),
            "rotate": plain(_rotate_kernel, {"D": 64, "BLOCK_R": 1, **wht_params(64), "PDL": pdl}, 1),
            "split-fp16": compile_split("fp16", 64, 4, 2, dim=64, pdl=pdl),
            "split-turbo4": compile_split("turbo4", 64, 2, 2, dim=64, pdl=pdl),
            "reduce-turbo4-asym": compile_reduce("turbo4-asym", True, dim=64, pdl=pdl),
            "reduce2-fp16": compile_reduce("fp16", True, dim=64, pdl=pdl, warps=2),
            "gemv": plain(_gemv_kernel, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 128, "EVEN_K": True,
                                         "HAS_BIAS": True, "PREFETCH_K": 256 if pdl else 0, "PF_REGIONS": 0,
                                         "PF_NT": 128, "PF_EVICT_LAST": False, "PF_LINES": False, "PDL": pdl}, 4),
        }
        out[str(pdl)] = {name: k.asm["ptx"] for name, k in kernels.items()}
    json.dump(out, sys.stdout)
    """
)

MEMORY_OPS = ("ld.global", "st.global", "cp.async", "atom.", "red.", "ld.volatile.global")


@pytest.fixture(scope="module")
def ptx():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run(
        [sys.executable, "-c", PTX_PROBE, str(ROOT)], capture_output=True, text=True, env=env, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def first(text: str, needles) -> int:
    hits = [i for i in (text.find(n) for n in needles) if i >= 0]
    return min(hits) if hits else -1


@pytest.mark.parametrize("name", ["rmsnorm", "rope_qk", "silu_mul", "rotate", "split-fp16", "split-turbo4", "gemv"])
def test_pdl_kernels_wait_before_touching_memory(ptx, name):
    """With PDL every kernel but the reduction waits for the previous one before its first
    global load or store, then releases the next, except the two that precede the split
    kernel (RoPE, the query rotation), which let it start only as they exit; without PDL
    neither instruction is there."""
    on, off = ptx["True"][name], ptx["False"][name]
    assert "griddepcontrol" not in off
    wait, release = on.find("griddepcontrol.wait"), on.find("griddepcontrol.launch_dependents")
    mem = first(on, MEMORY_OPS)
    assert wait >= 0, name
    assert (release > wait) if name not in ("rope_qk", "rotate") else (release < 0), name
    assert mem > wait, f"{name}: a global memory access precedes griddepcontrol.wait"


def test_pdl_reduction_writes_before_it_waits(ptx):
    """The reduction lets the next kernel (the output GEMV) start and stores the fresh token
    (slot L, which the split kernel does not read) before it waits, and reads the splits'
    partial results only after."""
    on, off = ptx["True"]["reduce-turbo4-asym"], ptx["False"]["reduce-turbo4-asym"]
    assert "griddepcontrol" not in off
    wait = on.find("griddepcontrol.wait")
    assert 0 <= on.find("griddepcontrol.launch_dependents") < wait
    assert 0 <= first(on, ("st.global",)) < wait
    assert "ld.global" in on[wait:]  # the merge's loads come after the wait


def test_reduction_issues_every_merge_load_before_its_first_barrier(ptx):
    """A merge on two warps (past 32 splits) loads m, l and acc before its first cross-warp
    reduction (a barrier): one round trip to L2, not one per reduction (see
    `auto_reduce_warps`). Under PDL the merge is what follows the wait."""
    code = ptx["True"]["reduce2-fp16"]
    body = code[code.find("griddepcontrol.wait") :]
    barrier = body.find("bar.sync")
    assert body.count("ld.global") >= 3 and barrier > 0
    assert "ld.global" not in body[barrier:], "a merge load waits behind a cross-warp reduction"


def test_pdl_gemv_prefetches_weights_before_it_waits(ptx):
    """The GEMV asks L2 for its first weight lines before it waits (they are not the previous
    kernel's output), and loads x and the weights only after; without PDL it prefetches nothing."""
    on, off = ptx["True"]["gemv"], ptx["False"]["gemv"]
    assert "prefetch" not in off and "griddepcontrol" not in off
    wait = on.find("griddepcontrol.wait")
    assert 0 <= on.find("prefetch.global.L2") < wait
    assert first(on, MEMORY_OPS) > wait


@pytest.mark.parametrize("name", ["rope_qk_pf", "rope_qk_pf_last"])
def test_pdl_rope_prefetches_the_cache_before_it_waits(ptx, name):
    """With a prefetch table, RoPE asks L2 for the cache (bulk prefetches, evict-last where asked)
    before it waits for the QKV GEMV; it stores nothing before the wait and still lets the split
    kernel start only as it exits. Without PDL there is no prefetch (and ptxas took the PTX)."""
    on, off = ptx["True"][name], ptx["False"][name]
    assert "prefetch" not in off and "griddepcontrol" not in off
    wait = on.find("griddepcontrol.wait")
    assert 0 <= on.find("cp.async.bulk.prefetch.L2.global") < wait
    assert ("createpolicy.fractional.L2::evict_last" in on) == name.endswith("_last")
    assert "griddepcontrol.launch_dependents" not in on
    assert on.find("st.global") > wait


def test_pdl_gemv_prefetches_the_cache_line_by_line_before_it_waits(ptx):
    """With a prefetch table (by line), the GEMV asks L2 for the cache's lines (predicated line
    prefetches, beside its own weight lines) before it waits; nothing is stored before the wait."""
    on, off = ptx["True"]["gemv_pf"], ptx["False"]["gemv_pf"]
    assert "prefetch" not in off
    wait = on.find("griddepcontrol.wait")
    assert 0 <= on.find("@p prefetch.global.L2") < wait and "cp.async.bulk" not in on
    assert on.find("st.global") > wait


def test_pdl_only_where_asked_and_supported():
    """PDL is off by default, on inside `programmatic_launch` on a GPU of sm_90+, never on
    CPU tensors (the interpreter) and never after the block ends."""
    t = torch.zeros(1)
    assert not pdl_active(t)
    with programmatic_launch():
        assert not pdl_active(t)  # CPU
        assert pdl_kwargs(t) == {"PDL": False, "launch_pdl": False}
        with programmatic_launch(False):
            assert not pdl_active(t)
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") == "0":
        g = torch.zeros(1, device="cuda")
        hopper = torch.cuda.get_device_capability()[0] >= 9 and os.environ.get("KVBENCH_PDL", "1") != "0"
        with programmatic_launch():
            assert pdl_active(g) == hopper
        assert not pdl_active(g)


@pytest.mark.skipif(DEVICE == "cpu", reason="compiled kernels on a GPU only (KVBENCH_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("mode", ["fp16", "int8", "turbo4-asym", "turbo4", "turbo4-delegated"])
def test_pdl_decode_step_same_bits(mode, seed):
    """Several layers' attention + append launched back to back in a CUDA graph, with PDL
    and without: the outputs and the caches agree bit for bit."""
    b, hkv, group, dim, length, cap, cold, layers = 2, 8, 4, 128, 3000, 3100, 2900, 4
    torch.set_default_device("cuda")  # the cache helpers make tensors on the default device
    try:
        _same_bits(mode, seed, b, hkv, group, dim, length, cap, cold, layers)
    finally:
        torch.set_default_device(None)


def _same_bits(mode, seed, b, hkv, group, dim, length, cap, cold, layers):
    from test_kernels import codec_kwargs, make_cache, random_tokens

    from kvbench.kernels.decode_attention import DecodeWorkspace, decode_attention
    from kvbench.kernels.fused_ops import rmsnorm

    kw = codec_kwargs(mode, dim)
    caches = [make_cache(mode, b, hkv, dim, cap, length, cold, torch.float16, kw) for _ in range(layers)]
    q = (3 * torch.randn(b, hkv * group, dim, device="cuda")).to(torch.float16)
    fresh = [random_tokens(b, hkv, 2, dim, torch.float16).cuda().unbind(2) for _ in range(layers)]
    ln = torch.ones(dim, dtype=torch.float16, device="cuda")
    length_t = torch.tensor([length], dtype=torch.int32, device="cuda")
    cold_t = torch.tensor([cold], dtype=torch.int32, device="cuda")
    results = {}
    for pdl in (False, True):
        bufs = [{k: v.clone().cuda() for k, v in c.items()} for c in caches]
        ws = DecodeWorkspace.for_cache(mode, q, hkv, cap)
        outs = [torch.empty_like(q) for _ in range(layers)]

        def step(bufs=bufs, ws=ws, outs=outs):
            x = q
            for (k_new, v_new), buf, out in zip(fresh, bufs, outs, strict=True):
                decode_attention(mode, x, k_new, v_new, buf, length_t, 0.09, cold_length=cold_t, out=out,
                                 workspace=ws, append=True, **kw)  # fmt: skip
                x = rmsnorm(out, ln, 1e-6)  # the next layer's query depends on this one

        with programmatic_launch(pdl):
            step()  # compile
            for c, src in zip(bufs, caches, strict=True):  # undo the warm-up's append
                for k, v in src.items():
                    c[k].copy_(v)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
        graph.replay()
        torch.cuda.synchronize()
        results[pdl] = (outs, bufs)
    (o0, b0), (o1, b1) = results[False], results[True]
    for a, c in zip(o0, o1, strict=True):
        assert torch.equal(a, c), f"seed {seed}: outputs differ with PDL"
    for x, y in zip(b0, b1, strict=True):
        for k in x:
            assert torch.equal(x[k].nan_to_num(), y[k].nan_to_num()), f"seed {seed}: cache {k} differs with PDL"
