"""Numba kernels of the forward pass, other than the quantized matrix products (those live in ggufrun.quants).

Every kernel writes into buffers the caller preallocated, so a decode step allocates nothing. Arrays in, arrays
out; a zero-length array stands for an absent optional tensor (bias, norm weight). The KV cache is either float32
or IEEE half floats stored as uint16 (Numba has no float16): `_kv_load` / `_kv_store` convert one value with the
CPU's F16C instructions (LLVM `fpext`/`fptrunc` on `half`), so the loops still vectorise.

All helpers a kernel calls are in this module: Numba's on-disk cache keys a kernel on its own source file, so a
kernel that inlined a helper from another file would keep running stale machine code after that file changed. The
imports are the F32x8 / F32x16 / F64x8 / I32x16 lane types of ggufrun.quants.dot, type registrations that generate
no code, its HAS_ZMM constant (attention takes 16-lane tiles where the CPU has AVX-512: the same chains per lane), and
ggufrun.quants.launch, whose run_items emits only calls by name: each attention kernel is a launcher that hands a
serial worker of this module (`_attend_*`) to the one shared parallel loop by its exported name instead of compiling
a copy of it (cold compile of attend_rows 8.1 -> 3.1 s, attend_one 3.7 -> 2.0 s, SmolLM2's shapes; then without a
prange loop of its own, attend_one's launcher 0.77 -> 0.16 s). For the same
reason the few 8 and 16 x float32 intrinsics attention needs are written here rather than imported from the vector
vocabulary of ggufrun.quants.dot; they are named after their counterparts there (_ld_f32x8 / ld_f32x8, _fma_v /
fma_v, ...) but index arrays by element rather than by byte (a uint16 KV cache row holds IEEE halves), and their
FMA is always llvm.fma (ggml's exp needs the single rounding even where the CPU has no FMA instruction). The
softmax's maximum and float64 sum and the greedy argmax (_max_of, exp_sum, _first_index) use a few more: 16-lane
maxima and equality masks, 8-lane float64 sums, each with a fixed order of its lanes.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ..quants.dot import HAS_ZMM, F32x8, F32x16, F64x8, I32x16, bits_f32
from ..quants.launch import launcher, run_items

# Fast-math without nnan/ninf: masks and softmax rely on -inf / large values behaving as IEEE says. No reference
# counting (_nrt=False, see quants/jit.py): these kernels allocate nothing, and the views they take (a head's keys, a
# row of scores) were counted inside their loops. A 30-layer model of 64-wide Q4_1 matrices, whose decode step is
# dispatch and small kernels (AMD EPYC Zen 4, 2 threads, three alternating processes, medians of 8 x 200 steps):
# 1.39-1.43 -> 1.33-1.37 ms a step, with the activation quantizer's and the launchers' counting gone too.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
JIT = {"cache": True, "nogil": True, "fastmath": FASTMATH, "error_model": "numpy", "_nrt": False}
JIT_PARALLEL = dict(JIT, parallel=True)
# Attention: no fast-math at all, so that decode and prefill compute each query the same way (see attend_rows).
ATT = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy", "_nrt": False}
ATT_PARALLEL = dict(ATT, parallel=True)

GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654


# ---- scalar helpers -------------------------------------------------------------------------------------------


@intrinsic
def _f16_to_f32(typingctx, h):
    """uint16 holding IEEE half bits -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_to_f16(typingctx, x):
    """float32 -> uint16 holding IEEE half bits (round to nearest even; overflow gives inf, like ggml)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


# ---- 8 and 16 x float32 vectors for attention (lane types: ggufrun.quants.dot's F32x8, F32x16) --------------------
# Attention tiles keep their accumulators in registers through these. Multiply-adds are llvm.fma, as in the
# scalar _fma, so a lane computes exactly what the scalar code would. Why not ggufrun.quants.dot's: see the
# module docstring.


def _elem_ptr(context, builder, aryty, ary, idx, idxty):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(data, [context.cast(builder, idx, idxty, types.intp)], inbounds=True)


def _c_array(a, *dtypes) -> bool:
    """Whether Numba type a is a C-contiguous array (of one of `dtypes`, when given): what the intrinsics below index
    by flat element offset."""
    return isinstance(a, types.Array) and a.layout == "C" and (not dtypes or a.dtype in dtypes)


def _f32_lanes(n: int, lane_type):
    """The loads, stores, broadcast, zero and FMA of n x float32 vectors (lane_type: F32x8 or F32x16), as intrinsics:
    (ld, st, bcast, zero, fma). ld(a, i) is a[i:i+n] (flat element index into a C-contiguous array; uint16 arrays
    hold IEEE halves), st(a, i, v) stores v there (a float32), fma(acc, a, b) is a * b + acc rounded once per lane."""
    vty = ir.VectorType(ir.FloatType(), n)

    @intrinsic
    def ld(typingctx, a, i):
        if not _c_array(a, types.uint16, types.float32):
            return None

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            if sig.args[0].dtype == types.uint16:
                h = builder.load(builder.bitcast(ptr, ir.VectorType(ir.HalfType(), n).as_pointer()), align=2)
                return builder.fpext(h, vty)
            return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=4)

        return lane_type(a, i), codegen

    @intrinsic
    def st(typingctx, a, i, v):
        if not _c_array(a, types.float32):
            return None

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            builder.store(args[2], builder.bitcast(ptr, vty.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(a, i, lane_type), codegen

    @intrinsic
    def bcast(typingctx, x):
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            v = builder.insert_element(ir.Constant(vty, ir.Undefined), args[0], ir.Constant(ir.IntType(32), 0))
            return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))

        return lane_type(types.float32), codegen

    @intrinsic
    def zero(typingctx):
        def codegen(context, builder, sig, args):
            return ir.Constant(vty, [0.0] * n)

        return lane_type(), codegen

    @intrinsic
    def fma(typingctx, acc, a, b):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3), f"llvm.fma.v{n}f32")
            return builder.call(fn, [args[1], args[2], args[0]])

        return lane_type(lane_type, lane_type, lane_type), codegen

    return ld, st, bcast, zero, fma


_ld_f32x8, _st_f32x8, _fbcast, _fzero, _fma_v = _f32_lanes(8, F32x8)
# 16 lanes (AVX-512's zmm): the attention tiles of HAS_ZMM CPUs, lane for lane what the 8-lane ones compute
_ld_f32x16, _st_f32x16, _fbcast16, _fzero16, _fma_v16 = _f32_lanes(16, F32x16)


_v8f64, _v16f32 = ir.VectorType(ir.DoubleType(), 8), ir.VectorType(ir.FloatType(), 16)


def _load_lanes(dtype, n: int, lane_type, widen=None):
    """Intrinsic (a, i): the n elements a[i:i+n] of a C-contiguous array of `dtype` (flat index) as one vector,
    converted by widen(builder, vector) where given (exact conversions only)."""
    elem = {types.int8: ir.IntType(8), types.int32: ir.IntType(32), types.float32: ir.FloatType()}[dtype]

    @intrinsic
    def ld(typingctx, a, i):
        if not _c_array(a, dtype):
            return None

        def codegen(context, builder, sig, args):
            ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            v = builder.load(builder.bitcast(ptr, ir.VectorType(elem, n).as_pointer()), align=dtype.bitwidth // 8)
            return v if widen is None else widen(builder, v)

        return lane_type(a, i), codegen

    return ld


_ld_f64x8 = _load_lanes(types.float32, 8, F64x8, lambda b, v: b.fpext(v, _v8f64))  # float32 x 8 as float64
_ld_i8f32x16 = _load_lanes(types.int8, 16, F32x16, lambda b, v: b.sitofp(v, _v16f32))  # int8 x 16 as float32
_ld_i32x16 = _load_lanes(types.int32, 16, I32x16)  # int32 x 16: a tile's quad column (_key_tiles_q8_0)


def _lanewise(lane_type, op: str):
    """Intrinsic (a, b) -> a op b lane by lane for two vectors of lane_type (op: "fadd", "fsub" or "fmul"), each
    lane rounded as the scalar operation."""

    @intrinsic
    def binary(typingctx, a, b):
        if a != lane_type or b != lane_type:
            return None
        return lane_type(lane_type, lane_type), lambda context, builder, sig, args: getattr(builder, op)(*args)

    return binary


_fadd64 = _lanewise(F64x8, "fadd")
# 16 float32 lanes: the Walsh-Hadamard butterflies (_fwht) and q8_0 V rows' codes times their scale (_attend_heads_q8_0)
_fadd16, _fsub16, _fmul16 = (_lanewise(F32x16, op) for op in ("fadd", "fsub", "fmul"))


@intrinsic
def _fzero64(typingctx):
    return F64x8(), lambda context, builder, sig, args: ir.Constant(_v8f64, [0.0] * 8)


def _fold_halves(builder, c, combine):
    """combine(lower half, upper half) of vector c, again and again down to one lane: that lane's value."""
    while c.type.count > 1:
        n = c.type.count // 2
        lo, hi = (builder.shuffle_vector(c, c, ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(k, k + n))))
                  for k in (0, n))  # fmt: skip
        c = combine(lo, hi)
    return builder.extract_element(c, ir.Constant(ir.IntType(32), 0))


@intrinsic
def _hsum64(typingctx, v):
    """The 8 lanes' sum in a fixed order: lanes k + k+4, then those 4 as 0+2, 1+3, then the two."""
    if v != F64x8:
        return None

    def codegen(context, builder, sig, args):
        return _fold_halves(builder, args[0], builder.fadd)

    return types.float64(F64x8), codegen


@intrinsic
def _vmax16(typingctx, acc, v):
    """Lane-wise v where v > acc, else acc (a NaN in v is never taken; one in acc stays)."""
    if acc != F32x16 or v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered(">", args[1], args[0]), args[1], args[0])

    return F32x16(F32x16, F32x16), codegen


@intrinsic
def _vnan16(typingctx, acc, v):
    """Lane-wise 1.0 where v is NaN, else acc: from zeros, a lane above zero has seen a NaN."""
    if acc != F32x16 or v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        one = ir.Constant(args[0].type, [1.0] * 16)
        return builder.select(builder.fcmp_unordered("uno", args[1], args[1]), one, args[0])

    return F32x16(F32x16, F32x16), codegen


@intrinsic
def _hmax16(typingctx, v):
    """The largest of the 16 lanes (the same select rule, halves against halves)."""
    if v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        return _fold_halves(builder, args[0], lambda lo, hi: builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo))

    return types.float32(F32x16), codegen


@intrinsic
def _eq_first16(typingctx, a, i, v):
    """The lane of the first of a[i:i+16] equal to v, or 16 when none is (a compare mask's trailing zeros)."""
    if not _c_array(a, types.float32) or v != types.float32:
        return None

    def codegen(context, builder, sig, args):
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        x = builder.load(builder.bitcast(ptr, _v16f32.as_pointer()), align=4)
        s = builder.insert_element(ir.Constant(_v16f32, ir.Undefined), args[2], ir.Constant(ir.IntType(32), 0))
        s = builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))
        mask = builder.bitcast(builder.fcmp_ordered("==", x, s), ir.IntType(16))
        wide = builder.or_(builder.zext(mask, ir.IntType(32)), ir.Constant(ir.IntType(32), 1 << 16))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), [ir.IntType(32), ir.IntType(1)]), "llvm.cttz.i32"
        )
        return builder.sext(builder.call(fn, [wide, ir.Constant(ir.IntType(1), 1)]), ir.IntType(64))

    return types.int64(a, i, v), codegen


def _prefetch_hint(rw: int, locality: int):
    """Intrinsic (a, i): start fetching the cache line of element i (flat index into a C-contiguous array), for reading
    (rw 0) or writing (rw 1), into the cache levels `locality` says (llvm.prefetch: no fault, no effect on a value)."""

    @intrinsic
    def hint(typingctx, a, i):
        if not _c_array(a):
            return None

        def codegen(context, builder, sig, args):
            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            ptr = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]), i8p)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
            builder.call(fn, [ptr, ir.Constant(i32, rw), ir.Constant(i32, locality), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.none(a, i), codegen

    return hint


# _prefetch: into L2 and the levels below it, not L1 (locality 2: prefetcht1). attend_group's next work item is ~20 KB
# of keys and values (SmolLM2, 65 positions), as large as the current item's, which L1 (32 KB) then could not hold
# beside it: loaded into every level (prefetcht0) it evicted what the current item was reading. AMD EPYC Zen 4, 2
# threads, each layer's K/V out of cache (scratch attcold, n_ctx 4,096, alternating processes): 8 sequences of
# SmolLM2's heads 46.7-54.6 -> 36.1-42.4 us a layer, 16 of Gemma3's 171-206 -> 130-134 us; in the models' batched
# steps (cProfile, 50 steps, n_ctx 4,096) SmolLM2 8 rows 1.16-1.26 -> 1.02-1.12 ms a step, Gemma3 16 rows 1.54-1.60 ->
# 1.34-1.42 ms. _prefetch_store: a line about to be written, into every level (rw 1, locality 3: prefetchw).
_prefetch, _prefetch_store = _prefetch_hint(0, 2), _prefetch_hint(1, 3)


def _kv_load(v):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(_kv_load, inline="always")
def _kv_load_impl(v):
    if v == types.uint16:
        return lambda v: _f16_to_f32(v)
    return lambda v: np.float32(v)


def _kv_store(x, cache):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(_kv_store, inline="always")
def _kv_store_impl(x, cache):
    if cache.dtype == types.uint16:
        return lambda x, cache: _f32_to_f16(np.float32(x))
    return lambda x, cache: np.float32(x)


def _kv_round(x, cache):  # pragma: no cover - replaced by the overload in compiled code
    raise NotImplementedError


@overload(_kv_round, inline="always")
def _kv_round_impl(x, cache):
    """x rounded to the cache's precision: llama.cpp multiplies f16 K/V by f16-rounded Q and probabilities."""
    if cache.dtype == types.uint16:
        return lambda x, cache: _f16_to_f32(_f32_to_f16(np.float32(x)))
    return lambda x, cache: np.float32(x)


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma), for the exact FMA sequence of ggml's vector exp."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32, f32]), "llvm.fma.f32")
        return builder.call(fn, args)

    return sig, codegen


# ggml_v_expf's constants, as hex floats to be exact
_EXP_SHIFT = np.float32(float.fromhex("0x1.8p23"))
_EXP_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_EXP_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_EXP_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_EXP_C = tuple(
    np.float32(float.fromhex(h))
    for h in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3", "0x1.573e2ep-5", "0x1.0e4020p-7")
)


# No fast-math here: the rounding trick (x * log2e + 1.5 * 2^23) - 1.5 * 2^23 must not be re-associated away.
# Not inlined at the Numba level, so these instructions keep their strict flags when LLVM inlines the call.
@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)  # explicit: callers' flags are inherited
def _expf(x):
    """exp(x) for float32, bit for bit as ggml's AVX-512 `ggml_v_expf` (ggml/src/ggml-cpu/vec.h), which llama.cpp
    uses in softmax and SiLU: about 1.5 ulp, subnormals below 2^-126, 0 / inf outside [-104, 89]."""
    c1, c2, c3, c4, c5 = _EXP_C
    x = min(max(x, np.float32(-104.0)), np.float32(89.0))  # beyond these ggml's result is 0 / inf as well
    z = _fma(x, _EXP_LOG2E, _EXP_SHIFT)
    n = z - _EXP_SHIFT  # round(x / ln 2)
    b = _fma(-n, _EXP_LN2_LO, _fma(-n, _EXP_LN2_HI, x))  # x - n ln 2
    u = b * b
    j = _fma(_fma(_fma(c5, b, c4), u, _fma(c3, b, c2)), u, _fma(c1, b, np.float32(1.0)))
    # j * 2^n in two exact steps (like _mm512_scalef_ps, including overflow to inf and gradual underflow)
    n1 = np.int32(n) >> np.int32(1)
    n2 = np.int32(n) - n1
    return j * bits_f32((n1 + np.int32(127)) << np.int32(23)) * bits_f32((n2 + np.int32(127)) << np.int32(23))


@intrinsic
def _exp_sub16(typingctx, v, m):
    """_expf(v - m) in each of 16 lanes: _expf's float32 operations in its order on every lane (the clamp passing a
    NaN on, as max / min do; every FMA one llvm.fma), so the bits _expf gives each value."""
    if v != F32x16 or m != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32x16 = ir.VectorType(ir.IntType(32), 16)

        def splat(c):
            return ir.Constant(_v16f32, [float(c)] * 16)

        def fma(a, b, c):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v16f32, [_v16f32] * 3), "llvm.fma.v16f32"
            )
            return builder.call(fn, [a, b, c])

        mv = builder.insert_element(ir.Constant(_v16f32, ir.Undefined), args[1], ir.Constant(ir.IntType(32), 0))
        mv = builder.shuffle_vector(mv, mv, ir.Constant(i32x16, [0] * 16))
        x = builder.fsub(args[0], mv)
        x = builder.select(builder.fcmp_ordered("<", x, splat(-104.0)), splat(-104.0), x)
        x = builder.select(builder.fcmp_ordered(">", x, splat(89.0)), splat(89.0), x)
        c1, c2, c3, c4, c5 = (splat(c) for c in _EXP_C)
        z = fma(x, splat(_EXP_LOG2E), splat(_EXP_SHIFT))
        n = builder.fsub(z, splat(_EXP_SHIFT))
        neg = builder.fneg(n)
        b = fma(neg, splat(_EXP_LN2_LO), fma(neg, splat(_EXP_LN2_HI), x))
        u = builder.fmul(b, b)
        j = fma(fma(fma(c5, b, c4), u, fma(c3, b, c2)), u, fma(c1, b, splat(1.0)))
        ni = builder.fptosi(n, i32x16)
        n1 = builder.ashr(ni, ir.Constant(i32x16, [1] * 16))
        n2 = builder.sub(ni, n1)
        bias, at = ir.Constant(i32x16, [127] * 16), ir.Constant(i32x16, [23] * 16)
        s1 = builder.bitcast(builder.shl(builder.add(n1, bias), at), _v16f32)
        s2 = builder.bitcast(builder.shl(builder.add(n2, bias), at), _v16f32)
        return builder.fmul(builder.fmul(j, s1), s2)

    return F32x16(F32x16, types.float32), codegen


@intrinsic
def _f64_half(typingctx, v, k):
    """Lanes 8k..8k+7 of 16 float32 widened to 8 float64 (exact)."""
    if v != F32x16 or not isinstance(k, types.IntegerLiteral):
        return None
    at = k.literal_value

    def codegen(context, builder, sig, args):
        half = builder.shuffle_vector(args[0], args[0], ir.Constant(ir.VectorType(ir.IntType(32), 8),
                                                                    list(range(8 * at, 8 * at + 8))))  # fmt: skip
        return builder.fpext(half, _v8f64)

    return F64x8(F32x16, k), codegen


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _inv_sum(total):
    """float(1 / total) for a float64 sum, as ggml's softmax scales (no approximate reciprocal)."""
    return np.float32(1.0 / total)


