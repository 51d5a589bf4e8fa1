"""Numba kernels of the forward pass, other than the quantized matrix products (those live in ggufrun.quants).

Every kernel writes into buffers the caller preallocated, so a decode step allocates nothing. Arrays in, arrays
out; a zero-length array stands for an absent optional tensor (bias, norm weight). The KV cache is either float32
or IEEE half floats stored as uint16 (Numba has no float16): `_kv_load` / `_kv_store` convert one value with the
CPU's F16C instructions (LLVM `fpext`/`fptrunc` on `half`), so the loops still vectorise.

All helpers a kernel calls are in this module: Numba's on-disk cache does not notice edits to other files.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

# Fast-math without nnan/ninf: masks and softmax rely on -inf / large values behaving as IEEE says.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
JIT = {"cache": True, "nogil": True, "fastmath": FASTMATH, "error_model": "numpy"}
# Attention: no fast-math at all, so that decode and prefill compute each query the same way (see attend_rows).
ATT = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}

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


@intrinsic
def _i32_as_f32(typingctx, i):
    """Reinterpret int32 bits as float32."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


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
    return j * _i32_as_f32((n1 + np.int32(127)) << np.int32(23)) * _i32_as_f32((n2 + np.int32(127)) << np.int32(23))


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=False)
def _inv_sum(total):
    """float(1 / total) for a float64 sum, as ggml's softmax scales (no approximate reciprocal)."""
    return np.float32(1.0 / total)


@numba.njit(inline="always", **JIT)
def _max_of(x):
    """max of a non-empty float32 vector; eight running maxima, as one chain is bound by max's latency."""
    n = x.shape[0]
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = x[0]
    n8 = n - n % 8
    for j in range(0, n8, 8):
        b0, b1, b2, b3 = max(b0, x[j]), max(b1, x[j + 1]), max(b2, x[j + 2]), max(b3, x[j + 3])
        b4, b5, b6, b7 = max(b4, x[j + 4]), max(b5, x[j + 5]), max(b6, x[j + 6]), max(b7, x[j + 7])
    for j in range(n8, n):
        b0 = max(b0, x[j])
    return max(max(max(b0, b1), max(b2, b3)), max(max(b4, b5), max(b6, b7)))


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
def add_norm(x, y, post_w, w, eps, out):
    """Residual add, then the next RMSNorm: x[m] += post_norm(y[m]) (or y[m] when post_w is empty); out = norm(x) * w.

    x (residual stream, updated in place), y (overwritten), out: float32 [M, n]; post_w, w: float32 [n] or [0].
    """
    for m in range(x.shape[0]):
        if post_w.shape[0]:
            scale = _rms_scale(y[m], eps)
            for i in range(x.shape[1]):
                y[m, i] = y[m, i] * scale * post_w[i]
        _add_to(x[m], y[m])
        scale = _rms_scale(x[m], eps)
        for i in range(x.shape[1]):
            out[m, i] = x[m, i] * scale * w[i]


# ---- attention --------------------------------------------------------------------------------------------------


@numba.njit(**JIT)
def qkv_rope_store(
    q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, eps, cos, sin, neox, q_scale, pos0, k_cache, v_cache
):
    """Finish Q/K/V of M new tokens at positions pos0..pos0+M-1 and append K/V to this layer's cache.

    q [M, n_head*hd_k] (in place: + bias, per-head RMSNorm, rope, * q_scale); k [M, n_kv*hd_k], v [M, n_kv*hd_v]
    (+ bias; K normed and roped) are written to k_cache [n_kv, hd_k, n_ctx] / v_cache [n_kv, n_ctx, hd_v] at the
    token's position. cos/sin: [n_ctx, n_rot/2]. neox: rotate (x[i], x[i + n_rot/2]) else (x[2i], x[2i+1]).
    """
    n_kv, hd_k = k_cache.shape[0], k_cache.shape[1]
    hd_v = v_cache.shape[2]
    n_head = q.shape[1] // hd_k
    half = cos.shape[1]
    for m in range(q.shape[0]):
        p = pos0 + m
        for i in range(q_bias.shape[0]):
            q[m, i] += q_bias[i]
        for i in range(k_bias.shape[0]):
            k[m, i] += k_bias[i]
        for i in range(v_bias.shape[0]):
            v[m, i] += v_bias[i]
        for h in range(n_head + n_kv):
            x = q[m, h * hd_k : (h + 1) * hd_k] if h < n_head else k[m, (h - n_head) * hd_k : (h - n_head + 1) * hd_k]
            nw = q_norm if h < n_head else k_norm
            if nw.shape[0]:
                scale = _rms_scale(x, eps)
                for i in range(hd_k):
                    x[i] = x[i] * scale * nw[i]
            for i in range(half):
                c, s = cos[p, i], sin[p, i]
                i0, i1 = (i, i + half) if neox else (2 * i, 2 * i + 1)
                a, b = x[i0], x[i1]
                x[i0] = a * c - b * s
                x[i1] = a * s + b * c
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


