"""Fused quantized dot products: y = W @ x straight from the GGUF blocks, as llama.cpp computes them.

The activations are quantized once per matmul (`quantize_q8_32`, `quantize_q8_k`), then every weight
block is unpacked to unsigned 8-bit codes in registers and multiplied with the 8-bit activations in
32-bit integer lanes (VNNI `vpdpbusd` where the CPU has it), with one float multiply-add per block.

Why hand-written vector IR: LLVM's auto-vectoriser, as Numba drives it, turns the per-block reductions into
scalar code or gathers (~3 GMAC/s per core). So the hot loops use a small vocabulary of vector intrinsics
defined below (256-bit vectors: 32 x int8, 8 x int32, 8 x float32), each with a portable LLVM IR fallback
for CPUs without AVX2 / VNNI / F16C. All offsets into weight arrays are flat byte offsets.

Activation layouts (structure of arrays, leading dimension M = number of activation rows):
    Q8_32 (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL):
        qs int8 [M, K], d float32 [M, K/32] (fp16-rounded scale), sums int32 [M, K/32] (sum of qs),
        s float32 [M, K/32] (Q8_1's fp16(d * sum), used by the Q4_1/Q5_1 min term)
    Q8_K (for Q2_K..Q6_K, IQ4_XS):
        qs int8 [M, K], d float32 [M, K/256], bsums16 int32 [M, K/16], bsums32 int32 [M, K/32]
    F32 / F16 / BF16 weights: x float32 [M, K], rounded to f16 / bf16 first for F16 / BF16 weights
"""

from __future__ import annotations

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils, config
from numba.extending import intrinsic, models, register_model

from .jit import EXACT, FAST, FAST_PARALLEL

# ---------------------------------------------------------------------------------------------------------
# Target features: x86 intrinsics only where the CPU Numba compiles for has them.


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

# ---------------------------------------------------------------------------------------------------------
# Vector types: Numba values backed by LLVM vectors.


class Vec(types.Type):
    def __init__(self, kind: str, lanes: int):
        self.kind, self.lanes = kind, lanes
        super().__init__(name=f"Vec({kind}x{lanes})")


_LL = {"i8": ir.IntType(8), "i32": ir.IntType(32), "f32": ir.FloatType()}


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_LL[fe_type.kind], fe_type.lanes))


I8x32 = Vec("i8", 32)
I32x8 = Vec("i32", 8)
F32x8 = Vec("f32", 8)

_i8, _i16, _i32, _i64, _f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_v32i8, _v8i32, _v8f32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 8), ir.VectorType(_f32, 8)


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
def ld_u8(typingctx, a, off):
    """uint8 at byte `off` of `a`, as int32."""
    if not _is_ptr_args(a, off):
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(_load(context, builder, sig, args, _i8), _i32)

    return types.int32(a, off), codegen


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