@numba.njit(inline="always", **JIT)
def _max_nan_of(x):
    """(max, whether x holds a NaN) of a non-empty float32 vector, in one pass: two 16-lane running maxima over each 32
    values (a lane takes a value only when it is larger, so a NaN past the first 32 is passed over, as max() below
    passes over one after the first) beside two lanes' NaN marks, then the last n % 32 one at a time. The maximum of
    finite values whatever the order. Gemma3's 262,144 logits: 37 -> ~10 us (scalar chains, 8 of them, before). The
    NaN marks are the greedy sampler's check for a row whose normaliser it skips (exp_total's sum would be NaN)."""
    n = x.shape[0]
    if n < 32:
        b, bad = x[0], x[0] != x[0]
        for j in range(1, n):
            b = max(b, x[j])
            bad |= x[j] != x[j]
        return b, bad
    a, b = _ld_f32x16(x, 0), _ld_f32x16(x, 16)
    na, nb = _vnan16(_fzero16(), a), _vnan16(_fzero16(), b)
    n32 = n - n % 32
    for j in range(32, n32, 32):
        va, vb = _ld_f32x16(x, j), _ld_f32x16(x, j + 16)
        a, b = _vmax16(a, va), _vmax16(b, vb)
        na, nb = _vnan16(na, va), _vnan16(nb, vb)
    m = _hmax16(_vmax16(a, b))
    bad = _hmax16(_vmax16(na, nb)) > 0.0
    for j in range(n32, n):
        m = max(m, x[j])
        bad |= x[j] != x[j]
    return m, bad


@numba.njit(inline="always", **JIT)
def _max_of(x):
    """_max_nan_of's maximum alone (inlined, the unused NaN marks compile away)."""
    return _max_nan_of(x)[0]


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _silu(x):
    """x / (1 + exp(-x)) with a true division, as ggml_v_silu."""
    return x / (np.float32(1.0) + _expf(np.float32(0.0) - x))


# ---- norms and residuals ----------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _rms_scale_of(sum_sq, n, eps):
    """1 / sqrtf(mean + eps) in plain float32 as ggml's rms_norm (fast-math would use an approximate rsqrt)."""
    mean = np.float32(sum_sq / n)
    return np.float32(1.0) / np.sqrt(mean + np.float32(eps))


@numba.njit(inline="always", **JIT)
def _rms_scale(x, eps):
    s = 0.0  # float squares summed in double, as ggml
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return _rms_scale_of(s, x.shape[0], eps)


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _add_to(x, y):
    """x += y without fast-math: as its own ggml op, the add must not fuse with the multiply before it (FMA)."""
    for i in range(x.shape[0]):
        x[i] += y[i]


@numba.njit(**JIT)
def rmsnorm(x, w, eps, out):
    """out[m] = x[m] / rms(x[m]) * w.  x, out: float32 [M, n]; w: float32 [n]."""
    for m in range(x.shape[0]):
        scale = _rms_scale(x[m], eps)
        for i in range(x.shape[1]):
            out[m, i] = x[m, i] * scale * w[i]


@numba.njit(**JIT)
def _add_norm_part(x, y, post_w, w, eps, out, m0, m1):
    """add_norm of rows m0..m1-1."""
    for m in range(m0, m1):
        if post_w.shape[0]:
            scale = _rms_scale(y[m], eps)
            for i in range(x.shape[1]):
                y[m, i] = y[m, i] * scale * post_w[i]
        _add_to(x[m], y[m])
        scale = _rms_scale(x[m], eps)
        for i in range(x.shape[1]):
            out[m, i] = x[m, i] * scale * w[i]


@numba.njit(**JIT)
def add_norm(x, y, post_w, w, eps, out):
    """Residual add, then the next RMSNorm: x[m] += post_norm(y[m]) (or y[m] when post_w is empty); out = norm(x) * w.

    x (residual stream, updated in place), y (overwritten), out: float32 [M, n]; post_w, w: float32 [n] or [0].
    """
    _add_norm_part(x, y, post_w, w, eps, out, 0, x.shape[0])


NORM_ROWS = 32  # rows per work item of add_norm_rows: up to one item, this thread (run_items)


@launcher(_add_norm_part, JIT_PARALLEL)
def add_norm_rows(x, y, post_w, w, eps, out):
    """add_norm for passes of several rows (the same bits), NORM_ROWS rows a work item, so that the 2-row pass of
    Transformer.warmup compiles what a prompt runs. 2 threads, in cache, medians of 400 calls, add_norm against the
    rows shared out in items of 8: n_embd 576 at 16 / 32 / 64 / 256 rows 2.6 / 4.4 / 8.7 / 35.0 -> 3.3 / 4.3 / 7.2 /
    22.0 us; 640 with post-norms (Gemma3) 4.1 / 7.6 / 15.0 / 58.7 -> 3.8 / 5.9 / 9.8 / 33.8 us."""
    run_items("_add_norm_part", (x, y, post_w, w, eps, out), x.shape[0], NORM_ROWS)


# ---- attention --------------------------------------------------------------------------------------------------


@numba.njit(inline="always", **JIT)
def _add_biases(q, k, v, q_bias, k_bias, v_bias):
    """One token's q, k, v rows += their biases (empty: none)."""
    for i in range(q_bias.shape[0]):
        q[i] += q_bias[i]
    for i in range(k_bias.shape[0]):
        k[i] += k_bias[i]
    for i in range(v_bias.shape[0]):
        v[i] += v_bias[i]


@numba.njit(inline="always", **JIT)
def _norm_rope(x, nw, eps, cos, sin, p, neox):
    """One head of Q or K in place: per-head RMSNorm (when nw is not empty), then RoPE at position p."""
    if nw.shape[0]:
        scale = _rms_scale(x, eps)
        for i in range(x.shape[0]):
            x[i] = x[i] * scale * nw[i]
    half = cos.shape[1]
    for i in range(half):
        c, s = cos[p, i], sin[p, i]
        i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
        a, b = x[i0], x[i1]
        x[i0] = a * c - b * s
        x[i1] = a * s + b * c


@numba.njit(inline="always", **JIT)
def _qkv_rope_store_row(q, k, v, m, p, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, k_cache,
                        v_cache):  # fmt: skip
    """qkv_rope_store's work for row m at position p."""
    n_kv, hd_k = k_cache.shape[0], k_cache.shape[1]
    hd_v = v_cache.shape[2]
    n_head = q.shape[1] // hd_k
    _add_biases(q[m], k[m], v[m], q_bias, k_bias, v_bias)
    for h in range(n_head + n_kv):
        x = q[m, h * hd_k : (h + 1) * hd_k] if h < n_head else k[m, (h - n_head) * hd_k : (h - n_head + 1) * hd_k]
        _norm_rope(x, q_norm if h < n_head else k_norm, eps, cos, sin, p, neox)
        if h < n_head:
            for i in range(hd_k):
                x[i] = _kv_round(x[i] * q_scale, k_cache)
        else:
            g = h - n_head
            for i in range(hd_k):
                k_cache[g, i, p] = _kv_store(x[i], k_cache)
    for g in range(n_kv):
        for i in range(hd_v):
            v_cache[g, p, i] = _kv_store(v[m, g * hd_v + i], v_cache)


@numba.njit(**JIT)
def qkv_rope_store(
    q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, pos0, k_cache, v_cache
):
    """Finish Q/K/V of M new tokens at positions pos0..pos0+M-1 and append K/V to this layer's cache.

    q [M, n_head*hd_k] (in place: + bias, per-head RMSNorm, rope, * q_scale); k [M, n_kv*hd_k], v [M, n_kv*hd_v]
    (+ bias; K normed and roped) are written to k_cache [n_kv, hd_k, n_ctx] / v_cache [n_kv, n_ctx, hd_v] at the
    token's position. cos/sin: [n_ctx, n_rot/2]. neox: rotate (x[i], x[i + n_rot/2]) else (x[2i], x[2i+1]).
    """
    for m in range(q.shape[0]):
        _qkv_rope_store_row(q, k, v, m, pos0 + m, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale,
                            k_cache, v_cache)  # fmt: skip


STORE_LINE = 32  # positions a cache line of f16 keys holds: qkv_rope_store_rows' work items start on these


@numba.njit(**JIT)
def _qkv_rope_store_lines(q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, pos0,
                          k_cache, v_cache, i0, i1):  # fmt: skip
    """qkv_rope_store_rows' items i0..i1-1: item i the rows whose positions fall in [a + STORE_LINE i,
    a + STORE_LINE (i + 1)), a = pos0 rounded down to a multiple of STORE_LINE."""
    a = pos0 - pos0 % STORE_LINE
    for m in range(max(0, a + STORE_LINE * i0 - pos0), min(q.shape[0], a + STORE_LINE * i1 - pos0)):
        _qkv_rope_store_row(q, k, v, m, pos0 + m, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale,
                            k_cache, v_cache)  # fmt: skip


@launcher(_qkv_rope_store_lines, JIT_PARALLEL)
def qkv_rope_store_rows(
    q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, pos0, k_cache, v_cache
):
    """qkv_rope_store for a prompt's rows (the same bits), shared among the threads; a single work item on this thread
    (run_items), so that the 2-row pass of Transformer.warmup compiles what a long prompt will run. A work item is the
    rows whose positions share the cache lines of the key rows ([hd_k, n_ctx] per K/V head: STORE_LINE f16 positions
    a line), so no two threads write one line (rows dealt two at a time, as qkv_rope_store_group deals decode rows,
    ran a 32-row prompt 28 -> 47 us). 2 threads, in cache, medians of 200 calls: SmolLM2's heads at 64 / 256 rows
    38.4 / 154.3 -> 22.2 / 81.1 us, Gemma3's 75.1 / 298.0 -> 41.0 / 152.3 us."""
    a = pos0 - pos0 % STORE_LINE
    n_items = (pos0 + q.shape[0] - a + STORE_LINE - 1) // STORE_LINE
    run_items("_qkv_rope_store_lines", (q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale,
                                        pos0, k_cache, v_cache), n_items, 1)  # fmt: skip


@numba.njit(**JIT)
def _qkv_rope_store_spans_lines(q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, rows0,
                                pos0s, lens, slots, first_item, k_group, v_group, i0, i1):  # fmt: skip
    """qkv_rope_store_spans' items i0..i1-1: item i is item i - first_item[s] of span s (first_item[s] <= i <
    first_item[s + 1]) as qkv_rope_store_rows deals that span's rows (_qkv_rope_store_lines)."""
    s = 0
    for i in range(i0, i1):
        while first_item[s + 1] <= i:
            s += 1
        r0, r1, j = rows0[s], rows0[s] + lens[s], i - first_item[s]
        _qkv_rope_store_lines(q[r0:r1], k[r0:r1], v[r0:r1], q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox,
                              q_scale, pos0s[s], k_group[slots[s]], v_group[slots[s]], j, j + 1)  # fmt: skip


@launcher(_qkv_rope_store_spans_lines, JIT_PARALLEL)
def qkv_rope_store_spans(
    q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, rows0, pos0s, lens, slots,
    first_item, k_group, v_group,
):  # fmt: skip
    """qkv_rope_store_rows for the prompt chunks of several sequences whose caches are slots of one group (a batched
    prefill pass: span s is rows rows0[s]..rows0[s] + lens[s] - 1 of q / k / v, at positions pos0s[s].. of slot
    slots[s] of k_group [n_slots, n_kv, hd_k, n_ctx] / v_group [n_slots, n_kv, n_ctx, hd_v]) in one call: the work
    items are each span's qkv_rope_store_rows items, first_item[s] the first of span s (first_item[-1]: their count),
    shared among the threads, where one call per span ran each short prompt's rows on one thread. Each row gets
    qkv_rope_store's operations, so the same bits. Intel Xeon (AMX VM), 2 threads, a pass of 8 prompts of 32 tokens
    (dev/step_profile.py --rows 8 --prefill 32, medians of 20 passes, two rounds of alternating trees, in a slow
    minute: passes of 155-224 ms): SmolLM2 13.4-14.3 -> 5.3-7.0 ms a pass, Gemma3 14.9-17.0 -> 6.4-8.4."""
    run_items("_qkv_rope_store_spans_lines", (q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox,
                                              q_scale, rows0, pos0s, lens, slots, first_item, k_group, v_group),
              first_item[first_item.shape[0] - 1], 1)  # fmt: skip


