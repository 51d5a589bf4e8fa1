"""Dequantization kernels: GGUF blocks -> float32, bit-exact with gguf-py's `gguf.quants.dequantize`.

Each kernel is `deq_<type>(w, rows, out)`: w [N, row_bytes] uint8 (or [N, K] float32 / uint16 for the float
types), rows int64 [R] (the weight rows wanted, in order), out float32 [R, K]. Whole tensors pass
rows = arange(N); the token-embedding gather passes the token ids.

Exactness: the arithmetic is gguf-py's, operation for operation, in float32 with no FMA contraction
(e.g. Q4_1 is `d * q + m`, two roundings; Q4_K is `(d * sc) * q - (dmin * m)`). Byte layouts: see
ggufrun.quants.registry.
"""

from __future__ import annotations

import base64

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


# ---- IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4 --------------------------------------------------------------------
# iq1s_grid (llama.cpp ggml-common.h): 2048 entries of 8 values in {-1, 0, 1}, here packed 2 bits per value
# (value + 1 at bits 2j of a little-endian uint16 per entry, base64). dot.py holds the same literal (the kernels'
# helpers and constants live in the kernels' own file); tests/test_quants_iq1tq.py checks the two are equal and
# spot-checks entries against llama.cpp's table.
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


def _unpack_iq1s_grid(packed: str) -> np.ndarray:
    """IQ1S_GRID_PACKED -> int8 [2048, 8], the values of iq1s_grid."""
    entries = np.frombuffer(base64.b64decode("".join(packed)), "<u2").astype(np.int32)
    return (((entries[:, None] >> (2 * np.arange(8))) & 3) - 1).astype(np.int8)


IQ1S_GRID = _unpack_iq1s_grid(IQ1S_GRID_PACKED)
_IQ1S_GRID_F32 = IQ1S_GRID.astype(np.float32)
IQ1_DELTA = np.float32(0.125)  # IQ1S_DELTA / IQ1M_DELTA
# kvalues_mxfp4 (llama.cpp ggml-common.h): E2M1 values, doubled (the scale is halved to match)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


@njit(inline="always", **EXACT)
def _f16_bits(h):
    """IEEE half bits h (0..0xFFFF) -> float32, exactly as f16()."""
    e = h & 0x7C00
    if e == 0:
        f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
    elif e == 0x7C00:
        f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
    else:
        f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
    return -f if h & 0x8000 else f


@njit(inline="always", **EXACT)
def iq1m_d(w, r, o):
    """IQ1_M's fp16 scale: the top nibbles of the four uint16 scale words at o (iq1m_scale_t in llama.cpp)."""
    h = (np.int32(w[r, o + 1]) >> 4) | (np.int32(w[r, o + 3]) & 0xF0)
    h |= ((np.int32(w[r, o + 5]) >> 4) << 8) | ((np.int32(w[r, o + 7]) & 0xF0) << 8)
    return _f16_bits(h)


@njit(inline="always", **EXACT)
def e8m0_half(e):
    """GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32 (subnormal for e < 2; never inf or NaN)."""
    if e < 2:
        return np.uint32(0x00200000 << e).view(np.float32)
    return np.uint32(np.int64(e - 1) << 23).view(np.float32)


@njit(**EXACT)
def deq_iq1_s(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 50):
            o = b * 50
            d = f16(w, r, o)
            for g in range(8):
                qh = np.int32(w[r, o + 34 + 2 * g]) | (np.int32(w[r, o + 35 + 2 * g]) << 8)
                dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
                delta = -IQ1_DELTA if qh & 0x8000 else IQ1_DELTA
                for l in range(4):
                    idx = np.int32(w[r, o + 2 + 4 * g + l]) | (((qh >> (3 * l)) & 7) << 8)
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 8 * l + j] = dl * (_IQ1S_GRID_F32[idx, j] + delta)


@njit(**EXACT)
def deq_iq1_m(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 56):
            o = b * 56
            d = iq1m_d(w, r, o + 48)
            for g in range(8):
                sc = np.int32(w[r, o + 48 + 2 * (g // 2)]) | (np.int32(w[r, o + 49 + 2 * (g // 2)]) << 8)
                for l in range(4):
                    qh = np.int32(w[r, o + 32 + 2 * g + l // 2]) >> (4 * (l % 2))
                    idx = np.int32(w[r, o + 4 * g + l]) | ((qh & 7) << 8)
                    dl = d * np.float32(2 * ((sc >> (6 * (g % 2) + 3 * (l // 2))) & 7) + 1)
                    delta = -IQ1_DELTA if qh & 8 else IQ1_DELTA
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 8 * l + j] = dl * (_IQ1S_GRID_F32[idx, j] + delta)


@njit(inline="always", **EXACT)
def _trit(v, p):
    """Digit of the byte v selected by the power of three p: ((v * p mod 256) * 3) >> 8, in 0..2."""
    return (((np.int32(v) * p) & 0xFF) * 3) >> 8


@njit(**EXACT)
def deq_tq1_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 54):
            o = b * 54
            d = f16(w, r, o + 52)
            y = b * 256
            p = 1
            for n in range(5):  # qs[0:32]: values 32n + m
                for m in range(32):
                    out[i, y + 32 * n + m] = np.float32(_trit(w[r, o + m], p) - 1) * d
                p *= 3
            p = 1
            for n in range(5):  # qs[32:48]: values 160 + 16n + m
                for m in range(16):
                    out[i, y + 160 + 16 * n + m] = np.float32(_trit(w[r, o + 32 + m], p) - 1) * d
                p *= 3
            p = 1
            for n in range(4):  # qh[0:4]: values 240 + 4n + j
                for j in range(4):
                    out[i, y + 240 + 4 * n + j] = np.float32(_trit(w[r, o + 48 + j], p) - 1) * d
                p *= 3


@njit(**EXACT)
def deq_tq2_0(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 66):
            o = b * 66
            d = f16(w, r, o + 64)
            for g in range(8):  # bits 2(g%4) of qs[32*(g//4):]
                for m in range(32):
                    q = (np.int32(w[r, o + 32 * (g // 4) + m]) >> (2 * (g % 4))) & 3
                    out[i, b * 256 + 32 * g + m] = np.float32(q - 1) * d


@njit(**EXACT)
def deq_mxfp4(w, rows, out):
    for i in range(rows.shape[0]):
        r = rows[i]
        for b in range(w.shape[1] // 17):
            o = b * 17
            d = e8m0_half(np.int32(w[r, o]))
            for j in range(16):
                v = w[r, o + 1 + j]
                out[i, b * 32 + j] = MXFP4_VALUES[v & 15] * d
                out[i, b * 32 + 16 + j] = MXFP4_VALUES[v >> 4] * d