# Attention is written so that a query's result is the same bits whether it is computed alone (decode) or in a
# block of prefill queries: the same operations in the same order, explicit FMAs and no fast-math (which would let
# LLVM vectorise the reductions differently in each kernel). Scores accumulate over the head dimension one FMA at
# a time, lane-wise over key positions, which is why keys are cached head-dimension-major ([hd_k, n_ctx]: a
# score sweep reads contiguous positions); outputs accumulate over positions, lane-wise over the value dimension.


@numba.njit(inline="always", **ATT)
def _softmax_inplace(x):
    """x = exp(x - max(x)) in place; returns float(1 / sum), the sum in double (as ggml's soft_max) over four
    interleaved partial sums in a fixed order. The exp pass has no loop-carried value, so it vectorises."""
    best = _max_of(x)
    n = x.shape[0]
    for j in range(n):
        x[j] = _expf(x[j] - best)
    n4 = n - n % 4
    t0 = t1 = t2 = t3 = 0.0
    for j in range(0, n4, 4):
        t0, t1, t2, t3 = t0 + x[j], t1 + x[j + 1], t2 + x[j + 2], t3 + x[j + 3]
    for j in range(n4, n):
        t0 += x[j]
    return _inv_sum((t0 + t1) + (t2 + t3))


@numba.njit(inline="always", **ATT)
def _attend_head(qh, keys, values, t0, t1, s, o):
    """o = softmax(qh . keys[:, t0:t1]) @ values[t0:t1] for one head; keys [hd_k, n_ctx], values [n_ctx, hd_v],
    s: float32 scratch [>= t1 - t0]. Probabilities are rounded to the cache's precision, as llama.cpp does."""
    n = t1 - t0
    s = s[:n]
    s[:] = 0.0
    for i in range(keys.shape[0]):
        a = qh[i]
        kr = keys[i, t0:t1]
        for t in range(n):
            s[t] = _fma(a, _kv_load(kr[t]), s[t])
    inv = _softmax_inplace(s)
    o[:] = 0.0
    for t in range(n):
        p = _kv_round(s[t] * inv, values)
        vr = values[t0 + t]
        for i in range(o.shape[0]):
            o[i] = _fma(p, _kv_load(vr[i]), o[i])