@intrinsic
def round_f16(typingctx, x):
    """float32 -> nearest IEEE half (ties to even) -> float32: what GGML_CPU_FP32_TO_FP16 stores."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        (f,) = args
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

    return types.float32(x), codegen


# ---- 32 x int8 vectors ------------------------------------------------------------------------------------


@intrinsic
def ld32(typingctx, a, off):
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
def lo4(typingctx, v):
    """v & 0x0F per byte."""

    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _splat(_v32i8, 15))

    return I8x32(I8x32), codegen


@intrinsic
def hi4(typingctx, v):
    """v >> 4 per byte (logical)."""

    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _splat(_v32i8, 4))

    return I8x32(I8x32), codegen


@intrinsic
def field(typingctx, v, shift, mask, up):
    """((v >> shift) & mask) << up per byte: a bit field of each byte, moved into place."""
    if not all(isinstance(t, types.Integer) for t in (shift, mask, up)):
        return None

    def codegen(context, builder, sig, args):
        s, k, u = (builder.trunc(_int_arg(context, builder, t, a), _i8) for t, a in zip(sig.args[1:], args[1:]))
        v = builder.and_(builder.lshr(args[0], _bsplat(builder, _v32i8, s)), _bsplat(builder, _v32i8, k))
        return builder.shl(v, _bsplat(builder, _v32i8, u))

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
def vor(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])

    return I8x32(I8x32, I8x32), codegen


@intrinsic
def flip(typingctx, v):
    """v ^ 0x80: a signed byte q as the unsigned byte q + 128."""

    def codegen(context, builder, sig, args):
        return builder.xor(args[0], _splat(_v32i8, 0x80))

    return I8x32(I8x32), codegen


# IQ4_NL / IQ4_XS non-linear code book (kvalues_iq4nl in llama.cpp ggml-common.h), shifted by +128 so the
# codes are unsigned bytes for vpdpbusd; the kernels subtract 128 * sum(x) again.
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


@intrinsic
def iq4_lut(typingctx, idx):
    """kvalues_iq4nl[idx] + 128 per byte (idx 0..15)."""

    def codegen(context, builder, sig, args):
        table = [v + 128 for v in IQ4_VALUES]
        if HAS_AVX2:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v32i8, [_v32i8, _v32i8]), "llvm.x86.avx2.pshuf.b"
            )
            return builder.call(fn, [ir.Constant(_v32i8, table * 2), args[0]])
        out = _splat(_v32i8, 0)
        for k, t in enumerate(table):
            out = builder.select(builder.icmp_unsigned("==", args[0], _splat(_v32i8, k)), _splat(_v32i8, t), out)
        return out

    return I8x32(I8x32), codegen


# ---- 8 x int32 vectors ------------------------------------------------------------------------------------


@intrinsic
def izero(typingctx):
    def codegen(context, builder, sig, args):
        return _splat(_v8i32, 0)

    return I32x8(), codegen


@intrinsic
def ilane0(typingctx, a):
    """(a, 0, 0, 0, 0, 0, 0, 0): seeds a block's dot product with its offset correction."""
    if not isinstance(a, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        a = _int_arg(context, builder, sig.args[0], args[0])
        return builder.insert_element(_splat(_v8i32, 0), a, ir.Constant(_i32, 0))

    return I32x8(a), codegen


@intrinsic
def ilane04(typingctx, a, b):
    """(a, 0, 0, 0, b, 0, 0, 0): lanes 0-3 of vpdpbusd cover bytes 0-15, lanes 4-7 bytes 16-31."""
    if not isinstance(a, types.Integer) or not isinstance(b, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        a = _int_arg(context, builder, sig.args[0], args[0])
        b = _int_arg(context, builder, sig.args[1], args[1])
        v = builder.insert_element(_splat(_v8i32, 0), a, ir.Constant(_i32, 0))
        return builder.insert_element(v, b, ir.Constant(_i32, 4))

    return I32x8(a, b), codegen


@intrinsic
def dpbusd(typingctx, acc, u, s):
    """acc[i] + sum_{k<4} u[4i+k] * s[4i+k], u unsigned bytes, s signed bytes (exact, int32)."""

    def codegen(context, builder, sig, args):
        acc, u, s = args
        if HAS_VNNI:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v8i32, [_v8i32] * 3), "llvm.x86.avx512.vpdpbusd.256"
            )
            return builder.call(fn, [acc, builder.bitcast(u, _v8i32), builder.bitcast(s, _v8i32)])
        v32 = ir.VectorType(_i32, 32)
        p = builder.mul(builder.zext(u, v32), builder.sext(s, v32))
        part = [builder.shuffle_vector(p, p, ir.Constant(_v8i32, list(range(k, 32, 4)))) for k in range(4)]
        return builder.add(acc, builder.add(builder.add(part[0], part[1]), builder.add(part[2], part[3])))

    return I32x8(I32x8, I8x32, I8x32), codegen


