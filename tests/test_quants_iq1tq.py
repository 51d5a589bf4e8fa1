"""IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4 against gguf-py and llama.cpp, beyond the per-type tests of test_quants.py
(which run every supported type through random and hand-built blocks, the float64 products and batch invariance).

- the iq1s_grid copies in dequant.py and dot.py are one table, and that table is llama.cpp's (entries of
  ggml-common.h's iq1s_grid written out here);
- dequantize is bit-exact against `gguf.quants.dequantize` on real quantizer output (gguf-py quantizes TQ1_0,
  TQ2_0, MXFP4; llama-quantize's IQ1_S / IQ1_M files are the goldens test_quants.py reads), on every E8M0
  exponent and every byte of trits, and on IQ1_M scales spread over the scale words;
- the products equal llama.cpp's integer formulas (ggml-cpu/quants.c, ggml_vec_dot_*_q8_K_generic /
  ggml_vec_dot_mxfp4_q8_0_generic) transcribed in NumPy from the same quantized activations.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize as gguf_quantize
from test_quants import assert_bit_exact, random_weights, reference_dequantize

import ggufrun.quants as Q
from ggufrun.quants import dequant as dq
from ggufrun.quants import dot

TYPES = [T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4]

# llama.cpp ggml-common.h iq1s_grid: entries 0-3, 1000-1001 and 2044-2047 (uint64, byte j = value j as int8)
LLAMA_IQ1S_GRID = {
    0: 0xFFFFFFFFFFFFFFFF,
    1: 0xFFFFFFFFFFFFFF01,
    2: 0xFFFFFFFFFFFF0000,
    3: 0xFFFFFFFFFFFF01FF,
    1000: 0x00000000FFFF00FF,
    1001: 0x00000000FFFF0000,
    2044: 0x010101010101FFFF,
    2045: 0x010101010101FF01,
    2046: 0x01010101010101FF,
    2047: 0x0101010101010101,
}


def test_iq1s_grid_is_llamacpps_and_shared():
    assert dq.IQ1S_GRID_PACKED == dot.IQ1S_GRID_PACKED
    grid = dq.IQ1S_GRID
    assert grid.shape == (2048, 8) and set(np.unique(grid)) == {-1, 0, 1}
    for i, v in LLAMA_IQ1S_GRID.items():
        assert grid[i].tobytes() == int(v).to_bytes(8, "little"), i
    # the kernels' code table: bytes 8 * (value + 1)
    codes = dot.IQ1_GRID8.view(np.uint8).reshape(2048, 8).astype(np.int32)
    np.testing.assert_array_equal(codes, 8 * (grid.astype(np.int32) + 1))


@pytest.mark.parametrize("qtype", [T.TQ1_0, T.TQ2_0, T.MXFP4], ids=lambda t: t.name)
def test_dequantize_gguf_quantizer_output(qtype):
    rng = np.random.default_rng(20)
    x = (rng.standard_normal((6, 1024)) * rng.uniform(1e-3, 10, (6, 1))).astype(np.float32)
    x[2, :256] = 0  # an all-zero block
    raw = gguf_quantize(x, qtype)
    ours = Q.dequantize(raw, qtype)
    assert_bit_exact(ours, reference_dequantize(raw, qtype))
    # and it is a quantization of x: ternary codes within half a step, MXFP4 within its relative precision
    err = np.abs(ours - x)
    if qtype == T.MXFP4:
        amax = np.abs(x).reshape(6, -1, 32).max(-1).repeat(32, 1)
        assert np.all(err <= 0.25 * amax + 1e-30)
    else:
        amax = np.abs(x).reshape(6, -1, 256).max(-1).repeat(256, 1)
        assert np.all(err <= 0.5 * amax * (1 + 2.0**-10))


def test_dequantize_mxfp4_every_exponent():
    """All 256 E8M0 bytes (e < 2: subnormal scales; e = 255: 2^127), with every nibble."""
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:] = np.arange(16, dtype=np.uint8) | (np.arange(16, dtype=np.uint8)[::-1] << 4)
    with np.errstate(over="ignore"):
        ref = reference_dequantize(blocks, T.MXFP4)
    assert_bit_exact(Q.dequantize(blocks, T.MXFP4), ref)
    assert Q.dequantize(blocks[0], T.MXFP4)[1] == np.float32(2.0**-128)  # 1 x 2^(0 - 128), subnormal
    assert Q.dequantize(blocks[128], T.MXFP4)[7] == 12.0  # kvalues_mxfp4[7] (E2M1 6, doubled) x 2^0


def test_dequantize_tq1_0_every_byte():
    """Every byte value in every trit position (qs[0:32], qs[32:48], qh)."""
    blocks = np.zeros((256, 54), np.uint8)
    blocks[:, :52] = (np.arange(256)[:, None] + np.arange(52)[None, :]) % 256
    blocks[:, 52:54] = np.array([0.5], np.float16).view(np.uint8)
    assert_bit_exact(Q.dequantize(blocks, T.TQ1_0), reference_dequantize(blocks, T.TQ1_0))


def test_dequantize_iq1_m_scale_nibbles():
    """IQ1_M's d is spread over the top nibbles of its 4 scale words: every nibble position matters."""
    rng = np.random.default_rng(21)
    blocks = rng.integers(0, 256, (64, 56), dtype=np.uint8)
    d = (rng.standard_normal(64) * 0.1).astype(np.float16).view(np.uint16).astype(np.int32)
    for k in range(4):
        blocks[:, 49 + 2 * k] = (blocks[:, 49 + 2 * k] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4)
    ours = Q.dequantize(blocks, T.IQ1_M)
    assert_bit_exact(ours, reference_dequantize(blocks, T.IQ1_M))
    # |x| = d * (2s + 1) * |grid +- 1/8|: the largest is at most 15 * 1.125 * |d|
    dabs = np.abs(d.astype(np.uint16).view(np.float16).astype(np.float32))
    assert np.all(np.abs(ours.reshape(64, -1)).max(1) <= 15 * 1.125 * dabs)