def store_spans_items(pos0s: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """qkv_rope_store_spans' first_item for spans of lens[s] rows at positions pos0s[s]..: each span's first work item
    (the key lines its rows touch, as qkv_rope_store_rows counts them), then their count; int64 [len(lens) + 1]."""
    items = (pos0s % STORE_LINE + lens + STORE_LINE - 1) // STORE_LINE
    return np.concatenate((np.zeros(1, np.int64), np.cumsum(items)))


GROUP_STORE_ROWS = 2  # decode rows per work item of qkv_rope_store_group


@numba.njit(**JIT)
def _qkv_rope_store_part(q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, rows, slots,
                         positions, k_group, v_group, i0, i1):  # fmt: skip
    n_kv, hd_k, stride, hd_v = k_group.shape[1], k_group.shape[2], k_group.shape[3], v_group.shape[3]
    for i in range(i0, i1):  # every line the item's rows write, asked for at once (the stores would wait in turn)
        kc, vc, p = k_group[slots[i]], v_group[slots[i]], positions[i]
        for r in range(n_kv * hd_k):
            _prefetch_store(kc, r * stride + p)
        for g in range(n_kv):  # (a 64-byte line holds 64 // itemsize values: f16 or f32)
            for e in range((g * v_group.shape[2] + p) * hd_v, (g * v_group.shape[2] + p + 1) * hd_v, 64 // vc.itemsize):
                _prefetch_store(vc, e)
    for i in range(i0, i1):
        _qkv_rope_store_row(q, k, v, rows[i], positions[i], q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox,
                            q_scale, k_group[slots[i]], v_group[slots[i]])  # fmt: skip


@launcher(_qkv_rope_store_part, JIT_PARALLEL)
def qkv_rope_store_group(
    q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, rows, slots, positions, k_group,
    v_group,
):  # fmt: skip
    """qkv_rope_store for one token of each of several sequences whose caches are slots of one group (the decode
    rows of a batch, as attend_group): row rows[i] is at position positions[i] of slot slots[i] of k_group
    [n_slots, n_kv, hd_k, n_ctx] / v_group [n_slots, n_kv, n_ctx, hd_v]. One call per layer instead of one per
    sequence, the rows shared among the threads (each row's new key lands in hd_k cache lines, one per key row: ~5 us
    a row, 2.7 ms of SmolLM2's 21 ms step of 16 sequences when serial); each row gets qkv_rope_store's operations,
    so the same bits. A work item first asks for every line its rows will write (_prefetch_store), whose misses then
    overlap instead of waiting behind each other's stores: Ice Lake, 2 threads, 16 sequences at 64 positions,
    alternating processes (dev/step_profile.py), SmolLM2 1.166-1.169 -> 0.989-1.081 ms a step, Gemma3 1.014 ->
    0.902."""
    n = rows.shape[0]
    run_items("_qkv_rope_store_part", (q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale,
                                       rows, slots, positions, k_group, v_group), n, GROUP_STORE_ROWS)  # fmt: skip


# Attention is written so that a query's result is the same bits whether it is computed alone (decode) or in a
# block of prefill queries: the same operations in the same order, explicit FMAs and no fast-math (which would let
# LLVM vectorise the reductions differently in each kernel). Scores accumulate over the head dimension one FMA at
# a time, lane-wise over key positions, which is why keys are cached head-dimension-major ([hd_k, n_ctx]: a
# score sweep reads contiguous positions); outputs accumulate over positions, lane-wise over the value dimension.


@numba.njit(**ATT)
def exp_sum(x, m):
    """x = exp(x - m) in place for float32 x [n] (_expf, ggml's exp); returns the float64 sum of x (as ggml's
    soft_max), in a fixed order: four 8-lane float64 sums over each 32 values (lane k of sum q takes x[32 i + 8 q + k]),
    added lane by lane ((0 + 1) + (2 + 3)), their 8 lanes summed (_hsum64), then the last n % 32 values one at a time.
    The softmax normaliser of values whose maximum is m (attention's scores, ggufrun.sampling's greedy
    log-probability). The exp pass has no loop-carried value, so it vectorises (~1.6 ns a value with NumPy's float32
    exp on the AVX2 machine this was first measured on); the sums run 32 values a step instead of 4 scalar chains
    (Gemma3's 262,144 logits: 73 -> ~15 us)."""
    n = x.shape[0]
    for j in range(n):
        x[j] = _expf(x[j] - m)
    n32 = n - n % 32
    a0, a1, a2, a3 = _fzero64(), _fzero64(), _fzero64(), _fzero64()
    for j in range(0, n32, 32):
        a0, a1 = _fadd64(a0, _ld_f64x8(x, j)), _fadd64(a1, _ld_f64x8(x, j + 8))
        a2, a3 = _fadd64(a2, _ld_f64x8(x, j + 16)), _fadd64(a3, _ld_f64x8(x, j + 24))
    t = _hsum64(_fadd64(_fadd64(a0, a1), _fadd64(a2, a3)))
    for j in range(n32, n):
        t += x[j]
    return t


@numba.njit(**ATT)
def exp_total(x, m):
    """exp_sum's return value, bit for bit (the same exps, the same float64 sums in the same order), with x left as it
    is: each 32 values' exps go from registers into the sums instead of through x and back (_exp_sub16). A greedy
    token's log-probability (ggufrun.sampling), which needs the sum only. Ice Lake, 2 threads, in-process alternating
    calls, greedy_rows (min of 30): Gemma3's 262,144 logits, 1 / 16 rows 0.217 / 2.104 -> 0.185 / 1.703 ms; SmolLM2's
    49,152, 0.042 / 0.318 -> 0.034 / 0.260 ms."""
    n = x.shape[0]
    n32 = n - n % 32
    a0, a1, a2, a3 = _fzero64(), _fzero64(), _fzero64(), _fzero64()
    for j in range(0, n32, 32):
        e0, e1 = _exp_sub16(_ld_f32x16(x, j), m), _exp_sub16(_ld_f32x16(x, j + 16), m)
        a0, a1 = _fadd64(a0, _f64_half(e0, 0)), _fadd64(a1, _f64_half(e0, 1))
        a2, a3 = _fadd64(a2, _f64_half(e1, 0)), _fadd64(a3, _f64_half(e1, 1))
    t = _hsum64(_fadd64(_fadd64(a0, a1), _fadd64(a2, a3)))
    for j in range(n32, n):
        t += _expf(x[j] - m)
    return t


@numba.njit(inline="always", **ATT)
def _first_index(x, v):
    """The first index below n - 1 of x holding v, else n - 1 (the scan `while b < n - 1 and x[b] != v`; with v the
    maximum, np.argmax's answer), 16 values a compare."""
    n = x.shape[0]
    b = 0
    while b + 16 <= n - 1:
        k = _eq_first16(x, b, v)
        if k < 16:
            return b + k
        b += 16
    while b < n - 1 and x[b] != v:
        b += 1
    return b


@numba.njit(**ATT)
def _greedy_part(logits, rows, want, best, sums, i0, i1):
    for i in range(i0, i1):
        x = logits[rows[i]]
        v, bad = _max_nan_of(x)
        best[i] = _first_index(x, v)  # the first of equal maxima, as np.argmax
        # a row whose maximum is +-inf or that holds a NaN gets NaN, for the sampler's error
        if bad or not math.isfinite(v):
            sums[i] = math.nan
        else:
            sums[i] = exp_total(x, v) if want[i] else 1.0


@launcher(_greedy_part, ATT_PARALLEL)
def greedy_rows(logits, rows, want, best, sums):
    """For row rows[i] of logits float32 [M, n_vocab]: best[i] its argmax (the first of equal maxima), sums[i] the
    float64 sum of exp(logit - max) (exp_sum: -log(sums[i]) is the token's log-probability) where want[i] (uint8)
    is set, else 1.0 (no pass over the row's exps: Gemma3's 262,144 logits, ~0.13 ms a row), NaN where the maximum is
    not finite or the row holds a NaN (_max_nan_of: found in the maximum's pass); the bits of ggufrun.sampling's greedy
    Sampler, a row per work item on the threads (a batched decode step's greedy rows: Gemma3's 262,144 logits, 16 rows
    3.96 -> 2.87 ms; without the sums 0.43 ms). The rows are left as they are (exp_total)."""
    run_items("_greedy_part", (logits, rows, want, best, sums), rows.shape[0], 1)


@numba.njit(**ATT)
def _softmax_inplace(x):
    """x = exp(x - max(x)) in place; returns float(1 / sum) (exp_sum)."""
    return _inv_sum(exp_sum(x, _max_of(x)))


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _softcap_scores(x, cap):
    """x = cap * tanh(x * (1 / cap)) in place, as llama.cpp's attention-logit soft-capping (src/llama-graph.cpp
    build_attn_mha: ggml_scale, ggml_tanh (tanhf), ggml_scale). Its own compiled function without fast-math, so
    decode and prefill round every score the same way."""
    inv = np.float32(1.0) / cap
    for j in range(x.shape[0]):
        x[j] = cap * np.float32(math.tanh(x[j] * inv))


# attend_group's key sweeps (_scores_block_z from _heads_block) ask for each key row's line KEY_PREFETCH positions ahead
# of the tile they read. The keys of a K/V head are hd_k rows n_ctx positions apart, each read front to back: 64 or more
# streams at once, more than the hardware prefetchers follow, so a long context's keys came in at the latency of each
# miss. Intel Xeon (AMX VM), 2 threads, n_ctx 4,096, alternating processes: attend_group of 16 SmolLM2 sequences at
# 1,024 positions, 30 layers' caches cycled (min of 300 calls, four rounds), 1,093-1,616 -> 789-1,150 us a layer; at 64
# and 300 positions even (no tile is that far from the end at 64); in SmolLM2's batched steps at 1,024 positions
# (dev/step_profile.py, medians of 30 steps, five rounds) 16 rows 38.1 / 40.3 / 32.0 / 31.2 / 31.9 -> 34.8 / 37.0 /
# 27.6 / 31.0 / 30.3 ms of attend_group a step, 8 rows 19.6 / 17.5 -> 19.2 / 16.6. attend_one (each query head its own
# sweep, the K/V head's lines then in L2 for the next) and prefill (attend_rows: many blocks of queries sweep the same
# keys) gained nothing measurable from it and go without.
KEY_PREFETCH = 256
KV_PAD = 32  # extra positions at the end of every key row and score row: tiles of 16 or 32 positions read past
# the last valid one instead of taking a scalar tail (those lanes are computed and never used)


@numba.njit(**ATT)
def _scores_one(q, qo, keys, t0, n, s):
    """s[:n] = q[qo:qo+hd] . keys[:, t0:t0+n], keys [hd, n_ctx + KV_PAD]; 64 positions at a time (8 FMA chains, where
    4 waited on each other's latency: one head over 3,000 positions 8.6 -> 8.0 us), then 32 at a time (4 chains)
    while 64 would read past the row's KV_PAD spare positions; on AVX-512 (HAS_ZMM) first 128 at a time in 8 chains of
    16 lanes, then 64 in 4. Each lane is one position's chain either way."""
    stride = keys.shape[1]
    wide = 0
    if HAS_ZMM:  # 16-lane vectors: 128 positions in 8 chains, then 64 in 4; the 32-position tiles below finish
        while wide + 128 <= n + KV_PAD:
            a0, a1, a2, a3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            b0, b1, b2, b3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            for i in range(keys.shape[0]):
                qi = _fbcast16(q[qo + i])
                o = i * stride + t0 + wide
                a0 = _fma_v16(a0, qi, _ld_f32x16(keys, o))
                a1 = _fma_v16(a1, qi, _ld_f32x16(keys, o + 16))
                a2 = _fma_v16(a2, qi, _ld_f32x16(keys, o + 32))
                a3 = _fma_v16(a3, qi, _ld_f32x16(keys, o + 48))
                b0 = _fma_v16(b0, qi, _ld_f32x16(keys, o + 64))
                b1 = _fma_v16(b1, qi, _ld_f32x16(keys, o + 80))
                b2 = _fma_v16(b2, qi, _ld_f32x16(keys, o + 96))
                b3 = _fma_v16(b3, qi, _ld_f32x16(keys, o + 112))
            _st_f32x16(s, wide, a0)
            _st_f32x16(s, wide + 16, a1)
            _st_f32x16(s, wide + 32, a2)
            _st_f32x16(s, wide + 48, a3)
            _st_f32x16(s, wide + 64, b0)
            _st_f32x16(s, wide + 80, b1)
            _st_f32x16(s, wide + 96, b2)
            _st_f32x16(s, wide + 112, b3)
            wide += 128
        while wide + 64 <= n + KV_PAD:
            a0, a1, a2, a3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            for i in range(keys.shape[0]):
                qi = _fbcast16(q[qo + i])
                o = i * stride + t0 + wide
                a0 = _fma_v16(a0, qi, _ld_f32x16(keys, o))
                a1 = _fma_v16(a1, qi, _ld_f32x16(keys, o + 16))
                a2 = _fma_v16(a2, qi, _ld_f32x16(keys, o + 32))
                a3 = _fma_v16(a3, qi, _ld_f32x16(keys, o + 48))
            _st_f32x16(s, wide, a0)
            _st_f32x16(s, wide + 16, a1)
            _st_f32x16(s, wide + 32, a2)
            _st_f32x16(s, wide + 48, a3)
            wide += 64
    while wide + 64 <= n + KV_PAD:
        a0, a1, a2, a3 = _fzero(), _fzero(), _fzero(), _fzero()
        b0, b1, b2, b3 = _fzero(), _fzero(), _fzero(), _fzero()
        for i in range(keys.shape[0]):
            qi = _fbcast(q[qo + i])
            o = i * stride + t0 + wide
            a0 = _fma_v(a0, qi, _ld_f32x8(keys, o))
            a1 = _fma_v(a1, qi, _ld_f32x8(keys, o + 8))
            a2 = _fma_v(a2, qi, _ld_f32x8(keys, o + 16))
            a3 = _fma_v(a3, qi, _ld_f32x8(keys, o + 24))
            b0 = _fma_v(b0, qi, _ld_f32x8(keys, o + 32))
            b1 = _fma_v(b1, qi, _ld_f32x8(keys, o + 40))
            b2 = _fma_v(b2, qi, _ld_f32x8(keys, o + 48))
            b3 = _fma_v(b3, qi, _ld_f32x8(keys, o + 56))
        _st_f32x8(s, wide, a0)
        _st_f32x8(s, wide + 8, a1)
        _st_f32x8(s, wide + 16, a2)
        _st_f32x8(s, wide + 24, a3)
        _st_f32x8(s, wide + 32, b0)
        _st_f32x8(s, wide + 40, b1)
        _st_f32x8(s, wide + 48, b2)
        _st_f32x8(s, wide + 56, b3)
        wide += 64
    for t in range(wide, n, 32):
        a0, a1, a2, a3 = _fzero(), _fzero(), _fzero(), _fzero()
        for i in range(keys.shape[0]):
            qi = _fbcast(q[qo + i])
            o = i * stride + t0 + t
            a0 = _fma_v(a0, qi, _ld_f32x8(keys, o))
            a1 = _fma_v(a1, qi, _ld_f32x8(keys, o + 8))
            a2 = _fma_v(a2, qi, _ld_f32x8(keys, o + 16))
            a3 = _fma_v(a3, qi, _ld_f32x8(keys, o + 24))
        _st_f32x8(s, t, a0)
        _st_f32x8(s, t + 8, a1)
        _st_f32x8(s, t + 16, a2)
        _st_f32x8(s, t + 24, a3)


@numba.njit(**ATT)
def _values_one(p, values, t0, n, out, oo):
    """out[oo:oo+hd_v] = sum over t < n of p[t] * values[t0 + t] (values [n_ctx, hd_v]), each lane in t order; 64
    dimensions at a time (8 chains, as _scores_one: 3,000 positions 7.9 -> 6.5 us), then 32 (4), then one; on AVX-512
    (HAS_ZMM) first 128 in 8 chains of 16 lanes, then 64 in 4."""
    hd = values.shape[1]
    i = 0
    if HAS_ZMM:  # 16-lane vectors: 128 dimensions in 8 chains, then 64 in 4, then 32 in 2
        while i + 128 <= hd:
            c0, c1, c2, c3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            e0, e1, e2, e3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            for t in range(n):
                pt = _fbcast16(p[t])
                o = (t0 + t) * hd + i
                c0 = _fma_v16(c0, pt, _ld_f32x16(values, o))
                c1 = _fma_v16(c1, pt, _ld_f32x16(values, o + 16))
                c2 = _fma_v16(c2, pt, _ld_f32x16(values, o + 32))
                c3 = _fma_v16(c3, pt, _ld_f32x16(values, o + 48))
                e0 = _fma_v16(e0, pt, _ld_f32x16(values, o + 64))
                e1 = _fma_v16(e1, pt, _ld_f32x16(values, o + 80))
                e2 = _fma_v16(e2, pt, _ld_f32x16(values, o + 96))
                e3 = _fma_v16(e3, pt, _ld_f32x16(values, o + 112))
            _st_f32x16(out, oo + i, c0)
            _st_f32x16(out, oo + i + 16, c1)
            _st_f32x16(out, oo + i + 32, c2)
            _st_f32x16(out, oo + i + 48, c3)
            _st_f32x16(out, oo + i + 64, e0)
            _st_f32x16(out, oo + i + 80, e1)
            _st_f32x16(out, oo + i + 96, e2)
            _st_f32x16(out, oo + i + 112, e3)
            i += 128
        while i + 64 <= hd:
            c0, c1, c2, c3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            for t in range(n):
                pt = _fbcast16(p[t])
                o = (t0 + t) * hd + i
                c0 = _fma_v16(c0, pt, _ld_f32x16(values, o))
                c1 = _fma_v16(c1, pt, _ld_f32x16(values, o + 16))
                c2 = _fma_v16(c2, pt, _ld_f32x16(values, o + 32))
                c3 = _fma_v16(c3, pt, _ld_f32x16(values, o + 48))
            _st_f32x16(out, oo + i, c0)
            _st_f32x16(out, oo + i + 16, c1)
            _st_f32x16(out, oo + i + 32, c2)
            _st_f32x16(out, oo + i + 48, c3)
            i += 64
    while i + 64 <= hd:
        c0, c1, c2, c3 = _fzero(), _fzero(), _fzero(), _fzero()
        e0, e1, e2, e3 = _fzero(), _fzero(), _fzero(), _fzero()
        for t in range(n):
            pt = _fbcast(p[t])
            o = (t0 + t) * hd + i
            c0 = _fma_v(c0, pt, _ld_f32x8(values, o))
            c1 = _fma_v(c1, pt, _ld_f32x8(values, o + 8))
            c2 = _fma_v(c2, pt, _ld_f32x8(values, o + 16))
            c3 = _fma_v(c3, pt, _ld_f32x8(values, o + 24))
            e0 = _fma_v(e0, pt, _ld_f32x8(values, o + 32))
            e1 = _fma_v(e1, pt, _ld_f32x8(values, o + 40))
            e2 = _fma_v(e2, pt, _ld_f32x8(values, o + 48))
            e3 = _fma_v(e3, pt, _ld_f32x8(values, o + 56))
        _st_f32x8(out, oo + i, c0)
        _st_f32x8(out, oo + i + 8, c1)
        _st_f32x8(out, oo + i + 16, c2)
        _st_f32x8(out, oo + i + 24, c3)
        _st_f32x8(out, oo + i + 32, e0)
        _st_f32x8(out, oo + i + 40, e1)
        _st_f32x8(out, oo + i + 48, e2)
        _st_f32x8(out, oo + i + 56, e3)
        i += 64
    while i + 32 <= hd:
        c0, c1, c2, c3 = _fzero(), _fzero(), _fzero(), _fzero()
        for t in range(n):
            pt = _fbcast(p[t])
            o = (t0 + t) * hd + i
            c0 = _fma_v(c0, pt, _ld_f32x8(values, o))
            c1 = _fma_v(c1, pt, _ld_f32x8(values, o + 8))
            c2 = _fma_v(c2, pt, _ld_f32x8(values, o + 16))
            c3 = _fma_v(c3, pt, _ld_f32x8(values, o + 24))
        _st_f32x8(out, oo + i, c0)
        _st_f32x8(out, oo + i + 8, c1)
        _st_f32x8(out, oo + i + 16, c2)
        _st_f32x8(out, oo + i + 24, c3)
        i += 32
    for j in range(i, hd):
        acc = np.float32(0.0)
        for t in range(n):
            acc = _fma(p[t], _kv_load(values[t0 + t, j]), acc)
        out[oo + j] = acc


@numba.njit(**ATT)
def _heads_or_blocks(n_head, n_kv, n_seq, n_slots):
    """How attend_group splits its work: (grouped, work items per sequence). Grouped: the query heads that share a
    K/V head run in blocks of up to QUERY_BLOCK (_heads_block: each key and value loaded once for the block, 8 FMA
    chains instead of 4), n_kv x ceil(group / QUERY_BLOCK) items per sequence; chosen when the task slots get the
    same number of items or at least two each, so that threads do not wait for one another (3 sequences of a model
    with one K/V head on 2 threads keep one item per head). Either way every head gets the same bits.
    attend_one (a single sequence) keeps one item per head: SmolLM2's 3 K/V heads or Gemma3-270M's one would leave
    a thread idle, and compiling the blocks too would add to the first run."""
    nb = (n_head // n_kv + QUERY_BLOCK - 1) // QUERY_BLOCK
    n_items = n_seq * n_kv * nb
    if n_items % n_slots == 0 or n_items >= 2 * n_slots:
        return True, n_kv * nb
    return False, n_head


@numba.njit(**ATT)
def _heads_block(q2, h0, nr, keys, values, t0, n, softcap, sc, out2):
    """Query heads h0..h0+nr-1 (rows of q2 [n_head, hd_k], nr <= QUERY_BLOCK, all reading the K/V head keys
    [hd_k, n_ctx + KV_PAD] / values [n_ctx, hd_v]) over positions t0..t0+n-1, into rows h0.. of out2
    [n_head, hd_v]; sc: scratch [QUERY_BLOCK, >= n + KV_PAD]. The tiles of attend_rows with the block's rows being
    heads instead of positions: each head gets _attend_head's bits (the same lane-wise FMA chains)."""
    r1, r2, r3 = h0 + min(1, nr - 1), h0 + min(2, nr - 1), h0 + min(3, nr - 1)  # missing rows repeat the last
    zero = np.int64(0)  # not the literal 0: the tiles' compiled versions are attend_rows' own (int64 offsets)
    if HAS_ZMM:
        _scores_block_z(q2, h0, r1, r2, r3, zero, keys, t0, zero, n, sc, KEY_PREFETCH)
    else:
        _scores_block(q2, h0, r1, r2, r3, zero, keys, t0, zero, n, sc)
    for r in range(QUERY_BLOCK):
        p = sc[r, :n]
        if r >= nr:  # a repeated row: no output, but its probabilities must be finite zeros
            p[:] = 0.0
            continue
        if softcap != 0.0:
            _softcap_scores(p, softcap)
        inv = _softmax_inplace(p)
        for j in range(n):
            p[j] = _kv_round(p[j] * inv, values)
    if HAS_ZMM:
        _values_block_z(sc, zero, n, values, t0, out2, h0, nr, zero, False)
    else:
        _values_block(sc, zero, n, values, t0, out2, h0, nr, zero, zero)


@numba.njit(inline="always", **ATT)
def _attend_item(q, k_cache, v_cache, t0, t1, softcap, grouped, item, sc, out):
    """Work item `item` of one decoding token (q [n_head*hd_k] -> out [n_head*hd_v]): query head `item`, or
    (grouped) block item % nb of K/V head item // nb's query heads."""
    n_kv, hd_k, hd_v = k_cache.shape[0], k_cache.shape[1], v_cache.shape[2]
    n_head = q.shape[0] // hd_k
    group = n_head // n_kv
    if grouped:
        nb = (group + QUERY_BLOCK - 1) // QUERY_BLOCK
        g, b = item // nb, item % nb
        h0 = g * group + QUERY_BLOCK * b
        nr = min(QUERY_BLOCK, group - QUERY_BLOCK * b)
        _heads_block(q.reshape(n_head, hd_k), h0, nr, k_cache[g], v_cache[g], t0, t1 - t0, softcap, sc,
                     out.reshape(n_head, hd_v))  # fmt: skip
    else:
        h = item
        _attend_head(q, h * hd_k, k_cache[h // group], v_cache[h // group], t0, t1 - t0, softcap, sc[0], out,
                     h * hd_v)  # fmt: skip


@numba.njit(**ATT)
def _attend_one_heads(q, k_cache, v_cache, t0, t1, softcap, scores, out, h0, h1):
    """attend_one's query heads h0..h1-1."""
    hd_k, hd_v = k_cache.shape[1], v_cache.shape[2]
    group = q.shape[0] // hd_k // k_cache.shape[0]
    for h in range(h0, h1):
        _attend_head(q, h * hd_k, k_cache[h // group], v_cache[h // group], t0, t1 - t0, softcap, scores[h], out,
                     h * hd_v)  # fmt: skip


@launcher(_attend_one_heads, ATT_PARALLEL)
def attend_one(q, k_cache, v_cache, t0, t1, softcap, scores, out):
    """Attention of one token over cached positions t0..t1-1, every head (decode), heads spread over threads.

    q [n_head*hd_k] (already scaled); k_cache [n_kv, hd_k, n_ctx + KV_PAD]; v_cache [n_kv, n_ctx, hd_v];
    softcap: float32, scores = softcap * tanh(scores / softcap) before the softmax (0: none);
    scores: float32 scratch [n_head, >= t1 - t0 + KV_PAD]; out [n_head*hd_v]. Query head h reads K/V head
    h // (n_head / n_kv). Probabilities are rounded to the cache's precision, as llama.cpp does.
    """
    n_head = q.shape[0] // k_cache.shape[1]
    run_items("_attend_one_heads", (q, k_cache, v_cache, t0, t1, softcap, scores, out), n_head, 1)


@numba.njit(inline="always", **ATT)
def _attend_head(q, qo, keys, values, t0, n, softcap, s, out, oo):
    """One query head (q[qo:qo+hd_k]) over positions t0..t0+n-1 of one K/V head: keys [hd_k, n_ctx + KV_PAD],
    values [n_ctx, hd_v], scratch s [>= n + KV_PAD]; the result goes to out[oo:oo+hd_v]."""
    _scores_one(q, qo, keys, t0, n, s)
    p = s[:n]
    if softcap != 0.0:
        _softcap_scores(p, softcap)
    inv = _softmax_inplace(p)
    for t in range(n):
        p[t] = _kv_round(p[t] * inv, values)
    _values_one(p, values, t0, n, out, oo)


PREFETCH_POSITIONS = 128  # attend_group loads this many positions of the next work item ahead


@numba.njit(inline="always", **ATT)
def _prefetch_item(k_cache, v_cache, t0, t1, grouped, item, n_head):
    """Start loading the first PREFETCH_POSITIONS keys and values of positions t0..t1-1 that work item `item` of
    attend_group (_attend_item) reads. Its key rows are n_ctx positions apart: hd_k streams, more than the hardware
    prefetcher follows, and a batched decode step finds them out of cache (the products in between stream the
    weights): SmolLM2, 16 slots decoding at 64 positions, attend_group 5.4 -> 3.5-3.9 ms a step."""
    n_kv, hd_k, hd_v = k_cache.shape[0], k_cache.shape[1], v_cache.shape[2]
    group = n_head // n_kv
    g = item // ((group + QUERY_BLOCK - 1) // QUERY_BLOCK) if grouped else item // group  # its K/V head
    stride = k_cache.shape[2]
    end = min(t1, t0 + PREFETCH_POSITIONS)
    for d in range(hd_k):
        row = (g * hd_k + d) * stride
        for t in range(t0, end, 32):  # 32 f16 positions a cache line (f32: every other line)
            _prefetch(k_cache, row + t)
    for e in range((g * v_cache.shape[1] + t0) * hd_v, (g * v_cache.shape[1] + end) * hd_v, 32):
        _prefetch(v_cache, e)


@numba.njit(**ATT)
def _attend_group_tasks(q, k_group, v_group, rows, slots, t0s, t1s, softcap, scores, out, task0, task1):
    """attend_group's tasks task0..task1-1."""
    n_head = q.shape[1] // k_group.shape[2]
    grouped, per_seq = _heads_or_blocks(n_head, k_group.shape[1], rows.shape[0], scores.shape[0])
    n_items = rows.shape[0] * per_seq
    n_tasks = min(scores.shape[0], n_items)
    for task in range(task0, task1):
        for item in range(task, n_items, n_tasks):
            i, j = item // per_seq, item % per_seq
            ahead = item + n_tasks  # this task's next item: its first keys and values on their way meanwhile
            if ahead < n_items:
                a = ahead // per_seq
                _prefetch_item(k_group[slots[a]], v_group[slots[a]], t0s[a], t1s[a], grouped, ahead % per_seq, n_head)
            _attend_item(q[rows[i]], k_group[slots[i]], v_group[slots[i]], t0s[i], t1s[i], softcap, grouped, j,
                         scores[task], out[rows[i]])  # fmt: skip


@launcher(_attend_group_tasks, ATT_PARALLEL)
def attend_group(q, k_group, v_group, rows, slots, t0s, t1s, softcap, scores, out):
    """attend_one for several decoding sequences whose caches are slots of one group (KVCache.group), in one call:
    row rows[i] of q / out is sequence i's token, attending positions t0s[i]..t1s[i]-1 of slot slots[i].

    k_group [n_slots, n_kv, hd_k, n_ctx + KV_PAD] and v_group [n_slots, n_kv, n_ctx, hd_v] (one layer of the group);
    scores: float32 scratch [n_tasks, QUERY_BLOCK, >= n_ctx + KV_PAD]. Work items (sequence, head or block of heads:
    _heads_or_blocks) are dealt round-robin to the tasks. Each item runs attend_one's code for it (_attend_item), so
    every sequence gets attend_one's bits.
    """
    n_head = q.shape[1] // k_group.shape[2]
    _, per_seq = _heads_or_blocks(n_head, k_group.shape[1], rows.shape[0], scores.shape[0])
    n_tasks = min(scores.shape[0], rows.shape[0] * per_seq)
    run_items("_attend_group_tasks", (q, k_group, v_group, rows, slots, t0s, t1s, softcap, scores, out), n_tasks, 1)


QUERY_BLOCK = 4  # queries of one head processed together, sharing each loaded key and value


@numba.njit(**ATT)
def _scores_block(q, r0, r1, r2, r3, qo, keys, t0, lo, hi, sc):
    """sc[r, lo:hi] = query row r's head slice . keys over positions t0+lo..t0+hi-1, for the 4 rows r0..r3 of q
    (in sc's rows 0..3); tiles of 16 positions x 4 queries, each lane the chain _scores_one computes."""
    stride = keys.shape[1]
    for t in range(lo, hi, 16):
        a0, a1, b0, b1 = _fzero(), _fzero(), _fzero(), _fzero()
        c0, c1, e0, e1 = _fzero(), _fzero(), _fzero(), _fzero()
        for i in range(keys.shape[0]):
            o = i * stride + t0 + t
            k0, k1 = _ld_f32x8(keys, o), _ld_f32x8(keys, o + 8)
            x = _fbcast(q[r0, qo + i])
            a0, a1 = _fma_v(a0, x, k0), _fma_v(a1, x, k1)
            if r1 != r0:  # rows that repeat the one before: skipped (_scores_block_z)
                x = _fbcast(q[r1, qo + i])
                b0, b1 = _fma_v(b0, x, k0), _fma_v(b1, x, k1)
            if r2 != r1:
                x = _fbcast(q[r2, qo + i])
                c0, c1 = _fma_v(c0, x, k0), _fma_v(c1, x, k1)
            if r3 != r2:
                x = _fbcast(q[r3, qo + i])
                e0, e1 = _fma_v(e0, x, k0), _fma_v(e1, x, k1)
        _st_f32x8(sc[0], t, a0)
        _st_f32x8(sc[0], t + 8, a1)
        _st_f32x8(sc[1], t, b0)
        _st_f32x8(sc[1], t + 8, b1)
        _st_f32x8(sc[2], t, c0)
        _st_f32x8(sc[2], t + 8, c1)
        _st_f32x8(sc[3], t, e0)
        _st_f32x8(sc[3], t + 8, e1)


@numba.njit(**ATT)
def _values_block(sc, lo, hi, values, t0, out, r0, nr, oo, i0):
    """out[r0 + r, oo+i0:oo+hd_v] = sum over t in [lo, hi) of sc[r, t] * values[t0 + t, i0:] for r < nr; tiles of
    16 dims x 4 queries, each lane the chain _values_one computes (probability-0 terms leave a sum unchanged)."""
    hd = values.shape[1]
    p0, p1, p2, p3 = sc[0], sc[1], sc[2], sc[3]
    i = i0
    while i + 16 <= hd:
        a0, a1, b0, b1 = _fzero(), _fzero(), _fzero(), _fzero()
        c0, c1, e0, e1 = _fzero(), _fzero(), _fzero(), _fzero()
        for t in range(lo, hi):
            o = (t0 + t) * hd + i
            v0, v1 = _ld_f32x8(values, o), _ld_f32x8(values, o + 8)
            x = _fbcast(p0[t])
            a0, a1 = _fma_v(a0, x, v0), _fma_v(a1, x, v1)
            if nr > 1:  # only the rows stored
                x = _fbcast(p1[t])
                b0, b1 = _fma_v(b0, x, v0), _fma_v(b1, x, v1)
            if nr > 2:
                x = _fbcast(p2[t])
                c0, c1 = _fma_v(c0, x, v0), _fma_v(c1, x, v1)
            if nr > 3:
                x = _fbcast(p3[t])
                e0, e1 = _fma_v(e0, x, v0), _fma_v(e1, x, v1)
        _st_f32x8(out[r0], oo + i, a0)
        _st_f32x8(out[r0], oo + i + 8, a1)
        if nr > 1:
            _st_f32x8(out[r0 + 1], oo + i, b0)
            _st_f32x8(out[r0 + 1], oo + i + 8, b1)
        if nr > 2:
            _st_f32x8(out[r0 + 2], oo + i, c0)
            _st_f32x8(out[r0 + 2], oo + i + 8, c1)
        if nr > 3:
            _st_f32x8(out[r0 + 3], oo + i, e0)
            _st_f32x8(out[r0 + 3], oo + i + 8, e1)
        i += 16
    for r in range(nr):
        for j in range(i, hd):
            acc = np.float32(0.0)
            for t in range(lo, hi):
                acc = _fma(sc[r, t], _kv_load(values[t0 + t, j]), acc)
            out[r0 + r, oo + j] = acc


@numba.njit(**ATT)
def _scores_block_z(q, r0, r1, r2, r3, qo, keys, t0, lo, hi, sc, ahead):
    """_scores_block in tiles of 32 positions x 4 queries (16-lane vectors, HAS_ZMM): every lane the same chain. A
    row that repeats the one before it (a block of fewer than 4 queries) is skipped and its scores left 0: the callers
    zero those rows anyway, and a model with 3 or 6 query heads a K/V head (SmolLM2, Qwen2.5-1.5B) had spent a quarter
    of its FMAs on them (values likewise, _values_block_z). attend_group, one thread, in cache, 16 sequences: SmolLM2's
    heads at 64 / 256 positions 55 / 178 -> 47-51 / 154-156 us, 12 heads on 2 K/V heads of 128 (Qwen2.5-1.5B's) 127 /
    443-452 -> 108-110 / 372-382 us; Gemma3's (4 on 1) and attend_rows (prefill) unchanged."""
    stride = keys.shape[1]
    t = lo
    while t + 16 < hi:
        a0, a1, b0, b1 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        c0, c1, e0, e1 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        if ahead and t + ahead < hi:  # the key lines `ahead` positions on (decode: KEY_PREFETCH), read later
            for i in range(keys.shape[0]):
                _prefetch(keys, i * stride + t0 + t + ahead)
        for i in range(keys.shape[0]):
            o = i * stride + t0 + t
            k0, k1 = _ld_f32x16(keys, o), _ld_f32x16(keys, o + 16)
            x = _fbcast16(q[r0, qo + i])
            a0, a1 = _fma_v16(a0, x, k0), _fma_v16(a1, x, k1)
            if r1 != r0:
                x = _fbcast16(q[r1, qo + i])
                b0, b1 = _fma_v16(b0, x, k0), _fma_v16(b1, x, k1)
            if r2 != r1:
                x = _fbcast16(q[r2, qo + i])
                c0, c1 = _fma_v16(c0, x, k0), _fma_v16(c1, x, k1)
            if r3 != r2:
                x = _fbcast16(q[r3, qo + i])
                e0, e1 = _fma_v16(e0, x, k0), _fma_v16(e1, x, k1)
        _st_f32x16(sc[0], t, a0)
        _st_f32x16(sc[0], t + 16, a1)
        _st_f32x16(sc[1], t, b0)
        _st_f32x16(sc[1], t + 16, b1)
        _st_f32x16(sc[2], t, c0)
        _st_f32x16(sc[2], t + 16, c1)
        _st_f32x16(sc[3], t, e0)
        _st_f32x16(sc[3], t + 16, e1)
        t += 32
    if t < hi:  # 16 positions or fewer left: one 16-lane tile, not a 32-lane one half of whose lanes go unused
        a0, b0, c0, e0 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        for i in range(keys.shape[0]):
            k0 = _ld_f32x16(keys, i * stride + t0 + t)
            a0 = _fma_v16(a0, _fbcast16(q[r0, qo + i]), k0)
            if r1 != r0:
                b0 = _fma_v16(b0, _fbcast16(q[r1, qo + i]), k0)
            if r2 != r1:
                c0 = _fma_v16(c0, _fbcast16(q[r2, qo + i]), k0)
            if r3 != r2:
                e0 = _fma_v16(e0, _fbcast16(q[r3, qo + i]), k0)
        _st_f32x16(sc[0], t, a0)
        _st_f32x16(sc[1], t, b0)
        _st_f32x16(sc[2], t, c0)
        _st_f32x16(sc[3], t, e0)


@numba.njit(**ATT)
def _values_block_z(sc, lo, hi, values, t0, out, r0, nr, oo, from_out):
    """_values_block in tiles of 32 dims x 4 queries (16-lane vectors, HAS_ZMM), then _values_block's for the
    dims left (a head of 80 or 112); every lane the same chain, and only the nr rows that are stored. from_out: the
    chains go on from the sums in out (a block of positions after the ones before it: _attend_rows_tiled; only for
    heads of a multiple of 32 dims), not from 0."""
    hd = values.shape[1]
    p0, p1, p2, p3 = sc[0], sc[1], sc[2], sc[3]
    i = 0
    while i + 32 <= hd:
        a0, a1, b0, b1 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        c0, c1, e0, e1 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        if from_out:  # rows past nr load a stored row again; their sums are never stored
            o1, o2, o3 = out[r0 + min(1, nr - 1)], out[r0 + min(2, nr - 1)], out[r0 + min(3, nr - 1)]
            a0, a1 = _ld_f32x16(out[r0], oo + i), _ld_f32x16(out[r0], oo + i + 16)
            b0, b1 = _ld_f32x16(o1, oo + i), _ld_f32x16(o1, oo + i + 16)
            c0, c1 = _ld_f32x16(o2, oo + i), _ld_f32x16(o2, oo + i + 16)
            e0, e1 = _ld_f32x16(o3, oo + i), _ld_f32x16(o3, oo + i + 16)
        for t in range(lo, hi):
            o = (t0 + t) * hd + i
            v0, v1 = _ld_f32x16(values, o), _ld_f32x16(values, o + 16)
            x = _fbcast16(p0[t])
            a0, a1 = _fma_v16(a0, x, v0), _fma_v16(a1, x, v1)
            if nr > 1:
                x = _fbcast16(p1[t])
                b0, b1 = _fma_v16(b0, x, v0), _fma_v16(b1, x, v1)
            if nr > 2:
                x = _fbcast16(p2[t])
                c0, c1 = _fma_v16(c0, x, v0), _fma_v16(c1, x, v1)
            if nr > 3:
                x = _fbcast16(p3[t])
                e0, e1 = _fma_v16(e0, x, v0), _fma_v16(e1, x, v1)
        _st_f32x16(out[r0], oo + i, a0)
        _st_f32x16(out[r0], oo + i + 16, a1)
        if nr > 1:
            _st_f32x16(out[r0 + 1], oo + i, b0)
            _st_f32x16(out[r0 + 1], oo + i + 16, b1)
        if nr > 2:
            _st_f32x16(out[r0 + 2], oo + i, c0)
            _st_f32x16(out[r0 + 2], oo + i + 16, c1)
        if nr > 3:
            _st_f32x16(out[r0 + 3], oo + i, e0)
            _st_f32x16(out[r0 + 3], oo + i + 16, e1)
        i += 32
    if i < hd:
        _values_block(sc, lo, hi, values, t0, out, r0, nr, oo, i)


@numba.njit(inline="always", **ATT)
def _block_span(b, m_rows, pos0, t0, n, window):
    """Block b of a prompt chunk's queries (M = m_rows at positions pos0..): (its first row, its rows, the columns
    [lo, hi) of the keys t0.. that some query of it sees)."""
    m0 = b * QUERY_BLOCK
    nr = min(QUERY_BLOCK, m_rows - m0)
    lo = max(0, pos0 + m0 - window + 1 - t0) if window > 0 else 0
    return m0, nr, lo, min(n, pos0 + m0 + nr - t0)


@numba.njit(inline="always", **ATT)
def _block_probabilities(sc, nr, lo, hi, c0, n, window, softcap, v_cache):
    """Rows 0..3 of sc, a block's scores over columns [lo, hi) whose row r is the query at column c0 + r, to
    probabilities: each of the first nr rows softmaxed over the columns it sees (window 0: all up to its own, of n),
    rounded to the cache's precision, 0 elsewhere in [lo, hi); the rows past nr (repeats) 0."""
    for r in range(QUERY_BLOCK):
        row = sc[r]
        if r >= nr:  # a repeated row: no output, but its probabilities must be finite zeros
            row[lo:hi] = 0.0
            continue
        p = c0 + r
        rlo = max(0, p - window + 1) if window > 0 else 0
        rhi = min(n, p + 1)
        visible = row[rlo:rhi]
        if softcap != 0.0:
            _softcap_scores(visible, softcap)
        inv = _softmax_inplace(visible)
        for j in range(rhi - rlo):
            visible[j] = _kv_round(visible[j] * inv, v_cache)
        row[lo:rlo] = 0.0
        row[rhi:hi] = 0.0


LONG_SPAN = 3000  # prompt spans of more positions than this take _attend_rows_tiled (where scores has the rows)
KEY_TILE = 512  # positions a tile of _attend_rows_tiled: SmolLM2's keys and values 128 KB, Gemma3's 512 KB
TILED_BLOCKS = 16  # blocks of 4 queries a work item of _attend_rows_tiled takes (RunState.block_scores' rows / 4)


@numba.njit(**ATT)
def _attend_rows_tiled(q, k_cache, v_cache, pos0, t0, n, window, softcap, scores, out, slot0, slot1):
    """_attend_rows_slots for long spans (HAS_ZMM, heads of a multiple of 32 dims): a work item is a head's
    scores.shape[1] / 4 blocks of 4 queries, which take their scores KEY_TILE positions at a time (each tile's keys
    read once from memory for all of them, then from L2), softmax their rows, then take the values KEY_TILE
    positions at a time, the sums waiting in out between tiles. Each lane's chains are _attend_rows_slots' in the
    same order (a score's over dimensions, whatever tile it falls in; a sum's over positions, tile after tile), so
    the same bits. Before, each block of 4 queries read all of a head's keys and values, which from ~3,000 positions
    on no longer fit L2: Ice Lake VM, 2 threads, 256 queries, the two in turns, equal outputs asserted: SmolLM2's
    heads (30 layers) at 12,000 positions 2,601 -> 1,872 ms, at 5,000 with a window of 4,096 615 -> 615; Gemma3's
    (18 layers) 4,542 -> 2,048 ms and 1,257 -> 744."""
    m_rows, n_kv, hd_k, hd_v = q.shape[0], k_cache.shape[0], k_cache.shape[1], v_cache.shape[2]
    n_head = q.shape[1] // hd_k
    group = n_head // n_kv
    n_blocks = (m_rows + QUERY_BLOCK - 1) // QUERY_BLOCK
    n_slots, per_item = scores.shape[0], scores.shape[1] // QUERY_BLOCK
    n_items = (n_blocks + per_item - 1) // per_item
    for slot in range(slot0, slot1):
        for item in range(slot, n_head * n_items, n_slots):
            h, b0 = item // n_items, item % n_items * per_item
            b1 = min(n_blocks, b0 + per_item)
            g = h // group
            first = _block_span(b0, m_rows, pos0, t0, n, window)[2]  # the columns the item's blocks see
            last = _block_span(b1 - 1, m_rows, pos0, t0, n, window)[3]
            for a in range(first, last, KEY_TILE):
                for b in range(b0, b1):
                    m0, nr, lo, hi = _block_span(b, m_rows, pos0, t0, n, window)
                    lo, hi = max(lo, a), min(hi, a + KEY_TILE)
                    if lo < hi:
                        r1, r2, r3 = m0 + min(1, nr - 1), m0 + min(2, nr - 1), m0 + min(3, nr - 1)
                        sc = scores[slot][(b - b0) * QUERY_BLOCK : (b - b0 + 1) * QUERY_BLOCK]
                        _scores_block_z(q, m0, r1, r2, r3, h * hd_k, k_cache[g], t0, lo, hi, sc, 0)
            for b in range(b0, b1):
                m0, nr, lo, hi = _block_span(b, m_rows, pos0, t0, n, window)
                sc = scores[slot][(b - b0) * QUERY_BLOCK : (b - b0 + 1) * QUERY_BLOCK]
                _block_probabilities(sc, nr, lo, hi, pos0 + m0 - t0, n, window, softcap, v_cache)
            for a in range(first, last, KEY_TILE):
                for b in range(b0, b1):
                    m0, nr, lo0, hi = _block_span(b, m_rows, pos0, t0, n, window)
                    lo, hi = max(lo0, a), min(hi, a + KEY_TILE)
                    if lo < hi:  # the block's first tile starts its sums from 0
                        sc = scores[slot][(b - b0) * QUERY_BLOCK : (b - b0 + 1) * QUERY_BLOCK]
                        _values_block_z(sc, lo, hi, v_cache[g], t0, out, m0, nr, h * hd_v, lo > lo0)


@numba.njit(**ATT)
def _attend_rows_slots(q, k_cache, v_cache, pos0, t0, n, window, softcap, scores, out, slot0, slot1):
    """attend_rows' slots slot0..slot1-1."""
    m_rows, n_kv, hd_k, hd_v = q.shape[0], k_cache.shape[0], k_cache.shape[1], v_cache.shape[2]
    n_head = q.shape[1] // hd_k
    group = n_head // n_kv
    n_blocks = (m_rows + QUERY_BLOCK - 1) // QUERY_BLOCK
    n_slots = scores.shape[0]
    span = min(n, pos0 + m_rows - t0) - (max(0, pos0 - window + 1 - t0) if window > 0 else 0)
    if HAS_ZMM and scores.shape[1] > QUERY_BLOCK and span > LONG_SPAN and hd_v % 32 == 0:
        _attend_rows_tiled(q, k_cache, v_cache, pos0, t0, n, window, softcap, scores, out, slot0, slot1)
        return
    for slot in range(slot0, slot1):
        sc = scores[slot]
        for item in range(slot, n_head * n_blocks, n_slots):
            h, g = item // n_blocks, item // n_blocks // group
            m0, nr, lo, hi = _block_span(item % n_blocks, m_rows, pos0, t0, n, window)
            # missing rows repeat the last one
            r1, r2, r3 = m0 + min(1, nr - 1), m0 + min(2, nr - 1), m0 + min(3, nr - 1)
            if HAS_ZMM:
                _scores_block_z(q, m0, r1, r2, r3, h * hd_k, k_cache[g], t0, lo, hi, sc, 0)
            else:
                _scores_block(q, m0, r1, r2, r3, h * hd_k, k_cache[g], t0, lo, hi, sc)
            _block_probabilities(sc, nr, lo, hi, pos0 + m0 - t0, n, window, softcap, v_cache)
            if HAS_ZMM:
                _values_block_z(sc, lo, hi, v_cache[g], t0, out, m0, nr, h * hd_v, False)
            else:
                _values_block(sc, lo, hi, v_cache[g], t0, out, m0, nr, h * hd_v, np.int64(0))


@launcher(_attend_rows_slots, ATT_PARALLEL)
def attend_rows(q, k_cache, v_cache, pos0, t0, n, window, softcap, scores, out):
    """Causal attention of M queries (positions pos0..pos0+M-1) over cached keys t0..t0+n-1 (prefill).

    q [M, n_head*hd_k] (scaled); k_cache [n_kv, hd_k, n_ctx + KV_PAD], v_cache [n_kv, n_ctx, hd_v]; softcap as
    in attend_one (applied to the scores a query can see, so the masked ones never reach tanh); scores:
    float32 scratch [n_slots, QUERY_BLOCK x k, >= n + KV_PAD], one slot per concurrent task (with k > 1, spans of
    more than LONG_SPAN positions take k blocks of queries a work item: _attend_rows_tiled); out [M, n_head*hd_v].
    A query at position p sees keys at p - window < key <= p (window 0: all keys <= p).
    Work items are (head, block of 4 queries), dealt round-robin to the slots so causal rows balance out. Each
    query gets what attend_one computes for it, bit for bit: its scores over the block's columns are the same
    lane-wise FMA chains, columns it cannot see get probability 0, and adding 0 * v leaves a sum unchanged.
    """
    run_items(
        "_attend_rows_slots", (q, k_cache, v_cache, pos0, t0, n, window, softcap, scores, out), scores.shape[0], 1
    )


# ---- q8_0 KV cache ----------------------------------------------------------------------------------------------
# llama.cpp's `-ctk q8_0 -ctv q8_0`: every K and V row (one head of one position) stored as Q8_0 blocks of 32
# values, int8 codes and an f16 scale, quantized when stored (ggml_set_rows -> the CPU's quantize_row_q8_0). A
# quantized V cache needs flash attention there (src/llama-context.cpp), whose CPU kernel
# (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16_one_chunk) converts each query head to the K type's
# vec_dot_type (Q8_0 again), takes K.Q with ggml_vec_dot_q8_0_q8_0 (per block: the integer dot times the product
# of the two scales), scales the score, and adds dequantized V rows (code * scale) weighted by unrounded
# probabilities. Here the softmax is the two-pass one of the f16 path instead of the online one (the same
# probabilities to a few ulp). Before quantizing, this llama.cpp rotates Q and K (and V, rotating the attention
# output back) by an orthonormal Walsh-Hadamard matrix per chunk of 64+ values of a head when the head dimension is a
# multiple of 64 (src/llama-kv-cache.cpp attn_rot_k / attn_rot_v, src/llama-graph.cpp build_attn; the CPU runs it as
# a fast transform, ggml_compute_forward_fwht): K.Q is unchanged in exact arithmetic, and outliers spread over the
# block quantize with less error. Layout: position-major rows as in llama.cpp, codes int8 [n_kv, n_ctx, hd] and
# scales uint16 (f16 bits) [n_kv, n_ctx, hd / 32]. Decode and prefill run one per-(head, query) function over the
# same key range, so a query's output is the same bits either way (batch invariance).

QK8_0 = 32  # values per Q8_0 block


# Not inlined, no fast-math: `amax / 127` must stay a division (arcp would turn it into a product) for d's bits.
@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _quantize_q8_0(x, qs, d):
    """x float32 [n] (n a multiple of 32) -> qs int8 [n], d uint16 [n / 32] (f16 bits), as the AVX2
    quantize_row_q8_0 (ggml-cpu/arch/x86/quants.c): d = amax / 127, codes rint(x * (127 / amax))."""
    for b in range(x.shape[0] // QK8_0):
        amax = np.float32(0.0)
        for i in range(b * QK8_0, (b + 1) * QK8_0):
            amax = max(amax, abs(x[i]))
        d[b] = _f32_to_f16(amax / np.float32(127.0))
        inv = np.float32(127.0) / amax if amax != 0.0 else np.float32(0.0)
        for i in range(b * QK8_0, (b + 1) * QK8_0):
            qs[i] = np.int8(np.rint(x[i] * inv))


@intrinsic
def _fwht16(typingctx, v):
    """The butterflies of spans 1, 2, 4 and 8 within one 16-lane vector, in that order: lane j with bit `span`
    clear becomes u + v, its partner j + span u - v (u = lane j, v = lane j + span), as _fwht's scalar steps."""
    if v != F32x16:
        return None

    def codegen(context, builder, sig, args):
        r, i32 = args[0], ir.IntType(32)
        for span in (1, 2, 4, 8):
            p = builder.shuffle_vector(r, r, ir.Constant(ir.VectorType(i32, 16), [j ^ span for j in range(16)]))
            low = ir.Constant(ir.VectorType(ir.IntType(1), 16), [not j & span for j in range(16)])
            r = builder.select(low, builder.fadd(r, p), builder.fsub(p, r))
        return r

    return F32x16(F32x16), codegen


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _fwht(x, n):
    """x (contiguous, a multiple of n long) = H_n x per chunk of n values: the orthonormal Walsh-Hadamard rotation
    as ggml's CPU ggml_compute_forward_fwht computes it (scale by 1 / sqrtf(n) first, then butterflies u + v,
    u - v of growing span). No fast-math: the rounding of every step is part of the result.

    n a multiple of 16 (the rotations are 64 or more): 16-lane vectors, each value taking the scalar steps' operations
    in their order: the spans below 16 pair values of one vector (_fwht16), the others whole vectors; a span's
    butterflies are independent of each other, and those below 16 never reach past a vector, so a vector can take
    them all before the next one. The same bits as the scalar steps below, 6-8x as fast: fwht_rows of 16 rows, n 64 x
    576 values 38.9 -> 6.3 us, 128 x 1,536 113.6 -> 14.8 us, 256 x 1,024 101.8 -> 12.7 us (Ice Lake VM, in turns)."""
    scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(n)))
    if n % 16 == 0:
        s16 = _fbcast16(scale)
        for c in range(0, x.shape[0], n):
            for j in range(c, c + n, 16):
                _st_f32x16(x, j, _fwht16(_fmul16(_ld_f32x16(x, j), s16)))
            span = 16
            while span < n:
                for i in range(c, c + n, 2 * span):
                    for j in range(i, i + span, 16):
                        u, v = _ld_f32x16(x, j), _ld_f32x16(x, j + span)
                        _st_f32x16(x, j, _fadd16(u, v))
                        _st_f32x16(x, j + span, _fsub16(u, v))
                span *= 2
        return
    for c in range(0, x.shape[0], n):
        for j in range(c, c + n):
            x[j] = x[j] * scale
        span = 1
        while span < n:
            for i in range(c, c + n, 2 * span):
                for j in range(i, i + span):
                    u, v = x[j], x[j + span]
                    x[j] = u + v
                    x[j + span] = u - v
            span *= 2


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def fwht_rows(x, n):
    """Every row of x [M, k] (k a multiple of n) rotated by H_n per chunk of n (_fwht): undoes the V rotation on
    attention outputs (H_n is its own inverse)."""
    for m in range(x.shape[0]):
        _fwht(x[m], n)


@numba.njit(inline="always", **JIT)
def _qkv_rope_store_q8_0_row(q, k, v, m, p, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, rot_k, rot_v,
                             qq, qd, k_qs, k_d, v_qs, v_d):  # fmt: skip
    """qkv_rope_store_q8_0's work for row m at position p: its quantized Q into qq [n_head*hd_k] / qd, its K and V
    into row p of k_qs [n_kv, n_ctx, hd_k] / k_d and v_qs / v_d."""
    n_kv, hd_k, hd_v = k_qs.shape[0], k_qs.shape[2], v_qs.shape[2]
    n_head = q.shape[1] // hd_k
    nb_k = hd_k // QK8_0
    _add_biases(q[m], k[m], v[m], q_bias, k_bias, v_bias)
    for h in range(n_head):
        x = q[m, h * hd_k : (h + 1) * hd_k]
        _norm_rope(x, q_norm, eps, cos, sin, p, neox)
        if rot_k:
            _fwht(x, rot_k)
        _quantize_q8_0(x, qq[h * hd_k : (h + 1) * hd_k], qd[h * nb_k : (h + 1) * nb_k])
    for g in range(n_kv):
        x = k[m, g * hd_k : (g + 1) * hd_k]
        _norm_rope(x, k_norm, eps, cos, sin, p, neox)
        if rot_k:
            _fwht(x, rot_k)
        _quantize_q8_0(x, k_qs[g, p], k_d[g, p])
        x = v[m, g * hd_v : (g + 1) * hd_v]
        if rot_v:
            _fwht(x, rot_v)
        _quantize_q8_0(x, v_qs[g, p], v_d[g, p])


@numba.njit(**JIT)
def qkv_rope_store_q8_0(
    q,
    k,
    v,
    q_bias,
    k_bias,
    v_bias,
    q_norm,
    k_norm,
    eps,
    cos,
    sin,
    neox,
    pos0,
    rot_k,
    rot_v,
    q_qs,
    q_d,
    k_qs,
    k_d,
    v_qs,
    v_d,
):
    """qkv_rope_store for a q8_0 cache: Q/K/V of M new tokens at positions pos0.. finished (bias, per-head norm,
    rope; Q is not scaled: attend_*_q8_0 scale the scores, as llama.cpp does), Q quantized per head into
    q_qs int8 [M, n_head*hd_k] / q_d uint16 [M, n_head*hd_k/32], K and V appended as Q8_0 rows to
    k_qs [n_kv, n_ctx, hd_k] / k_d [n_kv, n_ctx, hd_k/32] and v_qs [n_kv, n_ctx, hd_v] / v_d [n_kv, n_ctx, hd_v/32].
    rot_k, rot_v: 0, or the Walsh-Hadamard size that Q and K (rot_k) and V (rot_v) are rotated by before they are
    quantized, per chunk of that many values of a head (llama.cpp's attn_rot_k / attn_rot_v); the attention output
    is rotated back by the caller (fwht_rows)."""
    for m in range(q.shape[0]):
        _qkv_rope_store_q8_0_row(q, k, v, m, pos0 + m, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox,
                                 rot_k, rot_v, q_qs[m], q_d[m], k_qs, k_d, v_qs, v_d)  # fmt: skip


@numba.njit(**JIT)
def _qkv_rope_store_group_q8_0_part(q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, rot_k, rot_v,
                                    q_qs, q_d, rows, slots, positions, kq_group, kd_group, vq_group, vd_group, i0,
                                    i1):  # fmt: skip
    for i in range(i0, i1):
        m, sl = rows[i], slots[i]
        _qkv_rope_store_q8_0_row(q, k, v, m, positions[i], q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox,
                                 rot_k, rot_v, q_qs[m], q_d[m], kq_group[sl], kd_group[sl], vq_group[sl],
                                 vd_group[sl])  # fmt: skip


@launcher(_qkv_rope_store_group_q8_0_part, JIT_PARALLEL)
def qkv_rope_store_group_q8_0(q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, rot_k, rot_v, q_qs,
                              q_d, rows, slots, positions, kq_group, kd_group, vq_group, vd_group):  # fmt: skip
    """qkv_rope_store_q8_0 for one token of each of several sequences whose q8_0 caches are slots of one group (the
    decode rows of a batch, as qkv_rope_store_group): row rows[i] at position positions[i] of slot slots[i] of
    kq_group [n_slots, n_kv, n_ctx, hd_k] / kd_group and vq_group / vd_group, its quantized Q into row rows[i] of
    q_qs / q_d. One call per layer instead of one per sequence, the rows shared among the threads; each row gets
    qkv_rope_store_q8_0's operations, so the same bits."""
    run_items("_qkv_rope_store_group_q8_0_part", (q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox,
                                                  rot_k, rot_v, q_qs, q_d, rows, slots, positions, kq_group, kd_group,
                                                  vq_group, vd_group), rows.shape[0], GROUP_STORE_ROWS)  # fmt: skip


def _splat_i32(builder, x):
    """A 32-bit integer in all 16 lanes."""
    v16i32 = ir.VectorType(ir.IntType(32), 16)
    v = builder.insert_element(ir.Constant(v16i32, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(v16i32, [0] * 16))


@intrinsic
def _quads_u8x16(typingctx, a, i, stride, count):
    """16 lanes of 4 codes of int8 array a (flat, C-contiguous): lane l < count the 4 bytes at a[i + l * stride ..],
    each + 128 (so unsigned, vpdpbusd's first operand; exact), by one masked hardware gather: lane l is position l's
    quad of a q8_0 key block. Lanes from count on are never read (their value is 128 per byte)."""
    if not _c_array(a, types.int8):
        return None

    def codegen(context, builder, sig, args):
        i32, i8p, v16i32 = ir.IntType(32), ir.IntType(8).as_pointer(), ir.VectorType(ir.IntType(32), 16)
        base = builder.bitcast(_elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1]), i8p)
        stride, count = (builder.trunc(context.cast(builder, args[k], sig.args[k], types.intp), i32) for k in (2, 3))
        lanes = ir.Constant(v16i32, list(range(16)))
        mask = builder.icmp_signed("<", lanes, _splat_i32(builder, count))
        mask_t = ir.VectorType(ir.IntType(1), 16)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16i32, [v16i32, i8p, v16i32, mask_t, i32]),
                                            "llvm.x86.avx512.mask.gather.dpi.512")  # fmt: skip
        index = builder.mul(lanes, _splat_i32(builder, stride))
        v = builder.call(fn, [ir.Constant(v16i32, [0] * 16), base, index, mask, ir.Constant(i32, 1)])
        return builder.xor(v, ir.Constant(v16i32, [-0x7F7F7F80] * 16))  # 0x80808080: each byte + 128

    return I32x16(a, i, stride, count), codegen


@intrinsic
def _dpbusd16(typingctx, acc, u, q, j):
    """acc + vpdpbusd(u, the 4 int8 at q[j..j+3] in every lane): per lane the 4 products of u's unsigned bytes and
    the quad's signed ones, summed into acc (exact int32)."""
    if acc != I32x16 or u != I32x16 or not _c_array(q, types.int8):
        return None

    def codegen(context, builder, sig, args):
        i32, v16i32 = ir.IntType(32), ir.VectorType(ir.IntType(32), 16)
        ptr = builder.bitcast(_elem_ptr(context, builder, sig.args[2], args[2], args[3], sig.args[3]), i32.as_pointer())
        quad = _splat_i32(builder, builder.load(ptr, align=1))
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16i32, [v16i32] * 3),
                                            "llvm.x86.avx512.vpdpbusd.512")  # fmt: skip
        return builder.call(fn, [args[0], args[1], quad])

    return I32x16(I32x16, I32x16, q, j), codegen


