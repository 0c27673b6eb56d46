#!/usr/bin/env python
"""Replays tests/test_kernels.py::test_decode_append_stores_slot_l for int8 (fused append,
G=3, written after the merge) on the GPU with one seed, N times, and prints every int8 code
that differs from the reference's write: where it is, both codes and x / scale there.

    KVBENCH_TEST_DEVICE=cuda python scripts/exp/int8_write_check.py 2870484150 20
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("KVBENCH_TEST_DEVICE", "cuda")
os.environ.setdefault("TRITON_INTERPRET", "0")
root = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(root), str(root / "tests")]

import test_kernels as tk  # noqa: E402
import torch  # noqa: E402

from kvbench.kernels import reference as ref  # noqa: E402
from kvbench.kernels.decode_attention import decode_attention  # noqa: E402

seed, runs = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
torch.set_default_device(tk.DEVICE)
for run in range(runs):
    torch.manual_seed(seed + run)
    mode, group, b, hkv, dim, length, cap, cold = "int8", 3, 2, 3, 64, 37, 50, 20
    kw = tk.codec_kwargs(mode, dim)
    got = tk.make_cache(mode, b, hkv, dim, cap, length, cold, tk.F16, kw)
    want = {key: buf.clone() for key, buf in got.items()}
    q = (3 * torch.randn(b, hkv * group, dim)).to(tk.F16)
    k_new, v_new = tk.random_tokens(b, hkv, 2, dim, tk.F16).unbind(2)
    out = torch.full_like(q, float("nan"))
    lt, ct = torch.tensor([length], dtype=torch.int32), torch.tensor([cold], dtype=torch.int32)
    decode_attention(mode, q, k_new, v_new, got, lt, 0.125, cold_length=ct, out=out, append=True, fuse_append=True,
                     write_first=False, **kw)  # fmt: skip
    ref.write_kv(mode, k_new, v_new, want, length, cold_length=cold, **kw)
    bad = 0
    for key, src in (("k", k_new), ("v", v_new)):
        diff = (got[key] != want[key]).nonzero().tolist()
        bad += len(diff)
        for bi, hi, t, di in diff[:8]:
            xf = src[bi, hi].float()
            scale = xf.abs().amax() / 127.0
            print(f"seed {seed + run} {key}[{bi},{hi},{t},{di}]: kernel {got[key][bi, hi, t, di].item()} "
                  f"reference {want[key][bi, hi, t, di].item()} x/scale {(xf[di] / scale).item():.6f} (slot L={length})")  # fmt: skip
        if len(diff) > 8:
            print(f"  ... {len(diff)} in all")
    print(f"seed {seed + run}: {'ok' if not bad else f'{bad} codes differ'}")