@intrinsic
def imadd(typingctx, acc, p, s):
    """acc + p * s (s a scalar int)."""
    if not isinstance(s, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        s = _bsplat(builder, _v8i32, _int_arg(context, builder, sig.args[2], args[2]))
        return builder.add(args[0], builder.mul(args[1], s))

    return I32x8(I32x8, I32x8, s), codegen


@intrinsic
def imadd2(typingctx, acc, p, sa, sb):
    """acc + p * (sa, sa, sa, sa, sb, sb, sb, sb): two 16-value sub-blocks with their own scales."""
    if not isinstance(sa, types.Integer) or not isinstance(sb, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        a = _int_arg(context, builder, sig.args[2], args[2])
        b = _int_arg(context, builder, sig.args[3], args[3])
        v = builder.insert_element(ir.Constant(_v8i32, ir.Undefined), a, ir.Constant(_i32, 0))
        v = builder.insert_element(v, b, ir.Constant(_i32, 4))
        v = builder.shuffle_vector(v, v, ir.Constant(_v8i32, [0, 0, 0, 0, 4, 4, 4, 4]))
        return builder.add(args[0], builder.mul(args[1], v))

    return I32x8(I32x8, I32x8, sa, sb), codegen


# ---- 8 x float32 vectors ----------------------------------------------------------------------------------

_FM = ("fast",)


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
        prod = builder.fmul(builder.sitofp(iv, _v8f32), _bsplat(builder, _v8f32, sc), flags=_FM)
        return builder.fadd(acc, prod, flags=_FM)

    return F32x8(F32x8, I32x8, types.float32), codegen


@intrinsic
def fma_v(typingctx, acc, a, b):
    """acc + a * b, lane-wise."""

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], builder.fmul(args[1], args[2], flags=_FM), flags=_FM)

    return F32x8(F32x8, F32x8, F32x8), codegen


@intrinsic
def fadd_v(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1], flags=_FM)

    return F32x8(F32x8, F32x8), codegen


@intrinsic
def hsum(typingctx, v):
    """Sum of the 8 lanes."""

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_f32, [_f32, _v8f32]), "llvm.vector.reduce.fadd.v8f32"
        )
        return builder.call(fn, [ir.Constant(_f32, 0.0), args[0]], fastmath=("reassoc",))

    return types.float32(F32x8), codegen


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


# ---------------------------------------------------------------------------------------------------------
# Activation quantization. Rounding follows llama.cpp's x86 build, which produced the reference logits:
# quantize_row_q8_0 / q8_1 (ggml-cpu/arch/x86/quants.c): d = amax/127, q = round-half-even(x * (127/amax)),
# d stored as fp16; Q8_1 also stores s = fp16(d * sum(q)) with the unrounded d.
# quantize_row_q8_K_ref (ggml-quants.c, also used on x86): iscale = -127/max (max = the first element of
# largest magnitude, with its sign), q = min(127, nearest_int(iscale * x)), d = 1/iscale as float32,
# plus sums of q over each 16 values (bsums; we also keep sums over 32).


