"""Split-K ("flash-decoding") attention of one decode step over a quantized KV cache.

Two launches (three for turbo K, which first rotates the query):

1. `_decode_split_kernel`: one program per (batch, kv head, split) serves the whole
   GQA query group, so every K/V byte is read once. Its token range is computed in
   the kernel from the device-side length L, so one fixed grid serves every L (CUDA
   graphs). Online softmax in float32 (log2 units), rescaled lazily where `default_config`
   says so (only when a row's maximum rose by more than `rescale_tau`); writes partial
   (m, l, acc).
   Quantized formats are never dequantized element by element (int8's K and V scales
   are bfloat16 side by side, one 4-byte word per token-head, loaded once for both):
   - int8 K (default, `int8_dot="mixed"`, and "s8"): q split into two int8 parts
     (hi + lo / 254, ~15 bits), integer dots on the codes as stored; `int8_dot="f16"`: codes
     become fp16 c + 1152 in registers (byte permutes, exact),
     scores = (q16 @ (k + 1152)^T - 1152 * sum(q16)) * k_scale;
   - int8 V (default, and "f16"): weights w = p * v_scale, in fp16 against the biased codes
     (the bias comes off once per output row as 1152 * sum(w)); with `int8_dot="s8"` split
     like q for integer dots;
   - turbo K: scores = k_scale * <q_rot, c[codes]>; turbo V: acc += (p * v_scale) @ c[codes]
     in the rotated basis (codebook gather in registers, fp16 tensor-core dot);
   - delegated V: cold turbo codes for tokens < C, shared by splits 0..S-2, and hot
     fp16 for tokens >= C (at most ~257 in decode) in the last split, each into its
     own accumulator plane (rotated cold, plain hot). No split holds both kinds:
     on the H200 (triton 3.6) a program that ran a cold and then a hot loop gave
     wrong outputs while the interpreter agreed with the reference. Each program
     runs one of the two loops (a branch) with one accumulator, and the hot split
     counts in the grid's budget (`hot_in_budget`).
2. `_decode_reduce_kernel`: one program per (batch, query head) merges the splits
   and the fresh token (k_new, v_new used exactly), inverse-rotates a turbo V
   accumulator once, and writes the output. With `merge_cols` (fp16 at batch 1) one
   program per (batch, query head, 32 columns) instead, on one warp with no barrier; a
   turbo V's sums then leave the split programs inverse-rotated. With `append=True` it
   also stores the fresh token into slot L in the cache's format (quantize-on-write), so
   a decode step needs no write launch of its own.

Inside `kernels.launch.programmatic_launch()` (the GPU decode step; sm_90+) both launch
with PDL: the split kernel waits for the kernel before it first thing, and the
reduction, launched while the split kernel runs, lets the kernel after it start
(`early_release`) and stores the fresh token (slot L, which no split reads) before it
waits for the splits' partial results.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from fractions import Fraction

import torch
import triton
import triton.language as tl

from kvbench.kernels.launch import pdl_enter, pdl_kwargs, release_dependents
from kvbench.kernels.quantize import (
    DELEGATED,
    FLOAT,
    FORMAT_IDS,
    HOT,
    INT8,
    TURBO4,
    _quantize_store,
    _wht,
    buffer_layout,
    device_int,
    rotate,
    wht_params,
    write_kv,
    write_operands,
)
from kvbench.kernels.reference import FORMATS

LOG2E = 1.4426950408889634
# whether triton.jit made the kernels below interpreted (it reads TRITON_INTERPRET when they are defined)
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# triton's (major, minor): some launch defaults were tuned against one compiler's code generation
_TRITON = tuple(int(x) for x in triton.__version__.split(".")[:2])


@triton.jit
def _stamp(STAMPS, slot, ON: tl.constexpr):
    """Experiments (`record_stamps`): store the GPU's global nanosecond timer at STAMPS[slot]."""
    if ON:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(STAMPS + slot, t)


@triton.jit
def _load_packed(
    CODES,
    rows,
    mask,
    BITS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRMT: tl.constexpr,
    SET_MAJOR: tl.constexpr = False,
):
    """Packed codes of token rows [BLOCK_N] -> [BLOCK_N, NG]: bytes of 2 codes (4-bit, gather
    path) or int32 words of 8 codes (4-bit for the prmt path; 3-bit always, in the low 24 bits).

    SET_MAJOR (3-bit): the words are loaded as [set, token] tiles, not [token, set]. The result is
    the same; what changes is the register layout triton derives from the loads, and with it how
    the centroid tile is stored to shared memory for its dot: in 16-byte stores where a warp's
    lanes spread over the sets, in 16-bit ones (8x as many) where each lane holds a token's row.
    Triton 3.6 spreads the lanes over the sets for [set, token] tiles, 3.8 for [token, set] ones
    (`v3_set_major` in `default_config`)."""
    CPG: tl.constexpr = 2 if BITS == 4 and not PRMT else 8  # codes per packed group
    NG: tl.constexpr = D // CPG
    g = tl.arange(0, NG)
    if BITS == 4 and PRMT:  # a row of D/2 bytes is D/8 aligned int32 words
        packed = tl.load(
            CODES.to(tl.pointer_type(tl.int32)) + rows[:, None] * NG + g[None, :], mask=mask[:, None], other=0
        )
    elif BITS == 4:
        packed = tl.load(CODES + rows[:, None] * NG + g[None, :], mask=mask[:, None], other=0)
    elif D % 32 == 0:  # a row of 3D/8 bytes is 3D/32 aligned words; every 3 words hold 4 groups
        NS: tl.constexpr = D // 32
        s = tl.arange(0, NS)
        if SET_MAJOR:
            words = CODES.to(tl.pointer_type(tl.int32)) + rows[None, :] * (3 * NS) + 3 * s[:, None]
            live = mask[None, :]
        else:
            words = CODES.to(tl.pointer_type(tl.int32)) + rows[:, None] * (3 * NS) + 3 * s[None, :]
            live = mask[:, None]
        w0 = tl.load(words, mask=live, other=0).to(tl.uint32, bitcast=True)
        w1 = tl.load(words + 1, mask=live, other=0).to(tl.uint32, bitcast=True)
        w2 = tl.load(words + 2, mask=live, other=0).to(tl.uint32, bitcast=True)
        # group j of the set in the low 24 bits of gj (the bits above are not read)
        g0 = w0
        g1 = (w0 >> 24) | (w1 << 8)
        g2 = (w1 >> 16) | (w2 << 16)
        g3 = w2 >> 8
        # join(join(g0, g2), join(g1, g3))[..., i, j] is group 2i + j of the set
        packed = tl.join(tl.join(g0, g2), tl.join(g1, g3))
        if SET_MAJOR:
            packed = tl.permute(packed, (1, 0, 2, 3))
        packed = tl.reshape(packed, [BLOCK_N, NG])
    else:  # D = 8 or 16: rows are not word-aligned; byte by byte
        packed = tl.zeros([BLOCK_N, NG], dtype=tl.int32)
        for k in tl.static_range(3):
            byte = tl.load(CODES + rows[:, None] * (NG * 3) + (g * 3 + k)[None, :], mask=mask[:, None], other=0)
            packed |= byte.to(tl.int32) << (8 * k)
    return packed


@triton.jit
def _centroids(packed, CB, BITS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, PRMT: tl.constexpr, words=None):
    """Unpack [BLOCK_N, NG] code groups into their fp16 centroids -> [BLOCK_N, D].

    Gather path: CB is the codebook, 2^BITS fp16 values (one 32-byte sector, so a warp's
    gather is a single L1 wavefront; a 256-entry table of code pairs measured 3-6x slower).
    PRMT path (compiled kernels only): CB holds the codebook's low and high bytes in 8
    int32 words (`prmt_table`), which sit in registers; byte permutes pick each code's
    two bytes, about 3 instructions per code instead of an address and a load.
    PRMT % 4 == 2 (`lut_regs`): the words are made per-thread values first (`_per_thread`).
    PRMT // 4 % 2 (`dot_fence`): the tile leaves through `_dot_fence`. `words`: the table's words
    as the caller loaded them (`hoist_lut`); None: loaded here, from CB.
    """
    if PRMT:
        if words is None:
            words = _prmt_words(CB, PRMT % 4 == 2)
        c = _centroids_prmt(packed, words, BITS, D, BLOCK_N)
        if PRMT // 4 % 2:
            c = _dot_fence(c)
    else:
        CPG: tl.constexpr = 2 if BITS == 4 else 8
        idx = (packed.to(tl.int32)[:, :, None] >> (tl.arange(0, CPG) * BITS)[None, None, :]) & ((1 << BITS) - 1)
        c = tl.load(CB + tl.reshape(idx, [BLOCK_N, D]))
    return c


def _prmt_asm(bits: int) -> str:
    """PTX of `_centroids_prmt`: $8 is a word of 8 codes, $9..$16 the table, $0..$7 the fp16
    outputs. Each 16-bit half of the word (4 codes) goes through the same steps."""
    if bits == 4:  # selectors h & 0x7777 into both table halves, bit 3 of each code picks one
        regs = ".reg .b32 a, m, s, la, lb, ha, hb, lo, hi, p0, p1, h;"
        lookup = [
            "shl.b32 a, h, 4;",
            "prmt.b32 m, a, h, 0xD9C8;",
            "and.b32 s, h, 0x7777;",
            "prmt.b32 la, $9, $10, s;",
            "prmt.b32 lb, $11, $12, s;",
            "prmt.b32 ha, $13, $14, s;",
            "prmt.b32 hb, $15, $16, s;",
            "lop3.b32 lo, la, lb, m, 0xD8;",
            "lop3.b32 hi, ha, hb, m, 0xD8;",
        ]
        halves = (["mov.b32 h, $8;"], ["shr.u32 h, $8, 16;"])
    else:  # 3-bit: the 24-bit group's codes spread to the word's 8 nibbles, then one table half
        regs = ".reg .b32 s, x, lo, hi, p0, p1;"
        lookup = ["prmt.b32 lo, $9, $10, s;", "prmt.b32 hi, $13, $14, s;"]  # selectors: s's low 16 bits
        spread = [
            "and.b32 x, $8, 0xFFF000;",  # codes 4-7 from bit 12 to bit 16: 4 codes in each 16-bit half
            "and.b32 s, $8, 0xFFF;",
            "shl.b32 x, x, 4;",
            "or.b32 s, s, x;",
            "and.b32 x, s, 0x0FC00FC0;",  # s + 3x: the upper 6 bits of each half up by 2, 2 codes a byte
            "mad.lo.u32 s, x, 3, s;",
            "and.b32 x, s, 0x38383838;",  # s + x: the upper 3 bits of each byte up by 1, a code a nibble
            "add.u32 s, s, x;",
        ]
        halves = (spread, ["shr.u32 s, s, 16;"])
    body = [regs]
    for half, outs in zip(halves, (("$0", "$4", "$2", "$6"), ("$1", "$5", "$3", "$7"))):
        body += half + lookup
        body += ["prmt.b32 p0, lo, hi, 0x5140;", "prmt.b32 p1, lo, hi, 0x7362;"]
        body += [f"mov.b32 {{{outs[0]}, {outs[1]}}}, p0;", f"mov.b32 {{{outs[2]}, {outs[3]}}}, p1;"]
    return "{\n" + "\n".join(body) + "\n}"


_PRMT_ASM4 = tl.constexpr(_prmt_asm(4))
_PRMT_ASM3 = tl.constexpr(_prmt_asm(3))


# adds (%tid.x >> 30), always 0 (a block has at most 1024 threads), which ptxas cannot prove
_PER_THREAD_ASM = tl.constexpr("{\n.reg .b32 t;\nmov.u32 t, %tid.x;\nshr.u32 t, t, 30;\nadd.u32 $0, $1, t;\n}")


@triton.jit
def _per_thread(x):
    """x, unchanged, as a value ptxas must keep per thread. A word loaded once for the whole
    program lives in a uniform register; a byte permute cannot read its data words from one, so
    ptxas copies the word into a vector register at every use."""
    return tl.inline_asm_elementwise(_PER_THREAD_ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)