@numba.njit(parallel=True, **ATT)
def attend_one(q, k_cache, v_cache, t0, t1, scores, out):
    """Attention of one token over cached positions t0..t1-1, every head (decode), heads spread over threads.

    q [n_head*hd_k] (already scaled); k_cache [n_kv, hd_k, n_ctx]; v_cache [n_kv, n_ctx, hd_v];
    scores: float32 scratch [n_head, >= t1 - t0]; out [n_head*hd_v]. Query head h reads K/V head
    h // (n_head / n_kv).
    """
    hd_k, hd_v = k_cache.shape[1], v_cache.shape[2]
    n_head = q.shape[0] // hd_k
    group = n_head // k_cache.shape[0]
    for h in numba.prange(n_head):
        _attend_head(
            q[h * hd_k : (h + 1) * hd_k], k_cache[h // group], v_cache[h // group], t0, t1,
            scores[h], out[h * hd_v : (h + 1) * hd_v],
        )  # fmt: skip


QUERY_BLOCK = 4  # queries of one head processed together, sharing each loaded key and value


@numba.njit(parallel=True, **ATT)
def attend_rows(q, k_cache, v_cache, pos0, t0, n, window, scores, acc, out):
    """Causal attention of M queries (positions pos0..pos0+M-1) over cached keys t0..t0+n-1 (prefill).

    q [M, n_head*hd_k] (scaled); k_cache [n_kv, hd_k, n_ctx], v_cache [n_kv, n_ctx, hd_v]; scratch, one slot per
    concurrent task: scores float32 [n_slots, QUERY_BLOCK, >= n], acc float32 [n_slots, QUERY_BLOCK, hd_v];
    out [M, n_head*hd_v]. A query at position p sees keys at p - window < key <= p (window 0: all keys <= p).
    Work items are (head, block of 4 queries), dealt round-robin to the slots so causal rows balance out. Each
    query gets what attend_one computes for it, bit for bit: its scores over the block's columns are the same
    lane-wise FMA chains, columns it cannot see get probability 0, and adding 0 * v leaves a sum unchanged.
    """
    m_rows, n_kv, hd_k, hd_v = q.shape[0], k_cache.shape[0], k_cache.shape[1], v_cache.shape[2]
    n_head = q.shape[1] // hd_k
    group = n_head // n_kv
    n_blocks = (m_rows + QUERY_BLOCK - 1) // QUERY_BLOCK
    n_slots = scores.shape[0]
    for slot in numba.prange(n_slots):
        sc, ob = scores[slot], acc[slot]
        for item in range(slot, n_head * n_blocks, n_slots):
            h, m0 = item // n_blocks, item % n_blocks * QUERY_BLOCK
            g, nr = h // group, min(QUERY_BLOCK, m_rows - m0)
            # columns [lo, hi) visible to some query of the block; missing rows repeat the last one
            lo = max(0, pos0 + m0 - window + 1 - t0) if window > 0 else 0
            hi = min(n, pos0 + m0 + nr - t0)
            r1, r2, r3 = min(1, nr - 1), min(2, nr - 1), min(3, nr - 1)
            q0, q1 = q[m0, h * hd_k : (h + 1) * hd_k], q[m0 + r1, h * hd_k : (h + 1) * hd_k]
            q2, q3 = q[m0 + r2, h * hd_k : (h + 1) * hd_k], q[m0 + r3, h * hd_k : (h + 1) * hd_k]
            s0, s1, s2, s3 = sc[0, lo:hi], sc[1, lo:hi], sc[2, lo:hi], sc[3, lo:hi]
            w = hi - lo
            sc[:, lo:hi] = 0.0
            for i in range(hd_k):
                keys = k_cache[g, i, t0 + lo : t0 + hi]
                a0, a1, a2, a3 = q0[i], q1[i], q2[i], q3[i]
                for t in range(w):
                    k = _kv_load(keys[t])
                    s0[t] = _fma(a0, k, s0[t])
                    s1[t] = _fma(a1, k, s1[t])
                    s2[t] = _fma(a2, k, s2[t])
                    s3[t] = _fma(a3, k, s3[t])
            for r in range(nr):
                p = pos0 + m0 + r
                rlo = max(0, p - window + 1 - t0) if window > 0 else 0
                rhi = min(n, p - t0 + 1)
                row = sc[r]
                visible = row[rlo:rhi]
                inv = _softmax_inplace(visible)
                for j in range(rhi - rlo):
                    visible[j] = _kv_round(visible[j] * inv, v_cache)
                row[lo:rlo] = 0.0
                row[rhi:hi] = 0.0
            o0, o1, o2, o3 = ob[0], ob[1], ob[2], ob[3]
            ob[:, :] = 0.0
            for t in range(w):
                values = v_cache[g, t0 + lo + t]
                p0, p1, p2, p3 = s0[t], s1[t], s2[t], s3[t]
                for i in range(hd_v):
                    v = _kv_load(values[i])
                    o0[i] = _fma(p0, v, o0[i])
                    o1[i] = _fma(p1, v, o1[i])
                    o2[i] = _fma(p2, v, o2[i])
                    o3[i] = _fma(p3, v, o3[i])
            for r in range(nr):
                out[m0 + r, h * hd_v : (h + 1) * hd_v] = ob[r]


# ---- feed-forward -----------------------------------------------------------------------------------------------


def gelu_table() -> np.ndarray:
    """GELU (tanh form) of every half-precision value, rounded to half: ggml's `ggml_table_gelu_f16`
    (ggml/src/ggml-cpu/vec.h, GGML_GELU_FP16), which llama.cpp's CPU backend uses for x in (-10, 10).

    float32 operations in ggml_gelu_f32's order, tanh correctly rounded (NumPy's own float32 tanh is a few ulp
    off, which changes a few table entries).
    """
    f32 = np.float32
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(f32)
    with np.errstate(all="ignore"):
        inner = (f32(SQRT_2_OVER_PI) * x) * (f32(1.0) + (f32(GELU_COEF_A) * x) * x)
        y = (f32(0.5) * x) * (f32(1.0) + np.tanh(inner.astype(np.float64)).astype(f32))
    return y.astype(np.float16).astype(f32)


@numba.njit(inline="always", **JIT)
def _swiglu_row(g, u):
    for i in range(g.shape[0]):
        g[i] = _silu(g[i]) * u[i]


@numba.njit(inline="always", **JIT)
def _geglu_row(g, u, table):
    for i in range(g.shape[0]):
        x = g[i]
        if x <= -10.0:
            y = np.float32(0.0)
        elif x >= 10.0:
            y = x
        else:
            y = table[_f32_to_f16(x)]
        g[i] = y * u[i]


@numba.njit(**JIT)
def swiglu(gate, up):
    """gate = silu(gate) * up, in place (ggml_vec_swiglu_f32).  gate, up: float32 [M, n_ff]."""
    for m in range(gate.shape[0]):
        _swiglu_row(gate[m], up[m])


@numba.njit(**JIT)
def geglu(gate, up, table):
    """gate = gelu_tanh(gate) * up, in place, through the half-precision table as llama.cpp computes it."""
    for m in range(gate.shape[0]):
        _geglu_row(gate[m], up[m], table)


@numba.njit(**JIT)
def scale_rows(x, s):
    """x *= s in place (gemma3's embedding scale).  x: float32 [M, n]."""
    for m in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[m, i] *= s


@numba.njit(**JIT)
def softcap(x, cap):
    """x = cap * tanh(x / cap) in place (final logit soft-capping).  x: float32 [M, n]."""
    for m in range(x.shape[0]):
        for i in range(x.shape[1]):
            x[m, i] = cap * math.tanh(x[m, i] / cap)