@njit(**EXACT)
def quantize_q8_32(x, qs, d, sums, s):
    """x float32 [M, K] -> qs int8 [M, K], d/sums/s [M, K/32] (see module docstring)."""
    M, K = x.shape
    for m in range(M):
        for b in range(K // 32):
            amax = np.float32(0.0)
            for j in range(b * 32, b * 32 + 32):
                amax = max(amax, abs(x[m, j]))
            dm = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            tot = 0
            for j in range(b * 32, b * 32 + 32):
                q = np.int32(np.rint(x[m, j] * inv))
                qs[m, j] = q
                tot += q
            d[m, b] = round_f16(dm)
            sums[m, b] = tot
            s[m, b] = round_f16(dm * np.float32(tot))


@njit(**EXACT)
def quantize_q8_k(x, qs, d, bsums16, bsums32):
    """x float32 [M, K] -> qs int8 [M, K], d [M, K/256], bsums16 [M, K/16], bsums32 [M, K/32]."""
    M, K = x.shape
    for m in range(M):
        for b in range(K // 256):
            o = b * 256
            amax = np.float32(0.0)
            vmax = np.float32(0.0)
            for j in range(o, o + 256):
                ax = abs(x[m, j])
                if ax > amax:
                    amax = ax
                    vmax = x[m, j]
            if amax == 0:
                d[m, b] = 0
                for j in range(o, o + 256):
                    qs[m, j] = 0
            else:
                iscale = np.float32(-127.0) / vmax
                for j in range(o, o + 256):
                    qs[m, j] = min(127, np.int32(np.rint(iscale * x[m, j])))
                d[m, b] = np.float32(1.0) / iscale
            for g in range(16):
                t = 0
                for j in range(o + 16 * g, o + 16 * g + 16):
                    t += qs[m, j]
                bsums16[m, b * 16 + g] = t
            for g in range(8):
                bsums32[m, b * 8 + g] = bsums16[m, b * 16 + 2 * g] + bsums16[m, b * 16 + 2 * g + 1]


@njit(**EXACT)
def round_f16_rows(x, out):
    """x float32 [M, K] -> out: each value rounded to the nearest IEEE half (llama.cpp's F16 vec_dot_type)."""
    M, K = x.shape
    for m in range(M):
        for k in range(K):
            out[m, k] = round_f16(x[m, k])


@njit(**EXACT)
def round_bf16_rows(x, out):
    """x float32 [M, K] -> out: each value rounded to bfloat16 like ggml_compute_fp32_to_bf16 (RNE, quiet NaN)."""
    M, K = x.shape
    for m in range(M):
        for k in range(K):
            u = np.int64(np.float32(x[m, k]).view(np.uint32))
            if (u & 0x7FFFFFFF) > 0x7F800000:
                r = (u & 0xFFFF0000) | 0x00400000
            else:
                r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            out[m, k] = np.uint32(r).view(np.float32)


# ---------------------------------------------------------------------------------------------------------
# Row dot products: one weight row (starting at byte `wo`) times activation row m. Inlined into the kernels;
# other njit code (a fused decode step) can call them too. Byte layouts: see ggufrun.quants.registry.


@njit(inline="always", **FAST)
def row_q4_0(w, wo, qs, m, d, sums, s):
    # Q4_0: 18-byte blocks (d:2, qs:16); value = d * (nibble - 8)
    nb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nb):
        o = wo + b * 18
        p = dpbusd(ilane0(-8 * sums[m, b]), ld_nib(w, o + 2), ld32(qs, xo + b * 32))
        acc = fma_i(acc, p, ld_f16(w, o) * d[m, b])
    return hsum(acc)


@njit(inline="always", **FAST)
def row_q4_1(w, wo, qs, m, d, sums, s):
    # Q4_1: 20-byte blocks (d:2, m:2, qs:16); value = d * nibble + m
    nb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    accm = np.float32(0.0)
    for b in range(nb):
        o = wo + b * 20
        p = dpbusd(izero(), ld_nib(w, o + 4), ld32(qs, xo + b * 32))
        acc = fma_i(acc, p, ld_f16(w, o) * d[m, b])
        accm += ld_f16(w, o + 2) * s[m, b]
    return hsum(acc) + accm


@njit(inline="always", **FAST)
def row_q5_0(w, wo, qs, m, d, sums, s):
    # Q5_0: 22-byte blocks (d:2, qh:4, qs:16); value = d * ((nibble | qh bit << 4) - 16)
    nb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nb):
        o = wo + b * 22
        u = vor(ld_nib(w, o + 6), bits32_to(ld_u32(w, o + 2), 16))
        p = dpbusd(ilane0(-16 * sums[m, b]), u, ld32(qs, xo + b * 32))
        acc = fma_i(acc, p, ld_f16(w, o) * d[m, b])
    return hsum(acc)