# a 16-bit copy; declared with side effects, so that compiler passes cannot see through it
_FENCE_ASM = tl.constexpr("mov.b16 $0, $1;")


@triton.jit
def _dot_fence(x):
    """x (fp16), unchanged, as a value whose origin triton's passes cannot trace.

    For a dot on mma.sync (sm_80/90), triton 3.6 picks the operands' register layout (kWidth) from
    the narrowest type it finds walking back from them through elementwise ops, views and loads,
    and halves that bit width if the walk meets a `tl.join`. The lookup's tile is assembled by
    joins, so a 16-bit operand counted as 8 bits: kWidth 4 for both operands of the dot, where fp16's
    own dots get 2. With kWidth 4 the weights P cannot pass from the first dot's accumulators to the
    second dot's operand in registers; they went through shared memory and ~100 moves a block.
    An inline-asm copy with side effects stops the walk (ptxas then drops the copy)."""
    return tl.inline_asm_elementwise(_FENCE_ASM, "=h,h", [x], dtype=tl.float16, is_pure=False, pack=1)


@triton.jit
def _prmt_words(TAB, REGS: tl.constexpr):
    """The prmt lookup's 8 table words (`prmt_table`) from TAB.

    REGS: they pass through `_per_thread`, so that ptxas keeps them in vector registers instead of
    copying each one out of a uniform register at every permute (sm_90, triton 3.6: turbo4's loop at
    64-token blocks and 2 warps, 1899 -> 1665 instructions)."""
    t0 = tl.load(TAB + 0)
    t1 = tl.load(TAB + 1)
    t2 = tl.load(TAB + 2)
    t3 = tl.load(TAB + 3)
    t4 = tl.load(TAB + 4)
    t5 = tl.load(TAB + 5)
    t6 = tl.load(TAB + 6)
    t7 = tl.load(TAB + 7)
    if REGS:
        t0, t1, t2, t3 = _per_thread(t0), _per_thread(t1), _per_thread(t2), _per_thread(t3)
        t4, t5, t6, t7 = _per_thread(t4), _per_thread(t5), _per_thread(t6), _per_thread(t7)
    return t0, t1, t2, t3, t4, t5, t6, t7