@intrinsic
def _izero16(typingctx):
    return I32x16(), lambda context, builder, sig, args: ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16)


@intrinsic
def _i32_minus_f32x16(typingctx, v, c):
    """float32(v - c) lane by lane (v - c exact in int32; the conversion is exact below 2^24)."""
    if v != I32x16 or not isinstance(c, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        c = builder.trunc(context.cast(builder, args[1], sig.args[1], types.int64), ir.IntType(32))
        return builder.sitofp(builder.sub(args[0], _splat_i32(builder, c)), _v16f32)

    return F32x16(I32x16, c), codegen


@intrinsic
def _sum32_i8(typingctx, a, i):
    """The sum of int8 a[i:i+32] (flat index into a C-contiguous array) as int32 (exact)."""
    if not _c_array(a, types.int8):
        return None

    def codegen(context, builder, sig, args):
        v32i8, v32i32 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(32), 32)
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        ptr = builder.bitcast(ptr, v32i8.as_pointer())
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [v32i32]),
                                            "llvm.vector.reduce.add.v32i32")  # fmt: skip
        return builder.call(fn, [builder.sext(builder.load(ptr, align=1), v32i32)])

    return types.int32(a, i), codegen


@intrinsic
def _halves_f32x16(typingctx, a, i, stride, count):
    """16 IEEE halves of uint16 array a (flat, C-contiguous) as float32 (exact): lane l the one at a[i + l * stride],
    lanes from count on repeating lane count - 1's (16 scalar loads: the scales of 16 positions' key blocks)."""
    if not _c_array(a, types.uint16):
        return None

    def codegen(context, builder, sig, args):
        i64, i16 = ir.IntType(64), ir.IntType(16)
        base = _elem_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        stride, count = (context.cast(builder, args[k], sig.args[k], types.intp) for k in (2, 3))
        v = ir.Constant(ir.VectorType(i16, 16), ir.Undefined)
        last = builder.sub(count, ir.Constant(i64, 1))
        for lane in range(16):
            k = ir.Constant(i64, lane)
            at = builder.mul(stride, builder.select(builder.icmp_signed("<", k, count), k, last))
            x = builder.load(builder.gep(base, [at], inbounds=True))
            v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), lane))
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 16)), _v16f32)

    return F32x16(a, i, stride, count), codegen