@njit(inline="always", **FAST)
def row_q5_1(w, wo, qs, m, d, sums, s):
    # Q5_1: 24-byte blocks (d:2, m:2, qh:4, qs:16); value = d * (nibble | qh bit << 4) + m
    nb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    accm = np.float32(0.0)
    for b in range(nb):
        o = wo + b * 24
        u = vor(ld_nib(w, o + 8), bits32_to(ld_u32(w, o + 4), 16))
        p = dpbusd(izero(), u, ld32(qs, xo + b * 32))
        acc = fma_i(acc, p, ld_f16(w, o) * d[m, b])
        accm += ld_f16(w, o + 2) * s[m, b]
    return hsum(acc) + accm


@njit(inline="always", **FAST)
def row_q8_0(w, wo, qs, m, d, sums, s):
    # Q8_0: 34-byte blocks (d:2, qs:32 int8); value = d * q. Codes go in as q + 128, corrected by -128*sum(x).
    nb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nb):
        o = wo + b * 34
        p = dpbusd(ilane0(-128 * sums[m, b]), flip(ld32(w, o + 2)), ld32(qs, xo + b * 32))
        acc = fma_i(acc, p, ld_f16(w, o) * d[m, b])
    return hsum(acc)


@njit(inline="always", **FAST)
def row_iq4_nl(w, wo, qs, m, d, sums, s):
    # IQ4_NL: 18-byte blocks (d:2, qs:16); value = d * kvalues[nibble]
    nb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nb):
        o = wo + b * 18
        p = dpbusd(ilane0(-128 * sums[m, b]), iq4_lut(ld_nib(w, o + 2)), ld32(qs, xo + b * 32))
        acc = fma_i(acc, p, ld_f16(w, o) * d[m, b])
    return hsum(acc)


@njit(inline="always", **FAST)
def _k4_scale(w, o, g):
    """6-bit scale of sub-block g from the 12 packed bytes at o (get_scale_min_k4 in ggml-quants.c)."""
    if g < 4:
        return ld_u8(w, o + g) & 63
    return (ld_u8(w, o + g + 4) & 0xF) | ((ld_u8(w, o + g - 4) >> 6) << 4)


@njit(inline="always", **FAST)
def _k4_min(w, o, g):
    """6-bit min of sub-block g from the 12 packed bytes at o."""
    if g < 4:
        return ld_u8(w, o + g + 4) & 63
    return (ld_u8(w, o + g + 4) >> 4) | ((ld_u8(w, o + g) >> 6) << 4)


@njit(inline="always", **FAST)
def row_q4_k(w, wo, qs, m, d, bsums16, bsums32):
    # Q4_K: 144-byte super-blocks of 256 (d:2, dmin:2, scales:12, qs:128); sub-block g of 32 uses the low
    # (g even) or high (g odd) nibbles of qs[32*(g//2):][:32]; value = d*sc[g]*q - dmin*min[g]
    nsb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    accm = np.float32(0.0)
    for b in range(nsb):
        o = wo + b * 144
        isum = izero()
        summ = 0
        for j in range(4):
            q = ld32(w, o + 16 + 32 * j)
            x0 = xo + b * 256 + 64 * j
            isum = imadd(isum, dpbusd(izero(), lo4(q), ld32(qs, x0)), _k4_scale(w, o + 4, 2 * j))
            isum = imadd(isum, dpbusd(izero(), hi4(q), ld32(qs, x0 + 32)), _k4_scale(w, o + 4, 2 * j + 1))
            summ += _k4_min(w, o + 4, 2 * j) * bsums32[m, b * 8 + 2 * j]
            summ += _k4_min(w, o + 4, 2 * j + 1) * bsums32[m, b * 8 + 2 * j + 1]
        acc = fma_i(acc, isum, ld_f16(w, o) * d[m, b])
        accm += ld_f16(w, o + 2) * d[m, b] * np.float32(summ)
    return hsum(acc) - accm