@triton.jit
def _centroids_prmt(codes, table, BITS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_N, D/8] int32 words of 8 codes (code i at bits BITS*i) -> [BLOCK_N, D] fp16.

    table: the 8 words L0..L3, H0..H3 (`_prmt_words`), byte j of Lk / Hk = low / high byte of
    centroid 4k + j.
    4 bits, per 4 codes (a 16-bit half h of the word): selectors s = h & 0x7777 pick from
    entries 0-7 (L0:L1) and 8-15 (L2:L3); bit 3 of each code, spread to a byte mask by a
    sign-replicating prmt, chooses between them (lop3 0xD8 = m ? b : a). 3 bits: the
    group's 8 codes are spread to the word's nibbles (three mask-and-add steps, no per-code work)
    and one prmt per byte plane does. A last prmt pair
    interleaves low and high bytes into fp16 pairs. Output $m holds code [0,4,2,6,1,5,3,7][m],
    the order the joins below put back in place. Checked against the gather path on a GPU
    within the kernels' tolerance (`test_prmt_lookup_matches_gather`: not bit for bit, the dots
    may sum in another order).
    """
    t0, t1, t2, t3, t4, t5, t6, t7 = table
    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
        _PRMT_ASM4 if BITS == 4 else _PRMT_ASM3,
        "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r,r,r,r,r,r", [codes, t0, t1, t2, t3, t4, t5, t6, t7],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16, tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True, pack=1,
    )  # fmt: skip
    c = tl.join(tl.join(tl.join(o0, o1), tl.join(o2, o3)), tl.join(tl.join(o4, o5), tl.join(o6, o7)))
    return tl.reshape(c, [BLOCK_N, D])


# int8 code b -> fp16 (b + 1152), exact: the fp16 with bits 0x6400 | (b ^ 0x80) is 1024 + (b + 128).
# Four codes per 32-bit word: one xor, two byte permutes, no conversion instruction.
_I8_F16_ASM = tl.constexpr(
    "{\n.reg .b32 u;\nxor.b32 u, $2, 0x80808080;\n"
    "prmt.b32 $0, u, 0x64646464, 0x7170;\nprmt.b32 $1, u, 0x64646464, 0x7372;\n}"
)


@triton.jit
def _int8_biased_f16(x, ASM: tl.constexpr):
    """int8 codes -> fp16 code + 1152 (exact): the f16 path of the int8 kernel scores and
    weights biased codes and subtracts 1152 * (row sums) once. Inline PTX on compiled
    kernels (4 codes per 3 instructions), an ordinary conversion in the interpreter."""
    if ASM:
        y = tl.inline_asm_elementwise(_I8_F16_ASM, "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
    else:
        y = (x.to(tl.int32) + 1152).to(tl.float16)
    return y


@triton.jit
def _split_int8(x):
    """Rows of x [M, N] (float32) as two int8 parts: x ~ (hi + lo / 254) * unit[:, None], ~15 bits."""
    amax = tl.max(tl.abs(x), 1)
    unit = tl.where(amax > 0.0, amax, 1.0) / 127.0
    xn = x * (1.0 / unit)[:, None]
    hi = tl.floor(xn + 0.5)
    lo = tl.floor((xn - hi) * 254.0 + 0.5)
    return hi.to(tl.int8), lo.to(tl.int8), unit


@triton.jit
def _attend_range(
    qa,
    qb,
    q_unit,
    m_i,
    l_i,
    acc,
    w_i,
    lo,
    hi,
    K,
    KS,
    V,
    VS,
    CBK,
    CBV,
    k_row0,
    v_row0,
    v_cap,
    K_FMT: tl.constexpr,
    V_FMT: tl.constexpr,
    V_TOKEN_MAJOR: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    PRMT: tl.constexpr,
    K_F16: tl.constexpr,
    V_F16: tl.constexpr,
    BLOCK_G: tl.constexpr = 16,
    RESCALE_TAU: tl.constexpr = 0.0,
    DEFER_SUMS: tl.constexpr = False,
    G: tl.constexpr = 16,
    SPARSE_V: tl.constexpr = 0.0,
    SET_MAJOR: tl.constexpr = False,
):
    """Online softmax over tokens [lo, hi): returns updated (m, l, acc, w_i).

    RESCALE_TAU > 0: the sums are rescaled only when some row's block maximum exceeds the
    running one by more than it (log2 units), else the weights are taken against the stale
    maximum (exact; they stay below 2^RESCALE_TAU). DEFER_SUMS: the weights (and int8's
    fp16 weights) are summed per element and over tokens once after the loop, so no block
    pays a cross-warp reduction for them.

    int8 K and V each run one of two ways (K_F16, V_F16). False: q (or the weights) split
    into two int8 parts, integer tensor-core dots. True: the codes become fp16 (code + 1152,
    exact, by byte permutes) for fp16 dots with q and the weights in fp16; the bias comes off
    as 1152 * sum(q) per score row and 1152 * w_i, the running sum of the fp16 weights, per
    output row (subtracted by the caller).

    SPARSE_V < 0 (log2 of `sparse_v`'s tau): V is skipped for every (row, token) whose weight
    against the running maximum, exp2(s - m_i), is below tau, and the block's V is neither
    decoded nor dotted when no row of the group keeps a token. The final weight, exp2(s - M) / l
    with M >= m_i and l >= 1, is smaller still, so only tokens whose softmax weight is below tau
    are skipped (not all of them: a split sees only its own maximum). The sums l keep every token.

    Triton pipelines (cp.async) only loads that feed a dot; the packed codes and
    scales of turbo formats are prefetched here by hand, one block ahead, in registers.
    (int8's scales prefetched the same way made its kernel 5-10% slower on the H200.)
    """
    V_BITS: tl.constexpr = 4 if V_FMT == TURBO4 else 3
    V_CODES: tl.constexpr = V_FMT != FLOAT and V_FMT != INT8  # turbo codes (delegated is split by the caller)
    d = tl.arange(0, D)
    offs = tl.arange(0, BLOCK_N)
    if DEFER_SUMS:  # per-element running sums of the weights (and int8's fp16 weights)
        l_blk = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
        w_blk = tl.zeros([BLOCK_G, BLOCK_N], tl.float32)
    wk = None  # PRMT >= 8 (`hoist_lut`): the prmt tables' words, loaded here once rather than in every block
    wv = None
    if PRMT >= 8 and K_FMT == TURBO4:
        wk = _prmt_words(CBK, PRMT % 4 == 2)
    if PRMT >= 8 and V_CODES:
        wv = _prmt_words(CBV, PRMT % 4 == 2)
    if K_FMT == TURBO4:
        k_pk = _load_packed(K, k_row0 + lo + offs, lo + offs < hi, 4, D, BLOCK_N, PRMT)
        k_sc = tl.load(KS + k_row0 + lo + offs, mask=lo + offs < hi, other=0.0)
    if V_CODES:
        v_pk = _load_packed(V, v_row0 + lo + offs, lo + offs < hi, V_BITS, D, BLOCK_N, PRMT, SET_MAJOR)
        v_sc = tl.load(VS + v_row0 + lo + offs, mask=lo + offs < hi, other=0.0)
    for n0 in range(lo, hi, BLOCK_N):
        t = n0 + offs
        mask = t < hi
        kr = k_row0 + t
        vr = v_row0 + t
        nxt = t + BLOCK_N
        if K_FMT == TURBO4:
            k_cur, k_scale = k_pk, k_sc
            k_pk = _load_packed(K, k_row0 + nxt, nxt < hi, 4, D, BLOCK_N, PRMT)
            k_sc = tl.load(KS + k_row0 + nxt, mask=nxt < hi, other=0.0)
        if V_CODES:
            v_cur, v_scale = v_pk, v_sc
            v_pk = _load_packed(V, v_row0 + nxt, nxt < hi, V_BITS, D, BLOCK_N, PRMT, SET_MAJOR)
            v_sc = tl.load(VS + v_row0 + nxt, mask=nxt < hi, other=0.0)
        if K_FMT == INT8:  # int8 has K and V int8: one word per token holds both bf16 scales (K's low half)
            sc = tl.load(KS + kr, mask=mask, other=0)
            k_sc8 = (sc << 16).to(tl.float32, bitcast=True)
        # scores in log2 units [BLOCK_G, BLOCK_N]
        if K_FMT == FLOAT:
            k = tl.load(K + kr[:, None] * D + d[None, :], mask=mask[:, None], other=0.0)
            s = tl.dot(qa, tl.trans(k), input_precision=PRECISION) * q_unit[:, None]
        elif K_FMT == INT8 and K_F16:  # qb holds 1152 * sum(qa) per row, in q_unit's units
            k8 = tl.load(K + kr[:, None] * D + d[None, :], mask=mask[:, None], other=0)
            s = tl.dot(qa, tl.trans(_int8_biased_f16(k8, PRMT))) - qb[:, None]
            s = s * (q_unit[:, None] * k_sc8[None, :])
        elif K_FMT == INT8:
            # hi * 254 + lo summed in int32 (|.| < 2^31 for D <= 256), one conversion; q_unit carries the 1/254
            kt = tl.trans(tl.load(K + kr[:, None] * D + d[None, :], mask=mask[:, None], other=0))
            s = (tl.dot(qa, kt) * 254 + tl.dot(qb, kt)).to(tl.float32)
            s = s * (q_unit[:, None] * k_sc8[None, :])
        else:
            c = _centroids(k_cur, CBK, 4, D, BLOCK_N, PRMT, wk)
            s = tl.dot(qa, tl.trans(c)) * (q_unit[:, None] * k_scale.to(tl.float32)[None, :])
        s = tl.where(mask[None, :], s, float("-inf"))
        m_blk = tl.max(s, 1)
        if RESCALE_TAU > 0:  # lazy: only when some row's maximum rose by more than TAU (log2 units; the
            # first block always does): against a stale maximum the weights stay below 2^TAU
            rescale = tl.max(m_blk - m_i, 0) > RESCALE_TAU
        else:
            rescale = True
        if rescale:
            m_new = tl.maximum(m_i, m_blk)
            alpha = tl.math.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            w_i = w_i * alpha
            if DEFER_SUMS:
                l_blk = l_blk * alpha[:, None]
                w_blk = w_blk * alpha[:, None]
            m_i = m_new
        p = tl.math.exp2(s - m_i[:, None])
        if DEFER_SUMS:  # summed over tokens once, after the loop: no cross-warp reduction per block
            l_blk = l_blk + p
        else:
            l_i = l_i + tl.sum(p, 1)
        if SPARSE_V < 0.0:  # skip V where every weight's bound is below tau (see above)
            gap = s - m_i[:, None]
            p = tl.where(gap >= SPARSE_V, p, 0.0)
            rows = (tl.arange(0, BLOCK_G) < G)[:, None]  # the group's rows (the padding rows score 0)
            live = tl.max(tl.max(tl.where(rows, gap, float("-inf")), 1), 0) >= SPARSE_V
        else:
            live = True
        if live:
            if V_FMT == FLOAT:
                v = tl.load(V + vr[:, None] * D + d[None, :], mask=mask[:, None], other=0.0)
                pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            elif V_FMT == INT8:
                if V_TOKEN_MAJOR:  # V stored [B, H, D, cap]: tokens contiguous, as the int8 dot wants them
                    # masked at the padded capacity, not at L: constant over 16-token runs, so the
                    # loads stay 16-byte vectors (codes past L meet a zero weight; int8 has no NaN)
                    v_ptr = V + d[:, None] * v_cap + t[None, :]  # V points at this (batch, head)'s plane
                    v = tl.trans(tl.load(v_ptr, mask=t[None, :] < v_cap, other=0))
                else:
                    v = tl.load(V + vr[:, None] * D + d[None, :], mask=mask[:, None], other=0)
                if V_F16:
                    w = (p * ((sc >> 16) << 16).to(tl.float32, bitcast=True)[None, :]).to(tl.float16)
                    pv = tl.dot(w, _int8_biased_f16(v, PRMT))
                    if DEFER_SUMS:
                        w_blk = w_blk + w.to(tl.float32)
                    else:
                        w_i = w_i + tl.sum(w.to(tl.float32), 1)
                else:
                    wh, wl, unit = _split_int8(p * ((sc >> 16) << 16).to(tl.float32, bitcast=True)[None, :])
                    # |dot| <= 127^2 * BLOCK_N: hi * 254 + lo fits int32 for BLOCK_N <= 256
                    pv = (tl.dot(wh, v) * 254 + tl.dot(wl, v)).to(tl.float32) * (unit * (1.0 / 254.0))[:, None]
            else:
                c = _centroids(v_cur, CBV, V_BITS, D, BLOCK_N, PRMT, wv)
                pv = tl.dot((p * v_scale.to(tl.float32)[None, :]).to(tl.float16), c)
            acc = acc + pv
    if DEFER_SUMS:
        l_i = l_i + tl.sum(l_blk, 1)
        w_i = w_i + tl.sum(w_blk, 1)
    return m_i, l_i, acc, w_i


@triton.jit
def _first_rows(x, N: tl.constexpr, R: tl.constexpr, D: tl.constexpr):
    """The first R rows of x [N, D] (R, N powers of two): halved by splits, no memory round trip."""
    for i in tl.static_range(8):
        if (N >> i) > R:
            x, _ = tl.split(tl.permute(tl.reshape(x, [2, (N >> i) // 2, D]), (1, 2, 0)))
    return x


@triton.jit
def _rotate_rows(acc, outer, inner, N: tl.constexpr, R: tl.constexpr, D: tl.constexpr, INV_SQRT_D: tl.constexpr):
    """outer * H(inner * acc) on the first R rows of acc [N, D] (the query group's; the tile's other
    rows pad the dots to 16 and would only triple the transform's work): V's inverse rotation with
    (s1, s2), V's rotation with (s2, s1)."""
    x = _first_rows(acc, N, R, D)
    return _wht(x * inner[None, :], R, D, INV_SQRT_D) * outer[None, :]


@triton.jit
def _decode_split_kernel(
    Q,
    K,
    KS,
    V,
    VS,
    VH,
    CBK,
    CBV,
    LEN,
    COLD,
    WS_M,
    WS_L,
    WS_ACC,
    STAMPS,
    S1V,
    S2V,
    stride_qb,
    stride_qh,
    Hkv,
    cap,
    hot_cap,
    v_cap,
    qk_scale,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_FMT: tl.constexpr,
    V_FMT: tl.constexpr,
    V_TOKEN_MAJOR: tl.constexpr,
    PRECISION: tl.constexpr,
    PRMT: tl.constexpr,
    K_F16: tl.constexpr,
    V_F16: tl.constexpr,
    RESCALE_TAU: tl.constexpr = 0.0,
    DEFER_SUMS: tl.constexpr = False,
    PDL: tl.constexpr = False,
    STAMP: tl.constexpr = False,
    UNROTATE: tl.constexpr = False,
    ROTATE_HOT: tl.constexpr = False,
    INV_SQRT_D: tl.constexpr = 1.0,
    ROWS: tl.constexpr = 16,
    SPARSE_V: tl.constexpr = 0.0,
    SET_MAJOR: tl.constexpr = False,
):
    # grid: (B * Hkv, num_splits): one program per (batch, kv head, split of [0, L)), for all G query heads
    pdl_enter(PDL)
    bh = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    stamp = (bh * n_splits + split) * 4  # STAMPS[program]: [after the wait, after the stores, -, -]
    _stamp(STAMPS, stamp, STAMP)
    length = tl.load(LEN)
    if V_FMT == DELEGATED:
        # splits 0..S-2 share the cold tokens [0, C), the last split takes the hot ones [C, L):
        # no program runs both loops below (one of them is always empty)
        cold = tl.load(COLD)
        per_split = tl.cdiv(tl.cdiv(cold, n_splits - 1), BLOCK_N) * BLOCK_N
        is_hot = split == n_splits - 1
        lo = tl.where(is_hot, cold, split * per_split)
        hi = tl.where(is_hot, length, tl.minimum(lo + per_split, cold))
    else:
        per_split = tl.cdiv(tl.cdiv(length, n_splits), BLOCK_N) * BLOCK_N
        lo = split * per_split
        hi = tl.minimum(lo + per_split, length)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    gmask = g < G
    q_rows = (bh // Hkv).to(tl.int64) * stride_qb + ((bh % Hkv) * G + g) * stride_qh
    q = tl.load(Q + q_rows[:, None] + d[None, :], mask=gmask[:, None], other=0.0)
    if K_FMT == FLOAT:
        qa = q.to(K.dtype.element_ty)
        qb = qa
        q_unit = tl.full([BLOCK_G], 1.0, tl.float32) * qk_scale
    elif K_FMT == INT8 and K_F16:  # fp16 q in units of a power of two (exact for bf16 q)
        qf = q.to(tl.float32)
        amax = tl.max(tl.abs(qf), 1)
        q_unit = tl.math.exp2(tl.floor(tl.math.log2(tl.where(amax > 0.0, amax, 1.0))) - 8.0)
        qa = (qf * (1.0 / q_unit)[:, None]).to(tl.float16)
        qb = 1152.0 * tl.sum(qa.to(tl.float32), 1)  # the scores' bias, per row
        q_unit = q_unit * qk_scale
    elif K_FMT == INT8:  # the scores come as hi * 254 + lo: the 1/254 rides on q_unit
        qa, qb, q_unit = _split_int8(q.to(tl.float32))
        q_unit = q_unit * (qk_scale / 254.0)
    else:  # q is already rotated into K's basis
        qa = q.to(tl.float16)
        qb = qa
        q_unit = tl.full([BLOCK_G], 1.0, tl.float32) * qk_scale

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    w_i = tl.zeros([BLOCK_G], tl.float32)
    if UNROTATE or ROTATE_HOT:  # V's inverse rotation, s1 * H(s2 * acc), on this split's sums
        # (`merge_cols`), or delegated's hot sums into V's rotated basis (`rotated_out`): the signs
        # are loaded first, so their latency is not on the program's tail
        s1 = tl.load(S1V + d)
        s2 = tl.load(S2V + d)
    row0 = bh.to(tl.int64) * cap
    if V_TOKEN_MAJOR:  # int8 V stored [B, H, D, v_cap] (see `token_major`): V at this (batch, head)'s plane
        V += bh.to(tl.int64) * D * v_cap
    if V_FMT == DELEGATED:
        # one loop per program and one accumulator live (the other plane gets zeros); both
        # loops carrying both accumulators took 234-255 registers per thread (sm_90, ahead of time)
        if is_hot:
            hot_row0 = bh.to(tl.int64) * hot_cap - cold  # token t lives in hot slot t - C
            m_i, l_i, acc, w_i = _attend_range(
                qa, qb, q_unit, m_i, l_i, acc, w_i, lo, hi, K, KS, VH, VS, CBK, CBV,
                row0, hot_row0, 0, K_FMT, FLOAT, False, D, BLOCK_N, PRECISION, PRMT, False, False,
                BLOCK_G, RESCALE_TAU, DEFER_SUMS, G, SPARSE_V, SET_MAJOR,
            )  # fmt: skip
            if UNROTATE:  # plain already: the group's rows only, as the cold branch gives them
                acc_rows = _first_rows(acc, BLOCK_G, ROWS, D)
            if ROTATE_HOT:  # into the cold sums' basis: s2 * H(s1 * acc)
                acc_rows = _rotate_rows(acc, s2, s1, BLOCK_G, ROWS, D, INV_SQRT_D)
        else:
            m_i, l_i, acc, w_i = _attend_range(
                qa, qb, q_unit, m_i, l_i, acc, w_i, lo, hi, K, KS, V, VS, CBK, CBV,
                row0, row0, 0, K_FMT, TURBO4, False, D, BLOCK_N, PRECISION, PRMT, False, False,
                BLOCK_G, RESCALE_TAU, DEFER_SUMS, G, SPARSE_V, SET_MAJOR,
            )  # fmt: skip
            if UNROTATE:
                acc_rows = _rotate_rows(acc, s1, s2, BLOCK_G, ROWS, D, INV_SQRT_D)
            if ROTATE_HOT:  # rotated already
                acc_rows = _first_rows(acc, BLOCK_G, ROWS, D)
    else:
        m_i, l_i, acc, w_i = _attend_range(
            qa, qb, q_unit, m_i, l_i, acc, w_i, lo, hi, K, KS, V, VS, CBK, CBV,
            row0, row0, v_cap, K_FMT, V_FMT, V_TOKEN_MAJOR, D, BLOCK_N, PRECISION, PRMT, K_F16, V_F16,
            BLOCK_G, RESCALE_TAU, DEFER_SUMS, G, SPARSE_V, SET_MAJOR,
        )  # fmt: skip
        if V_FMT == INT8 and V_F16:
            acc -= 1152.0 * w_i[:, None]
        if UNROTATE:
            acc_rows = _rotate_rows(acc, s1, s2, BLOCK_G, ROWS, D, INV_SQRT_D)

    ws = (bh * G + g) * n_splits + split  # workspace row of (batch, query head, split)
    tl.store(WS_M + ws, m_i, mask=gmask)
    tl.store(WS_L + ws, l_i, mask=gmask)
    if UNROTATE or ROTATE_HOT:  # the group's rows only (`_first_rows`), all in plane 0, in one basis
        r = tl.arange(0, ROWS)
        ws_r = (bh * G + r) * n_splits + split
        tl.store(WS_ACC + ws_r[:, None] * D + d[None, :], acc_rows, mask=(r < G)[:, None])
    elif V_FMT == DELEGATED:  # the cold splits' sums in plane 0 (V's rotated basis), the
        # hot split's in plane 1 (only its own rows there, and not in plane 0: the reduction reads each once)
        plane = tl.where(is_hot, tl.num_programs(0) * G * n_splits * D, 0)
        tl.store(WS_ACC + plane + ws[:, None] * D + d[None, :], acc, mask=gmask[:, None])
    else:
        tl.store(WS_ACC + ws[:, None] * D + d[None, :], acc, mask=gmask[:, None])
    _stamp(STAMPS, stamp + 1, STAMP)


@triton.jit
def _append_fresh(
    kn, vn, b, h, Hq, LEN, COLD, DK, SK, S1K, S2K, CBK, BNK, DV, SV, S1V, S2V, CBV, BNV, cap_k, cap_v, v_stride_d,
    G: tl.constexpr, D: tl.constexpr, K_FMT: tl.constexpr, V_FMT: tl.constexpr, V_TOKEN_MAJOR: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):  # fmt: skip
    """The fresh token into slot L, in the cache's format: K by the GQA group's first program, V by its last."""
    kv_row = tl.full([1], b * (Hq // G) + h // G, tl.int32)
    one = kv_row >= 0
    slot = tl.load(LEN)
    if h % G == 0:
        _quantize_store(kn[None, :], kv_row, slot, one, DK, SK, S1K, S2K, CBK, BNK, cap_k, 0, K_FMT, False,
                        D, 1, INV_SQRT_D)  # fmt: skip
    if h % G == G - 1:
        v_slot = slot - tl.load(COLD) if V_FMT == HOT else slot
        _quantize_store(vn[None, :], kv_row, v_slot, one, DV, SV, S1V, S2V, CBV, BNV, cap_v, v_stride_d, V_FMT,
                        V_TOKEN_MAJOR, D, 1, INV_SQRT_D)  # fmt: skip


@triton.jit
def _decode_reduce_kernel(
    Q,
    KN,
    VN,
    WS_M,
    WS_L,
    WS_ACC,
    S1,
    S2,
    OUT,
    STAMPS,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_ob,
    stride_oh,
    Hq,
    n_splits,
    qk_scale,
    DK,
    SK,
    S1K,
    S2K,
    CBK,
    BNK,
    DV,
    SV,
    S1V,
    S2V,
    CBV,
    BNV,
    LEN,
    COLD,
    cap_k,
    cap_v,
    v_stride_d,
    G: tl.constexpr,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ROTATED: tl.constexpr,
    HAS_HOT: tl.constexpr,
    APPEND: tl.constexpr,
    WRITE_FIRST: tl.constexpr,
    K_FMT: tl.constexpr,
    V_FMT: tl.constexpr,
    V_TOKEN_MAJOR: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
    PDL: tl.constexpr = False,
    EARLY_RELEASE: tl.constexpr = False,
    STAMP: tl.constexpr = False,
    DC: tl.constexpr = 0,
    ROTATE_NEW: tl.constexpr = False,
):
    # grid: (B * Hq, D / DC): one program per (batch, query head, DC of the D columns; DC = 0: all)
    # merges its splits and the fresh token. Only whole rows (DC = 0) can inverse-rotate V here.
    # ROTATE_NEW (`rotated_out`): the splits' sums stay in V's rotated basis and the fresh token's V
    # joins them there; the output is left rotated (its caller folded the inverse into W_o).
    # With PDL it starts while the split kernel runs: until it waits, it touches only what that
    # kernel neither writes nor reads (q and the fresh token, written two launches back; slot L).
    if PDL and EARLY_RELEASE:  # the next kernel (the output GEMV) may start now: it prefetches its
        # weights into L2 as the split kernel's programs leave the SMs, and waits for this one's output
        release_dependents()
    row = tl.program_id(0)
    col = tl.program_id(1)
    stamp = (row * tl.num_programs(1) + col) * 4  # STAMPS[program]: [start, after the wait, after the store, -]
    _stamp(STAMPS, stamp, STAMP)
    b = row // Hq
    h = row % Hq
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + d).to(tl.float32)
    kn = tl.load(KN + b * stride_kb + (h // G) * stride_kh + d).to(tl.float32)
    vn = tl.load(VN + b * stride_vb + (h // G) * stride_vh + d).to(tl.float32)
    vc = vn
    if DC == 0:
        dc = d
    else:  # this program's columns (the fresh token's whole rows still serve its score and its write)
        dc = col * DC + tl.arange(0, DC)
        if not ROTATE_NEW:
            vc = tl.load(VN + b * stride_vb + (h // G) * stride_vh + dc).to(tl.float32)
    # the write, by the first columns' programs (on whole rows the constexpr test folds and no branch is
    # left: a runtime `col == 0` alone there moved, on triton 3.6, the write after the wait and the
    # merge's loads behind its first barrier, PTX on sm_90)
    write = DC == 0 or col == 0
    if APPEND and WRITE_FIRST and write:  # independent of the splits: its latency overlaps the merge's
        # loads (with PDL, which always writes first, the split kernel itself)
        _append_fresh(kn, vn, b, h, Hq, LEN, COLD, DK, SK, S1K, S2K, CBK, BNK, DV, SV, S1V, S2V, CBV, BNV,
                      cap_k, cap_v, v_stride_d, G, D, K_FMT, V_FMT, V_TOKEN_MAJOR, INV_SQRT_D)  # fmt: skip
    m = tl.sum(q * kn, 0) * qk_scale  # the fresh token starts the merge: m is finite
    if ROTATED or ROTATE_NEW:  # V's rotation signs, loaded before the wait: their latency overlaps it
        s1 = tl.load(S1 + d)
        s2 = tl.load(S2 + d)
    if ROTATE_NEW:  # the fresh token's V into V's rotated basis, s2 * H(s1 * v), before the wait
        vc = tl.reshape(_wht((vn * s1)[None, :], 1, D, INV_SQRT_D), [D]) * s2
        if DC != 0:  # this program's columns of it: row `col` of its [D / DC, DC] view
            pick = (tl.arange(0, D // DC) == col)[:, None]
            vc = tl.sum(tl.where(pick, tl.reshape(vc, [D // DC, DC]), 0.0), 0)
    pdl_enter(PDL, not EARLY_RELEASE)  # from here on the splits' partial results are read
    _stamp(STAMPS, stamp + 1, STAMP)
    l_sum = m * 0.0 + 1.0
    w_new = m * 0.0 + 1.0
    acc = tl.zeros([D if DC == 0 else DC], tl.float32)
    n_cold = n_splits - 1 if HAS_HOT else n_splits  # plane 0's splits (delegated: all but the hot one)
    if HAS_HOT:  # the hot split's sums: one row of plane 1, weighted once the merge's maximum is known
        hot_ws = row * n_splits + n_splits - 1
        m_hot = tl.load(WS_M + hot_ws)
        acc_hot = tl.load(WS_ACC + tl.num_programs(0) * n_splits * D + hot_ws * D + dc)
    for s0 in range(0, n_splits, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = s < n_splits
        ws = row * n_splits + s
        # every load first: each cross-warp reduction below is a barrier that later loads would
        # wait behind (m, then l, then acc: three round trips to L2 where one does)
        ms = tl.load(WS_M + ws, mask=smask, other=float("-inf"))
        ls = tl.load(WS_L + ws, mask=smask, other=0.0)
        a = tl.load(WS_ACC + ws[:, None] * D + dc[None, :], mask=(s < n_cold)[:, None], other=0.0)
        m_new = tl.maximum(m, tl.max(ms, 0))
        alpha = tl.math.exp2(m - m_new)
        beta = tl.math.exp2(ms - m_new)
        l_sum = l_sum * alpha + tl.sum(ls * beta, 0)
        w_new = w_new * alpha
        acc = acc * alpha + tl.sum(a * beta[:, None], 0)
        m = m_new
    if ROTATED:  # back from V's rotated basis: s1 * H(s2 * acc)
        acc = _wht((acc * s2)[None, :], 1, D, INV_SQRT_D)
        acc = tl.reshape(acc, [D]) * s1
    out = acc + w_new * vc
    if HAS_HOT:
        out += acc_hot * tl.math.exp2(m_hot - m)
    out = out / l_sum
    if APPEND and not WRITE_FIRST and write:  # after every load above: a cross-warp reduction's barrier
        # in the write would hold them back (4-warp reductions, 2026-12-01)
        _append_fresh(kn, vn, b, h, Hq, LEN, COLD, DK, SK, S1K, S2K, CBK, BNK, DV, SV, S1V, S2V, CBV, BNV,
                      cap_k, cap_v, v_stride_d, G, D, K_FMT, V_FMT, V_TOKEN_MAJOR, INV_SQRT_D)  # fmt: skip
    tl.store(OUT + b * stride_ob + h * stride_oh + dc, out.to(OUT.dtype.element_ty))
    _stamp(STAMPS, stamp + 2, STAMP)


# ------------------------------------------------------------------- launchers
_STAMPS = {"buf": None, "calls": 0}


@contextlib.contextmanager
def record_stamps(buf: torch.Tensor):
    """Experiments (scripts/exp/tail_stamps.py): every `decode_attention` launched inside stores
    the GPU's global timer (ns) per program into `buf`, int64 [slots, 2, programs, 4], at slot
    (launches so far) % slots. [s, 0, p]: split program p = (batch * Hkv + kv head) * splits + split,
    after its wait and after its stores; [s, 1, r]: reduction program r = batch * Hq + head, at its
    start, after its wait and after its store. A CUDA graph captured inside keeps stamping on replay."""
    _STAMPS.update(buf=buf, calls=0)
    try:
        yield buf
    finally:
        _STAMPS.update(buf=None, calls=0)


def _stamp_planes(fallback: torch.Tensor, split_programs: int, reduce_programs: int):
    """(split kernel's plane, reduction's plane, on) for this launch."""
    buf = _STAMPS["buf"]
    if buf is None:
        return fallback, fallback, False
    if _INTERPRETED or not buf.is_cuda:
        raise ValueError("record_stamps needs compiled kernels on a CUDA GPU (the timer is read by inline PTX)")
    if max(split_programs, reduce_programs) > buf.shape[2]:
        raise ValueError(f"record_stamps: {max(split_programs, reduce_programs)} programs, room for {buf.shape[2]}")
    slot = _STAMPS["calls"] % buf.shape[0]
    _STAMPS["calls"] += 1
    return buf[slot, 0], buf[slot, 1], True


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H200: keeps CPU (interpreter) runs on the GPU's code path


def choose_num_splits(
    batch: int,
    n_kv_heads: int,
    capacity: int,
    block_n: int = 128,
    device=None,
    programs_per_sm=(2, 4),
    nearest: bool | str | float = False,
    min_tokens: int = 1024,
    wave: int = 0,
) -> int:
    """Splits of the token axis, from the capacity (the grid is fixed while L grows).

    At least lo programs per SM, and up to hi per SM while splits keep >= `min_tokens` tokens
    (at large batch more programs balance the SMs; at batch 1 short splits only add
    merge work); never fewer than 1 block of BLOCK_N per split (at 2K, batch 1, every mode
    ran faster with 16 one-block splits than with 8 of two blocks: fp16 9.5 -> 8.8 us,
    int8 10.0 -> 9.2, turbo4-asym 12.5 -> 10.4 on the H200). `nearest`: programs per SM
    rounded to the nearest count of splits, not up (int8 at batch 16: 2 splits, 256
    programs, beat 3 or 5); "down": rounded down, so the grid never passes lo programs an SM; a float f:
    to the nearest, but down where that passes the SMs' slots (programs x SMs) by more than f of them.

    `wave`: the split kernel's programs an SM holds at once (0: ignore waves). The count is then
    the one, from the lower bound up to the rule's, that minimises waves x tokens per split
    (the more splits on a tie): programs run in waves of `wave` x SMs, and a wave lasts as long
    as its splits' tokens take, so the cost is waves / splits. E.g. one-warp programs (8 an SM)
    at batch 8 over 32K: 33 splits (two full waves of ~1000 tokens) rather than 65 (four of
    ~500, the last 94% full).
    """
    lo, hi = programs_per_sm
    sms = _sm_count(torch.device(device) if device is not None else torch.device("cpu"))
    rows = batch * n_kv_heads

    def per_row(programs):  # splits that put `programs` programs on every SM
        slots = programs * sms
        if nearest == "down":  # never past `programs` an SM: no sliver of a second wave
            return max(1, slots // rows)
        if nearest is False:
            return triton.cdiv(slots, rows)
        n = max(1, (slots + rows // 2) // rows)
        down = slots // rows
        if not isinstance(nearest, bool) and n * rows - slots > nearest * slots:
            n = max(1, down)  # too large a sliver: one wave, however many SMs it leaves idle
        return n

    splits = max(min(per_row(hi), triton.cdiv(capacity, min_tokens)), per_row(lo))
    splits = max(1, min(splits, triton.cdiv(capacity, block_n), 256))
    if wave > 0:
        slots = wave * sms

        def cost(s):  # waves / splits ~ waves x tokens per split; on a tie the more splits (8 at batch 64
            # over 32K read 0.4-0.5% faster than 4 on the H200, and 0-0.2% faster than the old 9)
            return Fraction(triton.cdiv(s * rows, slots), s), -s

        splits = min(range(max(1, min(per_row(lo), splits)), splits + 1), key=cost)
    return splits


# fp16's and int8's rounding (`choose_num_splits`' `nearest`): to the nearest split count while the grid passes
# the SMs' slots by at most 1/20 of them, else down. Rounded down against to the nearest on one H100 (132 SMs,
# like the H200), alternating, at 8K / 32K (results/2026-12-05c-gpu/split-down): fp16 batch 3 (5 splits, not 6:
# 12 programs past 132) +3.6% / +9.0%, batch 6 (2, not 3: 12 past) +5.3% / +10.2%; int8 batch 5 (6, not 7: 16
# past 264) -0.1% / +10.5%, batch 6 (5, not 6: 24 past) +4.1% / +12.4%; but int8 batch 2 (16, not 17: 8 past,
# 3.0%) -0.8% / -0.3%, and fp16 batch 1 keeps 17 (4 past, 3.0%; 16 were 0.4-0.6% slower at 8K and 32K).
# Down also where it leaves a third or more of the SMs idle: at 32K, alternating on one H100
# (results/2026-12-05d-gpu/fill-floor), fp16 batch 9 (1 split, 72 programs, not 2: 144) +15.9%, batch 11 (88,
# not 176) +3.8%, int8 batch 20 (160, not 320) +9.9%; a sliver wave costs about a wave. Untested between 3.0%
# and 6.1% past, and on GPUs with other SM counts.
SLIVER = 1 / 20


def default_config(mode: str, *, overrides: bool = True, batch: int | None = None, capacity: int | None = None) -> dict:
    """Launch defaults per mode, from sweeps on an H200 (Hq=32, Hkv=8, D=128, bf16; B=1 at
    8K and 32K, B=16 at 32K; see scripts/bench_kernels.py --tune [--grid wide]). fp16
    streams best with ~1 program per SM; the quantized formats want 2 or more to hide
    their unpacking. The turbo kernels gain from many short splits at batch 16 (up to 16
    programs per SM, run in waves) and, at batch 1, from a third pipeline stage
    (`deep_stages`: used while the grid leaves room for it, see `launch_stages`).
    `batch`: the decode batch, where a mode's best shape depends on it (delegated at 1).
    `capacity`: the cache's slots, where it does (raw turbo4 and turbo3-asym from 16K on); None: unknown.

    The reduction runs one warp per (batch, query head), two past 32 splits so that it
    merges them in one pass (`auto_reduce_warps`), and stores the fresh token itself
    (`fuse_append`). Measured per kernel on the H200 before PDL, reduction + write took
    less time on one warp than on 2 or 4 or with a separate write launch, in every mode and
    shape but one: int8 at 2K, where 4 warps were 0.4 us faster (and 0.7 us slower at
    32K; results/2026-12-01b-h200). fp16 and int8 store it before the merge (`write_first`):
    their reductions took 0.1-0.4 us less at batch 1 that way, the turbo ones 0.1-0.7 us more
    (results/2026-12-01c-h200). Under PDL the reduction lets the output GEMV start first thing
    (`early_release`), not after its wait: the GEMV's programs then land on the SMs as the split
    kernel's leave and ask L2 for their first weights while the merge runs. End to end on the H200,
    every mode gained 0.3-0.6% at batch 1 (fp16 229.3 -> 230.0 tok/s at 8K, 195.7 -> 196.8 at 32K)
    and int8 0.4-0.7% at batch 16, 32K, where fp16 stayed level (results/2026-12-02e-h200)."""
    cfg = {"block_n": 128, "num_warps": 4, "num_stages": 3, "programs_per_sm": (2, 4)}
    cfg.update(fuse_append=True, reduce_warps=None)  # None: 1 warp up to 32 splits, else 2 (`reduce_warps`)
    cfg["early_release"] = True
    cfg["short_split"] = None  # (block, stages) for splits of two blocks (`launch_shape`); None: the config's
    cfg["split_tokens"] = 1024  # `choose_num_splits`' min_tokens: past lo programs an SM, splits keep this many
    if mode == "fp16":  # at batch 1, 17 splits (136 programs): 16 were 0.4% faster end to end at 2K, 0.4-0.6%
        # slower at 8K and 32K (results/2026-12-02f-h200/experiments/l2-prefetch-rope, runs 9-12). Its programs
        # hold one an SM, so a count rounded up starts a second wave: `nearest` at batch 2 / 4 / 8 / 16 (8 / 4 /
        # 2 / 1 splits, not 9 / 5 / 3 / 2) read +12.7% / +16.0% / +9.3% / +0.7% at 32K, +0.1-6.5% at 2K and 8K,
        # alternating on one H200 (results/2026-12-05b-h200/fp16-rule); batch 1 keeps 16-17
        cfg.update(programs_per_sm=(1, 1), nearest=SLIVER)
    elif mode == "int8":  # token-major V: ~2 programs per SM at batch 1 and 16 (2026-11-30 sweep)
        cfg.update(programs_per_sm=(2, 2), nearest=SLIVER)
    elif mode == "turbo4":  # K and V decoded: small programs (2026-12-01 wide sweep)
        cfg.update(block_n=64, num_warps=2, num_stages=2, programs_per_sm=(4, 16))
    elif mode == "turbo4-delegated":
        cfg.update(block_n=64, num_warps=2, num_stages=3, programs_per_sm=(2, 16))
        if batch == 1:  # turbo4-asym's program shape: end to end at batch 1, 2K / 8K / 32K, 0.995x / 0.979x /
            # 0.993x of fp16 against 0.984x / 0.974x / 0.974x (2026-12-01, phase AN); slower at batch 16 (458 vs 438 us)
            cfg.update(block_n=128, num_warps=4, num_stages=2, short_split=(64, 3))
    elif mode == "turbo3-asym":  # 3 stages at any occupancy, <= 8 programs per SM (2026-12-01, fourth session:
        # batch 16, 32K: 440 vs 484 us with 17 splits of 2 stages; 8K: 127-130 vs 142)
        cfg.update(num_stages=2, deep_stages=3, deep_any_occupancy=True, programs_per_sm=(2, 8))
        if batch == 1:  # turbo4-asym's short split, since its 3-bit words are cheap (`v3_set_major`): at 8K,
            # 0.9986 / 0.9989 / 0.9988 of fp16 -> 1.0031 / 1.0024 / 1.0022 (results/2026-12-03f-h200, turbo3-short)
            cfg["short_split"] = (64, 3)
    elif mode.startswith("turbo"):
        cfg.update(num_stages=2, deep_stages=3, programs_per_sm=(2, 16))
        if batch == 1:  # splits of two 128-token blocks (8K) run 64-token blocks on 3 stages (`launch_shape`)
            cfg["short_split"] = (64, 3)
    # fp16 and int8 stores are cheap: issued before the merge, they overlap its loads
    cfg["write_first"] = mode in ("fp16", "int8")
    # int8 K/V: fp16 dots of biased codes ("f16"), integer dots of split operands ("s8"), or integer
    # dots for K and fp16 dots for V ("mixed": K's codes need no conversion; 761 instructions a block
    # against f16's 928). On the H200, attention + append at 32K, batch 1 / 16: mixed 26.2 / 276.3 us,
    # f16 26.2 / 278.2, s8 28.1 / 297.0. Batch 16 runs at the 700 W power cap, where fewer instructions
    # keep the clock up: end to end at 32K, batch 16, int8 read 1.464x / 1.467x of fp16 with mixed
    # against 1.430x / 1.435x with f16, alternating on one lease; batch 1 the same within 0.1%
    # (results/2026-12-02-h200/experiments/int8-dots)
    cfg["int8_dot"] = "mixed"
    # delegated: the hot window's split counts in the grid's split budget (False: one more on top)
    cfg["hot_in_budget"] = True
    # `splits`: a fixed split count (None: `choose_num_splits`), for experiments
    cfg["splits"] = None
    # `wave`: the split kernel's programs an SM holds at once, for `choose_num_splits` to count waves (0: off)
    cfg["wave"] = 0
    # `maxnreg`: a cap on the split kernel's registers per thread (ptxas `.maxnreg`; None: the compiler's
    # choice). Fewer registers let more warps share an SM, at the price of spills to local memory.
    cfg["maxnreg"] = None
    # `q_rot_in_rope` (turbo K): the decode step has the RoPE kernel write the rotated query beside q
    # (`fused_ops.rope_qk(q_rot=...)`) instead of a rotation launch of its own between RoPE and attention.
    # The same bits either way. On the H200 (results/2026-12-03-h200/q-rot-rope, alternating on one lease)
    # turbo4 went from 0.9840 / 0.9837 of fp16 to 0.9859 / 0.9863 at 8K, batch 1, from 0.9811 / 0.9812 to
    # 0.9823 / 0.9823 at 32K, and from 0.9716 to 0.9723 at 32K, batch 16: ~0.3 us a layer, not the 1-2% predicted.
    cfg["q_rot_in_rope"] = FORMATS[mode][0] == "turbo4"
    # `lut_regs`: the prmt lookup's 8 table words made per-thread values (`_per_thread`). Loaded once
    # per program they sit in uniform registers, and a byte permute takes its data words from vector
    # registers only, so ptxas may copy them at every use. Ahead of time (sm_90, triton 3.6) that took
    # turbo4's loop (64-token blocks, 2 warps) from 1899 to 1665 instructions (IMAD 732 -> 498); the
    # other turbo loops compile to the same code either way (their tables were already in registers).
    # On the H200, alternating on one lease (results/2026-12-03b-h200/experiments/lut-regs), turbo4 went
    # from 0.9512 / 0.9512 of fp16 to 0.9569 / 0.9568 at 32K, batch 16, and from 0.9841 / 0.9841 / 0.9836
    # to 0.9854 / 0.9868 / 0.9861 at 8K, batch 1; 32K, batch 1 did not move (0.981). The same bits either way.
    cfg["lut_regs"] = True
    # `dot_fence`: the centroid tiles pass an opaque copy (`_dot_fence`) before their dots, so that
    # triton gives those dots fp16's operand layout (kWidth 2) and not the one it takes for 8-bit
    # loads (4): the lookup's joins halve the bit width it infers. Ahead of time (sm_90, triton 3.6)
    # turbo4-asym's loop went from 1180 to 1084 instructions (IMAD 265 -> 140), turbo3-asym's from
    # 1463 to 1326, delegated's cold loop from 1137 to 1040, turbo4's from 1665 to 1511.
    # On the H200 (results/2026-12-03c-h200/experiments/dot-fence, alternating on one lease), ratio to
    # fp16: turbo4 0.979 -> 1.018 at 32K, batch 16 and 0.982 -> 0.995 at 32K, batch 1; delegated 1.065 ->
    # 1.091 at 32K, batch 16 and 0.997 -> 0.998 at 8K, batch 1; turbo3-asym +0.7 points at 32K, batch 16
    # but -0.5 at 8K, batch 1; turbo4-asym 0.995 -> 0.9995 at 8K, batch 1, but -0.5 points at 32K, batch 1
    # and -4 at batch 16 (254 registers against 164: 2 of its programs an SM, not 3); that loss was
    # the pipeliner's doing, which `hoist_lut` (below) undoes. So, with the hoist, on for every coded mode.
    # Triton 3.8 gives these dots kWidth 2 without it (turbo4-asym's loop, sm_90: 989 instructions, 1046
    # with it), so it is off from 3.8 on; measured on the GPU machine's 3.6 only.
    fence = FORMATS[mode][1].startswith(("turbo", "delegated")) and _TRITON < (3, 8)  # a coded V: the lookup
    cfg["dot_fence"] = fence
    # `hoist_lut`: the prmt table's words loaded once before the block loop, not inside it. Without the
    # fence the compiler hoists them itself (the same loops either way). With it, triton 3.6's pipeliner
    # turns the 8 loads into asynchronous copies through shared memory in every block, which is where
    # the fence's extra registers come from. Ahead of time (sm_90, triton 3.6), fence alone -> fence and
    # hoist: turbo4-asym 1084 -> 1035 instructions and 254 -> 164 registers (no fence: 1180, 164),
    # turbo3-asym 1326 -> 1296, delegated's cold loop 1040 -> 978 (255 -> 232 registers), turbo4 1511 ->
    # 1369 (253 -> 219). On the H200 (results/2026-12-03d-h200/experiments/hoist-lut, fence and hoist for
    # every coded mode against the previous defaults, alternating on one lease), ratio to fp16 at 32K,
    # batch 16: turbo4-asym 1.104 -> 1.151, turbo3-asym 1.064 -> 1.088, delegated 1.108 -> 1.138, turbo4
    # 0.994 -> 1.045; at 32K, batch 1: 1.018 -> 1.033, 1.008 -> 1.014, 1.005 -> 1.021, 0.994 -> 0.998; at 8K,
    # batch 1: 0.9987 -> 0.9992, 0.9976 -> 0.9993, 0.9973 -> 1.0007, 0.9901 -> 0.9911.
    cfg["hoist_lut"] = fence
    # `v3_set_major`: a 3-bit V's code words loaded as [set, token] tiles (`_load_packed`). It changes no
    # value, only the register layout triton gives the centroid tile, and so how that tile is stored to
    # shared memory for its dot. Ahead of time (sm_90, turbo3-asym, 128-token blocks, 4 warps, 3 stages),
    # triton 3.6 stores it in 16-byte stores with [set, token] tiles and in 16-bit ones with [token, set]
    # tiles (128 STS.U16 a block), triton 3.8 the other way round; so the knob follows the version.
    cfg["v3_set_major"] = _TRITON < (3, 8)
    # `merge_cols`: columns of D per reduction program (None: whole rows, one program per query head).
    # Fewer columns put more programs, each one warp merging every split in one pass with no barrier;
    # a turbo V's inverse rotation (which needs whole rows) then moves into the split programs. On the
    # H200 at batch 1 (results/2026-12-02g-h200/experiments/merge-cols*, alternating on one lease), 32
    # columns took fp16's merge at 8K from 1.04 to 0.63 us and fp16 from 227.1 / 227.2 to 228.0 / 228.0
    # tok/s (2K 234.7 / 234.8 -> 235.2 / 235.3, 32K 194.7 / 194.7 -> 195.5 / 195.5). At batch 16 fp16 was
    # 0.3% slower at 8K with them; int8 lost 0.15% at 8K, batch 1; the turbo modes lost 0.15-0.65% (the
    # rotation made each split program ~0.65 us longer for turbo4-asym and turbo3-asym: the merge's saving, and more)
    # `fold_v`: the fused decode step (`engine.fast_decode`) folds a turbo V's inverse rotation into
    # the output projection's weights (`engine.fold`) and asks for the output in V's rotated basis
    # (`rotated_out`): no program runs the inverse transform, and the merge is fp16's, columns included.
    # Unless set, `merge_cols` follows it (below): a turbo V merges on columns only with the fold.
    # At batch 1 only: on the H200 (results/2026-12-02h-h200/experiments/fold-v, alternating on one lease), at
    # 8K the fold with 32 columns took turbo4-asym from 0.9941 / 0.9944 of fp16 to 0.9975 / 0.9970,
    # turbo3-asym from 0.9963 / 0.9956 to 0.9988 / 0.9987, delegated from 0.9955 / 0.9954 to 0.9963 / 0.9967
    # (32K: 1.0161 -> 1.0204, 1.0051 -> 1.0060, 1.0020 -> 1.0044); the fold on whole rows alone was no
    # faster (0.9931-0.9953). At batch 16 (whole rows) it read -0.25% to +0.35%, so it stays off there.
    cfg["fold_v"] = FORMATS[mode][1].startswith(("turbo", "delegated")) and batch == 1
    # Under PDL, ask L2 for the layer's cache, [0, L) of every plane, while the QKV GEMV still
    # runs (`kernels.prefetch`), when it comes to at most `l2_prefetch_mb` MiB (0: never); from
    # `l2_prefetch_from` "rope" (its few programs, before they wait) or "gemv" (the QKV GEMV's);
    # `l2_prefetch_policy` "normal" or "evict_last"; `l2_prefetch_lines`: by 128-byte line, not in bulk.
    # Off in every mode: on the H200 every variant slowed every mode end to end (fp16 at 8K, batch 1:
    # 227-230 tok/s -> 196 from RoPE in bulk, 207.5 from the GEMV in bulk, 221.6 by line; turbo4-asym
    # 226-229 -> 204-224; results/2026-12-02f-h200/experiments)
    cfg.update(l2_prefetch_mb=0.0, l2_prefetch_from="rope", l2_prefetch_policy="normal", l2_prefetch_lines=False)
    # The split kernel's online softmax. `rescale_tau`: rescale the running sums only when a row's
    # maximum rose by more than this (log2 units; 0: at every block). `defer_sums`: sum the weights
    # per element and over tokens once after the loop, not across warps every block (fewer
    # barriers, more registers). On the H200 (results/2026-12-02b-h200/experiments/lazy-rescale),
    # end to end on one lease: int8 at 32K, batch 16 read 1.493x of fp16 with both (fp16 with both
    # too) against 1.438x with neither; turbo3-asym at batch 16 rose 1.7-2.0 points with the lazy
    # rescale alone; turbo4-asym, turbo4 and delegated lost 0.1-1.2 points with it (their kernels
    # 1.5-2.7% slower at batch 16, 32K), so they keep the eager one. Ahead of time (sm_90, triton
    # 3.6): int8 759 -> 719 instructions a block, 9 -> 5 barriers; fp16 621 -> 587. The weights reach
    # 2^tau, and int8 and turbo V take them times the token's scale in fp16 (max 65504): tau = 8 holds int8
    # values up to |v| ~ 32000; turbo3-asym's tau = 6 holds V norms up to ~1000 (measured at 8, then at 6).
    lazy, defer = {"fp16": (8.0, True), "int8": (8.0, True), "turbo3-asym": (6.0, False)}.get(mode, (0.0, False))
    cfg.update(rescale_tau=lazy, defer_sums=defer)
    # `long_shape`: knobs over the mode's own for caches of at least `long_capacity` slots (an override
    # of a knob wins over it). turbo4: one-warp programs of 32-token blocks, 8 an SM at batch 1 (132
    # splits at 32K) and 33 splits at 32K, batch 16 (the 1024-token floor, `split_tokens`). Its 64-token,
    # 2-warp default dates from a sweep before `lut_regs`, `dot_fence` and `hoist_lut`. On the H200
    # (results/2026-12-03g-h200/experiments), attention + append alone at 32K: 36.3 -> 33.1 us at batch 1,
    # 457.1 -> 378.9 us at batch 16 (34 splits; 446.9 with 17); end to end, alternating on one lease, ratio
    # to fp16 at 32K 0.9978 / 0.9968 -> 1.0174 / 1.0172 (batch 1) and 1.0404 / 1.0401 -> 1.1581 / 1.1578
    # (batch 16); at 16K 0.9978 -> 1.0040 / 1.0037 and 1.0366 -> 1.0707. At 8K it lost (0.9914 -> 0.9902 at
    # batch 1, 0.9973 -> 0.9689 at batch 16, 9 splits), hence the threshold. 50 splits at 32K, batch 16
    # (`split_tokens` 512) read 1.1682 / 1.1679 against 1.1599 / 1.1592, 65 splits 1.1521 / 1.1520.
    # Twenty-fourth session (results/2026-12-03h-h200/experiments, alternating on one lease):
    # - turbo4's `split_tokens` 512 in the long shape (call 2): 33 splits at 16K, batch 16 (17 with 1024),
    #   1.0922 -> 1.1365 of fp16; at 32K, batch 16 the split count is 33 either way (1.1768 / 1.1784 -> 1.1783 /
    #   1.1807).
    # - turbo3-asym takes the one-warp shape too (2 stages, no third): ratio to fp16 at 32K 1.0312 -> 1.0437
    #   (batch 1), 1.2338 -> 1.3009 (batch 4), 1.1538 -> 1.2288 (batch 16); at 16K 1.0072 -> 1.0180, 1.1446 ->
    #   1.1896, 1.1039 / 1.1037 -> 1.1240 / 1.1239; at 8K, batch 16 it lost (1.0859 -> 1.0393).
    # - Both keep splits of >= 512 tokens in the long shape (call 3, `def` 512 / 1024 against the other): at
    #   16K the split count doubles at batch 8 and 16 (17 -> 33: 1.03 -> 2.0 waves of the 1056 one-warp programs
    #   an H200 holds at batch 8). turbo3-asym 1.1131 -> 1.1947 (batch 8), 1.1236 / 1.1236 -> 1.1636 / 1.1645
    #   (batch 16); turbo4 1.0526 -> 1.1435, 1.0912 / 1.0905 -> 1.1385 / 1.1369. At 32K, batch 8 (33 -> 65
    #   splits) both lose: turbo3-asym 1.2546 -> 1.2369, turbo4 1.2117 -> 1.2054. At 32K, batch 1, 16 and the
    #   largest batch the split count is the same either way.
    # - turbo4-asym and delegated did not gain from it at 32K (turbo4-asym 1.0329 -> 1.0215 at batch 1,
    #   1.2334 -> 1.2177 at batch 4; delegated 1.0198 -> 1.0291 and 1.2252 -> 1.2153; both slower at batch 16,
    #   attention + append alone, twenty-third session), so they keep their own.
    # - Twenty-seventh session (results/2026-12-04c-h200/wave-splits, alternating on one lease): the split count
    #   counts waves of the 8 one-warp programs an SM holds (`wave`, see `choose_num_splits`). It changes only
    #   32K: batch 4 and 8 65 -> 33 splits, 32 17 -> 16, 47 12 -> 11, 64 9 -> 8, 87 7 -> 6. At 64, 4 splits
    #   (as cheap by the count as 8) read 1191-1193 tok/s against 1195-1196 with 9 and 1196-1198 with 8, so a
    #   tie goes to the more splits. Timed at 4, 8, 47 and 64; 32 only at 8 splits (a tie with 16 then broken the
    #   other way: turbo3-asym 1111.8 -> 1150.9 tok/s, turbo4 1067.3 -> 1085.9); 87 does not fit a timed run.
    #   Ratio to fp16: batch 8 turbo3-asym 1.2366 / 1.2345 -> 1.2552 / 1.2518, turbo4 1.2040 / 1.2050 -> 1.2104 /
    #   1.2132; batch 4 1.2789 / 1.2792 -> 1.2958 / 1.2934 and 1.2201 / 1.2200 -> 1.2288 / 1.2283. tok/s at 47:
    #   1174.7 -> 1206.5 and 1129.0 -> 1147.3. Batch 1 (132 splits either way) read the same within 0.03 points.
    cfg["long_capacity"] = 16384
    one_warp = {"block_n": 32, "num_warps": 1, "programs_per_sm": (8, 32), "split_tokens": 512, "wave": 8}
    cfg["long_shape"] = {"turbo4": one_warp, "turbo3-asym": {**one_warp, "deep_stages": None}}.get(mode, {})
    asked = config_overrides().get(mode, {}) if overrides else {}
    cfg = {**cfg, **asked}
    if capacity is not None and capacity >= cfg["long_capacity"]:
        cfg.update({k: v for k, v in cfg["long_shape"].items() if k not in asked})
    if "merge_cols" not in cfg:
        cfg["merge_cols"] = 32 if batch == 1 and (mode == "fp16" or cfg["fold_v"]) else None
    return cfg


CONFIG_ENV = "KVBENCH_ATTN_CONFIG"
# the int8 kernel's dots: K / V by fp16 dots of biased codes ("f16"), integer dots of split
# operands ("s8"), or integer dots for K and fp16 dots for V ("mixed")
INT8_DOTS = ("f16", "s8", "mixed")


def int8_dot_flags(int8_dot: str) -> dict:
    """The split kernel's K_F16 / V_F16 constexprs for an `int8_dot` choice (checked)."""
    if int8_dot not in INT8_DOTS:
        raise ValueError(f"int8_dot must be one of {', '.join(INT8_DOTS)}, got {int8_dot!r}")
    return {"K_F16": int8_dot == "f16", "V_F16": int8_dot != "s8"}


def auto_reduce_warps(num_splits: int) -> int:
    """Warps of the reduction: one merges 32 splits per pass, two merge up to 64 in one.

    After the split kernel ends, the merge is what a layer waits for. Global-timer stamps per
    program in the captured step on the H200 (scripts/exp/tail_stamps.py, 8K, batch 1;
    results/2026-12-02e-h200) put it at 1.04 us from the reduction's wait to its last store for
    fp16 (17 splits, one warp) and 1.87-2.08 us for the quantized modes (33 splits, two warps),
    where the wait's release was alike (0.4-0.5 us after the last split program). The SASS (sm_90, triton 3.6)
    showed part of why: the two-warp merge loaded m, then l, then acc, each behind the
    cross-warp reduction of the one before (three round trips to L2). With every load first in
    the source (the merge loop below) two warps issue them all before the first barrier, and
    the quantized modes' merges took 1.45-1.81 us. Two warps are still slower than one: fp16's
    17 splits on two warps took 1.73 us against 1.04 on one, same lease (so fp16 stays on one;
    results/2026-12-02e-h200/experiments/two-warp-merge-4dc302d). One pass read 0.1-0.2 points
    of fp16's speed faster end to end than two one-warp passes for int8, turbo4-asym and
    delegated at 33 splits (results/2026-12-01h-h200/experiments/merge-one-vs-two)."""
    return 1 if num_splits <= 32 else 2


def merge_block(reduce_warps: int, num_splits: int, cols: int = 128) -> int:
    """Splits the reduction merges per pass (its BLOCK_S): 32 rows of 128 columns a warp (128 fp32
    registers a thread), 4x as many rows of 32 columns (`merge_cols`), up to 2 warps' worth."""
    return min(32 * min(reduce_warps, 2) * max(1, 128 // cols), triton.next_power_of_2(num_splits))


def merge_columns(cfg: dict, dim: int, merge_cols: int | None = None) -> int:
    """The reduction's DC: columns per program, 0 for whole rows (`merge_cols`, else the config's:
    0, None or >= dim)."""
    cols = cfg["merge_cols"] if merge_cols is None else merge_cols
    if not cols or cols >= dim:
        return 0
    if cols < 16 or cols & (cols - 1):
        raise ValueError(f"merge_cols must be a power of two >= 16, got {cols}")
    return cols


def config_overrides() -> dict:
    """Launch knobs from the environment, for experiments: `KVBENCH_ATTN_CONFIG` holds JSON
    {mode: {knob: value}} over `default_config`'s keys, e.g.
    '{"turbo4-delegated": {"block_n": 128, "num_warps": 4, "programs_per_sm": [2, 16]}}'.
    decode-bench says so in each row's notes."""
    raw = os.environ.get(CONFIG_ENV, "").strip()
    return _parse_overrides(raw) if raw else {}


@functools.cache
def _parse_overrides(raw: str) -> dict:
    from kvbench.errors import KvbenchError

    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ValueError("not an object of objects")
    except ValueError as exc:
        raise KvbenchError(f"{CONFIG_ENV} must be JSON {{mode: {{knob: value}}}}: {exc}") from None
    known = set().union(*(default_config(m, overrides=False) for m in FORMATS))
    for mode, knobs in data.items():
        if mode not in FORMATS:
            raise KvbenchError(f"{CONFIG_ENV}: unknown mode {mode!r} (modes: {', '.join(FORMATS)})")
        bad = sorted(set(knobs) - known)
        if bad:
            raise KvbenchError(f"{CONFIG_ENV}: unknown knob(s) {', '.join(bad)} (knobs: {', '.join(sorted(known))})")
        for shape in (knobs, knobs.get("long_shape") or {}):  # JSON lists as the tuples the defaults hold
            if "programs_per_sm" in shape:
                shape["programs_per_sm"] = tuple(shape["programs_per_sm"])
    return data


def launch_stages(cfg: dict, programs: int, tokens_per_split: int, device=None) -> int:
    """Pipeline stages for a launch: `deep_stages` when the grid has at most 2 programs per
    SM (so the extra stage's shared memory costs no occupancy) and each split spans at
    least 4 blocks (so the pipeline fills), else `num_stages`. On the H200, turbo4-asym at
    batch 1 and 32K: 38.8 vs 40.9 us; at 8K (2 blocks per split) the third stage lost.
    `deep_any_occupancy` (turbo3-asym) drops the occupancy condition."""
    deep = cfg.get("deep_stages")
    sms = _sm_count(torch.device(device) if device is not None else torch.device("cpu"))
    roomy = programs <= 2 * sms or cfg.get("deep_any_occupancy", False)
    if deep and roomy and tokens_per_split >= 4 * cfg["block_n"]:
        return deep
    return cfg["num_stages"]


def launch_shape(cfg: dict, programs: int, tokens_per_split: int, device=None) -> tuple[int, int]:
    """(BLOCK_N, stages) for a launch: `short_split` (its block and stages) where a split spans more
    than one and at most two of the config's blocks, else the config's block and `launch_stages`.
    Two blocks leave a two-stage pipeline nothing to overlap; four blocks of half the size give it
    a third stage. On the H200, end to end at batch 1 (turbo4-asym's shape: 33 splits of 2 blocks of
    128 at 8K; results/2026-12-03e-h200/experiments/b1-short, alternating on one lease), 64-token
    blocks on 3 stages took turbo4-asym at 8K from 0.9997 / 1.0000 / 0.9999 of fp16 to 1.0033 / 1.0033 /
    1.0036, delegated from 1.0013 / 1.0017 / 1.0023 to 1.0039 / 1.0043 / 1.0044; turbo3-asym did not move
    (0.9981-0.9988 against 0.9983-0.9994) until its 3-bit words got cheap (twenty-second session, 1296 ->
    972 instructions a 128-token block): then from 0.9986-0.9989 to 1.0022-1.0031. Where a split is one
    block (2K) the same shape lost 0.2-0.4 points for turbo4-asym, and at 32K (8 blocks; 16 of half the size, 17%
    more instructions a token) 1.2 points (b1-shapes2): the rule applies to two-block splits only."""
    block_n, short = cfg["block_n"], cfg.get("short_split")
    if short and block_n < tokens_per_split <= 2 * block_n:
        return int(short[0]), int(short[1])
    return block_n, launch_stages(cfg, programs, tokens_per_split, device)


class DecodeWorkspace:
    """Scratch for `decode_attention`: pass one to keep launches allocation-free (CUDA graphs).

    Per (batch, query head, split): the running max m and sum l (log2 units) and the
    unnormalized output acc (float32); delegated mode keeps a second acc plane for hot
    tokens; `q_rot` holds the rotated query for turbo K.
    """

    def __init__(self, batch: int, n_q_heads: int, head_dim: int, num_splits: int, device, *, two_planes: bool = False):
        f32 = {"dtype": torch.float32, "device": device}
        self.num_splits = num_splits
        self.m = torch.empty(batch, n_q_heads, num_splits, **f32)
        self.l = torch.empty(batch, n_q_heads, num_splits, **f32)
        self.acc = torch.empty(1 + two_planes, batch, n_q_heads, num_splits, head_dim, **f32)
        self.q_rot = torch.empty(batch, n_q_heads, head_dim, **f32)
        self.codebooks: dict[str, torch.Tensor] = {}

    def codebook(self, side: str, codebook: torch.Tensor) -> torch.Tensor:
        """The fp16 copy of a side's codebook, made at the first call (a workspace serves one codec)."""
        if side not in self.codebooks:
            self.codebooks[side] = codebook.to(torch.float16).contiguous()
        return self.codebooks[side]

    def prmt_table(self, side: str, codebook: torch.Tensor) -> torch.Tensor:
        """The side's codebook as the prmt path's 8 int32 words (`prmt_table`), made at the first call."""
        key = side + ":prmt"
        if key not in self.codebooks:
            self.codebooks[key] = prmt_table(codebook)
        return self.codebooks[key]

    @classmethod
    def for_cache(cls, mode: str, q: torch.Tensor, n_kv_heads: int, capacity: int, num_splits=None, block_n=None):
        """Workspace for decoding `q` [B, Hq, D] against a cache of `capacity` slots."""
        b, hq, dim = q.shape
        cfg = default_config(mode, batch=b, capacity=capacity)
        block_n = block_n or cfg["block_n"]
        pps, nearest = cfg["programs_per_sm"], cfg.get("nearest", False)
        s = (
            num_splits
            or cfg["splits"]
            or choose_num_splits(
                b, n_kv_heads, capacity, block_n, q.device, pps, nearest, cfg["split_tokens"], cfg["wave"]
            )
        )
        delegated = FORMATS[mode][1] == "delegated"
        if delegated:  # the last split takes the hot window. Counted in the budget, the grid keeps
            # 2 programs per SM at batch 1 (264 on an H200); one more on top put a third on 8 SMs
            s = max(s + (num_splits is None and not cfg["hot_in_budget"]), 2)
        return cls(b, hq, dim, s, q.device, two_planes=delegated)


def l2_prefetch_args(mode: str, buffers: dict[str, torch.Tensor], batch: int, length: torch.Tensor):
    """The extra keyword arguments of the QKV projection and of RoPE, as (gemv, rope), that make
    the kernel named by `l2_prefetch_from` ask L2 for a cache of `mode` (its storage `buffers`,
    fixed from here on) at decode `batch`; ({}, {}) where the mode's config turns it off."""
    from kvbench.kernels.prefetch import POLICIES, region_table

    cfg = default_config(mode, batch=batch)
    if cfg["l2_prefetch_policy"] not in POLICIES:
        raise ValueError(f"l2_prefetch_policy must be one of {', '.join(POLICIES)}, got {cfg['l2_prefetch_policy']!r}")
    if cfg["l2_prefetch_from"] not in ("rope", "gemv"):
        raise ValueError(f"l2_prefetch_from must be 'rope' or 'gemv', got {cfg['l2_prefetch_from']!r}")
    table = region_table(FORMATS[mode][1], buffers) if cfg["l2_prefetch_mb"] > 0 else None
    if table is None:
        return {}, {}
    evict_last = cfg["l2_prefetch_policy"] == "evict_last"
    args = {"prefetch": (table, length, int(cfg["l2_prefetch_mb"] * 2**20), evict_last, cfg["l2_prefetch_lines"])}
    return (args, {}) if cfg["l2_prefetch_from"] == "gemv" else ({}, args)


def prmt_table(codebook: torch.Tensor) -> torch.Tensor:
    """int32 [8] = [L0..L3, H0..H3]: byte j of Lk (Hk) is the low (high) byte of fp16
    centroid 4k + j; a 3-bit codebook fills L0, L1, H0, H1 and leaves the rest 0."""
    bits = codebook.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    if bits.numel() not in (8, 16):
        raise ValueError(f"the prmt lookup serves 8- or 16-entry codebooks, got {bits.numel()}")
    planes = []
    for plane in (bits & 0xFF, bits >> 8):
        words = (plane.view(-1, 4) << torch.tensor([0, 8, 16, 24], device=bits.device)).sum(-1)
        planes.append(torch.cat([words, words.new_zeros(4 - words.numel())]))
    words = torch.cat(planes)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def prmt_flag(cfg: dict, prmt: bool) -> int:
    """The split kernel's PRMT constexpr: 0 the gather lookup, 1 the byte permutes with the table as
    loaded, 2 with its words made per-thread (`lut_regs`); plus 4 where the centroid tiles pass
    `_dot_fence` before their dots (`dot_fence`), plus 8 where the table's words are loaded once
    before the loop (`hoist_lut`)."""
    if not prmt:
        return 0
    return (2 if cfg["lut_regs"] else 1) + (4 if cfg.get("dot_fence") else 0) + (8 if cfg.get("hoist_lut") else 0)


def lut_path(device: torch.device, lut: str | None = None) -> str:
    """How turbo kernels turn codes into centroids: "prmt" (byte permutes in registers,
    compiled kernels only: the Triton interpreter runs no inline PTX) or "gather"."""
    if lut is None:
        lut = "prmt" if device.type == "cuda" and not _INTERPRETED else "gather"
    if lut not in ("prmt", "gather"):
        raise ValueError(f"lut must be 'prmt' or 'gather', got {lut!r}")
    return lut


def _check_args(mode, q, k_new, v_new, out, buffers, ws):
    """Cheap shape checks: the kernels index buffers as contiguous [B, H, cap, W] (int8 V
    may also be token-major) and vectors by their last dim."""
    b, hq, dim = q.shape
    if any(x.stride(-1) != 1 for x in (q, k_new, v_new, out)):
        raise ValueError("decode_attention needs q, k_new, v_new and out with a contiguous last dim")
    for key, buf in buffers.items():
        buffer_layout("decode_attention", key, FORMATS[mode][1], buf)
    if FORMATS[mode][0] == "int8" and dim < 32 and q.is_cuda and not _INTERPRETED:
        raise ValueError(f"the int8 decode kernel needs head_dim >= 32 (int8 tensor-core dots), got {dim}")
    planes = 2 if FORMATS[mode][1] == "delegated" else 1
    if ws.acc.shape[0] < planes or ws.acc.shape[1:] != (b, hq, ws.num_splits, dim):
        raise ValueError(f"workspace of shape {tuple(ws.acc.shape)} does not fit q {tuple(q.shape)} in mode {mode}")
    if planes == 2 and ws.num_splits < 2:
        raise ValueError("delegated mode needs at least 2 splits (cold tokens, then the hot window)")


def decode_attention(
    mode: str,
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    buffers: dict[str, torch.Tensor],
    length: torch.Tensor | int,
    sm_scale: float,
    *,
    cold_length: torch.Tensor | int | None = None,
    k_signs: tuple[torch.Tensor, torch.Tensor] | None = None,
    k_codebook: torch.Tensor | None = None,
    v_signs: tuple[torch.Tensor, torch.Tensor] | None = None,
    v_codebook: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    workspace: DecodeWorkspace | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    lut: str | None = None,
    append: bool = False,
    fuse_append: bool | None = None,
    reduce_warps: int | None = None,
    write_first: bool | None = None,
    int8_dot: str | None = None,
    rescale_tau: float | None = None,
    defer_sums: bool | None = None,
    k_boundaries: torch.Tensor | None = None,
    v_boundaries: torch.Tensor | None = None,
    merge_cols: int | None = None,
    rotated_out: bool = False,
    sparse_v: float = 0.0,
    q_rotated: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step of attention for one layer (same contract as `reference.decode_attention`).

    q [B, Hq, D]; k_new, v_new [B, Hkv, D] (the fresh token, exact, not yet in the cache);
    `buffers` in the mode's storage format; `length` L (and `cold_length` C for delegated):
    device int32 [1] tensors, or ints. Turbo sides need their signs (s1, s2) and codebook;
    the workspace keeps an fp16 copy of each codebook from its first call.
    Returns [B, Hq, D] in q's dtype, written into `out` when given. With `out` and a
    warmed-up `workspace` given and L, C as device tensors, nothing is allocated
    (capturable in a CUDA graph). `num_splits` comes from the workspace, else
    `choose_num_splits` over the cache capacity; unset tuning knobs from `default_config`;
    `lut` picks the turbo code lookup (`lut_path`: prmt on compiled kernels, else gather).

    `append=True` also stores the fresh token into slot L, exactly as
    `write_kv(mode, k_new, v_new, buffers, L, cold_length=C, ...)` would (turbo sides then
    need their boundaries too): inside the reduction kernel (`fuse_append`, default from
    `default_config`), where the first and the last program of each GQA group store its
    kv head's K and V, or else by a `write_kv` launch after it. Either way after the
    split kernel has read [0, L), so slot L is free to write; `write_first` (default from
    `default_config`; always, under PDL) stores it before the reduction's merge instead of after.

    `rotated_out=True` (turbo and delegated V only) returns each head's output in V's rotated
    basis, s2 * H(s1 * o) with V's signs, for a caller that folded V's inverse rotation into its
    output projection (`engine.fold`): no program then runs the inverse rotation, and the reduction
    merges like fp16's (`merge_cols` included).

    `sparse_v` = tau in (0, 1) skips V for stored tokens whose softmax weight is below tau (the
    split programs' test, against their running maximum, is conservative: see `_attend_range`);
    the weights' sum keeps every token and the fresh token is always used. 0: off.

    `q_rotated` (turbo K): the query already rotated with K's signs, s2 * H(s1 * q) in float32
    [B, Hq, D] (`fused_ops.rope_qk(q_rot=...)` writes it beside RoPE); else a launch rotates it here.
    """
    if not 0.0 <= sparse_v < 1.0:
        raise ValueError(f"sparse_v must be in [0, 1), got {sparse_v}")
    b, hq, dim = q.shape
    kf, vf = FORMATS[mode]
    k = buffers["k_codes"] if kf == "turbo4" else buffers["k"]
    hkv, cap = k.shape[1], k.shape[2]
    cfg = default_config(mode, batch=b, capacity=cap)
    if block_n is not None:  # the caller's block: no `short_split` (its split count was chosen for it)
        cfg["short_split"] = None
    block_n = block_n or cfg["block_n"]
    num_warps = num_warps or cfg["num_warps"]
    dev = q.device
    group = hq // hkv
    if workspace is None:
        workspace = DecodeWorkspace.for_cache(mode, q, hkv, cap, num_splits, block_n)
    if out is None:
        out = torch.empty_like(q)
    _check_args(mode, q, k_new, v_new, out, buffers, workspace)
    length = device_int(length, dev)
    cold = device_int(cold_length if cold_length is not None else 0, dev)

    if vf == "float" or vf == "int8":
        v, vs = buffers["v"], k
    else:
        v, vs = buffers["v_codes"], buffers["v_scale"]
    vh = buffers.get("v_hot", v)
    ks = buffers.get("k_scale", k)
    if kf == "int8":  # both scales of a token as one int32 word (`reference.int8_scale`)
        ks = vs = buffers["scales"].view(torch.int32)
    prmt = lut_path(dev, lut) == "prmt"
    table = workspace.prmt_table if prmt else workspace.codebook
    cbk = table("k", k_codebook) if kf == "turbo4" else ks
    cbv = table("v", v_codebook) if vf.startswith(("turbo", "delegated")) else vs
    q_score = q
    if kf == "turbo4" and q_rotated is not None:
        if tuple(q_rotated.shape) != (b, hq, dim) or q_rotated.dtype != torch.float32 or q_rotated.stride(-1) != 1:
            raise ValueError(f"q_rotated must be float32 [{b}, {hq}, {dim}] with a unit last stride")
        q_score = q_rotated
    elif kf == "turbo4":
        q_score = rotate(q, *k_signs, out=workspace.q_rot)
    qk_scale = sm_scale * LOG2E
    precision = "ieee" if torch.float32 in (q.dtype, k.dtype, v.dtype) else "tf32"
    dots = int8_dot_flags(int8_dot or cfg["int8_dot"])

    v_stride = buffer_layout("decode_attention", "v", vf, v)

    s = workspace.num_splits
    pdl = pdl_kwargs(q)
    block_n, stages = launch_shape({**cfg, "block_n": block_n}, b * hkv * s, triton.cdiv(cap, s), dev)
    num_stages = num_stages or stages
    rotated = vf.startswith(("turbo", "delegated"))
    if rotated_out and not rotated:
        raise ValueError(f"rotated_out needs a mode whose V is rotated (turbo or delegated V), not {mode}")
    s1v, s2v = v_signs if rotated else (q, q)
    cols = merge_columns(cfg, dim, merge_cols)
    unrotate = rotated and cols > 0 and not rotated_out  # the split kernel inverse-rotates its own sums
    rotate_hot = rotated_out and vf == "delegated"  # delegated's hot split rotates its sums
    n_cols = dim // cols if cols else 1
    stamps_split, stamps_reduce, stamp = _stamp_planes(workspace.m, b * hkv * s, b * hq * n_cols)
    _decode_split_kernel[(b * hkv, s)](
        q_score, k, ks, v, vs, vh, cbk, cbv, length, cold, workspace.m, workspace.l, workspace.acc, stamps_split,
        s1v, s2v, q_score.stride(0), q_score.stride(1), hkv, cap, vh.shape[2], v_stride or 0, qk_scale,
        G=group, D=dim, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n,
        K_FMT=FORMAT_IDS[kf], V_FMT=FORMAT_IDS[vf], V_TOKEN_MAJOR=v_stride is not None, PRECISION=precision,
        PRMT=prmt_flag(cfg, prmt),
        **dots, RESCALE_TAU=float(cfg["rescale_tau"] if rescale_tau is None else rescale_tau),
        DEFER_SUMS=bool(cfg["defer_sums"] if defer_sums is None else defer_sums),
        num_warps=num_warps, num_stages=num_stages, STAMP=stamp, UNROTATE=unrotate, ROTATE_HOT=rotate_hot,
        ROWS=triton.next_power_of_2(group), INV_SQRT_D=wht_params(dim)["INV_SQRT_D"] if unrotate or rotate_hot else 1.0,
        SPARSE_V=math.log2(sparse_v) if sparse_v > 0 else 0.0, SET_MAJOR=bool(cfg["v3_set_major"]), **pdl,
        **({"maxnreg": int(cfg["maxnreg"])} if cfg["maxnreg"] else {}),
    )  # fmt: skip
    codecs = {"k_signs": k_signs, "k_codebook": k_codebook, "k_boundaries": k_boundaries}
    codecs.update(v_signs=v_signs, v_codebook=v_codebook, v_boundaries=v_boundaries)
    for side, fmt in (("k", kf), ("v", vf)):
        if append and fmt.startswith("turbo") and codecs[f"{side}_boundaries"] is None:
            raise ValueError(f"decode_attention(append=True) in mode {mode} needs {side}_boundaries")
    fused = append and (cfg["fuse_append"] if fuse_append is None else fuse_append)
    reduce_warps = reduce_warps or cfg["reduce_warps"] or (1 if cols else auto_reduce_warps(s))
    if fused:
        tensors, sizes, consts = write_operands("decode_attention", mode, buffers, dim, *codecs.values())
    else:  # stand-ins, unused
        tensors, sizes = [q] * 12, [0, 0, 0]
        consts = {"K_FMT": 0, "V_FMT": 0, "V_TOKEN_MAJOR": False, "INV_SQRT_D": 1.0}
    if rotated:  # the write's Walsh-Hadamard parameters are the same (one head dim)
        consts.update(wht_params(dim))
    consts["DC"] = cols
    # with PDL the reduction writes before it waits, i.e. while the split kernel runs
    write_first = (cfg["write_first"] if write_first is None else write_first) or pdl["PDL"]
    _decode_reduce_kernel[(b * hq, n_cols)](
        q, k_new, v_new, workspace.m, workspace.l, workspace.acc, s1v, s2v, out, stamps_reduce,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        out.stride(0), out.stride(1), hq, s, qk_scale, *tensors, length, cold, *sizes,
        G=group, D=dim, BLOCK_S=merge_block(reduce_warps, s, cols or 128),
        ROTATED=rotated and not (unrotate or rotated_out), HAS_HOT=vf == "delegated" and not (unrotate or rotate_hot),
        ROTATE_NEW=rotated_out, APPEND=fused, WRITE_FIRST=write_first, EARLY_RELEASE=bool(cfg["early_release"]),
        STAMP=stamp, num_warps=reduce_warps, **consts, **pdl,
    )  # fmt: skip
    if append and not fused:
        write_kv(mode, k_new, v_new, buffers, length, cold_length=cold, **codecs)
    return out
