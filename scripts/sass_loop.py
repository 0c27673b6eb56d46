#!/usr/bin/env python
"""SASS instruction counts of the split kernel's main loop, compiled ahead of time for
sm_90 on any machine (no GPU: triton's bundled ptxas and nvdisasm do the work).

    python scripts/sass_loop.py                 # fp16 and int8, Llama-3.1-8B shapes, bf16
    python scripts/sass_loop.py --modes int8 --block-n 64 --warps 2 --stages 2
    python scripts/sass_loop.py --reduce --modes fp16,turbo4-asym   # the reduction kernel, whole

Prints, per mode, shared memory and, for each backward branch (a loop), its
instruction count (and the count with no conditional block taken: the path of a block
that needs no lazy rescale), its barriers, and the most frequent opcodes. The
compiler is the local triton's (3.8 on the CPU machine), not the GPU machine's 3.6,
unless a triton 3.6 sits first on the path
(`pip install --target DIR triton==3.6.0; PYTHONPATH=DIR python ...`):
use the counts for direction and size, and time the change on the GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvbench.kernels.decode_attention import (
    _decode_reduce_kernel,
    _decode_split_kernel,
    default_config,
    int8_dot_flags,
    merge_block,
    prmt_flag,
)
from kvbench.kernels.quantize import FORMAT_IDS, wht_params
from kvbench.kernels.reference import FORMATS

ELEMENT = {"float": "*bf16", "int8": "*i8", "turbo4": "*u8", "turbo3": "*u8", "delegated": "*u8"}
# the prmt lookup's `default_config` knobs that have a 0/1 flag here
LOOKUP_KNOBS = {
    "lut_regs": "the prmt table words per-thread",
    "dot_fence": "the centroid tiles through `_dot_fence` before their dots",
    "hoist_lut": "the prmt table's words loaded once before the loop",
    "v3_set_major": "a 3-bit V's code words loaded as [set, token] tiles",
}
ALIGNED_INTS = ("stride_qb", "stride_qh", "cap", "v_cap", "hot_cap")  # multiples of 16 in practice


def compile_split(
    mode: str,
    block_n: int,
    warps: int,
    stages: int,
    group: int = 4,
    dim: int = 128,
    int8_dot: str | None = None,
    pdl: bool = False,
    rescale_tau: float | None = None,
    defer_sums: bool | None = None,
    unrotate: bool = False,
    rotated_out: bool = False,
    sparse_v: float = 0.0,
    maxnreg: int | None = None,
    knobs: dict | None = None,
):
    """The split kernel of `mode` compiled for sm_90, with pointers and strides 16-aligned
    (`unrotate`: a turbo V's sums inverse-rotated in the kernel, as `merge_cols` launches it;
    `rotated_out`: delegated's hot sums rotated into V's basis, as `rotated_out` launches it;
    `knobs`: `default_config` keys set over the mode's defaults)."""
    kf, vf = FORMATS[mode]
    cfg = default_config(mode)
    cfg.update(knobs or {})
    uses_prmt = kf.startswith("turbo") or vf.startswith(("turbo", "delegated")) or kf == "int8"
    fn = _decode_split_kernel
    pointers = {"Q": "*bf16", "K": ELEMENT[kf], "V": ELEMENT[vf], "VH": "*bf16", "LEN": "*i32", "COLD": "*i32"}
    pointers["STAMPS"] = "*i64"
    consts = {
        "G": group, "D": dim, "BLOCK_G": max(16, triton.next_power_of_2(group)), "BLOCK_N": block_n,
        "K_FMT": FORMAT_IDS[kf], "V_FMT": FORMAT_IDS[vf], "V_TOKEN_MAJOR": vf == "int8",
        "PRECISION": "tf32",
        "PRMT": prmt_flag(cfg, uses_prmt),
        **int8_dot_flags(int8_dot or cfg["int8_dot"]), "PDL": pdl, "STAMP": False,
        "RESCALE_TAU": float(cfg["rescale_tau"] if rescale_tau is None else rescale_tau),
        "DEFER_SUMS": bool(cfg["defer_sums"] if defer_sums is None else defer_sums),
        "UNROTATE": unrotate, "ROTATE_HOT": rotated_out and vf == "delegated", "ROWS": triton.next_power_of_2(group),
        "INV_SQRT_D": wht_params(dim)["INV_SQRT_D"] if unrotate or rotated_out else 1.0,
        "SPARSE_V": math.log2(sparse_v) if sparse_v > 0 else 0.0, "SET_MAJOR": bool(cfg["v3_set_major"]),
    }  # fmt: skip
    scales = {"KS": kf, "VS": vf}  # int8's two bf16 scales of a token load as one i32; turbo's typed fp32 here

    def table(name):
        return "*i32" if name.startswith("CB") or scales.get(name) == "int8" else "*fp32"

    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    return compile_sm90(fn, consts, pointers, table, options, ALIGNED_INTS)


def compile_sm90(fn, consts, pointers, table, options, aligned=()):
    """`fn` compiled for sm_90: `consts` as constexprs, `pointers` {name: type}, the other
    upper-case arguments pointers of type `table(name)`, qk_scale fp32, the rest i32;
    pointers and the `aligned` integers 16-aligned."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name == "qk_scale":
            sig[name] = "fp32"
        elif name in pointers or name.isupper():
            sig[name] = pointers.get(name) or table(name)
        else:
            sig[name] = "i32"
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if sig[name].startswith("*") or name in aligned
    }
    src = ASTSource(fn, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_reduce(
    mode: str,
    append: bool,
    group: int = 4,
    dim: int = 128,
    pdl: bool = False,
    warps: int = 1,
    cols: int = 0,
    rotated_out: bool = False,
):
    """The reduction kernel of `mode` on `warps` warps (1 up to 32 splits, 2 beyond, as
    launched), with or without the fresh token's write, compiled for sm_90; `cols`: columns per
    program (`merge_cols`; 0: whole rows, where a turbo V is inverse-rotated unless `rotated_out`)."""
    kf, vf = FORMATS[mode]
    rotated_out = rotated_out and vf.startswith(("turbo", "delegated"))
    whole = not cols and not rotated_out
    fn = _decode_reduce_kernel
    cfg = default_config(mode)
    wf = {"float": "float", "int8": "int8", "delegated": "hot"}
    consts = {
        "G": group, "D": dim, "BLOCK_S": merge_block(warps, 64, cols or 128),
        "ROTATED": whole and vf.startswith(("turbo", "delegated")), "HAS_HOT": whole and vf == "delegated",
        "DC": cols, "ROTATE_NEW": rotated_out, "APPEND": append, "WRITE_FIRST": cfg["write_first"] or pdl,
        "K_FMT": FORMAT_IDS[wf.get(kf, kf)], "V_FMT": FORMAT_IDS[wf.get(vf, vf)], "V_TOKEN_MAJOR": vf == "int8",
        **wht_params(dim), "PDL": pdl, "EARLY_RELEASE": bool(cfg["early_release"]), "STAMP": False,
    }  # fmt: skip
    codes = {"float": "*bf16", "int8": "*i8", "turbo4": "*u8", "turbo3": "*u8", "delegated": "*bf16"}
    pointers = {"Q": "*bf16", "KN": "*bf16", "VN": "*bf16", "OUT": "*bf16", "LEN": "*i32", "COLD": "*i32"}
    pointers.update(DK=codes[kf], DV=codes[vf], STAMPS="*i64")
    return compile_sm90(fn, consts, pointers, lambda name: "*fp32", {"num_warps": warps})


def opcodes(instructions) -> Counter:
    return Counter(re.sub(r"^@!?U?P\w+\s+", "", o).split()[0].split(".")[0] for o in instructions)


def instructions(sass: str, labels: dict | None = None):
    """[(address, instruction)] of nvdisasm output; `labels` collects label -> address."""
    ins, pending = [], None
    for line in sass.splitlines():
        m = re.match(r"\s*\.(L_x_\d+):", line)
        if m:
            pending = m.group(1)
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s*(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            ins.append((addr, m.group(2).strip()))
            if pending and labels is not None:
                labels[pending] = addr
            pending = None
    return ins


def loops(sass: str):
    """[(start, end, [instructions], skippable)] for every backward branch in nvdisasm output;
    skippable: the instructions that conditional forward branches inside the loop jump over
    (a lazy rescale's body), so len(instructions) - skippable is the path taken when none runs."""
    labels = {}
    ins = instructions(sass, labels)
    out = []
    for addr, op in ins:
        m = re.search(r"BRA.*`\(\.(L_x_\d+)\)", op)
        if m and labels.get(m.group(1), addr) < addr:
            lo = labels[m.group(1)]
            body = [(a, o) for a, o in ins if lo <= a <= addr]
            skips = set()
            for a, o in body:
                f = re.match(r"@!?U?P\w+\s+BRA.*`\(\.(L_x_\d+)\)", o)
                if f and a < labels.get(f.group(1), a) <= addr:
                    skips.update(b for b, _ in body if a < b < labels[f.group(1)])
            out.append((lo, addr, [o for _, o in body], len(skips)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="fp16,int8")
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument(
        "--reduce-warps", type=int, default=1, help="with --reduce: the reduction's warps (2 merge 64 splits)"
    )
    ap.add_argument(
        "--int8-dot", choices=("s8", "f16", "mixed"), help="the int8 kernel's dots (default: default_config's, f16)"
    )
    ap.add_argument(
        "--rescale-tau", type=float, help="the online softmax's lazy rescale threshold (default: default_config's)"
    )
    ap.add_argument(
        "--defer-sums", type=int, choices=(0, 1), help="sum the weights once after the loop (default: default_config's)"
    )
    ap.add_argument(
        "--reduce",
        action="store_true",
        help="the reduction kernel instead: all its instructions (cold paths included), with and without the append",
    )
    ap.add_argument("--merge-cols", type=int, default=0, help="with --reduce: columns per program (0: whole rows)")
    ap.add_argument("--unrotate", action="store_true", help="the split kernel inverse-rotates a turbo V's sums")
    ap.add_argument(
        "--rotated-out",
        action="store_true",
        help="a turbo V's output left rotated (`rotated_out`: W_o holds the inverse; delegated's hot split rotates)",
    )
    ap.add_argument("--sparse-v", type=float, default=0.0, help="sparse V's tau (`sparse_v`; 0: off)")
    ap.add_argument("--maxnreg", type=int, help="cap the split kernel's registers per thread (`maxnreg`; spills)")
    for knob, what in LOOKUP_KNOBS.items():
        ap.add_argument(
            "--" + knob.replace("_", "-"), type=int, choices=(0, 1), help=f"{what} (`{knob}`; default: the config's)"
        )
    args = ap.parse_args()
    top_n = int(os.environ.get("SASS_TOP", 16))
    for mode in args.modes.split(","):
        if args.reduce:
            for append in (False, True):
                body = [
                    op
                    for _, op in instructions(
                        sass_of(
                            compile_reduce(
                                mode,
                                append,
                                warps=args.reduce_warps,
                                cols=args.merge_cols,
                                rotated_out=args.rotated_out,
                            )
                        )
                    )
                ]
                top = ", ".join(f"{op} {n}" for op, n in opcodes(body).most_common(top_n))
                print(
                    f"{mode} reduction, {'with' if append else 'without'} the append: {len(body)} instructions; {top}"
                )
            continue
        kernel = compile_split(
            mode,
            args.block_n,
            args.warps,
            args.stages,
            int8_dot=args.int8_dot,
            rescale_tau=args.rescale_tau,
            defer_sums=None if args.defer_sums is None else bool(args.defer_sums),
            unrotate=args.unrotate,
            rotated_out=args.rotated_out,
            sparse_v=args.sparse_v,
            maxnreg=args.maxnreg,
            knobs={k: bool(getattr(args, k)) for k in LOOKUP_KNOBS if getattr(args, k) is not None},
        )
        sass = sass_of(kernel)
        every = instructions(sass)
        found = loops(sass)
        tail = sum(a > max((hi for _, hi, _, _ in found), default=-1) for a, _ in every)
        print(
            f"{mode}: shared memory {kernel.metadata.shared // 1024} KB, {registers(kernel)} registers per thread, "
            f"{len(every)} instructions, {tail} after the last loop"
        )
        for lo, hi, body, skippable in found:
            top = ", ".join(f"{op} {n}" for op, n in opcodes(body).most_common(top_n))
            bars = sum("BAR.SYNC" in op for op in body)
            print(
                f"  loop {lo:#06x}-{hi:#06x}: {len(body)} instructions ({len(body) - skippable} with no "
                f"conditional block taken), {bars} barriers; {top}"
            )


def _cubin_tool(kernel, tool: str, *args: str, check: bool = True) -> str:
    """stdout of triton's bundled `tool` (nvdisasm, cuobjdump) run on the kernel's cubin."""
    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        return subprocess.run([str(exe), *args, f.name], capture_output=True, text=True, check=check).stdout
    finally:
        os.unlink(f.name)


def registers(kernel) -> int | str:
    """Registers per thread of the compiled kernel, from cuobjdump's resource usage."""
    m = re.search(r"REG:(\d+)", _cubin_tool(kernel, "cuobjdump", "-res-usage", check=False))
    return int(m.group(1)) if m else "?"


def sass_of(kernel) -> str:
    return _cubin_tool(kernel, "nvdisasm", "-c")


if __name__ == "__main__":
    main()