@njit(inline="always", **FAST)
def row_q5_k(w, wo, qs, m, d, bsums16, bsums32):
    # Q5_K: 176-byte super-blocks (d:2, dmin:2, scales:12, qh:32, qs:128); like Q4_K plus a fifth bit:
    # bit g of qh[l] for value l of sub-block g
    nsb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    accm = np.float32(0.0)
    for b in range(nsb):
        o = wo + b * 176
        qh = ld32(w, o + 16)
        isum = izero()
        summ = 0
        for j in range(4):
            q = ld32(w, o + 48 + 32 * j)
            x0 = xo + b * 256 + 64 * j
            u0 = vor(lo4(q), bit_to(qh, 2 * j, 16))
            u1 = vor(hi4(q), bit_to(qh, 2 * j + 1, 16))
            isum = imadd(isum, dpbusd(izero(), u0, ld32(qs, x0)), _k4_scale(w, o + 4, 2 * j))
            isum = imadd(isum, dpbusd(izero(), u1, ld32(qs, x0 + 32)), _k4_scale(w, o + 4, 2 * j + 1))
            summ += _k4_min(w, o + 4, 2 * j) * bsums32[m, b * 8 + 2 * j]
            summ += _k4_min(w, o + 4, 2 * j + 1) * bsums32[m, b * 8 + 2 * j + 1]
        acc = fma_i(acc, isum, ld_f16(w, o) * d[m, b])
        accm += ld_f16(w, o + 2) * d[m, b] * np.float32(summ)
    return hsum(acc) - accm


@njit(inline="always", **FAST)
def row_q6_k(w, wo, qs, m, d, bsums16, bsums32):
    # Q6_K: 210-byte super-blocks (ql:128, qh:64, scales:16 int8, d:2). In half h, group k of 32 values takes
    # the low (k < 2) or high nibbles of ql[64h + 32*(k % 2):][:32] and bits 2k..2k+1 of qh[32h:][:32];
    # value = d * scale[sub-block of 16] * (q - 32)
    nsb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nsb):
        o = wo + b * 210
        isum = izero()
        for h in range(2):
            qh = ld32(w, o + 128 + 32 * h)
            for k in range(4):
                q = ld32(w, o + 64 * h + 32 * (k % 2))
                low = lo4(q) if k < 2 else hi4(q)
                u = vor(low, field(qh, 2 * k, 3, 4))
                sb = b * 16 + 8 * h + 2 * k  # first of the two 16-value sub-blocks
                p = dpbusd(ilane04(-32 * bsums16[m, sb], -32 * bsums16[m, sb + 1]), u, ld32(qs, xo + 16 * sb))
                sa = ld_u8(w, o + 192 + 8 * h + 2 * k)
                sb_ = ld_u8(w, o + 193 + 8 * h + 2 * k)
                isum = imadd2(isum, p, sa - ((sa & 128) << 1), sb_ - ((sb_ & 128) << 1))  # int8 scales
        acc = fma_i(acc, isum, ld_f16(w, o + 208) * d[m, b])
    return hsum(acc)


