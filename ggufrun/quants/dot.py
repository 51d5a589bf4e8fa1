"""Fused quantized dot products: y = W @ x straight from the GGUF blocks, as llama.cpp computes them.

The activations are quantized once per matmul (`quantize_q8_1`, `quantize_q8_k`), then every weight block
is decoded to 8-bit codes in registers and multiplied with the 8-bit activations in 32-bit integer lanes (VNNI
`vpdpbusd` where the CPU has it, else AVX2's `vpmaddubsw` + `vpmaddwd`, as llama.cpp's mul_sum_us8_pairs_float),
with one float multiply-add per block (per super-block for K-quants).

Batch invariance: a row's result is the same bits whatever M is (decode, prefill chunks, prefix reuse). The
integer part is exact whatever route it takes; the float part is the same sequence of explicit FMAs in every
kernel, and the kernels compile without fast-math so LLVM cannot reorder it differently in each.

Why hand-written vector IR: LLVM's auto-vectoriser, as Numba drives it, turns the per-block reductions into
scalar code or gathers (~3 GMAC/s per core; dev/ has the experiments). So the hot loops use a small
vocabulary of vector intrinsics defined below (256-bit vectors: 32 x int8, 8 x int32, 8 x float32), each
with a portable LLVM IR fallback for CPUs without AVX2 / VNNI / F16C. On CPUs with AVX-512 (HAS_ZMM) the
interleaved layouts' kernels use 512-bit vectors instead (16 x int32 / float32, names ending in _z / _z16): pair
tiles for two or more activation rows, two groups of 8 weight rows per vector for one row (the sections "pair
tiles" and "decode on AVX-512" in part 4), except where a model larger than the cache streams from DRAM on AMD Zen 4
(DECODE_STREAM, STREAM_ROW, EXPERTS_STREAM: the 256-bit one-row code, one stream a thread); on CPUs with AMX
(Sapphire Rapids and later, where Linux grants it) the products of 32 or more activation rows run on the tile unit
(the section "AMX tiles"). Offsets into arrays are flat byte offsets.

Why one file: Numba's on-disk cache (`cache=True`) keys a kernel on its own source file only, so a kernel would
keep running stale machine code after an edit to a helper or intrinsic in another file. Everything the kernels
inline lives here instead (STYLE.md, point 5), and the sections below are in the order a block's data flows:

    1. Target features and kinds  HAS_AVX2 / HAS_VNNI / HAS_F16C / HAS_FMA; the kind constants (GGML type numbers)
    2. Vector vocabulary          Numba types I8x32 / I32x8 / F32x8 and the intrinsics on them: scalar loads,
                                  32 x int8 (code decoding), 8 x int32 (integer dots, scales), 8 x float32.
                                  Loads and stores say lane type and count (ld_i8x32, ld_f32x8, st_i8x8);
                                  int32-lane operations start with i (izero, isum1, imadd16), float ones with
                                  f (fzero, fma_v, fscale)
    3. Activation quantizers      quantize_q8_1, quantize_q8_k, and with their rows shared among the threads
                                  quantize_q8_1_rows, quantize_q8_k_rows
    4. Row dots                   per weight family, the dot of weight rows with activation rows:
                                  32-value blocks (_block32, row32, rows8x1, _tiles32; interleaved: _rows_x8),
                                  K-quants (_scales_k, _group_k, rowk, rowkx4; interleaved: _rowsk_x8), grid
                                  types (_group_iq, rowiq, rowiqx4), ternary codes (IQ1_S, IQ1_M, TQ1_0, TQ2_0:
                                  _codes_t, rowt, rowtx4), float weights (row_float, row_floatx4)
    5. Kernels                    dot_<type>(w, *activation arrays, out): chunks of weight rows on the threads,
                                  each a call of a serial _rows_<type> worker, compiled once and called by name
                                  (ggufrun.quants.launch: run_items)

A weight type's knowledge is its layout comment in registry.py, its dequant kernel, and here: its branch in
_block32 / _offset32 (32-value types) or in _scales_k, _group_k, _d_off, _dmin_off, _has_min, _kmin, _koffset,
_signed_k (K-quants), or in _group_iq, _d_iq (IQ2 / IQ3 grid types), plus one `_rows_<type>` / `dot_<type>` pair.
`kind` is the weight's GGML type number, a compile-time constant in every kernel, so the branches on it fold away.

Activation layouts (structure of arrays, leading dimension M = number of activation rows):
    Q8_1 (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4): d float32 [M, K/32] (fp16-rounded scale), s float32
        [M, K/32] (d * sum of quants, Q8_1's s), qs int8 [M, K] (the quants), sums int32 [M, K/32]
    Q8_K (for Q2_K..Q6_K, IQ4_XS, IQ2_XXS..IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0): qu uint8 [M, K] (quant + 128),
        d float32 [M, K/256], bsums16 int32 [M, K/16], bsums32 int32 [M, K/32] (sums of the quants per 16 / 32
        values), qs int8 [M, K]
    F32 / F16 / BF16 weights: x float32 [M, K] as it is
vpdpbusd multiplies unsigned bytes by signed bytes. Weight codes without an offset (Q4_K, Q5_K, Q2_K) and the
unsigned codes of the 32-value types (their offset is taken off afterwards, times the block's quant sum) meet
the signed quants qs. K-quant codes with an offset (Q3_K, Q6_K, IQ4_XS) stay signed and meet qu = q + 128,
corrected by -128 * sum(codes) (corr128): Q8_K stores the quants in both forms, Q8_1 only as qs. The grid types'
code book values are unsigned; their sign bits go onto the quants qs (apply_sign).
"""

from __future__ import annotations

import base64
import ctypes
import os
import sys

import llvmlite.binding as llb
import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils, config
from numba.extending import intrinsic, models, register_model

from .jit import DOT, DOT_PARALLEL, EXACT, EXACT_PARALLEL
from .launch import launcher, prange_launcher, run_items

# ---------------------------------------------------------------------------------------------------------
# 1. Target features: x86 intrinsics only where the CPU Numba compiles for has them.


def _target_features() -> set[str]:
    if config.CPU_FEATURES:  # NUMBA_CPU_FEATURES, e.g. for a portable cache
        return {f[1:] for f in config.CPU_FEATURES.split(",") if f.startswith("+")}
    if config.CPU_NAME and config.CPU_NAME != "host":
        return set()
    return {k for k, v in llb.get_host_cpu_features().items() if v}


_FEATS = _target_features()
HAS_VNNI = "avxvnni" in _FEATS or {"avx512vnni", "avx512vl"} <= _FEATS
HAS_AVX2 = "avx2" in _FEATS
HAS_F16C = "f16c" in _FEATS
HAS_FMA = "fma" in _FEATS
HAS_BMI2 = "bmi2" in _FEATS
HAS_REDUCE = {"avx512dq", "avx512vl"} <= _FEATS  # vreduceps
HAS_ZMM = HAS_VNNI and {"avx512f", "avx512bw", "avx512vnni"} <= _FEATS  # 512-bit kernels (names ending in _z)
# AVX2 without VNNI multiplies bytes pairwise into int16 (vpmaddubsw): 8-bit weight codes (Q8_0, IQ4_NL) then meet
# the quants as signed x signed (|w| . sign(x, w), as llama.cpp's mul_sum_i8_pairs) instead of as w + 128
SIGNED_PAIRS = HAS_AVX2 and not HAS_VNNI
# the inline assembly of _pshufb and opaque is parsed by LLVM's assembler for the host target
llb.initialize_native_asmparser()

# Kinds: the row dots and workers take the weight's GGML type number as a compile-time constant and branch on it.
F32, F16, BF16 = T.F32.value, T.F16.value, T.BF16.value
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL = (t.value for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL))
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS = (t.value for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS))
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S = (t.value for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S))
IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4 = (t.value for t in (T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4))

# ---------------------------------------------------------------------------------------------------------
# 2. Vector vocabulary. Types: Numba values backed by LLVM vectors.


class Vec(types.Type):
    def __init__(self, kind: str, lanes: int):
        self.kind, self.lanes = kind, lanes
        super().__init__(name=f"Vec({kind}x{lanes})")


_LL = {"i8": ir.IntType(8), "i32": ir.IntType(32), "f32": ir.FloatType(), "f64": ir.DoubleType()}


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_LL[fe_type.kind], fe_type.lanes))


I8x32 = Vec("i8", 32)
I32x8 = Vec("i32", 8)
F32x8 = Vec("f32", 8)
F32x16 = Vec("f32", 16)  # (AVX-512: the quantizers' search, the pair tiles' and decode's float steps)
F64x8 = Vec("f64", 8)  # (kernels.py: the float64 sums of a softmax)

_i8, _i16, _i32, _i64, _f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_v32i8, _v8i32, _v8f32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 8), ir.VectorType(_f32, 8)
_v16i16, _v16f32 = ir.VectorType(_i16, 16), ir.VectorType(_f32, 16)


def _splat(ty: ir.VectorType, value) -> ir.Constant:
    return ir.Constant(ty, [value] * ty.count)


def _bsplat(builder, vty: ir.VectorType, scalar):
    """Broadcast an LLVM scalar value to every lane."""
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar, ir.Constant(_i32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, vty.count), [0] * vty.count))


def _ptr(context, builder, aryty, ary, offty, off, elt):
    """Pointer to byte `off` of a C-contiguous array, cast to `elt`*."""
    data = builder.bitcast(context.make_array(aryty)(context, builder, ary).data, _i8.as_pointer())
    off = context.cast(builder, off, offty, types.intp)
    return builder.bitcast(builder.gep(data, [off], inbounds=True), elt.as_pointer())


def _load(context, builder, sig, args, elt):
    return builder.load(_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], elt), align=1)


def _is_ptr_args(a, off) -> bool:
    return isinstance(a, types.Array) and a.layout == "C" and isinstance(off, types.Integer)


def _int_arg(context, builder, ty, val, to=types.int32):
    return context.cast(builder, val, ty, to)


def _h2f(builder, h):
    """IEEE half bits (i16 or <n x i16>) -> float (or <n x float>), exactly; F16C's vcvtph2ps when present."""
    vec = isinstance(h.type, ir.VectorType)
    if HAS_F16C:
        hty = ir.VectorType(ir.HalfType(), h.type.count) if vec else ir.HalfType()
        fty = ir.VectorType(_f32, h.type.count) if vec else _f32
        return builder.fpext(builder.bitcast(h, hty), fty)
    ity = ir.VectorType(_i32, h.type.count) if vec else _i32
    fty = ir.VectorType(_f32, h.type.count) if vec else _f32

    def c(v):
        return ir.Constant(ity, [v] * ity.count) if vec else ir.Constant(_i32, v)

    x = builder.zext(h, ity)
    e = builder.and_(x, c(0x7C00))
    mant = builder.and_(x, c(0x3FF))
    normal = builder.add(builder.shl(builder.and_(x, c(0x7FFF)), c(13)), c(0x38000000))
    infnan = builder.or_(builder.shl(mant, c(13)), c(0x7F800000))
    sub = builder.bitcast(
        builder.fmul(
            builder.sitofp(mant, fty), ir.Constant(fty, [2.0**-24] * ity.count) if vec else ir.Constant(_f32, 2.0**-24)
        ),
        ity,
    )
    bits = builder.select(builder.icmp_unsigned("==", e, c(0)), sub, normal)
    bits = builder.select(builder.icmp_unsigned("==", e, c(0x7C00)), infnan, bits)
    bits = builder.or_(bits, builder.shl(builder.and_(x, c(0x8000)), c(16)))
    return builder.bitcast(bits, fty)


# ---- scalar loads at byte offsets -------------------------------------------------------------------------


@intrinsic
def ld_u16(typingctx, a, off):
    """Little-endian uint16 at byte `off`, as int32."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(_load(context, builder, sig, args, _i16), _i32)

    return types.int32(a, off), codegen


@intrinsic
def ld_u32(typingctx, a, off):
    """Little-endian uint32 at byte `off` (unaligned)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _load(context, builder, sig, args, _i32)

    return types.uint32(a, off), codegen


@intrinsic
def ld_f32(typingctx, a, off):
    """float32 at byte `off`."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _load(context, builder, sig, args, _f32)

    return types.float32(a, off), codegen


@intrinsic
def ld_f16(typingctx, a, off):
    """IEEE half at byte `off`, as float32 (exact)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _h2f(builder, _load(context, builder, sig, args, _i16))

    return types.float32(a, off), codegen


def _round_f16_ir(builder, f):
    """IR: float32 f (a scalar or a vector of them) -> nearest IEEE half (ties to even) -> float32."""
    if isinstance(f.type, ir.VectorType):
        n = f.type.count
        if HAS_F16C:
            return builder.fpext(builder.fptrunc(f, ir.VectorType(ir.HalfType(), n)), f.type)
        out = f
        for k in range(n):
            lane = _round_f16_ir(builder, builder.extract_element(f, ir.Constant(_i32, k)))
            out = builder.insert_element(out, lane, ir.Constant(_i32, k))
        return out
    if HAS_F16C:
        return builder.fpext(builder.fptrunc(f, ir.HalfType()), _f32)
    # ryg's float_to_half_fast3_rtne, then back to float
    u = builder.bitcast(f, _i32)
    sign = builder.and_(u, ir.Constant(_i32, 0x80000000))
    u = builder.xor(u, sign)
    c = lambda v: ir.Constant(_i32, v)  # noqa: E731
    big = builder.select(builder.icmp_unsigned(">", u, c(0x7F800000)), c(0x7E00), c(0x7C00))
    magic = c(((127 - 15) + (23 - 10) + 1) << 23)
    den = builder.fadd(builder.bitcast(u, _f32), builder.bitcast(magic, _f32))
    den = builder.sub(builder.bitcast(den, _i32), magic)
    odd = builder.and_(builder.lshr(u, c(13)), c(1))
    nrm = builder.add(builder.add(u, c(((15 - 127) << 23) + 0xFFF)), odd)
    nrm = builder.lshr(nrm, c(13))
    h = builder.select(builder.icmp_unsigned("<", u, c(113 << 23)), den, nrm)
    h = builder.select(builder.icmp_unsigned(">=", u, c((127 + 16) << 23)), big, h)
    h = builder.or_(h, builder.lshr(sign, c(16)))
    return _h2f(builder, builder.trunc(h, _i16))


@intrinsic
def round_f16(typingctx, x):
    """float32 -> nearest IEEE half (ties to even) -> float32: what GGML_CPU_FP32_TO_FP16 stores."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return _round_f16_ir(builder, args[0])

    return types.float32(x), codegen


# ---- 32 x int8 vectors ------------------------------------------------------------------------------------


def _prefetch(locality: int, doc: str):
    """Intrinsic (a, off): llvm.prefetch (read, data) of the cache line holding byte `off` of `a` with this
    locality (3: prefetcht0, into every cache level; 2: prefetcht1, into L2 and L3), a no-op past the array's end."""

    @intrinsic
    def prefetch(typingctx, a, off):
        if not _is_ptr_args(a, off):
            return None

        def codegen(context, builder, sig, args):
            aryty = sig.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            off = context.cast(builder, args[1], sig.args[1], types.intp)
            nbytes = builder.mul(ary.nitems, context.get_constant(types.intp, aryty.dtype.bitwidth // 8))
            with builder.if_then(builder.icmp_signed("<", off, nbytes), likely=True):
                ptr = _ptr(context, builder, aryty, args[0], types.intp, off, _i8)
                fnty = ir.FunctionType(ir.VoidType(), [_i8.as_pointer(), _i32, _i32, _i32])
                fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
                builder.call(fn, [ptr, ir.Constant(_i32, 0), ir.Constant(_i32, locality), ir.Constant(_i32, 1)])
            return context.get_dummy_value()

        return types.none(a, off), codegen

    prefetch.__doc__ = doc
    return prefetch


prefetch = _prefetch(3, "Hint the cache line holding byte `off` of `a` into every cache level (no-op past the end).")
prefetch_l2 = _prefetch(2, "Hint the cache line holding byte `off` of `a` into L2, not L1 (no-op past the end).")


@intrinsic
def ld_i8x32(typingctx, a, off):
    """32 bytes at byte `off`."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _load(context, builder, sig, args, _v32i8)

    return I8x32(a, off), codegen


@intrinsic
def ld_nib(typingctx, a, off):
    """16 bytes at `off` -> their 16 low nibbles, then their 16 high nibbles (the Q4_0 / IQ4_NL order)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
        v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 32), list(range(16)) * 2))
        lo = builder.and_(v, _splat(_v32i8, 15))
        hi = builder.lshr(v, _splat(_v32i8, 4))
        return builder.shuffle_vector(
            lo, hi, ir.Constant(ir.VectorType(_i32, 32), list(range(16)) + list(range(48, 64)))
        )

    return I8x32(a, off), codegen


@intrinsic
def field(typingctx, v, shift, mask, up):
    """((v >> shift) & mask) << up per byte: a bit field of each byte, moved into place.

    The shifts run on 16-bit lanes (x86 has no byte shifts, and LLVM's emulation of a variable byte shift is
    slow); bits that cross into a neighbouring byte are masked off, which is exact while the field stays
    within its byte (shift + bits(mask) <= 8, bits(mask) + up <= 8), as in every use here.
    """
    if not all(isinstance(t, types.Integer) for t in (shift, mask, up)):
        return None

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_i16, 16)
        s, k, u = (builder.trunc(_int_arg(context, builder, t, a), _i16) for t, a in zip(sig.args[1:], args[1:]))
        x = builder.bitcast(builder.lshr(builder.bitcast(args[0], v16), _bsplat(builder, v16, s)), _v32i8)
        x = builder.and_(x, _bsplat(builder, _v32i8, builder.trunc(k, _i8)))
        return builder.bitcast(builder.shl(builder.bitcast(x, v16), _bsplat(builder, v16, u)), _v32i8)

    return I8x32(I8x32, shift, mask, up), codegen


@intrinsic
def bit_to(typingctx, v, bit, value):
    """`value` in bytes of v whose bit number `bit` is set, else 0."""
    if not isinstance(bit, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        b = builder.trunc(_int_arg(context, builder, sig.args[1], args[1]), _i8)
        val = builder.trunc(_int_arg(context, builder, sig.args[2], args[2]), _i8)
        mask = builder.shl(_splat(_v32i8, 1), _bsplat(builder, _v32i8, b))
        on = builder.icmp_unsigned("!=", builder.and_(args[0], mask), _splat(_v32i8, 0))
        return builder.select(on, _bsplat(builder, _v32i8, val), _splat(_v32i8, 0))

    return I8x32(I8x32, bit, value), codegen


@intrinsic
def bits32_to(typingctx, m, value):
    """Byte j = `value` if bit j of the uint32 m is set, else 0 (the Q5_0/Q5_1 high bits)."""
    if not isinstance(m, types.Integer) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        bits = builder.bitcast(
            _int_arg(context, builder, sig.args[0], args[0], types.uint32), ir.VectorType(ir.IntType(1), 32)
        )
        val = builder.trunc(_int_arg(context, builder, sig.args[1], args[1]), _i8)
        return builder.select(bits, _bsplat(builder, _v32i8, val), _splat(_v32i8, 0))

    return I8x32(m, value), codegen


@intrinsic
def iadd(typingctx, a, b):
    """a + b, int32 lanes (8 or 16 of them)."""
    if a != b or a not in (I32x8, I32x16):
        return None

    def codegen(context, builder, sig, args):
        return builder.add(*args)

    return a(a, a), codegen


@intrinsic
def isub(typingctx, v, c):
    """v - c per byte: unsigned codes to signed (q - 8, q - 32, ...)."""
    if not isinstance(c, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        c = builder.trunc(_int_arg(context, builder, sig.args[1], args[1]), _i8)
        return builder.sub(args[0], _bsplat(builder, _v32i8, c))

    return I8x32(I8x32, c), codegen


@intrinsic
def vor(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])

    return I8x32(I8x32, I8x32), codegen


# IQ4_NL / IQ4_XS non-linear code book (kvalues_iq4nl in llama.cpp ggml-common.h)
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_lut(builder, idx, add):
    table = [(v + add) & 0xFF for v in IQ4_VALUES]
    if HAS_AVX2:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v32i8, [_v32i8, _v32i8]), "llvm.x86.avx2.pshuf.b"
        )
        return builder.call(fn, [ir.Constant(_v32i8, table * 2), idx])
    out = _splat(_v32i8, 0)
    for k, t in enumerate(table):
        out = builder.select(builder.icmp_unsigned("==", idx, _splat(_v32i8, k)), _splat(_v32i8, t), out)
    return out


@intrinsic
def iq4_lut(typingctx, idx):
    """kvalues_iq4nl[idx] per byte (idx 0..15), as signed bytes."""

    def codegen(context, builder, sig, args):
        return _iq4_lut(builder, args[0], 0)

    return I8x32(I8x32), codegen


@intrinsic
def iq4_lut_u(typingctx, idx):
    """kvalues_iq4nl[idx] + 128 per byte: the code book as unsigned bytes."""

    def codegen(context, builder, sig, args):
        return _iq4_lut(builder, args[0], 128)

    return I8x32(I8x32), codegen


@intrinsic
def flip(typingctx, v):
    """v ^ 0x80: a signed byte q as the unsigned byte q + 128."""

    def codegen(context, builder, sig, args):
        return builder.xor(args[0], _splat(_v32i8, 0x80))

    return I8x32(I8x32), codegen


# ---- 8 x int32 vectors ------------------------------------------------------------------------------------


@intrinsic
def izero(typingctx):
    def codegen(context, builder, sig, args):
        return _splat(_v8i32, 0)

    return I32x8(), codegen


def _pmaddubsw(builder, u, s):
    """AVX2 vpmaddubsw: int16 lanes u[2k] s[2k] + u[2k+1] s[2k+1] (u unsigned, s signed bytes; saturating)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v16i16, [_v32i8, _v32i8]),
                                        "llvm.x86.avx2.pmadd.ub.sw")  # fmt: skip
    return builder.call(fn, [u, s])


def _pmaddwd(builder, a, b):
    """AVX2 vpmaddwd: int32 lanes a[2k] b[2k] + a[2k+1] b[2k+1] of int16 vectors."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8i32, [_v16i16, _v16i16]),
                                        "llvm.x86.avx2.pmadd.wd")  # fmt: skip
    return builder.call(fn, [a, b])


def _pmaddubsw_wd(builder, u, s):
    """AVX2 without VNNI: int32 lanes of u . s over 4 bytes each, as vpmaddubsw (pairs, saturated to int16) then
    vpmaddwd with ones (pairs of pairs); exact when no pair u[2k]s[2k] + u[2k+1]s[2k+1] leaves the int16 range."""
    return _pmaddwd(builder, _pmaddubsw(builder, u, s), _splat(_v16i16, 1))


def _dpbusd(builder, acc, u, s, narrow=False):
    """acc + dpbusd(u, s); `narrow`: the caller guarantees every pair sum u[2k]s[2k] + u[2k+1]s[2k+1] fits int16."""
    if HAS_VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v8i32, [_v8i32] * 3), "llvm.x86.avx512.vpdpbusd.256"
        )
        return builder.call(fn, [acc, builder.bitcast(u, _v8i32), builder.bitcast(s, _v8i32)])
    if HAS_AVX2 and narrow:
        return builder.add(acc, _pmaddubsw_wd(builder, u, s))
    if HAS_AVX2:
        # u = (u & 0x7f) + (u & 0x80): pairs of 127 * s and of 128 * s both stay in int16 (-32768 included)
        lo = _pmaddubsw_wd(builder, builder.and_(u, _splat(_v32i8, 0x7F)), s)
        hi = _pmaddubsw_wd(builder, builder.and_(u, _splat(_v32i8, 0x80)), s)
        return builder.add(acc, builder.add(lo, hi))
    v32 = ir.VectorType(_i32, 32)
    p = builder.mul(builder.zext(u, v32), builder.sext(s, v32))
    part = [builder.shuffle_vector(p, p, ir.Constant(_v8i32, list(range(k, 32, 4)))) for k in range(4)]
    return builder.add(acc, builder.add(builder.add(part[0], part[1]), builder.add(part[2], part[3])))


@intrinsic
def dpbusd(typingctx, acc, u, s):
    """acc[i] + sum_{k<4} u[4i+k] * s[4i+k], u unsigned bytes, s signed bytes (exact, int32)."""

    def codegen(context, builder, sig, args):
        return _dpbusd(builder, *args)

    return I32x8(I32x8, I8x32, I8x32), codegen


@intrinsic
def dpbusd_n(typingctx, acc, u, s):
    """dpbusd for narrow operands: the caller guarantees |u[2k] s[2k] + u[2k+1] s[2k+1]| < 2^15 for every k (codes
    of at most 5 bits against quants, or 6-bit signed codes against quants + 128). Without VNNI this is one
    vpmaddubsw + vpmaddwd; dpbusd takes two of each for operands of any size."""

    def codegen(context, builder, sig, args):
        return _dpbusd(builder, *args, narrow=True)

    return I32x8(I32x8, I8x32, I8x32), codegen


@intrinsic
def dpbssd(typingctx, acc, a, b):
    """acc[i] + sum_{k<4} a[4i+k] * b[4i+k], both signed bytes, b never -128 (exact, int32). AVX2: vpmaddubsw of
    |a| (unsigned, 128 for -128) and b with a's signs (vpsignb), pairs within +-2 * 128 * 127, then vpmaddwd."""

    def codegen(context, builder, sig, args):
        return _dpbssd(builder, *args)

    return I32x8(I32x8, I8x32, I8x32), codegen


def _dpbssd(builder, acc, a, b):
    """acc + dpbssd(a, b) (see dpbssd)."""
    if HAS_AVX2:
        sign = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v32i8, [_v32i8, _v32i8]), "llvm.x86.avx2.psign.b"
        )
        return builder.add(acc, _pmaddubsw_wd(builder, builder.call(sign, [a, a]), builder.call(sign, [b, a])))
    v32 = ir.VectorType(_i32, 32)
    p = builder.mul(builder.sext(a, v32), builder.sext(b, v32))
    part = [builder.shuffle_vector(p, p, ir.Constant(_v8i32, list(range(k, 32, 4)))) for k in range(4)]
    return builder.add(acc, builder.add(builder.add(part[0], part[1]), builder.add(part[2], part[3])))


@intrinsic
def corr128(typingctx, wq):
    """-128 * (lane sums of the signed bytes wq): seeds dpbusd(., x + 128, wq) so that it yields x . wq.

    Lane i sums bytes 4i..4i+3, the same bytes as dpbusd's lane i, so the correction stays lane-aligned.
    """

    def codegen(context, builder, sig, args):
        s = _dpbusd(builder, _splat(_v8i32, 0), _splat(_v32i8, 128), args[0], narrow=True)
        return builder.sub(_splat(_v8i32, 0), s)

    return I32x8(I8x32), codegen


@intrinsic
def ld_i32x8(typingctx, a, off):
    """8 int32 at byte `off`."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _load(context, builder, sig, args, _v8i32)

    return I32x8(a, off), codegen


@intrinsic
def ld_u8x8(typingctx, a, off):
    """8 bytes at byte `off`, zero-extended to int32 lanes."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(_load(context, builder, sig, args, ir.VectorType(_i8, 8)), _v8i32)

    return I32x8(a, off), codegen


@intrinsic
def isum8(typingctx, p0, p1, p2, p3, p4, p5, p6, p7):
    """(sum of p0's lanes, ..., sum of p7's lanes): eight dot products' int32 lanes folded into one vector."""
    if not all(t == I32x8 for t in (p0, p1, p2, p3, p4, p5, p6, p7)):
        return None

    def codegen(context, builder, sig, args):
        def fold(a, b, lo, hi):
            return builder.add(
                builder.shuffle_vector(a, b, ir.Constant(_v8i32, lo)),
                builder.shuffle_vector(a, b, ir.Constant(_v8i32, hi)),
            )

        # pairs: lanes 0-3 hold a's half sums, 4-7 b's; then quarters; then whole sums
        q = [
            fold(args[2 * k], args[2 * k + 1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
            for k in range(4)
        ]
        r = [fold(q[2 * k], q[2 * k + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]) for k in range(2)]
        # r[k] lanes: (p4k, p4k, p4k+2, p4k+2, p4k+1, p4k+1, p4k+3, p4k+3) partial sums
        return fold(r[0], r[1], [0, 4, 2, 6, 8, 12, 10, 14], [1, 5, 3, 7, 9, 13, 11, 15])

    return I32x8(*([I32x8] * 8)), codegen


@intrinsic
def isum2(typingctx, a, b):
    """(sum of a's lanes) in lane 0 and (sum of b's lanes) in lane 4 (the other lanes: partial sums): two
    horizontal sums in one fold."""
    if a != I32x8 or b != I32x8:
        return None

    def codegen(context, builder, sig, args):
        a, b = args
        lo = builder.shuffle_vector(a, b, ir.Constant(_v8i32, [0, 1, 2, 3, 8, 9, 10, 11]))
        hi = builder.shuffle_vector(a, b, ir.Constant(_v8i32, [4, 5, 6, 7, 12, 13, 14, 15]))
        s = builder.add(lo, hi)
        s = builder.add(s, builder.shuffle_vector(s, s, ir.Constant(_v8i32, [2, 3, 0, 1, 6, 7, 4, 5])))
        return builder.add(s, builder.shuffle_vector(s, s, ir.Constant(_v8i32, [1, 0, 3, 2, 5, 4, 7, 6])))

    return I32x8(I32x8, I32x8), codegen


def _reduce_i32x8(op: str):
    """Intrinsic (I32x8) -> int32: LLVM's vector.reduce.`op` of the 8 lanes."""

    @intrinsic
    def reduce(typingctx, p):
        if p != I32x8:
            return None

        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_i32, [_v8i32]), f"llvm.vector.reduce.{op}.v8i32"
            )
            return builder.call(fn, [args[0]])

        return types.int32(I32x8), codegen

    return reduce


isum1 = _reduce_i32x8("add")  # the sum of the 8 lanes (exact)
imax1 = _reduce_i32x8("smax")  # the largest of the 8 lanes


@intrinsic
def st_i8x8(typingctx, a, off, v):
    """Store the low byte of each int32 lane of v (8 bytes) at byte `off` of `a`: int8 quants from int32 lanes."""
    if not _is_ptr_args(a, off) or v != I32x8:
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], ir.VectorType(_i8, 8))
        builder.store(builder.trunc(args[2], ir.VectorType(_i8, 8)), ptr, align=1)
        return context.get_dummy_value()

    return types.none(a, off, I32x8), codegen


@intrinsic
def isubs(typingctx, v, x):
    """v - x in every lane (x an integer scalar)."""
    if v != I32x8 or not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], _bsplat(builder, _v8i32, _int_arg(context, builder, sig.args[1], args[1])))

    return I32x8(I32x8, x), codegen


@intrinsic
def ld_f16_rows(typingctx, a, off, stride):
    """8 IEEE halves at bytes off, off + stride, ..., off + 7 * stride, as float32 lanes (one field of 8 rows)."""
    if not (_is_ptr_args(a, off) and isinstance(stride, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        base = context.cast(builder, args[1], sig.args[1], types.intp)
        step = context.cast(builder, args[2], sig.args[2], types.intp)
        h = ir.Constant(ir.VectorType(_i16, 8), [0] * 8)
        for r in range(8):
            o = builder.add(base, builder.mul(step, ir.Constant(_i64, r)))
            x = builder.load(_ptr(context, builder, sig.args[0], args[0], types.intp, o, _i16), align=1)
            h = builder.insert_element(h, x, ir.Constant(_i32, r))
        return _h2f(builder, h)

    return F32x8(a, off, stride), codegen


def _store_codegen(context, builder, sig, args):
    """Store a vector (F32x8 / I32x8) at byte `off` of an array."""
    llty = context.get_value_type(sig.args[2])
    builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], llty), align=4)
    return context.get_dummy_value()


@intrinsic
def st_f32x8(typingctx, a, off, v):
    """Store 8 float32 at byte `off` of `a`."""
    if not _is_ptr_args(a, off) or v != F32x8:
        return None
    return types.none(a, off, F32x8), _store_codegen


@intrinsic
def st_i32x8(typingctx, a, off, v):
    """Store 8 int32 at byte `off` of `a`."""
    if not _is_ptr_args(a, off) or v != I32x8:
        return None
    return types.none(a, off, I32x8), _store_codegen


@njit(inline="always", **DOT)
def _empty64(n, dtype):
    """np.empty(n, dtype) starting on a 64-byte boundary, for arrays read as whole 16-lane vectors: Numba aligns arrays
    to 32 bytes, so by chance (per process, as the allocator places them) every 64-byte load of an unpacked tile row
    would read two cache lines. Ice Lake, one thread, IQ4_XS 8,192 x 2,048 at 512 rows on the VNNI tiles: 60.5-70.2 ms
    from process to process, 54.4-55.3 with the tiles aligned."""
    raw = np.empty(n + 64, dtype)
    off = ((-raw.ctypes.data) & 63) // raw.itemsize
    return raw[off : off + n]


@njit(inline="always", **DOT)
def _empty64_rows(rows, cols, dtype):
    """_empty64 as a [rows, cols] array."""
    return _empty64(rows * cols, dtype).reshape(rows, cols)


def _stack_scratch(elt, numba_elt, n: int):
    """Intrinsic () -> pointer to n `elt` on the stack of the kernel that inlines the call (its entry block): no
    heap allocation per call (numba.carray makes an array of it). Aligned to 64 bytes: the tiles load and store
    whole 16-lane vectors of it, and at the alloca's own alignment (16 bytes at most) three in four of those split
    two cache lines. The pair tiles' accumulators for 2-8 rows live here; AMD EPYC Zen 4, 2 threads, kernel alone
    in cache, alternating processes: Q4_1 3,072 x 576 at 2 / 4 / 8 rows 68 / 82 / 95 -> 32 / 41-54 / 65-86 us (one
    thread: 134 / 159 / 181 -> 57 / 77 / 119), Q8_0 2,048 x 640 31-44 / 40-59 / 60-90 -> 23 / 30 / 47 us; 16 rows
    (accumulators from np.empty) and one row (decode) unchanged."""

    @intrinsic
    def scratch(typingctx):
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, ir.ArrayType(elt, n))
            slot.align = 64
            return builder.bitcast(slot, elt.as_pointer())

        return types.CPointer(numba_elt)(), codegen

    return scratch


# the tiles' accumulators of the interleaved kernels for up to X8_STACK_ROWS activation rows (decode, small batches):
# on the stack instead of np.empty, whose allocation costs up to ~0.7 us per work item of 16 weight rows
X8_STACK_ROWS = 8
k_scratch = _stack_scratch(_i32, types.int32, 128)  # rowk8's int32 lanes [16, 8]
x8_acc_scratch = _stack_scratch(_f32, types.float32, X8_STACK_ROWS * 16)
x8_int_scratch = _stack_scratch(_i32, types.int32, X8_STACK_ROWS * 8)


def _k4_bytes(context, builder, sig, args):
    """The 12 packed bytes of Q4_K / Q5_K scales at byte args[1] -> 16 bytes: the 8 scales, then the 8 mins.

    llama.cpp's kmask trick (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_q4_K_q8_K) on the three 32-bit words
    x0, x1, x2, in 4 lanes at once: (x0 & m1, (x2 & m2) | ((x0 >> 6) & m3) << 4, x1 & m1,
    ((x2 >> 4) & m2) | ((x1 >> 6) & m3) << 4), m1 = 0x3F.., m2 = 0x0F.., m3 = 0x03.. (reads 16 bytes: the 12, then
    4 of the super-block's quants, unused)."""
    v4 = ir.VectorType(_i32, 4)
    x = builder.load(_ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], v4), align=1)
    m1, m2, m3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    p = builder.shuffle_vector(x, x, ir.Constant(v4, [0, 2, 1, 2]))
    lo = builder.and_(builder.lshr(p, ir.Constant(v4, [0, 0, 0, 4])), ir.Constant(v4, [m1, m2, m1, m2]))
    q = builder.shuffle_vector(x, x, ir.Constant(v4, [0, 0, 1, 1]))
    hi = builder.and_(builder.lshr(q, ir.Constant(v4, [6] * 4)), ir.Constant(v4, [0, m3, 0, m3]))
    v = builder.or_(lo, builder.shl(hi, ir.Constant(v4, [4] * 4)))
    return builder.bitcast(v, ir.VectorType(_i8, 16))


@intrinsic
def k4_unpack(typingctx, a, off):
    """The 12 packed bytes of Q4_K / Q5_K scales at byte `off` -> (8 scales, 8 mins) as int32 lanes (_k4_bytes)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        b = _k4_bytes(context, builder, sig, args)
        lo = builder.shuffle_vector(b, b, ir.Constant(_v8i32, list(range(8))))
        hi = builder.shuffle_vector(b, b, ir.Constant(_v8i32, list(range(8, 16))))
        return context.make_tuple(builder, sig.return_type, [builder.zext(lo, _v8i32), builder.zext(hi, _v8i32)])

    return types.UniTuple(I32x8, 2)(a, off), codegen


@intrinsic
def k4_scales16(typingctx, a, off):
    """The 12 packed bytes of Q4_K / Q5_K scales at byte `off` -> (the 8 scales as 16-bit lanes 0-7 of both 128-bit
    halves, for ibcast16; the 8 mins as int32 lanes). The scales' layout is llama.cpp's for
    get_scale_shuffle_k4 (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_q4_K_q8_K)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        b = _k4_bytes(context, builder, sig, args)
        sc = builder.shuffle_vector(b, b, ir.Constant(ir.VectorType(_i32, 16), list(range(8)) * 2))
        sc = builder.bitcast(builder.zext(sc, _v16i16), _v8i32)
        mins = builder.zext(builder.shuffle_vector(b, b, ir.Constant(_v8i32, list(range(8, 16)))), _v8i32)
        return context.make_tuple(builder, sig.return_type, [sc, mins])

    return types.UniTuple(I32x8, 2)(a, off), codegen


@intrinsic
def k6_scales16(typingctx, a, off):
    """The 16 int8 scales of Q6_K at byte `off` -> (scales 0-7, scales 8-15), each as sign-extended 16-bit lanes
    0-7 of both 128-bit halves, for ipair16 (llama.cpp's ggml_vec_dot_q6_K_q8_K keeps them as 16 bytes and
    shuffles a pair out per 32 values)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
        out = []
        for h in (0, 8):
            x = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 16), list(range(h, h + 8)) * 2))
            out.append(builder.bitcast(builder.sext(x, _v16i16), _v8i32))
        return context.make_tuple(builder, sig.return_type, out)

    return types.UniTuple(I32x8, 2)(a, off), codegen


@intrinsic
def k3_unpack(typingctx, a, off):
    """The 12 packed bytes of Q3_K scales at byte `off` -> 16 scales minus 32, as two int32 vectors.

    The 32-bit shuffles of llama.cpp's ggml_vec_dot_q3_K_q8_K (ggml-cpu/quants.c)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        u = [
            builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, 4 * k)]), _i32.as_pointer()), align=1)
            for k in range(3)
        ]
        c = lambda v: ir.Constant(_i32, v)  # noqa: E731
        m1, m2 = c(0x03030303), c(0x0F0F0F0F)

        def part(lo, lo_shift, hi_shift):
            low = builder.and_(builder.lshr(lo, c(lo_shift)), m2)
            return builder.or_(low, builder.shl(builder.and_(builder.lshr(u[2], c(hi_shift)), m1), c(4)))

        words = (part(u[0], 0, 0), part(u[1], 0, 2), part(u[0], 4, 4), part(u[1], 4, 6))
        v = ir.Constant(ir.VectorType(_i32, 4), [0, 0, 0, 0])
        for i, x in enumerate(words):
            v = builder.insert_element(v, x, c(i))
        b = builder.bitcast(v, ir.VectorType(_i8, 16))
        halves = []
        for h in (list(range(8)), list(range(8, 16))):
            x = builder.zext(builder.shuffle_vector(b, b, ir.Constant(_v8i32, h)), _v8i32)
            halves.append(builder.sub(x, _splat(_v8i32, 32)))
        return context.make_tuple(builder, sig.return_type, halves)

    return types.UniTuple(I32x8, 2)(a, off), codegen


@intrinsic
def xs_unpack(typingctx, a, off):
    """IQ4_XS scales (scales_h:2, scales_l:4 at byte `off`) -> 8 scales minus 32, as int32 lanes."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        sh = builder.zext(builder.load(builder.bitcast(p, _i16.as_pointer()), align=1), _i32)
        sl = builder.load(
            builder.bitcast(builder.gep(p, [ir.Constant(_i64, 2)]), ir.VectorType(_i8, 4).as_pointer()), align=1
        )
        sl = builder.zext(builder.shuffle_vector(sl, sl, ir.Constant(_v8i32, [0, 0, 1, 1, 2, 2, 3, 3])), _v8i32)
        low = builder.and_(builder.lshr(sl, ir.Constant(_v8i32, [0, 4] * 4)), _splat(_v8i32, 15))
        high = builder.and_(
            builder.lshr(_bsplat(builder, _v8i32, sh), ir.Constant(_v8i32, list(range(0, 16, 2)))), _splat(_v8i32, 3)
        )
        return builder.sub(builder.or_(low, builder.shl(high, _splat(_v8i32, 4))), _splat(_v8i32, 32))

    return I32x8(a, off), codegen


@intrinsic
def ishr(typingctx, v, s):
    """v >> s per int32 lane (logical)."""
    if not isinstance(s, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _bsplat(builder, _v8i32, _int_arg(context, builder, sig.args[1], args[1])))

    return I32x8(I32x8, s), codegen


@intrinsic
def idot(typingctx, a, b):
    """sum(a * b) over the 8 int32 lanes."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_i32, [_v8i32]), "llvm.vector.reduce.add.v8i32"
        )
        return builder.call(fn, [builder.mul(args[0], args[1])])

    return types.int32(I32x8, I32x8), codegen


@intrinsic
def ld_i8x8(typingctx, a, off):
    """8 signed bytes at byte `off`, sign-extended to int32 lanes."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.sext(_load(context, builder, sig, args, ir.VectorType(_i8, 8)), _v8i32)

    return I32x8(a, off), codegen


@intrinsic
def iand(typingctx, v, c):
    """v & c per int32 lane."""
    if not isinstance(c, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _bsplat(builder, _v8i32, _int_arg(context, builder, sig.args[1], args[1])))

    return I32x8(I32x8, c), codegen


@intrinsic
def ipair(typingctx, v, k):
    """(v[2k] x 4, v[2k+1] x 4): the scales of a group's two 16-value sub-blocks, in dpbusd's lane order."""
    if not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        k2 = builder.shl(_int_arg(context, builder, sig.args[1], args[1]), ir.Constant(_i32, 1))
        if HAS_AVX2:
            idx = builder.add(_bsplat(builder, _v8i32, k2), ir.Constant(_v8i32, [0, 0, 0, 0, 1, 1, 1, 1]))
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v8i32, [_v8i32, _v8i32]), "llvm.x86.avx2.permd"
            )
            return builder.call(fn, [v, idx])
        a = _bsplat(builder, _v8i32, builder.extract_element(v, k2))
        b = _bsplat(builder, _v8i32, builder.extract_element(v, builder.add(k2, ir.Constant(_i32, 1))))
        return builder.shuffle_vector(a, b, ir.Constant(_v8i32, [0, 1, 2, 3, 12, 13, 14, 15]))

    return I32x8(I32x8, k), codegen


@intrinsic
def ibcast(typingctx, v, k):
    """(v[k] x 8): one group's scale in every lane."""
    if not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        k = _int_arg(context, builder, sig.args[1], args[1])
        if HAS_AVX2:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v8i32, [_v8i32, _v8i32]), "llvm.x86.avx2.permd"
            )
            return builder.call(fn, [args[0], _bsplat(builder, _v8i32, k)])
        return _bsplat(builder, _v8i32, builder.extract_element(args[0], k))

    return I32x8(I32x8, k), codegen


def _pshufb(builder, v, idx):
    """AVX2 vpshufb on int32 vectors: byte j of each 128-bit half = byte idx[j] of that half of v.

    As inline assembly: LLVM rewrites the intrinsic with a constant idx as a broadcast, a shift and a
    vpbroadcastw (two instructions where one does)."""
    ty = ir.FunctionType(_v32i8, [_v32i8, _v32i8])
    args = [builder.bitcast(v, _v32i8), builder.bitcast(idx, _v32i8)]
    out = builder.asm(ty, "vpshufb $2, $1, $0", "=x,x,x", args, False)
    return builder.bitcast(out, _v8i32)


@intrinsic
def opaque(typingctx, x):
    """x, through an empty inline assembly statement: the optimiser cannot tell it equals x, so loads at offsets
    derived from it are not merged with loads at offsets derived from x (rowk8: each weight row reloads the
    activation quants, as a memory operand of vpmaddubsw, instead of the 8 rows sharing 8 registers that then
    spill). Costs no instruction."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.intp)
        return builder.asm(ir.FunctionType(_i64, [_i64]), "", "=r,0", [v], True)

    return types.intp(x), codegen


@intrinsic
def ibcast16(typingctx, v, k):
    """16-bit lane k of v (v with the same 8 16-bit values in both 128-bit halves, k4_scales16) in every 16-bit
    lane: one group's scale twice per int32 lane, the form imadd_pair wants. One in-lane vpshufb on AVX2."""
    if v != I32x8 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        k = builder.trunc(_int_arg(context, builder, sig.args[1], args[1]), _i16)
        if HAS_AVX2:  # bytes 2k, 2k + 1 of each half
            sel = builder.add(builder.mul(k, ir.Constant(_i16, 514)), ir.Constant(_i16, 256))
            return _pshufb(builder, args[0], builder.bitcast(_bsplat(builder, _v16i16, sel), _v8i32))
        x = builder.extract_element(builder.bitcast(args[0], _v16i16), k)
        return builder.bitcast(_bsplat(builder, _v16i16, x), _v8i32)

    return I32x8(I32x8, k), codegen


@intrinsic
def ipair16(typingctx, v, k):
    """16-bit lane 2k of v in every 16-bit lane of the low 128-bit half, lane 2k + 1 in the high half (v with the
    same 8 16-bit values in both halves, k6_scales16): a group's two 16-value scales, each twice per int32 lane,
    in dpbusd's lane order (ipair's lanes in imadd_pair's form). One in-lane vpshufb on AVX2."""
    if v != I32x8 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        k = builder.trunc(_int_arg(context, builder, sig.args[1], args[1]), _i16)
        if HAS_AVX2:  # bytes 4k, 4k + 1 of the low half, 4k + 2, 4k + 3 of the high half
            sel = builder.add(builder.mul(k, ir.Constant(_i16, 1028)), ir.Constant(_i16, 256))
            sel = builder.add(_bsplat(builder, _v16i16, sel), ir.Constant(_v16i16, [0] * 8 + [514] * 8))
            return _pshufb(builder, args[0], builder.bitcast(sel, _v8i32))
        v16 = builder.bitcast(args[0], _v16i16)
        k2 = builder.shl(k, ir.Constant(_i16, 1))
        a = _bsplat(builder, _v16i16, builder.extract_element(v16, k2))
        b = _bsplat(builder, _v16i16, builder.extract_element(v16, builder.add(k2, ir.Constant(_i16, 1))))
        idx = ir.Constant(ir.VectorType(_i32, 16), list(range(8)) + list(range(24, 32)))
        return builder.bitcast(builder.shuffle_vector(a, b, idx), _v8i32)

    return I32x8(I32x8, k), codegen


@intrinsic
def iaddmul(typingctx, a, b, k):
    """a + b * k, int32 lanes (k an integer scalar)."""
    if a != I32x8 or b != I32x8 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        k = _bsplat(builder, _v8i32, _int_arg(context, builder, sig.args[2], args[2]))
        return builder.add(args[0], builder.mul(args[1], k))

    return I32x8(I32x8, I32x8, k), codegen


@intrinsic
def imadd_v(typingctx, acc, p, s):
    """acc + p * s, lane-wise."""

    def codegen(context, builder, sig, args):
        return builder.add(args[0], builder.mul(args[1], args[2]))

    return I32x8(I32x8, I32x8, I32x8), codegen


@intrinsic
def imadd16(typingctx, acc, p, s):
    """acc + p * s, lane-wise, for p in the int16 range and s holding an int16 in its low half (high half 0):
    one VNNI vpdpwssd (acc + p.lo * s.lo + p.hi * s.hi, and s.hi is 0) instead of vpmulld + vpaddd."""

    def codegen(context, builder, sig, args):
        return _imadd16_ir(builder, *args)

    return I32x8(I32x8, I32x8, I32x8), codegen


def _imadd16_ir(builder, acc, p, s):
    if HAS_VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v8i32, [_v8i32] * 3), "llvm.x86.avx512.vpdpwssd.256"
        )
        return builder.call(fn, [acc, p, s])
    if HAS_AVX2:  # vpmaddwd: p.lo * s.lo + p.hi * s.hi, p.hi * 0 = 0
        return builder.add(acc, _pmaddwd(builder, builder.bitcast(p, _v16i16), builder.bitcast(s, _v16i16)))
    lo = builder.ashr(builder.shl(s, _splat(_v8i32, 16)), _splat(_v8i32, 16))  # s.lo as signed
    return builder.add(acc, builder.mul(p, lo))


# ---- 8 x float32 vectors ----------------------------------------------------------------------------------
# No fast-math flags here: every float operation is spelled out (one llvm.fma per multiply-add where the CPU has
# FMA), so LLVM can neither reassociate nor decide per call site whether to fuse. A row's result then depends
# only on its own data, never on how many rows a kernel processes together (batch invariance: a prompt's
# logits are the same whether it is evaluated in one chunk, in several, or token by token).


def _vfma(builder, a, b, c):
    """a * b + c lane-wise: one rounding with FMA, else two (either way the same at every call site)."""
    if HAS_FMA:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8f32, [_v8f32] * 3), "llvm.fma.v8f32")
        return builder.call(fn, [a, b, c])
    return builder.fadd(builder.fmul(a, b), c)


@intrinsic
def fzero(typingctx):
    def codegen(context, builder, sig, args):
        return _splat(_v8f32, 0.0)

    return F32x8(), codegen


@intrinsic
def fma_i(typingctx, acc, iv, scale):
    """acc + float(iv) * scale."""
    if scale != types.float32:
        return None

    def codegen(context, builder, sig, args):
        acc, iv, sc = args
        return _vfma(builder, builder.sitofp(iv, _v8f32), _bsplat(builder, _v8f32, sc), acc)

    return F32x8(F32x8, I32x8, types.float32), codegen


@intrinsic
def fma_v(typingctx, acc, a, b):
    """acc + a * b, lane-wise."""

    def codegen(context, builder, sig, args):
        return _vfma(builder, args[1], args[2], args[0])

    return F32x8(F32x8, F32x8, F32x8), codegen


def _f32x8_binary(op: str):
    """Intrinsic (a, b) of two F32x8 -> the IR instruction `op` (fadd, fsub, fmul, fdiv) lane-wise."""

    @intrinsic
    def binary(typingctx, a, b):
        if a != F32x8 or b != F32x8:
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return F32x8(F32x8, F32x8), codegen

    return binary


fadd_v, fmul_v, fdiv_v = (_f32x8_binary(op) for op in ("fadd", "fmul", "fdiv"))


def _first_lane(builder, mask):
    """IR: the lowest lane set in an <8 x i1> mask as i8, 8 if none is."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.IntType(8), [ir.IntType(8), ir.IntType(1)]), "llvm.cttz.i8"
    )
    return builder.call(fn, [builder.bitcast(mask, ir.IntType(8)), ir.Constant(ir.IntType(1), 0)])


def _rint_ir(builder, v):
    """IR: <8 x float> -> the nearest integers, ties to even, as floats (llvm.rint)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8f32, [_v8f32]), "llvm.rint.v8f32")
    return builder.call(fn, [v])


@intrinsic
def frac_v(typingctx, v):
    """v - rint(v) per lane of 8 or 16 float32 (exact for every finite value): one vreduceps where AVX512DQ / VL
    have it."""
    if v not in (F32x8, F32x16):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        if HAS_REDUCE:  # imm 8: keep no fraction bits, round to nearest even, no precision exception
            if ty.count == 8:
                fn = cgutils.get_or_insert_function(
                    builder.module,
                    ir.FunctionType(ty, [ty, _i32, ty, ir.IntType(8)]),
                    "llvm.x86.avx512.mask.reduce.ps.256",
                )
                return builder.call(fn, [args[0], _i32(8), args[0], ir.IntType(8)(-1)])
            fn = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ty, [ty, _i32, ty, ir.IntType(16), _i32]),
                "llvm.x86.avx512.mask.reduce.ps.512",
            )  # (rounding argument 4: the current direction, no embedded rounding)
            return builder.call(fn, [args[0], _i32(8), args[0], ir.IntType(16)(-1), _i32(4)])
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty]), f"llvm.rint.v{ty.count}f32")
        return builder.fsub(args[0], builder.call(rint, [args[0]]))

    return v(v), codegen


@intrinsic
def fargmin(typingctx, v):
    """The first lane holding the least of v's 8 lanes, without branches: the minimum spread to every lane by three
    shuffle-and-min steps, then the lowest lane equal to it (lane 0 if NaNs leave none equal)."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        low = v
        for perm in ([4, 5, 6, 7, 0, 1, 2, 3], [2, 3, 0, 1, 6, 7, 4, 5], [1, 0, 3, 2, 5, 4, 7, 6]):
            other = builder.shuffle_vector(low, low, ir.Constant(ir.VectorType(_i32, 8), perm))
            low = builder.select(builder.fcmp_ordered("<", other, low), other, low)
        first = _first_lane(builder, builder.fcmp_ordered("==", v, low))
        first = builder.select(
            builder.icmp_unsigned("<", first, ir.Constant(ir.IntType(8), 8)), first, ir.Constant(ir.IntType(8), 0)
        )
        return builder.zext(first, ir.IntType(64))

    return types.int64(F32x8), codegen


@intrinsic
def q8k_codes(typingctx, v):
    """min(127, int32 lanes v) and that + 128: Q8_K's quants and their unsigned form."""
    if v != I32x8:
        return None

    def codegen(context, builder, sig, args):
        top = _splat(_v8i32, 127)
        q = builder.select(builder.icmp_signed("<", args[0], top), args[0], top)
        return context.make_tuple(builder, sig.return_type, [q, builder.add(q, _splat(_v8i32, 128))])

    return types.UniTuple(I32x8, 2)(I32x8), codegen


@intrinsic
def ffind_abs(typingctx, v, a):
    """The first lane of v whose magnitude equals the float32 a, or 8 if none does."""
    if v != F32x8 or a != types.float32:
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8f32, [_v8f32]), "llvm.fabs.v8f32")
        mask = builder.fcmp_ordered("==", builder.call(fn, [args[0]]), _bsplat(builder, _v8f32, args[1]))
        return builder.zext(_first_lane(builder, mask), ir.IntType(64))

    return types.int64(F32x8, types.float32), codegen


@intrinsic
def abs_bits_max(typingctx, acc, v):
    """Lane-wise max of acc and the bits of |v| (v's float32 bits without the sign, as int32): for non-NaN floats
    the order of those bits is the order of the magnitudes, and a NaN's exceed every other's."""
    if acc != I32x8 or v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8i32, [_v8i32] * 2), "llvm.smax.v8i32")
        bits = builder.and_(builder.bitcast(args[1], _v8i32), _splat(_v8i32, 0x7FFFFFFF))
        return builder.call(fn, [args[0], bits])

    return I32x8(I32x8, F32x8), codegen


@intrinsic
def fround_f16_v(typingctx, v):
    """round_f16 of each lane."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        return _round_f16_ir(builder, args[0])

    return F32x8(F32x8), codegen


@intrinsic
def rint_i32x8(typingctx, v):
    """float32 lanes -> the nearest integers, ties to even, as int32 lanes (np.int32(np.rint(x)) per lane)."""
    if v != F32x8:
        return None

    def codegen(context, builder, sig, args):
        return builder.fptosi(_rint_ir(builder, args[0]), _v8i32)

    return I32x8(F32x8), codegen


@intrinsic
def fcvt(typingctx, v):
    """int32 lanes -> float32 lanes (exact below 2^24)."""

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _v8f32)

    return F32x8(I32x8), codegen


@intrinsic
def fbcast(typingctx, x):
    """x in every lane."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return _bsplat(builder, _v8f32, args[0])

    return F32x8(types.float32), codegen


@intrinsic
def fscale(typingctx, v, x):
    """v * x lane-wise, x a float32 scalar."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _bsplat(builder, _v8f32, args[1]))

    return F32x8(F32x8, types.float32), codegen


@intrinsic
def sfma(typingctx, a, b, c):
    """a * b + c for float32 scalars, rounded as fma_v rounds one lane."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, sig, args):
        if HAS_FMA:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_f32, [_f32] * 3), "llvm.fma.f32")
            return builder.call(fn, list(args))
        return builder.fadd(builder.fmul(args[0], args[1]), args[2])

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def hsum(typingctx, v):
    """Sum of the 8 lanes, always as ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))."""

    def codegen(context, builder, sig, args):
        v = args[0]
        a = builder.fadd(
            builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 4), [0, 1, 2, 3])),
            builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 4), [4, 5, 6, 7])),
        )
        b = builder.fadd(
            builder.shuffle_vector(a, a, ir.Constant(ir.VectorType(_i32, 2), [0, 1])),
            builder.shuffle_vector(a, a, ir.Constant(ir.VectorType(_i32, 2), [2, 3])),
        )
        return builder.fadd(
            builder.extract_element(b, ir.Constant(_i32, 0)), builder.extract_element(b, ir.Constant(_i32, 1))
        )

    return types.float32(F32x8), codegen


@intrinsic
def f32x8_of(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    """(a0, ..., a7): eight float32 scalars as one vector."""
    if not all(t == types.float32 for t in (a0, a1, a2, a3, a4, a5, a6, a7)):
        return None

    def codegen(context, builder, sig, args):
        v = _splat(_v8f32, 0.0)
        for k, x in enumerate(args):
            v = builder.insert_element(v, x, ir.Constant(_i32, k))
        return v

    return F32x8(*([types.float32] * 8)), codegen


@intrinsic
def flane(typingctx, v, k):
    """Lane k of v."""
    if v != F32x8 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], _int_arg(context, builder, sig.args[1], args[1]))

    return types.float32(F32x8, k), codegen


@intrinsic
def ld_f32x8(typingctx, a, off):
    """8 float32 at byte `off`."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _load(context, builder, sig, args, _v8f32)

    return F32x8(a, off), codegen


@intrinsic
def ld_f16x8(typingctx, a, off):
    """8 IEEE halves at byte `off`, as float32."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _h2f(builder, _load(context, builder, sig, args, ir.VectorType(_i16, 8)))

    return F32x8(a, off), codegen


@intrinsic
def ld_bf16x8(typingctx, a, off):
    """8 bfloat16 at byte `off`, as float32 (the high halves of float32)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        h = builder.zext(_load(context, builder, sig, args, ir.VectorType(_i16, 8)), _v8i32)
        return builder.bitcast(builder.shl(h, _splat(_v8i32, 16)), _v8f32)

    return F32x8(a, off), codegen


# ---- grid code books and sign bits (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) --------------------------------------
# Their values are entries of a code book (8 values per entry for IQ2, 4 for IQ3) whose values are all positive,
# with one sign bit per value. The tables are ggml-common.h's (iq2xxs_grid .. iq3s_grid, ksigns_iq2xs), the same
# text as in dequant.py (a kernel must not read another file's globals: Numba's cache would not see an edit):
# one 16-bit word (4 hex digits) per entry, value j is level number (word >> bits * j).

# fmt: off
IQ2XXS_HEX = (  # iq2xxs_grid, 256 entries
    "0000000200050008000a00110014002000220028002a00410044005000580061006400800082008a00a20101010401100115014001840198"
    "020002020222028204010404041004210424044004420448046004810484049004a405000502050805200546056905800591060906100640"
    "068406a40800080508080814082808410844085008520888090409400a020a14100110041010102110401060108410901095110011081120"
    "1150115a1180122412451400140814201425144914801518156216001616180118041810184018811900190519a01a5120002002200a2044"
    "20612080208221292148220022022401240424102440245625002541256426902808282028942a4440014004401040184021402440404048"
    "4056406040814084409041004120416141804185420142104248425642684400440844204480449945124524460048014804481048404845"
    "49004958496149824a454a9050005008501150195020508050885104514251a4529154905492550a56015654580058115819586459405a08"
    "6004601060406068610061556218626064006405651065126584684280008002800a80418082810481188140821184018404841084158440"
    "8460850085468594860986408660880289048a11900490109024904090a1911691809245940094229444955198819920a002a050a085a109"
    "a200a418a850a904"
)
IQ2XS_HEX = (  # iq2xs_grid, 512 entries
    "0000000200050008000a00110014001600190020002200250028004100440046004900500052005500580061006400800082008500880091"
    "0094009900a001010104010601090110011201150118011a0121012401400142014501480151015401600168018101840190020002020205"
    "020802110214022002410244025002550280028a040104040406040904100412041504180421042404400442044504480451045404560460"
    "04810484049005000502050505080511051405200541054405500561058006010604061006260640064206840800080208050808080a0811"
    "0814082008250841084408500858088008a008aa0901090409100940098109890a000a200a280a960aa01001100410061009101010121015"
    "1018102110241040104210451048105110541060106a10811084109011001102110511081111111411201141114411501180119411961201"
    "1204120612101240126014001402140514081411141414201441144414491450146414801501150415101540160016141649180118041810"
    "18121840185418861900190519661a511aa92000200220052008200a201120142020204120442050208020a0210121042110214021482165"
    "22002222228022a82401240424102429244025002541255225992601261a26a628002808280a28202855288828a2296829902a082a202a82"
    "2a882a8a40014004400640094010401240154018402140244040404240454048404a40514054406040654081408440904100410241054108"
    "4111411441204141414441504180418541a24201420442104212422942404400440244054408441144144419442044414444445044804494"
    "45014504451045244540459a4600460a464446504801480448104840484548544862490049114944495049694a0450005002500550085011"
    "50145020502850415044505050805101510451105115514051425200524452aa540154045410542154405460548154a15500550855805588"
    "5621566856a158005814584158505899591a594059425a85600160046010604060546062608660a961006224624a62926400641665106540"
    "654565a46801686a69256a066a546a628000800280058008801180148020802a8041804480508080808280a880aa81018104810681108140"
    "81518159820082208280828282a082a8840184048410841284158440846084898500854485a58618866a880088088825885a8880888288a8"
    "89068a228a808a888a968aa890019004901090409056908491009122916492569289940094059444945094589529959095929641985198a6"
    "99499a159a60a000a002a008a00aa020a02aa0a0a151a159a1a6a200a202a208a22aa280a2a0a440a495a665a698a80aa820a822a828a8a0"
    "a8a8a904a984a986aa28aa2aaa91aaaa"
)
IQ2S_HEX = (  # iq2s_grid, 1024 entries
    "0000000200050008000a00110014001600190020002200250028004100440046004900500052005500580061006400660069008000820085"
    "00880091009400a000a500aa0101010401060109011001120115011801210124014001420145014801510154015601590160016501680181"
    "018401900192019501a101a40200020202050208021102140220022a02410244024602490250025502800285028a029402a2040104040406"
    "0409041004120415041804210424042604290440044204450448044a04510454045604590460046204650481048404860489049004950498"
    "04a104a40500050205050508050a051105140516051905200525052805410544054605490550055205550558056105640580058205850588"
    "0591059405a00601060406060609061006150640064506480651065406600681068406900800080208050808081108140816081908200825"
    "082a084108440846084908500852085508580861086408800885089408aa0901090409100912091509180921094009450948095109540960"
    "098109900a000a110a140a220a280a2a0a500a99100110041006100910101012101510181021102410261040104210451048105110541056"
    "1059106010621065106810811084108610901095109810a110a41100110211051108110a1111111411161119112011221125112811411144"
    "1146114911501152115511581161116411801182118511881191119412011204120912101215122112241240124512511254128112841290"
    "14001402140514081411141414161419142014251428144114441446144914501452145514581461146414801482148514881491149414a0"
    "1501150415061509151015121515151815211524154015421545154815511554156015811584159016001605160816111614162016411644"
    "1650168016aa1801180418061809181018151818182118401842184518481851185418601881188419001902190519081911191419201941"
    "19441950196919a21a041a101a401a562000200220052008201120142016201920202025202a2041204420502052205520642080208a2094"
    "20aa2101210421102112211521212140214221452151215421602181218421902200220a22222228222a224422502288228a22a824012404"
    "2406240924102415241824212424244024422445244824512454246024812484249025002505250825112514252025412544255025662580"
    "260126042610264026592800280528112814284128442850288a28aa29012904291029952a0a2a222a642a882a8a40014004400640094010"
    "401240154018401a4021402440264040404240454048404a40514054405640594060406240654081408440904095409840a140a441004102"
    "410541084111411441164119412041224125414141444146414941504152415541584161416441804182418541884191419441a042014204"
    "42104212421542184224424042454248425142544260428142844400440244054408440a4411441444164419442044224425442844414444"
    "4446444944504452445544584461446444804482448544884491449444a04501450445064509451045124515451845214524454045424545"
    "4548455145544560456a4581458445904600460246054608461146144620464146444650468046a548014804480948104812481548184821"
    "48244840484248454848485148544860488448904900490249054908491149144920494149444950498049964a014a044a104a4050005002"
    "5005500850115014501650195020502250255028504150445046504950505052505550585061506450805082508550885091509451015104"
    "5106510951105112511551185121512451405142514551485151515451605181518451905200520552085211521452205241524452505269"
    "5280540154045406540954105412541554185421542454405442544554485451545454605481548454905500550255055508551155145520"
    "5541554455505580560156045610562656405800580258055808581158145820584158445850585a588059015904591059405a005a195a85"
    "5aa8600160046006601060126015601860216024604060456048605160546060608460906100610261056108611161146120614161446150"
    "61806199620462106240625662a164006405640864116414642064416444645064806501650465106540654a656865926600669468016804"
    "6810686568986900692a6a426aa1800080028005800880118014801980208025804180448050805280558058806180808085809180948101"
    "8104810981108112811581188121812481408142814581488151815481818184819081a982008205820a8211821482418244825084018404"
    "8406840984108412841584188421844084428445844884518454846084818484849085008502850585088511851485208541854485508580"
    "858a86018604861086298640880088058811881488418844885088a289018904894089658a228a588a5a8a828aa290019004900990109012"
    "90159018902490409042904590489051905490609081908490909100910591119114914191449150915a920192049210924092a694009402"
    "94059408941194149420944194449450948094969501950495109540959895a19600964696649801980498109826984098a9990099499952"
    "9a90a000a005a00aa014a022a02aa041a044a050a0a2a0aaa140a165a202a20aa222a228a22aa282a288a28aa2a8a401a404a410a440a489"
    "a4a4a500a519a651a80aa828a8a2a954a986aa08aa0aaa20aa22aa28aa88aaaa"
)
IQ3XXS_HEX = (  # iq3xxs_grid, 256 entries
    "0000000200040011001300170020002200310042007300750101010301100112012101250130013201410154017002000202020402110220"
    "0222023102330237025102570275030103070310031203250370041304370444045704730475050105070532055206350664071007140716"
    "0743076110011003101010121021102310301032103410471050110011021111112011221201120312101212122112301272130013021320"
    "1331134613661401140514501520152415461571160517221740200020022011201320202022202620312042210121032105211021122121"
    "2130216321672170220022022211221722202222223722402255230123102314237023742435245325032527254125742701270327162745"
    "3001301030123021302330503065307231003102312031313144314632013203321032253252327233113333343034473472350035063522"
    "3555361436363663373337604004401740354037405340574174422042374240426042664307434544044451446445254543457047054710"
    "4712473050125041507051005106512651555214523252725302535354105423542754725502553156505724574260246044604660646121"
    "6161621762646330633664446505655266336703672170037005700770107032705271267140721272457252730073157333736074217441"
    "7500750275247630"
)
IQ3S_HEX = (  # iq3s_grid, 512 entries
    "0000000100020005000700100011001200140016002000210025003300400042004500470051005300600062007100740077010001010102"
    "0104011001110115012001230127013101350144016101650172020002010205020702100213021602210225023002340242024502470251"
    "0253027002730303031103150320032203310333033603440350035203670371037504000413041704210424043204400443045104700502"
    "0504052005220526053305410545054705660573060606110613063106520671070007020704072007220726073307500754100010011002"
    "1004101010111013101510171020102210311034103610541056106110721100110111031106111011141121113011331141115011521170"
    "1176120012121215121712201224123212401243125512601272130113041307131013131321132713301334134113621370140314051412"
    "1414143114331442144614501454150115101513152115301532155116201624162716441646170117031710171217211735174117621770"
    "2000200120032005200720102012201420162021202320272030203220412043204520502052206720702073207521002102211021132117"
    "2122212521312134214221512201220422072221222322302237224122532257227122742300230223052311232223242331233323422350"
    "2366240124072420242324322435244124722475250425112522253725402553257026002602260726212655266127052711272627302743"
    "2750300230113013301530173022303130333035304230443047305130633071310131033105311431213123314031603172317632003212"
    "3220323232343250330133103314332133233327333033413343334733553373340334113416342234313452346034643501351035123525"
    "3532354435563573361636413701370337203722373540004004401240204024402740324041405040704102410741114113412241304135"
    "4143415141554201420342104215422142334240425742624270430443114313432043224331433544004402442444374440447145054507"
    "4521456246134634466047104715473047434751500250105014502250405044504750525066507451015103510551125121513251725200"
    "5211522352305236525353025307531053275344535153655373540154045420543254465512552655515553564257025704572260116013"
    "6015603160336060610061206127616462126234624262556262627063006314632163406425644364626500650365346560660566406711"
    "6713700070047007702070227036704070547062710271117124714371457201720472107216722172307251730273327335735374017405"
    "74137420745075227542760276317700"
)
# fmt: on


def _code_book(words: str, n_values: int, bits: int, levels) -> np.ndarray:
    """The packed table -> uint8 [entries, n_values] of grid values."""
    w = np.array([int(words[k : k + 4], 16) for k in range(0, len(words), 4)], np.int64)
    return np.array(levels, np.uint8)[(w[:, None] >> (bits * np.arange(n_values))) & ((1 << bits) - 1)]


IQ2_LEVELS = (0x08, 0x19, 0x2B)
IQ2XXS_GRID = _code_book("".join(IQ2XXS_HEX), 8, 2, IQ2_LEVELS)  # [256, 8]
IQ2XS_GRID = _code_book("".join(IQ2XS_HEX), 8, 2, IQ2_LEVELS)  # [512, 8]
IQ2S_GRID = _code_book("".join(IQ2S_HEX), 8, 2, IQ2_LEVELS)  # [1024, 8]
IQ3XXS_GRID = _code_book("".join(IQ3XXS_HEX), 4, 4, (0x04, 0x0C, 0x14, 0x1C, 0x24, 0x2C, 0x34, 0x3E))  # [256, 4]
IQ3S_GRID = _code_book("".join(IQ3S_HEX), 4, 4, range(1, 16, 2))  # [512, 4]
# ksigns_iq2xs: a 7-bit sign index plus an 8th sign bit that makes the count of negative values even
KSIGNS = np.array([i | (bin(i).count("1") & 1) << 7 for i in range(128)], np.uint8)
# the same signs as 8 bytes of +1 / -1 (0x01 / 0xFF) per index: llama.cpp's keven_signs_q2xs
KSIGNS_PM1 = np.where((KSIGNS[:, None] >> np.arange(8)) & 1, 0xFF, 0x01).astype(np.uint8)  # [128, 8]


@intrinsic
def ld_u8(typingctx, a, off):
    """The byte at `off`, as int32."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(_load(context, builder, sig, args, _i8), _i32)

    return types.int32(a, off), codegen


def _grid_rows(context, builder, sig, args):
    """Rows args[1:] of the uint8 [n, width] table args[0], concatenated into 32 bytes (width = 32 / rows)."""
    aryty, idx = sig.args[0], args[1:]
    width = 32 // len(idx)
    ity = ir.IntType(8 * width)
    v = ir.Constant(ir.VectorType(ity, len(idx)), None)
    for k, (t, i) in enumerate(zip(sig.args[1:], idx)):
        off = builder.mul(context.cast(builder, i, t, types.intp), ir.Constant(_i64, width))
        x = builder.load(_ptr(context, builder, aryty, args[0], types.intp, off, ity), align=1)
        v = builder.insert_element(v, x, ir.Constant(_i32, k))
    return builder.bitcast(v, _v32i8)


def _is_table(t) -> bool:
    return isinstance(t, types.Array) and t.layout == "C" and t.ndim == 2 and t.dtype == types.uint8


@intrinsic
def ld_grid8x4(typingctx, table, i0, i1, i2, i3):
    """Rows i0..i3 of a uint8 [n, 8] code book: four 8-value entries as 32 bytes."""
    if not _is_table(table) or not all(isinstance(t, types.Integer) for t in (i0, i1, i2, i3)):
        return None
    return I8x32(table, i0, i1, i2, i3), _grid_rows


@intrinsic
def ld_grid4x8(typingctx, table, i0, i1, i2, i3, i4, i5, i6, i7):
    """Rows i0..i7 of a uint8 [n, 4] code book: eight 4-value entries as 32 bytes."""
    idx = (i0, i1, i2, i3, i4, i5, i6, i7)
    if not _is_table(table) or not all(isinstance(t, types.Integer) for t in idx):
        return None
    return I8x32(table, *idx), _grid_rows


@intrinsic
def ld_grid4x8v(typingctx, table, idx):
    """Rows idx[0..7] (int32 lanes) of a uint8 [n, 4] code book as 32 bytes. Eight scalar loads: AVX2's
    vpgatherdd measured no faster here (AMD Zen, IQ3_S matvec 4.4 vs 4.5 ns per group) and is microcoded slow
    on Intel CPUs with the Gather Data Sampling mitigation."""
    if not _is_table(table) or idx != I32x8:
        return None

    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], types.intp, context.get_constant(types.intp, 0), _i8)
        v = ir.Constant(_v8i32, None)
        for k in range(8):
            i = builder.zext(builder.extract_element(args[1], ir.Constant(_i32, k)), _i64)
            p = builder.bitcast(builder.gep(base, [builder.mul(i, ir.Constant(_i64, 4))]), _i32.as_pointer())
            v = builder.insert_element(v, builder.load(p, align=1), ir.Constant(_i32, k))
        return builder.bitcast(v, _v32i8)

    return I8x32(table, idx), codegen


@intrinsic
def iq3s_entries(typingctx, a, off, qh):
    """IQ3_S entry numbers of a group: byte off + k | bit k of qh << 8, k = 0..7, as int32 lanes."""
    if not _is_ptr_args(a, off) or not isinstance(qh, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], ir.VectorType(_i8, 8))
        lo = builder.zext(builder.load(p, align=1), _v8i32)
        h = _bsplat(builder, _v8i32, _int_arg(context, builder, sig.args[2], args[2]))
        hi = builder.and_(builder.shl(h, ir.Constant(_v8i32, [8, 7, 6, 5, 4, 3, 2, 1])), _splat(_v8i32, 256))
        return builder.or_(lo, hi)

    return I32x8(a, off, qh), codegen


@intrinsic
def bits_pm1(typingctx, m):
    """Byte j = -1 if bit j of the integer m is set, else +1: sign bits as the second operand of apply_sign."""
    if not isinstance(m, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        bits = builder.bitcast(_int_arg(context, builder, sig.args[0], args[0]), ir.VectorType(ir.IntType(1), 32))
        return builder.select(bits, _splat(_v32i8, 0xFF), _splat(_v32i8, 1))

    return I8x32(m), codegen


@intrinsic
def apply_sign(typingctx, v, sgn):
    """v * sgn per byte, sgn +1 or -1 (v's bytes in -127..127): AVX2's vpsignb."""

    def codegen(context, builder, sig, args):
        if HAS_AVX2:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v32i8, [_v32i8, _v32i8]), "llvm.x86.avx2.psign.b"
            )
            return builder.call(fn, list(args))
        neg = builder.icmp_signed("<", args[1], _splat(_v32i8, 0))
        return builder.select(neg, builder.sub(_splat(_v32i8, 0), args[0]), args[0])

    return I8x32(I8x32, I8x32), codegen


# ---- IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4: code books, trits, E8M0 scales ------------------------------------
# iq1s_grid (llama.cpp ggml-common.h), packed as in ggufrun.quants.dequant (the same literal; a test checks).
IQ1S_GRID_PACKED = (
    "AAACAAUACAAKABEAFQAgACIAKAAqAEUAUQBUAFYAZQCAAIIAiACKAJUAoACiAKgAqgAEAQUBEQEUARYBGQEaASUBQQFGAUkBUgFVAVoBYQFk"
    "AWYBaAGFAZEBlAGWAaUBAAICAggCCgIVAiACIgIoAioCRQJRAlkCZAJpAoACggKIAooCkQKVApkCoAKiAqgCqgIRBBQEFgQlBEEESQRVBFoE"
    "ZARlBJEEmQSlBAEFBAUFBQYFFQUYBRoFKQVABUUFSgVQBVEFVAVVBVYFWQVgBWIFZQVoBWoFgQWRBZUFmAWaBaEFpAWlBaYFqQUUBhkGQQZE"
    "BlAGUgZVBlgGYAZhBmYGaQaFBpEGlAaZBgAIAggICAoIFQggCCIIKAgqCEUIUQhWCGUIgAiCCIgIigiVCKAIogioCKoIBQkRCRQJGQkkCSUJ"
    "QQlQCVEJVQlhCWQJaQmRCZQJlgmZCaUJAAoCCggKCgoVCiAKIgooCioKRQpRClkKYQplCoAKggqFCogKigqVCqAKogqoCqoKEBAREBQQGRAk"
    "ECUQQRBEEFAQVRBYEGEQZBBlEGkQkRCUEJYQoRClEAERBBEGEQkREBESERURGBEhESQRKRFFEUoRUBFREVIRVBFVEVYRWRFgEWURhBGSEZUR"
    "oRGkERESFBIWEiUSQBJGEkkSUhJVElgSWhJkEmYShRKREpQSlhKlEgEUBhQJFBQUFRQYFBkUIRQmFEEURRRGFEgUShRRFFQUVRRWFFkUYhRl"
    "FGgUhBSJFJAUlBSVFJgUmRSaFKEUpBSlFKkUAhUFFQoVERUUFRUVFhUZFSAVIhUlFSgVKhVBFUQVRRVGFVEVUhVUFVUVVhVZFVoVYRVkFWUV"
    "ZhVpFYAVghWEFYUViBWKFZAVkRWUFZUVlhWZFZoVoBWiFaUVARYEFgUWBhYVFhYWGBYaFiEWJhZAFkIWRBZFFkgWShZRFlUWVhZYFlkWYRZk"
    "FmUWaBZpFmoWhhaKFpIWlRakFqkWERgWGCUYQRhEGEYYSRhQGFUYWBhaGGAYYRhkGGYYaRiFGJEYlBilGBAZEhkVGRoZIRklGUIZRBlFGUgZ"
    "URlUGVUZVhlZGVoZYBllGWoZiRmRGZIZlRmYGaEZphmpGQkaFhokGiYaRBpGGkkaUBpSGlUaWBphGmYaaRqFGpEalhqaGgAgAiAIIAogFSAg"
    "ICIgJSAoICogRSBRIFkgYSBlIIAggiCIIIoglSCgIKIgpSCoIKogBSERIRQhGSElIUIhRCFJIVUhWCFaIWEhZCFlIWYhhSGQIZYhmSGlIQEi"
    "CCIKIhEiFSIgIiIiKCIqIkUiUSJWIlkiZSKBIogiiiKRIpUioCKiIqgiqiIFJBQkFiQZJCUkRCRFJEYkSSRSJFUkWCRaJGYkhSSRJJQkmSSh"
    "JKUkCSUVJSElKSVAJUUlSCVRJVQlVSVZJWIlZSVoJYklkCWUJZUlmCWaJaElpCWmJaklBSYQJhImGSYlJkEmSSZVJmAmYSZpJoQmhiaQJpom"
    "ACgCKAgoCigVKCAoIigoKCooRShRKFQoZSiAKIIoiCiKKKAooiioKKooCSkRKRQpGSklKUYpSSlSKVUpYSlkKWYpaSmFKZAplimZKaQppSkA"
    "KgIqCCoKKiAqIiooKioqRSpRKlYqWSplKoAqgiqIKooqlSqgKqIqqCqqKgVAEUAWQCVASUBSQFVAWEBaQGFAZEBmQJRAmUChQKZAAEEBQQRB"
    "BkEJQRJBFUEWQRhBGkEhQSZBKUFFQUhBSkFRQVRBVUFWQVlBWkFlQWhBakGBQYRBhkGQQZJBlUGgQaFBokEFQhFCFEIWQiVCQUJSQlVCWkJk"
    "QmlCiUKUQqVCAUQVRBlEKURFREhESkRRRFREVURWRGFEYkRlRGhEakSBRIZEiUSQRJJElUSgRKFEqUQBRQJFBUUKRRFFFEUVRRZFGUUgRSVF"
    "KkVBRURFRUVGRUlFUEVRRVRFVUVWRVhFWUVhRWRFZUVmRWlFgkWERYVFiEWRRZRFlUWWRZlFmkWlRahFqkUBRgVGCUYURhVGGEYaRiFGJEYp"
    "RkBGQkZFRkhGUEZRRlJGVUZWRllGYkZlRmhGgUaFRopGlEaVRqFGpEamRgVIEUgVSBpIJUhCSElIUEhVSFhIYUhkSGZIaUiFSJFIlEiWSJlI"
    "pUgBSQVJBkkKSRBJFEkVSRhJIUkkSSZJQElFSUpJUUlSSVRJVUlWSVlJYEliSWVJZklqSYZJiUmSSZVJlkmYSaFJpEmmSalJFkpESkZKSUpV"
    "SlhKWkpkSmlKlEqlSgFQBFAFUAZQCVASUBVQGlAhUCRQKVBAUEVQSFBRUFRQVVBWUFlQZVBoUIZQiVCVUJhQoFChUKZQqVAFUQhRCVEKURFR"
    "FFEVURZRGFEZUSBRJVEmUShRKlFBUURRRVFGUUlRUFFRUVJRVFFVUVZRWFFZUVpRYVFkUWVRZlFpUYJRhVGRUZRRlVGWUZlRoFGlUapRAVIG"
    "UhJSFVIaUiFSJFJCUkVSSlJRUlRSVVJWUllSYlJlUoVSkFKSUpVSmVKaUqRSBFQFVBFUFFQVVBZUGFQZVCFUJVQoVCpUQVREVEVURlRJVEpU"
    "UFRRVFRUVVRWVFhUWVRaVGFUYlRkVGVUZlRpVIBUiFSKVJFUlFSVVJZUmVShVKRUpVSqVAFVAlUEVQVVBlUJVRBVEVUSVRRVFVUWVRlVGlUh"
    "VSRVJVUmVSlVQFVBVUJVRFVFVUZVSFVJVVBVUVVSVVRVVVVWVVhVWVVaVWBVYVVkVWVVZlVoVWlValWBVYRVhVWJVYpVkFWRVZRVlVWWVZhV"
    "mVWhVaRVpVWmValVAFYBVgJWBFYGVghWCVYRVhRWFVYYVhlWIFYhViJWJFYlViZWKFYpVkFWRVZGVkhWSVZKVlBWUVZSVlRWVVZWVlhWWVZa"
    "VmFWZFZlVmlWglaFVoZWiFaJVopWkVaVVppWolalVqZWqFapVgRYBVgGWAlYEFgVWBhYIVgqWEVYSFhKWFFYVFhVWFZYWFhZWGBYYlhkWGVY"
    "gliJWJBYkliVWJhYoVipWAFZAlkFWQpZEVkUWRVZFlkZWSVZQVlEWUVZRllJWVBZUVlSWVRZVVlWWVhZWVlaWWFZZFllWWZZaVmBWYVZiVmR"
    "WZRZlVmWWZhZmVmlWQRaCFoVWhpaIFolWiZaKVpFWkhaSVpRWlVaVlpYWllaYlplWmhaalqBWopaklqVWpZamFqaWqFaBWAUYBZgGWAlYERg"
    "UGBVYFZgWGBaYGFgZGBmYGlggWCWYKVgAWEEYQZhCWESYRVhIWEiYSZhKWFFYUlhUWFVYVZhWWFlYWZhamGEYYphkmGVYaFhpmGpYRFiFmIZ"
    "YkBiQWJGYlViVmJYYmBihWKRYpZipWIRZBJkFWQWZBpkIWQmZClkQGRCZEVkSGRKZFFkVGRVZFZkWWRaZGBkYmRlZIRkhWSJZJBkkmSUZJVk"
    "lmSYZJpkoWSkZKlkBWUIZQplEWUVZRZlGWVEZUVlRmVJZVBlUWVUZVVlVmVZZWFlZGVlZWZlaWWGZYllimWRZZVllmWZZZplomWlZaZlqGUC"
    "ZglmFWYgZiZmKGYpZkBmRWZIZkpmUWZUZlVmVmZYZlpmYGZlZmhmgGaCZoVmimaUZpZmmGaZZqBmpGamZqpmFmgZaCVoQWhSaFVoWmhhaGlo"
    "hWiRaJhopmgBaQRpEGkVaSFpJGkmaSlpQGlBaUVpRmlIaVFpVGlVaVZpWWlgaWVpammCaYRpimmVaaFppGmlaalpEWoWahhqQWpEaklqUGpV"
    "alhqWmpkamVqaWqGapRqmGqaaqZqAIACgAiACoAggCKAKIAqgEWAUIBRgFSAVoBZgGWAgICCgIiAioCVgKCAooCogKqABYERgRSBFoEZgSWB"
    "QYFEgUmBUIFSgVWBVoFYgVmBZIFmgWmBhYGJgZSBloGZgaWBAIICggiCCoIVgiCCIoIogiqCUYJUglmCZYKAgoKCiIKKgpWCoIKigqiCqoIU"
    "hBmEQYREhFGEVYRahGGEZIRphJSEmYQBhQmFEoUVhRqFJoUphUCFQYVFhUiFUYVUhVWFVoVZhVqFZYVmhWiFaoWBhYSFhoWJhZCFkoWVhZiF"
    "poURhhaGGYYlhkGGRIZJhkqGUIZVhlmGWoZhhmaGaoaFhpGGmoakhgCIAogIiAqIFYggiCKIKIgqiEGIRYhRiFSIWYhliGmIgIiCiIiIioiV"
    "iKCIooioiKqIBYkGiRGJFIkWiSWJQYlEiUaJSYlQiVKJVYlaiWGJZImFiZaJmYmliQCKAooIigqKFYogiiKKKIoqikWKUYpUilaKgIqCioiK"
    "ioqViqCKooqoiqqKBZARkBaQGJAZkCWQQZBGkEmQVZBYkFqQaZBqkIWQkZCUkJaQmZClkAGRBJEGkQmREJEVkRiRGpEhkSSRJpEpkUCRRZFQ"
    "kVGRVJFVkVaRWZFikWWRhJGGkZKRlZGYkaGRpJGmkamRBZIRkhSSGZIlkkSSRpJJklCSUpJVkliSZpJpkoWSlJKWkqmSAZQElAaUEJQVlBiU"
    "JpRAlEqUUZRUlFWUVpRYlFmUYJRhlGKUZZSElIaUkpSUlJWUmJShlKmUAJUFlQiVCpUQlRGVFJUVlRaVGZUhlSWVKZUqlUGVRJVFlUaVSZVQ"
    "lVGVUpVUlVWVVpVYlVmVWpVhlWSVZZVmlWmVgZWFlYiVkZWSlZSVlZWWlZmVmpWglaKVpZWolaqVAZYElhCWFZYZliCWJpYplkWWSJZJllGW"
    "UpZVllaWWZZllmiWgpaElomWipaSlpSWlZaklqaWqZYFmBaYGZglmEGYRphQmFKYVZhWmFqYZJhlmIWYkZiWmJmYpZgEmQaZCZkQmRKZFZkY"
    "mRqZIJkhmSSZJplAmUKZRZlImUqZUZlUmVWZVplZmWKZZZlmmWqZgZmEmZCZkpmVmZqZoZmmmQWaFZolmkSaRppJmlCaVZpYmmGahZqRmpSa"
    "lZqWmgCgAqAIoAqgFaAgoCKgKKAqoEWgUaBUoFagWaCAoIKgiKCKoJWgoKCioKigqqAFoQmhEaEUoRahGaEaoUahSaFRoVWhWKFaoWGhZKGF"
    "oZChkqGWoZmhAqIIogqiEKIZoiKiKKIqokWiUaJWolmiZaKAooKiiKKKopWioKKioqiiqqIZpCWkQaREpFCkVKRVpFikWqRhpGWkZqRopGmk"
    "haQGpQmlEKUSpRWlGKUmpSmlQqVFpVGlVKVVpValWaVlpWqlgaWEpYWlhqWJpZKllaWYpQWmEaYWphqmIaYlpkSmRqZKplKmVaZWplimYKZi"
    "poamkKaVppammaahpqSmpqYAqAKoCKgKqCCoIqgoqCqoUahUqFaoWaiAqIKoiKiKqJWooKiiqKioqqgFqRSpGakhqSWpQalQqVWpWqlhqWap"
    "aamQqZapAKoCqgiqCqogqiKqKKoqqlGqVKpWqoCqgqqIqoqqlaqgqqKqqKqqqg=="
)


def _iq1_grid_codes(packed: str) -> np.ndarray:
    """IQ1S_GRID_PACKED -> int64 [2048]: per entry its 8 values v as the bytes 8 * (v + 1) (0, 8, 16), the
    grid part of the IQ1 codes 8 * (v + 1) + (delta + 1) that the row dots use (see _codes_t)."""
    entries = np.frombuffer(base64.b64decode("".join(packed)), "<u2").astype(np.int64)
    codes = ((entries[:, None] >> (2 * np.arange(8))) & 3) * 8
    return (codes << (8 * np.arange(8))).sum(1).astype(np.int64)


IQ1_GRID8 = _iq1_grid_codes(IQ1S_GRID_PACKED)
IQ1_DELTA_UP = 0x0202020202020202  # + 2 in each of 8 bytes: delta + 1 for delta = +1

# TQ1_0: the power of three that selects each value's trit from its byte, per group of 32 values (see _codes_t)
TQ1_POW3 = np.array(
    [[3**g] * 32 for g in range(5)]
    + [[1] * 16 + [3] * 16, [9] * 16 + [27] * 16, [81] * 16 + sum(([p] * 4 for p in (1, 3, 9, 27)), [])],
    np.uint8,
).reshape(-1)

# kvalues_mxfp4 (llama.cpp ggml-common.h): E2M1 values doubled
FP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@intrinsic
def i8x32_of(typingctx, a, b, c, e):
    """The 32 bytes of four 64-bit integers, a's first (little-endian): four 8-value grid entries as one vector."""
    if not all(isinstance(t, types.Integer) for t in (a, b, c, e)):
        return None

    def codegen(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(_i64, 4), [0] * 4)
        for k in range(4):
            x = context.cast(builder, args[k], sig.args[k], types.int64)
            v = builder.insert_element(v, x, ir.Constant(_i32, k))
        return builder.bitcast(v, _v32i8)

    return I8x32(a, b, c, e), codegen


def _iq1_index4(context, builder, sig, args, bits):
    """Byte l of the uint32 q4 in bits 0-7 of the 16-bit lane l of an int64, field l of `bits` bits of qh (fields
    packed from bit 0) in bits 8 and up: BMI2's pdep deposits both in two instructions (llama.cpp's AVX2 IQ1_S
    kernel does the same); shifts and masks without BMI2."""
    x = builder.zext(context.cast(builder, args[0], sig.args[0], types.uint32), _i64)
    y = context.cast(builder, args[1], sig.args[1], types.int64)
    c = lambda v: ir.Constant(_i64, v)  # noqa: E731
    field = (1 << bits) - 1
    if HAS_BMI2:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_i64, [_i64, _i64]), "llvm.x86.bmi.pdep.64")
        lanes = builder.call(fn, [y, c((field << 8) * 0x0001000100010001)])
        return builder.or_(builder.call(fn, [x, c(0x00FF00FF00FF00FF)]), lanes)
    x = builder.and_(builder.or_(x, builder.shl(x, c(16))), c(0x0000FFFF0000FFFF))
    x = builder.and_(builder.or_(x, builder.shl(x, c(8))), c(0x00FF00FF00FF00FF))
    pair = (1 << 2 * bits) - 1  # fields 0-1 stay in the low half, 2-3 move to bit 32, then 1 and 3 up by 16
    y = builder.and_(y, c((1 << 4 * bits) - 1))
    y = builder.and_(builder.or_(y, builder.shl(y, c(32 - 2 * bits))), c(pair | pair << 32))
    y = builder.and_(builder.or_(y, builder.shl(y, c(16 - bits))), c(field * 0x0001000100010001))
    return builder.or_(x, builder.shl(y, c(8)))


@intrinsic
def iq1s_index4(typingctx, q4, qh):
    """IQ1_S's 4 grid indices of a group as the 16-bit lanes of an int64: lane l = byte l of q4 | bits 3l..3l+2
    of qh << 8."""
    if not (isinstance(q4, types.Integer) and isinstance(qh, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _iq1_index4(context, builder, sig, args, 3)

    return types.int64(q4, qh), codegen


@intrinsic
def iq1m_index4(typingctx, q4, qh):
    """IQ1_M's 4 grid indices of a group, with their delta signs, as the 16-bit lanes of an int64: lane l = byte l
    of q4 | nibble l of qh << 8 (bits 8-10 the index's high bits, bit 11 the sign)."""
    if not (isinstance(q4, types.Integer) and isinstance(qh, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return _iq1_index4(context, builder, sig, args, 4)

    return types.int64(q4, qh), codegen


@intrinsic
def tq1_trits(typingctx, v, p):
    """((v * p mod 256) * 3) >> 8 per byte: the base-3 digit of v that the power of three p selects (0..2),
    TQ1_0's unpacking (dequantize_row_tq1_0). Both bytes of a 16-bit lane share p (TQ1_POW3's layout).

    In 16-bit lanes, without unpacking the bytes: a byte moved to the high half times p keeps v * p mod 256 there
    (vpmullw), and the high half of that times 3 is the digit (vpmulhuw)."""
    if v != I8x32 or p != I8x32:
        return None

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_i16, 16)
        x = builder.bitcast(args[0], v16)
        p16 = builder.and_(builder.bitcast(args[1], v16), _splat(v16, 0xFF))

        def mulhi3(a):  # (a * 3) >> 16, unsigned
            if HAS_AVX2:
                fn = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(v16, [v16, v16]), "llvm.x86.avx2.pmulhu.w"
                )
                return builder.call(fn, [a, _splat(v16, 3)])
            v32 = ir.VectorType(_i32, 16)
            wide = builder.mul(builder.zext(a, v32), _splat(v32, 3))
            return builder.trunc(builder.lshr(wide, _splat(v32, 16)), v16)

        lo = mulhi3(builder.mul(builder.shl(x, _splat(v16, 8)), p16))  # even bytes: digit in the low half
        hi = mulhi3(builder.mul(builder.and_(x, _splat(v16, 0xFF00)), p16))  # odd bytes
        return builder.bitcast(builder.or_(lo, builder.shl(hi, _splat(v16, 8))), _v32i8)

    return I8x32(I8x32, I8x32), codegen


@intrinsic
def dpbusd_scaled(typingctx, acc, u, s, a, b):
    """acc + (dpbusd lanes of u . s) * (a in lanes 0-3, b in lanes 4-7): a group's two 16-value halves, each
    times its scale. For operands whose byte pairs u[2k] * s[2k] + u[2k+1] * s[2k+1] stay within int16 (code
    book values below 64 times quants of -127..127) and scales below 2^15: llama.cpp's vpmaddubsw (which
    saturates beyond int16) then vpmaddwd by the scales, two instructions, also where VNNI has vpdpbusd (which
    would still need a vpmulld for the scales)."""
    if not isinstance(a, types.Integer) or not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        acc, u, s = args[:3]
        if HAS_AVX2:
            v16 = ir.VectorType(_i16, 16)
            sa, sb = (builder.trunc(_int_arg(context, builder, t, x), _i16) for t, x in zip(sig.args[3:], args[3:]))
            scale = builder.shuffle_vector(
                _bsplat(builder, v16, sa),
                _bsplat(builder, v16, sb),
                ir.Constant(ir.VectorType(_i32, 16), [0] * 8 + [16] * 8),
            )
            return builder.add(acc, _pmaddwd(builder, _pmaddubsw(builder, u, s), scale))
        va, vb = (_bsplat(builder, _v8i32, _int_arg(context, builder, t, x)) for t, x in zip(sig.args[3:], args[3:]))
        scale = builder.shuffle_vector(va, vb, ir.Constant(_v8i32, [0, 1, 2, 3, 12, 13, 14, 15]))
        return builder.add(acc, builder.mul(_dpbusd(builder, _splat(_v8i32, 0), u, s), scale))

    return I32x8(I32x8, I8x32, I8x32, a, b), codegen


@intrinsic
def ld_dup16(typingctx, a, off):
    """16 bytes at `off`, twice."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 32), list(range(16)) * 2))

    return I8x32(a, off), codegen


@intrinsic
def ld_tq1_tail(typingctx, a, off):
    """TQ1_0's last 20 bytes of codes at `off` (qs[32:48], qh[0:4]) -> qs[32:48], then qh[0:4] four times."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        lo = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        qh = builder.load(
            builder.bitcast(builder.gep(p, [ir.Constant(_i64, 16)]), ir.VectorType(_i8, 4).as_pointer()), align=1
        )
        hi = builder.shuffle_vector(qh, qh, ir.Constant(ir.VectorType(_i32, 16), [0, 1, 2, 3] * 4))
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_i32, 32), list(range(32))))

    return I8x32(a, off), codegen


def _lut16(builder, idx, table):
    """table[idx] per byte (idx 0..15, table 16 byte values): vpshufb where the CPU has AVX2."""
    if HAS_AVX2:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_v32i8, [_v32i8, _v32i8]), "llvm.x86.avx2.pshuf.b"
        )
        return builder.call(fn, [ir.Constant(_v32i8, list(table) * 2), idx])
    out = _splat(_v32i8, 0)
    for k, t in enumerate(table):
        out = builder.select(builder.icmp_unsigned("==", idx, _splat(_v32i8, k)), _splat(_v32i8, t), out)
    return out


@intrinsic
def fp4_lut(typingctx, idx):
    """kvalues_mxfp4[idx] per byte (idx 0..15), as signed bytes."""

    def codegen(context, builder, sig, args):
        return _lut16(builder, args[0], [v & 0xFF for v in FP4_VALUES])

    return I8x32(I8x32), codegen


@intrinsic
def fp4_lut_u(typingctx, idx):
    """kvalues_mxfp4[idx] + 12 per byte: the code book as unsigned bytes 0..24 (narrow: dpbusd_n)."""

    def codegen(context, builder, sig, args):
        return _lut16(builder, args[0], [v + 12 for v in FP4_VALUES])

    return I8x32(I8x32), codegen


def _e8m0_half(builder, e):
    """E8M0 bytes (i32 or <n x i32>) -> GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) as float (exact)."""
    vec = isinstance(e.type, ir.VectorType)

    def c(v):
        return ir.Constant(e.type, [v] * e.type.count) if vec else ir.Constant(_i32, v)

    sub = builder.shl(c(0x00200000), e)  # e < 2: the subnormals 2^-128, 2^-127
    normal = builder.shl(builder.sub(e, c(1)), c(23))
    bits = builder.select(builder.icmp_unsigned("<", e, c(2)), sub, normal)
    return builder.bitcast(bits, ir.VectorType(_f32, e.type.count) if vec else _f32)


@intrinsic
def ld_e8m0(typingctx, a, off):
    """The E8M0 scale byte at `off`, as GGML_E8M0_TO_FP32_HALF (MXFP4's d)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return _e8m0_half(builder, builder.zext(_load(context, builder, sig, args, _i8), _i32))

    return types.float32(a, off), codegen


@intrinsic
def ld_e8m0_rows(typingctx, a, off, stride):
    """ld_e8m0 of the bytes at off, off + stride, ..., off + 7 * stride, as float32 lanes (8 rows' scales)."""
    if not (_is_ptr_args(a, off) and isinstance(stride, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        base = context.cast(builder, args[1], sig.args[1], types.intp)
        step = context.cast(builder, args[2], sig.args[2], types.intp)
        e = ir.Constant(_v8i32, [0] * 8)
        for r in range(8):
            o = builder.add(base, builder.mul(step, ir.Constant(_i64, r)))
            x = builder.load(_ptr(context, builder, sig.args[0], args[0], types.intp, o, _i8), align=1)
            e = builder.insert_element(e, builder.zext(x, _i32), ir.Constant(_i32, r))
        return _e8m0_half(builder, e)

    return F32x8(a, off, stride), codegen


@intrinsic
def h2f(typingctx, h):
    """IEEE half bits (an integer 0..0xFFFF) -> float32, exactly."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return _h2f(builder, builder.trunc(context.cast(builder, args[0], sig.args[0], types.int32), _i16))

    return types.float32(h), codegen


@intrinsic
def iq1s_scales(typingctx, a, off):
    """IQ1_S: the 8 uint16 qh words at `off` -> the group scales 2 * ((qh >> 12) & 7) + 1, as int32 lanes."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        qh = builder.zext(_load(context, builder, sig, args, ir.VectorType(_i16, 8)), _v8i32)
        ls = builder.and_(builder.lshr(qh, _splat(_v8i32, 12)), _splat(_v8i32, 7))
        return builder.or_(builder.shl(ls, _splat(_v8i32, 1)), _splat(_v8i32, 1))

    return I32x8(a, off), codegen


@intrinsic
def iq1m_scales(typingctx, a, off):
    """IQ1_M: the 4 uint16 scale words at `off` -> the 16 scales 2 * s + 1 of 16 values each (s the 3-bit fields
    at bits 0, 3, 6, 9 of each word), as two int32 vectors in value order (they line up with bsums16)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        sc = builder.zext(_load(context, builder, sig, args, ir.VectorType(_i16, 4)), ir.VectorType(_i32, 4))
        shifts = ir.Constant(_v8i32, [0, 3, 6, 9] * 2)
        out = []
        for lanes in ([0, 0, 0, 0, 1, 1, 1, 1], [2, 2, 2, 2, 3, 3, 3, 3]):
            v = builder.shuffle_vector(sc, sc, ir.Constant(_v8i32, lanes))
            ls = builder.and_(builder.lshr(v, shifts), _splat(_v8i32, 7))
            out.append(builder.or_(builder.shl(ls, _splat(_v8i32, 1)), _splat(_v8i32, 1)))
        return context.make_tuple(builder, sig.return_type, out)

    return types.UniTuple(I32x8, 2)(a, off), codegen


@intrinsic
def imadd_small(typingctx, acc, u, s, sc):
    """acc + sc * (dpbusd lane sums of u * s), for operands whose byte pairs u[2k] s[2k] + u[2k+1] s[2k+1] stay
    within int16 (unsigned bytes u <= 129 against any s; K-quant codes within +-32 against quants + 128) and sc
    holding an int16 in its low half (high half 0), as imadd16(acc, dpbusd(izero(), u, s), sc) computes it, exactly.

    Without VNNI, AVX2's vpmaddubsw (pairs of u * s, saturated to int16: never reached while 2 * 129 * 128 <
    32768) and vpmaddwd (pairs times sc) do it in two instructions where the dpbusd emulation needs a dozen:
    llama.cpp's AVX2 route for IQ1_S / TQ2_0 (ggml-cpu/arch/x86/quants.c)."""
    if not (acc == I32x8 and u == I8x32 and s == I8x32 and sc == I32x8):
        return None

    def codegen(context, builder, sig, args):
        acc, u, s, sc = args
        if HAS_VNNI or not HAS_AVX2:
            return _imadd16_ir(builder, acc, _dpbusd(builder, _splat(_v8i32, 0), u, s), sc)
        sc2 = builder.bitcast(builder.or_(sc, builder.shl(sc, _splat(_v8i32, 16))), _v16i16)  # the scale twice
        return builder.add(acc, _pmaddwd(builder, _pmaddubsw(builder, u, s), sc2))

    return I32x8(I32x8, I8x32, I8x32, I32x8), codegen


@intrinsic
def imadd_pair(typingctx, acc, u, s, sc2):
    """imadd_small with the scale already twice in every int32 lane (sc2 = sc | sc << 16, ibcast16 / ipair16):
    acc + sc * (dpbusd lane sums of u * s), for the same narrow operands. AVX2 without VNNI: vpmaddubsw, then
    vpmaddwd by sc2 as it is (llama.cpp's _mm256_madd_epi16(scale, p16) in ggml_vec_dot_q4_K_q8_K)."""
    if not (acc == I32x8 and u == I8x32 and s == I8x32 and sc2 == I32x8):
        return None

    def codegen(context, builder, sig, args):
        acc, u, s, sc2 = args
        if HAS_VNNI or not HAS_AVX2:  # vpdpwssd needs the high half 0
            sc = builder.and_(sc2, _splat(_v8i32, 0xFFFF))
            return _imadd16_ir(builder, acc, _dpbusd(builder, _splat(_v8i32, 0), u, s), sc)
        return builder.add(acc, _pmaddwd(builder, _pmaddubsw(builder, u, s), builder.bitcast(sc2, _v16i16)))

    return I32x8(I32x8, I8x32, I8x32, I32x8), codegen


@intrinsic
def ione(typingctx):
    """1 in every lane (a unit scale for imadd_small)."""

    def codegen(context, builder, sig, args):
        return _splat(_v8i32, 1)

    return I32x8(), codegen


# ---------------------------------------------------------------------------------------------------------
# 3. Activation quantization: the formats of llama.cpp's vec_dot_types, each block's scale chosen by a search.
# llama.cpp: quantize_row_q8_0 / q8_1 (ggml-cpu/arch/x86/quants.c): d = amax/127, q = round-half-even(x * (127/amax)),
# d stored as fp16; Q8_1 also stores s = fp16(d * sum(q)) with the unrounded d. quantize_row_q8_K_ref
# (ggml-quants.c, also used on x86): iscale = -127/max (max = the first element of largest magnitude, with its
# sign), q = min(127, nearest_int(iscale * x)), d = 1/iscale as float32, plus sums of q over each 16 values
# (bsums; we also keep sums over 32).
# ggufrun starts from the same scale and tries 7 slightly larger ones, d0 * (1 + SCALE_STEP * c) for c = 0..7
# (amax / 127 never clips a value and a larger scale never does either), and keeps per block the candidate whose
# quants reproduce its values with the least squared error: a dot product's rounding error is the weights against
# those per-value errors, so its variance follows their sum. Q8_1's candidates are rounded to fp16 (the scale the
# kernels multiply by) and the quants rounded against that stored scale; Q8_K's are 1 / (iscale / (1 + step c)),
# c = 0 being llama.cpp's. On Gaussian and t(3) values the sum falls by 10-16 % (32 values) and 1-4 % (256
# values) from llama.cpp's rule; the mean KL divergence of the small golden models from their float reference fell
# by 12-16 % and 2.4-5.0 % (README, "Quality against the float model"). The 8 candidates are the 8 lanes of one
# vector (_best_scale), so the search costs 3 vector operations a value (multiply, vreduceps, fma). Q8_1's s is
# d * sum(q) with the stored d, in float32. Blocks of zeros, blocks holding inf or NaN, and Q8_1 blocks whose scale
# is outside fp16's normal range keep llama.cpp's rule.
# The quants are stored as q (int8); Q8_K also stores them as q + 128 (uint8, 1..255: vpdpbusd wants its first
# operand unsigned) for the K-quants whose codes stay signed (see the module docstring).
SCALE_STEP = 0.005


@intrinsic
def bits_f32(typingctx, i):
    """IEEE bits (the low 32 of an integer) -> the float32 they encode (a bitcast); also model.kernels' _expf."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0] if i.bitwidth == 32 else builder.trunc(args[0], _i32)
        return builder.bitcast(v, _f32)

    return types.float32(i), codegen


@njit(inline="always", **EXACT)
def _amax(x, m, o, n):
    """max |x| over x[m, o:o+n] (n % 8 == 0), from the float bits (abs_bits_max) in 8 integer lanes. Written as a
    scalar loop, LLVM unrolled it into a chain of compare-and-branch steps (~4 mispredicted a block of 32 values)."""
    K = x.shape[1]
    best = izero()
    for j in range(o, o + n, 8):
        best = abs_bits_max(best, ld_f32x8(x, 4 * (m * K + j)))
    return bits_f32(imax1(best))


@njit(inline="always", **EXACT)
def _scale_steps():
    """1 + SCALE_STEP * c in lane c (c = 0..7)."""
    f = np.float32(SCALE_STEP)
    o = np.float32(1.0)
    return f32x8_of(
        o,
        o + f,
        o + np.float32(2.0) * f,
        o + np.float32(3.0) * f,
        o + np.float32(4.0) * f,
        o + np.float32(5.0) * f,
        o + np.float32(6.0) * f,
        o + np.float32(7.0) * f,
    )


@njit(inline="always", **EXACT)
def _errors4(x, at, inv, a0, a1, a2, a3):
    """_best_scale's four chains after the 4 values of x at byte `at`."""
    r = frac_v(fscale(inv, ld_f32(x, at)))
    a0 = fma_v(a0, r, r)
    r = frac_v(fscale(inv, ld_f32(x, at + 4)))
    a1 = fma_v(a1, r, r)
    r = frac_v(fscale(inv, ld_f32(x, at + 8)))
    a2 = fma_v(a2, r, r)
    r = frac_v(fscale(inv, ld_f32(x, at + 12)))
    a3 = fma_v(a3, r, r)
    return a0, a1, a2, a3


@njit(inline="always", **EXACT)
def _least_error(a0, a1, a2, a3, rel):
    """The lane of the least squared error, the four chains (_errors4) summed in units of the first scale."""
    return fargmin(fmul_v(fadd_v(fadd_v(a0, a1), fadd_v(a2, a3)), fmul_v(rel, rel)))


@njit(inline="always", **EXACT)
def _best_scale_v(x, m, o, n, inv, rel):
    """The lane c (the first of equals) of 8 candidate scales (inv: their inverses as the quantizer takes them,
    q = rint(x * inv); rel: each scale over the first) with the least sum over x[m, o:o+n] of
    ((x * inv_c - q) * rel_c)^2, the squared rounding error in units of the first scale; n % 4 == 0."""
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()  # four chains, so the adds do not wait on each other
    at = 4 * (m * x.shape[1] + o)
    for j in range(0, 4 * n, 16):
        a0, a1, a2, a3 = _errors4(x, at + j, inv, a0, a1, a2, a3)
    return _least_error(a0, a1, a2, a3, rel)


# On AVX-512 (HAS_ZMM) a block's search runs on 16-lane vectors: lane 4c + k of a pair (a, b) is chain k of
# candidate c (a: c = 0..3, b: c = 4..7), and each step loads its 4 values once for all 32 chains (vbroadcastf32x4):
# 6 vector operations for 4 values where _errors4 takes 12. Every chain takes _errors4's operations in its order (lane
# c of chain k there), so the same sums, the same choice and the same bits. Ice Lake VM, old / new calls alternating
# in one process (medians): quantize_q8_k_rows 16 / 256 rows x 576-1,536 values 1.10-1.30x faster on 1-2 threads,
# decode's quantize_q8_1 / q8_k (1 x 576) 1.08x. The four blocks of _q8_1_scales4 keep 8 lanes: there the chains of
# four blocks already fill the float units, and their 16-lane form ran 0.80-0.88x as fast on this CPU.


@intrinsic
def ld_f32x4_z(typingctx, a, off):
    """The 4 float32 at byte `off` in each quarter of 16 lanes (lane 4c + k <- value k)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        v4 = _load(context, builder, sig, args, ir.VectorType(_f32, 4))
        return builder.shuffle_vector(v4, v4, ir.Constant(ir.VectorType(_i32, 16), [k % 4 for k in range(16)]))

    return F32x16(a, off), codegen


@intrinsic
def fspread4_z(typingctx, v, h):
    """Lane 4c + k <- lane 4h + c of v (F32x8, h a literal 0 or 1): candidates 4h..4h+3, each over its 4 chains."""
    if v != F32x8 or not isinstance(h, types.IntegerLiteral):
        return None
    at = 4 * h.literal_value

    def codegen(context, builder, sig, args):
        idx = ir.Constant(ir.VectorType(_i32, 16), [at + k // 4 for k in range(16)])
        return builder.shuffle_vector(args[0], args[0], idx)

    return F32x16(v, h), codegen


@intrinsic
def fchain_z(typingctx, a, b, k):
    """Chain k (a literal 0..3) of the 8 candidates: lane c <- lane 4c + k of a (c < 4), of b (c >= 4)."""
    if a != F32x16 or b != F32x16 or not isinstance(k, types.IntegerLiteral):
        return None
    at = k.literal_value

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1], ir.Constant(_v8i32, [4 * c + at for c in range(8)]))

    return F32x8(F32x16, F32x16, k), codegen


@njit(inline="always", **EXACT)
def _errors_z(x, at, ia, ib, a, b):
    """_errors4 for the 8 candidates' 4 chains at once (ia, ib: the inverses spread by fspread4_z)."""
    v = ld_f32x4_z(x, at)
    ra = frac_v(fmul_z(ia, v))
    rb = frac_v(fmul_z(ib, v))
    return fma_z(a, ra, ra), fma_z(b, rb, rb)


@njit(inline="always", **EXACT)
def _least_error_z(a, b, rel):
    """_least_error of the chains in a and b (_errors_z)."""
    return _least_error(fchain_z(a, b, 0), fchain_z(a, b, 1), fchain_z(a, b, 2), fchain_z(a, b, 3), rel)


@njit(inline="always", **EXACT)
def _best_scale_z(x, m, o, n, inv, rel):
    """_best_scale on 16-lane vectors (the same lane, the same bits)."""
    ia, ib = fspread4_z(inv, 0), fspread4_z(inv, 1)
    a, b = fzero_z(), fzero_z()
    at = 4 * (m * x.shape[1] + o)
    for j in range(0, 4 * n, 16):
        a, b = _errors_z(x, at + j, ia, ib, a, b)
    return _least_error_z(a, b, rel)


_best_scale = _best_scale_z if HAS_ZMM else _best_scale_v  # (one of the two compiled into the quantizers)


@njit(inline="always", **EXACT)
def _candidates(dm):
    """_q8_1_scale's 8 candidate scales for amax / 127 = dm (fp16-rounded), their inverses, each over the first."""
    cand = fround_f16_v(fscale(_scale_steps(), dm))
    return cand, fdiv_v(fbcast(np.float32(1.0)), cand), fscale(cand, np.float32(1.0) / flane(cand, 0))


@njit(inline="always", **EXACT)
def _fp16_normal(dm):
    """Whether every candidate scale of amax / 127 = dm is a normal fp16 (else the search is not taken)."""
    return np.float32(6.2e-5) <= dm <= np.float32(63000.0)


@njit(inline="always", **EXACT)
def _llama_scale(dm, amax):
    """llama.cpp's rule: the fp16-rounded amax / 127 and the inverse 127 / amax (0 for a block of zeros)."""
    return round_f16(dm), (np.float32(127.0) / amax if amax != 0 else np.float32(0.0))


@njit(inline="always", **EXACT)
def _q8_1_scale(x, m, b):
    """Block b of row m: (its fp16-rounded scale, the inverse the quants are rounded with)."""
    amax = _amax(x, m, b * 32, 32)
    dm = amax / np.float32(127.0)
    if _fp16_normal(dm):
        cand, inverse, rel = _candidates(dm)
        c = _best_scale(x, m, b * 32, 32, inverse, rel)
        return flane(cand, c), flane(inverse, c)
    return _llama_scale(dm, amax)


@njit(inline="always", **EXACT)
def _q8_1_pick(dm, amax, cand, inverse, k):
    """_q8_1_scale's result from the search's choice k, or llama.cpp's rule where a candidate falls outside fp16's
    normal range (the search then ran on values it does not use)."""
    if _fp16_normal(dm):
        return flane(cand, k), flane(inverse, k)
    return _llama_scale(dm, amax)


@njit(inline="always", **EXACT)
def _q8_1_scales4(x, m, b):
    """_q8_1_scale of blocks b..b+3 of row m, each step taken for the four blocks together: one block's steps are a
    chain of dependent operations (max, candidates, their inverses, the search, the choice) that the core overlaps
    with a neighbour's only where both are this close in the code. The same operations per block, so the same bits;
    one copy of the search in the compiled code (a block outside the search's range picks llama.cpp's rule after it)."""
    o = b * 32
    am0, am1, am2, am3 = _amax(x, m, o, 32), _amax(x, m, o + 32, 32), _amax(x, m, o + 64, 32), _amax(x, m, o + 96, 32)
    dm0, dm1 = am0 / np.float32(127.0), am1 / np.float32(127.0)
    dm2, dm3 = am2 / np.float32(127.0), am3 / np.float32(127.0)
    c0, v0, r0 = _candidates(dm0)
    c1, v1, r1 = _candidates(dm1)
    c2, v2, r2 = _candidates(dm2)
    c3, v3, r3 = _candidates(dm3)
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    a20, a21, a22, a23 = fzero(), fzero(), fzero(), fzero()
    a30, a31, a32, a33 = fzero(), fzero(), fzero(), fzero()
    row = 4 * (m * x.shape[1] + o)  # byte of block b's first value
    for j in range(0, 128, 16):
        a00, a01, a02, a03 = _errors4(x, row + j, v0, a00, a01, a02, a03)
        a10, a11, a12, a13 = _errors4(x, row + j + 128, v1, a10, a11, a12, a13)
        a20, a21, a22, a23 = _errors4(x, row + j + 256, v2, a20, a21, a22, a23)
        a30, a31, a32, a33 = _errors4(x, row + j + 384, v3, a30, a31, a32, a33)
    s0, i0 = _q8_1_pick(dm0, am0, c0, v0, _least_error(a00, a01, a02, a03, r0))
    s1, i1 = _q8_1_pick(dm1, am1, c1, v1, _least_error(a10, a11, a12, a13, r1))
    s2, i2 = _q8_1_pick(dm2, am2, c2, v2, _least_error(a20, a21, a22, a23, r2))
    s3, i3 = _q8_1_pick(dm3, am3, c3, v3, _least_error(a30, a31, a32, a33, r3))
    return s0, i0, s1, i1, s2, i2, s3, i3


@njit(inline="always", **EXACT)
def _q8_1_store(x, d, s, qs, sums, m, b, scale, inv):
    """Block b of row m quantized with inv, its scale and sums stored."""
    K = x.shape[1]
    o = m * K + b * 32
    q0 = rint_i32x8(fscale(ld_f32x8(x, 4 * o), inv))  # 8 lanes at a time: LLVM would unroll a scalar loop instead
    q1 = rint_i32x8(fscale(ld_f32x8(x, 4 * (o + 8)), inv))
    q2 = rint_i32x8(fscale(ld_f32x8(x, 4 * (o + 16)), inv))
    q3 = rint_i32x8(fscale(ld_f32x8(x, 4 * (o + 24)), inv))
    st_i8x8(qs, o, q0)
    st_i8x8(qs, o + 8, q1)
    st_i8x8(qs, o + 16, q2)
    st_i8x8(qs, o + 24, q3)
    tot = isum1(iadd(iadd(q0, q1), iadd(q2, q3)))  # one horizontal sum a block (integers: the same total)
    d[m, b] = scale
    s[m, b] = scale * np.float32(tot)
    sums[m, b] = tot


# On AVX-512 the multi-row quantizer searches 16 blocks at a time, lane l holding block l (_q8_1_scales16): the
# blocks' values transposed in registers into 32 vectors (value j of every block in vector j, st_blocks_lanes), then
# for four candidates at a time the four chains of _errors4 over those vectors (each vector loaded once for the four:
# 16 chains in registers), and the least error kept lane by lane (a later candidate only where strictly less: the
# first of equals, as fargmin). Every lane takes its block's own operations in their order (its max, its candidates
# and their inverses, the chains, their sum and the first least; llama.cpp's rule outside fp16's normal range), so the
# same scales, quants and bits as the four-block steps and decode's quantizer, with no horizontal step left in the
# search. Why it is not twice as fast as its half as many vector operations a value suggest: vreduceps runs on one
# port, and 16-lane code leaves the third port of 8-lane code unused. Ice Lake VM, one thread, the two forms in turn
# in one process (medians of 15 x 20,000 rows): 4 / 16 x 576 values 3.23 / 11.29 -> 2.93 / 8.88 us, 16 x 1,536 27.3
# -> 24.6, 256 x 576 225 -> 176 (1.10-1.28x).
Q8_1_LANE_BLOCKS = 16  # blocks a step of the search with a block in each lane (_q8_1_scales16)
q8_1_values_scratch = _stack_scratch(_f32, types.float32, 32 * 16)  # [32 values, 16 blocks]
q8_1_lanes_scratch = _stack_scratch(_f32, types.float32, 2 * 16)  # each block's scale, then each one's inverse


def _scratch_ptr(context, builder, p, off, offty, elt):
    """Pointer to byte `off` of a CPointer scratch (_stack_scratch), cast to `elt`*."""
    data = builder.bitcast(p, _i8.as_pointer())
    return builder.bitcast(builder.gep(data, [context.cast(builder, off, offty, types.intp)]), elt.as_pointer())


@intrinsic
def st_zs(typingctx, p, off, v):
    """Store 16 float32 lanes at byte `off` of a stack scratch (a CPointer from _stack_scratch)."""
    if not isinstance(p, types.CPointer) or not isinstance(off, types.Integer) or v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _scratch_ptr(context, builder, args[0], args[1], sig.args[1], _v16f32), align=64)
        return context.get_dummy_value()

    return types.none(p, off, v), codegen


@intrinsic
def ld_zs(typingctx, p, off):
    """16 float32 lanes at byte `off` of a stack scratch (st_zs)."""
    if not isinstance(p, types.CPointer) or not isinstance(off, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_scratch_ptr(context, builder, args[0], args[1], sig.args[1], _v16f32), align=64)

    return F32x16(p, off), codegen


@intrinsic
def ld_f32s(typingctx, p, i):
    """Float32 i of a stack scratch (a CPointer from _stack_scratch)."""
    if not isinstance(p, types.CPointer) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = builder.gep(
            builder.bitcast(args[0], _f32.as_pointer()), [context.cast(builder, args[1], sig.args[1], types.intp)]
        )
        return builder.load(ptr)

    return types.float32(p, i), codegen


def _transpose16(builder, rows):
    """IR: 16 vectors of 16 float32 -> their transpose (vector j holds lane j of every input, input l in lane l): one
    stage per bit of the lane index, each swapping that bit of the row and lane indices with 16 two-vector shuffles."""
    rows = list(rows)
    for h in (1, 2, 4, 8):
        lo_mask = ir.Constant(ir.VectorType(_i32, 16), [c if not c & h else 16 + c - h for c in range(16)])
        hi_mask = ir.Constant(ir.VectorType(_i32, 16), [c + h if not c & h else 16 + c for c in range(16)])
        out = list(rows)
        for i in range(16):
            if i & h:
                continue
            a, b = rows[i], rows[i + h]
            out[i] = builder.shuffle_vector(a, b, lo_mask)
            out[i + h] = builder.shuffle_vector(a, b, hi_mask)
        rows = out
    return rows


@intrinsic
def st_blocks_lanes(typingctx, a, off, p):
    """The 16 blocks of 32 float32 at byte `off` of a, stored into the stack scratch p (512 float32) one value per
    vector: value j of block l at float j * 16 + l (two 16 x 16 transposes in registers)."""
    if not _is_ptr_args(a, off) or not isinstance(p, types.CPointer):
        return None

    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        dst = builder.bitcast(args[2], _v16f32.as_pointer())
        for half in range(2):
            rows = []
            for blk in range(16):
                at = ir.Constant(_i64, 128 * blk + 64 * half)
                rows.append(builder.load(builder.bitcast(builder.gep(base, [at]), _v16f32.as_pointer()), align=4))
            for j, v in enumerate(_transpose16(builder, rows)):
                builder.store(v, builder.gep(dst, [ir.Constant(_i64, 16 * half + j)]), align=64)
        return context.get_dummy_value()

    return types.none(a, off, p), codegen


@njit(inline="always", **EXACT)
def _chain_step_z(v, inv, acc):
    """One value's step of a candidate's error chain (_errors4): acc + frac(v * inv)^2, fused."""
    r = frac_v(fmul_z(inv, v))
    return fma_z(acc, r, r)


@njit(inline="always", **EXACT)
def _chain_steps4_z(v, inv, acc):
    """One value's step of four candidates' chains (inv, acc: tuples of four vectors), as _chain_step_z."""
    return (
        _chain_step_z(v, inv[0], acc[0]),
        _chain_step_z(v, inv[1], acc[1]),
        _chain_step_z(v, inv[2], acc[2]),
        _chain_step_z(v, inv[3], acc[3]),
    )


@njit(inline="always", **EXACT)
def _error_z(a0, a1, a2, a3, cand, first):
    """_least_error's measure of a candidate from its four chains (first: 1 / candidate 0): their sum in units of the
    first scale, squared."""
    rel = fmul_z(cand, first)
    return fmul_z(fadd_z(fadd_z(a0, a1), fadd_z(a2, a3)), fmul_z(rel, rel))


@njit(inline="always", **EXACT)
def _errors4_z(k0, k1, k2, k3, cands, first):
    """_error_z of four candidates: chain k of candidate c in kk[c], their scales in cands."""
    return (
        _error_z(k0[0], k1[0], k2[0], k3[0], cands[0], first),
        _error_z(k0[1], k1[1], k2[1], k3[1], cands[1], first),
        _error_z(k0[2], k1[2], k2[2], k3[2], cands[2], first),
        _error_z(k0[3], k1[3], k2[3], k3[3], cands[3], first),
    )


@njit(inline="always", **EXACT)
def _candidate_z(steps, c, dm):
    """Candidate scale c of every lane's block (_candidates): the fp16-rounded step c x amax / 127."""
    return fround_f16_z(fmul_z(fbcast_z(flane(steps, c)), dm))


@njit(inline="always", **EXACT)
def _q8_1_candidates4_z(values, steps, dm, c0, first):
    """Candidates c0..c0+3 of _q8_1_scales16's 16 blocks: (their scales, their inverses, their errors), each a tuple
    of 4 vectors; each value loaded once for the four (16 chains in registers). first: 1 / candidate 0, None for
    c0 = 0 (then this call's own first inverse)."""
    cand = (_candidate_z(steps, c0, dm), _candidate_z(steps, c0 + 1, dm), _candidate_z(steps, c0 + 2, dm),
            _candidate_z(steps, c0 + 3, dm))  # fmt: skip
    one = fbcast_z(np.float32(1.0))
    inv = (fdiv_z(one, cand[0]), fdiv_z(one, cand[1]), fdiv_z(one, cand[2]), fdiv_z(one, cand[3]))
    z = fzero_z()
    k0, k1, k2, k3 = (z, z, z, z), (z, z, z, z), (z, z, z, z), (z, z, z, z)  # chain k of each of the four
    for j in range(0, 32, 4):  # value j + k feeds chain k, as _errors4
        k0 = _chain_steps4_z(ld_zs(values, 64 * j), inv, k0)
        k1 = _chain_steps4_z(ld_zs(values, 64 * j + 64), inv, k1)
        k2 = _chain_steps4_z(ld_zs(values, 64 * j + 128), inv, k2)
        k3 = _chain_steps4_z(ld_zs(values, 64 * j + 192), inv, k3)
    return cand, inv, _errors4_z(k0, k1, k2, k3, cand, inv[0] if first is None else first)


@njit(inline="always", **EXACT)
def _q8_1_scales16(x1, at, values):
    """_q8_1_scale of the 16 blocks of 32 values at byte `at` of x1 (float32, flat), block l in lane l: (their scales,
    inverses, amax / 127 and amax), 16 lanes each (the caller takes llama.cpp's rule where amax / 127 is outside fp16's
    normal range, as _q8_1_pick: the search's lanes then hold values it does not use). values: a stack scratch of 512
    float32, value j of block l at j * 16 + l."""
    st_blocks_lanes(x1, at, values)
    big = izero_z()
    for j in range(32):
        big = abs_bits_max_z(big, ld_zs(values, 64 * j))
    amax = bits_f32z(big)
    dm = fdiv_z(amax, fbcast_z(np.float32(127.0)))
    steps = _scale_steps()
    s0, v0, e0 = _q8_1_candidates4_z(values, steps, dm, 0, None)
    s1, v1, e1 = _q8_1_candidates4_z(values, steps, dm, 4, v0[0])  # v0[0]: 1 / candidate 0
    # the first least of the eight: a later candidate only where strictly less
    scale, inverse, best = s0[0], v0[0], e0[0]
    for c in range(1, 8):
        e, cand, inv = (e0[c], s0[c], v0[c]) if c < 4 else (e1[c - 4], s1[c - 4], v1[c - 4])
        scale = fpick_z(e, best, cand, scale)
        inverse = fpick_z(e, best, inv, inverse)
        best = fpick_z(e, best, e, best)
    return scale, inverse, dm, amax


@njit(inline="always", **EXACT)
def _quantize_q8_1_lanes(x, d, s, qs, sums, m0, m1):
    """_quantize_q8_1_rows' rows m0..m1-1 sixteen blocks at a time (_q8_1_scales16), the blocks of consecutive rows
    taken as one run (x C-contiguous); the last sixteen may overlap those before (the same bits again). False (and
    nothing done) where the rows hold fewer than 16 blocks."""
    nb = x.shape[1] // 32
    n = (m1 - m0) * nb
    if n < Q8_1_LANE_BLOCKS:
        return False
    x1 = x.reshape(-1)
    values, lanes = q8_1_values_scratch(), q8_1_lanes_scratch()
    for g0 in range(0, n, Q8_1_LANE_BLOCKS):
        g = m0 * nb + min(g0, n - Q8_1_LANE_BLOCKS)  # the first block of this step, counted from row 0
        scales, inverses, dms, amaxes = _q8_1_scales16(x1, 128 * g, values)
        # llama.cpp's rule where amax / 127 is outside fp16's normal range (_q8_1_pick), lane by lane
        st_zs(lanes, 0, fnormal_pick_z(dms, scales, fround_f16_z(dms)))
        st_zs(lanes, 64, fnormal_pick_z(dms, inverses, fnonzero_z(amaxes, fdiv_z(fbcast_z(np.float32(127.0)), amaxes))))
        m, b = g // nb, g % nb
        for lane in range(Q8_1_LANE_BLOCKS):
            if b == nb:  # the next row's first block
                m, b = m + 1, 0
            scale, inv = ld_f32s(lanes, lane), ld_f32s(lanes, 16 + lane)
            _q8_1_store(x, d, s, qs, sums, m, b, scale, inv)
            b += 1
    return True


@njit(inline="always", **EXACT)
def _no_lanes(x, d, s, qs, sums, m0, m1):
    """Without AVX-512: _quantize_q8_1_rows' four-block steps take every row."""
    return False


_q8_1_by_lanes = _quantize_q8_1_lanes if HAS_ZMM else _no_lanes  # (one of the two compiled into the quantizer)


@njit(**EXACT)
def _quantize_q8_1_rows(x, d, s, qs, sums, m0, m1):
    """quantize_q8_1 of rows m0..m1-1. Four blocks at a time (_q8_1_scales4; the last four overlapping the ones before):
    one block's steps (max, candidate scales, their inverses, the search, the choice) form a chain of dependent
    operations, which the core overlaps with other blocks' only where their steps stand close together in the code.
    Ice Lake, one thread, min of 2,000 calls (16 x 576 / 16 x 1,536 / 1 x 576 values): two blocks at a time,
    scalar loads with index checks in the search 13.4-13.7 / 33.2-34.0 / 1.23-1.26 us; four blocks a step,
    the search's values loaded by byte offset 9.8-10.3 / 23.1-23.4 / 1.03-1.05 us."""
    if _q8_1_by_lanes(x, d, s, qs, sums, m0, m1):  # AVX-512, 16 blocks or more
        return
    nb = x.shape[1] // 32
    for m in range(m0, m1):
        if nb < 4:
            for b in range(nb):
                scale, inv = _q8_1_scale(x, m, b)
                _q8_1_store(x, d, s, qs, sums, m, b, scale, inv)
            continue
        for b4 in range(0, nb, 4):
            b = min(b4, nb - 4)  # the last four may overlap the four before: those blocks get the same bits again
            s0, i0, s1, i1, s2, i2, s3, i3 = _q8_1_scales4(x, m, b)
            _q8_1_store(x, d, s, qs, sums, m, b, s0, i0)
            _q8_1_store(x, d, s, qs, sums, m, b + 1, s1, i1)
            _q8_1_store(x, d, s, qs, sums, m, b + 2, s2, i2)
            _q8_1_store(x, d, s, qs, sums, m, b + 3, s3, i3)


@njit(**EXACT)
def quantize_q8_1(x, d, s, qs, sums):
    """x float32 [M, K] -> d float32 [M, K/32] (fp16-rounded), s [M, K/32], qs int8 [M, K] (q),
    sums int32 [M, K/32] (sum of q per block). Two blocks a step (_quantize_q8_1_rows' bits): decode's quantizer,
    which a first run compiles before its first token, in 1.1 s where the four-block steps take 2.5 (1 x 576 values
    1.15 us, 1.05 with them: not worth the wait)."""
    nb = x.shape[1] // 32
    for m in range(x.shape[0]):
        for b in range(0, nb - 1, 2):
            scale0, inv0 = _q8_1_scale(x, m, b)
            scale1, inv1 = _q8_1_scale(x, m, b + 1)
            _q8_1_store(x, d, s, qs, sums, m, b, scale0, inv0)
            _q8_1_store(x, d, s, qs, sums, m, b + 1, scale1, inv1)
        if nb % 2:
            scale, inv = _q8_1_scale(x, m, nb - 1)
            _q8_1_store(x, d, s, qs, sums, m, nb - 1, scale, inv)


@njit(**EXACT)
def _quantize_q8_k_rows(x, qu, d, bsums16, bsums32, qs, m0, m1):
    """quantize_q8_k of rows m0..m1-1."""
    K = x.shape[1]
    for m in range(m0, m1):
        for b in range(K // 256):
            o = b * 256
            amax = _amax(x, m, o, 256)
            vmax = np.float32(0.0)
            for j in range(o, o + 256, 8):  # the first value of that magnitude, with its sign
                lane = ffind_abs(ld_f32x8(x, 4 * (m * K + j)), amax)
                if lane < 8:
                    vmax = x[m, j + lane]
                    break
            iscale = np.float32(-127.0) / vmax if amax != 0 else np.float32(0.0)
            if amax != 0 and amax < np.float32(np.inf) and abs(iscale) < np.float32(np.inf):
                steps = _scale_steps()
                inverse = fdiv_v(fbcast(iscale), steps)
                iscale = flane(inverse, _best_scale(x, m, o, 256, inverse, steps))
            d[m, b] = np.float32(1.0) / iscale if amax != 0 else np.float32(0.0)
            for g in range(16):  # 8 lanes at a time
                t = np.int32(0)
                for j in range(o + 16 * g, o + 16 * g + 16, 8):
                    q, u = q8k_codes(rint_i32x8(fscale(ld_f32x8(x, 4 * (m * K + j)), iscale)))
                    st_i8x8(qs, m * K + j, q)
                    st_i8x8(qu, m * K + j, u)
                    t += isum1(q)
                bsums16[m, b * 16 + g] = t
            for g in range(8):
                bsums32[m, b * 8 + g] = bsums16[m, b * 16 + 2 * g] + bsums16[m, b * 16 + 2 * g + 1]


@njit(**EXACT)
def quantize_q8_k(x, qu, d, bsums16, bsums32, qs):
    """x float32 [M, K] -> qu uint8 [M, K] (q + 128), d [M, K/256], bsums16 [M, K/16], bsums32 [M, K/32]."""
    _quantize_q8_k_rows(x, qu, d, bsums16, bsums32, qs, 0, x.shape[0])


QUANTIZE_ROWS = 4  # activation rows per work item of the parallel quantizers (an 8-row batched step: 2 items)


@launcher(_quantize_q8_1_rows, EXACT_PARALLEL)
def quantize_q8_1_rows(x, d, s, qs, sums):
    """quantize_q8_1 for several rows (the same arrays and bits), QUANTIZE_ROWS a work item: up to that many on this
    thread (run_items), so that a pass of 2 rows (the model's warm-up) compiles what a prompt runs."""
    run_items("_quantize_q8_1_rows", (x, d, s, qs, sums), x.shape[0], QUANTIZE_ROWS)


@launcher(_quantize_q8_k_rows, EXACT_PARALLEL)
def quantize_q8_k_rows(x, qu, d, bsums16, bsums32, qs):
    """quantize_q8_k for several rows (the same arrays and bits), as quantize_q8_1_rows."""
    run_items("_quantize_q8_k_rows", (x, qu, d, bsums16, bsums32, qs), x.shape[0], QUANTIZE_ROWS)


# ---------------------------------------------------------------------------------------------------------
# 4. Row dots. Each weight block is decoded to 8-bit codes in registers and multiplied with the 8-bit
# activation quants in int32 lanes (exact), then float multiply-adds fold the integers into the result:
#   32-value types (row32, rows8x1, _rows32): 8 weight rows at a time, lane r = output row r. Per block, the 8
#     rows' exact integer dots (unsigned codes . signed quants, minus offset x the block's quant sum) are folded
#     into one vector (isum8), then acc = fma(float(isum), d_w * d_x, acc) for 8 outputs at once; rows outside
#     a group of 8 take the same steps one at a time (row32). With 4 or more activation rows, _tiles32 decodes
#     each block of the 8 weight rows once for a whole tile of rows, whose accumulators wait in L1 (on AVX2 the
#     codes, rows8x1's two accumulators and four rows' worth of them do not fit the 16 vector registers: tiles of
#     4 rows held in registers spilled, and ran 12% slower at 16 rows, SmolLM2's ffn_up Q4_1 1536x576).
#   K-quants (rowk, rowk8, rowkx4): per super-block, the exact integer S = sum over groups of dpbusd(codes, x) *
#     sub-block scale (codes with an offset that stays in them, Q3_K / IQ4_XS, are signed and meet x + 128,
#     corrected by corr128; Q6_K's offset comes off through the quant sums, _koffset) and, for the types with mins,
#     Mn = mins . quant sums; then acc = fma(float(S), d_w * d_x, acc), accm = fma(float(Mn), dmin * -d_x, accm),
#     and acc + accm at the end. Decode takes 8 weight rows at a time in lanes as the 32-value types do (rowk8,
#     isum8), prefill 4 activation rows per weight row with their S and Mn in the lanes of one vector (rowkx4).
# The multi-row variants (prefill) decode a weight block once and then do for each activation row exactly what
# the 1-row variant (decode) does, in the same order: integers are exact and the float steps are the same
# sequence, so a row's result never depends on the rows processed with it (tests/test_quants.py checks bit
# equality). `kind` is a compile-time constant: the branches on it fold away (LLVM inlines the small helpers).

# ---- 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) ------------------------------------------


@njit(**DOT)
def _block32(kind, w, o, unsigned):
    """Block at byte o -> (codes I8x32, d, m): value j = d * (codes[j] - offset) + m, offset = _offset32(kind)
    if `unsigned`, else the codes are the signed values themselves (offset 0). Layouts: see registry."""
    if kind == Q4_0:
        q = ld_nib(w, o + 2)
        return (q if unsigned else isub(q, 8)), ld_f16(w, o), np.float32(0.0)
    if kind == Q4_1:
        return ld_nib(w, o + 4), ld_f16(w, o), ld_f16(w, o + 2)
    if kind == Q5_0:
        q = vor(ld_nib(w, o + 6), bits32_to(ld_u32(w, o + 2), 16))
        return (q if unsigned else isub(q, 16)), ld_f16(w, o), np.float32(0.0)
    if kind == Q5_1:
        return vor(ld_nib(w, o + 8), bits32_to(ld_u32(w, o + 4), 16)), ld_f16(w, o), ld_f16(w, o + 2)
    if kind == Q8_0:
        q = ld_i8x32(w, o + 2)
        return (flip(q) if unsigned else q), ld_f16(w, o), np.float32(0.0)
    if kind == MXFP4:  # E8M0 scale byte, then nibbles as IQ4_NL's, through kvalues_mxfp4
        q = ld_nib(w, o + 1)
        return (fp4_lut_u(q) if unsigned else fp4_lut(q)), ld_e8m0(w, o), np.float32(0.0)
    q = ld_nib(w, o + 2)  # IQ4_NL
    return (iq4_lut_u(q) if unsigned else iq4_lut(q)), ld_f16(w, o), np.float32(0.0)


@njit(inline="always", **DOT)
def _wide32(kind):
    """Whether `kind`'s codes take all 8 bits (Q8_0, IQ4_NL): on SIGNED_PAIRS CPUs they stay signed."""
    return kind == Q8_0 or kind == IQ4_NL


@njit(inline="always", **DOT)
def _offset32(kind):
    """What the codes the row dots use exceed the signed values by (0 where they use the signed values)."""
    if SIGNED_PAIRS and _wide32(kind):
        return 0
    if kind == Q4_0:
        return 8
    if kind == Q5_0:
        return 16
    if kind == Q8_0 or kind == IQ4_NL:
        return 128
    if kind == MXFP4:
        return 12
    return 0


@njit(inline="always", **DOT)
def _dp32(kind, u, x):
    """int32 lanes of a 32-value block's codes u (from _codes32) . quants x: codes of at most 5 bits (MXFP4's:
    <= 24) are narrow (dpbusd_n); Q8_0's and IQ4_NL's reach 255 unsigned, or stay signed (dpbssd) on SIGNED_PAIRS
    CPUs."""
    if _wide32(kind):
        if SIGNED_PAIRS:
            return dpbssd(izero(), u, x)
        return dpbusd(izero(), u, x)
    return dpbusd_n(izero(), u, x)


@njit(inline="always", **DOT)
def _codes32(kind, w, o):
    """_block32 with the codes the row dots use: unsigned (offset _offset32), or signed for wide codes on
    SIGNED_PAIRS CPUs."""
    return _block32(kind, w, o, not (SIGNED_PAIRS and _wide32(kind)))


@njit(inline="always", **DOT)
def row32(kind, bsize, w, wo, m, d, s, qs, sums):
    """Weight row at byte wo . activation row m, for a 32-value block type of `bsize` bytes.

    Per block: the exact integer dot (unsigned codes . signed quants, minus offset x the block's quant sum),
    then acc = fma(float(isum), d_w * d_x, acc); rows8x1 and _tiles32 compute each lane the same way."""
    K = qs.shape[1]
    off = _offset32(kind)
    acc = np.float32(0.0)
    accm = np.float32(0.0)
    for b in range(K // 32):
        u, dw, mw = _codes32(kind, w, wo + b * bsize)
        isum = isum1(_dp32(kind, u, ld_i8x32(qs, m * K + 32 * b))) - np.int32(off * sums[m, b])
        acc = sfma(np.float32(isum), dw * d[m, b], acc)
        if kind == Q4_1 or kind == Q5_1:
            accm = sfma(mw, s[m, b], accm)  # the min term m * d_x * sum(q_x) (Q8_1's s), fused as llama.cpp's
    return acc + accm


@njit(inline="always", **DOT)
def _d8(kind, w, o, rb):
    """Scales d of the blocks at bytes o, o + rb, ..., o + 7 rb, as float32 lanes."""
    if kind == MXFP4:
        return ld_e8m0_rows(w, o, rb)
    return ld_f16_rows(w, o, rb)


@njit(inline="always", **DOT)
def _codes8(kind, w, o, rb):
    """_codes32 of the blocks at bytes o, o + rb, ..., o + 7 rb (the same block of 8 weight rows)."""
    return (
        _codes32(kind, w, o)[0], _codes32(kind, w, o + rb)[0],
        _codes32(kind, w, o + 2 * rb)[0], _codes32(kind, w, o + 3 * rb)[0],
        _codes32(kind, w, o + 4 * rb)[0], _codes32(kind, w, o + 5 * rb)[0],
        _codes32(kind, w, o + 6 * rb)[0], _codes32(kind, w, o + 7 * rb)[0],
    )  # fmt: skip


@njit(inline="always", **DOT)
def _dots8(kind, u, qs, xo, corr):
    """Exact integer dots of 8 blocks' unsigned codes u (from _codes8) with the quants at byte xo, minus corr,
    one per lane."""
    x = ld_i8x32(qs, xo)
    p = isum8(
        _dp32(kind, u[0], x), _dp32(kind, u[1], x), _dp32(kind, u[2], x), _dp32(kind, u[3], x),
        _dp32(kind, u[4], x), _dp32(kind, u[5], x), _dp32(kind, u[6], x), _dp32(kind, u[7], x),
    )  # fmt: skip
    return isubs(p, corr)


@njit(inline="always", **DOT)
def rows8x1(kind, bsize, w, wo, rb, m, d, s, qs, sums):
    """Weight rows at bytes wo, wo + rb, ..., wo + 7 rb . activation row m: lane r is row r, computed as row32."""
    K = qs.shape[1]
    off = _offset32(kind)
    acc, accm = fzero(), fzero()
    for b in range(K // 32):
        o = wo + b * bsize
        u = _codes8(kind, w, o, rb)
        p = _dots8(kind, u, qs, m * K + 32 * b, off * sums[m, b])
        acc = fma_v(acc, fcvt(p), fscale(_d8(kind, w, o, rb), d[m, b]))
        if kind == Q4_1 or kind == Q5_1:
            accm = fma_v(accm, ld_f16_rows(w, o + 2, rb), fbcast(s[m, b]))
    return fadd_v(acc, accm)


# ---- 32-value blocks of 8 weight rows interleaved (Q4_0, Q4_1, Q5_0, Q8_0; see ggufrun.quants.repack) ------------
# A group of 8 weight rows holds, per block of 32 values: the 8 rows' d (8 halves), for Q4_1 their m (8 halves), then 4
# chunks of 32 bytes, chunk c holding bytes 4c..4c+3 of each row's 16 nibble bytes (row r at 4r): its low nibbles are
# values 4c..4c+3, its high nibbles values 16+4c..16+4c+3. Each of the 8 code vectors then meets 4 activation quants
# broadcast to all 8 rows, so one int32 lane per weight row comes out without the transpose (isum8) that rows8x1 needs;
# on AVX2 without VNNI the 8 vpmaddubsw results are summed in int16 (8 x 2 x 15 x 127 = 30480 < 2^15: exact) and widened
# by one vpmaddwd (5-bit codes: 4 at a time). Q5_0's fifth bits sit in a 32-byte plane after d, bit j of byte i for code
# vector j's byte i, so each code vector takes 3 more operations; Q8_0's 8 chunks hold 4 code bytes per row each, met
# as dpbssd / dpbusd meet them (one vpmaddwd per chunk). Every lane is the same exact integer as rows8x1's and
# the float steps are rows8x1's, so the results are the same bits (llama.cpp's repacked ggml_gemm_q4_0_8x8_q8_0 in
# ggml-cpu/repack.cpp interleaves the same way).

Codes8 = types.UniTuple(I8x32, 8)


def _ld32_at(builder, p, at):
    """32 bytes at byte `at` of i8* p."""
    return builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, at)]), _v32i8.as_pointer()), align=1)


def _bcast4_at(builder, p, at):
    """The 4 bytes at byte `at` of i8* p in each of the 8 dwords of a 32-byte vector (vpbroadcastd)."""
    x4 = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, at)]), _i32.as_pointer()), align=1)
    return builder.bitcast(_bsplat(builder, _v8i32, x4), _v32i8)


@intrinsic
def codes_x8(typingctx, a, off):
    """The 4 chunks of 32 bytes at byte `off` -> 8 code vectors: chunk c's low nibbles, then its high nibbles."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        out = []
        for c in range(4):
            v = _ld32_at(builder, p, 32 * c)
            out.append(builder.and_(v, _splat(_v32i8, 15)))
            out.append(builder.lshr(v, _splat(_v32i8, 4)))
        return context.make_tuple(builder, sig.return_type, out)

    return Codes8(a, off), codegen


@intrinsic
def codes5_x8(typingctx, a, off):
    """Q5_0's interleaved codes at byte `off`: a 32-byte plane of fifth bits (bit j of byte i: code vector j's
    byte i), then 4 chunks of nibble bytes as codes_x8's -> 8 code vectors of 5 bits."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        # 16-bit shifts (x86 has no byte shifts): bit 4 of each byte comes from the same byte for shifts of at most 4
        plane = builder.bitcast(_ld32_at(builder, p, 0), _v16i16)
        out = []
        for c in range(4):
            v = _ld32_at(builder, p, 32 + 32 * c)
            for j, nib in (
                (2 * c, builder.and_(v, _splat(_v32i8, 15))),
                (2 * c + 1, builder.lshr(v, _splat(_v32i8, 4))),
            ):
                moved = (builder.shl(plane, _splat(_v16i16, 4 - j)) if j < 4
                         else builder.lshr(plane, _splat(_v16i16, j - 4)))  # fmt: skip
                out.append(builder.or_(nib, builder.and_(builder.bitcast(moved, _v32i8), _splat(_v32i8, 0x10))))
        return context.make_tuple(builder, sig.return_type, out)

    return Codes8(a, off), codegen


def _dot_x8(run: int):
    """dot_x8 for codes whose vpmaddubsw pairs may be summed `run` at a time in int16 (4-bit: 8, 5-bit: 4); run 0:
    codes of any byte value (IQ4's code book + 128), each dword by dpbusd (without VNNI its exact two-part form)."""

    @intrinsic
    def dot(typingctx, codes, a, off):
        if codes != Codes8 or not _is_ptr_args(a, off):
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
            acc16 = acc = None
            for j in range(8):  # code vector j: chunk c = j // 2, values 4c.. (low nibbles) or 16 + 4c.. (high)
                x = _bcast4_at(builder, p, 16 * (j % 2) + 4 * (j // 2))
                u = builder.extract_value(args[0], j)
                if HAS_AVX2 and not HAS_VNNI and run:
                    m = _pmaddubsw(builder, u, x)
                    acc16 = m if acc16 is None else builder.add(acc16, m)
                    if (j + 1) % run == 0:
                        part = _pmaddwd(builder, acc16, _splat(_v16i16, 1))
                        acc, acc16 = (part if acc is None else builder.add(acc, part)), None
                else:
                    acc = _dpbusd(builder, _splat(_v8i32, 0) if acc is None else acc, u, x, narrow=bool(run))
            return acc

        return I32x8(Codes8, a, off), codegen

    return dot


# int32 lane r = weight row r's codes (codes_x8 / codes5_x8) . the 32 activation quants at byte `off`, exactly:
# 4-bit codes sum 8 vpmaddubsw in int16 (8 x 2 x 15 x 127 = 30480), 5-bit ones 4 (4 x 2 x 31 x 127 = 31496)
dot_x8 = _dot_x8(8)
dot5_x8 = _dot_x8(4)
dotw_x8 = _dot_x8(0)  # IQ4_NL / IQ4_XS: the code book + 128 (1..241) against the quants


@intrinsic
def iq4_codes_x8(typingctx, a, off):
    """IQ4_NL / IQ4_XS's 8 code vectors of 32 values of 8 interleaved rows at byte `off` (codes_x8's 4 chunks of 32
    bytes: chunk c's low nibbles, then its high nibbles), looked up in the code book + 128 (unsigned 1..241,
    vpshufb): what iq4_codes_z16 gives one group in its 16 lanes."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        out = []
        for c in range(4):
            v = _ld32_at(builder, p, 32 * c)
            out.append(_iq4_lut(builder, builder.and_(v, _splat(_v32i8, 15)), 128))
            out.append(_iq4_lut(builder, builder.lshr(v, _splat(_v32i8, 4)), 128))
        return context.make_tuple(builder, sig.return_type, out)

    return Codes8(a, off), codegen


@intrinsic
def codes8_x8(typingctx, a, off):
    """Q8_0's interleaved codes at byte `off`: 8 chunks of 32 bytes (chunk j: values 4j..4j+3 of each row), as the
    row dots use them: signed on SIGNED_PAIRS CPUs, else + 128 (unsigned)."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        out = []
        for j in range(8):
            v = _ld32_at(builder, p, 32 * j)
            out.append(v if SIGNED_PAIRS else builder.xor(v, _splat(_v32i8, 0x80)))
        return context.make_tuple(builder, sig.return_type, out)

    return Codes8(a, off), codegen


@intrinsic
def dot8_x8(typingctx, codes, a, off):
    """dot_x8 for Q8_0's codes (codes8_x8): chunk j meets quants 4j..4j+3; signed x signed on SIGNED_PAIRS CPUs
    (dpbssd's vpsignb route), else the unsigned codes' dpbusd (the caller subtracts 128 x the quant sum)."""
    if codes != Codes8 or not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
        acc = _splat(_v8i32, 0)
        for j in range(8):
            x, u = _bcast4_at(builder, p, 4 * j), builder.extract_value(args[0], j)
            acc = _dpbssd(builder, acc, u, x) if SIGNED_PAIRS else _dpbusd(builder, acc, u, x)
        return acc

    return I32x8(Codes8, a, off), codegen


@njit(inline="always", **DOT)
def _codes32_x8(kind, w, o):
    """The code vectors of the block of 8 interleaved rows at byte o: Q8_0's bytes, Q5_0's with their fifth bits, or
    the nibble chunks after d (and Q4_1's m)."""
    if kind == Q8_0:
        return codes8_x8(w, o + 16)
    if kind == Q5_0:
        return codes5_x8(w, o + 16)
    return codes_x8(w, o + (32 if kind == Q4_1 else 16))


@njit(inline="always", **DOT)
def _dot32_x8(kind, u, qs, xo):
    """Int32 lane r: row r's codes u (_codes32_x8) . the 32 activation quants at byte xo."""
    if kind == Q8_0:
        return dot8_x8(u, qs, xo)
    if kind == Q5_0:
        return dot5_x8(u, qs, xo)
    return dot_x8(u, qs, xo)


@njit(inline="always", **DOT)
def _group_x8_one(kind, bsize, w, go, d1, s1, sums1, qs, nb, off, m):
    """_rows_x8's lanes for activation row m and the group of 8 rows at byte go: the tile loop's float steps with
    both accumulators in registers."""
    accd, accm = fzero(), fzero()
    xo, bo = m * 32 * nb, m * nb  # row m's quants (bytes) and blocks
    for b in range(nb):
        o = go + b * bsize
        p = isubs(_dot32_x8(kind, _codes32_x8(kind, w, o), qs, xo + 32 * b), off * sums1[bo + b])
        accd = fma_v(accd, fcvt(p), fscale(ld_f16x8(w, o), d1[bo + b]))
        if kind == Q4_1:
            accm = fma_v(accm, ld_f16x8(w, o + 16), fbcast(s1[bo + b]))
    return fadd_v(accd, accm)


@njit(inline="always", **DOT)
def _far(w):
    """Whether matrix w is Z16_FAR_BYTES or more: it streams from DRAM at every batched step."""
    return w.size >= Z16_FAR_BYTES


@njit(inline="always", **DOT)
def _far_prefetch(w, o, nbytes, far):
    """Where `far` (a matrix of Z16_FAR_BYTES or more, which streams from DRAM at every batched step), decode's hint
    for the nbytes DECODE_PREFETCH past byte o: the weights of the 256-bit two-row kernels (_group_x8_two,
    _rowsk_x8_two) and of the 32-value types' tile loop (X8K note, far matrices)."""
    if far:
        for pf in range(0, nbytes, 64):
            decode_prefetch(w, o + DECODE_PREFETCH + pf)


@njit(inline="always", **DOT)
def _group_x8_two(kind, bsize, w, go, d1, s1, sums1, qs, nb, off, K, far):
    """_group_x8_one for activation rows 0 and 1 at once (row 1's blocks at nb.., its quants at byte K): each
    block's codes decoded once for both, the four accumulators in registers (more rows would not fit AVX2's 16
    vector registers beside the 8 code vectors). Two rows (a one-token speculative draft, two sequences decoding
    together) ran 1.06-1.19x faster so than in the tile loop; from three rows on the tile loop was as fast. Without
    AVX-512 only: there two rows take two pairs of groups at a time (_rows_zq, Z8_MIN_ROWS). `far`: prefetch the
    weights (_far_prefetch)."""
    ad0, ad1, am0, am1 = fzero(), fzero(), fzero(), fzero()
    for b in range(nb):
        o = go + b * bsize
        _far_prefetch(w, o, bsize, far)
        u = _codes32_x8(kind, w, o)
        p0, p1 = _dot32_x8(kind, u, qs, 32 * b), _dot32_x8(kind, u, qs, K + 32 * b)
        dw = ld_f16x8(w, o)
        ad0 = fma_v(ad0, fcvt(isubs(p0, off * sums1[b])), fscale(dw, d1[b]))
        ad1 = fma_v(ad1, fcvt(isubs(p1, off * sums1[nb + b])), fscale(dw, d1[nb + b]))
        if kind == Q4_1:
            mw = ld_f16x8(w, o + 16)
            am0 = fma_v(am0, mw, fbcast(s1[b]))
            am1 = fma_v(am1, mw, fbcast(s1[nb + b]))
    return fadd_v(ad0, am0), fadd_v(ad1, am1)


@njit(inline="always", **DOT)
def _rows_x8_one(kind, bsize, w, d, s, qs, sums, out, g0, g1, stream):
    """out[:, 8 g0 : 8 g1] one activation row at a time (decode: the accumulators stay in registers; no software
    prefetch, X8K note; on AVX-512 two groups per vector, prefetched: _group_x8_z16_one, unless `stream`: DECODE_STREAM
    below): each row gets the bits _rows_x8's tiles give it. The one-row launchers (dot_*_x8_one) hold
    only this, which compiles in a third of the tiles' time: a first run's first token waits for these alone, the
    tiles compile in the background (ggufrun.runtime.compile_kernels)."""
    d1, s1, sums1 = d.reshape(-1), s.reshape(-1), sums.reshape(-1)
    for m in range(qs.shape[0]):  # a work item's groups (a few KB) stay in L1 for the rows after the first
        _row_x8(kind, bsize, w, 0, d1, s1, sums1, qs, m, out, m, g0, g1, stream)


@njit(inline="always", **DOT)
def _row_x8(kind, bsize, w, wg, d1, s1, sums1, qs, m, out, o, g0, g1, stream):
    """out[o, 8 g0 : 8 g1] = activation row m times groups wg + g0 .. wg + g1 - 1 of w (one row of _rows_x8_one; an
    expert's rows of a stack of experts for _experts_x8). On AVX-512 two groups per vector, an odd last group as a
    vector of itself twice (_row_k_x8); with `stream`, one group at a time (DECODE_STREAM), except IQ4_NL, whose
    one-group code is _row_iq4_nl_x8's."""
    rb, N = w.shape[1], out.shape[1]
    nb = qs.shape[1] // 32
    off = _offset32(kind)
    if HAS_ZMM and not stream:
        for g in range(g0, g1, 2):
            gb = min(g + 1, g1 - 1)
            v = _group_x8_z16_one(kind, bsize, w, (wg + g) * rb, (wg + gb) * rb, d1, s1, sums1, qs, nb, off, m)
            if gb > g:
                st_z(out, 4 * (o * N + 8 * g), v)
            else:
                st_lo_f32x8(out, 4 * (o * N + 8 * g), v)
        return
    for g in range(g0, g1):
        v = _group_x8_one(kind, bsize, w, (wg + g) * rb, d1, s1, sums1, qs, nb, off, m)
        st_f32x8(out, 4 * (o * N + 8 * g), v)


@njit(inline="always", **DOT)
def _rows_x8(kind, bsize, w, d, s, qs, sums, out, g0, g1):
    """out[:, 8 g0 : 8 g1] for groups g0..g1-1 of 8 interleaved weight rows (Q4_0, Q4_1, Q5_0, Q8_0): each
    block of a group is decoded once for a tile of activation rows (all of them for decode), whose accumulators wait
    in L1; lane r of a tile row is rows8x1's lane r (without AVX-512). On AVX-512: with AMX, from AMX_MIN_ROWS rows
    on, the tile unit (_rows_amx); without AMX, from VNNI_MIN_ROWS_32 rows on, the VNNI tiles (_rows_vnni, the
    launcher passing the quants + 128 as qs but for Q4_1); below those, from Z8_MIN_ROWS (2) rows on, two pairs of
    groups at a time on decode's code vectors (_rows_zq, the activations as they are), Q8_0 with AMX at
    AMX_Q8_0_MIN_ROWS to AMX_Q8_0_ROWS rows on the tiles instead (_rows_amx_q8_0, the same arrays); on a CPU with AMX
    whose tiles are off, _rows_zq above AMX_MIN_ROWS too (the AMX tiles' arrays: _amx_given_32)."""
    if _vnni_given(out, qs, kind):
        _rows_vnni(kind, bsize, w, d, s, qs, out, g0, g1)
        return
    if _amx_given_32(out, qs, kind):
        _rows_amx(kind, bsize, w, d, s, qs, sums, out, g0, g1)
        return
    if _z8_given(out, qs, kind):
        if kind == Q8_0 and _amx_q8_0_tiles(out.shape[0]):
            _rows_amx_q8_0(w, d, qs, out, g0, g1)
        else:
            _rows_zq(kind, bsize, w, d, s, qs, sums, out, g0, g1)
        return
    rb = w.shape[1]
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    if M == 1:
        _rows_x8_one(kind, bsize, w, d, s, qs, sums, out, g0, g1, False)
        return
    nb = K // 32
    MT = _m_tile(K)
    far = _far(w)  # its first tile of rows prefetches (X8K note, far matrices)
    off = _offset32(kind)
    # per tile row: the 8 lanes of d terms, then the 8 of m terms (Q4_1)
    acc = carray(x8_acc_scratch(), (X8_STACK_ROWS, 16)) if M <= X8_STACK_ROWS else _empty64_rows(MT, 16, np.float32)
    d1, s1, sums1 = d.reshape(-1), s.reshape(-1), sums.reshape(-1)  # flat: the row loop steps one index
    if M == 2:
        for g in range(g0, g1):
            r0, r1 = _group_x8_two(kind, bsize, w, g * rb, d1, s1, sums1, qs, nb, off, K, far)
            st_f32x8(out, 4 * 8 * g, r0)
            st_f32x8(out, 4 * (N + 8 * g), r1)
        return
    for t in range(0, M, MT):
        t1 = min(M, t + MT)
        for g in range(g0, g1):
            for a in range(0, 64 * (t1 - t), 32):
                st_f32x8(acc, a, fzero())
            for b in range(nb):
                o = g * rb + b * bsize
                _far_prefetch(w, o, bsize, far and t == 0)
                u = _codes32_x8(kind, w, o)
                dw = ld_f16x8(w, o)
                mw = ld_f16x8(w, o + 16) if kind == Q4_1 else fzero()
                i, xo = t * nb + b, t * K + 32 * b
                for a in range(0, 64 * (t1 - t), 64):
                    iu = np.uint64(i)  # an unsigned index: no negative-index wraparound per row and array
                    p = isubs(_dot32_x8(kind, u, qs, xo), off * sums1[iu])
                    st_f32x8(acc, a, fma_v(ld_f32x8(acc, a), fcvt(p), fscale(dw, d1[iu])))
                    if kind == Q4_1:
                        st_f32x8(acc, a + 32, fma_v(ld_f32x8(acc, a + 32), mw, fbcast(s1[iu])))
                    i += nb
                    xo += K
            for m in range(t, t1):
                a = 64 * (m - t)
                st_f32x8(out, 4 * (m * N + 8 * g), fadd_v(ld_f32x8(acc, a), ld_f32x8(acc, a + 32)))


# ---- K-quants and IQ4_XS: 256-value super-blocks of 8 groups of 32 values, each group with two integer scales
# (values 0-15, 16-31) -----------------------------------------------------------------------------------------


@njit(**DOT)
def _scales_k(kind, w, o):
    """The super-block's integer scales as two int32 vectors: Q4_K, Q5_K: the 8 per-32-value scales as 16-bit lanes
    in both 128-bit halves (k4_scales16) and the 8 mins; Q6_K: the 16 per-16-value scales as 16-bit lanes, 0-7 in
    the first and 8-15 in the second, both halves each (k6_scales16); IQ4_XS: 8 per-32-value scales in the first;
    Q2_K, Q3_K: 16 per-16-value scales across both."""
    if kind == Q4_K or kind == Q5_K:
        return k4_scales16(w, o + 4)
    if kind == Q6_K:
        return k6_scales16(w, o + 192)
    if kind == Q3_K:
        return k3_unpack(w, o + 96)
    if kind == Q2_K:  # low nibbles of the 16 scale bytes
        return iand(ld_u8x8(w, o), 15), iand(ld_u8x8(w, o + 8), 15)
    a = xs_unpack(w, o + 2)  # IQ4_XS
    return a, a


@njit(**DOT)
def _group_k(kind, w, o, g, sc0, sc1):
    """Group g (values 32g..32g+31) of the super-block at byte o -> (codes, scales in dpbusd lanes).

    Codes are unsigned for Q2_K, Q4_K, Q5_K and Q6_K (Q6_K's offset 32 comes off with _koffset), signed for
    Q3_K and IQ4_XS (_signed_k). Lanes 0-3 of a group's dpbusd cover values 0-15, lanes 4-7 values 16-31; the
    scale vector matches (Q4_K, Q5_K, Q6_K: twice per lane, for imadd_pair).
    Written without branches on g, so it is cheap whether or not LLVM unrolls the loop over g.
    """
    if kind == Q4_K:  # low (g even) or high nibbles of qs[32*(g//2):]
        return field(ld_i8x32(w, o + 16 + 32 * (g // 2)), 4 * (g % 2), 15, 0), ibcast16(sc0, g)
    if kind == Q5_K:  # Q4_K's nibbles plus bit g of qh[l] as bit 4
        low = field(ld_i8x32(w, o + 48 + 32 * (g // 2)), 4 * (g % 2), 15, 0)
        return vor(low, bit_to(ld_i8x32(w, o + 16), g, 16)), ibcast16(sc0, g)
    if kind == Q6_K:  # half h = g//4, k = g%4: nibble k//2 of ql[64h + 32(k%2):], bits 2k of qh[32h:]
        low = field(ld_i8x32(w, o + 64 * (g // 4) + 32 * (g % 2)), 4 * ((g % 4) // 2), 15, 0)
        q = vor(low, field(ld_i8x32(w, o + 128 + 32 * (g // 4)), 2 * (g % 4), 3, 4))
        return q, ipair16(sc0 if g < 4 else sc1, g % 4)
    if kind == Q3_K:  # bits 2(g%4) of qs[32*(g//4):], minus 4 unless bit g of hmask[l] is set
        q = vor(field(ld_i8x32(w, o + 32 + 32 * (g // 4)), 2 * (g % 4), 3, 0), bit_to(ld_i8x32(w, o), g, 4))
        return isub(q, 4), ipair(sc0 if g < 4 else sc1, g % 4)
    if kind == Q2_K:  # bits 2(g%4) of qs[32*(g//4):]
        return field(ld_i8x32(w, o + 16 + 32 * (g // 4)), 2 * (g % 4), 3, 0), ipair(sc0 if g < 4 else sc1, g % 4)
    return iq4_lut(ld_nib(w, o + 8 + 16 * g)), ibcast(sc0, g)  # IQ4_XS: 16 bytes of nibbles per group at qs[16g:]


@njit(inline="always", **DOT)
def _d_off(kind):
    """Byte offset of the super-block scale d (fp16)."""
    if kind == Q6_K:
        return 208
    if kind == Q3_K:
        return 108
    if kind == Q2_K:
        return 80
    return 0


@njit(inline="always", **DOT)
def _has_min(kind):
    """Whether the type has per-sub-block mins (subtracted as dmin * sum of min * activation quant sums)."""
    return kind == Q4_K or kind == Q5_K or kind == Q2_K


@njit(inline="always", **DOT)
def _dmin_off(kind):
    """Byte offset of the super-block min scale dmin (fp16), for the types with mins."""
    if kind == Q2_K:
        return 82
    return 2


@njit(inline="always", **DOT)
def _signed_k(kind):
    """Whether the group codes carry an offset that stays in them (then they are signed and meet the x + 128
    quants): Q3_K, IQ4_XS. Q6_K's codes go unsigned (0..63) and the offset comes off through bsums (_koffset)."""
    return kind == Q3_K or kind == IQ4_XS


@njit(inline="always", **DOT)
def _pair16(kind):
    """Whether _group_k's scales are already twice per int32 lane (imadd_pair)."""
    return kind == Q4_K or kind == Q5_K or kind == Q6_K


@njit(inline="always", **DOT)
def _corr_sc(kind, c, sc):
    """corr128's correction c times the scales sc, for _gstep's narrow signed codes (Q3_K); else zeros."""
    if kind == Q3_K:
        return imadd16(izero(), c, sc)
    return izero()


@njit(inline="always", **DOT)
def _gstep(kind, acc, wq, c, csc, qu, qs, xo, sc):
    """acc + (int32 lanes of one group's codes wq . the activation quants at byte xo) * its scales sc (_sc16).

    IQ4_XS: code book values up to 127 against quants + 128 up to 255, dpbusd seeded with c = corr128(wq), then
    a 32-bit multiply by the scales. Q3_K: codes within +-4 against quants + 128; Q2_K / Q4_K / Q5_K / Q6_K: codes
    >= 0 of at most 6 bits against the quants as they are. Both narrow: every pair stays in int16, so the scale
    folds into the dot (imadd_small, imadd_pair), Q3_K's correction coming in as csc = _corr_sc(kind, c, sc),
    computed once per group for all activation rows. A group's scaled lanes stay far inside int32."""
    if kind == IQ4_XS:
        return imadd_v(acc, dpbusd(c, ld_i8x32(qu, xo), wq), sc)
    if _signed_k(kind):
        return imadd_small(iadd(acc, csc), ld_i8x32(qu, xo), wq, sc)
    if _pair16(kind):
        return imadd_pair(acc, wq, ld_i8x32(qs, xo), sc)
    return imadd_small(acc, wq, ld_i8x32(qs, xo), sc)


@njit(inline="always", **DOT)
def _sc16(kind, sc):
    """Sub-block scales for _gstep: the low 16 bits only (IQ4_XS, and Q4_K / Q5_K / Q6_K's pairs: as they are)."""
    if kind == IQ4_XS or _pair16(kind):
        return sc
    return iand(sc, 0xFFFF)


@njit(inline="always", **DOT)
def _koffset(kind, i, w, o, m, b, bsums16):
    """Q6_K: the super-block's lanes i with the codes' offset 32 taken off, i - 32 * sum over the 16 sub-blocks of
    scale * (sum of the activation quants in it), as llama.cpp's q8s term in ggml_vec_dot_q6_K_q8_K; i otherwise.
    The bsums (|.| <= 2032) meet the int8 scales in one vpmaddwd each (imadd16)."""
    if kind == Q6_K:
        bo = 4 * (m * bsums16.shape[1] + 16 * b)
        c = imadd16(izero(), ld_i8x8(w, o + 192), iand(ld_i32x8(bsums16, bo), 0xFFFF))
        c = imadd16(c, ld_i8x8(w, o + 200), iand(ld_i32x8(bsums16, bo + 32), 0xFFFF))
        return iaddmul(i, c, -32)
    return i


@njit(inline="always", **DOT)
def _kmin(kind, w, o, sc1, m, b, bsums16, bsums32):
    """Int32 lanes of sum over sub-blocks of min * (sum of the activation quants in it), activation row m, for the
    types with mins (_has_min): Q4_K / Q5_K's 8 mins (sc1 of _scales_k) against bsums32, Q2_K's 16 against bsums16;
    each one vpmaddwd (imadd16: sums of at most 32 quants fit int16, the mins' high halves are 0)."""
    if kind == Q4_K or kind == Q5_K:
        return imadd16(izero(), ld_i32x8(bsums32, 4 * (m * bsums32.shape[1] + 8 * b)), sc1)
    if kind == Q2_K:
        bo = 4 * (m * bsums16.shape[1] + 16 * b)
        c = imadd16(izero(), ld_i32x8(bsums16, bo), ishr(ld_u8x8(w, o), 4))
        return imadd16(c, ld_i32x8(bsums16, bo + 32), ishr(ld_u8x8(w, o + 8), 4))
    return izero()


@njit(inline="always", **DOT)
def _kdot(kind, w, o, qu, qs, xo):
    """(Int32 lanes of the super-block at byte o . the activation quants at byte xo, scales applied, before
    _koffset; sc1 of _scales_k, for _kmin)."""
    sc0, sc1 = _scales_k(kind, w, o)
    i = izero()
    for g in range(8):
        wq, sc = _group_k(kind, w, o, g, sc0, sc1)
        c = corr128(wq) if _signed_k(kind) else izero()
        sc = _sc16(kind, sc)
        i = _gstep(kind, i, wq, c, _corr_sc(kind, c, sc), qu, qs, xo + 32 * g, sc)
    return i, sc1


@njit(inline="always", **DOT)
def rowk(kind, bsize, w, wo, qu, m, d, bsums16, bsums32, qs):
    """Weight row at byte wo . activation row m, for a 256-value super-block type of `bsize` bytes.

    Per super-block b, with the exact integer sums S (codes . quants times scales) and, for the types with mins,
    Mn (mins . quant sums): acc = fma(float(S), d_w * d_x, acc), accm = fma(float(Mn), dmin * -d_x, accm); the
    result is acc + accm (llama.cpp's ggml_vec_dot_q4_K_q8_K keeps the min term in its own accumulator too).
    rowk8 and rowkx4 take the same steps per row."""
    K = qs.shape[1]
    acc = fzero()  # lane 0: acc, lane 4: accm
    for b in range(K // 256):
        o = wo + b * bsize
        i, sc1 = _kdot(kind, w, o, qu, qs, m * K + 256 * b)
        i = _koffset(kind, i, w, o, m, b, bsums16)
        mn = _kmin(kind, w, o, sc1, m, b, bsums16, bsums32)
        dw = ld_f16(w, o + _d_off(kind))
        dmin = ld_f16(w, o + _dmin_off(kind)) if _has_min(kind) else np.float32(0.0)
        zero = np.float32(0.0)
        acc = fma_v(
            acc, fcvt(isum2(i, mn)), f32x8_of(dw * d[m, b], zero, zero, zero, dmin * -d[m, b], zero, zero, zero)
        )
    return flane(acc, 0) + flane(acc, 4)


@njit(inline="always", **DOT)
def _stream_ahead(x, rb):
    """Where rowk8 prefetches for byte x of a row: ROW_PREFETCH_BYTES further along the row's stream (the row, then
    the row 8 below it, and so on), as a byte offset from the row's start."""
    t, skip = x + ROW_PREFETCH_BYTES, 0
    while t >= rb:
        t, skip = t - rb, skip + 8 * rb
    return skip + t


@njit(inline="always", **DOT)
def rowk8(kind, bsize, w, wo, rb, qu, m, d, bsums16, bsums32, qs, lanes):
    """Weight rows at bytes wo, wo + rb, ..., wo + 7 rb . activation row m: lane r is row r, computed as rowk, the
    8 rows' integer sums folded into one vector (isum8) so that the float steps are one vector operation each.
    `lanes`: int32 scratch [16, 8] for the rows' integer lanes (one row at a time keeps the registers free)."""
    K = qs.shape[1]
    acc, accm = fzero(), fzero()
    for b in range(K // 256):
        o = wo + b * bsize
        p0 = _stream_ahead(b * bsize, rb)  # row r's stream, continued in rows r + 8, r + 16, ... past its end
        p1 = _stream_ahead(b * bsize + 64, rb)
        p2 = _stream_ahead(b * bsize + 128, rb)
        p3 = _stream_ahead(b * bsize + 192, rb)
        for r in range(8):
            prefetch(w, wo + r * rb + p0)
            prefetch(w, wo + r * rb + p1)
            prefetch(w, wo + r * rb + p2)
            if bsize > 192:
                prefetch(w, wo + r * rb + p3)
            i, sc1 = _kdot(kind, w, o + r * rb, qu, qs, opaque(m * K + 256 * b))
            st_i32x8(lanes, 32 * r, _koffset(kind, i, w, o + r * rb, m, b, bsums16))
            st_i32x8(lanes, 32 * (8 + r), _kmin(kind, w, o + r * rb, sc1, m, b, bsums16, bsums32))
        p = isum8(
            ld_i32x8(lanes, 0), ld_i32x8(lanes, 32), ld_i32x8(lanes, 64), ld_i32x8(lanes, 96),
            ld_i32x8(lanes, 128), ld_i32x8(lanes, 160), ld_i32x8(lanes, 192), ld_i32x8(lanes, 224),
        )  # fmt: skip
        acc = fma_v(acc, fcvt(p), fscale(ld_f16_rows(w, o + _d_off(kind), rb), d[m, b]))
        if _has_min(kind):
            mn = isum8(
                ld_i32x8(lanes, 256), ld_i32x8(lanes, 288), ld_i32x8(lanes, 320), ld_i32x8(lanes, 352),
                ld_i32x8(lanes, 384), ld_i32x8(lanes, 416), ld_i32x8(lanes, 448), ld_i32x8(lanes, 480),
            )  # fmt: skip
            accm = fma_v(accm, fcvt(mn), fscale(ld_f16_rows(w, o + _dmin_off(kind), rb), -d[m, b]))
    return fadd_v(acc, accm)


@njit(inline="always", **DOT)
def rowkx4(kind, bsize, w, wo, qu, m, d, bsums16, bsums32, qs):
    """rowk for activation rows m .. m+3, decoding each weight group once. Per super-block the 4 rows' S and Mn are
    folded into one vector (isum8: lanes 0-3 S, lanes 4-7 Mn), so that rowk's acc and accm of the 4 rows are the
    lanes of one accumulator and their float steps one vector fma."""
    K = qs.shape[1]
    acc = fzero()
    for b in range(K // 256):
        o = wo + b * bsize
        i0, i1, i2, i3 = izero(), izero(), izero(), izero()
        sc0, sc1 = _scales_k(kind, w, o)
        for g in range(8):
            wq, sc = _group_k(kind, w, o, g, sc0, sc1)
            c = corr128(wq) if _signed_k(kind) else izero()
            sc = _sc16(kind, sc)
            csc = _corr_sc(kind, c, sc)
            xo = m * K + 256 * b + 32 * g
            i0 = _gstep(kind, i0, wq, c, csc, qu, qs, xo, sc)
            i1 = _gstep(kind, i1, wq, c, csc, qu, qs, xo + K, sc)
            i2 = _gstep(kind, i2, wq, c, csc, qu, qs, xo + 2 * K, sc)
            i3 = _gstep(kind, i3, wq, c, csc, qu, qs, xo + 3 * K, sc)
        p = isum8(
            _koffset(kind, i0, w, o, m, b, bsums16), _koffset(kind, i1, w, o, m + 1, b, bsums16),
            _koffset(kind, i2, w, o, m + 2, b, bsums16), _koffset(kind, i3, w, o, m + 3, b, bsums16),
            _kmin(kind, w, o, sc1, m, b, bsums16, bsums32), _kmin(kind, w, o, sc1, m + 1, b, bsums16, bsums32),
            _kmin(kind, w, o, sc1, m + 2, b, bsums16, bsums32), _kmin(kind, w, o, sc1, m + 3, b, bsums16, bsums32),
        )  # fmt: skip
        dw = ld_f16(w, o + _d_off(kind))
        dmin = ld_f16(w, o + _dmin_off(kind)) if _has_min(kind) else np.float32(0.0)
        d0, d1, d2, d3 = d[m, b], d[m + 1, b], d[m + 2, b], d[m + 3, b]
        sx = f32x8_of(dw * d0, dw * d1, dw * d2, dw * d3, dmin * -d0, dmin * -d1, dmin * -d2, dmin * -d3)
        acc = fma_v(acc, fcvt(p), sx)
    return (
        flane(acc, 0) + flane(acc, 4), flane(acc, 1) + flane(acc, 5),
        flane(acc, 2) + flane(acc, 6), flane(acc, 3) + flane(acc, 7),
    )  # fmt: skip


# ---- Q4_K, Q5_K and Q6_K with 8 weight rows interleaved (ggufrun.quants.repack): per super-block, the 8 rows' d (and
# Q4_K's dmin), their integer scales as bytes in pairs of sub-blocks ([pair][row][2]: Q4_K's 8 scales and 8 mins
# unpacked from their 6 bits, Q6_K's 16 int8 scales), then chunks of 32 bytes holding 4 code bytes of each row
# (row r at bytes 4r..4r+3). A chunk's codes meet 4 activation quants broadcast to the 8 rows (as dot_x8's), their
# int16 pair sums are summed a few chunks at a time (Q4_K: 4 x 2 x 15 x 128, Q6_K: 2 x 2 x 63 x 128, both < 2^15),
# then one vpmaddwd with the sub-block's scale twice per row lane gives the scaled int32 lane of each row. The
# integers S (codes . quants x scales, Q6_K's offset 32 taken off through bsums16) and Mn (Q4_K's mins . bsums32)
# are rowk's exactly, and the float steps are rowk's, so every output is the same bits as on the file layout.
# -----------------------------------------------------------------------------------------------------------------


def _maddubs(builder, u, s):
    """int16 lanes u[2k] s[2k] + u[2k+1] s[2k+1] (u unsigned, s signed bytes), for pairs within int16."""
    if HAS_AVX2:
        return _pmaddubsw(builder, u, s)
    v = ir.VectorType(_i16, 32)
    p = builder.mul(builder.zext(u, v), builder.sext(s, v))
    even, odd = (ir.Constant(ir.VectorType(_i32, 16), list(range(k, 32, 2))) for k in (0, 1))
    return builder.add(builder.shuffle_vector(p, p, even), builder.shuffle_vector(p, p, odd))


def _maddwd(builder, a, b):
    """int32 lanes a[2k] b[2k] + a[2k+1] b[2k+1] of int16 vectors (vpmaddwd)."""
    if HAS_AVX2:
        return _pmaddwd(builder, a, b)
    v = ir.VectorType(_i32, 16)
    p = builder.mul(builder.sext(a, v), builder.sext(b, v))
    even, odd = (ir.Constant(_v8i32, list(range(k, 16, 2))) for k in (0, 1))
    return builder.add(builder.shuffle_vector(p, p, even), builder.shuffle_vector(p, p, odd))


def _scale_pair_pick(builder, v, e: int, signed: bool):
    """v: 16 bytes of scale pairs ([row][2]) -> element e of each row's pair twice in its int32 lane, as int16s
    (sign- or zero-extended): the scales vpmaddwd wants."""
    x = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 16), [2 * (i // 2) + e for i in range(16)]))
    return builder.sext(x, _v16i16) if signed else builder.zext(x, _v16i16)


def _kscales_x8(signed: bool):
    """Intrinsic (a, off, e) -> element e (0 or 1) of the 8 rows' scale pairs at byte `off` (_scale_pair_pick)."""

    @intrinsic
    def scales(typingctx, a, off, e):
        if not _is_ptr_args(a, off) or not isinstance(e, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
            pick = [_scale_pair_pick(builder, v, k, signed) for k in (0, 1)]
            odd = builder.icmp_signed("!=", _int_arg(context, builder, sig.args[2], args[2]), ir.Constant(_i32, 0))
            return builder.bitcast(builder.select(odd, pick[1], pick[0]), _v8i32)

        return I32x8(a, off, e), codegen

    return scales


ksc_x8 = _kscales_x8(False)  # Q4_K's 6-bit scales
ksc6_x8 = _kscales_x8(True)  # Q6_K's int8 scales


@intrinsic
def kscw_x8(typingctx, a, off, e):
    """Element e (0 or 1) of the 8 rows' signed scale pairs at byte `off`, as int32 lanes (for vpmulld): IQ4_XS's
    scales minus 32, as kscw_z16 gives one group."""
    if not _is_ptr_args(a, off) or not isinstance(e, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
        pick = [builder.sext(builder.shuffle_vector(v, v, ir.Constant(_v8i32, [2 * i + k for i in range(8)])), _v8i32)
                for k in (0, 1)]  # fmt: skip
        odd = builder.icmp_signed("!=", _int_arg(context, builder, sig.args[2], args[2]), ir.Constant(_i32, 0))
        return builder.select(odd, pick[1], pick[0])

    return I32x8(a, off, e), codegen


@intrinsic
def imuladd(typingctx, acc, s, sc):
    """acc + s * sc, 8 int32 lanes (vpmulld)."""
    if acc != I32x8 or s != I32x8 or sc != I32x8:
        return None

    def codegen(context, builder, sig, args):
        return builder.add(args[0], builder.mul(args[1], args[2]))

    return I32x8(I32x8, I32x8, I32x8), codegen


def _kpairs_x8(signed: bool):
    """Intrinsic (a, off, bs, bo) -> int32 lane r: row r's byte pair at byte `off` ([row][2] bytes, sign- or
    zero-extended) . the two int32 of bs at byte `bo` (activation quant sums, within int16): one vpmaddwd."""

    @intrinsic
    def pairs(typingctx, a, off, bs, bo):
        if not _is_ptr_args(a, off) or not _is_ptr_args(bs, bo):
            return None

        def codegen(context, builder, sig, args):
            v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
            v = builder.sext(v, _v16i16) if signed else builder.zext(v, _v16i16)
            two = builder.load(_ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3],
                                    ir.VectorType(_i32, 2)), align=1)  # fmt: skip
            two = builder.bitcast(builder.trunc(two, ir.VectorType(_i16, 2)), _i32)
            return _maddwd(builder, v, builder.bitcast(_bsplat(builder, _v8i32, two), _v16i16))

        return I32x8(a, off, bs, bo), codegen

    return pairs


kmin_x8 = _kpairs_x8(False)  # Q4_K: a pair of sub-blocks' mins . their bsums32
koff6_x8 = _kpairs_x8(True)  # Q6_K: a pair of 16-value groups' scales . their bsums16


@intrinsic
def codes6_x8(typingctx, a, ql, qh, kp):
    """Q6_K's interleaved codes: the 4 chunks of low-bit bytes at byte `ql` and the 4 chunks of high-bit bytes at
    byte `qh` -> 8 code vectors of 6 bits: [2c] = ql_c & 15 | bits 2kp, 2kp + 1 of qh_c as bits 4, 5; [2c + 1] =
    ql_c >> 4 | bits 2kp + 4, 2kp + 5 of qh_c as bits 4, 5 (16-bit shifts of at most 4: the bits kept come from
    the same byte)."""
    if not _is_ptr_args(a, ql) or not isinstance(qh, types.Integer) or not isinstance(kp, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], types.intp, context.get_constant(types.intp, 0), _i8)
        pl = builder.gep(base, [context.cast(builder, args[1], sig.args[1], types.intp)])
        ph = builder.gep(base, [context.cast(builder, args[2], sig.args[2], types.intp)])
        k2 = builder.trunc(builder.shl(_int_arg(context, builder, sig.args[3], args[3]), ir.Constant(_i32, 1)), _i16)
        up = _bsplat(builder, _v16i16, builder.sub(ir.Constant(_i16, 4), k2))
        down = _bsplat(builder, _v16i16, k2)
        m15, m48 = _splat(_v32i8, 15), _splat(_v32i8, 0x30)
        out = []
        for c in range(4):
            lo = _ld32_at(builder, pl, 32 * c)
            hi16 = builder.bitcast(_ld32_at(builder, ph, 32 * c), _v16i16)
            up_bits = builder.and_(builder.bitcast(builder.shl(hi16, up), _v32i8), m48)
            down_bits = builder.and_(builder.bitcast(builder.lshr(hi16, down), _v32i8), m48)
            high4 = builder.and_(
                builder.bitcast(builder.lshr(builder.bitcast(lo, _v16i16), _splat(_v16i16, 4)), _v32i8), m15
            )
            out.append(builder.or_(builder.and_(lo, m15), up_bits))
            out.append(builder.or_(high4, down_bits))
        return context.make_tuple(builder, sig.return_type, out)

    return Codes8(a, ql, qh, kp), codegen


def _dot_k_x8(run: int, hi_at: int):
    """Intrinsic (codes, a, off, sclo, schi) -> int32 lane r = row r's codes . the quants at byte `off`, scaled:
    code vector 2c meets quants off + 4c (scales sclo), 2c + 1 quants off + hi_at + 4c (schi); vpmaddubsw pairs
    summed `run` at a time in int16, then one vpmaddwd with the scales (ksc_x8 / ksc6_x8)."""

    @intrinsic
    def dot(typingctx, codes, a, off, sclo, schi):
        if codes != Codes8 or not _is_ptr_args(a, off) or sclo != I32x8 or schi != I32x8:
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
            acc = None
            for part in (0, 1):
                sc = builder.bitcast(args[3 + part], _v16i16)
                s16 = None
                for c in range(4):
                    m = _maddubs(builder, builder.extract_value(args[0], 2 * c + part),
                                 _bcast4_at(builder, p, hi_at * part + 4 * c))  # fmt: skip
                    s16 = m if s16 is None else builder.add(s16, m)
                    if (c + 1) % run == 0:
                        x = _maddwd(builder, s16, sc)
                        acc, s16 = (x if acc is None else builder.add(acc, x)), None
            return acc

        return I32x8(Codes8, a, off, I32x8, I32x8), codegen

    return dot


@intrinsic
def sb6_x8(typingctx, a, off, x, xo):
    """Q6_K, one activation row: int32 lane r = row r's codes . the quants at byte xo of x, scaled (before the offset
    32), for the super-block of 8 interleaved rows at byte `off` (_sbk_x8). Per chunk c of a half, its two ql chunks
    and its qh chunk give the 4 code vectors of values 32k + 4c.. (k = 0..3), each summed with the next chunk's in
    int16, then one vpmaddwd with its 16-value group's scales. All shifts are constants, and every byte is loaded
    once (codes6_x8, for the tiles, loads qh once per ql run)."""
    if not _is_ptr_args(a, off) or not _is_ptr_args(x, xo):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
        q = _ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3], _i8)
        m15, m48 = _splat(_v32i8, 15), _splat(_v32i8, 0x30)

        def sh(v, by):  # 16-bit lane shift of bytes (left for by > 0); the bits kept come from the same byte
            v16 = builder.bitcast(v, _v16i16)
            v16 = builder.shl(v16, _splat(_v16i16, by)) if by > 0 else builder.lshr(v16, _splat(_v16i16, -by))
            return builder.bitcast(v16, _v32i8)

        acc = None
        for h in range(2):
            co = 144 + 768 * h
            for half in range(2):
                sc = []
                for k in range(4):  # pair 4h + k: groups 8h + 2k (element 0) and 8h + 2k + 1 (element 1)
                    v = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, 16 + 16 * (4 * h + k))]),
                                                     ir.VectorType(_i8, 16).as_pointer()), align=1)  # fmt: skip
                    sc.append(_scale_pair_pick(builder, v, half, True))
                s16 = [None] * 4
                for cc in range(4):
                    c = 4 * half + cc
                    ql0, ql1 = _ld32_at(builder, p, co + 32 * c), _ld32_at(builder, p, co + 256 + 32 * c)
                    qh = _ld32_at(builder, p, co + 512 + 32 * c)
                    codes = (
                        builder.or_(builder.and_(ql0, m15), builder.and_(sh(qh, 4), m48)),
                        builder.or_(builder.and_(ql1, m15), builder.and_(sh(qh, 2), m48)),
                        builder.or_(builder.and_(sh(ql0, -4), m15), builder.and_(qh, m48)),
                        builder.or_(builder.and_(sh(ql1, -4), m15), builder.and_(sh(qh, -2), m48)),
                    )
                    for k in range(4):
                        m = _maddubs(builder, codes[k], _bcast4_at(builder, q, 128 * h + 32 * k + 4 * c))
                        s16[k] = m if s16[k] is None else builder.add(s16[k], m)
                        if cc % 2 == 1:  # 2 x 2 x 63 x 128 < 2^15
                            y = _maddwd(builder, s16[k], sc[k])
                            acc, s16[k] = (y if acc is None else builder.add(acc, y)), None
        return acc

    return I32x8(a, off, x, xo), codegen


dot4k_x8 = _dot_k_x8(4, 32)  # Q4_K: low nibbles values 4c.., high nibbles 32 + 4c.. of a 64-value group
dot6k_x8 = _dot_k_x8(2, 64)  # Q6_K: ql's low nibbles values 4c.., high nibbles 64 + 4c.. of a 128-value half

Q4_K_X8_BYTES, Q5_K_X8_BYTES, Q6_K_X8_BYTES = 1184, 1440, 1680  # one super-block of 8 interleaved rows (repack)
IQ4_XS_X8_BYTES = 1104  # d, scale pairs, code chunks: AVX-512 only (_pair_tiles)


@njit(inline="always", **DOT)
def _kx8_bytes(kind):
    """Bytes of one super-block of 8 interleaved rows of an interleaved K-quant layout."""
    if kind == Q4_K:
        return Q4_K_X8_BYTES
    if kind == Q5_K:
        return Q5_K_X8_BYTES
    if kind == IQ4_XS:
        return IQ4_XS_X8_BYTES
    return Q6_K_X8_BYTES


@njit(inline="always", **DOT)
def _kx8_codes(kind, w, o, jj, half):
    """Q4_K / Q5_K: the 8 code vectors of half `half` of 64-value group jj of the super-block at byte o (Q5_K's
    with their fifth bits from the plane before the chunks, as Q5_0's: codes5_x8)."""
    if kind == Q5_K:
        return codes5_x8(w, o + 160 + 320 * jj + 160 * half)
    return codes_x8(w, o + 160 + 256 * jj + 128 * half)


@njit(inline="always", **DOT)
def _sbk_x8(kind, w, o, qs, xo):
    """Int32 lane r: row r's codes . the activation quants at byte xo, scaled, of the super-block of 8 interleaved
    rows at byte o (before Q6_K's offset): _rowsk_x8's integer part for one activation row, in registers."""
    s = izero()
    if kind == Q4_K or kind == Q5_K:
        for jj in range(4):
            sclo, schi = ksc_x8(w, o + 32 + 16 * jj, 0), ksc_x8(w, o + 32 + 16 * jj, 1)
            for half in range(2):
                u = _kx8_codes(kind, w, o, jj, half)
                s = iadd(s, dot4k_x8(u, qs, xo + 64 * jj + 16 * half, sclo, schi))
    else:
        s = sb6_x8(w, o, qs, xo)
    return s


@njit(inline="always", **DOT)
def _sbk_tile_x8(kind, w, o, qs, xo, K, rows, isc):
    """_sbk_x8 for `rows` activation rows at bytes xo, xo + K, ... into isc[:rows] (int32 [rows, 8], in L1): each
    code vector decoded once for all of them."""
    for a in range(0, 32 * rows, 32):
        st_i32x8(isc, a, izero())
    if kind == Q4_K or kind == Q5_K:
        for jj in range(4):  # 64-value group jj: sub-blocks 2jj (low nibbles), 2jj + 1 (high)
            sclo, schi = ksc_x8(w, o + 32 + 16 * jj, 0), ksc_x8(w, o + 32 + 16 * jj, 1)
            for half in range(2):
                u = _kx8_codes(kind, w, o, jj, half)
                x = xo + 64 * jj + 16 * half
                for a in range(0, 32 * rows, 32):
                    st_i32x8(isc, a, iadd(ld_i32x8(isc, a), dot4k_x8(u, qs, x, sclo, schi)))
                    x += K
    else:
        for h in range(2):  # 128-value half h; kp: ql's bytes 0-31 (kp 0) or 32-63 (kp 1) of the half
            co = o + 144 + 768 * h
            for kp in range(2):
                for half in range(2):  # chunks 4 half .. 4 half + 3: 16-value groups 8h + 2k + half
                    sclo = ksc6_x8(w, o + 16 + 16 * (4 * h + kp), half)
                    schi = ksc6_x8(w, o + 16 + 16 * (4 * h + kp + 2), half)
                    u = codes6_x8(w, co + 256 * kp + 128 * half, co + 512 + 128 * half, kp)
                    x = xo + 128 * h + 32 * kp + 16 * half
                    for a in range(0, 32 * rows, 32):
                        st_i32x8(isc, a, iadd(ld_i32x8(isc, a), dot6k_x8(u, qs, x, sclo, schi)))
                        x += K


@njit(inline="always", **DOT)
def _sbk_x8_two(kind, w, o, qs, xo, K):
    """_sbk_x8 for two activation rows (quants at bytes xo and xo + K), each code vector decoded once for both and
    both lane vectors in registers (Q6_K through the tile form's codes6_x8 / dot6k_x8: the same integers)."""
    s0, s1 = izero(), izero()
    if kind == Q4_K or kind == Q5_K:
        for jj in range(4):
            sclo, schi = ksc_x8(w, o + 32 + 16 * jj, 0), ksc_x8(w, o + 32 + 16 * jj, 1)
            for half in range(2):
                u = _kx8_codes(kind, w, o, jj, half)
                x = xo + 64 * jj + 16 * half
                s0 = iadd(s0, dot4k_x8(u, qs, x, sclo, schi))
                s1 = iadd(s1, dot4k_x8(u, qs, x + K, sclo, schi))
    else:
        for h in range(2):
            co = o + 144 + 768 * h
            for kp in range(2):
                for half in range(2):
                    sclo = ksc6_x8(w, o + 16 + 16 * (4 * h + kp), half)
                    schi = ksc6_x8(w, o + 16 + 16 * (4 * h + kp + 2), half)
                    u = codes6_x8(w, co + 256 * kp + 128 * half, co + 512 + 128 * half, kp)
                    x = xo + 128 * h + 32 * kp + 16 * half
                    s0 = iadd(s0, dot6k_x8(u, qs, x, sclo, schi))
                    s1 = iadd(s1, dot6k_x8(u, qs, x + K, sclo, schi))
    return s0, s1


@njit(inline="always", **DOT)
def _kmin_sum_x8(w, o, b32, bo):
    """Q4_K: int32 lane r = row r's 8 mins . the activation row's 32-value sums at byte bo of b32 (the super-block at
    byte o), in pairs of sub-blocks."""
    mn = izero()
    for k in range(4):  # pair k: sub-blocks 2k, 2k + 1
        mn = iadd(mn, kmin_x8(w, o + 96 + 16 * k, b32, bo + 8 * k))
    return mn


@njit(inline="always", **DOT)
def _koff6_sum_x8(w, o, b16, bo):
    """Q6_K: int32 lane r = row r's 16 scales . the activation row's 16-value sums at byte bo of b16 (what the
    offset 32 of its codes takes away, times 32)."""
    c = izero()
    for k in range(8):
        c = iadd(c, koff6_x8(w, o + 16 + 16 * k, b16, bo + 8 * k))
    return c


@njit(inline="always", **DOT)
def _rowsk_x8_two(kind, w, d1, b16, b32, qs, out, g0, g1, far):
    """_rowsk_x8 for exactly two activation rows: per group, both rows' integer lanes (_sbk_x8_two) and their four
    accumulators in registers; rowk's float steps, row by row in the same order. `far`: prefetch the weights
    (_far_prefetch; the tile loop of 3 or more rows ran as fast without it)."""
    rb = w.shape[1]
    N, K = out.shape[1], qs.shape[1]
    nsb = K // 256
    sbytes = _kx8_bytes(kind)
    n16, n32 = b16.shape[1], b32.shape[1]
    for g in range(g0, g1):
        ad0, ad1, am0, am1 = fzero(), fzero(), fzero(), fzero()
        for b in range(nsb):
            o = g * rb + b * sbytes
            _far_prefetch(w, o, sbytes, far)
            dw = ld_f16x8(w, o)
            s0, s1 = _sbk_x8_two(kind, w, o, qs, 256 * b, K)
            if _has_min(kind):
                dm = ld_f16x8(w, o + 16)
                mn0, mn1 = _kmin_sum_x8(w, o, b32, 4 * (8 * b)), _kmin_sum_x8(w, o, b32, 4 * (n32 + 8 * b))
                am0 = fma_v(am0, fcvt(mn0), fscale(dm, -d1[b]))
                am1 = fma_v(am1, fcvt(mn1), fscale(dm, -d1[nsb + b]))
            else:
                c0, c1 = _koff6_sum_x8(w, o, b16, 4 * (16 * b)), _koff6_sum_x8(w, o, b16, 4 * (n16 + 16 * b))
                s0, s1 = iaddmul(s0, c0, -32), iaddmul(s1, c1, -32)
            ad0 = fma_v(ad0, fcvt(s0), fscale(dw, d1[b]))
            ad1 = fma_v(ad1, fcvt(s1), fscale(dw, d1[nsb + b]))
        st_f32x8(out, 4 * (8 * g), fadd_v(ad0, am0))
        st_f32x8(out, 4 * (N + 8 * g), fadd_v(ad1, am1))


@njit(inline="always", **DOT)
def _group_k_x8_one(kind, w, go, d1, b16, b32, qs, nsb, m):
    """_rowsk_x8's lanes for activation row m and the group of 8 Q4_K / Q6_K rows at byte go: per super-block the
    integer lanes (_sbk_x8), then the tile loop's float steps with both accumulators in registers."""
    sbytes = _kx8_bytes(kind)
    n16, n32 = b16.shape[1], b32.shape[1]
    K = 256 * nsb
    ad, am = fzero(), fzero()
    for b in range(nsb):
        o = go + b * sbytes  # no software prefetch: one contiguous stream per thread (X8K note)
        i = m * nsb + b
        s = _sbk_x8(kind, w, o, qs, m * K + 256 * b)
        if _has_min(kind):
            am = fma_v(am, fcvt(_kmin_sum_x8(w, o, b32, 4 * (m * n32 + 8 * b))), fscale(ld_f16x8(w, o + 16), -d1[i]))
        else:
            s = iaddmul(s, _koff6_sum_x8(w, o, b16, 4 * (m * n16 + 16 * b)), -32)
        ad = fma_v(ad, fcvt(s), fscale(ld_f16x8(w, o), d1[i]))
    return fadd_v(ad, am)


@njit(inline="always", **DOT)
def _rowsk_x8_one(kind, w, d, b16, b32, qs, out, g0, g1, stream):
    """out[:, 8 g0 : 8 g1] one activation row at a time, each row the bits _rowsk_x8's tiles give it (as
    _rows_x8_one: what the one-row launchers hold)."""
    d1 = d.reshape(-1)
    for m in range(qs.shape[0]):  # a work item's groups stay in L1 for the rows after the first
        _row_k_x8(kind, w, 0, d1, b16, b32, qs, m, out, m, g0, g1, stream)


@njit(inline="always", **DOT)
def _row_k_x8(kind, w, wg, d1, b16, b32, qs, m, out, o, g0, g1, stream):
    """out[o, 8 g0 : 8 g1] = activation row m times groups wg + g0 .. wg + g1 - 1 of w (one row of _rowsk_x8_one; an
    expert's rows of a stack of experts for _expertsk_x8). On AVX-512 two groups per vector, an odd last group as a
    vector of itself twice (the 256-bit code stays out of these kernels: one path to compile), unless `stream`: one
    group at a time (DECODE_STREAM), except IQ4_XS, whose one-group code is _row_iq4_xs_x8's."""
    rb, N = w.shape[1], out.shape[1]
    nsb = qs.shape[1] // 256
    if HAS_ZMM and not stream:
        for g in range(g0, g1, 2):
            gb = min(g + 1, g1 - 1)
            v = _group_k_z16_one(kind, w, (wg + g) * rb, (wg + gb) * rb, d1, b16, b32, qs, nsb, m)
            if gb > g:
                st_z(out, 4 * (o * N + 8 * g), v)
            else:
                st_lo_f32x8(out, 4 * (o * N + 8 * g), v)
        return
    for g in range(g0, g1):
        st_f32x8(out, 4 * (o * N + 8 * g), _group_k_x8_one(kind, w, (wg + g) * rb, d1, b16, b32, qs, nsb, m))


@njit(inline="always", **DOT)
def _rowsk_x8(kind, w, qu, d, b16, b32, qs, out, g0, g1):
    """out[:, 8 g0 : 8 g1] for groups g0..g1-1 of 8 interleaved Q4_K / Q6_K rows: each super-block of a group is
    decoded once per tile of activation rows (all of them for decode); per super-block and tile row the 8 rows'
    integer lanes (one row: in registers, _sbk_x8; more: waiting in L1, _sbk_tile_x8), then rowk's float steps
    (acc: the d terms, then the dmin terms). On AVX-512 from 2 rows on, the launcher passes its pair layouts
    (_pairs_q8_k) in place of d, b16 / b32, qs and the pair tiles run instead (_rowsk_z); from VNNI_MIN_ROWS rows on,
    the VNNI tiles (_rowsk_vnni, on qu); with AMX, from AMX_MIN_ROWS rows on, the tile unit (_rowsk_amx)."""
    if _vnni_given(out, qs, kind):
        _rowsk_vnni(kind, w, qu, d, b32, out, g0, g1)
        return
    if _amx_given(out, qs, kind):
        _rowsk_amx(kind, w, d, b16, b32, qs, out, g0, g1)
        return
    if _pairs_given(out.shape[0], kind):
        _rowsk_z(kind, w, d, b16, b32, qs, out, g0, g1)
        return
    rb = w.shape[1]
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    nsb = K // 256
    if M == 1:
        _rowsk_x8_one(kind, w, d, b16, b32, qs, out, g0, g1, False)
        return
    sbytes = _kx8_bytes(kind)
    MT = _m_tile(K)
    if M == 2:
        _rowsk_x8_two(kind, w, d.reshape(-1), b16, b32, qs, out, g0, g1, _far(w))
        return
    if M <= X8_STACK_ROWS:
        acc, isc = carray(x8_acc_scratch(), (X8_STACK_ROWS, 16)), carray(x8_int_scratch(), (X8_STACK_ROWS, 8))
    else:
        acc, isc = _empty64_rows(MT, 16, np.float32), _empty64_rows(MT, 8, np.int32)
    d1 = d.reshape(-1)
    n16, n32 = b16.shape[1], b32.shape[1]
    for t in range(0, M, MT):
        t1 = min(M, t + MT)
        for g in range(g0, g1):
            for a in range(0, 64 * (t1 - t), 32):
                st_f32x8(acc, a, fzero())
            for b in range(nsb):
                o = g * rb + b * sbytes  # no software prefetch: one contiguous stream per thread (X8K note)
                dw = ld_f16x8(w, o)
                dm = ld_f16x8(w, o + 16) if _has_min(kind) else fzero()
                if t1 - t > 1:
                    _sbk_tile_x8(kind, w, o, qs, t * K + 256 * b, K, t1 - t, isc)
                for m in range(t, t1):
                    a, i = m - t, m * nsb + b
                    s = _sbk_x8(kind, w, o, qs, m * K + 256 * b) if t1 - t == 1 else ld_i32x8(isc, 32 * a)
                    if _has_min(kind):
                        mn = _kmin_sum_x8(w, o, b32, 4 * (m * n32 + 8 * b))
                        st_f32x8(acc, 64 * a + 32, fma_v(ld_f32x8(acc, 64 * a + 32), fcvt(mn), fscale(dm, -d1[i])))
                    else:
                        s = iaddmul(s, _koff6_sum_x8(w, o, b16, 4 * (m * n16 + 16 * b)), -32)
                    st_f32x8(acc, 64 * a, fma_v(ld_f32x8(acc, 64 * a), fcvt(s), fscale(dw, d1[i])))
            for m in range(t, t1):
                a = 64 * (m - t)
                st_f32x8(out, 4 * (m * N + 8 * g), fadd_v(ld_f32x8(acc, a), ld_f32x8(acc, a + 32)))


# ---- Pair tiles on AVX-512: the interleaved layouts with M >= 2 activation rows -----------------------------------
# With 512-bit registers a vector holds the 8 interleaved weight rows against two activation rows at once: lane
# 2r + j is weight row r against activation row j of a pair. The launcher lays each pair of activation rows out
# together (_pair_rows: 4 quant bytes of one row, then the same 4 of the other, so one 8-byte broadcast fills every
# lane), and the tiles decode each code vector once, spread its rows' dwords over both lanes (vpermd), then take 4
# quant bytes a lane per vpdpbusd and the sub-block scale per vpdpwssd. Every lane is the same exact integer as
# _sbk_x8's and gets the same float steps as _rowsk_x8's, so the bits are the same. What it saves: the 256-bit
# tiles spend ~21 vector instructions on 256 multiply-adds of a row (vpmaddubsw, int16 adds, vpmaddwd, broadcasts);
# these ~11 on 512. llama.cpp's repacked Q4_K gemm (ggml-cpu/arch/x86/repack.cpp, ggml_gemm_q4_K_8x8_q8_K) likewise
# interleaves the activations, 4 rows at a time (block_q8_Kx4), and takes 16 rows per pass on AVX-512. The K-quants'
# tiles are here (up to VNNI_MIN_ROWS rows), then the launchers' pair layouts (_pairs_q8_k). Only where the CPU has
# AVX-512 F / BW / VNNI. (The 32-value types' pair tiles are gone: two pairs of groups at a time, _rows_zq, ran their
# products of 2-7 rows 1.07-1.58x faster on Ice Lake; see Z8_MIN_ROWS.)
# A batched decode step (a few rows) reads every weight once, from L3 or DRAM, as decode does: the tiles prefetch
# each block Z16_PREFETCH ahead on their first tile of rows, as the one-row kernels do. Intel Xeon, 2 threads,
# forward_batch of M one-token sequences (median step, base / prefetched, 3 alternating process pairs): Gemma3 M = 4
# 20.9-21.1 -> 14.2-15.0 ms, M = 8 28.0-28.5 -> 18.2-19.0 ms (its 262,144 x 640 Q8_0 output projection at 8 rows 15.6
# -> 7.0-7.4 ms); SmolLM2 M = 4 9.4-15.0 -> 6.7-7.1 ms, M = 8 13.1-24.9 -> 11.2-12.6 ms.
# -----------------------------------------------------------------------------------------------------------------

# one activation row keeps decode's kernels; two take the pair tiles (the K-quants) or _rows_zq (the 32-value types)
# too, which on AVX-512 beat the 256-bit two-row kernels (_rowsk_x8_two, _group_x8_two): forward_batch of 2
# sequences, alternating processes, with the pair tiles for both, Gemma3 15.0-15.7 -> 12.2-12.5 ms, SmolLM2 6.4-8.2 ->
# 5.1-5.4 ms (one sequence: 9.4-10.4 / 3.5-3.7 ms)
ZMM_MIN_ROWS = 2

I8x64 = Vec("i8", 64)
I32x16 = Vec("i32", 16)
CodesZ8 = types.UniTuple(I8x64, 8)
_v16i32, _v32i16 = ir.VectorType(_i32, 16), ir.VectorType(_i16, 32)
_DUP = ir.Constant(_v16i32, [i // 2 for i in range(16)])  # lane 2r + j <- lane r (vpermd)
_PAIR = ir.Constant(_v16i32, [i % 2 for i in range(16)])  # lane 2r + j <- element j


def _z_call(builder, name, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(args[0].type, [a.type for a in args]), name)
    return builder.call(fn, list(args))


def _z_pair8(builder, p, at):
    """The 8 bytes at byte `at` of i8* p in each of the 8 qwords of a 64-byte vector (vpbroadcastq), as int32."""
    x = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, at)]), _i64.as_pointer()), align=1)
    return builder.bitcast(_bsplat(builder, ir.VectorType(_i64, 8), x), _v16i32)


def _z_bcast4(builder, p, at):
    """The 4 bytes at byte `at` of i8* p in each of the 16 dwords of a 64-byte vector (vpbroadcastd)."""
    x = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, at)]), _i32.as_pointer()), align=1)
    return _bsplat(builder, _v16i32, x)


@intrinsic
def widen_z(typingctx, codes):
    """8 code vectors of 8 interleaved rows (dword r: row r's 4 codes) -> the same with row r in lanes 2r and 2r + 1."""
    if codes != Codes8:
        return None

    def codegen(context, builder, sig, args):
        out = []
        for i in range(8):
            v = builder.bitcast(builder.extract_value(args[0], i), _v8i32)
            out.append(builder.bitcast(builder.shuffle_vector(v, v, _DUP), ir.VectorType(_i8, 64)))
        return context.make_tuple(builder, sig.return_type, out)

    return CodesZ8(Codes8), codegen


@intrinsic
def imuladd_z(typingctx, acc, s, sc):
    """acc + s * sc, int32 lanes (vpmulld)."""
    if acc != I32x16 or s != I32x16 or sc != I32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.add(args[0], builder.mul(args[1], args[2]))

    return I32x16(I32x16, I32x16, I32x16), codegen


@intrinsic
def isub128_z(typingctx, s, c):
    """s - 128 c, int32 lanes: IQ4_XS's code book + 128 taken off again."""
    if s != I32x16 or c != I32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], builder.shl(args[1], _splat(_v16i32, 7)))

    return I32x16(I32x16, I32x16), codegen


def _kscales_z(signed: bool, low16: bool = True):
    """Intrinsic (a, off, e) -> element e (0 or 1) of the 8 rows' scale pairs at byte `off` (as ksc_x8) in lanes 2r
    and 2r + 1, as an int16 in the low half of the lane and 0 in the high half (what vpdpwssd multiplies exactly),
    or (low16 False) as an int32."""

    @intrinsic
    def scales(typingctx, a, off, e):
        if not _is_ptr_args(a, off) or not isinstance(e, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            v = _load(context, builder, sig, args, ir.VectorType(_i8, 16))
            pick = []
            for k in (0, 1):
                x = builder.shuffle_vector(v, v, ir.Constant(_v16i32, [2 * (i // 2) + k for i in range(16)]))
                x = builder.sext(x, _v16i32) if signed else builder.zext(x, _v16i32)
                pick.append(builder.and_(x, _splat(_v16i32, 0xFFFF)) if low16 else x)
            odd = builder.icmp_signed("!=", _int_arg(context, builder, sig.args[2], args[2]), ir.Constant(_i32, 0))
            return builder.select(odd, pick[1], pick[0])

        return I32x16(a, off, e), codegen

    return scales


ksc_z = _kscales_z(False)  # Q4_K / Q5_K's 6-bit scales
ksc6_z = _kscales_z(True, False)  # Q6_K's int8 scales, for vpmulld (dot6k_z)
kscw_z = _kscales_z(True, False)  # IQ4_XS's scales (-32..31), for vpmulld


def _z_quants(builder, p, v, pairs: bool):
    """The activation quants of value v (4 of them) in every lane: a pair of rows in the pair layout (_z_pair8,
    lanes 2r + j) or one row (_z_bcast4)."""
    return _z_pair8(builder, p, 2 * v) if pairs else _z_bcast4(builder, p, v)


def _dot_k_z(run: int, hi_at: int, pairs: bool = True):
    """Intrinsic (codes, x, off, sclo, schi, acc) -> acc + the lanes of _dot_k_x8 in 16 lanes: code vector 2c meets
    the quants of values 4c.. (scales sclo), 2c + 1 those of values hi_at + 4c.. (schi), of a pair of activation
    rows in the pair layout at byte `off` (pair tiles: widen_z codes) or of one row (decode: codes of two groups,
    codes_z16); `run` vpdpbusd then one vpdpwssd by the scale (run * 16 codes times quants stay within int16:
    Q4_K 4 x 16 x 15 x 128, Q5_K 2 x 16 x 31 x 128 < 2^15). run 0: all 4 vpdpbusd chained in int32, then one vpmulld
    by the scale as an int32 (_kscales_z low16 False): Q6_K, whose codes allow a run of 1 only (4 x 63 x 128)."""

    @intrinsic
    def dot(typingctx, codes, x, off, sclo, schi, acc):
        if codes != CodesZ8 or not _is_ptr_args(x, off) or sclo != I32x16 or schi != I32x16 or acc != I32x16:
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
            acc = args[5]
            for part in (0, 1):
                s = None
                for c in range(4):
                    u = builder.bitcast(builder.extract_value(args[0], 2 * c + part), _v16i32)
                    q = _z_quants(builder, p, hi_at * part + 4 * c, pairs)
                    s = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", s or _splat(_v16i32, 0), u, q)
                    if run and (c + 1) % run == 0:
                        acc, s = _z_call(builder, "llvm.x86.avx512.vpdpwssd.512", acc, s, args[3 + part]), None
                if not run:
                    acc = builder.add(acc, builder.mul(s, args[3 + part]))
            return acc

        return I32x16(CodesZ8, x, off, I32x16, I32x16, I32x16), codegen

    return dot


dot4k_z, dot5k_z, dot6k_z = _dot_k_z(4, 32), _dot_k_z(2, 32), _dot_k_z(0, 64)
dot4k_z16, dot5k_z16 = _dot_k_z(4, 32, False), _dot_k_z(2, 32, False)


def _kpairs_z(signed: bool, n: int):
    """Intrinsic (a, off, bp, bo) -> int32 lane 2r + j: sum over k < n of row r's byte pair at byte off + 16k ([row][2]
    bytes, sign- or zero-extended) . pair row j's two int16 sums at byte bo + 8k of bp (the pair layout of
    _pair_sums): kmin_x8 / koff6_x8 summed as _kmin_sum_x8 / _koff6_sum_x8 sum them, for both rows of a pair."""

    @intrinsic
    def pairs(typingctx, a, off, bp, bo):
        if not _is_ptr_args(a, off) or not _is_ptr_args(bp, bo):
            return None

        def codegen(context, builder, sig, args):
            pa = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
            pb = _ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3], _i8)
            acc = _splat(_v16i32, 0)
            for k in range(n):
                v = builder.load(builder.bitcast(builder.gep(pa, [ir.Constant(_i64, 16 * k)]),
                                                 ir.VectorType(_i8, 16).as_pointer()), align=1)  # fmt: skip
                v = builder.bitcast(builder.sext(v, _v16i16) if signed else builder.zext(v, _v16i16), _v8i32)
                v = builder.shuffle_vector(v, v, _DUP)
                acc = _z_call(builder, "llvm.x86.avx512.vpdpwssd.512", acc, v, _z_pair8(builder, pb, 8 * k))
            return acc

        return I32x16(a, off, bp, bo), codegen

    return pairs


kmin_z = _kpairs_z(False, 4)  # Q4_K / Q5_K: the 8 sub-blocks' mins . bsums32
kiq4_z = _kpairs_z(True, 4)  # IQ4_XS: the 8 sub-blocks' scales . bsums32 (what the code book's + 128 adds)
koff6_z = _kpairs_z(True, 8)  # Q6_K: the 16 groups' scales . bsums16


@intrinsic
def ld_f16x8_z(typingctx, a, off):
    """8 IEEE halves at byte `off` (one per interleaved row), as float32, row r in lanes 2r and 2r + 1."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        v = _h2f(builder, _load(context, builder, sig, args, ir.VectorType(_i16, 8)))
        return builder.shuffle_vector(v, v, _DUP)

    return F32x16(a, off), codegen


def _f32pair_z(negate: bool):
    """Intrinsic (a, off) -> the two float32 at byte `off` (a pair's two activation scales) in alternate lanes,
    negated if `negate`."""

    @intrinsic
    def pair(typingctx, a, off):
        if not _is_ptr_args(a, off):
            return None

        def codegen(context, builder, sig, args):
            v = _load(context, builder, sig, args, ir.VectorType(_f32, 2))
            v = builder.shuffle_vector(v, v, _PAIR)
            return builder.fneg(v) if negate else v

        return F32x16(a, off), codegen

    return pair


ld_f32pair_z, ld_f32pair_neg_z = _f32pair_z(False), _f32pair_z(True)


def _const_z(ty, value):
    @intrinsic
    def const(typingctx):
        def codegen(context, builder, sig, args):
            return _splat(context.get_value_type(ty), value)

        return ty(), codegen

    return const


izero_z, fzero_z = _const_z(I32x16, 0), _const_z(F32x16, 0.0)


def _ld_z(ty):
    @intrinsic
    def load(typingctx, a, off):
        """16 lanes at byte `off`."""
        if not _is_ptr_args(a, off):
            return None

        def codegen(context, builder, sig, args):
            return _load(context, builder, sig, args, context.get_value_type(ty))

        return ty(a, off), codegen

    return load


ld_i32z, ld_f32z = _ld_z(I32x16), _ld_z(F32x16)


@intrinsic
def st_z(typingctx, a, off, v):
    """Store 16 lanes (int32 or float32) at byte `off`."""
    if not _is_ptr_args(a, off) or v not in (I32x16, F32x16):
        return None
    return types.none(a, off, v), _store_codegen


@intrinsic
def st_lanes_f32x8(typingctx, a, off, v, j):
    """Store lanes j, j + 2, ..., j + 14 of v (activation row j of a pair) as 8 float32 at byte `off`."""
    if not _is_ptr_args(a, off) or v != F32x16 or not isinstance(j, types.IntegerLiteral):
        return None
    k = j.literal_value

    def codegen(context, builder, sig, args):
        x = builder.shuffle_vector(args[2], args[2], ir.Constant(_v8i32, list(range(k, 16, 2))))
        builder.store(x, _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _v8f32), align=4)
        return context.get_dummy_value()

    return types.none(a, off, v, j), codegen


def _lanewise_z(build, out, *ins):
    """Intrinsic of 16-lane operands `ins` (one to four) -> `out`: build(builder, *operands)."""

    def typer(args):
        if tuple(args) != ins:
            return None

        def codegen(context, builder, sig, llargs):
            return build(builder, *llargs)

        return out(*ins), codegen

    if len(ins) == 1:
        return intrinsic(lambda typingctx, a: typer((a,)))
    if len(ins) == 2:
        return intrinsic(lambda typingctx, a, b: typer((a, b)))
    if len(ins) == 3:
        return intrinsic(lambda typingctx, a, b, c: typer((a, b, c)))
    return intrinsic(lambda typingctx, a, b, c, d: typer((a, b, c, d)))


fcvt_z = _lanewise_z(lambda b, v: b.sitofp(v, _v16f32), F32x16, I32x16)
fmul_z = _lanewise_z(lambda b, x, y: b.fmul(x, y), F32x16, F32x16, F32x16)
fadd_z = _lanewise_z(lambda b, x, y: b.fadd(x, y), F32x16, F32x16, F32x16)
fma_z = _lanewise_z(lambda b, acc, x, y: _z_call(b, "llvm.fma.v16f32", x, y, acc), F32x16, F32x16, F32x16, F32x16)
isub32_z = _lanewise_z(lambda b, s, c: b.sub(s, b.shl(c, _splat(_v16i32, 5))), I32x16, I32x16, I32x16)  # s - 32 c
# the Q8_1 lane search's steps (_q8_1_scales16), each lane what the 8-lane forms give its block
fdiv_z = _lanewise_z(lambda b, x, y: b.fdiv(x, y), F32x16, F32x16, F32x16)
fround_f16_z = _lanewise_z(_round_f16_ir, F32x16, F32x16)  # round_f16 of each lane
bits_f32z = _lanewise_z(lambda b, v: b.bitcast(v, _v16f32), F32x16, I32x16)  # the float32 each lane's bits encode


def _abs_bits_max_z(b, acc, v):
    """abs_bits_max on 16 lanes: lane-wise max of acc and the bits of |v| as int32."""
    return _z_call(b, "llvm.smax.v16i32", acc, b.and_(b.bitcast(v, _v16i32), _splat(_v16i32, 0x7FFFFFFF)))


def _fpick_z(b, e, best, new, old):
    """Lane-wise: new where e < best (ordered), else old."""
    return b.select(b.fcmp_ordered("<", e, best), new, old)


def _fnonzero_z(b, v, x):
    """Lane-wise: x where v != 0 (unordered, as Python's: a NaN is not 0), else 0."""
    return b.select(b.fcmp_unordered("!=", v, _splat(_v16f32, 0.0)), x, _splat(_v16f32, 0.0))


def _fnormal_pick_z(b, dm, searched, fallback):
    """Lane-wise: searched where 6.2e-5 <= dm <= 63000 (_fp16_normal; ordered: NaN fails), else fallback."""
    lo = b.fcmp_ordered("<=", _splat(_v16f32, float(np.float32(6.2e-5))), dm)
    hi = b.fcmp_ordered("<=", dm, _splat(_v16f32, float(np.float32(63000.0))))
    return b.select(b.and_(lo, hi), searched, fallback)


abs_bits_max_z = _lanewise_z(_abs_bits_max_z, I32x16, I32x16, F32x16)
fpick_z = _lanewise_z(_fpick_z, F32x16, F32x16, F32x16, F32x16, F32x16)
fnonzero_z = _lanewise_z(_fnonzero_z, F32x16, F32x16, F32x16)
fnormal_pick_z = _lanewise_z(_fnormal_pick_z, F32x16, F32x16, F32x16, F32x16)


@njit(inline="always", **DOT)
def _pair_tiles(M, kind):
    """Whether a K-quant launcher runs M activation rows as pair tiles (the 32-value types have none: _z8_tiles). Not
    where the AMX tiles (_amx_tiles) or the VNNI tiles (_vnni_tiles) take the product."""
    return _pairs_given(M, kind) and not _amx_tiles(M, kind) and not _vnni_tiles(M, kind)


@njit(inline="always", **DOT)
def _pairs_given(M, kind):
    """In a worker: whether its launcher passed pair layouts, the AMX case set apart first (_amx_given)."""
    return HAS_ZMM and M >= ZMM_MIN_ROWS


@njit(inline="always", **DOT)
def _pair_rows(x, xp, p):
    """Pair p of x's rows (int32 words [M, n]; the last row twice when M is odd) into xp[p] ([P, 2n]): word i of
    row 2p, then word i of row 2p + 1."""
    a, b = 2 * p, min(2 * p + 1, x.shape[0] - 1)
    for i in range(x.shape[1]):
        xp[p, 2 * i] = x[a, i]
        xp[p, 2 * i + 1] = x[b, i]


@njit(inline="always", **DOT)
def _pair_sums(s, sp, p):
    """Pair p of the activation sums s (int32 [M, n], n even, each within int16) into sp[p] (int32 [P, n]): for
    each two sums 2i, 2i + 1 of a row, word 2i + j = row j's two as int16s (low, high), j = 0, 1."""
    a, b = 2 * p, min(2 * p + 1, s.shape[0] - 1)
    for i in range(s.shape[1] // 2):
        sp[p, 2 * i] = (s[a, 2 * i] & 0xFFFF) | (s[a, 2 * i + 1] << 16)
        sp[p, 2 * i + 1] = (s[b, 2 * i] & 0xFFFF) | (s[b, 2 * i + 1] << 16)


@njit(inline="always", **DOT)
def _tile_prefetch(w, o, nbytes):
    """A pair tile's hint for the block of nbytes at byte o, on its first tile of rows: Z16_PREFETCH ahead into
    every level, or decode's hint and distance for a matrix of Z16_FAR_BYTES or more."""
    _tile_prefetch_far(w, o, nbytes, DECODE_PREFETCH)


@njit(inline="always", **DOT)
def _tile_prefetch_far(w, o, nbytes, far_ahead):
    """_tile_prefetch with decode's hint far_ahead bytes ahead for a matrix of Z16_FAR_BYTES or more."""
    far = _far(w)
    for pf in range(0, nbytes, 64):
        if far:
            decode_prefetch(w, o + far_ahead + pf)
        else:
            prefetch(w, o + Z16_PREFETCH + pf)


@njit(inline="always", **DOT)
def _sbk_tile_z(kind, w, o, qp, xo, K2, pairs, isc):
    """_sbk_tile_x8 for `pairs` pairs of activation rows in the pair layout (pair t at byte xo + t * K2 of qp):
    isc[t] (int32 [pairs, 16], lane 2r + j) = the pair's integer lanes of the super-block at byte o. Q4_K / Q5_K
    add each step's dot (from zero) to isc[t] instead of passing isc[t] in as vpdpwssd's accumulator, so that the
    read-modify-write of isc[t] waits on an add rather than on two vpdpwssd: the same integer sums; one pair (2 rows),
    one thread, Q4_K 2,048 x 2,048 116.6-117.5 -> 109.1-109.5 us, more pairs unchanged."""
    for a in range(0, 64 * pairs, 64):
        st_z(isc, a, izero_z())
    if kind == Q4_K or kind == Q5_K:
        for jj in range(4):
            sclo, schi = ksc_z(w, o + 32 + 16 * jj, 0), ksc_z(w, o + 32 + 16 * jj, 1)
            for half in range(2):
                if kind == Q5_K:
                    u = codes5_z(w, o + 160 + 320 * jj + 160 * half)
                else:
                    u = codes_z(w, o + 160 + 256 * jj + 128 * half)
                x = xo + 2 * (64 * jj + 16 * half)
                for a in range(0, 64 * pairs, 64):
                    if kind == Q4_K:
                        st_z(isc, a, iadd(ld_i32z(isc, a), dot4k_z(u, qp, x, sclo, schi, izero_z())))
                    else:
                        st_z(isc, a, iadd(ld_i32z(isc, a), dot5k_z(u, qp, x, sclo, schi, izero_z())))
                    x += K2
    elif kind == Q6_K:
        for h in range(2):
            co = o + 144 + 768 * h
            for kp in range(2):
                for half in range(2):
                    sclo = ksc6_z(w, o + 16 + 16 * (4 * h + kp), half)
                    schi = ksc6_z(w, o + 16 + 16 * (4 * h + kp + 2), half)
                    u = widen_z(codes6_x8(w, co + 256 * kp + 128 * half, co + 512 + 128 * half, kp))
                    x = xo + 2 * (128 * h + 32 * kp + 16 * half)
                    for a in range(0, 64 * pairs, 64):
                        st_z(isc, a, dot6k_z(u, qp, x, sclo, schi, ld_i32z(isc, a)))
                        x += K2
    else:  # IQ4_XS: per sub-block the code book + 128 against the quants, times the scale (vpmulld)
        for gg in range(8):
            sc = kscw_z(w, o + 16 + 16 * (gg // 2), gg % 2)
            u = iq4_codes_z(w, o + 80 + 128 * gg)
            x = xo + 64 * gg
            for a in range(0, 64 * pairs, 64):
                st_z(isc, a, imuladd_z(ld_i32z(isc, a), dot_z(u, qp, x), sc))
                x += K2


@njit(inline="always", **DOT)
def _rowsk_z(kind, w, dp, b16p, b32p, qp, out, g0, g1):
    """_rowsk_x8 for M >= 2 activation rows given as pairs (the launcher's _pair_rows / _pair_sums: qp [P, 2K],
    dp [P, 2 K/256], b16p [P, K/16], b32p [P, K/32]): per tile of pairs and group, each super-block decoded once,
    the pairs' integer lanes waiting in L1, then rowk's float steps on both rows of a pair at once."""
    rb = w.shape[1]
    M, N = out.shape[0], out.shape[1]
    P, K2 = qp.shape[0], qp.shape[1]
    nsb = K2 // 512
    sbytes = _kx8_bytes(kind)
    PT = _m_tile(K2 // 2) // 2
    if P <= X8_STACK_ROWS // 2:
        acc, isc = (
            carray(x8_acc_scratch(), (X8_STACK_ROWS // 2, 32)),
            carray(x8_int_scratch(), (X8_STACK_ROWS // 2, 16)),
        )
    else:
        acc, isc = _empty64_rows(PT, 32, np.float32), _empty64_rows(PT, 16, np.int32)
    n16, n32 = b16p.shape[1], b32p.shape[1]
    for t in range(0, P, PT):
        t1 = min(P, t + PT)
        for g in range(g0, g1):
            for a in range(0, 128 * (t1 - t), 64):
                st_z(acc, a, fzero_z())
            for b in range(nsb):
                o = g * rb + b * sbytes
                if t == 0:
                    _tile_prefetch(w, o, sbytes)
                dw = ld_f16x8_z(w, o)
                _sbk_tile_z(kind, w, o, qp, t * K2 + 512 * b, K2, t1 - t, isc)
                for p in range(t, t1):
                    a = p - t
                    s = ld_i32z(isc, 64 * a)
                    if kind == IQ4_XS:
                        s = isub128_z(s, kiq4_z(w, o + 16, b32p, 4 * (p * n32 + 8 * b)))
                    elif _has_min(kind):
                        mn = kmin_z(w, o + 96, b32p, 4 * (p * n32 + 8 * b))
                        dm = fmul_z(ld_f16x8_z(w, o + 16), ld_f32pair_neg_z(dp, 4 * (p * 2 * nsb + 2 * b)))
                        st_z(acc, 128 * a + 64, fma_z(ld_f32z(acc, 128 * a + 64), fcvt_z(mn), dm))
                    else:
                        s = isub32_z(s, koff6_z(w, o + 16, b16p, 4 * (p * n16 + 16 * b)))
                    dd = fmul_z(dw, ld_f32pair_z(dp, 4 * (p * 2 * nsb + 2 * b)))
                    st_z(acc, 128 * a, fma_z(ld_f32z(acc, 128 * a), fcvt_z(s), dd))
            for p in range(t, t1):
                v = fadd_z(ld_f32z(acc, 128 * (p - t)), ld_f32z(acc, 128 * (p - t) + 64))
                st_lanes_f32x8(out, 4 * (2 * p * N + 8 * g), v, 0)
                if 2 * p + 1 < M:
                    st_lanes_f32x8(out, 4 * ((2 * p + 1) * N + 8 * g), v, 1)


def _dot32_z(nibbles: bool, pairs: bool = True):
    """Intrinsic (codes, x, off) -> 16 lanes of 8 rows' codes (iq4_codes_z) . a pair of activation rows' 32 quants at
    byte `off` of the pair layout (lane 2r + j), or of two groups' codes (codes_z16, codes8_z16, iq4_codes_z16) . one
    row's: 8 vpdpbusd, code vector j meeting values 16 (j % 2) + 4 (j // 2).. for the nibble types, 4j.. for Q8_0; in
    two chains of 4 (even and odd j) added at the end, the same integer sum: with one pair of rows a tile waited on one
    chain of 8 (Zen 4, one thread, alternating processes: Q4_1 3,072 x 576 at 2 / 4 / 8 / 16 rows 59.3-59.5 /
    77.4-81.4 / 121 / 211 -> 55.6-56.0 / 74.1-74.6 / 116-117 / 202-205 us; Q4_K's tiles and one-row decode
    unchanged)."""

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
        acc = [_splat(_v16i32, 0), _splat(_v16i32, 0)]
        for j in range(8):
            v = 16 * (j % 2) + 4 * (j // 2) if nibbles else 4 * j
            u = builder.bitcast(builder.extract_value(args[0], j), _v16i32)
            acc[j % 2] = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", acc[j % 2], u,
                                 _z_quants(builder, p, v, pairs))  # fmt: skip
        return builder.add(acc[0], acc[1])

    @intrinsic
    def dot(typingctx, codes, x, off):
        if codes != CodesZ8 or not _is_ptr_args(x, off):
            return None
        return I32x16(CodesZ8, x, off), codegen

    return dot


dot_z = _dot32_z(True)  # (IQ4_XS's pair tiles)
dot_z16, dot8_z16 = _dot32_z(True, False), _dot32_z(False, False)


PAIRS_SERIAL_BYTES = 1 << 17  # activations laid out as pairs by the launcher's own thread up to this size


@njit(inline="always", **DOT)
def _pair_rows_q8_k(d, b, q32, dp, bp, qp32, p):
    _pair_rows(q32, qp32, p)
    _pair_rows(d, dp, p)
    _pair_sums(b, bp, p)


@njit(inline="always", **DOT_PARALLEL)
def _pairs_q8_k(d, b, qs):
    """Q8_K activations (d [M, K/256], one of bsums16 / bsums32 as b, qs [M, K]) as pairs of rows for _rowsk_z:
    (dp, bp, qp)."""
    P = (qs.shape[0] + 1) // 2
    dp, bp = _empty64_rows(P, 2 * d.shape[1], np.float32), _empty64_rows(P, b.shape[1], np.int32)
    qp = _empty64_rows(P, 2 * qs.shape[1], np.int8)
    q32, qp32 = qs.view(np.int32), qp.view(np.int32)
    if qs.size <= PAIRS_SERIAL_BYTES:
        for p in range(P):
            _pair_rows_q8_k(d, b, q32, dp, bp, qp32, p)
    else:
        for p in prange(P):
            _pair_rows_q8_k(d, b, q32, dp, bp, qp32, p)
    return dp, bp, qp


# ---- AMX tiles: 16 activation rows x 16 weight rows per tile instruction (Intel AMX-INT8) -------------------------
# Where the CPU has AMX (Sapphire Rapids and later Xeons) and Linux grants this process its tile state (arch_prctl
# ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: the kernel hands it out only on request), products of AMX_MIN_ROWS or more
# activation rows run on the tile unit (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL: _rows_amx; Q4_K, Q5_K, Q6_K, IQ4_XS:
# _rowsk_amx): one `tdpbssd` multiplies a 16 x 32 tile of int8 activation quants by a 32 x 16 tile of int8 weight codes
# into 16 x 16 int32 sums, 8,192 multiply-adds per instruction against a 512-bit vpdpbusd's 64. A tile's K is one block
# (one scale group for the K-quants: 32 values, Q6_K's 16), so each tile's sums go back to memory (tilestored) and take
# their scale there: the same integers (codes minus the type's offset as signed bytes: sum((q - off) x) = sum(q x) - off
# sum(x)) and the same FMAs per lane as _group_x8_z16_one / _group_k_z16_one, so the same bits as every other route
# (tests/test_repack). A work item unpacks its weight rows (pairs of groups of the interleaved layout, 16 rows per B
# tile) over the whole K once into the tiles' VNNI layout (row k of a B tile: 4 codes of each of the 16 rows), up to
# AMX_ITEM_BYTES so that they stay in L2, and sends every 16-row activation tile through all of them (each activation
# tile read once per item); a 32-value tile's 16 accumulators stay in registers (Acc16), a K-quant super-block's
# integer sums too (AccI16). llama.cpp's AMX kernels (ggml-cpu/amx/mmq.cpp) take the same route: int8 tiles per
# block, the scales applied with AVX-512 after each tile store. The granted flag is read at run time (amx_granted), not
# frozen into the compiled code: a kernel cached by a process that had AMX never issues a tile instruction in one that
# was refused it (a tile instruction without the grant is SIGILL).
# -----------------------------------------------------------------------------------------------------------------

AMX_CPU = HAS_ZMM and {"amx-tile", "amx-int8"} <= _FEATS
# activation rows from which products take the tiles: a product costs the tiles what a whole number of 16-row
# activation tiles costs (24 rows about what 32 do), so below 32 the routes without tiles win: two pairs of groups at a
# time for the 32-value types (_rows_zq), the VNNI tiles for the K-quants. A batched decode step, Intel Xeon (AMX
# granted), 2 threads, forward_batch of 16 / 24 sequences at 64 positions, alternating processes, q5 of 40 steps
# (AMX_MIN_ROWS 16 -> 32): SmolLM2 20.4-27.8 / 55.8-65.8 -> 21.8-26.0 / 29.3-33.8 ms, Gemma3 32.3-39.6 / 60.1-79.7 ->
# 26.5-38.3 / 35.8-41.2 ms; at 32 and 64 rows even (2026-12-06). Before the rows of 8 and the VNNI tiles ran here, the
# tiles had won over the pair tiles from 16 rows (at 16 even or the AMX tiles ahead, 0.69-1.20).
AMX_MIN_ROWS = 32
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158  # Linux x86-64 (asm/prctl.h)
_AMX_GRANTED = ctypes.c_int8(0)  # what amx_granted() reads: 1 while the tiles are in use
llb.add_symbol("ggufrun_amx_granted", ctypes.addressof(_AMX_GRANTED))


def _request_amx() -> bool:
    """Ask Linux for the tile state (once per process; every thread then has it). GGUFRUN_AMX=0 skips the tiles."""
    if not AMX_CPU or os.environ.get("GGUFRUN_AMX", "1") == "0" or sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


AMX_PERMITTED = _request_amx()


def use_amx(on: bool) -> bool:
    """Turn the AMX tiles on or off for the kernels' next calls (on only where AMX_PERMITTED); returns whether they
    are on. Every route gives the same bits: this changes speed only (benchmarks, tests)."""
    _AMX_GRANTED.value = 1 if on and AMX_PERMITTED else 0
    return bool(_AMX_GRANTED.value)


use_amx(True)


@intrinsic
def amx_granted(typingctx):
    """Whether the tiles are on in this process (a load of the flag use_amx sets, through its exported symbol)."""

    def codegen(context, builder, sig, args):
        flag = builder.module.globals.get("ggufrun_amx_granted")
        if flag is None:
            flag = ir.GlobalVariable(builder.module, _i8, "ggufrun_amx_granted")
            flag.linkage = "external"
        return builder.icmp_unsigned("!=", builder.load(flag), ir.Constant(_i8, 0))

    return types.boolean(), codegen


def _tile_shapes(shapes) -> np.ndarray:
    """ldtilecfg's 64 bytes (palette 1) for tiles (tile number, bytes a row, rows); the others unused."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    colsb, rows = cfg[16:48].view(np.uint16), cfg[48:64]
    for t, c, r in shapes:
        colsb[t], rows[t] = c, r
    return cfg


def _amx_config(k: int = 32) -> np.ndarray:
    """ldtilecfg's 64 bytes for tiles of k values: tmm0 / tmm3 the int32 sums (16 rows x 64 bytes), tmm1 / tmm4 the
    activation quants (16 rows x k), tmm2 / tmm5 the weight codes (k / 4 rows of 16 x 4)."""
    return _tile_shapes(((0, 64, 16), (3, 64, 16), (1, k, 16), (4, k, 16), (2, 64, k // 4), (5, 64, k // 4)))


AMX_CONFIG = _amx_config()  # a global array: a constant in the compiled code
AMX_CONFIG16 = _amx_config(16)  # Q6_K: 16-value tiles (its scales cover 16 values)


def _tile_op(fmt, nregs: int, ptr: bool):
    """Intrinsic of `nregs` literal tile numbers (and, if ptr, an array, a byte offset and a row stride in bytes)
    -> the inline assembly fmt.format(*tiles) (operands $0 the address, $1 the stride)."""

    def build(context, builder, sig, args, tiles):
        asm = fmt.format(*tiles)
        if not ptr:
            builder.asm(ir.FunctionType(ir.VoidType(), []), asm, "~{memory}", [], True)
            return context.get_dummy_value()
        a, off, stride = args[nregs:]
        p = _ptr(context, builder, sig.args[nregs], a, sig.args[nregs + 1], off, _i8)
        s = context.cast(builder, stride, sig.args[nregs + 2], types.intp)
        builder.asm(ir.FunctionType(ir.VoidType(), [_i8.as_pointer(), _i64]), asm, "r,r,~{memory}", [p, s], True)
        return context.get_dummy_value()

    def typer(argtys):
        regs = argtys[:nregs]
        if not all(isinstance(t, types.IntegerLiteral) for t in regs):
            return None
        if ptr and not _is_ptr_args(argtys[nregs], argtys[nregs + 1]):
            return None
        tiles = [t.literal_value for t in regs]
        return types.none(*argtys), lambda c, b, s, a: build(c, b, s, a, tiles)

    if ptr:
        return intrinsic(prefer_literal=True)(lambda typingctx, t, a, off, stride: typer((t, a, off, stride)))
    if nregs == 1:
        return intrinsic(prefer_literal=True)(lambda typingctx, t: typer((t,)))
    return intrinsic(prefer_literal=True)(lambda typingctx, c, a, b: typer((c, a, b)))


tile_zero = _tile_op("tilezero %tmm{0}", 1, False)
tile_load = _tile_op("tileloadd ($0,$1,1), %tmm{0}", 1, True)
tile_store = _tile_op("tilestored %tmm{0}, ($0,$1,1)", 1, True)
tile_dpbssd = _tile_op("tdpbssd %tmm{2}, %tmm{1}, %tmm{0}", 3, False)  # tmm{0} += tmm{1} . tmm{2}


@intrinsic
def tile_config(typingctx, cfg):
    """ldtilecfg: the tile shapes of cfg (AMX_CONFIG) on this thread."""
    if not (isinstance(cfg, types.Array) and cfg.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], types.intp, ir.Constant(_i64, 0), _i8)
        builder.asm(ir.FunctionType(ir.VoidType(), [_i8.as_pointer()]), "ldtilecfg ($0)", "r,~{memory}", [p], True)
        return context.get_dummy_value()

    return types.none(cfg), codegen


@intrinsic
def tile_release(typingctx):
    """tilerelease: the thread's tile state back to its initial (unused) state."""

    def codegen(context, builder, sig, args):
        builder.asm(ir.FunctionType(ir.VoidType(), []), "tilerelease", "~{memory}", [], True)
        return context.get_dummy_value()

    return types.none(), codegen


def _st_btile(kquant: bool):
    """Intrinsic (codes, a, off, sub): the 8 code vectors of two groups (codes_z16, codes5_z16: 16 rows x 4 codes
    each) minus `sub`, as rows of B tiles at byte `off` of a. 32-value types: vector j holds values 4 (j // 2) + 16
    (j % 2).. of a block, so it is row j // 2 + 4 (j % 2) of the block's tile. Q4_K (4 chunks of a 64-value group's
    half h, the caller's off at sub-block 2 jj's tile + 256 h): vector j holds values 4 (4 h + j // 2).. of sub-block
    2 jj + j % 2, so it is row j // 2 of that sub-block's tile (512 bytes further for odd j)."""

    @intrinsic
    def st_btile(typingctx, codes, a, off, sub):
        if codes != CodesZ8 or not _is_ptr_args(a, off) or not isinstance(sub, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
            v64 = ir.VectorType(_i8, 64)
            k = _bsplat(builder, v64, builder.trunc(_int_arg(context, builder, sig.args[3], args[3]), _i8))
            for j in range(8):
                row = 64 * (j // 2) + 512 * (j % 2) if kquant else 64 * (j // 2 + 4 * (j % 2))
                at = builder.bitcast(builder.gep(p, [ir.Constant(_i64, row)]), v64.as_pointer())
                builder.store(builder.sub(builder.extract_value(args[0], j), k), at, align=1)
            return context.get_dummy_value()

        return types.none(codes, a, off, sub), codegen

    return st_btile


st_btile, st_btile_k = _st_btile(False), _st_btile(True)


def _st_btile_ab(rows):
    """Intrinsic (w, oa, ob, a, off): rows(builder, pa, pb) -> [(byte offset, 64-byte vector)] of B-tile rows made
    from groups A (byte oa of w) and B (byte ob), each stored at off + its offset in a."""

    @intrinsic
    def st(typingctx, w, oa, ob, a, off):
        if not _is_ab_args(w, oa, ob) or not _is_ptr_args(a, off):
            return None

        def codegen(context, builder, sig, args):
            pa, pb = _ab_ptrs(context, builder, sig, args)
            p = _ptr(context, builder, sig.args[3], args[3], sig.args[4], args[4], _i8)
            v64 = ir.VectorType(_i8, 64)
            for at, v in rows(builder, pa, pb):
                dst = builder.bitcast(builder.gep(p, [ir.Constant(_i64, at)]), v64.as_pointer())
                builder.store(builder.bitcast(v, v64), dst, align=1)
            return context.get_dummy_value()

        return types.none(w, oa, ob, a, off), codegen

    return st


# Q8_0: chunk j of both groups (32 bytes each) is row j of the block's B tile, the codes as they are (signed)
st_btile8 = _st_btile_ab(lambda builder, pa, pb: [(64 * j, _ld64_ab(builder, pa, pb, 32 * j)) for j in range(8)])
# Q6_K: chunk c of a 128-value half (oa / ob at its ql bytes) as _q6_codes_ab decodes it, minus 32 (signed -32..31):
# the codes of values l, 32 + l, 64 + l, 96 + l are row c % 4 of their 16-value groups' tiles, 512 bytes apart (the
# caller's off: the tile of the half's group c // 4, + 64 (c % 4))
st_btile6 = _st_btile_ab(
    lambda builder, pa, pb: [
        (512 * k, builder.sub(v, _splat(v.type, 32))) for k, v in enumerate(_q6_codes_ab(builder, pa, pb, 0))
    ]
)


Acc16 = types.UniTuple(F32x16, 16)  # a tile's 16 rows of 16 float32 accumulators, in registers


def _acc_zero(ty):
    """Intrinsic () -> ty (a tuple of 16-lane float32 or int32 vectors: Acc16, AccI16, Acc8), every lane zero."""
    vty = _v16f32 if ty.dtype == F32x16 else _v16i32

    @intrinsic
    def zero(typingctx):
        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, sig.return_type, [ir.Constant(vty, None)] * ty.count)

        return ty(), codegen

    return zero


def _row_elems(context, builder, sig, args, xi, ii, n):
    """Array args[xi]'s element i0 + r * stride for r = 0..n-1, clamped to index `last` (a partial tile's rows repeat
    the last one), as scalars: args[ii:ii + 3] = i0, stride, last."""
    x = context.make_array(sig.args[xi])(context, builder, args[xi])
    i0, stride, last = (context.cast(builder, args[ii + k], sig.args[ii + k], types.intp) for k in (0, 1, 2))
    out = []
    for r in range(n):
        i = builder.add(i0, builder.mul(stride, ir.Constant(_i64, r)))
        i = builder.select(builder.icmp_signed("<", i, last), i, last)
        out.append(builder.load(builder.gep(x.data, [i])))
    return out


def _acc_rows(context, builder, sig, args, at, n):
    """_row_elems of float array x broadcast to 16 lanes: args[at:at + 4] = x, i0, stride, last."""
    return [_bsplat(builder, _v16f32, v) for v in _row_elems(context, builder, sig, args, at, at + 1, n)]


@intrinsic
def acc16_sums(typingctx, acc, c, coff, dw, dx, i0, stride, last):
    """acc[r] += float(row r of the int32 sums at byte coff of c) * (dw * dx[i0 + r stride]): _group_x8_z16_one's
    d-term FMA for 16 activation rows."""
    if acc != Acc16 or not _is_ptr_args(c, coff) or dw != F32x16:
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
        out = []
        for r, x in enumerate(_acc_rows(context, builder, sig, args, 4, 16)):
            s = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, 64 * r)]), _v16i32.as_pointer()))
            f = builder.sitofp(s, _v16f32)
            out.append(
                _z_call(builder, "llvm.fma.v16f32", f, builder.fmul(args[3], x), builder.extract_value(args[0], r))
            )
        return context.make_tuple(builder, sig.return_type, out)

    return Acc16(acc, c, coff, dw, dx, i0, stride, last), codegen


def _acc_mins(ty):
    """Intrinsic (acc, mw, sx, i0, stride, last) -> acc[r] + mw * sx[i0 + r stride] for each row r of ty (Acc16,
    Acc8): Q4_1's m-term FMA."""

    @intrinsic
    def mins(typingctx, acc, mw, sx, i0, stride, last):
        if acc != ty or mw != F32x16:
            return None

        def codegen(context, builder, sig, args):
            rows = _acc_rows(context, builder, sig, args, 2, ty.count)
            out = [
                _z_call(builder, "llvm.fma.v16f32", args[1], x, builder.extract_value(args[0], r))
                for r, x in enumerate(rows)
            ]
            return context.make_tuple(builder, sig.return_type, out)

        return ty(acc, mw, sx, i0, stride, last), codegen

    return mins


def _acc_store(ty):
    """Intrinsic (acc, accm, out, off, stride, rows, lanes): rows r < `rows` of acc + accm (ty: Acc16, Acc8) to byte
    off + r * stride of out, 16 float32 each, or the low 8 if lanes == 8."""

    @intrinsic
    def store(typingctx, acc, accm, out, off, stride, rows, lanes):
        if acc != ty or accm != ty or not _is_ptr_args(out, off):
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3], _i8)
            stride, rows, lanes = (context.cast(builder, args[k], sig.args[k], types.intp) for k in (4, 5, 6))
            full = builder.icmp_signed("==", lanes, ir.Constant(_i64, 16))
            for r in range(ty.count):
                v = builder.fadd(builder.extract_value(args[0], r), builder.extract_value(args[1], r))
                at = builder.gep(p, [builder.mul(stride, ir.Constant(_i64, r))])
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_i64, r), rows)):
                    with builder.if_else(full) as (whole, low):
                        with whole:
                            builder.store(v, builder.bitcast(at, _v16f32.as_pointer()), align=4)
                        with low:
                            lo = builder.shuffle_vector(v, v, ir.Constant(_v8i32, list(range(8))))
                            builder.store(lo, builder.bitcast(at, _v8f32.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(acc, accm, out, off, stride, rows, lanes), codegen

    return store


def _acc_put(ty):
    """Intrinsic (acc, a, off): the vectors of acc (ty: AccI16, AccI8, Acc8) as they are to bytes off, off + 64, ... of
    a."""

    @intrinsic
    def store(typingctx, acc, a, off):
        if acc != ty or not _is_ptr_args(a, off):
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
            for r in range(ty.count):
                v = builder.extract_value(args[0], r)
                builder.store(
                    v, builder.bitcast(builder.gep(p, [ir.Constant(_i64, 64 * r)]), v.type.as_pointer()), align=4
                )
            return context.get_dummy_value()

        return types.none(acc, a, off), codegen

    return store


acc16_zero, acc16_mins, acc16_store = _acc_zero(Acc16), _acc_mins(Acc16), _acc_store(Acc16)


AccI16 = types.UniTuple(I32x16, 16)  # a tile's 16 rows of 16 int32 sums (a super-block's, K-quants)
acc16i_zero, acc16i_store = _acc_zero(AccI16), _acc_put(AccI16)


@intrinsic
def acc16i_madd(typingctx, acc, c, coff, sc):
    """acc[r] += (row r of the int32 sums at byte coff of c) * sc, int32 lanes (vpmulld): a sub-block's sums times
    its integer scale."""
    if acc != AccI16 or not _is_ptr_args(c, coff) or sc != I32x16:
        return None

    def codegen(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
        out = []
        for r in range(16):
            v = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(_i64, 64 * r)]), _v16i32.as_pointer()))
            out.append(builder.add(builder.extract_value(args[0], r), builder.mul(v, args[3])))
        return context.make_tuple(builder, sig.return_type, out)

    return AccI16(acc, c, coff, sc), codegen


@njit(inline="always", **DOT)
def _amx_tiles(M, kind):
    """Whether a launcher runs a product of M activation rows on the AMX tiles (the flag use_amx sets, read once).
    Every interleaved layout (kind) has them."""
    return AMX_CPU and M >= AMX_MIN_ROWS and amx_granted()


@njit(inline="always", **DOT)
def _amx_given(out, qs, kind):
    """In a worker: whether its launcher chose the AMX tiles, from the layout it passed: the activation rows as they
    are (qs has out's rows; pair layouts have half as many). Not the flag again: use_amx called from another thread
    between the launcher's read and the worker's cannot hand a worker a layout it does not expect."""
    return AMX_CPU and out.shape[0] >= AMX_MIN_ROWS and qs.shape[0] == out.shape[0]


@njit(inline="always", **DOT)
def _last_rows(q1, M, K, n):
    """The activation quants of the last M % n rows (q1: [M, K] flat, M >= n) at the start of n rows of their own: the
    AMX tiles' 16 (tile_load reads 16 rows) and the VNNI tiles' 4 (vnni4x2_step, vnni4x2_block); the padding rows'
    sums are computed and never stored. q1 itself where M is whole tiles of n (the
    callers read it only for a partial last tile)."""
    tail = M % n
    if tail == 0:  # whole tiles only: nothing reads it (and nothing to allocate a work item)
        return q1
    part = np.zeros_like(q1[: n * K])
    src = (M - tail) * K
    for i in range(tail * K):  # a plain loop, which LLVM makes a memcpy: the slice assignment ran ~1 byte a cycle
        part[i] = q1[src + i]
    return part


@njit(inline="always", **DOT)
def _unpack_32x16(kind, bsize, w, g0, g1, nb, off):
    """The AMX and VNNI tiles' weights for groups g0..g1-1 of a 32-value interleaved layout (Q4_0, Q4_1, Q5_0, Q8_0,
    IQ4_NL), nb blocks a row: (btiles, dws, mws). btiles: per pair of groups (16 rows; an odd last group as both
    halves) and block 512 bytes, row k the 4 codes of values 4k..4k + 3 of each of the 16 rows, minus `off` (the
    type's offset, _offset32: signed values; 0 for the codes as they are, _vnni_unsigned); dws / mws: the 16 rows' d
    (and Q4_1's m) of each block as float32."""
    rb = w.shape[1]
    npair = (g1 - g0 + 1) // 2
    btiles = _empty64(512 * nb * npair, np.int8)  # per pair of groups: 8 rows x 64 bytes per block
    dws, mws = _empty64(16 * nb * npair, np.float32), _empty64(16 * nb * npair, np.float32)
    for p in range(npair):
        g = g0 + 2 * p
        gb = min(g + 1, g1 - 1)  # an odd last group as both halves; only its 8 columns are stored
        bt, dt = 512 * nb * p, 64 * nb * p
        for b in range(nb):
            oa, ob = g * rb + b * bsize, gb * rb + b * bsize
            if kind == Q8_0:
                st_btile8(w, oa + 16, ob + 16, btiles, bt + 512 * b)
            elif kind == Q5_0:
                st_btile(codes5_z16(w, oa + 16, ob + 16), btiles, bt + 512 * b, off)
            elif kind == IQ4_NL:  # the code book + 128, minus its offset 128: the signed values
                st_btile(iq4_codes_z16(w, oa + 16, ob + 16), btiles, bt + 512 * b, off)
            else:
                c = 32 if kind == Q4_1 else 16
                st_btile(codes_z16(w, oa + c, ob + c), btiles, bt + 512 * b, off)
            st_z(dws, dt + 64 * b, ld_f16x16(w, oa, ob))
            if kind == Q4_1:
                st_z(mws, dt + 64 * b, ld_f16x16(w, oa + 16, ob + 16))
    return btiles, dws, mws


@njit(inline="always", **DOT)
def _rows_amx(kind, bsize, w, d, s, qs, sums, out, g0, g1):
    """_rows_x8 on the AMX tiles (section note): the codes of the work item's groups over the whole K unpacked once
    into B tiles (two groups, 16 rows, per tile; the launcher sizes the item so that they stay in L2, _x8_chunk),
    then every 16 activation rows through each pair's B tiles: one tdpbssd per block (two blocks in flight) and
    _group_x8_z16_one's FMAs per row."""
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    nb = K // 32
    npair = (g1 - g0 + 1) // 2
    btiles, dws, mws = _unpack_32x16(kind, bsize, w, g0, g1, nb, _offset32(kind))
    sums32 = _empty64(512, np.int32)  # two blocks' int32 sums, 16 x 16 each
    q1, d1, s1 = qs.reshape(-1), d.reshape(-1), s.reshape(-1)
    part = _last_rows(q1, M, K, 16)
    last = M * nb - 1
    tile_config(AMX_CONFIG)
    for m0 in range(0, M, 16):  # each 16 activation rows read once per work item, its pairs' B tiles from L2
        rows = min(16, M - m0)
        x, xo = (q1, m0 * K) if rows == 16 else (part, 0)
        for p in range(npair):
            g = g0 + 2 * p
            gb = min(g + 1, g1 - 1)
            bt, dt = 512 * nb * p, 64 * nb * p
            acc, accm = acc16_zero(), acc16_zero()
            for b in range(0, nb - 1, 2):
                tile_zero(0)
                tile_zero(3)
                tile_load(1, x, xo + 32 * b, K)
                tile_load(2, btiles, bt + 512 * b, 64)
                tile_load(4, x, xo + 32 * b + 32, K)
                tile_load(5, btiles, bt + 512 * b + 512, 64)
                tile_dpbssd(0, 1, 2)
                tile_dpbssd(3, 4, 5)
                tile_store(0, sums32, 0, 64)
                tile_store(3, sums32, 1024, 64)
                acc = acc16_sums(acc, sums32, 0, ld_f32z(dws, dt + 64 * b), d1, m0 * nb + b, nb, last)
                acc = acc16_sums(acc, sums32, 1024, ld_f32z(dws, dt + 64 * b + 64), d1, m0 * nb + b + 1, nb, last)
            if nb % 2:
                b = nb - 1
                tile_zero(0)
                tile_load(1, x, xo + 32 * b, K)
                tile_load(2, btiles, bt + 512 * b, 64)
                tile_dpbssd(0, 1, 2)
                tile_store(0, sums32, 0, 64)
                acc = acc16_sums(acc, sums32, 0, ld_f32z(dws, dt + 64 * b), d1, m0 * nb + b, nb, last)
            if kind == Q4_1:
                for b in range(nb):
                    accm = acc16_mins(accm, ld_f32z(mws, dt + 64 * b), s1, m0 * nb + b, nb, last)
            acc16_store(acc, accm, out, 4 * (m0 * N + 8 * g), 4 * N, rows, 16 if gb > g else 8)
    tile_release()


# ---- Q8_0 on the AMX tiles at 10-16 rows: the layout's code chunks are B tiles already ---------------------------
# A block of 8 interleaved Q8_0 rows (repack: their 8 d, then 8 chunks of 32 bytes, 4 codes of each row) holds its codes
# as signed bytes in exactly a B tile's layout for 8 columns (row k: values 4k..4k + 3 of each of the 8 rows), so a
# pair of groups' B tile of 16 columns is their chunks side by side (st_btile8, two 32-byte loads and one 64-byte store
# a row): no unpacking pass, which is what keeps _rows_amx off products of fewer than AMX_MIN_ROWS rows (its unpacked
# tiles would serve one activation tile there). Per block and pair of groups: the 16 activation rows' 32 quants, the
# staged codes, one tdpbssd into 16 x 16 int32 sums, stored, then _rows_amx's FMAs (acc16_sums: _group_x8_z16_one's
# float steps), so the same bits as every route. Only a product of one tile of rows takes it: AMX_Q8_0_MIN_ROWS to
# AMX_Q8_0_ROWS (16) rows (a batched decode step of 10-16 sequences; a tile of M < 16 rows is configured with M rows,
# _q8_0_tile_config); more rows would take a second activation tile. Measured before the staging (two tdpbssd of 8
# columns a block, read straight from the layout): Intel Xeon (AMX granted), 2 threads, the same product with the
# tiles on and off in turn in one process, min of 100 calls (against two pairs of groups at a time, _rows_zq): SmolLM2's
# output, 49,152 x 576, at 16 rows 1.18 against 1.60 ms, at 17 / 20 rows 2.14 / 3.20 against 1.57 / 2.89; Gemma3's
# 262,144 x 640 at 16 rows 10.97 against 10.80 ms (in a minute when one row took about as long); SmolLM2's batched
# step of 16 sequences (forward_batch, 10th percentile of 80 steps each, alternating) 23.07 against 23.47 ms.
# Each block of both groups is prefetched as _rows_zq prefetches it (_tile_prefetch: 12 KB ahead; a matrix of
# Z16_FAR_BYTES or more, decode's hint): without it, Gemma3's output at 16 rows read its 178 MB at about half the
# rate one row reads it. Intel Xeon (AMX), 2 threads, processes alternating, medians of 30 calls against one row's in
# the same process: 12.6-13.8 ms, 1.72-1.74x one row's, before; 8.7-9.6 ms, 1.31-1.45x, after; in Gemma3's batched
# step of 16 sequences (dev/step_profile.py, medians of 40 steps, three pairs) 12.3-14.1 -> 9.2-11.6 ms of the output
# product and 27.1-32.8 -> 23.7-30.2 ms a step. SmolLM2's output (30 MB) at 16 rows: 2.0-2.2 -> 1.5-1.9 ms.
# From 10 rows (tiles of M rows): the output product alone, tiles on / off in turn in one process (medians of 16-60
# calls, two or three runs), Gemma3's at 8 / 9 / 10 / 11 / 12 / 15 rows 0.96-1.31 / 0.92-0.99 / 0.86-0.95 / 0.86-0.91 /
# 0.73-0.76 / 0.80-0.84x the time of _rows_zq, SmolLM2's 1.09-1.10 / 1.12 / 0.99 / 0.83 / 0.97-1.02 / 0.83x; in
# Gemma3's batched step of 12 sequences (dev/step_profile.py, medians of 30 steps, three pairs of trees alternating)
# 8.6-11.0 -> 7.2-7.4 ms of the output product and 19.3-25.3 -> 17.7-18.0 ms a step.
# Pipelined (even and odd blocks on tiles of their own, each block's tile steps issued before the FMAs of the block
# before it): a tile store costs ~6 ns and the FMAs read its sums back through memory (dev/vnni_rates.c, part 3), so in
# order each block waited on the one before. The output product alone, in order / pipelined in turn in one process
# (medians of 40-60 calls, Intel Xeon with AMX, 2 threads): Gemma3's at 16 rows 0.92-1.00x the in-order time in four
# runs, at 12 rows 0.93-0.98x; SmolLM2's at 16 / 12 / 10 rows 0.93 / 0.89 / 0.88x. Then one tdpbssd a block instead of
# two: both groups' code chunks staged as one B tile of 16 columns (st_btile8), two blocks ahead in a ring of four,
# halving the tile stores, loads of codes and tdpbssd (staged just before its tile load, the load waited on the
# stores: 1.2-1.4x slower). Against the two-tile pipeline (medians of 30-60 calls): Gemma3 16 / 12 rows 0.93 / 0.89x
# and 0.94x (in L2: 256 groups, 0.94x), SmolLM2 16 / 12 rows 0.87 / 0.91x. Against _rows_zq (use_amx off) after its
# two-chain dots, medians of 40 calls: Gemma3 at 10 / 11 / 12 / 13 / 16 rows 0.98 / 0.99 / 0.80 / 0.94 / 0.89x,
# SmolLM2 0.82 / 0.96 / 0.94 / 0.84 / 0.80x; at 8-9 rows _rows_zq stays ahead (before its two chains, already
# 0.97-1.09x of these tiles' time).
AMX_Q8_0_ROWS = 16
AMX_Q8_0_MIN_ROWS = 10


@njit(inline="always", **DOT)
def _amx_q8_0_tiles(M):
    """Whether a worker runs a Q8_0 product of M activation rows (below AMX_MIN_ROWS, the activations as they are) on
    _rows_amx_q8_0 instead of _rows_zq: the flag use_amx sets, read here (both take the same arrays and give the same
    bits, so a flag flipped meanwhile changes only the route; on only where this process was granted the tiles)."""
    return AMX_CPU and AMX_Q8_0_MIN_ROWS <= M <= AMX_Q8_0_ROWS and amx_granted()


@njit(inline="always", **DOT)
def _q8_0_tile_config(M):
    """_rows_amx_q8_0's tiles, _rows_amx's (AMX_CONFIG: tmm0 / tmm3 an even / odd block's int32 sums, 16 rows x 16
    columns, group A's 8 then B's; tmm1 / tmm4 its activation quants; tmm2 / tmm5 its staged codes) for M (<= 16)
    activation rows: ldtilecfg's byte 48 + t, tile t's rows, set to M for the sums and the quants."""
    cfg = AMX_CONFIG.copy()
    for t in (0, 1, 3, 4):
        cfg[48 + t] = M
    return cfg


@njit(inline="always", **DOT)
def _q8_0_stage(w, nb, g0, g1, f, bt):
    """Stage block f % nb of the (f // nb)-th pair of groups from g0 (an odd last group as both halves; none past
    g1) as one B tile of 16 columns (st_btile8: row j group A's code chunk j, then B's) in slot f % 4 of bt."""
    rb = w.shape[1]
    g, b = g0 + 2 * (f // nb), f % nb
    if g < g1:
        o = b * 272 + 16
        st_btile8(w, g * rb + o, min(g + 1, g1 - 1) * rb + o, bt, 512 * (f % 4))


@njit(inline="always", **DOT)
def _rows_amx_q8_0(w, d, qs, out, g0, g1):
    """_rows_zq for Q8_0 and AMX_Q8_0_MIN_ROWS..16 activation rows on the AMX tiles (section note): per pair of groups
    (an odd last group as both halves, its 8 columns stored), block by block, one tdpbssd into 16 x 16 int32 sums
    against the block's codes of both groups staged two blocks ahead as one B tile (_q8_0_stage: a slot of a ring of
    four, so the tile load finds its bytes written long before, in L1), the sums to memory and _group_x8_z16_one's
    FMAs in 16 accumulators in registers (those of rows past M from the sums' zero rows, never stored). Pipelined:
    even and odd blocks take tiles and a sums buffer of their own, and each block's tile steps are issued before the
    FMAs of the block before it, which meanwhile read that block's sums; the FMAs still run in block order, so the
    same bits."""
    rb = w.shape[1]
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    nb = K // 32
    sums32 = _empty64(512, np.int32)  # an even block's 16 rows x 64 bytes (group A's 8 sums, then B's), an odd one's
    sums32[:] = 0  # the rows past M stay zero
    bt = _empty64(2048, np.int8)  # the ring of 4 staged B tiles, 8 rows x 64 bytes each
    q1, d1 = qs.reshape(-1), d.reshape(-1)
    last = M * nb - 1
    tile_config(_q8_0_tile_config(M))
    _q8_0_stage(w, nb, g0, g1, 0, bt)
    _q8_0_stage(w, nb, g0, g1, 1, bt)
    f = 0  # blocks staged or run so far, over every pair of this call
    for g in range(g0, g1, 2):
        gb = min(g + 1, g1 - 1)
        acc, accm = acc16_zero(), acc16_zero()
        for b in range(nb):
            oa, ob = g * rb + b * 272, gb * rb + b * 272
            _tile_prefetch(w, oa, 272)
            _tile_prefetch(w, ob, 272)
            _q8_0_stage(w, nb, g0, g1, f + 2, bt)
            if b % 2 == 0:  # this block's tiles (their numbers are literals: one set per parity)
                tile_zero(0)
                tile_load(1, q1, 32 * b, K)
                tile_load(2, bt, 512 * (f % 4), 64)
                tile_dpbssd(0, 1, 2)
                tile_store(0, sums32, 0, 64)
            else:
                tile_zero(3)
                tile_load(4, q1, 32 * b, K)
                tile_load(5, bt, 512 * (f % 4), 64)
                tile_dpbssd(3, 4, 5)
                tile_store(3, sums32, 1024, 64)
            if b > 0:  # then the block before's FMAs, from its parity's sums
                acc = acc16_sums(acc, sums32, 1024 * ((b - 1) % 2), ld_f16x16(w, oa - 272, ob - 272), d1, b - 1, nb,
                                 last)  # fmt: skip
            f += 1
        oa, ob = g * rb + (nb - 1) * 272, gb * rb + (nb - 1) * 272  # the last block's FMAs
        acc = acc16_sums(acc, sums32, 1024 * ((nb - 1) % 2), ld_f16x16(w, oa, ob), d1, nb - 1, nb, last)
        acc16_store(acc, accm, out, 4 * 8 * g, 4 * N, M, 16 if gb > g else 8)
    tile_release()


@njit(inline="always", **DOT)
def _unpack_k16(kind, w, g0, g1, nsb):
    """The AMX and VNNI tiles' weights for groups g0..g1-1 of a K-quant interleaved layout, nsb super-blocks a row:
    (btiles, scs). btiles: per pair of groups (16 rows; an odd last group as both halves) and super-block 4096 bytes,
    one B tile per scale group (32 values, Q6_K 16), row k of a tile the 4 codes of values 4k..4k + 3 of each of the
    16 rows as signed bytes (IQ4_XS the code book's values, Q6_K its codes minus 32, Q4_K / Q5_K the codes 0..31).
    scs: the 16 rows' integer scale of each scale group (int32)."""
    rb = w.shape[1]
    sbytes = _kx8_bytes(kind)
    ng = 16 if kind == Q6_K else 8
    npair = (g1 - g0 + 1) // 2
    btiles = _empty64(4096 * nsb * npair, np.int8)
    scs = _empty64(16 * ng * nsb * npair, np.int32)
    for p in range(npair):
        g = g0 + 2 * p
        gb = min(g + 1, g1 - 1)
        bt, st = 4096 * nsb * p, 64 * ng * nsb * p
        for b in range(nsb):
            oa, ob = g * rb + b * sbytes, gb * rb + b * sbytes
            if kind == Q4_K or kind == Q5_K:
                for jj in range(4):
                    for h in range(2):
                        t = bt + 4096 * b + 1024 * jj + 256 * h
                        if kind == Q5_K:  # a fifth-bit plane before each half's chunks
                            c = 160 + 320 * jj + 160 * h
                            st_btile_k(codes5_z16(w, oa + c, ob + c), btiles, t, 0)
                        else:
                            c = 160 + 256 * jj + 128 * h
                            st_btile_k(codes_z16(w, oa + c, ob + c), btiles, t, 0)
            elif kind == Q6_K:
                for h in range(2):
                    for c in range(8):
                        at = 144 + 768 * h + 32 * c
                        t = bt + 4096 * b + 2048 * h + 256 * (c // 4) + 64 * (c % 4)
                        st_btile6(w, oa + at, ob + at, btiles, t)
            else:  # IQ4_XS: the code book's values as signed bytes (iq4_codes_z16 gives them + 128)
                for sb in range(8):
                    c = 80 + 128 * sb
                    st_btile(iq4_codes_z16(w, oa + c, ob + c), btiles, bt + 4096 * b + 512 * sb, 128)
            so = 32 if _has_min(kind) else 16  # the scale pairs
            for sb in range(ng):
                sc = kscw_z16(w, oa + so + 16 * (sb // 2), ob + so + 16 * (sb // 2), sb % 2)
                st_z(scs, st + 64 * (ng * b + sb), sc)
    return btiles, scs


@njit(inline="always", **DOT)
def _k_row_step(kind, w, oa, ob, b32, bo, dx, dw, dmw, isums, acc, r, n):
    """A K-quant super-block's float steps for activation row r of a tile of n (_rowsk_amx's 16, _rowsk_vnni's 8),
    _group_k_z16_one's per lane: acc row r (the d terms) += float(row r of the int32 sums isums) * dw * dx; for Q4_K /
    Q5_K acc row n + r (the dmin terms) += float(the mins . the row's block sums at byte bo of b32) * dmw * -dx."""
    if _has_min(kind):
        _k_min_step(w, oa, ob, b32, bo, dx, dmw, acc, n + r)
    st_z(acc, 64 * r, fma_z(ld_f32z(acc, 64 * r), fcvt_z(ld_i32z(isums, 64 * r)), fscale_z(dw, dx)))


@njit(inline="always", **DOT)
def _k_min_step(w, oa, ob, b32, bo, dx, dmw, acc, r):
    """Q4_K / Q5_K: row r of acc += float(the mins . an activation row's block sums at byte bo of b32) * dmw * -dx
    (_k_row_step's dmin term)."""
    mn = kmin_z16(w, oa + 96, ob + 96, b32, bo)
    st_z(acc, 64 * r, fma_z(ld_f32z(acc, 64 * r), fcvt_z(mn), fscale_z(dmw, -dx)))


@njit(inline="always", **DOT)
def _rowsk_amx(kind, w, d, b16, b32, qs, out, g0, g1):
    """_rowsk_x8 on the AMX tiles for Q4_K, Q5_K, Q6_K and IQ4_XS: the work item's codes unpacked once into one B tile
    per pair of groups and scale group (32 values; Q6_K 16, with AMX_CONFIG16's shapes; IQ4_XS: the code book's signed
    values and Q6_K its codes minus 32, so no correction term is needed), sized by the launcher to stay in L2
    (_x8_chunk); per 16 activation rows, pair and super-block, one tdpbssd per scale group (two in flight), the sums
    times the groups' scales in int32 (rowk's integers: sum of scale x codes . quants), then _group_k_z16_one's FMAs
    (the d and, for Q4_K / Q5_K, the dmin terms, their accumulators in L1)."""
    rb = w.shape[1]
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    nsb, n32 = K // 256, b32.shape[1]
    sbytes = _kx8_bytes(kind)
    gs = 16 if kind == Q6_K else 32  # values per scale group and tile
    ng, tb = 256 // gs, 16 * gs  # scale groups per super-block, bytes per B tile
    npair = (g1 - g0 + 1) // 2
    btiles, scs = _unpack_k16(kind, w, g0, g1, nsb)
    sums32, isums = _empty64(512, np.int32), _empty64(256, np.int32)
    acc = _empty64(512, np.float32)  # per tile row: the d terms (rows 0-15), then the dmin terms (16-31)
    q1, d1 = qs.reshape(-1), d.reshape(-1)
    part = _last_rows(q1, M, K, 16)
    tile_config(AMX_CONFIG16 if kind == Q6_K else AMX_CONFIG)
    for m0 in range(0, M, 16):  # each 16 activation rows read once per work item, its pairs' B tiles from L2
        rows = min(16, M - m0)
        x, xo = (q1, m0 * K) if rows == 16 else (part, 0)
        for p in range(npair):
            g = g0 + 2 * p
            gb = min(g + 1, g1 - 1)
            bt, st = 4096 * nsb * p, 64 * ng * nsb * p
            for a in range(0, 2048, 64):
                st_z(acc, a, fzero_z())
            for b in range(nsb):
                isum = acc16i_zero()
                for k in range(ng // 2):  # scale groups 2k, 2k + 1
                    t, xk = bt + 4096 * b + 2 * tb * k, xo + 256 * b + 2 * gs * k
                    tile_zero(0)
                    tile_zero(3)
                    tile_load(1, x, xk, K)
                    tile_load(2, btiles, t, 64)
                    tile_load(4, x, xk + gs, K)
                    tile_load(5, btiles, t + tb, 64)
                    tile_dpbssd(0, 1, 2)
                    tile_dpbssd(3, 4, 5)
                    tile_store(0, sums32, 0, 64)
                    tile_store(3, sums32, 1024, 64)
                    isum = acc16i_madd(isum, sums32, 0, ld_i32z(scs, st + 64 * (ng * b + 2 * k)))
                    isum = acc16i_madd(isum, sums32, 1024, ld_i32z(scs, st + 64 * (ng * b + 2 * k + 1)))
                acc16i_store(isum, isums, 0)
                oa, ob = g * rb + b * sbytes, gb * rb + b * sbytes
                dw = ld_f16x16(w, oa, ob)
                dmw = ld_f16x16(w, oa + 16, ob + 16) if _has_min(kind) else dw  # dmin (Q4_K, Q5_K)
                for r in range(16):
                    m = min(m0 + r, M - 1)
                    _k_row_step(
                        kind, w, oa, ob, b32, 4 * (m * n32 + 8 * b), d1[m * nsb + b], dw, dmw, isums, acc, r, 16
                    )
            for r in range(rows):
                v = fadd_z(ld_f32z(acc, 64 * r), ld_f32z(acc, 64 * (16 + r)))
                if gb > g:
                    st_z(out, 4 * ((m0 + r) * N + 8 * g), v)
                else:
                    st_lo_f32x8(out, 4 * ((m0 + r) * N + 8 * g), v)
    tile_release()


# ---- VNNI tiles: 4-8 activation rows x 16-32 weight rows from unpacked codes (AVX-512 VNNI without AMX) ----------
# On AVX-512 VNNI CPUs without AMX, products of VNNI_MIN_ROWS (the 32-value types: VNNI_MIN_ROWS_32) or more
# activation rows take the AMX route's unpacked weights (_unpack_k16 for Q4_K, Q5_K, Q6_K, IQ4_XS; _unpack_32x16 for
# Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL: a work item's codes once as signed bytes, sized to stay in L2) through vpdpbusd
# instead of tdpbssd. Row k of a scale group's or block's tile (the 4 codes of values 4k.. of 16 weight rows) is one
# 64-byte vector: per tile row one load, two tiles (32 weight rows) against 4 activation rows' 4 quants + 128 (broadcast
# loads, each feeding both tiles' vpdpbusd), 8 int32 chains in registers (vnni4x2_step, vnni4x2_block). A C model of the
# K-quant loop ran 2.5-2.7 ns per 16 rows x 32 values x one activation row that way against 3.3 with one tile against
# 8 rows (the same vpdpbusd and vpmulld, twice the broadcast loads).
# vpdpbusd takes the unsigned operand first, so the activations come as quant + 128 (Q8_K's qu; _plus128 for Q8_1)
# and the 128 comes off where the sums start: at -128 x the codes' sum per weight row (times the scales for a K-quant
# super-block: vnni_wneg, at unpack). The integers are then the AMX route's and the float steps _rowsk_amx's /
# _rows_amx's, so the same bits as every route. The inner loop has no decoding and no loads or stores of its sums:
# per 32 values, activation row and 16 weight rows 8 vpdpbusd and a vpmulld (2 uops; the K-quants' scales) or a
# convert, multiply and FMA (the 32-value types), where the pair tiles spend about as many port-0 operations but also
# decode and keep their lanes in L1. llama.cpp's ggml-cpu/tiled kernels take the same route (codes unpacked to bytes,
# 8 weight rows x 16 activation rows a band). A C model of the K-quant loop with one tile against 8 rows (one thread,
# 8,960 x 1,536 at 256 rows, work items of 256 weight rows) ran 3.35 ns per 16 rows x 32 values x one activation row,
# against 5.3 for the pair tiles' whole product. CPUs with AMX take the VNNI tiles only below AMX_MIN_ROWS rows (the
# K-quants from 16); from there the AMX tiles, or, refused them, the K-quants' pair tiles (the route follows from the
# CPU and the row count alone, never from the AMX flag, so a launcher and its workers always agree on it) and the
# 32-value types' _rows_zq (which takes the AMX tiles' arrays: its workers read the flag again, _amx_given_32).
# -----------------------------------------------------------------------------------------------------------------

VNNI_TILES = HAS_ZMM
# activation rows from which products take the VNNI tiles (two tiles against 4 rows). Ice Lake, 2 threads, in-process
# alternating, us (pair tiles or, for the 32-value types, rows of 8 -> VNNI tiles): Q4_K 1,536 x 1,536 at 8 / 12 / 16
# / 24 rows 143 / 190 / 235 / 324 -> 158 / 192 / 225 / 269, 8,960 x 1,536 at 8 / 16 rows 642 / 1,163 -> 708 / 1,031,
# Q6_K 1,536 x 8,960 at 16 rows 1,387 -> 1,094; Q8_0 2,048 x 2,048 at 16 / 32 / 64 rows 350 / 619 / 1,808 -> 353 / 551
# / 1,333, Q4_1 1,536 x 576 at 16 rows 97 -> 108, Q8_0 49,152 x 576 (SmolLM2's output) 2,236 -> 2,598
# (AMD EPYC Zen 4 VM, 2026-12-07, 2 threads, SmolLM2's 16-row step at n_ctx 4096, `dev/step_profile.py` on a copy
# with VNNI_MIN_ROWS_32 = 16, 2 x 2 alternating processes, us a call: Q4_1 3,072 x 576 110-116 -> 163-167, 576 x
# 1,536 64-65 -> 79-84, Q8_0 49,152 x 576 1,585-1,644 -> 2,691-2,799; the step 13.8-14.7 -> 18.2-18.8 ms)
VNNI_MIN_ROWS = 16  # the K-quants
VNNI_MIN_ROWS_32 = 32  # Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL
AccI8 = types.UniTuple(I32x16, 8)  # int32 sums of 4 activation rows x 2 tiles of 16 weight rows, in registers
Acc8 = types.UniTuple(F32x16, 8)  # float32 accumulators: 4 rows x 2 tiles (VNNI tiles) or 8 rows x 1 (Q4_1's m terms)
acc8_zero, acc8_mins, acc8_put = _acc_zero(Acc8), _acc_mins(Acc8), _acc_put(Acc8)
VNNI_ONES = np.ones(16, np.int32)  # a block's scale for vnni_wneg: the 32-value types scale in float


@njit(inline="always", **DOT)
def _vnni_tiles(M, kind):
    """Whether a launcher runs a product of M activation rows on the VNNI tiles (the K-quants and the 32-value types):
    from VNNI_MIN_ROWS (the 32-value types: VNNI_MIN_ROWS_32) rows on, and with AMX below AMX_MIN_ROWS only."""
    if not VNNI_TILES or (AMX_CPU and M >= AMX_MIN_ROWS):
        return False
    if kind == Q4_K or kind == Q5_K or kind == Q6_K or kind == IQ4_XS:
        return M >= VNNI_MIN_ROWS
    return _x8_32(kind) and M >= VNNI_MIN_ROWS_32


@njit(inline="always", **DOT)
def _vnni_unsigned(kind):
    """Q4_1, whose codes are unsigned bytes with no offset (0..15): on the VNNI tiles they stay as they are, vpdpbusd's
    unsigned operand against the quants as they are (vnni4x2_block_u). The others meet the quants + 128 (_plus128)
    with their codes signed: Q4_0's and Q5_0's offset taken off the codes (the unpacking pass), not off every row's
    sums (a broadcast and a copy a row and block: Gemma3's Q5_0 products at 256 rows ran 1.05-1.09x slower so)."""
    return kind == Q4_1


@njit(inline="always", **DOT)
def _x8_32(kind):
    """The 32-value types with interleaved layouts (_rows_x8, _rows_iq4_nl_x8)."""
    return kind == Q4_0 or kind == Q4_1 or kind == Q5_0 or kind == Q8_0 or kind == IQ4_NL


@njit(inline="always", **DOT)
def _vnni_given(out, qs, kind):
    """In a worker: whether its launcher chose the VNNI tiles, from the layout it passed (the activation rows as they
    are, not as pairs). Never beside _amx_given: with AMX, _vnni_tiles stops below AMX_MIN_ROWS, where those start."""
    return _vnni_tiles(out.shape[0], kind) and qs.shape[0] == out.shape[0]


@intrinsic
def acc8i_splat(typingctx, va, vb):
    """4 copies of va, then 4 of vb: where 4 activation rows' sums of a super-block start for two tiles."""
    if va != I32x16 or vb != I32x16:
        return None

    def codegen(context, builder, sig, args):
        return context.make_tuple(builder, sig.return_type, [args[0]] * 4 + [args[1]] * 4)

    return AccI8(va, vb), codegen


def _dpbusd_4x2(builder, raw, tiles, rows, n4, codes_unsigned=False):
    """The VNNI tiles' inner loop (codegen): for j < n4, tile row j of both tiles (64 bytes at 64 j of each pointer
    in `tiles`) against activation row r's 4 quants + 128 at byte 4 j of rows[r] (broadcast once, fed to both tiles'
    vpdpbusd): raw[h 4 + r] updated in place, r = 0..3, h = 0, 1. codes_unsigned: the tiles hold unsigned codes and
    the rows the quants as they are (vpdpbusd's unsigned and signed operands the other way round)."""
    for j in range(n4):
        wv = []
        for pt in tiles:
            at = builder.gep(pt, [ir.Constant(_i64, 64 * j)])
            wv.append(builder.load(builder.bitcast(at, _v16i32.as_pointer()), align=1))
        for r in range(4):
            at = builder.bitcast(builder.gep(rows[r], [ir.Constant(_i64, 4 * j)]), _i32.as_pointer())
            xv = _bsplat(builder, _v16i32, builder.load(at, align=1))
            for h in range(2):
                a, b = (wv[h], xv) if codes_unsigned else (xv, wv[h])
                raw[4 * h + r] = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", raw[4 * h + r], a, b)


def _tiles_and_rows(context, builder, sig, args):
    """Codegen for the VNNI tiles' intrinsics, whose args[1:7] are bt, ta, tb, x, xoff, xstride: the pointers to both
    tiles (bytes ta and tb of bt) and to activation rows r = 0..3 (byte xoff + r xstride of x)."""
    tiles = [_ptr(context, builder, sig.args[1], args[1], sig.args[k], args[k], _i8) for k in (2, 3)]
    px = _ptr(context, builder, sig.args[4], args[4], sig.args[5], args[5], _i8)
    xs = context.cast(builder, args[6], sig.args[6], types.intp)
    return tiles, [builder.gep(px, [builder.mul(xs, ir.Constant(_i64, r))]) for r in range(4)]


def _fma_4x2(builder, acc, sums, dws, dx):
    """acc[h 4 + r] + float(sums[h 4 + r]) * (dws[h] * dx[r]) for r = 0..3, h = 0, 1 (codegen; acc an Acc8 value,
    sums 8 int32 vectors, dx 4 broadcast vectors): the d-term FMA of 4 activation rows and two tiles."""
    out = []
    for r in range(8):
        f = builder.sitofp(sums[r], _v16f32)
        scale = builder.fmul(dws[r // 4], dx[r % 4])
        out.append(_z_call(builder, "llvm.fma.v16f32", f, scale, builder.extract_value(acc, r)))
    return out


@intrinsic
def acc4x2_isums(typingctx, acc, isum, dwa, dwb, dx, i0, stride, last):
    """acc[h 4 + r] += float(isum[h 4 + r]) * (dw_h * dx[i0 + r stride], the index clamped to last), r = 0..3, for the
    tiles h = 0, 1 (dw_0 = dwa, dw_1 = dwb): _k_row_step's d-term FMA for 4 activation rows and two tiles, their int32
    sums and float accumulators in registers."""
    if acc != Acc8 or isum != AccI8 or dwa != F32x16 or dwb != F32x16:
        return None

    def codegen(context, builder, sig, args):
        sums = [builder.extract_value(args[1], r) for r in range(8)]
        out = _fma_4x2(builder, args[0], sums, args[2:4], _acc_rows(context, builder, sig, args, 4, 4))
        return context.make_tuple(builder, sig.return_type, out)

    return Acc8(acc, isum, dwa, dwb, dx, i0, stride, last), codegen


def _vnni4x2(n4: int):
    """Intrinsic (acc, bt, ta, tb, x, xoff, xstride, sca, scb) -> acc[h 4 + r] + sc_h * (the tile of n4 rows at byte t_h
    of bt . activation row r's n4 x 4 quants + 128 at byte xoff + r xstride of x), r = 0..3, tiles h = 0, 1 (t_0 = ta,
    sc_0 = sca; t_1 = tb, sc_1 = scb), int32 lanes (one per weight row): n4 vpdpbusd a row and tile in 8 chains, each
    broadcast quant feeding both tiles, then a vpmulld by each tile's 16 scales."""

    @intrinsic
    def step(typingctx, acc, bt, ta, tb, x, xoff, xstride, sca, scb):
        if acc != AccI8 or not _is_ptr_args(bt, ta) or not _is_ptr_args(x, xoff) or sca != I32x16 or scb != I32x16:
            return None
        if not isinstance(tb, types.Integer) or not isinstance(xstride, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            tiles, rows = _tiles_and_rows(context, builder, sig, args)
            raw = [_splat(_v16i32, 0)] * 8
            _dpbusd_4x2(builder, raw, tiles, rows, n4)
            out = [
                builder.add(builder.extract_value(args[0], r), builder.mul(raw[r], args[7 + r // 4])) for r in range(8)
            ]
            return context.make_tuple(builder, sig.return_type, out)

        return AccI8(acc, bt, ta, tb, x, xoff, xstride, sca, scb), codegen

    return step


vnni4x2_step, vnni4x2_step16 = _vnni4x2(8), _vnni4x2(4)  # 32-value scale groups; Q6_K's 16-value ones


def _vnni_wneg(n4: int):
    """Intrinsic (acc, bt, toff, sc) -> acc - 128 sc (sum of each weight row's codes in the tile of n4 rows at byte
    toff of bt): one scale group's share of the +128 the activations carry into vnni4x2_step."""

    @intrinsic
    def wneg(typingctx, acc, bt, toff, sc):
        if acc != I32x16 or not _is_ptr_args(bt, toff) or sc != I32x16:
            return None

        def codegen(context, builder, sig, args):
            pb = _ptr(context, builder, sig.args[1], args[1], sig.args[2], args[2], _i8)
            ones = builder.bitcast(_splat(ir.VectorType(_i8, 64), 1), _v16i32)
            s = _splat(_v16i32, 0)
            for j in range(n4):
                tile = builder.bitcast(builder.gep(pb, [ir.Constant(_i64, 64 * j)]), _v16i32.as_pointer())
                s = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", s, ones, builder.load(tile, align=1))
            return builder.sub(args[0], builder.shl(builder.mul(s, args[3]), _splat(_v16i32, 7)))

        return I32x16(acc, bt, toff, sc), codegen

    return wneg


vnni_wneg, vnni_wneg16 = _vnni_wneg(8), _vnni_wneg(4)


@njit(inline="always", **DOT)
def _put_4x2(sums, out, m0, rows, g0, g1, p, pb):
    """The VNNI tiles' results for activation rows m0..m0 + rows - 1 and the pairs of groups p, pb of the work item
    g0..g1 (pb == p: one pair): row h 4 + r of sums (the d terms of tile h, activation row r) + row 8 + h 4 + r (its
    m / dmin terms) to out, 16 columns a pair, an odd last group's 8."""
    N = out.shape[1]
    for h in range(2 if pb > p else 1):
        g = g0 + 2 * (p + h)
        for r in range(rows):
            v = fadd_z(ld_f32z(sums, 64 * (4 * h + r)), ld_f32z(sums, 64 * (8 + 4 * h + r)))
            if g + 1 < g1:
                st_z(out, 4 * ((m0 + r) * N + 8 * g), v)
            else:  # an odd last group: its 8 columns
                st_lo_f32x8(out, 4 * ((m0 + r) * N + 8 * g), v)


@njit(inline="always", **DOT)
def _rowsk_vnni(kind, w, qu, d, b32, out, g0, g1):
    """_rowsk_x8 on the VNNI tiles (section note): the work item's codes unpacked once (_unpack_k16) with each
    super-block's -128 correction per weight row (wneg); per 4 activation rows, two pairs of groups (32 weight rows; an
    odd last pair as both, stored once) and super-block, the 4 rows' integer sums for both in registers (vnni4x2_step
    per scale group: each broadcast quant feeds two vpdpbusd), then _rowsk_amx's float steps per row: the d terms on
    the sums in registers (acc4x2_isums, the accumulators in registers over the super-blocks), for Q4_K / Q5_K the dmin
    terms in L1 (_k_min_step). Ice Lake, one thread, IQ4_XS 8,192 x 2,048 at 512 rows, in-process alternating: 8
    activation rows against one pair with the d terms through L1 60.5-70.2 ms, the d terms in registers 53.5-55.5 ms
    (a C model of it: 3.3 ns per 16 weight rows x 32 values x one activation row), two pairs and 4 rows 44.2-48.2 ms
    (C: 2.5-2.7 ns); two threads, 256 rows: IQ4_XS 14.4 -> 11.6 ms, Q4_K 17.2 -> 14.4, Q6_K 14.9 -> 13.5."""
    rb = w.shape[1]
    M, K = qu.shape
    nsb, n32 = K // 256, b32.shape[1]
    sbytes = _kx8_bytes(kind)
    gs = 16 if kind == Q6_K else 32  # values per scale group and tile
    ng, tb = 256 // gs, 16 * gs  # scale groups per super-block, bytes per tile
    npair = (g1 - g0 + 1) // 2
    btiles, scs = _unpack_k16(kind, w, g0, g1, nsb)
    wneg = _empty64(16 * nsb * npair, np.int32)
    for p in range(npair):
        for b in range(nsb):
            v = izero_z()
            for s in range(ng):
                t, sc = 4096 * (nsb * p + b) + tb * s, ld_i32z(scs, 64 * (ng * (nsb * p + b) + s))
                v = vnni_wneg16(v, btiles, t, sc) if kind == Q6_K else vnni_wneg(v, btiles, t, sc)
            st_z(wneg, 64 * (nsb * p + b), v)
    # per row h 4 + r (tile h, activation row r): the d terms (rows 0-7), then the dmin terms (8-15; zero but for
    # Q4_K / Q5_K, so every kind's rows are d terms + dmin terms, as on the other routes)
    acc = _empty64(256, np.float32)
    for a in range(512, 1024, 64):
        st_z(acc, a, fzero_z())
    q1, d1 = qu.reshape(-1), d.reshape(-1)
    part = _last_rows(q1, M, K, 4)
    for m0 in range(0, M, 4):  # each 4 activation rows read once per work item, its pairs' tiles from L2
        rows = min(4, M - m0)
        x, xo = (q1, m0 * K) if rows == 4 else (part, 0)
        for p in range(0, npair, 2):
            pb = min(p + 1, npair - 1)
            ga, gb = g0 + 2 * p, g0 + 2 * pb  # each tile's first group
            ga1, gb1 = min(ga + 1, g1 - 1), min(gb + 1, g1 - 1)  # and second (an odd last group as both halves)
            if _has_min(kind):
                for a in range(512, 1024, 64):
                    st_z(acc, a, fzero_z())
            facc = acc8_zero()
            for b in range(nsb):
                isum = acc8i_splat(ld_i32z(wneg, 64 * (nsb * p + b)), ld_i32z(wneg, 64 * (nsb * pb + b)))
                for s in range(ng):
                    ta, tb2, xs = 4096 * (nsb * p + b) + tb * s, 4096 * (nsb * pb + b) + tb * s, xo + 256 * b + gs * s
                    sca = ld_i32z(scs, 64 * (ng * (nsb * p + b) + s))
                    scb = ld_i32z(scs, 64 * (ng * (nsb * pb + b) + s))
                    if kind == Q6_K:
                        isum = vnni4x2_step16(isum, btiles, ta, tb2, x, xs, K, sca, scb)
                    else:
                        isum = vnni4x2_step(isum, btiles, ta, tb2, x, xs, K, sca, scb)
                oa, oa1, ob, ob1 = (
                    ga * rb + b * sbytes,
                    ga1 * rb + b * sbytes,
                    gb * rb + b * sbytes,
                    gb1 * rb + b * sbytes,
                )
                dwa, dwb = ld_f16x16(w, oa, oa1), ld_f16x16(w, ob, ob1)
                facc = acc4x2_isums(facc, isum, dwa, dwb, d1, m0 * nsb + b, nsb, (M - 1) * nsb + b)
                if _has_min(kind):
                    dma, dmb = ld_f16x16(w, oa + 16, oa1 + 16), ld_f16x16(w, ob + 16, ob1 + 16)
                    for r in range(rows):
                        m = m0 + r
                        bo, dx = 4 * (m * n32 + 8 * b), d1[m * nsb + b]
                        _k_min_step(w, oa, oa1, b32, bo, dx, dma, acc, 8 + r)
                        _k_min_step(w, ob, ob1, b32, bo, dx, dmb, acc, 12 + r)
            acc8_put(facc, acc, 0)
            _put_4x2(acc, out, m0, rows, g0, g1, p, pb)


# flip's 64-byte form: each byte ^ 0x80 (a signed byte q as the unsigned byte q + 128), on 16 int32 lanes
flip_z = _lanewise_z(lambda b, v: b.xor(v, _splat(_v16i32, -0x7F7F7F80)), I32x16, I32x16)
PLUS128_CHUNK = 1 << 18  # bytes of quants per work item of _plus128 (a prompt pass of a small model: one item)


@njit(inline="always", **DOT_PARALLEL)
def _plus128(qs):
    """The activation quants qs (int8 [M, K]) + 128 as bytes (the same type): the VNNI tiles' unsigned operand. 64
    bytes a step: written as a loop over uint64 words, LLVM left it scalar (Ice Lake, one thread, 256 x 576 quants 52
    us, 2.8 GB/s)."""
    xu = np.empty_like(qs)
    a, b = qs.reshape(-1), xu.reshape(-1)
    n = a.shape[0]
    for c in prange((n + PLUS128_CHUNK - 1) // PLUS128_CHUNK):
        lo, hi = c * PLUS128_CHUNK, min(n, c * PLUS128_CHUNK + PLUS128_CHUNK)
        j = lo
        while j + 64 <= hi:
            st_z(b, j, flip_z(ld_i32z(a, j)))
            j += 64
        for i in range(j, hi):
            b[i] = a[i] ^ np.int8(-128)
    return xu


@intrinsic
def vnni4x2_block(typingctx, acc, bt, ta, tb, x, xoff, xstride, starta, startb, dwa, dwb, dx, i0, stride, last):
    """One 32-value block for 4 activation rows and two tiles (h = 0: ta, starta, dwa; h = 1: tb, startb, dwb): the
    int32 sums start at start_h (the block's -128 sum of codes per weight row), 8 vpdpbusd a row and tile (the tile at
    byte t_h of bt against row r's quants + 128 at byte xoff + r xstride of x, each broadcast feeding both tiles), then
    acc[h 4 + r] += float(sums) * (dw_h * dx[i0 + r stride]): acc16_sums's FMA, 4 rows x 2 tiles."""
    if acc != Acc8 or not _is_ptr_args(bt, ta) or not _is_ptr_args(x, xoff) or not isinstance(tb, types.Integer):
        return None
    if starta != I32x16 or startb != I32x16 or dwa != F32x16 or dwb != F32x16 or not isinstance(xstride, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        tiles, rows = _tiles_and_rows(context, builder, sig, args)
        raw = [args[7]] * 4 + [args[8]] * 4
        _dpbusd_4x2(builder, raw, tiles, rows, 8)
        out = _fma_4x2(builder, args[0], raw, args[9:11], _acc_rows(context, builder, sig, args, 11, 4))
        return context.make_tuple(builder, sig.return_type, out)

    sig = Acc8(acc, bt, ta, tb, x, xoff, xstride, starta, startb, dwa, dwb, dx, i0, stride, last)
    return sig, codegen


@intrinsic
def vnni4x2_block_u(typingctx, acc, bt, ta, tb, x, xoff, xstride, dwa, dwb, dx, i0, stride, last):
    """vnni4x2_block for Q4_1 (_vnni_unsigned): its codes as they are, vpdpbusd's unsigned operand, against the quants
    as they are at byte xoff + r xstride of x, the int32 sums starting from zero: the same integers as the signed
    codes against the quants + 128 from their correction; then the same FMAs."""
    if acc != Acc8 or not _is_ptr_args(bt, ta) or not _is_ptr_args(x, xoff) or not isinstance(tb, types.Integer):
        return None
    if dwa != F32x16 or dwb != F32x16 or not isinstance(xstride, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        tiles, rows = _tiles_and_rows(context, builder, sig, args)
        raw = [_splat(_v16i32, 0)] * 8
        _dpbusd_4x2(builder, raw, tiles, rows, 8, codes_unsigned=True)
        out = _fma_4x2(builder, args[0], raw, args[7:9], _acc_rows(context, builder, sig, args, 9, 4))
        return context.make_tuple(builder, sig.return_type, out)

    return Acc8(acc, bt, ta, tb, x, xoff, xstride, dwa, dwb, dx, i0, stride, last), codegen


@intrinsic
def acc4x2_mins(typingctx, acc, mwa, mwb, sx, i0, stride, last):
    """acc[h 4 + r] + mw_h * sx[i0 + r stride] for r = 0..3, tiles h = 0, 1 (mw_0 = mwa, mw_1 = mwb): Q4_1's m-term
    FMA for 4 rows x 2 tiles."""
    if acc != Acc8 or mwa != F32x16 or mwb != F32x16:
        return None

    def codegen(context, builder, sig, args):
        xs = _acc_rows(context, builder, sig, args, 3, 4)
        out = [
            _z_call(builder, "llvm.fma.v16f32", args[1 + r // 4], xs[r % 4], builder.extract_value(args[0], r))
            for r in range(8)
        ]
        return context.make_tuple(builder, sig.return_type, out)

    return Acc8(acc, mwa, mwb, sx, i0, stride, last), codegen


@njit(inline="always", **DOT)
def _rows_vnni(kind, bsize, w, d, s, xu, out, g0, g1):
    """_rows_x8 on the VNNI tiles (section note) for Q4_0, Q4_1, Q5_0, Q8_0 and IQ4_NL, xu the activation quants + 128
    (_plus128): the work item's codes unpacked once (_unpack_32x16) with each block's -128 correction per weight row;
    per 4 activation rows and two pairs of groups (32 weight rows), per block 8 vpdpbusd a row and pair from that
    correction, each broadcast quant feeding both (vnni4x2_block), then _rows_amx's FMAs (acc16_sums, acc16_mins), the
    accumulators in registers. Q4_1 (_vnni_unsigned): xu the quants as they are and the codes unpacked as they are,
    vpdpbusd's unsigned operand, the sums starting from zero (vnni4x2_block_u): no +128 pass, no corrections per
    weight row, no copies of them per row and block."""
    M, K = xu.shape
    nb = K // 32
    npair = (g1 - g0 + 1) // 2
    unsigned = _vnni_unsigned(kind)
    btiles, dws, mws = _unpack_32x16(kind, bsize, w, g0, g1, nb, 0 if unsigned else _offset32(kind))
    one = ld_i32z(VNNI_ONES, 0)
    n_neg = 0 if unsigned else nb * npair  # the -128 corrections, one per pair of groups and block (none for Q4_1)
    wneg = _empty64(16 * max(n_neg, 1), np.int32)
    for t in range(n_neg):
        st_z(wneg, 64 * t, vnni_wneg(izero_z(), btiles, 512 * t, one))
    q1, d1, s1 = xu.reshape(-1), d.reshape(-1), s.reshape(-1)
    part = _last_rows(q1, M, K, 4)
    last = M * nb - 1
    sums = _empty64(256, np.float32)  # per row h 4 + r (tile h, activation row r): the d terms, then the m terms
    for m0 in range(0, M, 4):  # each 4 activation rows read once per work item, its pairs' tiles from L2
        rows = min(4, M - m0)
        x, xo = (q1, m0 * K) if rows == 4 else (part, 0)
        for p in range(0, npair, 2):
            pb = min(p + 1, npair - 1)  # an odd last pair as both, stored once
            acc, accm = acc8_zero(), acc8_zero()
            for b in range(nb):
                ta, tb, da, db = 512 * (nb * p + b), 512 * (nb * pb + b), 64 * (nb * p + b), 64 * (nb * pb + b)
                dwa, dwb = ld_f32z(dws, da), ld_f32z(dws, db)
                i = m0 * nb + b
                if unsigned:
                    acc = vnni4x2_block_u(acc, btiles, ta, tb, x, xo + 32 * b, K, dwa, dwb, d1, i, nb, last)
                else:
                    sa, sb = ld_i32z(wneg, da), ld_i32z(wneg, db)
                    acc = vnni4x2_block(acc, btiles, ta, tb, x, xo + 32 * b, K, sa, sb, dwa, dwb, d1, i, nb, last)
            if kind == Q4_1:
                for b in range(nb):
                    mwa, mwb = ld_f32z(mws, 64 * (nb * p + b)), ld_f32z(mws, 64 * (nb * pb + b))
                    accm = acc4x2_mins(accm, mwa, mwb, s1, m0 * nb + b, nb, last)
            acc8_put(acc, sums, 0)
            acc8_put(accm, sums, 512)
            _put_4x2(sums, out, m0, rows, g0, g1, p, pb)


# ---- Two pairs of groups on decode's vectors: batched decode of the 32-value types ------------------------------
# From Z8_MIN_ROWS activation rows up to the VNNI / AMX tiles' minimum (a server's batched decode steps, short
# prompts), the 32-value types (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL) take decode's 16-row code vectors (codes_z16,
# codes5_z16, iq4_codes_z16, codes8_z16: two groups of 8 interleaved rows, lane = weight row, unsigned codes; no
# unpacking pass), two pairs of groups (32 weight rows) at a time, block by block (_rows_zq): per block both pairs'
# codes decoded into registers, then for every activation row 8 broadcast quads of its quants, each feeding both pairs'
# vpdpbusd, from -offset x the row's block sum, then the d-term FMAs, the row's accumulators waiting in L1 between
# blocks (a load and a store a row, pair and block); Q4_1's m terms follow the blocks, 8 rows at a time in registers.
# Each row takes _group_x8_z16_one's integer and float steps in the same order, so the same bits as decode and every
# other route. Why two pairs: on this Ice Lake a vpdpbusd that needs a load of its own (a broadcast memory operand, or a
# vpbroadcastd in front) issues at most one a cycle, two vpdpbusd on one broadcast two a cycle (dev/vnni_rates.c: 0.32
# against 0.19-0.20 ns each); the rows of 8 this replaces (8 activation rows x one pair, the accumulators in registers,
# one broadcast a vpdpbusd) ran at the first rate. The pair tiles, which take fewer rows, put 2 activation rows x 8
# weight rows in a vector and keep their accumulators in L1. Ice Lake, 1 thread, the same product repeated, min of
# alternating processes (ns per 16 weight rows x 32 values x 1 row): Q4_1 3,072 x 576 at 16 / 8 rows 4.5-4.9 / 5.3-7.7
# -> 3.6-3.7 / 4.2, Q4_1 576 x 1,536 at 16 rows 4.7 -> 3.6, Q8_0 1,536 x 576 4.6-5.3 -> 3.8-4.5; Q8_0 262,144 x 640
# (Gemma3's output) at 16 rows on 2 threads 5.0-7.8 -> 4.5. A C model of the loop (dev/vnni_rates.c) runs at 3.4-3.6 ns
# in L2, 3.0-3.1 in L1; with the m terms as a second read-modify-write per row 3.9-4.6.
# -----------------------------------------------------------------------------------------------------------------

# activation rows from which the rows of 8 (now two pairs at a time) take a product. Ice Lake, 2 threads, alternating
# processes, in Gemma3's and SmolLM2's batched steps (dev/step_profile.py): Q4_1 1,536 x 576 at 8 / 16 rows 3.40-3.38 /
# 6.70-6.82 -> 3.03-3.10 / 5.05-5.09 ms a step, Q5_0 2,048 x 640 at 16 rows 7.64-7.73 -> 4.60-5.46, Q8_0 262,144 x 640
# at 8 rows 9.66-9.73 -> 9.02-9.30; products alone at 32 / 64 rows 10-30% faster (commit notes). From 2 rows on too,
# where the pair tiles took them: Ice Lake VM, 2 threads, the two launchers called in turns on the same arrays (medians
# of 300 pairs), every 32-value product of SmolLM2 and Gemma3 at 2-7 rows 1.07-1.58x faster (Q4_1 3,072 x 576 at 5 / 7
# rows 93 / 112 -> 59 / 71 us, Gemma3's Q8_0 262,144 x 640 output at 2 / 6 rows 9.06 / 9.86 -> 7.00 / 8.08 ms); their
# batched steps (forward_batch at 64 positions, the products' kernels swapped in turns, medians of 15 x 8 steps) 1.05-
# 1.12x (SmolLM2, 2-7 rows) and 1.11-1.18x (Gemma3, 2-6 rows) faster, the same bits. At 8-31 rows the pair tiles ran
# 0.68-0.86x as fast as these. (Not measured on AMD Zen 4.)
Z8_MIN_ROWS = 2
Z8_MAX_ROWS = VNNI_MIN_ROWS_32  # from here the VNNI tiles (with AMX: the AMX tiles, AMX_MIN_ROWS) take the product


@njit(inline="always", **DOT)
def _z8_tiles(M, kind):
    """Whether a launcher runs a product of M activation rows of a 32-value type on two pairs of groups at a time
    (_rows_zq), passing the activations as they are: from Z8_MIN_ROWS rows up to the VNNI / AMX tiles' minimum, and on
    a CPU with AMX whose tiles are off (not granted, or use_amx(False)) above it too."""
    if not (HAS_ZMM and _x8_32(kind) and M >= Z8_MIN_ROWS):
        return False
    return M < Z8_MAX_ROWS or (AMX_CPU and not amx_granted())


@njit(inline="always", **DOT)
def _amx_given_32(out, qs, kind):
    """In a 32-value type's worker: whether to run the AMX tiles. Its launcher passes the activations as they are
    to them and to _rows_zq alike (_z8_tiles), so the worker reads the flag use_amx sets again, as _amx_q8_0_tiles
    does: a flag flipped between the launcher's read and the worker's changes only the route, never the bits."""
    return _amx_given(out, qs, kind) and amx_granted()


@njit(inline="always", **DOT)
def _z8_given(out, qs, kind):
    """In a worker: whether its launcher chose _rows_zq (the activation rows as they are, not as pairs)."""
    return _z8_tiles(out.shape[0], kind) and qs.shape[0] == out.shape[0]


@njit(inline="always", **DOT)
def _z16_codes(kind, w, oa, ob):
    """A 32-value block of groups A (byte oa) and B (byte ob) as decode (_group_x8_z16_one) and _rows_zq decode it:
    16 rows' unsigned codes, 8 vectors."""
    if kind == Q8_0:
        return codes8_z16(w, oa + 16, ob + 16)
    if kind == Q5_0:
        return codes5_z16(w, oa + 16, ob + 16)
    if kind == IQ4_NL:
        return iq4_codes_z16(w, oa + 16, ob + 16)
    c = 32 if kind == Q4_1 else 16
    return codes_z16(w, oa + c, ob + c)


def _dots2_z(nibbles: bool):
    """Intrinsic (ua, ub, x, xoff, init) -> (sa, sb): one 32-value block of two pairs of groups (ua, ub: decode's
    CodesZ8, unsigned) against one activation row's 32 quants at byte xoff of x: from `init` in every lane, 8 vpdpbusd
    a pair, each broadcast quad of quants (value v_j = 16 (j % 2) + 4 (j // 2) of the nibble types' code vector j, 4 j
    of Q8_0's) feeding both pairs' vpdpbusd: _group_x8_z16_one's integers (dot_z16 / dot8_z16) for two pairs.
    Each pair's 8 vpdpbusd run as two chains of 4 (even and odd j, the odd one from zero), added at the end: the same
    int32 sums, and a row's chain half as long, so the core overlaps more rows' chains (one vpdpbusd waits ~5 cycles
    on the one before). Intel Xeon with AMX, 2 threads, the two forms in turn in one process (medians of 300 calls,
    SmolLM2's layer matrices in turn, Q4_1): at 8 rows 3,072 x 576 61.8 -> 54.9 us, 576 x 1,536 35.5 -> 30.1, 960 x
    576 25.7 -> 21.5, 576 x 576 18.9 -> 15.8; at 16 rows 0.84-0.93x; in a slower minute 0.90-0.97x at 8 rows; Gemma3's
    Q5_0 4,096 x 640 at 8 rows 0.88x, its Q8_0 output 0.97x. Four chains of 2 ran no faster than one of 8 (registers:
    16 code vectors and 8 sums), nor did two rows a step with two chains each (0.92-0.99x the one chain)."""

    @intrinsic
    def dots(typingctx, ua, ub, x, xoff, init):
        if ua != CodesZ8 or ub != CodesZ8 or not _is_ptr_args(x, xoff) or not isinstance(init, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            p = _ptr(context, builder, sig.args[2], args[2], sig.args[3], args[3], _i8)
            raw = _bsplat(builder, _v16i32, context.cast(builder, args[4], sig.args[4], types.int32))
            sa, sb = [raw, _splat(_v16i32, 0)], [raw, _splat(_v16i32, 0)]  # the even and odd j's chains
            for j in range(8):
                xv = _z_bcast4(builder, p, 16 * (j % 2) + 4 * (j // 2) if nibbles else 4 * j)
                a = builder.bitcast(builder.extract_value(args[0], j), _v16i32)
                b = builder.bitcast(builder.extract_value(args[1], j), _v16i32)
                sa[j % 2] = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", sa[j % 2], a, xv)
                sb[j % 2] = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", sb[j % 2], b, xv)
            return context.make_tuple(builder, sig.return_type, [builder.add(*sa), builder.add(*sb)])

        return types.UniTuple(I32x16, 2)(ua, ub, x, xoff, init), codegen

    return dots


dots2_z, dots2_z8 = _dots2_z(True), _dots2_z(False)


@njit(inline="always", **DOT)
def _dots2(kind, ua, ub, x, xoff, init):
    if kind == Q8_0:
        return dots2_z8(ua, ub, x, xoff, init)
    return dots2_z(ua, ub, x, xoff, init)


@njit(inline="always", **DOT)
def _rows_zq(kind, bsize, w, d, s, qs, sums, out, g0, g1):
    """_rows_x8 from Z8_MIN_ROWS rows (section note) for Q4_0, Q4_1, Q5_0, Q8_0 and IQ4_NL: four groups (two pairs,
    32 weight rows) at a time, block by block: each block's codes of the two pairs decoded once into registers as
    decode decodes them (_z16_codes), then every activation row's integers (_dots2: each broadcast quad of quants
    feeds both pairs' vpdpbusd) and its d-term FMAs, the row's accumulators waiting in L1 between blocks; Q4_1's m
    terms after the blocks, 8 rows at a time in registers (acc8_mins). A last 1-3 groups repeat the last one in the
    missing places and store their own columns only."""
    rb = w.shape[1]
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    nb = K // 32
    neg = -_offset32(kind)
    q1, d1, s1, sums1 = qs.reshape(-1), d.reshape(-1), s.reshape(-1), sums.reshape(-1)
    last = M * nb - 1
    acc = _empty64(32 * M, np.float32)  # row r: pair a's 16 lanes (d terms), then pair b's
    tiles = (M + 7) // 8 * 8
    mins_a, mins_b = _empty64(16 * tiles, np.float32), _empty64(16 * tiles, np.float32)  # Q4_1's m terms, row r at 64 r
    for g in range(g0, g1, 4):
        n = min(4, g1 - g)  # groups g..g + n - 1; the others stand in for the missing ones
        ga, gb, gc, gd = g * rb, (g + min(1, n - 1)) * rb, (g + min(2, n - 1)) * rb, (g + min(3, n - 1)) * rb
        for r in range(M):
            st_z(acc, 128 * r, fzero_z())
            st_z(acc, 128 * r + 64, fzero_z())
        for b in range(nb):
            o0, o1, o2, o3 = ga + b * bsize, gb + b * bsize, gc + b * bsize, gd + b * bsize
            _tile_prefetch_far(w, o0, bsize, Z8_FAR_PREFETCH)
            _tile_prefetch_far(w, o1, bsize, Z8_FAR_PREFETCH)
            _tile_prefetch_far(w, o2, bsize, Z8_FAR_PREFETCH)
            _tile_prefetch_far(w, o3, bsize, Z8_FAR_PREFETCH)
            ua, ub = _z16_codes(kind, w, o0, o1), _z16_codes(kind, w, o2, o3)
            dwa, dwb = ld_f16x16(w, o0, o1), ld_f16x16(w, o2, o3)
            for r in range(M):
                i = r * nb + b
                sa, sb = _dots2(kind, ua, ub, q1, r * K + 32 * b, neg * sums1[i])
                dx = d1[i]
                st_z(acc, 128 * r, fma_z(ld_f32z(acc, 128 * r), fcvt_z(sa), fscale_z(dwa, dx)))
                st_z(acc, 128 * r + 64, fma_z(ld_f32z(acc, 128 * r + 64), fcvt_z(sb), fscale_z(dwb, dx)))
        for m0 in range(0, M, 8):
            ma, mb = acc8_zero(), acc8_zero()
            if kind == Q4_1:
                for b in range(nb):
                    o0, o1, o2, o3 = ga + b * bsize, gb + b * bsize, gc + b * bsize, gd + b * bsize
                    ma = acc8_mins(ma, ld_f16x16(w, o0 + 16, o1 + 16), s1, m0 * nb + b, nb, last)
                    mb = acc8_mins(mb, ld_f16x16(w, o2 + 16, o3 + 16), s1, m0 * nb + b, nb, last)
            acc8_put(ma, mins_a, 64 * m0)
            acc8_put(mb, mins_b, 64 * m0)
        for r in range(M):
            va = fadd_z(ld_f32z(acc, 128 * r), ld_f32z(mins_a, 64 * r))
            if n >= 2:
                st_z(out, 4 * (r * N + 8 * g), va)
            else:
                st_lo_f32x8(out, 4 * (r * N + 8 * g), va)
            if n >= 3:
                vb = fadd_z(ld_f32z(acc, 128 * r + 64), ld_f32z(mins_b, 64 * r))
                if n == 4:
                    st_z(out, 4 * (r * N + 8 * g + 16), vb)
                else:
                    st_lo_f32x8(out, 4 * (r * N + 8 * g + 16), vb)


# ---- Decode on AVX-512: two groups of 8 interleaved rows (16 rows) per vector -----------------------------------
# One activation row cannot fill a pair tile's lanes, so decode (_rowsk_x8_one, _rows_x8_one) takes a work item's two
# groups at once: lanes 0-7 are group A's rows, lanes 8-15 group B's (the next group, whose 8 output columns follow
# A's), each code chunk A's 32 bytes then B's. Every lane gets its own row's integers and float steps in the same order
# as _group_k_x8_one / _group_x8_one, so the same bits; a 16-row vector halves the decoding and multiply instructions
# per weight, and both groups' streams are prefetched (DECODE_PREFETCH). The 32-value types' _group_x8_z16_one is here
# too, beside the K-quants' _group_k_z16_one.
# -----------------------------------------------------------------------------------------------------------------


def _ld64_ab(builder, pa, pb, at):
    """The 32 bytes at byte `at` of i8* pa, then the 32 at byte `at` of pb, as one 64-byte vector."""
    return builder.shuffle_vector(_ld32_at(builder, pa, at), _ld32_at(builder, pb, at),
                                  ir.Constant(ir.VectorType(_i32, 64), list(range(64))))  # fmt: skip


def _ld16_ab(builder, pa, pb, at):
    """The 16 bytes at byte `at` of pa, then the 16 at `at` of pb (a field of 8 rows of each group)."""
    v16 = ir.VectorType(_i8, 16)
    a = builder.load(builder.bitcast(builder.gep(pa, [ir.Constant(_i64, at)]), v16.as_pointer()), align=1)
    b = builder.load(builder.bitcast(builder.gep(pb, [ir.Constant(_i64, at)]), v16.as_pointer()), align=1)
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_i32, 32), list(range(32))))


def _ab_ptrs(context, builder, sig, args):
    pa = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)
    pb = _ptr(context, builder, sig.args[0], args[0], sig.args[2], args[2], _i8)
    return pa, pb


def _is_ab_args(a, oa, ob) -> bool:
    return _is_ptr_args(a, oa) and isinstance(ob, types.Integer)


def _nibble_codes(builder, load):
    """codes_x8's 8 code vectors in 64 bytes from load(at) (the chunk at byte `at`, as 64 bytes): [2c] chunk c's
    low nibbles, [2c + 1] its high nibbles."""
    v64 = ir.VectorType(_i8, 64)
    out = []
    for c in range(4):
        v = load(32 * c)
        out += [builder.and_(v, _splat(v64, 15)), builder.lshr(v, _splat(v64, 4))]
    return out


def _nibble5_codes(builder, load):
    """codes5_x8's 8 code vectors of 5 bits in 64 bytes: a fifth-bit plane, then 4 nibble chunks."""
    v64 = ir.VectorType(_i8, 64)
    plane = builder.bitcast(load(0), _v32i16)
    out = []
    for j, nib in enumerate(_nibble_codes(builder, lambda at: load(32 + at))):
        moved = builder.shl(plane, _splat(_v32i16, 4 - j)) if j < 4 else builder.lshr(plane, _splat(_v32i16, j - 4))
        out.append(builder.or_(nib, builder.and_(builder.bitcast(moved, v64), _splat(v64, 0x10))))
    return out


def _iq4_codes(builder, load):
    """IQ4_XS's 8 code vectors of a 32-value sub-block (4 chunks of 32 bytes, row r's 4 nibble bytes at 4r) in 64
    bytes: _nibble_codes looked up in the code book + 128 (unsigned 1..241, vpshufb)."""
    v64 = ir.VectorType(_i8, 64)
    table = ir.Constant(v64, [(v + 128) & 0xFF for v in IQ4_VALUES] * 4)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v64, [v64, v64]), "llvm.x86.avx512.pshuf.b.512")
    return [builder.call(fn, [table, builder.and_(v, _splat(v64, 15))]) for v in _nibble_codes(builder, load)]


def _codes_z(decode, pairs: bool):
    """Intrinsic of 8 code vectors in 16 lanes (CodesZ8) decoded by decode(builder, load): pairs, (a, off): one group
    of 8 rows, each chunk's dword r spread over lanes 2r and 2r + 1 as it is loaded (the pair tiles); else (a, oa,
    ob): groups A and B side by side, A's rows in lanes 0-7 and B's in 8-15 (decode)."""
    if pairs:

        @intrinsic
        def codes(typingctx, a, off):
            if not _is_ptr_args(a, off):
                return None

            def codegen(context, builder, sig, args):
                p = _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _i8)

                def load(at):
                    v = builder.bitcast(_ld32_at(builder, p, at), _v8i32)
                    return builder.bitcast(builder.shuffle_vector(v, v, _DUP), ir.VectorType(_i8, 64))

                return context.make_tuple(builder, sig.return_type, decode(builder, load))

            return CodesZ8(a, off), codegen

        return codes

    @intrinsic
    def codes_ab(typingctx, a, oa, ob):
        if not _is_ab_args(a, oa, ob):
            return None

        def codegen(context, builder, sig, args):
            pa, pb = _ab_ptrs(context, builder, sig, args)
            return context.make_tuple(
                builder, sig.return_type, decode(builder, lambda at: _ld64_ab(builder, pa, pb, at))
            )

        return CodesZ8(a, oa, ob), codegen

    return codes_ab


codes_z, codes5_z, iq4_codes_z = (_codes_z(f, True) for f in (_nibble_codes, _nibble5_codes, _iq4_codes))
codes_z16, codes5_z16, iq4_codes_z16 = (_codes_z(f, False) for f in (_nibble_codes, _nibble5_codes, _iq4_codes))


def _kscales_z16(signed: bool, low16: bool = True):
    """Intrinsic (a, oa, ob, e) -> ksc_x8 / ksc6_x8's element e for groups A and B (lanes 0-7, 8-15), as an int16 in
    the low half of each lane and 0 in the high half (what vpdpwssd multiplies exactly), or (low16 False) an int32."""

    @intrinsic
    def scales(typingctx, a, oa, ob, e):
        if not _is_ab_args(a, oa, ob) or not isinstance(e, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            pa, pb = _ab_ptrs(context, builder, sig, args)
            v = _ld16_ab(builder, pa, pb, 0)
            pick = []
            for k in (0, 1):
                x = builder.shuffle_vector(v, v, ir.Constant(_v16i32, [2 * i + k for i in range(16)]))
                x = builder.sext(x, _v16i32) if signed else builder.zext(x, _v16i32)
                pick.append(builder.and_(x, _splat(_v16i32, 0xFFFF)) if low16 else x)
            odd = builder.icmp_signed("!=", _int_arg(context, builder, sig.args[3], args[3]), ir.Constant(_i32, 0))
            return builder.select(odd, pick[1], pick[0])

        return I32x16(a, oa, ob, e), codegen

    return scales


ksc_z16 = _kscales_z16(False)
kscw_z16 = _kscales_z16(True, False)


def _kpairs_z16(signed: bool, n: int):
    """Intrinsic (a, oa, ob, bs, bo) -> kmin_x8 / koff6_x8 summed over k < n (as _kmin_sum_x8 / _koff6_sum_x8) for
    groups A and B: row r's byte pair at byte o + 16k . the activation row's two int16 sums at byte bo + 8k of bs."""

    @intrinsic
    def pairs(typingctx, a, oa, ob, bs, bo):
        if not _is_ab_args(a, oa, ob) or not _is_ptr_args(bs, bo):
            return None

        def codegen(context, builder, sig, args):
            pa, pb = _ab_ptrs(context, builder, sig, args)
            ps = _ptr(context, builder, sig.args[3], args[3], sig.args[4], args[4], _i8)
            acc = _splat(_v16i32, 0)
            for k in range(n):
                v = _ld16_ab(builder, pa, pb, 16 * k)
                v = builder.bitcast(builder.sext(v, _v32i16) if signed else builder.zext(v, _v32i16), _v16i32)
                two = builder.load(builder.bitcast(builder.gep(ps, [ir.Constant(_i64, 8 * k)]),
                                                   ir.VectorType(_i32, 2).as_pointer()), align=1)  # fmt: skip
                two = builder.bitcast(builder.trunc(two, ir.VectorType(_i16, 2)), _i32)
                acc = _z_call(builder, "llvm.x86.avx512.vpdpwssd.512", acc, v, _bsplat(builder, _v16i32, two))
            return acc

        return I32x16(a, oa, ob, bs, bo), codegen

    return pairs


kmin_z16, koff6_z16, kiq4_z16 = _kpairs_z16(False, 4), _kpairs_z16(True, 8), _kpairs_z16(True, 4)


def _q6_codes_ab(builder, pa, pb, at):
    """Q6_K's 4 code vectors (0..63) of chunk bytes l = 4c..4c + 3 of a 128-value half in groups A and B (its ql
    bytes at byte `at` of pa / pb, ql + 32 at + 256, qh at + 512): the codes of values l, 32 + l, 64 + l, 96 + l,
    as llama.cpp's dequantize_row_q6_K assembles them."""
    v64 = ir.VectorType(_i8, 64)
    m15, m48 = _splat(v64, 15), _splat(v64, 0x30)

    def sh(v, by):  # 16-bit lane shift of bytes (left for by > 0); the bits kept come from the same byte
        v16 = builder.bitcast(v, _v32i16)
        v16 = builder.shl(v16, _splat(_v32i16, by)) if by > 0 else builder.lshr(v16, _splat(_v32i16, -by))
        return builder.bitcast(v16, v64)

    ql0, ql1, qh = (_ld64_ab(builder, pa, pb, at + k) for k in (0, 256, 512))
    return (
        builder.or_(builder.and_(ql0, m15), builder.and_(sh(qh, 4), m48)),
        builder.or_(builder.and_(ql1, m15), builder.and_(sh(qh, 2), m48)),
        builder.or_(builder.and_(sh(ql0, -4), m15), builder.and_(qh, m48)),
        builder.or_(builder.and_(sh(ql1, -4), m15), builder.and_(sh(qh, -2), m48)),
    )


@intrinsic
def sb6_z16(typingctx, a, oa, ob, x, xo):
    """sb6_x8 for groups A and B at once (lanes 0-7, 8-15): every byte loaded once; a 16-value group's 4 code
    vectors (one per chunk of the half) summed by a vpdpbusd chain in int32 (16 x 63 x 128 < 2^17), then one
    vpmulld by its scale (the same integers as a vpdpwssd per code vector, 2 of 8 multiplies fewer: one thread,
    Q6_K 1024 x 1024 from L2 30.0-30.5 -> 33.4-34.8 GB/s, 2048 x 2048 x 2 from L3 32.3-32.9 -> 36.9-38.5; from DRAM
    unchanged, 17.2-19.6)."""
    if not _is_ab_args(a, oa, ob) or not _is_ptr_args(x, xo):
        return None

    def codegen(context, builder, sig, args):
        pa, pb = _ab_ptrs(context, builder, sig, args)
        q = _ptr(context, builder, sig.args[3], args[3], sig.args[4], args[4], _i8)
        acc = _splat(_v16i32, 0)
        for h in range(2):
            co = 144 + 768 * h
            for half in range(2):
                sums = [_splat(_v16i32, 0)] * 4  # group 8h + 2k + half's codes . quants, int32
                for cc in range(4):
                    c = 4 * half + cc
                    codes = _q6_codes_ab(builder, pa, pb, co + 32 * c)
                    for k in range(4):
                        u = builder.bitcast(codes[k], _v16i32)
                        x = _z_bcast4(builder, q, 128 * h + 32 * k + 4 * c)
                        sums[k] = _z_call(builder, "llvm.x86.avx512.vpdpbusd.512", sums[k], u, x)
                for k in range(4):  # pair 4h + k: groups 8h + 2k (element 0) and 8h + 2k + 1 (element 1)
                    v = _ld16_ab(builder, pa, pb, 16 + 16 * (4 * h + k))
                    x = builder.shuffle_vector(v, v, ir.Constant(_v16i32, [2 * i + half for i in range(16)]))
                    acc = builder.add(acc, builder.mul(sums[k], builder.sext(x, _v16i32)))
        return acc

    return I32x16(a, oa, ob, x, xo), codegen


@intrinsic
def codes8_z16(typingctx, a, oa, ob):
    """codes8_x8 of groups A (byte oa) and B (byte ob) in one: Q8_0's 8 chunks, + 128 (unsigned, for vpdpbusd)."""
    if not _is_ab_args(a, oa, ob):
        return None

    def codegen(context, builder, sig, args):
        pa, pb = _ab_ptrs(context, builder, sig, args)
        v64 = ir.VectorType(_i8, 64)
        out = [builder.xor(_ld64_ab(builder, pa, pb, 32 * j), _splat(v64, 0x80)) for j in range(8)]
        return context.make_tuple(builder, sig.return_type, out)

    return CodesZ8(a, oa, ob), codegen


@intrinsic
def isubs_z(typingctx, v, x):
    """v - x in every lane (x an integer scalar)."""
    if v != I32x16 or not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(args[0], _bsplat(builder, _v16i32, _int_arg(context, builder, sig.args[1], args[1])))

    return I32x16(I32x16, x), codegen


@intrinsic
def fbcast_z(typingctx, x):
    """x in every lane."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return _bsplat(builder, _v16f32, args[0])

    return F32x16(types.float32), codegen


@intrinsic
def st_lo_f32x8(typingctx, a, off, v):
    """Store lanes 0-7 of v as 8 float32 at byte `off`."""
    if not _is_ptr_args(a, off) or v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        x = builder.shuffle_vector(args[2], args[2], ir.Constant(_v8i32, list(range(8))))
        builder.store(x, _ptr(context, builder, sig.args[0], args[0], sig.args[1], args[1], _v8f32), align=4)
        return context.get_dummy_value()

    return types.none(a, off, v), codegen


@intrinsic
def ld_f16x16(typingctx, a, oa, ob):
    """8 IEEE halves at byte oa, then 8 at byte ob, as 16 float32."""
    if not _is_ab_args(a, oa, ob):
        return None

    def codegen(context, builder, sig, args):
        pa, pb = _ab_ptrs(context, builder, sig, args)
        v8 = ir.VectorType(_i16, 8)
        ha = builder.load(builder.bitcast(pa, v8.as_pointer()), align=1)
        hb = builder.load(builder.bitcast(pb, v8.as_pointer()), align=1)
        return _h2f(builder, builder.shuffle_vector(ha, hb, ir.Constant(_v16i32, list(range(16)))))

    return F32x16(a, oa, ob), codegen


@intrinsic
def fscale_z(typingctx, v, x):
    """v * x lane-wise, x a float32 scalar."""
    if v != F32x16 or x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _bsplat(builder, _v16f32, args[1]))

    return F32x16(F32x16, types.float32), codegen


@njit(inline="always", **DOT)
def _ahead_start(ga, rb):
    """(pair, ahead) for _prefetch_ahead_pair at the start of the pair of groups at byte ga, rb bytes a group: groups
    longer than DECODE_PREFETCH have each stream's hints DECODE_PREFETCH ahead in its own group (A's would otherwise
    land on the part of B already read: Q6_K 4096 x 4096, 8 copies from DRAM, 1 / 2 threads, 11.5-12.8 -> 18.4-24.6 /
    21.6-25.8 -> 28.7-48.6 GB/s; Q4_K 4096 x 8192 16.5-17.9 -> 20.0-20.7 at 1 thread); shorter ones, DECODE_PREFETCH
    ahead of each stream's byte (the pairs a thread reads follow one another: for small groups a mapping per group,
    twice as far ahead in bytes, ran SmolLM2's decode step 7-10% slower)."""
    if rb > DECODE_PREFETCH:
        return ga, DECODE_PREFETCH
    return ga + DECODE_PREFETCH, 0


@njit(inline="always", **DOT)
def _prefetch_ahead_pair(w, pair, ahead, rb, nbytes):
    """Prefetch the next `nbytes` of both streams of a decode pair, at offset `ahead` of both groups of the pair at
    byte `pair` (_ahead_start), and move on to the same offset of the next pair at the end of a group."""
    for pf in range(0, nbytes, 64):
        decode_prefetch(w, pair + ahead + pf)
        decode_prefetch(w, pair + rb + ahead + pf)
    ahead += nbytes
    if ahead >= rb:
        ahead -= rb
        pair += 2 * rb
    return pair, ahead


@njit(inline="always", **DOT)
def _group_x8_z16_one(kind, bsize, w, ga, gb, d1, s1, sums1, qs, nb, off, m):
    """_group_x8_one for groups A (byte ga) and B (byte gb) of a 32-value type at once: lanes 0-7 A's rows, 8-15
    B's, each with its own row's integer and float steps (the same bits)."""
    accd, accm = fzero_z(), fzero_z()
    xo, bo = m * 32 * nb, m * nb
    pair, ahead = _ahead_start(ga, nb * bsize)
    for b in range(nb):
        oa, ob = ga + b * bsize, gb + b * bsize
        if m == 0:
            pair, ahead = _prefetch_ahead_pair(w, pair, ahead, nb * bsize, bsize)
        u = _z16_codes(kind, w, oa, ob)
        p = dot8_z16(u, qs, xo + 32 * b) if kind == Q8_0 else dot_z16(u, qs, xo + 32 * b)
        p = isubs_z(p, off * sums1[bo + b])
        accd = fma_z(accd, fcvt_z(p), fscale_z(ld_f16x16(w, oa, ob), d1[bo + b]))
        if kind == Q4_1:
            accm = fma_z(accm, ld_f16x16(w, oa + 16, ob + 16), fbcast_z(s1[bo + b]))
    return fadd_z(accd, accm)


@njit(inline="always", **DOT)
def _sbk_z16(kind, w, oa, ob, qs, xo):
    """_sbk_x8 for the super-blocks of groups A (byte oa) and B (byte ob) at once (lanes 0-7, 8-15)."""
    if kind == Q6_K:
        return sb6_z16(w, oa, ob, qs, xo)
    s = izero_z()
    if kind == IQ4_XS:
        for gg in range(8):
            sc = kscw_z16(w, oa + 16 + 16 * (gg // 2), ob + 16 + 16 * (gg // 2), gg % 2)
            u = iq4_codes_z16(w, oa + 80 + 128 * gg, ob + 80 + 128 * gg)
            s = imuladd_z(s, dot_z16(u, qs, xo + 32 * gg), sc)
        return s
    for jj in range(4):
        sclo, schi = (
            ksc_z16(w, oa + 32 + 16 * jj, ob + 32 + 16 * jj, 0),
            ksc_z16(w, oa + 32 + 16 * jj, ob + 32 + 16 * jj, 1),
        )
        for half in range(2):
            x = xo + 64 * jj + 16 * half
            if kind == Q5_K:
                u = codes5_z16(w, oa + 160 + 320 * jj + 160 * half, ob + 160 + 320 * jj + 160 * half)
                s = dot5k_z16(u, qs, x, sclo, schi, s)
            else:
                u = codes_z16(w, oa + 160 + 256 * jj + 128 * half, ob + 160 + 256 * jj + 128 * half)
                s = dot4k_z16(u, qs, x, sclo, schi, s)
    return s


@njit(inline="always", **DOT)
def _group_k_z16_one(kind, w, ga, gb, d1, b16, b32, qs, nsb, m):
    """_group_k_x8_one for groups A (byte ga) and B (byte gb) at once: lanes 0-7 A's rows, 8-15 B's."""
    sbytes = _kx8_bytes(kind)
    n16, n32 = b16.shape[1], b32.shape[1]
    K = 256 * nsb
    ad, am = fzero_z(), fzero_z()
    pair, ahead = _ahead_start(ga, nsb * sbytes)
    for b in range(nsb):
        oa, ob = ga + b * sbytes, gb + b * sbytes
        i = m * nsb + b
        if m == 0:
            pair, ahead = _prefetch_ahead_pair(w, pair, ahead, nsb * sbytes, sbytes)
        s = _sbk_z16(kind, w, oa, ob, qs, m * K + 256 * b)
        if kind == IQ4_XS:
            s = isub128_z(s, kiq4_z16(w, oa + 16, ob + 16, b32, 4 * (m * n32 + 8 * b)))
        elif _has_min(kind):
            mn = kmin_z16(w, oa + 96, ob + 96, b32, 4 * (m * n32 + 8 * b))
            am = fma_z(am, fcvt_z(mn), fscale_z(ld_f16x16(w, oa + 16, ob + 16), -d1[i]))
        else:
            s = isub32_z(s, koff6_z16(w, oa + 16, ob + 16, b16, 4 * (m * n16 + 16 * b)))
        ad = fma_z(ad, fcvt_z(s), fscale_z(ld_f16x16(w, oa, ob), d1[i]))
    return fadd_z(ad, am)


# ---- Grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): 256-value super-blocks of 8 groups of 32 values; a
# group is 4 code book entries of 8 values (IQ2) or 8 entries of 4 (IQ3), 32 sign bits, and one scale 2s+1 per
# 32 values (IQ2_XXS, IQ3_XXS, IQ3_S) or per 16 (IQ2_XS, IQ2_S). As llama.cpp's AVX2 kernels do, the signs go
# onto the activation quants (apply_sign), which then meet the unsigned code book values (< 64) and the scales
# in dpbusd_scaled. The super-block factor d * 1/8 (IQ2) or d * 1/4 (IQ3_XXS) is exact.
# -----------------------------------------------------------------------------------------------------------------


@njit(inline="always", **DOT)
def _ksigns4(aux):
    """Four 7-bit sign indices (bits 0-27 of aux) -> their 32 signs as +-1 bytes (ksigns_iq2xs)."""
    return ld_grid8x4(KSIGNS_PM1, aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127)


@njit(**DOT)
def _group_iq(kind, w, o, g):
    """Group g (values 32g..32g+31) of the super-block at byte o -> (code book values I8x32, their signs I8x32 (+1
    or -1), scale of values 0-15, scale of values 16-31). Layouts: see registry."""
    if kind == IQ2_XXS:  # qs[4g:4g+4] as uint16: 4 entry bytes, then 4 x 7 sign bits and a 4-bit scale
        e, aux = np.int64(ld_u32(w, o + 2 + 8 * g)), np.int64(ld_u32(w, o + 6 + 8 * g))
        u = ld_grid8x4(IQ2XXS_GRID, e & 255, (e >> 8) & 255, (e >> 16) & 255, e >> 24)
        s = 2 * (aux >> 28) + 1
        return u, _ksigns4(aux), s, s
    if kind == IQ2_XS:  # 4 uint16 (9-bit entry, 7-bit sign index), scales[g]: a 4-bit scale per 16 values
        a, b = np.int64(ld_u32(w, o + 2 + 8 * g)), np.int64(ld_u32(w, o + 6 + 8 * g))
        u = ld_grid8x4(IQ2XS_GRID, a & 511, (a >> 16) & 511, b & 511, (b >> 16) & 511)
        signs = ld_grid8x4(KSIGNS_PM1, (a >> 9) & 127, a >> 25, (b >> 9) & 127, b >> 25)
        sc = ld_u8(w, o + 66 + g)
        return u, signs, 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1
    if kind == IQ2_S:  # qs[4g:4g+4] + 2 bits each of qh[g]: entries; signs[4g:4g+4]; scales[g] per 16 values
        e, qh = np.int64(ld_u32(w, o + 2 + 4 * g)), ld_u8(w, o + 66 + g)
        u = ld_grid8x4(
            IQ2S_GRID,
            (e & 255) | ((qh & 3) << 8),
            ((e >> 8) & 255) | ((qh & 12) << 6),
            ((e >> 16) & 255) | ((qh & 48) << 4),
            (e >> 24) | ((qh & 192) << 2),
        )
        sc = ld_u8(w, o + 74 + g)
        return u, bits_pm1(ld_u32(w, o + 34 + 4 * g)), 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1
    if kind == IQ3_XXS:  # qs[8g:8g+8]: entries; then per group a uint32 of 4 x 7 sign bits and a 4-bit scale
        a, b = np.int64(ld_u32(w, o + 2 + 8 * g)), np.int64(ld_u32(w, o + 6 + 8 * g))
        u = ld_grid4x8(
            IQ3XXS_GRID,
            a & 255,
            (a >> 8) & 255,
            (a >> 16) & 255,
            a >> 24,
            b & 255,
            (b >> 8) & 255,
            (b >> 16) & 255,
            b >> 24,
        )
        aux = np.int64(ld_u32(w, o + 66 + 4 * g))
        s = 2 * (aux >> 28) + 1
        return u, _ksigns4(aux), s, s
    # IQ3_S: qs[8g:8g+8] + bit k of qh[g]: entries; signs[4g:4g+4]; a 4-bit scale per 32 values
    u = ld_grid4x8v(IQ3S_GRID, iq3s_entries(w, o + 2 + 8 * g, ld_u8(w, o + 66 + g)))
    s = 2 * ((ld_u8(w, o + 106 + g // 2) >> (4 * (g % 2))) & 15) + 1
    return u, bits_pm1(ld_u32(w, o + 74 + 4 * g)), s, s


@njit(inline="always", **DOT)
def _d_iq(kind, w, o):
    """Super-block factor: d times llama.cpp's constant (0.125 IQ2, 0.25 IQ3_XXS, 1 IQ3_S), exact."""
    if kind == IQ3_S:
        return ld_f16(w, o)
    if kind == IQ3_XXS:
        return ld_f16(w, o) * np.float32(0.25)
    return ld_f16(w, o) * np.float32(0.125)


@njit(inline="always", **DOT)
def rowiq(kind, bsize, w, wo, m, d, qs):
    """Weight row at byte wo . activation row m, for a grid type of `bsize` bytes per super-block.

    Per group: int32 lanes of the code book values . the sign-adjusted quants, times the two 16-value scales;
    per super-block: acc = fma(float(lanes), d_w * d_x, acc); an 8-lane hsum at the end."""
    K = qs.shape[1]
    acc = fzero()
    for b in range(K // 256):
        o = wo + b * bsize
        i0 = izero()
        for g in range(8):
            u, sgn, s0, s1 = _group_iq(kind, w, o, g)
            i0 = dpbusd_scaled(i0, u, apply_sign(ld_i8x32(qs, m * K + 256 * b + 32 * g), sgn), s0, s1)
        acc = fma_i(acc, i0, _d_iq(kind, w, o) * d[m, b])
    return hsum(acc)


@njit(inline="always", **DOT)
def rowiqx4(kind, bsize, w, wo, m, d, qs):
    """rowiq for activation rows m .. m+3, decoding each weight group once."""
    K = qs.shape[1]
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
    for b in range(K // 256):
        o = wo + b * bsize
        i0, i1, i2, i3 = izero(), izero(), izero(), izero()
        for g in range(8):
            u, sgn, s0, s1 = _group_iq(kind, w, o, g)
            xo = m * K + 256 * b + 32 * g
            i0 = dpbusd_scaled(i0, u, apply_sign(ld_i8x32(qs, xo), sgn), s0, s1)
            i1 = dpbusd_scaled(i1, u, apply_sign(ld_i8x32(qs, xo + K), sgn), s0, s1)
            i2 = dpbusd_scaled(i2, u, apply_sign(ld_i8x32(qs, xo + 2 * K), sgn), s0, s1)
            i3 = dpbusd_scaled(i3, u, apply_sign(ld_i8x32(qs, xo + 3 * K), sgn), s0, s1)
        dw = _d_iq(kind, w, o)
        a0 = fma_i(a0, i0, dw * d[m, b])
        a1 = fma_i(a1, i1, dw * d[m + 1, b])
        a2 = fma_i(a2, i2, dw * d[m + 2, b])
        a3 = fma_i(a3, i3, dw * d[m + 3, b])
    return hsum(a0), hsum(a1), hsum(a2), hsum(a3)


# ---- Float weights (F32, F16, BF16) ----------------------------------------------------------------------
# w is the typed matrix (float32, or uint16 bits of F16 / BF16), x float32 already rounded to
# the weight's precision. Four accumulators per row hide the FMA latency; the tail (K % 32) is scalar.


@njit(inline="always", **DOT)
def _ldw8(kind, w, off):
    """8 weights from element `off` as float32."""
    if kind == F32:
        return ld_f32x8(w, 4 * off)
    if kind == F16:
        return ld_f16x8(w, 2 * off)
    return ld_bf16x8(w, 2 * off)


@njit(inline="always", **DOT)
def _ldw1(kind, w, off):
    if kind == F32:
        return ld_f32(w, 4 * off)
    if kind == F16:
        return ld_f16(w, 2 * off)
    return np.uint32(ld_u16(w, 2 * off) << 16).view(np.float32)


@njit(inline="always", **DOT)
def _fold(a0, a1, a2, a3, kind, w, wo, x, m, k):
    """row_float's last steps for one row: the accumulators' sum, then the scalar tail from k."""
    total = hsum(fadd_v(fadd_v(a0, a1), fadd_v(a2, a3)))
    for j in range(k, x.shape[1]):
        total += _ldw1(kind, w, wo + j) * x[m, j]
    return total


@njit(inline="always", **DOT)
def row_float(kind, w, n, x, m):
    """Weight row n . activation row m."""
    K = x.shape[1]
    wo, xo = n * K, m * K * 4
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
    k = 0
    while k + 32 <= K:
        a0 = fma_v(a0, _ldw8(kind, w, wo + k), ld_f32x8(x, xo + 4 * k))
        a1 = fma_v(a1, _ldw8(kind, w, wo + k + 8), ld_f32x8(x, xo + 4 * k + 32))
        a2 = fma_v(a2, _ldw8(kind, w, wo + k + 16), ld_f32x8(x, xo + 4 * k + 64))
        a3 = fma_v(a3, _ldw8(kind, w, wo + k + 24), ld_f32x8(x, xo + 4 * k + 96))
        k += 32
    return _fold(a0, a1, a2, a3, kind, w, wo, x, m, k)


@njit(inline="always", **DOT)
def row_floatx4(kind, w, n, x, m):
    """row_float for activation rows m .. m+3, loading each 8 weights once."""
    K = x.shape[1]
    wo, xo, r = n * K, m * K * 4, K * 4
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
    b0, b1, b2, b3 = fzero(), fzero(), fzero(), fzero()
    c0, c1, c2, c3 = fzero(), fzero(), fzero(), fzero()
    e0, e1, e2, e3 = fzero(), fzero(), fzero(), fzero()
    k = 0
    while k + 32 <= K:
        w0, w1 = _ldw8(kind, w, wo + k), _ldw8(kind, w, wo + k + 8)
        w2, w3 = _ldw8(kind, w, wo + k + 16), _ldw8(kind, w, wo + k + 24)
        o = xo + 4 * k
        a0, a1 = fma_v(a0, w0, ld_f32x8(x, o)), fma_v(a1, w1, ld_f32x8(x, o + 32))
        a2, a3 = fma_v(a2, w2, ld_f32x8(x, o + 64)), fma_v(a3, w3, ld_f32x8(x, o + 96))
        b0, b1 = fma_v(b0, w0, ld_f32x8(x, o + r)), fma_v(b1, w1, ld_f32x8(x, o + r + 32))
        b2, b3 = fma_v(b2, w2, ld_f32x8(x, o + r + 64)), fma_v(b3, w3, ld_f32x8(x, o + r + 96))
        c0, c1 = fma_v(c0, w0, ld_f32x8(x, o + 2 * r)), fma_v(c1, w1, ld_f32x8(x, o + 2 * r + 32))
        c2, c3 = fma_v(c2, w2, ld_f32x8(x, o + 2 * r + 64)), fma_v(c3, w3, ld_f32x8(x, o + 2 * r + 96))
        e0, e1 = fma_v(e0, w0, ld_f32x8(x, o + 3 * r)), fma_v(e1, w1, ld_f32x8(x, o + 3 * r + 32))
        e2, e3 = fma_v(e2, w2, ld_f32x8(x, o + 3 * r + 64)), fma_v(e3, w3, ld_f32x8(x, o + 3 * r + 96))
        k += 32
    return (
        _fold(a0, a1, a2, a3, kind, w, wo, x, m, k),
        _fold(b0, b1, b2, b3, kind, w, wo, x, m + 1, k),
        _fold(c0, c1, c2, c3, kind, w, wo, x, m + 2, k),
        _fold(e0, e1, e2, e3, kind, w, wo, x, m + 3, k),
    )


# ---- Ternary-code types (IQ1_S, IQ1_M, TQ1_0, TQ2_0): 256-value super-blocks of values in {-1, 0, 1} (IQ1: plus a
# shift of +-1/8 per 8 or 32 values), Q8_K activations --------------------------------------------------------------
# Each group of 32 values is decoded to unsigned byte codes u, value = (u - offset) / div:
#   TQ1_0, TQ2_0: u = q + 1 in 0..2 (offset 1, div 1), every group scale 1;
#   IQ1_S, IQ1_M: u = 8 * (grid + 1) + (delta + 1) in {0, 2, 8, 10, 16, 18} (offset 9, div 8): the +-1/8 shift
#     folded into the code, with the odd scales 2s + 1 of 32 (IQ1_S) or 16 (IQ1_M) values.
# Per super-block and activation row the integer T = sum_g scale_g (u_g . x_g) - offset * sum_h scale_h bsum_h is
# exact (|T| < 2^23), and the result gains (d_w * d_x) * (T / div), one FMA: llama.cpp's order
# (ggml_vec_dot_iq1_s_q8_K: sumf += d * y.d * (sumi + IQ1S_DELTA * sumi1), and T / 8 is that sum exactly).


@njit(inline="always", **DOT)
def _ternary(kind):
    return kind == TQ1_0 or kind == TQ2_0


@njit(**DOT)
def _scales_t(kind, w, o):
    """IQ1_S: the 8 group scales (and again); IQ1_M: the 16 scales of 16 values in two vectors; TQ: ones."""
    if kind == IQ1_S:
        a = iq1s_scales(w, o + 34)
        return a, a
    if kind == IQ1_M:
        return iq1m_scales(w, o + 48)
    return ione(), ione()


@njit(**DOT)
def _d_t(kind, w, o):
    """Super-block scale d (IQ1_M: assembled from the top nibbles of its four scale words)."""
    if kind == IQ1_S:
        return ld_f16(w, o)
    if kind == IQ1_M:
        h = (ld_u16(w, o + 48) >> 12) | ((ld_u16(w, o + 50) >> 8) & 0xF0)
        return h2f(h | ((ld_u16(w, o + 52) >> 4) & 0xF00) | (ld_u16(w, o + 54) & 0xF000))
    if kind == TQ1_0:
        return ld_f16(w, o + 52)
    return ld_f16(w, o + 64)  # TQ2_0


@njit(inline="always", **DOT)
def _iq1m_entry(lane):
    """IQ1_M codes of 8 values from their 16-bit lane of iq1m_index4: grid index bits 0-10; bit 11 set: delta
    -1/8 (code part 0), else +1/8 (code part 2)."""
    e = IQ1_GRID8[lane & 0x7FF]
    return e if lane & 0x800 else e | IQ1_DELTA_UP


@njit(**DOT)
def _codes_t(kind, w, o, g, sc0, sc1):
    """Group g (values 32g..32g+31) of the super-block at byte o -> (unsigned codes, scales in dpbusd lanes)."""
    if kind == TQ2_0:  # bits 2(g%4) of qs[32*(g//4):], as Q2_K
        return field(ld_i8x32(w, o + 32 * (g // 4)), 2 * (g % 4), 3, 0), sc0
    if kind == TQ1_0:  # trits: 5 per byte of qs[0:32] (groups 0-4), of qs[32:48] (5, 6, 7), 4 per byte of qh (7)
        if g < 5:
            v = ld_i8x32(w, o)
        elif g < 7:
            v = ld_dup16(w, o + 32)
        else:
            v = ld_tq1_tail(w, o + 32)
        return tq1_trits(v, ld_i8x32(TQ1_POW3, 32 * g)), sc0
    if kind == IQ1_S:  # grid index qs[4g + l] | bits 3l..3l+2 of qh[g] << 8; bit 15 of qh[g]: delta -1/8
        qh = np.int64(ld_u16(w, o + 34 + 2 * g))
        ix = iq1s_index4(ld_u32(w, o + 2 + 4 * g), qh)
        up = 0 if qh & 0x8000 else IQ1_DELTA_UP
        u = i8x32_of(
            IQ1_GRID8[ix & 0xFFFF] | up,
            IQ1_GRID8[(ix >> 16) & 0xFFFF] | up,
            IQ1_GRID8[(ix >> 32) & 0xFFFF] | up,
            IQ1_GRID8[ix >> 48] | up,
        )
        return u, ibcast(sc0, g)
    ix = iq1m_index4(ld_u32(w, o + 4 * g), ld_u16(w, o + 32 + 2 * g))  # IQ1_M: qs[4g:4g+4], qh[2g:2g+2]
    u = i8x32_of(_iq1m_entry(ix), _iq1m_entry(ix >> 16), _iq1m_entry(ix >> 32), _iq1m_entry(ix >> 48))
    return u, ipair(sc0 if g < 4 else sc1, g % 4)


@njit(inline="always", **DOT)
def _gacc_t(kind, acc, u, sc, qs, xo):
    """acc + scale * (u . the activation quants at byte xo), per dpbusd lane (codes u <= 18: imadd_small)."""
    return imadd_small(acc, u, ld_i8x32(qs, xo), sc)


@njit(inline="always", **DOT)
def _corr_t(kind, sc0, sc1, m, b, bsums16, bsums32):
    """offset * sum over scale groups of scale * (sum of activation quants), activation row m, super-block b."""
    if kind == IQ1_S:
        return 9 * idot(sc0, ld_i32x8(bsums32, 4 * (m * bsums32.shape[1] + 8 * b)))
    if kind == IQ1_M:
        o = 4 * (m * bsums16.shape[1] + 16 * b)
        return 9 * (idot(sc0, ld_i32x8(bsums16, o)) + idot(sc1, ld_i32x8(bsums16, o + 32)))
    return isum1(ld_i32x8(bsums32, 4 * (m * bsums32.shape[1] + 8 * b)))


@njit(inline="always", **DOT)
def _fold_t(kind, acc, lanes, corr, dwx):
    """acc + dwx * (T / div), T = lanes' sum - corr (exact in float32)."""
    t = np.float32(isum1(lanes) - corr)
    if not _ternary(kind):
        t = t * np.float32(0.125)  # IQ1S_DELTA: exact, a power of two
    return sfma(dwx, t, acc)


@njit(inline="always", **DOT)
def rowt(kind, bsize, w, wo, m, d, bsums16, bsums32, qs):
    """Weight row at byte wo . activation row m, for a ternary-code type of `bsize`-byte super-blocks."""
    K = qs.shape[1]
    acc = np.float32(0.0)
    for b in range(K // 256):
        o = wo + b * bsize
        sc0, sc1 = _scales_t(kind, w, o)
        i0 = izero()
        for g in range(8):
            u, sc = _codes_t(kind, w, o, g, sc0, sc1)
            i0 = _gacc_t(kind, i0, u, sc, qs, m * K + 256 * b + 32 * g)
        acc = _fold_t(kind, acc, i0, _corr_t(kind, sc0, sc1, m, b, bsums16, bsums32), _d_t(kind, w, o) * d[m, b])
    return acc


@njit(inline="always", **DOT)
def rowtx4(kind, bsize, w, wo, m, d, bsums16, bsums32, qs):
    """rowt for activation rows m .. m+3, decoding each weight group once."""
    K = qs.shape[1]
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for b in range(K // 256):
        o = wo + b * bsize
        sc0, sc1 = _scales_t(kind, w, o)
        i0, i1, i2, i3 = izero(), izero(), izero(), izero()
        for g in range(8):
            u, sc = _codes_t(kind, w, o, g, sc0, sc1)
            xo = m * K + 256 * b + 32 * g
            i0 = _gacc_t(kind, i0, u, sc, qs, xo)
            i1 = _gacc_t(kind, i1, u, sc, qs, xo + K)
            i2 = _gacc_t(kind, i2, u, sc, qs, xo + 2 * K)
            i3 = _gacc_t(kind, i3, u, sc, qs, xo + 3 * K)
        dw = _d_t(kind, w, o)
        a0 = _fold_t(kind, a0, i0, _corr_t(kind, sc0, sc1, m, b, bsums16, bsums32), dw * d[m, b])
        a1 = _fold_t(kind, a1, i1, _corr_t(kind, sc0, sc1, m + 1, b, bsums16, bsums32), dw * d[m + 1, b])
        a2 = _fold_t(kind, a2, i2, _corr_t(kind, sc0, sc1, m + 2, b, bsums16, bsums32), dw * d[m + 2, b])
        a3 = _fold_t(kind, a3, i3, _corr_t(kind, sc0, sc1, m + 3, b, bsums16, bsums32), dw * d[m + 3, b])
    return a0, a1, a2, a3


# ---------------------------------------------------------------------------------------------------------
# 5. Kernels: out[m, n] = row n of W . activation row m, parallel over chunks of weight rows.
# w: [N, row_bytes] uint8 (or [N, K] float32 / uint16 for the float types), read-only; out float32 [M, N].
# The parallel loop only calls a serial worker (ggufrun.quants.launch: the worker's own compiled code, not a copy).

CHUNK = 16  # weight rows per parallel work item
# Software prefetch distance. A decode step streams every weight once, mostly from L3 or DRAM, in many small
# matrices; the hardware prefetchers ramp up too slowly for those, and prefetching each row's lines this many
# bytes ahead made decode ~1.7x faster (SmolLM2 Q4_1 FFN matvec 93 -> 40 us inside the forward pass).
PREFETCH_BYTES = 2048
# The prefill / batched tiles on 512-bit vectors (_rowsk_z) prefetch each block this far ahead on their
# first tile of rows (prefetcht0); decode's kernels, DECODE_PREFETCH below.
Z16_PREFETCH = 12288
# ...except on a matrix of Z16_FAR_BYTES or more, which streams from DRAM at every batched step: there the tiles take
# decode's hint and distance (decode_prefetch, DECODE_PREFETCH: on AMD Zen 4 prefetcht1 24 KB ahead; elsewhere the
# same as above). AMD EPYC Zen 4, 2 threads, alternating processes (best of 25 x 5 calls): Q8_0 262,144 x 640 (Gemma3's
# output, 178 MB) 4 / 8 rows 4.7-7.5 / 7.1-8.6 -> 3.7-4.4 / 5.7-5.9 ms; Q6_K 128,256 x 2,048 (a 1B model's output,
# 215 MB) 2 / 4 / 8 rows 9.1-10.1 / 11.5-12.8 / 14.5-15.0 -> 6.2 / 7.1 / 10.6-10.9 ms in two of three pairs (10.8 /
# 10.7 / 12.8 in the first); Gemma3's 8-sequence step, its output projection 8.4-9.4 -> 6.8-8.4 ms. Small matrices
# keep prefetcht0 12 KB: with the L2 hint SmolLM2's (0.2-1.1 MB) ran its 8-sequence step slower (gate / up 3.0-3.3 ->
# 3.6-4.0 ms); 4 x 9.4 MB of Q4_K: no difference. Two pairs of groups at a time (_rows_zq) hint such a matrix
# further ahead, Z8_FAR_PREFETCH.
Z16_FAR_BYTES = 1 << 23
# decode's 16-row vectors (_group_k_z16_one, _group_x8_z16_one) prefetch both groups' streams DECODE_PREFETCH ahead, a
# super-block (block) at a time: unlike the 256-bit kernels (X8K note), they leave the DRAM stream idle between
# loads. Intel Xeon (prefetcht0, 12 KB ahead), alternating processes, 2 threads: llama3.2-1b Q4_K_M shape 26.4-26.6
# -> 28.3-28.8 tok/s (32 KB ahead: 27.8-28.5), qwen2.5-1.5b 21.3-21.5 -> 23.0-23.7; Gemma3-270M (from cache) even.
# AMD Zen 4 (EPYC, 1 MB L2 a core): into L2 only (prefetcht1), 24 KB ahead, where prefetcht0 12 KB ahead ran the
# same files' decode (2 threads, 64-128 greedy steps, medians of 3, alternating processes) llama3.2-1b 22.6-22.9 ->
# 32.8-33.6 tok/s, SmolLM2 161-166 -> 195-211, Gemma3 73-80 -> 93-114 (12 KB ahead: llama3.2-1b 30.3-31.4; 4 KB
# 30.7-31.7; 48 KB 30.7-33.8); the batched tiles ran slower so (SmolLM2's 8-sequence step 11.0-12.3 -> 13.6-13.9 ms)
# and keep prefetcht0. On Intel Ice Lake (Xeon, 2 cores, 48 MB L3) Zen 4's choice ran slower, 2 threads, alternating
# processes: llama3.2-1b Q4_K_M shape decode 25.4-27.7 -> 17.3-19.5 tok/s with prefetcht1 24 KB ahead and DECODE_STREAM,
# 25.9-28.5 -> 21.8-24.7 with prefetcht1 alone; Intel keeps prefetcht0 12 KB ahead.
DECODE_PREFETCH_L2 = (config.CPU_NAME if config.CPU_NAME not in (None, "host") else llb.get_host_cpu_name()).startswith(
    "znver"
)
DECODE_PREFETCH = 24576 if DECODE_PREFETCH_L2 else 12288
decode_prefetch = prefetch_l2 if DECODE_PREFETCH_L2 else prefetch
# how far ahead _rows_zq hints a matrix of Z16_FAR_BYTES or more (an output projection streaming from memory): 24 KB,
# twice decode's distance on Intel (on AMD Zen 4 decode's own). Intel Xeon (AMX VM), 2 threads, the distance toggled
# in pairs of steps in one process (forward_batch at 64 positions, medians of 40-80 steps): Gemma3's 8-sequence step
# 19.40 / 14.56 / 13.50 -> 18.62 / 13.69 / 12.74 ms (36 KB: 14.06), 9 sequences 14.76 -> 14.08, SmolLM2's 8 sequences
# 8.52 / 9.47 -> 8.42 / 9.24; the output product alone at 8 rows 6.05 / 12.77 / 6.12 -> 5.62 / 11.53 / 5.53 ms, while
# the pair tiles (4 rows) ran 1-9% slower so and the AMX tiles (12, 16 rows) even: those keep decode's distance.
Z8_FAR_PREFETCH = DECODE_PREFETCH if DECODE_PREFETCH_L2 else 2 * DECODE_PREFETCH
# rowk8 reads 8 rows, a super-block of each in turn: 8 streams, each prefetched this many bytes ahead a super-block
# at a time (_prefetch_ahead's bursts of 8 rows' worth filled the miss queue: Q4_K matvecs streaming from DRAM ran
# ~25% slower than one row at a time)
ROW_PREFETCH_BYTES = 1024
# rowk8 only for rows of at least this many values: on shorter ones (K = 1536, 864-byte Q4_K rows) its 8 streams read
# from DRAM more slowly than rowk's one (Qwen2.5-1.5B's Q4_K 8960x1536 matvecs in a decode step: 36 -> 42-45 ms at 1
# thread), while on long ones they are faster (Q4_K 1536x8960: 11.5 -> 7.5-9 ms, Q6_K 1536x8960: 21 -> 12-13 ms)
ROWK8_MIN_K = 4096
# X8K note: the interleaved kernels (_rows_x8, _rowsk_x8) read their groups of rows as one contiguous stream per
# thread, which the hardware prefetchers follow; software prefetch made them slower, 1 thread, variants alternating
# call by call: Q4_K 640x2048 matrices from L3 17.2 / 18.9 GB/s without, 15.7 / 16.7 with a super-block 2 KB ahead;
# 8960x1536 from DRAM 14.4 / 13.6 without, 12.0-13.5 with 1-8 KB; Q6_K 1536x8960 9.4 either way; _rows_x8's whole
# group 2 KB ahead (_prefetch_ahead): Q4_1 1536x576 from L3 11.4 / 10.6, Q5_0 2048x640 13.6 / 11.3 (L3) and 11.8 /
# 8.8 (DRAM), Q8_0 32768x640 from DRAM 17.1 / 11.8. Gemma3 decode, 3 process pairs: 36.6 / 49.6 / 50.3 tok/s with,
# 60.7 / 55.9 / 67.6 without; SmolLM2 even (90-126 either way). Far matrices (Z16_FAR_BYTES or more, streaming
# from DRAM at every step) are the exception for a few activation rows: there each row's work on a block is short and
# the stream waits on its misses, so _rows_x8's two-row kernel and the first tile of its tile loop hint each block
# DECODE_PREFETCH ahead with decode's hint (_far_prefetch). AMD EPYC Zen 3 VM (AVX2, no VNNI; prefetcht1 24 KB), 2
# threads, the two forms in one process, call order alternating, medians of 40: Gemma3's 262,144 x 640 Q8_0 output
# (178 MB) at 2 / 3 / 4 rows 0.82 / 0.80-0.83 / 0.89-0.94x the time, SmolLM2's 49,152 x 576 (28 MB) 0.74 / 0.83 /
# 0.91x, 5-16 rows even (0.98-1.02x). The K-quants' two-row kernel (_rowsk_x8_two) too: a random 128,256 x 2,048
# Q6_K (a 1B model's output, 215 MB) at 2 rows 0.82-0.84x, Q4_K 16,384 x 2,048 0.88x; their tile loop (3+ rows) does
# not (Q6_K at 3 / 4 rows 0.99-1.02x), each super-block's longer work leaving the hardware prefetchers time.


@njit(inline="always", **DOT)
def _prefetch_ahead(w, wo, rb):
    """Prefetch the rb bytes PREFETCH_BYTES past byte wo of w (the rows this thread reads next)."""
    for o in range(wo + PREFETCH_BYTES, wo + PREFETCH_BYTES + rb, 64):
        prefetch(w, o)


@njit(**DOT)
def _m_tile(row_bytes):
    """Activation rows per tile: the 4-row kernels sweep a tile (<= 32 KB of activations, L1-resident) over the
    chunk's weight rows, so each weight row is decoded once per tile and the activations come from L1; but at least
    16 rows, for which long rows' activations come from L2: with 4 rows of 8 KB (an ffn_down of n_ff 8192 / 8960)
    the weights were read again every 4 rows. 512-token prefill, alternating processes, Intel Xeon: qwen2.5-1.5b's
    ffn_down Q6_K 1.07 -> 0.81-0.89 s and Q4_K 0.80 -> 0.62-0.68 s (90.4 / 95.0 -> 99.9 / 103.5 tok/s), llama3.2-1b's
    0.58-0.60 -> 0.49-0.50 and 0.65-0.67 -> 0.56-0.59 s; 32 rows made its 2048-value rows' gate / up 7-27% slower."""
    return max(16, (32768 // row_bytes) // 4 * 4)


@njit(inline="always", **DOT)
def _tiles32(kind, bsize, w, d, s, qs, sums, out, n0, n8):
    """out[:, n0:n8] (whole groups of 8 weight rows) for M >= 4 activation rows: each block of 8 weight rows is
    decoded once for a tile of up to _m_tile rows, whose rows8x1 accumulators wait in L1."""
    rb = w.shape[1]
    M, N, K = qs.shape[0], out.shape[1], qs.shape[1]
    MT = _m_tile(K)
    off = _offset32(kind)
    acc = _empty64_rows(MT, 8, np.float32)
    accm = _empty64_rows(MT, 8, np.float32)
    for t in range(0, M, MT):
        t1 = min(M, t + MT)
        for n in range(n0, n8, 8):
            _prefetch_ahead(w, n * rb, 8 * rb)
            for m in range(t1 - t):
                st_f32x8(acc, 32 * m, fzero())
                st_f32x8(accm, 32 * m, fzero())
            for b in range(K // 32):  # block b of the 8 weight rows, decoded once for every row of the tile
                o = n * rb + b * bsize
                u = _codes8(kind, w, o, rb)
                dw = _d8(kind, w, o, rb)
                mw = ld_f16_rows(w, o + 2, rb) if kind == Q4_1 or kind == Q5_1 else fzero()
                for m in range(t, t1):
                    p = _dots8(kind, u, qs, m * K + 32 * b, off * sums[m, b])
                    a = 32 * (m - t)
                    st_f32x8(acc, a, fma_v(ld_f32x8(acc, a), fcvt(p), fscale(dw, d[m, b])))
                    if kind == Q4_1 or kind == Q5_1:
                        st_f32x8(accm, a, fma_v(ld_f32x8(accm, a), mw, fbcast(s[m, b])))
            for m in range(t, t1):
                a = 32 * (m - t)
                st_f32x8(out, 4 * (m * N + n), fadd_v(ld_f32x8(acc, a), ld_f32x8(accm, a)))


@njit(inline="always", **DOT)
def _rows32(kind, bsize, w, d, s, qs, sums, out, n0, n1):
    """out[:, n0:n1] for a 32-value block type: groups of 8 weight rows (lanes) x tiles of activation rows
    (_tiles32, M >= 4; fewer rows go one at a time, rows8x1, without the tiles' scratch), weight rows outside a
    group of 8 one at a time (row32)."""
    rb = w.shape[1]
    M, N = qs.shape[0], out.shape[1]
    n8 = n0 + (n1 - n0) // 8 * 8
    if M >= 4:
        _tiles32(kind, bsize, w, d, s, qs, sums, out, n0, n8)
    else:
        for n in range(n0, n8, 8):
            _prefetch_ahead(w, n * rb, 8 * rb)
            for m in range(M):
                st_f32x8(out, 4 * (m * N + n), rows8x1(kind, bsize, w, n * rb, rb, m, d, s, qs, sums))
    for n in range(n8, n1):
        for m in range(M):
            out[m, n] = row32(kind, bsize, w, n * rb, m, d, s, qs, sums)


@njit(**DOT)
def _rows_q4_0(w, d, s, qs, sums, out, n0, n1):
    _rows32(Q4_0, 18, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_q4_0, DOT_PARALLEL)
def dot_q4_0(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_q4_0", (w, d, s, qs, sums, out), N, CHUNK)


@njit(**DOT)
def _rows_q4_1(w, d, s, qs, sums, out, n0, n1):
    _rows32(Q4_1, 20, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_q4_1, DOT_PARALLEL)
def dot_q4_1(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_q4_1", (w, d, s, qs, sums, out), N, CHUNK)


X8_GROUPS = 2  # groups of 8 interleaved weight rows per parallel work item (CHUNK rows)


@njit(**DOT)
def _rows_q4_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8(Q4_0, 144, w, d, s, qs, sums, out, g0, g1)


X8_TILE_BYTES = 1 << 21  # a multi-row work item's weights: up to about L2's size...
X8_MIN_ITEMS = 32  # ...in at least this many work items (threads take them in turn; a constant, not the thread
# count: numba.get_num_threads in a launcher keeps Numba from caching it)
# An AMX work item's B tiles (its groups' codes unpacked to int8, 8 x K bytes a group): up to this many bytes, which
# stay in L2 while every 16 activation rows go through them (read once per item, not once per pair of groups).
# IQ4_XS kernels alone, 512 rows, 2 threads, Intel Xeon: 8960 x 1536 11.8 -> 9.8 ms, 2048 x 8192 17.4 -> 12.5,
# 1536 x 8960 10.5 -> 10.1; items of 1 MB ran 1536 x 8960 in 12.2 ms
AMX_ITEM_BYTES = 1 << 19


@njit(inline="always", **DOT)
def _x8_chunk(G, group_bytes, M, K, kind):
    """Groups of 8 interleaved weight rows per parallel work item of a tiled kernel: X8_GROUPS for decode and small
    batches (M <= X8_STACK_ROWS); for more activation rows, up to X8_TILE_BYTES of weights, at least X8_MIN_ITEMS
    work items. A work item sweeps every activation tile over its groups, so with X8_GROUPS (2) each 16 weight rows read
    all M activation rows again (an ffn_down's 512 x 8 KB from L3); larger items read them once per item, their
    weights staying in L2. 512-token prefill, Q4_K / Q6_K launchers, Intel Xeon, 2 threads, alternating processes:
    qwen2.5-1.5b 96.5 / 100.3 -> 109.6 / 107.6 tok/s at 512 KB and 105.8 / 110.3 at 2 MB (its 8960 x 1536 gate / up
    2.74 / 2.58 -> 2.20-2.32 s), llama3.2-1b 141-145 -> 147-149 tok/s. The rows' arithmetic is unchanged.
    On the AMX tiles (kind's launcher takes them for M rows) an item's unpacked B tiles are what stays in L2:
    AMX_ITEM_BYTES of them."""
    if _amx_tiles(M, kind) or _vnni_tiles(M, kind):  # a group's B tiles: its 8 rows' codes as K bytes each
        per = max(X8_GROUPS, AMX_ITEM_BYTES // (8 * K))
    elif M <= X8_STACK_ROWS and not _z8_tiles(M, kind):
        return X8_GROUPS
    else:
        per = max(X8_GROUPS, X8_TILE_BYTES // group_bytes)
    per = max(X8_GROUPS, min(per, G // X8_MIN_ITEMS))
    if _vnni_tiles(M, kind) or _z8_tiles(M, kind):  # whole pairs of pairs (32 weight rows at a time)
        return max(4, per - per % 4)
    return per - per % 2  # whole pairs of groups (the AMX tiles take 16 weight rows at a time)


@prange_launcher(_rows_q4_0_x8, DOT_PARALLEL)
def dot_q4_0_x8(w, d, s, qs, sums, out):
    """dot_q4_0 for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/32 * 144]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q4_0)
    if _vnni_tiles(qs.shape[0], Q4_0):  # the quants + 128, for the VNNI tiles
        xu = _plus128(qs)
        run_items("_rows_q4_0_x8", (w, d, s, xu, sums, out), G, per)
    else:
        run_items("_rows_q4_0_x8", (w, d, s, qs, sums, out), G, per)


@njit(**DOT)
def _one_q4_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q4_0, 144, w, d, s, qs, sums, out, g0, g1, False)


@launcher(_one_q4_0_x8, DOT_PARALLEL)
def dot_q4_0_x8_one(w, d, s, qs, sums, out):
    """dot_q4_0_x8 one activation row at a time (the same bits): decode's kernel, dot_q4_0_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q4_0_x8", (w, d, s, qs, sums, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_q4_1_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8(Q4_1, 160, w, d, s, qs, sums, out, g0, g1)


@launcher(_rows_q4_1_x8, DOT_PARALLEL)
def dot_q4_1_x8(w, d, s, qs, sums, out):
    """dot_q4_1 for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/32 * 160]. Every route takes the
    activations as they are (the VNNI tiles too: _vnni_unsigned), so no layout pass of its own: a serial launcher."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q4_1)
    run_items("_rows_q4_1_x8", (w, d, s, qs, sums, out), G, per)


@njit(**DOT)
def _one_q4_1_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q4_1, 160, w, d, s, qs, sums, out, g0, g1, False)


@launcher(_one_q4_1_x8, DOT_PARALLEL)
def dot_q4_1_x8_one(w, d, s, qs, sums, out):
    """dot_q4_1_x8 one activation row at a time (the same bits): decode's kernel, dot_q4_1_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q4_1_x8", (w, d, s, qs, sums, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_q5_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8(Q5_0, 176, w, d, s, qs, sums, out, g0, g1)


@prange_launcher(_rows_q5_0_x8, DOT_PARALLEL)
def dot_q5_0_x8(w, d, s, qs, sums, out):
    """dot_q5_0 for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/32 * 176]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q5_0)
    if _vnni_tiles(qs.shape[0], Q5_0):  # the quants + 128, for the VNNI tiles
        xu = _plus128(qs)
        run_items("_rows_q5_0_x8", (w, d, s, xu, sums, out), G, per)
    else:
        run_items("_rows_q5_0_x8", (w, d, s, qs, sums, out), G, per)


@njit(**DOT)
def _one_q5_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q5_0, 176, w, d, s, qs, sums, out, g0, g1, False)


@launcher(_one_q5_0_x8, DOT_PARALLEL)
def dot_q5_0_x8_one(w, d, s, qs, sums, out):
    """dot_q5_0_x8 one activation row at a time (the same bits): decode's kernel, dot_q5_0_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q5_0_x8", (w, d, s, qs, sums, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_q8_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8(Q8_0, 272, w, d, s, qs, sums, out, g0, g1)


@prange_launcher(_rows_q8_0_x8, DOT_PARALLEL)
def dot_q8_0_x8(w, d, s, qs, sums, out):
    """dot_q8_0 for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/32 * 272]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q8_0)
    if _vnni_tiles(qs.shape[0], Q8_0):  # the quants + 128, for the VNNI tiles
        xu = _plus128(qs)
        run_items("_rows_q8_0_x8", (w, d, s, xu, sums, out), G, per)
    else:
        run_items("_rows_q8_0_x8", (w, d, s, qs, sums, out), G, per)


@njit(**DOT)
def _one_q8_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q8_0, 272, w, d, s, qs, sums, out, g0, g1, False)


@launcher(_one_q8_0_x8, DOT_PARALLEL)
def dot_q8_0_x8_one(w, d, s, qs, sums, out):
    """dot_q8_0_x8 one activation row at a time (the same bits): decode's kernel, dot_q8_0_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q8_0_x8", (w, d, s, qs, sums, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_q5_0(w, d, s, qs, sums, out, n0, n1):
    _rows32(Q5_0, 22, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_q5_0, DOT_PARALLEL)
def dot_q5_0(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_q5_0", (w, d, s, qs, sums, out), N, CHUNK)


@njit(**DOT)
def _rows_q5_1(w, d, s, qs, sums, out, n0, n1):
    _rows32(Q5_1, 24, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_q5_1, DOT_PARALLEL)
def dot_q5_1(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_q5_1", (w, d, s, qs, sums, out), N, CHUNK)


@njit(**DOT)
def _rows_q8_0(w, d, s, qs, sums, out, n0, n1):
    _rows32(Q8_0, 34, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_q8_0, DOT_PARALLEL)
def dot_q8_0(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_q8_0", (w, d, s, qs, sums, out), N, CHUNK)


@njit(**DOT)
def _rows_iq4_nl(w, d, s, qs, sums, out, n0, n1):
    _rows32(IQ4_NL, 18, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_iq4_nl, DOT_PARALLEL)
def dot_iq4_nl(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_iq4_nl", (w, d, s, qs, sums, out), N, CHUNK)


@njit(inline="always", **DOT)
def _rowsk(kind, bsize, w, qu, d, b16, b32, qs, out, n0, n1):
    """out[:, n0:n1] for a K-quant: tiles of 4 activation rows sweep the chunk's weight rows (each weight group
    decoded once per 4 rows), the M % 4 rest one activation row at a time, 8 weight rows at a time for rows of
    ROWK8_MIN_K values or more (rowk8; rows outside a group of 8, and shorter rows: rowk)."""
    rb = w.shape[1]
    M, N = qs.shape[0], out.shape[1]
    M4 = M // 4 * 4
    MT = _m_tile(qs.shape[1])
    for t in range(0, M4, MT):
        for n in range(n0, n1):
            _prefetch_ahead(w, n * rb, rb)
            for m in range(t, min(M4, t + MT), 4):
                out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = rowkx4(
                    kind, bsize, w, n * rb, qu, m, d, b16, b32, qs
                )
    if M4 < M:
        n8 = n0 + (n1 - n0) // 8 * 8 if qs.shape[1] >= ROWK8_MIN_K else n0
        lanes = carray(k_scratch(), (16, 8))  # not np.empty: up to ~0.7 us per chunk while weights stream
        for n in range(n0, n8, 8):
            for m in range(M4, M):
                st_f32x8(out, 4 * (m * N + n), rowk8(kind, bsize, w, n * rb, rb, qu, m, d, b16, b32, qs, lanes))
        for n in range(n8, n1):
            _prefetch_ahead(w, n * rb, rb)
            for m in range(M4, M):
                out[m, n] = rowk(kind, bsize, w, n * rb, qu, m, d, b16, b32, qs)


@njit(**DOT)
def _rows_q2_k(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowsk(Q2_K, 84, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_q2_k, DOT_PARALLEL)
def dot_q2_k(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_q2_k", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_q3_k(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowsk(Q3_K, 110, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_q3_k, DOT_PARALLEL)
def dot_q3_k(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_q3_k", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_q4_k(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowsk(Q4_K, 144, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_q4_k, DOT_PARALLEL)
def dot_q4_k(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_q4_k", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_q5_k(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowsk(Q5_K, 176, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_q5_k, DOT_PARALLEL)
def dot_q5_k(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_q5_k", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_q6_k(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowsk(Q6_K, 210, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_q6_k, DOT_PARALLEL)
def dot_q6_k(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_q6_k", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_q4_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8(Q4_K, w, qu, d, b16, b32, qs, out, g0, g1)


@prange_launcher(_rows_q4_k_x8, DOT_PARALLEL)
def dot_q4_k_x8(w, qu, d, b16, b32, qs, out):
    """dot_q4_k for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/256 * 1184]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q4_K)
    if _pair_tiles(qs.shape[0], Q4_K):  # AVX-512: pairs of activation rows laid out together, for the pair tiles
        dp, b32p, qp = _pairs_q8_k(d, b32, qs)
        run_items("_rows_q4_k_x8", (w, qu, dp, b16, b32p, qp, out), G, per)
    else:
        run_items("_rows_q4_k_x8", (w, qu, d, b16, b32, qs, out), G, per)


@njit(**DOT)
def _one_q4_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(Q4_K, w, d, b16, b32, qs, out, g0, g1, False)


@launcher(_one_q4_k_x8, DOT_PARALLEL)
def dot_q4_k_x8_one(w, qu, d, b16, b32, qs, out):
    """dot_q4_k_x8 one activation row at a time (the same bits): decode's kernel, dot_q4_k_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q4_k_x8", (w, qu, d, b16, b32, qs, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_q5_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8(Q5_K, w, qu, d, b16, b32, qs, out, g0, g1)


@prange_launcher(_rows_q5_k_x8, DOT_PARALLEL)
def dot_q5_k_x8(w, qu, d, b16, b32, qs, out):
    """dot_q5_k for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/256 * 1440]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q5_K)
    if _pair_tiles(qs.shape[0], Q5_K):  # AVX-512: pairs of activation rows laid out together, for the pair tiles
        dp, b32p, qp = _pairs_q8_k(d, b32, qs)
        run_items("_rows_q5_k_x8", (w, qu, dp, b16, b32p, qp, out), G, per)
    else:
        run_items("_rows_q5_k_x8", (w, qu, d, b16, b32, qs, out), G, per)


@njit(**DOT)
def _one_q5_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(Q5_K, w, d, b16, b32, qs, out, g0, g1, False)


@launcher(_one_q5_k_x8, DOT_PARALLEL)
def dot_q5_k_x8_one(w, qu, d, b16, b32, qs, out):
    """dot_q5_k_x8 one activation row at a time (the same bits): decode's kernel, dot_q5_k_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q5_k_x8", (w, qu, d, b16, b32, qs, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_q6_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8(Q6_K, w, qu, d, b16, b32, qs, out, g0, g1)


@prange_launcher(_rows_q6_k_x8, DOT_PARALLEL)
def dot_q6_k_x8(w, qu, d, b16, b32, qs, out):
    """dot_q6_k for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/256 * 1680]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], Q6_K)
    if _pair_tiles(qs.shape[0], Q6_K):  # AVX-512: pairs of activation rows laid out together, for the pair tiles
        dp, b16p, qp = _pairs_q8_k(d, b16, qs)
        run_items("_rows_q6_k_x8", (w, qu, dp, b16p, b32, qp, out), G, per)
    else:
        run_items("_rows_q6_k_x8", (w, qu, d, b16, b32, qs, out), G, per)


@njit(**DOT)
def _one_q6_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(Q6_K, w, d, b16, b32, qs, out, g0, g1, False)


@launcher(_one_q6_k_x8, DOT_PARALLEL)
def dot_q6_k_x8_one(w, qu, d, b16, b32, qs, out):
    """dot_q6_k_x8 one activation row at a time (the same bits): decode's kernel, dot_q6_k_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_q6_k_x8", (w, qu, d, b16, b32, qs, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_iq4_xs_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    if _vnni_given(out, qs, IQ4_XS):
        _rowsk_vnni(IQ4_XS, w, qu, d, b32, out, g0, g1)
    elif _amx_given(out, qs, IQ4_XS):
        _rowsk_amx(IQ4_XS, w, d, b16, b32, qs, out, g0, g1)
    elif _pairs_given(out.shape[0], IQ4_XS):  # the activations as pairs (dot_iq4_xs_x8)
        _rowsk_z(IQ4_XS, w, d, b16, b32, qs, out, g0, g1)
    else:  # one row (the interleaved IQ4_XS layout exists only where pair tiles do)
        _rowsk_x8_one(IQ4_XS, w, d, b16, b32, qs, out, g0, g1, False)


@prange_launcher(_rows_iq4_xs_x8, DOT_PARALLEL)
def dot_iq4_xs_x8(w, qu, d, b16, b32, qs, out):
    """dot_iq4_xs for weights in ggufrun.quants.repack's interleaved layout: w [N/8, K/256 * 1104]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], IQ4_XS)
    if _pair_tiles(qs.shape[0], IQ4_XS):  # AVX-512: pairs of activation rows laid out together, for the pair tiles
        dp, b32p, qp = _pairs_q8_k(d, b32, qs)
        run_items("_rows_iq4_xs_x8", (w, qu, dp, b16, b32p, qp, out), G, per)
    else:
        run_items("_rows_iq4_xs_x8", (w, qu, d, b16, b32, qs, out), G, per)


@njit(**DOT)
def _one_iq4_xs_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(IQ4_XS, w, d, b16, b32, qs, out, g0, g1, False)


@launcher(_one_iq4_xs_x8, DOT_PARALLEL)
def dot_iq4_xs_x8_one(w, qu, d, b16, b32, qs, out):
    """dot_iq4_xs_x8 one activation row at a time (the same bits): decode's kernel, dot_iq4_xs_x8's stand-in while its
    tiles compile."""
    G = w.shape[0]
    run_items("_one_iq4_xs_x8", (w, qu, d, b16, b32, qs, out), G, X8_GROUPS)


@njit(**DOT)
def _rows_iq4_nl_x8(w, d, s, qs, sums, out, g0, g1):
    if _vnni_given(out, qs, IQ4_NL):  # qs: the quants + 128 (dot_iq4_nl_x8)
        _rows_vnni(IQ4_NL, 144, w, d, s, qs, out, g0, g1)
    elif _amx_given_32(out, qs, IQ4_NL):
        _rows_amx(IQ4_NL, 144, w, d, s, qs, sums, out, g0, g1)
    elif _z8_given(out, qs, IQ4_NL):
        _rows_zq(IQ4_NL, 144, w, d, s, qs, sums, out, g0, g1)
    else:  # one row (the interleaved IQ4_NL layout exists only on AVX-512, where two or more rows take the above)
        _rows_x8_one(IQ4_NL, 144, w, d, s, qs, sums, out, g0, g1, False)


@prange_launcher(_rows_iq4_nl_x8, DOT_PARALLEL)
def dot_iq4_nl_x8(w, d, s, qs, sums, out):
    """dot_iq4_nl for weights in ggufrun.quants.repack's interleaved layout (Q4_0's): w [N/8, K/32 * 144]."""
    G = w.shape[0]
    per = _x8_chunk(G, w.shape[1], qs.shape[0], qs.shape[1], IQ4_NL)
    if _vnni_tiles(qs.shape[0], IQ4_NL):  # the quants + 128, for the VNNI tiles
        xu = _plus128(qs)
        run_items("_rows_iq4_nl_x8", (w, d, s, xu, sums, out), G, per)
    else:
        run_items("_rows_iq4_nl_x8", (w, d, s, qs, sums, out), G, per)


@njit(**DOT)
def _one_iq4_nl_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(IQ4_NL, 144, w, d, s, qs, sums, out, g0, g1, False)


@launcher(_one_iq4_nl_x8, DOT_PARALLEL)
def dot_iq4_nl_x8_one(w, d, s, qs, sums, out):
    """dot_iq4_nl_x8 one activation row at a time (the same bits): decode's kernel, dot_iq4_nl_x8's stand-in while
    its tiles compile."""
    G = w.shape[0]
    run_items("_one_iq4_nl_x8", (w, d, s, qs, sums, out), G, X8_GROUPS)


# each interleaved layout's full kernel -> its one-row kernel (ggufrun.model.linear.Linear.dot_one)
ONE_ROW = {
    dot_q4_0_x8: dot_q4_0_x8_one,
    dot_iq4_nl_x8: dot_iq4_nl_x8_one,
    dot_q4_1_x8: dot_q4_1_x8_one,
    dot_q5_0_x8: dot_q5_0_x8_one,
    dot_q8_0_x8: dot_q8_0_x8_one,
    dot_q4_k_x8: dot_q4_k_x8_one,
    dot_q5_k_x8: dot_q5_k_x8_one,
    dot_q6_k_x8: dot_q6_k_x8_one,
    dot_iq4_xs_x8: dot_iq4_xs_x8_one,
}

# ---- Decode from DRAM on AMD Zen 4: one group of 8 rows at a time ------------------------------------------------
# The 16-row vectors of decode (_group_k_z16_one, _group_x8_z16_one) read two streams a thread, groups A and B of a
# pair side by side, each a group's length (a few KB) before both jump to the next pair; the 256-bit one-row code
# (_group_k_x8_one, _group_x8_one) reads one, the thread's run of groups in order. From L2 / L3 the 16-row vectors are
# faster (Q4_K 17,920 x 1,536, one thread, in cache: 45 against 39 GB/s); from DRAM, on AMD EPYC Zen 4, one stream is
# what the hardware prefetchers follow: the same matrix, 28 copies (446 MB), 22.1 against 29.3-30.6 GB/s on one thread
# and 32.3-33.0 against 36.9 on two (a plain sum over 1 GiB: 34.5 / 36.4 then). Software prefetch did not close the
# gap (24, 48 or 96 KB ahead into L2, or a second hint 2-4 KB ahead into L1: 20.2-22.6 GB/s on one thread; none:
# 13.9), nor does a synthetic stream need it: two interleaved 6.9 KB streams a thread read at 16.7 GB/s where one long
# one with the same arithmetic a line read at 34.9, and software prefetch slowed that one to 27.4. Whole decode steps,
# alternating processes, 2 threads (2026-12-05): llama3.2-1b Q4_K_M 36.9-45.9 -> 41.0-56.2 tok/s, qwen2.5-1.5b
# 29.9-36.1 -> 44.1-44.3, SmolLM2 Q4_1 240-265 -> 267-289, qwen2.5-0.5b 74-75 -> 80-81.
# So where Numba's CPU is AMD Zen (DECODE_PREFETCH_L2 above, where this was measured) and the model's weights are
# larger than the last-level cache (ggufrun.model.weights.repack_matrices: they stream from DRAM every token), decode
# takes these kernels (STREAM_ROW), the same bits as dot_*_x8_one's (each lane's integer and float steps are the
# same). IQ4_XS and IQ4_NL, whose interleaved layouts exist only with AVX-512, take one group at a time through code of
# their own (_group_iq4_xs_x8_one, _group_iq4_nl_x8_one: the code book looked up 32 bytes at a time, iq4_codes_x8);
# IQ4_XS 8,960 x 1,536 x 40 copies from DRAM, alternating: 1 thread 24.7-27.0 -> 28.3-29.0 GB/s, 2 threads 47.8-50.7
# -> 53.4-55.5. A decode step's chosen experts stream the same way (EXPERTS_STREAM, at the end of this module).
DECODE_STREAM = HAS_ZMM and DECODE_PREFETCH_L2


@njit(**DOT)
def _stream_q4_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q4_0, 144, w, d, s, qs, sums, out, g0, g1, True)


@launcher(_stream_q4_0_x8, DOT_PARALLEL)
def dot_q4_0_x8_stream(w, d, s, qs, sums, out):
    """dot_q4_0_x8_one one group of 8 rows at a time (the same bits): decode's kernel for weights that stream from
    DRAM (DECODE_STREAM)."""
    run_items("_stream_q4_0_x8", (w, d, s, qs, sums, out), w.shape[0], X8_GROUPS)


@njit(**DOT)
def _stream_q4_1_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q4_1, 160, w, d, s, qs, sums, out, g0, g1, True)


@launcher(_stream_q4_1_x8, DOT_PARALLEL)
def dot_q4_1_x8_stream(w, d, s, qs, sums, out):
    """dot_q4_1_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_q4_1_x8", (w, d, s, qs, sums, out), w.shape[0], X8_GROUPS)


@njit(**DOT)
def _stream_q5_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q5_0, 176, w, d, s, qs, sums, out, g0, g1, True)


@launcher(_stream_q5_0_x8, DOT_PARALLEL)
def dot_q5_0_x8_stream(w, d, s, qs, sums, out):
    """dot_q5_0_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_q5_0_x8", (w, d, s, qs, sums, out), w.shape[0], X8_GROUPS)


@njit(**DOT)
def _stream_q8_0_x8(w, d, s, qs, sums, out, g0, g1):
    _rows_x8_one(Q8_0, 272, w, d, s, qs, sums, out, g0, g1, True)


@launcher(_stream_q8_0_x8, DOT_PARALLEL)
def dot_q8_0_x8_stream(w, d, s, qs, sums, out):
    """dot_q8_0_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_q8_0_x8", (w, d, s, qs, sums, out), w.shape[0], X8_GROUPS)


@njit(**DOT)
def _stream_q4_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(Q4_K, w, d, b16, b32, qs, out, g0, g1, True)


@launcher(_stream_q4_k_x8, DOT_PARALLEL)
def dot_q4_k_x8_stream(w, qu, d, b16, b32, qs, out):
    """dot_q4_k_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_q4_k_x8", (w, qu, d, b16, b32, qs, out), w.shape[0], X8_GROUPS)


@njit(**DOT)
def _stream_q5_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(Q5_K, w, d, b16, b32, qs, out, g0, g1, True)


@launcher(_stream_q5_k_x8, DOT_PARALLEL)
def dot_q5_k_x8_stream(w, qu, d, b16, b32, qs, out):
    """dot_q5_k_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_q5_k_x8", (w, qu, d, b16, b32, qs, out), w.shape[0], X8_GROUPS)


@njit(**DOT)
def _stream_q6_k_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    _rowsk_x8_one(Q6_K, w, d, b16, b32, qs, out, g0, g1, True)


@launcher(_stream_q6_k_x8, DOT_PARALLEL)
def dot_q6_k_x8_stream(w, qu, d, b16, b32, qs, out):
    """dot_q6_k_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_q6_k_x8", (w, qu, d, b16, b32, qs, out), w.shape[0], X8_GROUPS)


@njit(inline="always", **DOT)
def _group_iq4_nl_x8_one(w, go, d1, sums1, qs, nb, m):
    """_group_x8_z16_one's lanes for IQ4_NL, one group of 8 rows (byte go) at a time: per block the code book + 128
    against the quants (dpbusd), less 128 x the block's quant sum, then the same float step; the final + 0 is the
    16-row code's add of its (zero) m terms, which turns -0.0 into +0.0. A function of its own, not a branch of
    _group_x8_one / _codes32_x8: there the branch was compiled into every other 32-value type's kernels (cold compile
    of six one-row kernels 5.33-5.34 s without such branches, 5.91-6.05 s with them)."""
    acc = fzero()
    xo, bo = m * 32 * nb, m * nb
    for b in range(nb):
        o = go + b * 144
        p = isubs(dotw_x8(iq4_codes_x8(w, o + 16), qs, xo + 32 * b), 128 * sums1[bo + b])
        acc = fma_v(acc, fcvt(p), fscale(ld_f16x8(w, o), d1[bo + b]))
    return fadd_v(acc, fzero())


@njit(inline="always", **DOT)
def _row_iq4_nl_x8(w, wg, d1, sums1, qs, m, out, o, g0, g1):
    """out[o, 8 g0 : 8 g1] = activation row m times groups wg + g0 .. wg + g1 - 1 of IQ4_NL's w, one group at a time
    (_row_x8's `stream` for IQ4_NL)."""
    nb, rb, N = qs.shape[1] // 32, w.shape[1], out.shape[1]
    for g in range(g0, g1):
        st_f32x8(out, 4 * (o * N + 8 * g), _group_iq4_nl_x8_one(w, (wg + g) * rb, d1, sums1, qs, nb, m))


@njit(**DOT)
def _stream_iq4_nl_x8(w, d, s, qs, sums, out, g0, g1):
    d1, sums1 = d.reshape(-1), sums.reshape(-1)
    for m in range(qs.shape[0]):
        _row_iq4_nl_x8(w, 0, d1, sums1, qs, m, out, m, g0, g1)


@launcher(_stream_iq4_nl_x8, DOT_PARALLEL)
def dot_iq4_nl_x8_stream(w, d, s, qs, sums, out):
    """dot_iq4_nl_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_iq4_nl_x8", (w, d, s, qs, sums, out), w.shape[0], X8_GROUPS)


@njit(inline="always", **DOT)
def _group_iq4_xs_x8_one(w, go, d1, b32, qs, nsb, m):
    """_group_k_z16_one's lanes for IQ4_XS, one group of 8 rows (byte go) at a time: per 32-value sub-block the code
    book + 128 against the quants (dpbusd) times its scale (vpmulld), less 128 x the scales . the sub-blocks' quant
    sums, then the same float step (+ 0 as _group_iq4_nl_x8_one's); its own function for the same reason."""
    n32 = b32.shape[1]
    K = 256 * nsb
    acc = fzero()
    for b in range(nsb):
        o, xo, bo = go + b * IQ4_XS_X8_BYTES, m * K + 256 * b, 4 * (m * n32 + 8 * b)
        s, c = izero(), izero()
        for gg in range(8):
            sc = kscw_x8(w, o + 16 + 16 * (gg // 2), gg % 2)
            s = imuladd(s, dotw_x8(iq4_codes_x8(w, o + 80 + 128 * gg), qs, xo + 32 * gg), sc)
        for k in range(4):  # pairs of sub-blocks: scales . quant sums (kiq4_z16)
            c = iadd(c, koff6_x8(w, o + 16 + 16 * k, b32, bo + 8 * k))
        acc = fma_v(acc, fcvt(iaddmul(s, c, -128)), fscale(ld_f16x8(w, o), d1[m * nsb + b]))
    return fadd_v(acc, fzero())


@njit(inline="always", **DOT)
def _row_iq4_xs_x8(w, wg, d1, b32, qs, m, out, o, g0, g1):
    """out[o, 8 g0 : 8 g1] = activation row m times groups wg + g0 .. wg + g1 - 1 of IQ4_XS's w, one group at a time
    (_row_k_x8's `stream` for IQ4_XS)."""
    nsb, rb, N = qs.shape[1] // 256, w.shape[1], out.shape[1]
    for g in range(g0, g1):
        st_f32x8(out, 4 * (o * N + 8 * g), _group_iq4_xs_x8_one(w, (wg + g) * rb, d1, b32, qs, nsb, m))


@njit(**DOT)
def _stream_iq4_xs_x8(w, qu, d, b16, b32, qs, out, g0, g1):
    d1 = d.reshape(-1)
    for m in range(qs.shape[0]):
        _row_iq4_xs_x8(w, 0, d1, b32, qs, m, out, m, g0, g1)


@launcher(_stream_iq4_xs_x8, DOT_PARALLEL)
def dot_iq4_xs_x8_stream(w, qu, d, b16, b32, qs, out):
    """dot_iq4_xs_x8_one one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_stream_iq4_xs_x8", (w, qu, d, b16, b32, qs, out), w.shape[0], X8_GROUPS)


# each interleaved layout's full kernel -> its one-row kernel for weights that stream from DRAM (DECODE_STREAM); the
# kernels in it without a one-group version, and every kernel where the CPU is not one DECODE_STREAM was measured on,
# map to ONE_ROW's
STREAM_ROW = dict(ONE_ROW)
if DECODE_STREAM:
    STREAM_ROW.update({
        dot_q4_0_x8: dot_q4_0_x8_stream,
        dot_q4_1_x8: dot_q4_1_x8_stream,
        dot_q5_0_x8: dot_q5_0_x8_stream,
        dot_q8_0_x8: dot_q8_0_x8_stream,
        dot_q4_k_x8: dot_q4_k_x8_stream,
        dot_q5_k_x8: dot_q5_k_x8_stream,
        dot_q6_k_x8: dot_q6_k_x8_stream,
        dot_iq4_nl_x8: dot_iq4_nl_x8_stream,
        dot_iq4_xs_x8: dot_iq4_xs_x8_stream,
    })  # fmt: skip


@njit(**DOT)
def _rows_iq4_xs(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowsk(IQ4_XS, 136, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_iq4_xs, DOT_PARALLEL)
def dot_iq4_xs(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq4_xs", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(inline="always", **DOT)
def _rowsiq(kind, bsize, w, d, qs, out, n0, n1):
    """out[:, n0:n1] for a grid type: tiles of 4 activation rows sweep the chunk's weight rows (each weight group
    decoded once per 4 rows), the M % 4 rest one activation row at a time."""
    rb = w.shape[1]
    M = qs.shape[0]
    M4 = M // 4 * 4
    MT = _m_tile(qs.shape[1])
    for t in range(0, M4, MT):
        for n in range(n0, n1):
            _prefetch_ahead(w, n * rb, rb)
            for m in range(t, min(M4, t + MT), 4):
                out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = rowiqx4(kind, bsize, w, n * rb, m, d, qs)
    for n in range(n0, n1):
        _prefetch_ahead(w, n * rb, rb)
        for m in range(M4, M):
            out[m, n] = rowiq(kind, bsize, w, n * rb, m, d, qs)


@njit(**DOT)
def _rows_iq2_xxs(w, d, qs, out, n0, n1):
    _rowsiq(IQ2_XXS, 66, w, d, qs, out, n0, n1)


@launcher(_rows_iq2_xxs, DOT_PARALLEL, (0, 2, 5, 6))
def dot_iq2_xxs(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq2_xxs", (w, d, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_iq2_xs(w, d, qs, out, n0, n1):
    _rowsiq(IQ2_XS, 74, w, d, qs, out, n0, n1)


@launcher(_rows_iq2_xs, DOT_PARALLEL, (0, 2, 5, 6))
def dot_iq2_xs(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq2_xs", (w, d, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_iq2_s(w, d, qs, out, n0, n1):
    _rowsiq(IQ2_S, 82, w, d, qs, out, n0, n1)


@launcher(_rows_iq2_s, DOT_PARALLEL, (0, 2, 5, 6))
def dot_iq2_s(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq2_s", (w, d, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_iq3_xxs(w, d, qs, out, n0, n1):
    _rowsiq(IQ3_XXS, 98, w, d, qs, out, n0, n1)


@launcher(_rows_iq3_xxs, DOT_PARALLEL, (0, 2, 5, 6))
def dot_iq3_xxs(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq3_xxs", (w, d, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_iq3_s(w, d, qs, out, n0, n1):
    _rowsiq(IQ3_S, 110, w, d, qs, out, n0, n1)


@launcher(_rows_iq3_s, DOT_PARALLEL, (0, 2, 5, 6))
def dot_iq3_s(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq3_s", (w, d, qs, out), N, CHUNK)


@njit(inline="always", **DOT)
def _rows_float(kind, width, w, x, out, n0, n1):
    """out[:, n0:n1] for float weights of `width` bytes: 4-row tiles, then the M % 4 rest one row at a time."""
    rb = width * x.shape[1]
    M4 = x.shape[0] // 4 * 4
    MT = _m_tile(4 * x.shape[1])
    for t in range(0, M4, MT):
        for n in range(n0, n1):
            _prefetch_ahead(w, n * rb, rb)
            for m in range(t, min(M4, t + MT), 4):
                out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = row_floatx4(kind, w, n, x, m)
    for n in range(n0, n1):
        _prefetch_ahead(w, n * rb, rb)
        for m in range(M4, x.shape[0]):
            out[m, n] = row_float(kind, w, n, x, m)


@njit(**DOT)
def _rows_f32(w, x, out, n0, n1):
    _rows_float(F32, 4, w, x, out, n0, n1)


@launcher(_rows_f32, DOT_PARALLEL)
def dot_f32(w, x, out):
    N = w.shape[0]
    run_items("_rows_f32", (w, x, out), N, CHUNK)


@njit(**DOT)
def _rows_f16(w, x, out, n0, n1):
    _rows_float(F16, 2, w, x, out, n0, n1)


@launcher(_rows_f16, DOT_PARALLEL)
def dot_f16(w, x, out):
    N = w.shape[0]
    run_items("_rows_f16", (w, x, out), N, CHUNK)


@njit(**DOT)
def _rows_bf16(w, x, out, n0, n1):
    _rows_float(BF16, 2, w, x, out, n0, n1)


@launcher(_rows_bf16, DOT_PARALLEL)
def dot_bf16(w, x, out):
    N = w.shape[0]
    run_items("_rows_bf16", (w, x, out), N, CHUNK)


# ---- IQ1_S, IQ1_M, TQ1_0, TQ2_0 (ternary codes, Q8_K activations) and MXFP4 (32-value blocks, Q8_1) -----------


@njit(inline="always", **DOT)
def _rowst(kind, bsize, w, qu, d, b16, b32, qs, out, n0, n1):
    """out[:, n0:n1] for a ternary-code type: as _rowsk, with rowtx4 / rowt."""
    rb = w.shape[1]
    M = qs.shape[0]
    M4 = M // 4 * 4
    MT = _m_tile(qs.shape[1])
    for t in range(0, M4, MT):
        for n in range(n0, n1):
            _prefetch_ahead(w, n * rb, rb)
            for m in range(t, min(M4, t + MT), 4):
                out[m, n], out[m + 1, n], out[m + 2, n], out[m + 3, n] = rowtx4(
                    kind, bsize, w, n * rb, m, d, b16, b32, qs
                )
    for n in range(n0, n1):
        _prefetch_ahead(w, n * rb, rb)
        for m in range(M4, M):
            out[m, n] = rowt(kind, bsize, w, n * rb, m, d, b16, b32, qs)


@njit(**DOT)
def _rows_iq1_s(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowst(IQ1_S, 50, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_iq1_s, DOT_PARALLEL)
def dot_iq1_s(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq1_s", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_iq1_m(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowst(IQ1_M, 56, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_iq1_m, DOT_PARALLEL)
def dot_iq1_m(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_iq1_m", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_tq1_0(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowst(TQ1_0, 54, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_tq1_0, DOT_PARALLEL)
def dot_tq1_0(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_tq1_0", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_tq2_0(w, qu, d, b16, b32, qs, out, n0, n1):
    _rowst(TQ2_0, 66, w, qu, d, b16, b32, qs, out, n0, n1)


@launcher(_rows_tq2_0, DOT_PARALLEL)
def dot_tq2_0(w, qu, d, b16, b32, qs, out):
    N = w.shape[0]
    run_items("_rows_tq2_0", (w, qu, d, b16, b32, qs, out), N, CHUNK)


@njit(**DOT)
def _rows_mxfp4(w, d, s, qs, sums, out, n0, n1):
    _rows32(MXFP4, 17, w, d, s, qs, sums, out, n0, n1)


@launcher(_rows_mxfp4, DOT_PARALLEL)
def dot_mxfp4(w, d, s, qs, sums, out):
    N = w.shape[0]
    run_items("_rows_mxfp4", (w, d, s, qs, sums, out), N, CHUNK)


# A mixture-of-experts decode step runs its token's k chosen experts through one kernel call per matrix instead of k
# (ggml's mul_mat_id): w holds every expert's matrix of one 3-D tensor stacked in the interleaved layout (G groups of
# 8 rows each, ggufrun.model.weights.repack_matrices' pack_experts), out row r = expert sel[r] times activation row
# 0 (shared: the gate / up of one token's h) or row r (each expert's own input: the downs). The work items are
# the one-row kernels' (X8_GROUPS groups of one expert), all k experts' in one parallel region, so each expert's rows
# give the bits dot_*_x8_one gives them.


@njit(inline="always", **DOT)
def _experts_x8(kind, bsize, w, d, s, qs, sums, out, sel, shared, i0, i1, stream):
    """Work items i0..i1 of a 32-value type's experts kernel (dot_*_x8_experts; `stream`: one group at a time,
    dot_*_x8_experts_stream)."""
    G = out.shape[1] // 8
    per = (G + X8_GROUPS - 1) // X8_GROUPS
    d1, s1, sums1 = d.reshape(-1), s.reshape(-1), sums.reshape(-1)
    for i in range(i0, i1):
        r, g0 = i // per, (i % per) * X8_GROUPS
        m = 0 if shared else r
        g1 = min(G, g0 + X8_GROUPS)
        if kind == IQ4_NL and stream:
            _row_iq4_nl_x8(w, sel[r] * G, d1, sums1, qs, m, out, r, g0, g1)
        else:
            _row_x8(kind, bsize, w, sel[r] * G, d1, s1, sums1, qs, m, out, r, g0, g1, stream)


@njit(inline="always", **DOT)
def _expertsk_x8(kind, w, d, b16, b32, qs, out, sel, shared, i0, i1, stream):
    """Work items i0..i1 of a 256-value type's experts kernel (dot_*_x8_experts; `stream`: one group at a time,
    dot_*_x8_experts_stream)."""
    G = out.shape[1] // 8
    per = (G + X8_GROUPS - 1) // X8_GROUPS
    d1 = d.reshape(-1)
    for i in range(i0, i1):
        r, g0 = i // per, (i % per) * X8_GROUPS
        m = 0 if shared else r
        g1 = min(G, g0 + X8_GROUPS)
        if kind == IQ4_XS and stream:
            _row_iq4_xs_x8(w, sel[r] * G, d1, b32, qs, m, out, r, g0, g1)
        else:
            _row_k_x8(kind, w, sel[r] * G, d1, b16, b32, qs, m, out, r, g0, g1, stream)


@njit(inline="always", **DOT)
def _expert_items(out, sel):
    """The number of work items of an experts kernel: X8_GROUPS groups of one expert each."""
    return sel.shape[0] * ((out.shape[1] // 8 + X8_GROUPS - 1) // X8_GROUPS)


@njit(**DOT)
def _experts_q4_0_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q4_0, 144, w, d, s, qs, sums, out, sel, shared, i0, i1, False)


@launcher(_experts_q4_0_x8, DOT_PARALLEL)
def dot_q4_0_x8_experts(w, d, s, qs, sums, out, sel, shared):
    """out[r] = activation row (0 if shared else r) times expert sel[r]'s rows of the stack w (out.shape[1] rows
    each), for every rank r, in one parallel region (the bits of dot_q4_0_x8_one)."""
    run_items("_experts_q4_0_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_q4_1_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q4_1, 160, w, d, s, qs, sums, out, sel, shared, i0, i1, False)


@launcher(_experts_q4_1_x8, DOT_PARALLEL)
def dot_q4_1_x8_experts(w, d, s, qs, sums, out, sel, shared):
    """dot_q4_0_x8_experts for Q4_1 (the bits of dot_q4_1_x8_one)."""
    run_items("_experts_q4_1_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_q5_0_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q5_0, 176, w, d, s, qs, sums, out, sel, shared, i0, i1, False)


@launcher(_experts_q5_0_x8, DOT_PARALLEL)
def dot_q5_0_x8_experts(w, d, s, qs, sums, out, sel, shared):
    """dot_q4_0_x8_experts for Q5_0 (the bits of dot_q5_0_x8_one)."""
    run_items("_experts_q5_0_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_q8_0_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q8_0, 272, w, d, s, qs, sums, out, sel, shared, i0, i1, False)


@launcher(_experts_q8_0_x8, DOT_PARALLEL)
def dot_q8_0_x8_experts(w, d, s, qs, sums, out, sel, shared):
    """dot_q4_0_x8_experts for Q8_0 (the bits of dot_q8_0_x8_one)."""
    run_items("_experts_q8_0_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_iq4_nl_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(IQ4_NL, 144, w, d, s, qs, sums, out, sel, shared, i0, i1, False)


@launcher(_experts_iq4_nl_x8, DOT_PARALLEL)
def dot_iq4_nl_x8_experts(w, d, s, qs, sums, out, sel, shared):
    """dot_q4_0_x8_experts for IQ4_NL (the bits of dot_iq4_nl_x8_one)."""
    run_items("_experts_iq4_nl_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_q4_k_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(Q4_K, w, d, b16, b32, qs, out, sel, shared, i0, i1, False)


@launcher(_experts_q4_k_x8, DOT_PARALLEL)
def dot_q4_k_x8_experts(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q4_0_x8_experts for Q4_K (the bits of dot_q4_k_x8_one)."""
    run_items("_experts_q4_k_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_q5_k_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(Q5_K, w, d, b16, b32, qs, out, sel, shared, i0, i1, False)


@launcher(_experts_q5_k_x8, DOT_PARALLEL)
def dot_q5_k_x8_experts(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q4_0_x8_experts for Q5_K (the bits of dot_q5_k_x8_one)."""
    run_items("_experts_q5_k_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_q6_k_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(Q6_K, w, d, b16, b32, qs, out, sel, shared, i0, i1, False)


@launcher(_experts_q6_k_x8, DOT_PARALLEL)
def dot_q6_k_x8_experts(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q4_0_x8_experts for Q6_K (the bits of dot_q6_k_x8_one)."""
    run_items("_experts_q6_k_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_iq4_xs_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(IQ4_XS, w, d, b16, b32, qs, out, sel, shared, i0, i1, False)


@launcher(_experts_iq4_xs_x8, DOT_PARALLEL)
def dot_iq4_xs_x8_experts(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q4_0_x8_experts for IQ4_XS (the bits of dot_iq4_xs_x8_one)."""
    run_items("_experts_iq4_xs_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


# each interleaved layout's full kernel -> its experts kernel (ggufrun.model.linear.Experts)
EXPERTS = {
    dot_q4_0_x8: dot_q4_0_x8_experts,
    dot_iq4_nl_x8: dot_iq4_nl_x8_experts,
    dot_q4_1_x8: dot_q4_1_x8_experts,
    dot_q5_0_x8: dot_q5_0_x8_experts,
    dot_q8_0_x8: dot_q8_0_x8_experts,
    dot_q4_k_x8: dot_q4_k_x8_experts,
    dot_q5_k_x8: dot_q5_k_x8_experts,
    dot_q6_k_x8: dot_q6_k_x8_experts,
    dot_iq4_xs_x8: dot_iq4_xs_x8_experts,
}


# decode from DRAM (DECODE_STREAM): the experts kernels one group of 8 rows at a time, the same bits


@njit(**DOT)
def _experts_stream_q4_0_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q4_0, 144, w, d, s, qs, sums, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q4_0_x8, DOT_PARALLEL)
def dot_q4_0_x8_experts_stream(w, d, s, qs, sums, out, sel, shared):
    """dot_q4_0_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q4_0_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_q4_1_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q4_1, 160, w, d, s, qs, sums, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q4_1_x8, DOT_PARALLEL)
def dot_q4_1_x8_experts_stream(w, d, s, qs, sums, out, sel, shared):
    """dot_q4_1_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q4_1_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_q5_0_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q5_0, 176, w, d, s, qs, sums, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q5_0_x8, DOT_PARALLEL)
def dot_q5_0_x8_experts_stream(w, d, s, qs, sums, out, sel, shared):
    """dot_q5_0_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q5_0_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_q8_0_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(Q8_0, 272, w, d, s, qs, sums, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q8_0_x8, DOT_PARALLEL)
def dot_q8_0_x8_experts_stream(w, d, s, qs, sums, out, sel, shared):
    """dot_q8_0_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q8_0_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_iq4_nl_x8(w, d, s, qs, sums, out, sel, shared, i0, i1):
    _experts_x8(IQ4_NL, 144, w, d, s, qs, sums, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_iq4_nl_x8, DOT_PARALLEL)
def dot_iq4_nl_x8_experts_stream(w, d, s, qs, sums, out, sel, shared):
    """dot_iq4_nl_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_iq4_nl_x8", (w, d, s, qs, sums, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_q4_k_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(Q4_K, w, d, b16, b32, qs, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q4_k_x8, DOT_PARALLEL)
def dot_q4_k_x8_experts_stream(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q4_k_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q4_k_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_q5_k_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(Q5_K, w, d, b16, b32, qs, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q5_k_x8, DOT_PARALLEL)
def dot_q5_k_x8_experts_stream(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q5_k_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q5_k_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_q6_k_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(Q6_K, w, d, b16, b32, qs, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_q6_k_x8, DOT_PARALLEL)
def dot_q6_k_x8_experts_stream(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_q6_k_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_q6_k_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


@njit(**DOT)
def _experts_stream_iq4_xs_x8(w, qu, d, b16, b32, qs, out, sel, shared, i0, i1):
    _expertsk_x8(IQ4_XS, w, d, b16, b32, qs, out, sel, shared, i0, i1, True)


@launcher(_experts_stream_iq4_xs_x8, DOT_PARALLEL)
def dot_iq4_xs_x8_experts_stream(w, qu, d, b16, b32, qs, out, sel, shared):
    """dot_iq4_xs_x8_experts one group at a time (the same bits; DECODE_STREAM)."""
    run_items("_experts_stream_iq4_xs_x8", (w, qu, d, b16, b32, qs, out, sel, shared), _expert_items(out, sel), 1)


# each experts kernel -> its version for experts that stream from DRAM (DECODE_STREAM; elsewhere itself)
EXPERTS_STREAM = {k: k for k in EXPERTS.values()}
if DECODE_STREAM:
    EXPERTS_STREAM.update({
        dot_q4_0_x8_experts: dot_q4_0_x8_experts_stream,
        dot_q4_1_x8_experts: dot_q4_1_x8_experts_stream,
        dot_q5_0_x8_experts: dot_q5_0_x8_experts_stream,
        dot_q8_0_x8_experts: dot_q8_0_x8_experts_stream,
        dot_iq4_nl_x8_experts: dot_iq4_nl_x8_experts_stream,
        dot_q4_k_x8_experts: dot_q4_k_x8_experts_stream,
        dot_q5_k_x8_experts: dot_q5_k_x8_experts_stream,
        dot_q6_k_x8_experts: dot_q6_k_x8_experts_stream,
        dot_iq4_xs_x8_experts: dot_iq4_xs_x8_experts_stream,
    })  # fmt: skip