@intrinsic
def _dot32_i8(typingctx, a, i, b, j):
    """The integer dot of int8 a[i:i+32] and b[j:j+32] (flat indices into C-contiguous arrays) as int32: exact,
    whatever order the vector code adds the products in (ggml_vec_dot_q8_0_q8_0's per-block sum)."""
    if not (_c_array(a, types.int8) and _c_array(b, types.int8)):
        return None

    def codegen(context, builder, sig, args):
        v32i8, v32i32 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(32), 32)
        x, y = (builder.sext(builder.load(builder.bitcast(_elem_ptr(context, builder, sig.args[k], args[k], args[k + 1],
                                                                    sig.args[k + 1]), v32i8.as_pointer()), align=1),
                             v32i32) for k in (0, 2))  # fmt: skip
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), [v32i32]),
                                            "llvm.vector.reduce.add.v32i32")  # fmt: skip
        return builder.call(fn, [builder.mul(x, y)])

    return types.int32(a, i, b, j), codegen


@numba.njit(inline="always", **ATT)
def _attend_head_q8_0(qq, qd, k_qs, k_d, v_qs, v_d, t0, n, scale, softcap, s, out):
    """One query head over positions t0..t0+n-1 of one K/V head of a q8_0 cache: out [hd_v] = softmax(scale *
    K.Q) . V. qq int8 [hd_k] / qd uint16 [hd_k/32]: the quantized query; s: float32 scratch [>= n]. A position at a
    time: _attend_q8_0_rows's code where the CPU has no AVX-512 VNNI (its gathers and vpdpbusd), the same bits.

    A score is its blocks' exact integer dots (_dot32_i8, vector code) folded by one scalar FMA a block, in block
    order; the output takes 32 dimensions (one V block) at a time in 16-lane vectors, each lane the FMA chain over
    the positions, in position order, that one dimension took as scalar code: float(code) * scale rounded, then
    fma(p, that, acc)."""
    hd_k, hd_v = k_qs.shape[1], v_qs.shape[1]
    nb_k = hd_k // QK8_0
    for t in range(n):
        row = (t0 + t) * hd_k
        acc = np.float32(0.0)
        for b in range(nb_k):
            dot = _dot32_i8(k_qs, row + b * QK8_0, qq, b * QK8_0)
            acc = _fma(np.float32(dot), _f16_to_f32(k_d[t0 + t, b]) * _f16_to_f32(qd[b]), acc)
        s[t] = acc * scale
    p = s[:n]
    if softcap != 0.0:
        _softcap_scores(p, softcap)
    inv = _softmax_inplace(p)
    for b in range(hd_v // QK8_0):
        a0, a1 = _fzero16(), _fzero16()
        for t in range(n):
            pt = _fbcast16(p[t] * inv)
            d = _fbcast16(_f16_to_f32(v_d[t0 + t, b]))
            o = (t0 + t) * hd_v + b * QK8_0
            a0 = _fma_v16(a0, pt, _fmul16(_ld_i8f32x16(v_qs, o), d))
            a1 = _fma_v16(a1, pt, _fmul16(_ld_i8f32x16(v_qs, o + 16), d))
        _st_f32x16(out, b * QK8_0, a0)
        _st_f32x16(out, b * QK8_0 + 16, a1)


@numba.njit(inline="always", **ATT)
def _block_dot16(u0, u1, u2, u3, u4, u5, u6, u7, q, j, c):
    """16 positions' integer dots with one 32-value query block q[j:j+32] (int8): from their quads + 128 (u0..u7,
    _quads_u8x16), 8 vpdpbusd, then c = 128 x the block's sum taken off (_i32_minus_f32x16): exact, so each lane
    holds ggml_vec_dot_q8_0_q8_0's integer sum for its position, as float32."""
    acc = _dpbusd16(_izero16(), u0, q, j)
    acc = _dpbusd16(acc, u1, q, j + 4)
    acc = _dpbusd16(acc, u2, q, j + 8)
    acc = _dpbusd16(acc, u3, q, j + 12)
    acc = _dpbusd16(acc, u4, q, j + 16)
    acc = _dpbusd16(acc, u5, q, j + 20)
    acc = _dpbusd16(acc, u6, q, j + 24)
    acc = _dpbusd16(acc, u7, q, j + 28)
    return _i32_minus_f32x16(acc, c)


@numba.njit(inline="always", **ATT)
def _fold_block16(acc, u0, u1, u2, u3, u4, u5, u6, u7, q, j, c, kd, qd):
    """acc + 16 positions' integer dots with query block q[j:j+32] (_block_dot16, c its 128 x sum) times the key
    blocks' scales kd and the query block's (qd, an IEEE half): one FMA a lane, ggml_vec_dot_q8_0_q8_0's step."""
    d = _block_dot16(u0, u1, u2, u3, u4, u5, u6, u7, q, j, c)
    return _fma_v16(acc, d, _fmul16(kd, _fbcast16(_f16_to_f32(qd))))


@numba.njit(inline="always", **ATT)
def _attend_q8_0_rows(qq2, qd2, rows, nr, los, ends, k_qs, k_d, v_qs, v_d, scale, softcap, sc, s0, out2):
    """nr <= QUERY_BLOCK quantized queries on one K/V head of a q8_0 cache (k_qs int8 [n_ctx, hd_k], k_d uint16
    [n_ctx, hd_k/32], v_qs / v_d alike): query r is row rows[r] of qq2 int8 [R, hd_k] / qd2 uint16 [R, hd_k/32] (a
    token's heads that share the K/V head, or a prompt's tokens for one head), over positions los[r]..ends[r]-1; row
    rows[r] of out2 [R, hd_v] = softmax(scale * K.Q) . V. Scratch rows s0..s0+nr-1 of sc (float32, >= the span from
    the first position to the last + 16).

    A score is its blocks' exact integer dots folded by one FMA a block, in block order, then times scale
    (ggml_vec_dot_q8_0_q8_0's sums): 16 positions at a time, a lane each (_block_dot16 on each block's quads,
    gathered once for the nr queries: _scores_q8_0_gathered). The output takes 32 dimensions (one V block) at a time
    in 16-lane vectors, each lane the FMA chain over the query's positions, in position order, of float(code) * scale
    rounded, each V block loaded and scaled once for the nr queries (_softmax_values_q8_0). That is on AVX-512 VNNI
    (HAS_ZMM); elsewhere _attend_head_q8_0 takes a query at a time. Each query gets the bits it gets alone, and the
    bits of _attend_head_q8_0 (a score a position: each block's integer dot reduced across a vector), which on Ice
    Lake took 1.6-2.4x the time in attend_group_q8_0 (16 sequences, every layer's cache out of cache: SmolLM2 at 64 /
    300 / 2,000 positions 7.33 / 19.86 / 79.06 -> 3.74 / 11.90 / 49.55 ms a step, Gemma3 6.83 / 16.13 / 88.04 ->
    2.81 / 9.51 / 49.42) and 1.12-1.30x in attend_one_q8_0 (a VM, 2 threads, the two in turns, equal outputs
    asserted). Prompts take _attend_q8_0_tiles instead: the same steps on keys laid out by _key_tiles_q8_0."""
    if not HAS_ZMM:  # a query at a time, a position at a time: the same bits
        for r in range(nr):
            i = rows[r]
            _attend_head_q8_0(qq2[i], qd2[i], k_qs, k_d, v_qs, v_d, los[r], ends[r] - los[r], scale, softcap,
                              sc[s0 + r], out2[i])  # fmt: skip
        return
    t0, n = _q8_0_span(nr, los, ends)
    _scores_q8_0_gathered(qq2, qd2, rows, nr, t0, n, k_qs, k_d, scale, sc, s0)
    _softmax_values_q8_0(rows, nr, los, ends, t0, n, v_qs, v_d, softcap, sc, s0, out2)


@numba.njit(inline="always", **ATT)
def _attend_q8_0_tiles(qq2, qd2, rows, nr, los, ends, kt, kdt, v_qs, v_d, scale, softcap, sc, s0, out2):
    """_attend_q8_0_rows (HAS_ZMM) with the keys read from kt / kdt, one K/V head's keys as _key_tiles_q8_0 lays them
    out (_scores_q8_0_tiles): the same bits."""
    t0, n = _q8_0_span(nr, los, ends)
    _scores_q8_0_tiles(qq2, qd2, rows, nr, t0, n, kt, kdt, scale, sc, s0)
    _softmax_values_q8_0(rows, nr, los, ends, t0, n, v_qs, v_d, softcap, sc, s0, out2)


@numba.njit(inline="always", **ATT)
def _q8_0_span(nr, los, ends):
    """(first position, number of positions) of the span that the nr queries' spans los[r]..ends[r]-1 cover."""
    t0, t1 = los[0], ends[0]
    for r in range(1, nr):
        t0, t1 = min(t0, los[r]), max(t1, ends[r])
    return t0, t1 - t0


@numba.njit(inline="always", **ATT)
def _scores_q8_0_gathered(qq2, qd2, rows, nr, t0, n, k_qs, k_d, scale, sc, s0):
    """Row s0 + r of sc, positions 0..n-1 (t0..t0+n-1 of the cache) = query rows[r]'s scores: each tile's key block
    quads gathered once for the nr queries (_quads_u8x16, a masked vpgatherdd a quad column)."""
    hd_k = k_qs.shape[1]
    nb = hd_k // QK8_0
    kf, kdf, qf = k_qs.reshape(-1), k_d.reshape(-1), qq2.reshape(-1)
    q0, q1, q2, q3 = rows[0], rows[min(1, nr - 1)], rows[min(2, nr - 1)], rows[min(3, nr - 1)]
    for t in range(0, n, 16):
        count = min(16, n - t)
        a0, a1, a2, a3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        for b in range(nb):
            kd = _halves_f32x16(kdf, (t0 + t) * nb + b, nb, count)
            at = (t0 + t) * hd_k + b * QK8_0
            u0, u1 = _quads_u8x16(kf, at, hd_k, count), _quads_u8x16(kf, at + 4, hd_k, count)
            u2, u3 = _quads_u8x16(kf, at + 8, hd_k, count), _quads_u8x16(kf, at + 12, hd_k, count)
            u4, u5 = _quads_u8x16(kf, at + 16, hd_k, count), _quads_u8x16(kf, at + 20, hd_k, count)
            u6, u7 = _quads_u8x16(kf, at + 24, hd_k, count), _quads_u8x16(kf, at + 28, hd_k, count)
            j = q0 * hd_k + b * QK8_0
            a0 = _fold_block16(a0, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, 128 * _sum32_i8(qf, j), kd, qd2[q0, b])
            if nr > 1:
                j = q1 * hd_k + b * QK8_0
                a1 = _fold_block16(a1, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, 128 * _sum32_i8(qf, j), kd, qd2[q1, b])
            if nr > 2:
                j = q2 * hd_k + b * QK8_0
                a2 = _fold_block16(a2, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, 128 * _sum32_i8(qf, j), kd, qd2[q2, b])
            if nr > 3:
                j = q3 * hd_k + b * QK8_0
                a3 = _fold_block16(a3, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, 128 * _sum32_i8(qf, j), kd, qd2[q3, b])
        _store_scores16(sc, s0, nr, t, scale, a0, a1, a2, a3)


@numba.njit(inline="always", **ATT)
def _scores_q8_0_tiles(qq2, qd2, rows, nr, t0, n, kt, kdt, scale, sc, s0):
    """_scores_q8_0_gathered's scores, the same bits, from keys laid out by _key_tiles_q8_0 (_scores_q8_0_range):
    each query block's 128 x sum (_block_dot16's c) is taken once (_query_sums_q8_0), not once a tile."""
    hd_k = qq2.shape[1]
    qf = qq2.reshape(-1)
    _query_sums_q8_0(qf, rows, nr, hd_k, kt, 0)
    _scores_q8_0_range(qf, qd2, rows, nr, t0, t0 + n, t0, kt, kdt, 0, scale, sc, s0)


@numba.njit(inline="always", **ATT)
def _query_sums_q8_0(qf, rows, nr, hd_k, kt, at):
    """The 128 x sums (_block_dot16's c) of the blocks of queries rows[0..3] (the rows past nr repeating the last;
    qf: the queries' codes, rows of hd_k) into row hd_k/4 of kt, columns at + r * nb + b."""
    nb, nq = hd_k // QK8_0, hd_k // 4
    for r in range(QUERY_BLOCK):
        i = rows[min(r, nr - 1)]
        for b in range(nb):
            kt[nq, at + r * nb + b] = 128 * _sum32_i8(qf, i * hd_k + b * QK8_0)


@numba.njit(inline="always", **ATT)
def _scores_q8_0_range(qf, qd2, rows, nr, ta, tb, col0, kt, kdt, sums, scale, sc, s0):
    """Row s0 + r of sc, columns position - col0 = query rows[r]'s scores at positions ta..tb-1 (16 a step from ta:
    a last step's lanes past tb get the scores of the positions after, or of the padding), from keys laid out by
    _key_tiles_q8_0: a tile's quad column is one 64-byte load, its scales one load of 16 halves. The queries' block
    sums come from kt[hd_k/4, sums + r * nb + b] (_query_sums_q8_0). A score's chain is over its blocks alone, so
    any range of positions gives each score the same bits."""
    hd_k = qd2.shape[1] * QK8_0
    nb, nq, S = hd_k // QK8_0, hd_k // 4, kt.shape[1]
    q0, q1, q2, q3 = rows[0], rows[min(1, nr - 1)], rows[min(2, nr - 1)], rows[min(3, nr - 1)]
    c0, c1, c2, c3 = sums, sums + nb, sums + 2 * nb, sums + 3 * nb
    for t in range(ta, tb, 16):
        a0, a1, a2, a3 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        for b in range(nb):
            kd = _ld_f32x16(kdt, b * kdt.shape[1] + t)
            at = 8 * b * S + t
            u0, u1 = _ld_i32x16(kt, at), _ld_i32x16(kt, at + S)
            u2, u3 = _ld_i32x16(kt, at + 2 * S), _ld_i32x16(kt, at + 3 * S)
            u4, u5 = _ld_i32x16(kt, at + 4 * S), _ld_i32x16(kt, at + 5 * S)
            u6, u7 = _ld_i32x16(kt, at + 6 * S), _ld_i32x16(kt, at + 7 * S)
            j = q0 * hd_k + b * QK8_0
            a0 = _fold_block16(a0, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, kt[nq, c0 + b], kd, qd2[q0, b])
            if nr > 1:
                j = q1 * hd_k + b * QK8_0
                a1 = _fold_block16(a1, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, kt[nq, c1 + b], kd, qd2[q1, b])
            if nr > 2:
                j = q2 * hd_k + b * QK8_0
                a2 = _fold_block16(a2, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, kt[nq, c2 + b], kd, qd2[q2, b])
            if nr > 3:
                j = q3 * hd_k + b * QK8_0
                a3 = _fold_block16(a3, u0, u1, u2, u3, u4, u5, u6, u7, qf, j, kt[nq, c3 + b], kd, qd2[q3, b])
        _store_scores16(sc, s0, nr, t - col0, scale, a0, a1, a2, a3)


@numba.njit(inline="always", **ATT)
def _store_scores16(sc, s0, nr, t, scale, a0, a1, a2, a3):
    """Positions t..t+15 of the nr rows s0.. of sc = the tiles' sums a0..a3 times scale."""
    f = _fbcast16(scale)
    _st_f32x16(sc[s0], t, _fmul16(a0, f))
    if nr > 1:
        _st_f32x16(sc[s0 + 1], t, _fmul16(a1, f))
    if nr > 2:
        _st_f32x16(sc[s0 + 2], t, _fmul16(a2, f))
    if nr > 3:
        _st_f32x16(sc[s0 + 3], t, _fmul16(a3, f))


@numba.njit(inline="always", **ATT)
def _key_tiles_q8_0(k_qs, k_d, t0, t1, kt, kdt):
    """Positions t0..t1-1 of one K/V head of a q8_0 cache (k_qs int8 [n_ctx, hd_k], k_d uint16 [n_ctx, hd_k/32]) laid
    out for _scores_q8_0_tiles, in the columns of their positions: kt int32 [>= hd_k/4 + 1, >= t1 + 16], kt[j, t] =
    quad j of position t's codes (4 int8 as one int32) with each byte + 128 (vpdpbusd's unsigned operand, as
    _quads_u8x16 gathers them); kdt uint16 [>= hd_k/32, >= t1 + 16], kdt[b, t] = position t's scale of block b.
    Positions t1..t1+15 (the lanes a last tile reads past the span) get codes 0 and scale 0; columns before t0 are left
    as they are. A prompt's attention reads each key once for every 4 queries: laid out once a call and K/V head, its
    tiles are loads instead of gathers (_attend_rows_q8_0_slots)."""
    nq, nb = k_qs.shape[1] // 4, k_qs.shape[1] // QK8_0
    k32 = k_qs.view(np.int32)
    plus128 = np.int32(-0x7F7F7F80)  # 0x80808080
    for t in range(t0, t1):
        for j in range(nq):
            kt[j, t] = k32[t, j] ^ plus128
        for b in range(nb):
            kdt[b, t] = k_d[t, b]
    for t in range(t1, t1 + 16):
        for j in range(nq):
            kt[j, t] = plus128
        for b in range(nb):
            kdt[b, t] = 0


@numba.njit(inline="always", **ATT)
def _softmax_values_q8_0(rows, nr, los, ends, t0, n, v_qs, v_d, softcap, sc, s0, out2):
    """The nr queries' scores in rows s0.. of sc (position t0 + t at column t) to probabilities over each query's
    own span, then row rows[r] of out2 = those probabilities . V (_attend_q8_0_rows)."""
    invs = _softmax_q8_0(nr, los, ends, t0, softcap, sc, s0)
    _values_q8_0_range(rows, nr, los, ends, t0, t0 + n, t0, v_qs, v_d, invs, sc, s0, out2, False)


@numba.njit(inline="always", **ATT)
def _softmax_q8_0(nr, los, ends, col0, softcap, sc, s0):
    """Each of the nr queries' scores (row s0 + r of sc, positions los[r]..ends[r]-1 at columns position - col0)
    soft-capped, then exponentiated in place (_softmax_inplace); returns the four 1 / sums (0 past nr)."""
    inv0 = inv1 = inv2 = inv3 = np.float32(0.0)
    for r in range(nr):
        p = sc[s0 + r, los[r] - col0 : ends[r] - col0]  # this query's positions
        if softcap != 0.0:
            _softcap_scores(p, softcap)
        inv = _softmax_inplace(p)
        if r == 0:
            inv0 = inv
        elif r == 1:
            inv1 = inv
        elif r == 2:
            inv2 = inv
        else:
            inv3 = inv
    return inv0, inv1, inv2, inv3


@numba.njit(inline="always", **ATT)
def _values_q8_0_range(rows, nr, los, ends, ta, tb, col0, v_qs, v_d, invs, sc, s0, out2, from_out):
    """Row rows[r] of out2 = the sum over the positions ta..tb-1 that query r sees (los[r] <= position < ends[r])
    of its probability (row s0 + r of sc at column position - col0, times invs[r]) times V's row there, from 0, or
    (from_out) going on from the sums in out2 (positions after ones summed before). 32 dimensions (one V block) at a
    time in 16-lane vectors, each lane the FMA chain over the positions in position order of float(code) * scale
    rounded, each V block loaded and scaled once for the nr queries; a range after a range gives the chain of both."""
    hd_v = v_qs.shape[1]
    q0, q1, q2, q3 = rows[0], rows[min(1, nr - 1)], rows[min(2, nr - 1)], rows[min(3, nr - 1)]
    inv0, inv1, inv2, inv3 = invs
    p0, p1, p2, p3 = sc[s0], sc[s0 + min(1, nr - 1)], sc[s0 + min(2, nr - 1)], sc[s0 + min(3, nr - 1)]
    lo0, lo1, lo2, lo3 = los[0], los[min(1, nr - 1)], los[min(2, nr - 1)], los[min(3, nr - 1)]
    e0, e1, e2, e3 = ends[0], ends[min(1, nr - 1)], ends[min(2, nr - 1)], ends[min(3, nr - 1)]
    for b in range(hd_v // QK8_0):
        o = b * QK8_0
        if from_out:  # rows past nr load a stored row again; their sums are never stored
            c0, c1 = _ld_f32x16(out2[q0], o), _ld_f32x16(out2[q0], o + 16)
            d0, d1 = _ld_f32x16(out2[q1], o), _ld_f32x16(out2[q1], o + 16)
            f0, f1 = _ld_f32x16(out2[q2], o), _ld_f32x16(out2[q2], o + 16)
            g0, g1 = _ld_f32x16(out2[q3], o), _ld_f32x16(out2[q3], o + 16)
        else:
            c0, c1, d0, d1 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
            f0, f1, g0, g1 = _fzero16(), _fzero16(), _fzero16(), _fzero16()
        for pos in range(ta, tb):
            t = pos - col0
            d = _fbcast16(_f16_to_f32(v_d[pos, b]))
            at = pos * hd_v + o
            x0, x1 = _fmul16(_ld_i8f32x16(v_qs, at), d), _fmul16(_ld_i8f32x16(v_qs, at + 16), d)
            if lo0 <= pos < e0:
                pt = _fbcast16(p0[t] * inv0)
                c0, c1 = _fma_v16(c0, pt, x0), _fma_v16(c1, pt, x1)
            if nr > 1 and lo1 <= pos < e1:
                pt = _fbcast16(p1[t] * inv1)
                d0, d1 = _fma_v16(d0, pt, x0), _fma_v16(d1, pt, x1)
            if nr > 2 and lo2 <= pos < e2:
                pt = _fbcast16(p2[t] * inv2)
                f0, f1 = _fma_v16(f0, pt, x0), _fma_v16(f1, pt, x1)
            if nr > 3 and lo3 <= pos < e3:
                pt = _fbcast16(p3[t] * inv3)
                g0, g1 = _fma_v16(g0, pt, x0), _fma_v16(g1, pt, x1)
        _st_f32x16(out2[q0], o, c0)
        _st_f32x16(out2[q0], o + 16, c1)
        if nr > 1:
            _st_f32x16(out2[q1], o, d0)
            _st_f32x16(out2[q1], o + 16, d1)
        if nr > 2:
            _st_f32x16(out2[q2], o, f0)
            _st_f32x16(out2[q2], o + 16, f1)
        if nr > 3:
            _st_f32x16(out2[q3], o, g0)
            _st_f32x16(out2[q3], o + 16, g1)


@numba.njit(inline="always", **ATT)
def _attend_heads_q8_0(qq2, qd2, h0, nr, k_qs, k_d, v_qs, v_d, t0, n, scale, softcap, sc, s0, out2):
    """Query heads h0..h0+nr-1 of one token (rows of qq2 [n_head, hd_k] / qd2, out2 [n_head, hd_v]) that share one
    K/V head, over positions t0..t0+n-1 (_attend_q8_0_rows)."""
    heads = (h0, h0 + min(1, nr - 1), h0 + min(2, nr - 1), h0 + min(3, nr - 1))
    span = (t0, t0, t0, t0)
    end = (t0 + n, t0 + n, t0 + n, t0 + n)
    _attend_q8_0_rows(qq2, qd2, heads, nr, span, end, k_qs, k_d, v_qs, v_d, scale, softcap, sc, s0, out2)


@numba.njit(**ATT)
def _attend_one_q8_0_heads(q_qs, q_d, k_qs, k_d, v_qs, v_d, t0, t1, scale, softcap, scores, out, h0, h1):
    """attend_one_q8_0's query heads h0..h1-1."""
    hd_k, hd_v = k_qs.shape[2], v_qs.shape[2]
    n_head = q_qs.shape[0] // hd_k
    group = n_head // k_qs.shape[0]
    qq2, qd2, out2 = q_qs.reshape(n_head, hd_k), q_d.reshape(n_head, hd_k // QK8_0), out.reshape(n_head, hd_v)
    for h in range(h0, h1):
        g = h // group
        _attend_heads_q8_0(qq2, qd2, h, 1, k_qs[g], k_d[g], v_qs[g], v_d[g], t0, t1 - t0, scale, softcap, scores, h,
                           out2)  # fmt: skip


@launcher(_attend_one_q8_0_heads, ATT_PARALLEL)
def attend_one_q8_0(q_qs, q_d, k_qs, k_d, v_qs, v_d, t0, t1, scale, softcap, scores, out):
    """attend_one on a q8_0 cache: one token's quantized query (q_qs int8 [n_head*hd_k], q_d uint16
    [n_head*hd_k/32]) over positions t0..t1-1, heads spread over threads; scale: the attention scale applied to
    every score; scores: float32 scratch [n_head, >= t1 - t0 + 16]; out [n_head*hd_v]."""
    run_items("_attend_one_q8_0_heads", (q_qs, q_d, k_qs, k_d, v_qs, v_d, t0, t1, scale, softcap, scores, out),
              q_qs.shape[0] // k_qs.shape[2], 1)  # fmt: skip


@numba.njit(**ATT)
def _attend_group_q8_0_tasks(q_qs, q_d, kq_group, kd_group, vq_group, vd_group, rows, slots, t0s, t1s, scale, softcap,
                             scores, out, task0, task1):  # fmt: skip
    """attend_group_q8_0's tasks task0..task1-1: task j takes work items j, j + n_tasks, ... (_heads_or_blocks: a
    sequence's block of up to QUERY_BLOCK query heads on one K/V head, or a query head), with scratch scores[j]."""
    hd_k, hd_v = kq_group.shape[3], vq_group.shape[3]
    n_kv = kq_group.shape[1]
    n_head = q_qs.shape[1] // hd_k
    group = n_head // n_kv
    grouped, per_seq = _heads_or_blocks(n_head, n_kv, rows.shape[0], scores.shape[0])
    nblk = (group + QUERY_BLOCK - 1) // QUERY_BLOCK
    n_items = rows.shape[0] * per_seq
    n_tasks = min(scores.shape[0], n_items)
    for task in range(task0, task1):
        for item in range(task, n_items, n_tasks):
            i, j = item // per_seq, item % per_seq
            if grouped:
                g, blk = j // nblk, j % nblk
                h0, nr = g * group + blk * QUERY_BLOCK, min(QUERY_BLOCK, group - blk * QUERY_BLOCK)
            else:
                g, h0, nr = j // group, j, 1
            m, sl = rows[i], slots[i]
            qq2, qd2 = q_qs[m].reshape(n_head, hd_k), q_d[m].reshape(n_head, hd_k // QK8_0)
            _attend_heads_q8_0(qq2, qd2, h0, nr, kq_group[sl, g], kd_group[sl, g], vq_group[sl, g], vd_group[sl, g],
                               t0s[i], t1s[i] - t0s[i], scale, softcap, scores[task], 0,
                               out[m].reshape(n_head, hd_v))  # fmt: skip


@launcher(_attend_group_q8_0_tasks, ATT_PARALLEL)
def attend_group_q8_0(q_qs, q_d, kq_group, kd_group, vq_group, vd_group, rows, slots, t0s, t1s, scale, softcap, scores,
                      out):  # fmt: skip
    """attend_one_q8_0 for several decoding sequences whose q8_0 caches are slots of one group, in one call (as
    attend_group for f16 / f32 caches): row rows[i] of q_qs / q_d (quantized queries) and of out attends positions
    t0s[i]..t1s[i]-1 of slot slots[i] of kq_group [n_slots, n_kv, n_ctx, hd_k] / kd_group and vq_group / vd_group.
    scores: float32 scratch [n_tasks, QUERY_BLOCK, >= n_ctx + 16]. Work items (_heads_or_blocks: a sequence's query
    heads on one K/V head in blocks, each key block gathered once for them, or one query head) are dealt round-robin
    to the tasks; every head gets attend_one_q8_0's bits (_attend_heads_q8_0; speed: _attend_q8_0_rows)."""
    n_head = q_qs.shape[1] // kq_group.shape[3]
    _, per_seq = _heads_or_blocks(n_head, kq_group.shape[1], rows.shape[0], scores.shape[0])
    run_items("_attend_group_q8_0_tasks", (q_qs, q_d, kq_group, kd_group, vq_group, vd_group, rows, slots, t0s, t1s,
                                           scale, softcap, scores, out), min(scores.shape[0], rows.shape[0] * per_seq),
              1)  # fmt: skip


FWHT_ROWS = 4  # rows per work item of fwht_rows_at


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False, _nrt=False)
def _fwht_rows_part(x, rows, n, i0, i1):
    for i in range(i0, i1):
        _fwht(x[rows[i]], n)


@launcher(_fwht_rows_part, JIT_PARALLEL)
def fwht_rows_at(x, rows, n):
    """fwht_rows for rows `rows` of x [M, k] (int64 indices: a group's decode rows, a prompt chunk's rows) in one
    call, the rows shared among the threads; each row the same bits."""
    run_items("_fwht_rows_part", (x, rows, n), rows.shape[0], FWHT_ROWS)


# A q8_0 prompt chunk's attention takes _attend_rows_q8_0_tiled where its span passes LONG_SPAN positions, the scratch
# has rows for several blocks of queries, and a position of a K/V head holds this many bytes of codes or more (K and V:
# heads of 256 dimensions). Ice Lake VM, 2 threads, 256 queries, every layer's cache in turn, the two paths in turns
# (medians of 3), one block a work item -> TILED_BLOCKS: Gemma3's heads (4 on 1, 256 dimensions, 18 layers) at 3,000 /
# 3,500 / 5,000 / 12,000 positions 1.13 / 1.16 / 1.37 / 1.24-1.43x faster; Qwen2.5-1.5B's (12 on 2, 128) at 3,500 /
# 6,500 / 12,000 1.01 / 1.00 / 1.06x; SmolLM2's (9 on 3, 64) at 3,500 / 5,000 / 12,000 / 16,000 0.96 / 0.89-0.94 /
# 0.85-0.99 / 0.88x, whose 132 bytes a position a block of queries reads from L2 or as fast from L3.
LONG_ROW_BYTES_Q8_0 = 512


@numba.njit(inline="always", **ATT)
def _query_block_q8_0(blk, h, n_head, pos0, m_rows, window):
    """Block blk of a prompt chunk's queries of head h (M = m_rows at positions pos0..; rows of m * n_head + h in
    the queries laid out [M * n_head, hd_k]): (its four rows, the rows past nr repeating the last; nr; each row's
    first position and end, a query at p seeing p - window < key <= p, window 0: every key <= p)."""
    m0 = blk * QUERY_BLOCK
    nr = min(QUERY_BLOCK, m_rows - m0)
    m1, m2, m3 = m0 + min(1, nr - 1), m0 + min(2, nr - 1), m0 + min(3, nr - 1)
    rows = (m0 * n_head + h, m1 * n_head + h, m2 * n_head + h, m3 * n_head + h)
    ends = (pos0 + m0 + 1, pos0 + m1 + 1, pos0 + m2 + 1, pos0 + m3 + 1)
    if window > 0:
        los = (max(0, ends[0] - window), max(0, ends[1] - window), max(0, ends[2] - window),
               max(0, ends[3] - window))  # fmt: skip
    else:
        los = (0, 0, 0, 0)
    return rows, nr, los, ends


@numba.njit(**ATT)
def _attend_rows_q8_0_tiled(qq2, qd2, n_head, k_qs, k_d, v_qs, v_d, pos0, m_rows, window, first_key, scale, softcap,
                            scores, key_tiles, key_scales, out2, slot0, slot1):  # fmt: skip
    """_attend_rows_q8_0_slots for long spans (AVX-512 VNNI), as _attend_rows_tiled for f16 / f32 caches: a work item
    is a head's scores.shape[1] / 4 blocks of 4 queries, which take their scores KEY_TILE positions at a time (each
    tile of laid-out keys read from memory once for all of them, then from L2), each query's probabilities scaled by
    its 1 / sum, then the values KEY_TILE positions at a time, the sums waiting in out2 between tiles. A score's
    chain is over its own blocks, a sum's over positions in order, tile after tile, and p * (1 / sum) is rounded once
    either way: each query gets the bits _attend_q8_0_tiles gives it. first_key: the first position the pass's
    queries see, from which the keys are laid out."""
    hd_k = k_qs.shape[2]
    nb = hd_k // QK8_0
    group = n_head // k_qs.shape[0]
    qf = qq2.reshape(-1)
    n_blocks = (m_rows + QUERY_BLOCK - 1) // QUERY_BLOCK
    n_slots, per_item = scores.shape[0], scores.shape[1] // QUERY_BLOCK
    n_items = (n_blocks + per_item - 1) // per_item
    ones = (np.float32(1.0), np.float32(1.0), np.float32(1.0), np.float32(1.0))
    for slot in range(slot0, slot1):
        kt, kdt, sc = key_tiles[slot], key_scales[slot], scores[slot]
        laid_out = -1  # the K/V head in kt / kdt
        for item in range(slot, n_head * n_items, n_slots):
            h, b0 = item // n_items, item % n_items * per_item
            b1 = min(n_blocks, b0 + per_item)
            g = h // group
            if g != laid_out:
                _key_tiles_q8_0(k_qs[g], k_d[g], first_key, pos0 + m_rows, kt, kdt)
                laid_out = g
            for blk in range(b0, b1):
                rows, nr, los, ends = _query_block_q8_0(blk, h, n_head, pos0, m_rows, window)
                _query_sums_q8_0(qf, rows, nr, hd_k, kt, (blk - b0) * QUERY_BLOCK * nb)
            first = _query_block_q8_0(b0, h, n_head, pos0, m_rows, window)[2][0]  # the item's blocks' first key
            _, nr_last, _, ends_last = _query_block_q8_0(b1 - 1, h, n_head, pos0, m_rows, window)
            last = ends_last[nr_last - 1]  # and their end
            for a in range(first, last, KEY_TILE):
                for blk in range(b0, b1):
                    rows, nr, los, ends = _query_block_q8_0(blk, h, n_head, pos0, m_rows, window)
                    lo, hi = max(los[0], a), min(ends[nr - 1], a + KEY_TILE)
                    if lo < hi:
                        s0 = (blk - b0) * QUERY_BLOCK
                        _scores_q8_0_range(qf, qd2, rows, nr, lo, hi, 0, kt, kdt, s0 * nb, scale, sc, s0)
            for blk in range(b0, b1):
                rows, nr, los, ends = _query_block_q8_0(blk, h, n_head, pos0, m_rows, window)
                s0 = (blk - b0) * QUERY_BLOCK
                invs = _softmax_q8_0(nr, los, ends, 0, softcap, sc, s0)
                for r in range(nr):
                    p, inv = sc[s0 + r], invs[r]
                    for t in range(los[r], ends[r]):
                        p[t] = p[t] * inv
            for a in range(first, last, KEY_TILE):
                for blk in range(b0, b1):
                    rows, nr, los, ends = _query_block_q8_0(blk, h, n_head, pos0, m_rows, window)
                    lo, hi = max(los[0], a), min(ends[nr - 1], a + KEY_TILE)
                    if lo < hi:
                        _values_q8_0_range(rows, nr, los, ends, lo, hi, 0, v_qs[g], v_d[g], ones, sc,
                                           (blk - b0) * QUERY_BLOCK, out2, lo > los[0])  # fmt: skip


@numba.njit(**ATT)
def _attend_rows_q8_0_slots(q_qs, q_d, k_qs, k_d, v_qs, v_d, pos0, window, scale, softcap, scores, key_tiles,
                            key_scales, out, slot0, slot1):  # fmt: skip
    """attend_rows_q8_0's slots slot0..slot1-1: a slot lays out the keys of each K/V head its items read once
    (_key_tiles_q8_0, into key_tiles[slot] / key_scales[slot]; its items run head by head), where the CPU has AVX-512
    VNNI; spans of more than LONG_SPAN positions of heads of 256 dimensions (LONG_ROW_BYTES_Q8_0), where scores has
    rows for several blocks of queries, take _attend_rows_q8_0_tiled."""
    m_rows, hd_k, hd_v = q_qs.shape[0], k_qs.shape[2], v_qs.shape[2]
    n_head = q_qs.shape[1] // hd_k
    group = n_head // k_qs.shape[0]
    n_slots = scores.shape[0]
    qq2, qd2 = q_qs.reshape(m_rows * n_head, hd_k), q_d.reshape(m_rows * n_head, hd_k // QK8_0)
    out2 = out.reshape(m_rows * n_head, hd_v)
    first = max(0, pos0 + 1 - window) if window > 0 else 0  # the positions some query of the pass sees
    long = pos0 + m_rows - first > LONG_SPAN and hd_k + hd_v >= LONG_ROW_BYTES_Q8_0
    if HAS_ZMM and scores.shape[1] > QUERY_BLOCK and long:
        _attend_rows_q8_0_tiled(qq2, qd2, n_head, k_qs, k_d, v_qs, v_d, pos0, m_rows, window, first, scale, softcap,
                                scores, key_tiles, key_scales, out2, slot0, slot1)  # fmt: skip
        return
    nblk = (m_rows + QUERY_BLOCK - 1) // QUERY_BLOCK
    for slot in range(slot0, slot1):
        laid_out = -1  # the K/V head in key_tiles[slot]
        for item in range(slot, n_head * nblk, n_slots):
            h = item // nblk
            rows, nr, los, ends = _query_block_q8_0(item % nblk, h, n_head, pos0, m_rows, window)
            g = h // group
            if not HAS_ZMM:
                _attend_q8_0_rows(qq2, qd2, rows, nr, los, ends, k_qs[g], k_d[g], v_qs[g], v_d[g], scale, softcap,
                                  scores[slot], 0, out2)  # fmt: skip
                continue
            if g != laid_out:  # (a window's first query sees the fewest)
                _key_tiles_q8_0(k_qs[g], k_d[g], first, pos0 + m_rows, key_tiles[slot], key_scales[slot])
                laid_out = g
            _attend_q8_0_tiles(qq2, qd2, rows, nr, los, ends, key_tiles[slot], key_scales[slot], v_qs[g], v_d[g], scale,
                               softcap, scores[slot], 0, out2)  # fmt: skip


@launcher(_attend_rows_q8_0_slots, ATT_PARALLEL)
def attend_rows_q8_0(q_qs, q_d, k_qs, k_d, v_qs, v_d, pos0, window, scale, softcap, scores, key_tiles, key_scales,
                     out):  # fmt: skip
    """attend_rows on a q8_0 cache: M queries (positions pos0..pos0+M-1, quantized: q_qs [M, n_head*hd_k],
    q_d [M, n_head*hd_k/32]), causal, a query at p seeing keys p - window < key <= p (window 0: all <= p);
    scores: float32 scratch [n_slots, QUERY_BLOCK, >= pos0 + M + 16]; key_tiles int32 [n_slots, hd_k/4 + 1,
    >= pos0 + M + 16] and key_scales uint16 [n_slots, hd_k/32, >= pos0 + M + 16]: scratch for a K/V head's keys laid
    out as tiles (_key_tiles_q8_0); out [M, n_head*hd_v]. Work items: a head's queries in blocks of QUERY_BLOCK
    (_attend_q8_0_tiles); each query gets what attend_one_q8_0 gives it alone.

    The tiles' loads replace _attend_q8_0_rows' gathers and each query block's sum is taken once an item, not once a
    tile. Ice Lake VM, 2 threads, the two kernels in turns, equal outputs asserted, every layer's cache in turn: a
    512-token prompt's attention SmolLM2 (30 layers) 164-193 -> 112-135 ms, Gemma3 (18) 153-192 -> 102-140 ms (1.38-
    1.49x); 256 queries after 1,744 positions 594-666 -> 391-426 ms and 569-570 -> 376 ms (1.51-1.56x). A whole
    2,000-token prompt: SmolLM2 5.49 -> 4.30 s (f16 cache: 4.14), Gemma3 3.51 -> 2.99 s (2.87). Spans past
    LONG_SPAN positions with heads of 256 dimensions (LONG_ROW_BYTES_Q8_0) take their scores and values in key tiles
    (_attend_rows_q8_0_tiled): Gemma3's heads, 256 queries at 12,000 positions, 3,218 -> 2,258 ms (18 layers)."""
    run_items("_attend_rows_q8_0_slots", (q_qs, q_d, k_qs, k_d, v_qs, v_d, pos0, window, scale, softcap, scores,
                                          key_tiles, key_scales, out), scores.shape[0], 1)  # fmt: skip


# ---- feed-forward -----------------------------------------------------------------------------------------------


def gelu_table() -> np.ndarray:
    """GELU (tanh form) of every half-precision value, rounded to half: ggml's `ggml_table_gelu_f16`
    (ggml/src/ggml-cpu/vec.h, GGML_GELU_FP16), which llama.cpp's CPU backend uses for x in (-10, 10).

    ggml_gelu_f32's float32 operations in its order, as GCC compiles them for an x86 CPU with FMA (llama.cpp's
    native build; GCC contracts a * b + c into one FMA by default): 1 + GELU_COEF_A * x * x is fma(A * x, x, 1),
    rounded once, then tanh correctly rounded (NumPy's own float32 tanh is a few ulp off). Every one of the 65,536
    entries equals the table of llama.cpp 0c1e570 built on AVX2 + FMA; without the FMA, 0xbfff (x = -1.999)
    differed by one half-precision ulp.
    """
    f32 = np.float32
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(f32)
    with np.errstate(all="ignore"):
        # (A * x) * x has at most 11 + 24 significant bits: exact in float64; + 1 then one rounding to float32
        # (the float64 sum's own rounding never reaches a float32 tie here: checked on all 65,536 entries)
        fma_1 = ((f32(GELU_COEF_A) * x).astype(np.float64) * x.astype(np.float64) + 1.0).astype(f32)
        inner = (f32(SQRT_2_OVER_PI) * x) * fma_1
        y = (f32(0.5) * x) * (f32(1.0) + np.tanh(inner.astype(np.float64)).astype(f32))
    return y.astype(np.float16).astype(f32)


@numba.njit(inline="always", **JIT)
def _swiglu_row(g, u, out):
    """out = silu(g) * u (out may be g itself)."""
    for i in range(g.shape[0]):
        out[i] = _silu(g[i]) * u[i]


@intrinsic
def _geglu16(typingctx, table, g, u):
    """gelu(g) * u for 16 lanes, each what _geglu_row's scalar steps give: 0 where g <= -10, g where g >= 10, else
    table[half bits of g] (vcvtps2ph, round to nearest even, then one 16-lane gather), times u."""
    if not (isinstance(table, types.Array) and table.dtype == types.float32) or g != F32x16 or u != F32x16:
        return None

    def codegen(context, builder, sig, args):
        i32x16 = ir.VectorType(ir.IntType(32), 16)
        base = builder.bitcast(
            context.make_array(sig.args[0])(context, builder, args[0]).data, ir.IntType(8).as_pointer()
        )
        g, u = args[1], args[2]
        bits = builder.bitcast(builder.fptrunc(g, ir.VectorType(ir.HalfType(), 16)), ir.VectorType(ir.IntType(16), 16))
        mask_t = ir.VectorType(ir.IntType(1), 16)
        gather_t = ir.FunctionType(_v16f32, [_v16f32, ir.IntType(8).as_pointer(), i32x16, mask_t, ir.IntType(32)])
        gather = cgutils.get_or_insert_function(builder.module, gather_t, "llvm.x86.avx512.mask.gather.dps.512")
        everything = ir.Constant(mask_t, [1] * 16)
        t = builder.call(gather, [ir.Constant(_v16f32, None), base, builder.zext(bits, i32x16), everything,
                                  ir.Constant(ir.IntType(32), 4)])  # fmt: skip
        lo, hi = ir.Constant(_v16f32, [-10.0] * 16), ir.Constant(_v16f32, [10.0] * 16)
        y = builder.select(builder.fcmp_ordered(">=", g, hi), g, t)
        y = builder.select(builder.fcmp_ordered("<=", g, lo), ir.Constant(_v16f32, None), y)
        return builder.fmul(y, u)

    return F32x16(table, g, u), codegen


@numba.njit(inline="always", **JIT)
def _geglu_row(g, u, table, out):
    """out = gelu(g) * u through the table (out may be g itself); 16 values at a time on AVX-512 (_geglu16: the
    same lookups and product), the rest one at a time."""
    n = g.shape[0]
    i0 = 0
    if HAS_ZMM:
        while i0 + 16 <= n:
            _st_f32x16(out, i0, _geglu16(table, _ld_f32x16(g, i0), _ld_f32x16(u, i0)))
            i0 += 16
    for i in range(i0, n):
        x = g[i]
        if x <= -10.0:
            y = np.float32(0.0)
        elif x >= 10.0:
            y = x
        else:
            y = table[_f32_to_f16(x)]
        out[i] = y * u[i]


@numba.njit(**JIT)
def _swiglu_halves_part(gate_up, out, m0, m1):
    """Rows m0..m1-1 of swiglu_halves (its serial kernel and swiglu_halves_rows' work items)."""
    n = out.shape[1]
    for m in range(m0, m1):
        _swiglu_row(gate_up[m, :n], gate_up[m, n:], out[m])


@numba.njit(**JIT)
def _geglu_halves_part(gate_up, out, table, m0, m1):
    """Rows m0..m1-1 of geglu_halves."""
    n = out.shape[1]
    for m in range(m0, m1):
        _geglu_row(gate_up[m, :n], gate_up[m, n:], table, out[m])


@numba.njit(**JIT)
def swiglu(gate, up):
    """gate = silu(gate) * up, in place (ggml_vec_swiglu_f32).  gate, up: float32 [M, n_ff]."""
    for m in range(gate.shape[0]):
        _swiglu_row(gate[m], up[m], gate[m])


@numba.njit(**JIT)
def swiglu_halves(gate_up, out):
    """out = silu(gate) * up for rows [gate | up] of gate_up (fused products: a decode step's experts, a batched
    step's ffn_gate_up): gate_up float32 [M, 2 n], out [M, n]; swiglu's float operations."""
    _swiglu_halves_part(gate_up, out, 0, out.shape[0])


@numba.njit(**JIT)
def geglu(gate, up, table):
    """gate = gelu_tanh(gate) * up, in place, through the half-precision table as llama.cpp computes it."""
    for m in range(gate.shape[0]):
        _geglu_row(gate[m], up[m], table, gate[m])


@numba.njit(**JIT)
def geglu_halves(gate_up, out, table):
    """out = gelu_tanh(gate) * up for rows [gate | up] of gate_up (a batched step's ffn_gate_up): gate_up float32
    [M, 2 n], out [M, n]; geglu's float operations."""
    _geglu_halves_part(gate_up, out, table, 0, out.shape[0])


GLU_ROWS = 4  # rows per work item of swiglu_rows / geglu_rows


@numba.njit(**JIT)
def _swiglu_part(gate, up, m0, m1):
    for m in range(m0, m1):
        _swiglu_row(gate[m], up[m], gate[m])


@numba.njit(**JIT)
def _geglu_part(gate, up, table, m0, m1):
    for m in range(m0, m1):
        _geglu_row(gate[m], up[m], table, gate[m])


@launcher(_swiglu_halves_part, JIT_PARALLEL)
def swiglu_halves_rows(gate_up, out):
    """swiglu_halves with the rows shared among the threads, GLU_ROWS a work item (the same bits): a batched decode
    step's."""
    run_items("_swiglu_halves_part", (gate_up, out), out.shape[0], GLU_ROWS)


@launcher(_geglu_halves_part, JIT_PARALLEL)
def geglu_halves_rows(gate_up, out, table):
    """geglu_halves with the rows shared among the threads, GLU_ROWS a work item (the same bits)."""
    run_items("_geglu_halves_part", (gate_up, out, table), out.shape[0], GLU_ROWS)


@launcher(_swiglu_part, JIT_PARALLEL)
def swiglu_rows(gate, up):
    """swiglu with the rows shared among the threads (the same bits): prefill's, where the serial one was 4-5% of a
    1B model's 512-token prefill."""
    M = gate.shape[0]
    run_items("_swiglu_part", (gate, up), M, GLU_ROWS)


@launcher(_geglu_part, JIT_PARALLEL)
def geglu_rows(gate, up, table):
    """geglu with the rows shared among the threads (the same bits)."""
    M = gate.shape[0]
    run_items("_geglu_part", (gate, up, table), M, GLU_ROWS)


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def softcap(x, cap):
    """x = cap * tanh(x * (1 / cap)) in place (final logit soft-capping), the float32 operations of llama.cpp's
    ggml_scale, ggml_tanh, ggml_scale (src/models/gemma2.cpp).  x: float32 [M, n]; cap: float32."""
    for m in range(x.shape[0]):
        _softcap_scores(x[m], cap)


# ---- mixture of experts -----------------------------------------------------------------------------------------
# src/llama-graph.cpp build_moe_ffn on the CPU backend: soft_max (or sigmoid) of the router logits, argsort_top_k,
# get_rows of the chosen probabilities, optional division by their sum (clamped below at 2^-14), then per token
# moe_out = e_0 * w_0 + e_1 * w_1 + ... (products rounded, then added in rank order: ggml_mul, then ggml_add).
# No fast-math: the rounding order is part of the result, and a token's result must not depend on its batch.
MOE = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}
WEIGHTS_SUM_MIN = np.float32(6.103515625e-5)  # build_moe_ffn's clamp of the weights' sum (smallest normal half)


@numba.njit(**MOE)
def route(logits, sigmoid, norm, sel, weights):
    """Pick each row's experts: logits float32 [M, n_expert] (overwritten by the probabilities, then scratch);
    sel int32 [M, k] gets the k most probable experts, most probable first (ties: the lower index first, as
    std::sort's insertion sort leaves them for up to 16 experts), weights float32 [M, k] their probabilities,
    divided by their sum when `norm`."""
    n, k = logits.shape[1], sel.shape[1]
    for m in range(logits.shape[0]):
        p = logits[m]
        if sigmoid:
            for j in range(n):
                p[j] = np.float32(1.0) / (np.float32(1.0) + _expf(np.float32(0.0) - p[j]))
        else:
            inv = _softmax_inplace(p)
            for j in range(n):
                p[j] *= inv
        total = 0.0  # ggml_vec_sum_f32 sums in double
        for r in range(k):
            best = 0
            for j in range(1, n):
                if p[j] > p[best]:
                    best = j
            sel[m, r] = best
            weights[m, r] = p[best]
            total += p[best]
            p[best] = np.float32(-1.0)  # below every probability: taken
        if norm:
            s = max(np.float32(total), WEIGHTS_SUM_MIN)
            for r in range(k):
                weights[m, r] = weights[m, r] / s


@numba.njit(**MOE)
def group_by_expert(sel, offsets, order, active):
    """Group the (token, rank) choices by expert: order int32 [M * k] lists t * k + r for every sel[t, r], expert by
    expert, tokens ascending; expert e's entries are order[offsets[e]:offsets[e + 1]] (offsets int32
    [n_expert + 1]); active int32 [n_expert] gets the experts chosen at least once, ascending. Returns their count."""
    n_expert, k = offsets.shape[0] - 1, sel.shape[1]
    offsets[:] = 0
    for t in range(sel.shape[0]):
        for r in range(k):
            offsets[sel[t, r] + 1] += 1
    n_active = 0
    for e in range(n_expert):
        if offsets[e + 1]:
            active[n_active] = e
            n_active += 1
        offsets[e + 1] += offsets[e]
    # fill with offsets[e] as expert e's cursor, then shift the (now advanced) cursors back
    for t in range(sel.shape[0]):
        for r in range(k):
            e = sel[t, r]
            order[offsets[e]] = t * k + r
            offsets[e] += 1
    for e in range(n_expert, 0, -1):
        offsets[e] = offsets[e - 1]
    offsets[0] = 0
    return n_active


@numba.njit(**MOE)
def gather_rows(x, order, k, out):
    """out[i] = x[order[i] // k]: the input rows of the tokens routed to one expert.  x [M, n], out [len(order), n]."""
    for i in range(order.shape[0]):
        out[i] = x[order[i] // k]


@numba.njit(**MOE)
def scatter_rows(y, order, out):
    """out[order[i]] = y[i]: one expert's outputs to their (token, rank) rows.  y [len(order), n], out [M * k, n]."""
    for i in range(order.shape[0]):
        out[order[i]] = y[i]


@numba.njit(**MOE)
def combine_experts(y, weights, out):
    """out[t] = y[t*k] * w[t, 0] + y[t*k + 1] * w[t, 1] + ..., each product rounded, added in rank order.
    y float32 [M * k, n] (row t * k + r: token t's rank-r expert output), weights [M, k], out [M, n]."""
    k = weights.shape[1]
    for t in range(out.shape[0]):
        w0 = weights[t, 0]
        for i in range(out.shape[1]):
            out[t, i] = y[t * k, i] * w0
        for r in range(1, k):
            w = weights[t, r]
            row = y[t * k + r]
            for i in range(out.shape[1]):
                out[t, i] = out[t, i] + row[i] * w


@numba.njit(**MOE)
def add_gated(out, y, gate_logit):
    """out[t] += y[t] * sigmoid(gate_logit[t, 0]), the sigmoid as qwen2moe's graph computes it: silu(g) / g (0.5
    where g == 0, which llama.cpp would turn into NaN).  out, y: float32 [M, n]; gate_logit [M, 1]."""
    for t in range(out.shape[0]):
        g = gate_logit[t, 0]
        s = _silu(g) / g if g != 0 else np.float32(0.5)
        for i in range(out.shape[1]):
            out[t, i] = out[t, i] + y[t, i] * s