# ---- products against llama.cpp's integer formulas ---------------------------------------------------------


def _tq1_trit(byte, l: int) -> int:
    """Digit l of a TQ1_0 byte as dequantize_row_tq1_0 extracts it: ((uint8_t)(byte * 3^l) * 3) >> 8."""
    return ((int(byte) * 3**l) & 0xFF) * 3 >> 8


def _llama_dot(w_row: np.ndarray, qtype: T, qx: Q.QuantizedActivations, m: int) -> float:
    """ggml_vec_dot_<type>_q8_K_generic / ggml_vec_dot_mxfp4_q8_0_generic (ggml-cpu/quants.c) for one row, the
    integers exact, the float steps in float64."""
    e = Q.REGISTRY[qtype]
    blocks = w_row.reshape(-1, e.type_size)
    if qtype == T.MXFP4:
        d, _, qs, _ = qx.arrays
        q = qs[m].astype(np.int64).reshape(-1, 32)
        vals = np.array(dq.MXFP4_VALUES, np.int64)
        total = 0.0
        for b, blk in enumerate(blocks):
            sumi = int((vals[blk[1:] & 15] * q[b, :16]).sum() + (vals[blk[1:] >> 4] * q[b, 16:]).sum())
            total += float(d[m, b]) * float(dq.e8m0_half(np.int32(blk[0]))) * sumi
        return total
    _, d, bsums16, _, qs = qx.arrays
    q = qs[m].astype(np.int64).reshape(-1, 256)
    total = 0.0
    for b, blk in enumerate(blocks):
        if qtype == T.TQ2_0:  # value 4j + 32l + k: (qs[j + k] >> 2l) & 3, minus 1
            dw = float(blk[64:66].view(np.float16)[0])
            trits = np.array([(int(blk[j + k]) >> (2 * l)) & 3 for j in (0, 32) for l in range(4) for k in range(32)])
            total += dw * float(d[m, b]) * int(((trits - 1) * q[b]).sum())
            continue
        if qtype == T.TQ1_0:  # ((uint8)(byte * 3^l) * 3) >> 8, minus 1, in the order of the C loops
            dw = float(blk[52:54].view(np.float16)[0])
            trits = [_tq1_trit(blk[k], l) for l in range(5) for k in range(32)]
            trits += [_tq1_trit(blk[32 + k], l) for l in range(5) for k in range(16)]
            trits += [_tq1_trit(blk[48 + j], l) for l in range(4) for j in range(4)]
            total += dw * float(d[m, b]) * int(((np.array(trits) - 1) * q[b]).sum())
            continue
        if qtype == T.IQ1_S:
            dw = float(blk[:2].view(np.float16)[0])
            qh = blk[34:50].view("<u2").astype(np.int64)
            sumi = sumi1 = 0
            for ib in range(8):
                ls = 2 * ((qh[ib] >> 12) & 7) + 1
                delta = -1 if qh[ib] & 0x8000 else 1
                idx = [int(blk[2 + 4 * ib + l]) | (((int(qh[ib]) >> (3 * l)) & 7) << 8) for l in range(4)]
                grid = np.concatenate([dq.IQ1S_GRID[i] for i in idx]).astype(np.int64)
                sumi += ls * int((grid * q[b, 32 * ib : 32 * ib + 32]).sum())
                sumi1 += ls * delta * int(bsums16[m, 16 * b + 2 * ib] + bsums16[m, 16 * b + 2 * ib + 1])
            total += dw * float(d[m, b]) * (sumi + 0.125 * sumi1)
            continue
        sc = blk[48:56].view("<u2").astype(np.int64)  # IQ1_M
        h = (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)
        dw = float(np.array([h], np.uint16).view(np.float16)[0])
        sumi1 = sumi2 = 0
        for ib in range(8):
            qh = blk[32 + 2 * ib : 34 + 2 * ib].astype(np.int64)
            for half in range(2):
                ls = 2 * ((sc[ib // 2] >> (6 * (ib % 2) + 3 * half)) & 7) + 1
                for l in (2 * half, 2 * half + 1):
                    nib = (qh[l // 2] >> (4 * (l % 2))) & 0xF
                    grid = dq.IQ1S_GRID[int(blk[4 * ib + l]) | ((int(nib) & 7) << 8)].astype(np.int64)
                    x8 = q[b, 32 * ib + 8 * l : 32 * ib + 8 * l + 8]
                    sumi1 += ls * int((grid * x8).sum())
                    sumi2 += ls * (-1 if nib & 8 else 1) * int(x8.sum())
        total += dw * float(d[m, b]) * (sumi1 + 0.125 * sumi2)
    return total


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_products_match_llamacpp_formula(qtype):
    rng = np.random.default_rng(22)
    N, K, M = 9, 512, 5
    w = random_weights(qtype, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    x[:, :128] *= 20
    qx = Q.quantize_activations(x, qtype)
    Y = Q.matmul_q(w, qtype, qx)
    ref = np.array([[_llama_dot(w[n], qtype, qx, m) for n in range(N)] for m in range(M)])
    # only float32 rounding separates the two: a few ulps of the row's magnitude
    scale = np.abs(Q.dequantize(w, qtype).astype(np.float64)) @ np.abs(x.astype(np.float64)).T
    assert np.all(np.abs(Y - ref) <= 1e-5 * scale.T + 1e-30), np.abs(Y - ref).max()


def test_mxfp4_shares_q8_0_activations():
    rng = np.random.default_rng(23)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    qx = Q.quantize_activations(x, T.Q8_0)
    w = random_weights(T.MXFP4, 7, 256, rng)
    np.testing.assert_array_equal(Q.matmul_q(w, T.MXFP4, qx), Q.matmul(w, T.MXFP4, x))


def test_ternary_types_extreme_activations():
    """Activations at +-127 in every position and codes at their extremes: the integer paths do not overflow."""
    K = 1024
    x = np.where(np.arange(K) % 3 == 0, 1.0, -1.0).astype(np.float32)[None, :].repeat(2, 0)
    x[1] = 1.0
    for qtype in (T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0):
        rng = np.random.default_rng(24)
        w = random_weights(qtype, 16, K, rng, scale=1.0)
        W = Q.dequantize(w, qtype).astype(np.float64)
        Y = Q.matmul(w, qtype, x)
        ref = x.astype(np.float64) @ W.T  # x = +-1 exactly: Q8_K holds it without rounding (q = +-127, d = 1/127)
        assert np.allclose(Y, ref, rtol=1e-5, atol=1e-5 * np.abs(W).sum(1).max()), qtype.name
