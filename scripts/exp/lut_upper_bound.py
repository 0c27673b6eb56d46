#!/usr/bin/env python
"""Timing only (wrong values): how much faster would the turbo kernels be if a 4-bit code's
centroid came from ONE byte plane instead of two (an 8-bit centroid grid, read as the fp16
1024 + u)? Runs a script or module with the 4-bit lookup's PTX swapped, before any kernel
compiles:

    LUT=g7 python scripts/exp/lut_upper_bound.py scripts/bench_kernels.py --modes turbo4 ...
    LUT=g8 python scripts/exp/lut_upper_bound.py -m kvbench decode-bench ...

g8: one table plane of 16 bytes, bit 3 of each code chooses between its halves (lop3 with a
    sign-replicated mask): 8 instructions per 4 codes (the exact fp16 lookup takes 11).
g7: 7-bit entries in both halves, so the half that does not hold a code's entry reads
    0x00 through prmt's sign-replicate mode and an OR joins them: 6 per 4 codes.
Either way the 8 outputs keep the exact lookup's order and registers, so only the lookup's
instruction count changes. LUT unset or "exact": the committed code.
"""

import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import triton.language as tl

import kvbench.kernels.decode_attention as da


def one_plane_asm(kind: str) -> str:
    """$0..$7 fp16 outputs (the committed asm's order), $8 the word of 8 codes, $9..$12 table words."""
    body = [".reg .b32 h, x, a, b, m, s, u, c;", "mov.b32 c, 0x64646464;"]
    for half, outs in (("mov.b32 h, $8;", ("$0", "$4", "$2", "$6")), ("shr.u32 h, $8, 16;", ("$1", "$5", "$3", "$7"))):
        body.append(half)
        if kind == "g7":
            body += ["xor.b32 x, h, 0x8888;", "prmt.b32 a, $9, $10, h;", "prmt.b32 b, $11, $12, x;", "or.b32 u, a, b;"]
        else:
            body += ["shl.b32 a, h, 4;", "prmt.b32 m, a, h, 0xD9C8;", "and.b32 s, h, 0x7777;"]
            body += ["prmt.b32 a, $9, $10, s;", "prmt.b32 b, $11, $12, s;", "lop3.b32 u, a, b, m, 0xD8;"]
        body += ["prmt.b32 a, u, c, 0x5140;", "prmt.b32 b, u, c, 0x7362;"]
        body += [f"mov.b32 {{{outs[0]}, {outs[1]}}}, a;", f"mov.b32 {{{outs[2]}, {outs[3]}}}, b;"]
    return "{\n" + "\n".join(body) + "\n}"


kind = os.environ.get("LUT", "exact")
if kind in ("g7", "g8"):
    da._PRMT_ASM4 = tl.constexpr(one_plane_asm(kind))  # the module's globals, which the JIT reads at compile time
elif kind != "exact":
    sys.exit(f"LUT must be exact, g7 or g8, got {kind!r}")
print(f"[lut_upper_bound] 4-bit lookup: {kind}", file=sys.stderr)

args = sys.argv[1:]
if args[:1] == ["-m"]:
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
else:
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