@njit(inline="always", **FAST)
def _k3_scale(w, o, j):
    """6-bit scale (minus 32) of 16-value sub-block j from the 12 packed bytes at o (Q3_K)."""
    low = ld_u8(w, o + j) & 0xF if j < 8 else ld_u8(w, o + j - 8) >> 4
    high = (ld_u8(w, o + 8 + j % 4) >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


@njit(inline="always", **FAST)
def row_q3_k(w, wo, qs, m, d, bsums16, bsums32):
    # Q3_K: 110-byte super-blocks (hmask:32, qs:64, scales:12, d:2). Group g of 32 values: bits 2(g%4)..+1
    # of qs[32*(g//4):][:32], minus 4 unless bit g of hmask[l] is set; value = d * (scale - 32) * q
    nsb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nsb):
        o = wo + b * 110
        hm = ld32(w, o)
        isum = izero()
        for g in range(8):
            q = ld32(w, o + 32 + 32 * (g // 4))
            u = vor(field(q, 2 * (g % 4), 3, 0), bit_to(hm, g, 4))
            sb = b * 16 + 2 * g
            p = dpbusd(ilane04(-4 * bsums16[m, sb], -4 * bsums16[m, sb + 1]), u, ld32(qs, xo + 16 * sb))
            isum = imadd2(isum, p, _k3_scale(w, o + 96, 2 * g), _k3_scale(w, o + 96, 2 * g + 1))
        acc = fma_i(acc, isum, ld_f16(w, o + 108) * d[m, b])
    return hsum(acc)


@njit(inline="always", **FAST)
def row_q2_k(w, wo, qs, m, d, bsums16, bsums32):
    # Q2_K: 84-byte super-blocks (scales:16, qs:64, d:2, dmin:2). Group g of 32 values: bits 2(g%4)..+1 of
    # qs[32*(g//4):][:32]; scale byte j = sc | min << 4 per 16 values; value = d*sc*q - dmin*min
    nsb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    accm = np.float32(0.0)
    for b in range(nsb):
        o = wo + b * 84
        isum = izero()
        summ = 0
        for g in range(8):
            q = ld32(w, o + 16 + 32 * (g // 4))
            sb = b * 16 + 2 * g
            p = dpbusd(izero(), field(q, 2 * (g % 4), 3, 0), ld32(qs, xo + 16 * sb))
            sa = ld_u8(w, o + 2 * g)
            sb_ = ld_u8(w, o + 2 * g + 1)
            isum = imadd2(isum, p, sa & 0xF, sb_ & 0xF)
            summ += (sa >> 4) * bsums16[m, sb] + (sb_ >> 4) * bsums16[m, sb + 1]
        acc = fma_i(acc, isum, ld_f16(w, o + 80) * d[m, b])
        accm += ld_f16(w, o + 82) * d[m, b] * np.float32(summ)
    return hsum(acc) - accm


@njit(inline="always", **FAST)
def row_iq4_xs(w, wo, qs, m, d, bsums16, bsums32):
    # IQ4_XS: 136-byte super-blocks (d:2, scales_h:2, scales_l:4, qs:128); sub-block g of 32 has 16 bytes of
    # nibbles at qs[16g:] (low nibbles first) and a 6-bit scale; value = d * (scale - 32) * kvalues[nibble]
    nsb = d.shape[1]
    xo = m * qs.shape[1]
    acc = fzero()
    for b in range(nsb):
        o = wo + b * 136
        sh = ld_u16(w, o + 2)
        isum = izero()
        for g in range(8):
            ls = ((ld_u8(w, o + 4 + g // 2) >> (4 * (g % 2))) & 0xF) | (((sh >> (2 * g)) & 3) << 4)
            u = iq4_lut(ld_nib(w, o + 8 + 16 * g))
            p = dpbusd(ilane0(-128 * bsums32[m, b * 8 + g]), u, ld32(qs, xo + b * 256 + 32 * g))
            isum = imadd(isum, p, ls - 32)
        acc = fma_i(acc, isum, ld_f16(w, o) * d[m, b])
    return hsum(acc)


# Float weights: w is the typed row (float32, or uint16 bits of F16 / BF16), x float32 already rounded to
# the weight's precision. Four accumulators hide the FMA latency; the tail (K % 32) is scalar.


@njit(inline="always", **FAST)
def row_f32(w, wo, x, m):
    K = x.shape[1]
    xo = m * K * 4
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
    k = 0
    while k + 32 <= K:
        a0 = fma_v(a0, ld_f32x8(w, wo + 4 * k), ld_f32x8(x, xo + 4 * k))
        a1 = fma_v(a1, ld_f32x8(w, wo + 4 * k + 32), ld_f32x8(x, xo + 4 * k + 32))
        a2 = fma_v(a2, ld_f32x8(w, wo + 4 * k + 64), ld_f32x8(x, xo + 4 * k + 64))
        a3 = fma_v(a3, ld_f32x8(w, wo + 4 * k + 96), ld_f32x8(x, xo + 4 * k + 96))
        k += 32
    total = hsum(fadd_v(fadd_v(a0, a1), fadd_v(a2, a3)))
    for j in range(k, K):
        total += ld_f32(w, wo + 4 * j) * x[m, j]
    return total


@njit(inline="always", **FAST)
def row_f16(w, wo, x, m):
    K = x.shape[1]
    xo = m * K * 4
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
    k = 0
    while k + 32 <= K:
        a0 = fma_v(a0, ld_f16x8(w, wo + 2 * k), ld_f32x8(x, xo + 4 * k))
        a1 = fma_v(a1, ld_f16x8(w, wo + 2 * k + 16), ld_f32x8(x, xo + 4 * k + 32))
        a2 = fma_v(a2, ld_f16x8(w, wo + 2 * k + 32), ld_f32x8(x, xo + 4 * k + 64))
        a3 = fma_v(a3, ld_f16x8(w, wo + 2 * k + 48), ld_f32x8(x, xo + 4 * k + 96))
        k += 32
    total = hsum(fadd_v(fadd_v(a0, a1), fadd_v(a2, a3)))
    for j in range(k, K):
        total += ld_f16(w, wo + 2 * j) * x[m, j]
    return total


@njit(inline="always", **FAST)
def row_bf16(w, wo, x, m):
    K = x.shape[1]
    xo = m * K * 4
    a0, a1, a2, a3 = fzero(), fzero(), fzero(), fzero()
    k = 0
    while k + 32 <= K:
        a0 = fma_v(a0, ld_bf16x8(w, wo + 2 * k), ld_f32x8(x, xo + 4 * k))
        a1 = fma_v(a1, ld_bf16x8(w, wo + 2 * k + 16), ld_f32x8(x, xo + 4 * k + 32))
        a2 = fma_v(a2, ld_bf16x8(w, wo + 2 * k + 32), ld_f32x8(x, xo + 4 * k + 64))
        a3 = fma_v(a3, ld_bf16x8(w, wo + 2 * k + 48), ld_f32x8(x, xo + 4 * k + 96))
        k += 32
    total = hsum(fadd_v(fadd_v(a0, a1), fadd_v(a2, a3)))
    for j in range(k, K):
        total += np.uint32(ld_u16(w, wo + 2 * j) << 16).view(np.float32) * x[m, j]
    return total


# ---------------------------------------------------------------------------------------------------------
# Kernels: out[m, n] = row n of W . activation row m, parallel over the weight rows n.
# w: [N, row_bytes] uint8 (or [N, K] float32 / uint16 for the float types), read-only; out float32 [M, N].


@njit(**FAST_PARALLEL)
def dot_q4_0(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q4_0(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q4_1(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q4_1(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q5_0(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q5_0(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q5_1(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q5_1(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q8_0(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q8_0(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_iq4_nl(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_iq4_nl(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q2_k(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q2_k(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q3_k(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q3_k(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q4_k(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q4_k(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q5_k(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q5_k(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_q6_k(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_q6_k(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_iq4_xs(w, qs, d, a2, a3, out):
    rb = w.shape[1]
    for n in prange(w.shape[0]):
        for m in range(qs.shape[0]):
            out[m, n] = row_iq4_xs(w, n * rb, qs, m, d, a2, a3)


@njit(**FAST_PARALLEL)
def dot_f32(w, x, out):
    rb = w.shape[1] * 4
    for n in prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, n] = row_f32(w, n * rb, x, m)


@njit(**FAST_PARALLEL)
def dot_f16(w, x, out):
    rb = w.shape[1] * 2
    for n in prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, n] = row_f16(w, n * rb, x, m)


@njit(**FAST_PARALLEL)
def dot_bf16(w, x, out):
    rb = w.shape[1] * 2
    for n in prange(w.shape[0]):
        for m in range(x.shape[0]):
            out[m, n] = row_bf16(w, n * rb, x, m)
