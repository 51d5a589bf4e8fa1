"""Dequantization kernels: GGUF blocks -> float32, bit-exact with gguf-py's `gguf.quants.dequantize`.

Each kernel is `deq_<type>(w, rows, out)`: w [N, row_bytes] uint8 (or [N, K] float32 / uint16 for the float
types), rows int64 [R] (the weight rows wanted, in order), out float32 [R, K]. Whole tensors pass
rows = arange(N); the token-embedding gather passes the token ids.

Exactness: the arithmetic is gguf-py's, operation for operation, in float32 with no FMA contraction
(e.g. Q4_1 is `d * q + m`, two roundings; Q4_K is `(d * sc) * q - (dmin * m)`). Byte layouts: see
ggufrun.quants.registry.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import EXACT

# kvalues_iq4nl (llama.cpp ggml-common.h)
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


@njit(inline="always", **EXACT)
def f16(w, r, o):
    """The IEEE half at bytes o, o+1 of row r, as float32 (exact, subnormals and inf/nan included)."""
    h = np.int32(w[r, o]) | (np.int32(w[r, o + 1]) << 8)
    e = h & 0x7C00
    if e == 0:
        f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
    elif e == 0x7C00:
        f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
    else:
        f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
    return -f if h & 0x8000 else f


@njit(**EXACT)
def deq_q4_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 18):
            o = b * 18
            d = f16(w, r, o)
            for j in range(16):
                v = np.int32(w[r, o + 2 + j])
                out[i, b * 32 + j] = d * np.float32((v & 15) - 8)
                out[i, b * 32 + 16 + j] = d * np.float32((v >> 4) - 8)


@njit(**EXACT)
def deq_q4_1(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 20):
            o = b * 20
            d = f16(w, r, o)
            mn = f16(w, r, o + 2)
            for j in range(16):
                v = np.int32(w[r, o + 4 + j])
                out[i, b * 32 + j] = d * np.float32(v & 15) + mn
                out[i, b * 32 + 16 + j] = d * np.float32(v >> 4) + mn


@njit(**EXACT)
def deq_q5_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 22):
            o = b * 22
            d = f16(w, r, o)
            qh = (
                np.int64(w[r, o + 2])
                | (np.int64(w[r, o + 3]) << 8)
                | (np.int64(w[r, o + 4]) << 16)
                | (np.int64(w[r, o + 5]) << 24)
            )
            for j in range(16):
                v = np.int32(w[r, o + 6 + j])
                lo = (v & 15) | np.int32(((qh >> j) & 1) << 4)
                hi = (v >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                out[i, b * 32 + j] = d * np.float32(lo - 16)
                out[i, b * 32 + 16 + j] = d * np.float32(hi - 16)


@njit(**EXACT)
def deq_q5_1(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 24):
            o = b * 24
            d = f16(w, r, o)
            mn = f16(w, r, o + 2)
            qh = (
                np.int64(w[r, o + 4])
                | (np.int64(w[r, o + 5]) << 8)
                | (np.int64(w[r, o + 6]) << 16)
                | (np.int64(w[r, o + 7]) << 24)
            )
            for j in range(16):
                v = np.int32(w[r, o + 8 + j])
                lo = (v & 15) | np.int32(((qh >> j) & 1) << 4)
                hi = (v >> 4) | np.int32(((qh >> (j + 16)) & 1) << 4)
                out[i, b * 32 + j] = d * np.float32(lo) + mn
                out[i, b * 32 + 16 + j] = d * np.float32(hi) + mn


@njit(**EXACT)
def deq_q8_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 34):
            o = b * 34
            d = f16(w, r, o)
            for j in range(32):
                out[i, b * 32 + j] = np.float32(np.int8(w[r, o + 2 + j])) * d


@njit(**EXACT)
def deq_iq4_nl(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 18):
            o = b * 18
            d = f16(w, r, o)
            for j in range(16):
                v = w[r, o + 2 + j]
                out[i, b * 32 + j] = d * IQ4_VALUES[v & 15]
                out[i, b * 32 + 16 + j] = d * IQ4_VALUES[v >> 4]


@njit(**EXACT)
def deq_q2_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 84):
            o = b * 84
            d = f16(w, r, o + 80)
            dmin = f16(w, r, o + 82)
            for g in range(8):  # 32-value groups: bits 2(g%4) of qs[32*(g//4):]
                for half in range(2):
                    sc = np.int32(w[r, o + 2 * g + half])
                    dl = d * np.float32(sc & 0xF)
                    ml = dmin * np.float32(sc >> 4)
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int32(w[r, o + 16 + 32 * (g // 4) + l]) >> (2 * (g % 4))) & 3
                        out[i, b * 256 + 32 * g + l] = dl * np.float32(q) - ml


@njit(inline="always", **EXACT)
def _k3_scale(w, r, o, j):
    low = np.int32(w[r, o + j]) & 0xF if j < 8 else np.int32(w[r, o + j - 8]) >> 4
    high = (np.int32(w[r, o + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


@njit(**EXACT)
def deq_q3_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 110):
            o = b * 110
            d = f16(w, r, o + 108)
            for g in range(8):
                for half in range(2):
                    dl = d * np.float32(_k3_scale(w, r, o + 96, 2 * g + half))
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int32(w[r, o + 32 + 32 * (g // 4) + l]) >> (2 * (g % 4))) & 3
                        if not (np.int32(w[r, o + l]) >> g) & 1:
                            q -= 4
                        out[i, b * 256 + 32 * g + l] = dl * np.float32(q)


@njit(inline="always", **EXACT)
def _k4_scale_min(w, r, o, g):
    """(scale, min) of sub-block g from the 12 packed bytes at o (get_scale_min_k4 in ggml-quants.c)."""
    if g < 4:
        return np.int32(w[r, o + g]) & 63, np.int32(w[r, o + g + 4]) & 63
    sc = (np.int32(w[r, o + g + 4]) & 0xF) | ((np.int32(w[r, o + g - 4]) >> 6) << 4)
    mn = (np.int32(w[r, o + g + 4]) >> 4) | ((np.int32(w[r, o + g]) >> 6) << 4)
    return sc, mn


@njit(**EXACT)
def deq_q4_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 144):
            o = b * 144
            d = f16(w, r, o)
            dmin = f16(w, r, o + 2)
            for g in range(8):
                sc, mn = _k4_scale_min(w, r, o + 4, g)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(mn)
                shift = 4 * (g % 2)
                for l in range(32):
                    q = (np.int32(w[r, o + 16 + 32 * (g // 2) + l]) >> shift) & 0xF
                    out[i, b * 256 + 32 * g + l] = dl * np.float32(q) - ml


@njit(**EXACT)
def deq_q5_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 176):
            o = b * 176
            d = f16(w, r, o)
            dmin = f16(w, r, o + 2)
            for g in range(8):
                sc, mn = _k4_scale_min(w, r, o + 4, g)
                dl = d * np.float32(sc)
                ml = dmin * np.float32(mn)
                shift = 4 * (g % 2)
                for l in range(32):
                    q = (np.int32(w[r, o + 48 + 32 * (g // 2) + l]) >> shift) & 0xF
                    q |= ((np.int32(w[r, o + 16 + l]) >> g) & 1) << 4
                    out[i, b * 256 + 32 * g + l] = dl * np.float32(q) - ml


@njit(**EXACT)
def deq_q6_k(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 210):
            o = b * 210
            d = f16(w, r, o + 208)
            for h in range(2):
                for k in range(4):
                    for half in range(2):
                        sc = np.int32(np.int8(w[r, o + 192 + 8 * h + 2 * k + half]))
                        dl = d * np.float32(sc)
                        for l in range(16 * half, 16 * half + 16):
                            ql = np.int32(w[r, o + 64 * h + 32 * (k % 2) + l])
                            ql = ql & 0xF if k < 2 else ql >> 4
                            qh = (np.int32(w[r, o + 128 + 32 * h + l]) >> (2 * k)) & 3
                            out[i, b * 256 + 128 * h + 32 * k + l] = dl * np.float32((ql | (qh << 4)) - 32)


@njit(**EXACT)
def deq_iq4_xs(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 136):
            o = b * 136
            d = f16(w, r, o)
            sh = np.int32(w[r, o + 2]) | (np.int32(w[r, o + 3]) << 8)
            for g in range(8):
                ls = ((np.int32(w[r, o + 4 + g // 2]) >> (4 * (g % 2))) & 0xF) | (((sh >> (2 * g)) & 3) << 4)
                dl = d * np.float32(ls - 32)
                for j in range(16):
                    v = w[r, o + 8 + 16 * g + j]
                    out[i, b * 256 + 32 * g + j] = dl * IQ4_VALUES[v & 15]
                    out[i, b * 256 + 32 * g + 16 + j] = dl * IQ4_VALUES[v >> 4]


@njit(**EXACT)
def deq_f32(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(w.shape[1]):
            out[i, k] = w[r, k]


@njit(**EXACT)
def deq_f16(w, rows, out):
    # w: uint16 bits of IEEE halves
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(w.shape[1]):
            h = np.int32(w[r, k])
            e = h & 0x7C00
            if e == 0:
                f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
            elif e == 0x7C00:
                f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
            else:
                f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
            out[i, k] = -f if h & 0x8000 else f


@njit(**EXACT)
def deq_bf16(w, rows, out):
    # w: uint16, the high halves of float32
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(w.shape[1]):
            out[i, k] = np.uint32(np.int64(w[r, k]) << 16).view(np.float32)
