"""ggufrun.quants against independent references.

- dequantize: bit-exact against gguf-py's `gguf.quants.dequantize` on random blocks (hypothesis), hand-built
  blocks, and every tensor of the golden small-*.gguf files.
- activation quantizers: each block's scale is the best of its 8 candidates (float64 errors), never worse than
  NumPy transcriptions of llama.cpp's quantize_row_q8_1 (x86) and quantize_row_q8_K_ref, whose rule blocks of
  zeros and tiny blocks keep; half-integers round to even as llama.cpp's x86 build does.
- matvec / matmul: against float64 products of the dequantized weights, both with the activations as the
  kernels quantized them (tight: only float32 accumulation differs) and with the original float activations
  (within the bound 8-bit activation rounding explains, derived in `_activation_error_bound`).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from hypothesis import given, settings
from hypothesis import strategies as st

import ggufrun.quants as Q
from ggufrun.errors import GGUFError
from ggufrun.reader import GGUFFile
from ggufrun.runtime import _ThreadCount

ALL_TYPES = sorted(Q.SUPPORTED_TYPES, key=lambda t: t.value)
QUANT_TYPES = [t for t in ALL_TYPES if Q.REGISTRY[t].weight_dtype == np.uint8]
FLOAT_TYPES = [T.F32, T.F16, T.BF16]


def _ids(types):
    return [t.name for t in types]


def random_weights(qtype: T, n_rows: int, K: int, rng, scale: float = 0.02) -> np.ndarray:
    """Random blocks, fp16 scale fields set to normal values of size `scale` (typed arrays for float types)."""
    e = Q.REGISTRY[qtype]
    if e.weight_dtype != np.uint8:
        W = rng.standard_normal((n_rows, K)).astype(np.float32)
        if qtype == T.F16:
            return W.astype(np.float16)
        if qtype == T.BF16:
            return gguf_quantize(W, T.BF16).view(np.uint16)
        return W
    nb = K // e.block_size
    raw = rng.integers(0, 256, (n_rows, nb, e.type_size), dtype=np.uint8)
    for off in e.f16_fields:
        h = (rng.standard_normal((n_rows, nb)) * scale).astype(np.float16)
        raw[:, :, off : off + 2] = h.view(np.uint8).reshape(n_rows, nb, 2)
    if qtype == T.IQ1_M:  # its fp16 d is the top nibbles of the four scale words (bytes 49, 51, 53, 55)
        h = (rng.standard_normal((n_rows, nb)) * scale).astype(np.float16).view(np.uint16).astype(np.int32)
        for k in range(4):
            raw[:, :, 49 + 2 * k] = (raw[:, :, 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
    if qtype == T.MXFP4:  # E8M0 exponent byte: scales 2^-10 .. 2^-5 (x 2^-1)
        raw[:, :, 0] = rng.integers(118, 123, (n_rows, nb))
    return raw.reshape(n_rows, nb * e.type_size)


def reference_dequantize(data: np.ndarray, qtype: T) -> np.ndarray:
    """gguf-py's dequantize, given the raw bytes the way it expects them."""
    if qtype == T.BF16:
        data = data.view(np.uint8)
    return gguf_dequantize(data, qtype).astype(np.float32)


def assert_bit_exact(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.shape == ref.shape and ours.dtype == np.float32
    bad = ours.view(np.uint32) != ref.view(np.uint32)
    assert not bad.any(), (
        f"{bad.sum()} values differ, first at {np.argwhere(bad)[0]}: {ours[bad][:4]} vs {ref[bad][:4]}"
    )


# ---- registry ---------------------------------------------------------------------------------------------


def test_registry_matches_gguf_block_sizes():
    assert Q.SUPPORTED_TYPES == frozenset(
        {T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}
        | {T.IQ4_NL, T.IQ4_XS}
        | {T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S}
        | {T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4}
    )
    for t, e in Q.REGISTRY.items():
        assert (e.block_size, e.type_size) == GGML_QUANT_SIZES[t], t.name
        assert e.act in ("Q8_1", "Q8_K", "F32")
        fmt = Q.ACTIVATIONS[e.act]
        assert fmt.name == e.act and (fmt.block == 1) == (e.weight_dtype != np.uint8), t.name
        assert e.block_size % fmt.block == 0, t.name  # a row of whole weight blocks is whole activation blocks


def test_unsupported_type_names_tensor_and_type():
    with pytest.raises(GGUFError, match=r"tensor 'blk\.3\.ffn_up\.weight' has type F64.*supported: .*Q4_K"):
        Q.check_supported("blk.3.ffn_up.weight", T.F64)
    with pytest.raises(GGUFError, match="unknown ggml type 250"):
        Q.check_supported("token_embd.weight", 250)
    with pytest.raises(GGUFError, match="Q8_K"):  # ggml's activation type, never a weight type here
        Q.dequantize(np.zeros(292, np.uint8), T.Q8_K)
    for t in ALL_TYPES:
        Q.check_supported("x", t)
        Q.check_supported("x", int(t))


# ---- dequantize -------------------------------------------------------------------------------------------


# the bits of a finite fp16: the edges named, else any 16 bits with an all-ones exponent (inf / NaN) moved down one
# (drawn, not filtered: st.floats(width=16) rejects the floats that are not halves, and at times so many that
# Hypothesis's filter_too_much health check failed the test)
_FINITE_HALF_BITS = st.one_of(
    st.sampled_from([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF]),  # zeros, subnormals, 1, max
    st.integers(0, 0xFFFF).map(lambda b: b & ~0x0400 if b & 0x7C00 == 0x7C00 else b),
)


@st.composite
def _blocks(draw, qtype):
    """1-3 blocks of random bytes whose fp16 fields hold any finite half (zero, subnormal, max, negative)."""
    e = Q.REGISTRY[qtype]
    nb = draw(st.integers(1, 3))
    raw = np.frombuffer(draw(st.binary(min_size=nb * e.type_size, max_size=nb * e.type_size)), np.uint8)
    raw = raw.copy().reshape(nb, e.type_size)
    for off in e.f16_fields:
        halves = draw(st.lists(_FINITE_HALF_BITS, min_size=nb, max_size=nb))
        raw[:, off : off + 2] = np.array(halves, np.uint16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=_ids(QUANT_TYPES))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_dequantize_random_blocks(qtype, data):
    raw = data.draw(_blocks(qtype))
    assert_bit_exact(Q.dequantize(raw, qtype), reference_dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=["F16", "BF16"])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_dequantize_random_halves(qtype, data):
    # every bit pattern, NaN and inf included (F16: the float16 view; BF16: uint16 bits)
    bits = np.array(data.draw(st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=64)), np.uint16)
    ours = Q.dequantize(bits.view(np.float16) if qtype == T.F16 else bits, qtype)
    assert_bit_exact(ours, reference_dequantize(bits.view(np.float16) if qtype == T.F16 else bits, qtype))


def _hand_built(qtype: T) -> list[np.ndarray]:
    """Zeros, all-0xFF payloads (max nibbles / codes), and extreme / subnormal / negative scales."""
    e = Q.REGISTRY[qtype]
    out = []
    for fill in (0x00, 0xFF, 0x88, 0x0F, 0xF0):
        for scale in (0.0, 1.0, -1.0, 65504.0, -65504.0, 2.0**-24, 6.1e-5):
            b = np.full(e.type_size, fill, np.uint8)
            for off in e.f16_fields:
                b[off : off + 2] = np.array([scale], np.float16).view(np.uint8)
            out.append(b)
    return out


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=_ids(QUANT_TYPES))
def test_dequantize_hand_built_blocks(qtype):
    blocks = np.stack(_hand_built(qtype))  # [n, type_size]: each row one block
    assert_bit_exact(Q.dequantize(blocks, qtype), reference_dequantize(blocks, qtype))


def test_dequantize_float_types():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    assert Q.dequantize(x, T.F32) is x
    h = x.astype(np.float16)
    assert_bit_exact(Q.dequantize(h, T.F16), h.astype(np.float32))
    b = gguf_quantize(x, T.BF16).view(np.uint16)
    assert_bit_exact(Q.dequantize(b, T.BF16), reference_dequantize(b, T.BF16))
    # raw bytes work too, as for gguf-py
    assert_bit_exact(Q.dequantize(h.view(np.uint8), T.F16), h.astype(np.float32))


def _golden_tensors(golden_dir):
    for path in sorted(golden_dir.glob("small-*.gguf")):
        f = GGUFFile(path)
        for t in f.tensors.values():
            yield path.name, t


def test_dequantize_golden_files(golden_dir):
    seen = set()
    n = 0
    for fname, t in _golden_tensors(golden_dir):
        ours = Q.dequantize(t.data, t.type)
        assert ours.shape == t.shape, (fname, t.name)
        assert_bit_exact(ours, reference_dequantize(t.data, t.type).reshape(t.shape))
        seen.add(t.type)
        n += 1
    assert n > 100
    assert seen == Q.SUPPORTED_TYPES  # the golden files cover every type


def test_dequantize_keeps_leading_shape_and_runs_of_blocks():
    rng = np.random.default_rng(1)
    w = random_weights(T.Q4_K, 6, 512, rng)
    full = Q.dequantize(w.reshape(2, 3, -1), T.Q4_K)
    assert full.shape == (2, 3, 512)
    run = Q.dequantize(w[1, 144:288], T.Q4_K)  # one block from the middle of a row
    assert_bit_exact(run, full.reshape(6, 512)[1, 256:512])


# ---- get_rows ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids(ALL_TYPES))
def test_get_rows(qtype):
    rng = np.random.default_rng(2)
    w = random_weights(qtype, 11, 512, rng)
    ids = np.array([3, 0, 10, 3, 7], np.int32)
    ref = Q.dequantize(w, qtype)[ids]
    assert_bit_exact(Q.get_rows(w, qtype, ids), ref)
    out = np.full((5, 512), np.nan, np.float32)
    assert Q.get_rows(w, qtype, ids, out=out) is out
    assert_bit_exact(out, ref)
    with pytest.raises(IndexError):
        Q.get_rows(w, qtype, [11])


# ---- activation quantization ------------------------------------------------------------------------------


STEPS = np.float32(1.0) + np.arange(8, dtype=np.float32) * np.float32(0.005)  # the candidates' factors


def _block_errors(xb: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float64 sum over each block of (x - rint(x / scale) * scale)^2; xb [n, blk], scales [n, c] -> [n, c]."""
    x = xb.astype(np.float64)[:, None, :]
    sc = scales.astype(np.float64)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint(xb[:, None, :] * (np.float32(1) / scales)[..., None]).astype(np.float64)
    return ((x - q * sc) ** 2).sum(-1)


def _q8_1_llamacpp(xb: np.ndarray):
    """llama.cpp quantize_row_q8_1, x86 AVX2 path (ggml-cpu/arch/x86/quants.c), in NumPy float32, per block of 32:
    the quants and the stored fp16 scale."""
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None])  # _mm256_round_ps(_MM_ROUND_NEAREST): ties to even
    return q, (amax / np.float32(127)).astype(np.float16).astype(np.float32)


def test_q8_1_activations_choose_the_best_of_eight_scales():
    """Each block of 32 keeps one of the 8 candidates fp16(amax / 127 * (1 + 0.005 c)), the one (up to float
    order in the error sums) whose quants rint(x / d) reproduce the block best; never worse than llama.cpp's
    rule; s = d * sum(q). Zero blocks and blocks too small for a normal fp16 scale get llama.cpp's rule."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 512)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[1, 32:64] = 0  # an all-zero block
    x[2, :32] = np.r_[127.0, np.arange(-15, 16) + 0.5]  # exact half-integers under llama.cpp's scale
    x[3, 64:96] *= np.float32(1e-5) / np.abs(x[3, 64:96]).max()  # amax 1e-5: scale below fp16's normal range
    x[4] = rng.standard_t(3, 512).astype(np.float32)
    qx = Q.quantize_activations(x, T.Q4_1)
    d, s, qs, sums = qx.arrays
    xb = x.reshape(-1, 32)
    db, qb = d.reshape(-1), qs.reshape(-1, 32).astype(np.float64)
    amax = np.abs(xb).max(-1)
    cand = ((amax / np.float32(127))[:, None] * STEPS).astype(np.float16).astype(np.float32)
    searched = (amax / 127 >= 6.2e-5) & (amax != 0)
    assert searched.sum() == len(xb) - 2
    # the quants are those of the stored scale, and s and sums follow them
    with np.errstate(divide="ignore"):
        want_q = np.rint(xb * (np.float32(1) / db)[:, None])
    np.testing.assert_array_equal(qb[searched], want_q[searched])
    np.testing.assert_array_equal(sums.reshape(-1), qb.sum(-1).astype(np.int32))
    np.testing.assert_array_equal(s.reshape(-1), db * qb.sum(-1).astype(np.float32))
    assert np.abs(qb).max() <= 127
    # the stored scale is the best candidate, and no worse than llama.cpp's rule
    errs = _block_errors(xb[searched], cand[searched])
    ours = _block_errors(xb[searched], db[searched, None])[:, 0]
    assert all(db[i] in cand[i] for i in np.flatnonzero(searched))
    np.testing.assert_array_less(ours, errs.min(-1) * (1 + 1e-5) + 1e-30)
    q_ll, d_ll = _q8_1_llamacpp(xb)
    ll_err = ((xb.astype(np.float64) - q_ll * d_ll[:, None]) ** 2).sum(-1)
    np.testing.assert_array_less(ours, ll_err[searched] * (1 + 1e-5) + 1e-30)
    assert ours.sum() < 0.93 * ll_err[searched].sum()  # 10-16 % less on Gaussian / t(3) values
    # the blocks outside the search: llama.cpp's quants and scale
    np.testing.assert_array_equal(qb[~searched], q_ll[~searched])
    np.testing.assert_array_equal(db[~searched], d_ll[~searched])


def test_q8_1_activations_keep_ties_to_even():
    """A block whose best scale is amax / 127 = 1 (its other values integers, exact only at that scale) rounds
    its half-integer to even, as llama.cpp's x86 build does (gguf-py's Q8_0 rounds it away from zero)."""
    t = np.arange(32, dtype=np.float32)[None, :] - 15
    t[0, 0], t[0, 1] = 127.0, 2.5
    qx = Q.quantize_activations(t, T.Q8_0)
    assert qx.arrays[0][0, 0] == 1.0 and qx.arrays[2][0, 1] == 2
    assert gguf_quantize(t, T.Q8_0)[0, 3].view(np.int8) == 3


def test_q8_k_activations_choose_the_best_of_eight_scales():
    """Each block of 256 keeps one of llama.cpp's quantize_row_q8_K_ref inverse scales iscale = -127 / max over
    (1 + 0.005 c) (max the first value of largest magnitude, with its sign), the one whose quants
    min(127, rint(iscale * x)) reproduce the block best; d = 1 / iscale; bsums the quants' sums per 16 / 32."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 768)) * 3).astype(np.float32)
    x[0, 256:512] = 0
    x[1, 7], x[1, 9] = 40.0, -40.0  # tie in magnitude: the first one sets the sign
    x[2, 512:] = rng.standard_t(3, 256).astype(np.float32)
    qx = Q.quantize_activations(x, T.Q6_K)
    qu, d, b16, b32, qs = qx.arrays
    xb = x.reshape(-1, 256)
    db, qb = d.reshape(-1), qs.reshape(-1, 256)
    imax = np.abs(xb).argmax(-1)  # first element of largest magnitude, as the C loop's strict '>'
    vmax = np.take_along_axis(xb, imax[:, None], -1)[:, 0]
    nz = vmax != 0
    assert db[~nz].tolist() == [0.0] and not qb[~nz].any()
    iscale = np.float32(-127) / vmax[nz]
    inv = (iscale[:, None] / STEPS).astype(np.float32)
    cand = np.float32(1) / inv
    chosen = np.array([np.flatnonzero(cand[i] == db[nz][i]) for i in range(nz.sum())], dtype=object)
    assert all(len(c) >= 1 for c in chosen)
    best_inv = np.array([inv[i, c[0]] for i, c in enumerate(chosen)], np.float32)
    np.testing.assert_array_equal(qb[nz], np.minimum(127, np.rint(best_inv[:, None] * xb[nz])))
    assert np.all(np.sign(db[nz]) == -np.sign(vmax[nz]))  # llama.cpp's sign convention
    errs = _block_errors(xb[nz], cand)
    ours = _block_errors(xb[nz], db[nz, None])[:, 0]
    np.testing.assert_array_less(ours, errs.min(-1) * (1 + 1e-5) + 1e-30)
    np.testing.assert_array_less(ours, errs[:, 0] * (1 + 1e-5))  # c = 0 is llama.cpp's own scale
    np.testing.assert_array_equal(qu.astype(np.int32) - 128, qs)
    np.testing.assert_array_equal(b16, qs.astype(np.int32).reshape(3, -1, 16).sum(-1))
    np.testing.assert_array_equal(b32, b16.reshape(3, -1, 2).sum(-1))


def test_sixteen_lane_scale_search_picks_the_eight_lane_choice():
    """dot._best_scale_z (AVX-512's search: lane 4c + k is chain k of candidate c) returns the candidate
    _best_scale_v (8 lanes, four chains) does, on blocks of 32 and 256 values of several shapes, near-ties included
    (values on a grid, where candidates' errors come close). LLVM compiles the 16-lane code on any x86 CPU."""
    from ggufrun.quants import dot

    @numba.njit(**{k: v for k, v in dot.EXACT.items() if k != "cache"})
    def both(x, n, out):
        for m in range(x.shape[0]):
            amax = np.float32(0.0)
            for j in range(n):
                amax = max(amax, abs(x[m, j]))
            cand, inverse, rel = dot._candidates(amax / np.float32(127.0))
            out[m, 0] = dot._best_scale_v(x, m, 0, n, inverse, rel)
            out[m, 1] = dot._best_scale_z(x, m, 0, n, inverse, rel)

    rng = np.random.default_rng(12)
    for n in (32, 256):
        x = np.concatenate([rng.standard_normal((200, n)), rng.standard_t(3, (200, n)) * 5,
                            rng.integers(-8, 9, (200, n)) * 0.125, rng.uniform(-1, 1, (200, n)) * 1e3])  # fmt: skip
        got = np.zeros((x.shape[0], 2), np.int64)
        both(x.astype(np.float32), n, got)
        assert len(set(got[:, 0].tolist())) > 1  # the search does choose among the candidates
        np.testing.assert_array_equal(got[:, 1], got[:, 0])


def test_activation_quantizers_take_non_finite_values():
    """inf / NaN in a block (which then keeps llama.cpp's rule, no search): no crash, and every other block of the
    rows quantized exactly as without it."""
    rng = np.random.default_rng(8)
    clean = rng.standard_normal((2, 512)).astype(np.float32)
    x = clean.copy()
    x[0, 3], x[1, 300] = np.inf, np.nan  # Q8_1 blocks (0, 0) and (1, 9); Q8_K blocks (0, 0) and (1, 1)
    for qtype, blk in ((T.Q8_0, 32), (T.Q4_K, 256)):
        got, want = Q.quantize_activations(x, qtype), Q.quantize_activations(clean, qtype)
        hit = np.zeros((2, 512 // blk), bool)
        hit[0, 3 // blk] = hit[1, 300 // blk] = True
        for a, b in zip(got.arrays, want.arrays):  # [2, n]: n // (512 // blk) elements a block
            keep = np.repeat(~hit, a.shape[1] * blk // 512, axis=1)
            assert np.array_equal(a[keep], b[keep]), qtype.name


def test_float_weights_take_the_activations_as_they_are():
    """F32 / F16 / BF16 weights multiply float32 activations unrounded (llama.cpp rounds them to F16 / BF16)."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 100)) * 1e3).astype(np.float32)
    for qtype in (T.F32, T.F16, T.BF16):
        assert Q.REGISTRY[qtype].act == "F32"
        assert Q.quantize_activations(x, qtype).arrays[0] is x


@pytest.mark.parametrize("fmt", ["Q8_1", "Q8_K"])
def test_parallel_quantizers_give_the_same_arrays(fmt):
    """ACTIVATIONS[fmt].quantize_rows (prefill's, rows shared among the threads) fills the arrays quantize does, for
    row counts around its work items (zero rows and huge values included)."""
    rng = np.random.default_rng(11)
    f = Q.ACTIVATIONS[fmt]
    for m in (2, 7, 8, 9, 33):
        x = (rng.standard_normal((m, 512)) * rng.choice([1e-3, 1.0, 3e4], (m, 1))).astype(np.float32)
        x[1] = 0.0
        want, got = f.empty(m, 512), f.empty(m, 512)
        f.quantize(x, *want)
        f.quantize_rows(x, *got)
        for a, b in zip(want, got):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), (fmt, m)


def test_q8_1_rows_give_decodes_bits_block_by_block():
    """The multi-row Q8_1 quantizer (on AVX-512 the search with a block in each lane, dot._quantize_q8_1_lanes, for
    work items of 16 blocks or more: the last 16 overlapping, blocks running on into the next row) gives the arrays
    decode's quantizer gives, bit for bit: near-ties (values on a grid), heavy tails, blocks whose amax / 127 falls
    outside fp16's normal range on either side (llama.cpp's rule), zero blocks and inf / NaN."""
    from ggufrun.quants import dot

    rng = np.random.default_rng(21)
    f = Q.ACTIVATIONS["Q8_1"]
    scales = np.array([1e-7, 7.8e-3, 7.9e-3, 1.0, 3e4, 8e6, 1e9], np.float32)  # amax / 127 around 6.2e-5 and 63000
    for k in (96, 160, 576, 1536):
        for m in (2, 5, 9, 33):
            x = np.concatenate([rng.standard_normal((m, k // 2)), rng.integers(-8, 9, (m, k // 2)) * 0.125], axis=1)
            x *= rng.choice(scales, (m, k // 32)).repeat(32, axis=1)
            x[m // 2, :32] = 0.0
            x[-1, rng.integers(0, k, 3)] = [np.inf, -np.inf, np.nan]
            x = (x * rng.standard_t(3, (m, k)) ** 2 if k == 160 else x).astype(np.float32)
            want, got = f.empty(m, k), f.empty(m, k)
            dot.quantize_q8_1(x, *want)
            dot._quantize_q8_1_rows(x, *got, 0, m)  # one work item: every block of the m rows
            for a, b in zip(want, got):
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), (k, m, a.dtype)


def test_quantize_activations_errors_and_reuse():
    x = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError, match="K divisible by 256"):
        Q.quantize_activations(np.ones(96, np.float32), T.Q4_K)
    a = Q.quantize_activations(x, T.Q4_0)
    b = Q.quantize_activations(x * 2, T.Q5_0, out=a)
    assert b is a and a.format == "Q8_1"
    with pytest.raises(ValueError, match="Q8_K"):
        Q.quantize_activations(x, T.Q4_K, out=a)
    with pytest.raises(ValueError, match="take Q8_K activations"):
        Q.matmul_q(random_weights(T.Q4_K, 2, 256, np.random.default_rng(0)), T.Q4_K, a)


# ---- matvec / matmul --------------------------------------------------------------------------------------


def _dequantized_activations(qx: Q.QuantizedActivations) -> np.ndarray:
    """The float64 values the kernels multiply: (quant) * d per block, or the rounded floats."""
    if qx.format not in ("Q8_1", "Q8_K"):
        return qx.arrays[0].astype(np.float64)
    d, qs = (qx.arrays[0], qx.arrays[2]) if qx.format == "Q8_1" else (qx.arrays[1], qx.arrays[4])
    blk = qx.K // d.shape[1]
    q = qs.astype(np.float64).reshape(qx.M, -1, blk)
    return (q * d.astype(np.float64)[..., None]).reshape(qx.M, qx.K)


def _activation_error_bound(W: np.ndarray, x: np.ndarray, qtype: T) -> np.ndarray:
    """Worst case |W @ x_quantized - W @ x| per output, [M, N].

    8-bit blocks: a value of block b is rounded to a multiple of its step, at most amax_b / 127 * 1.035 (the
    largest candidate scale; Q8_1 rounds it to fp16, 2^-11 relative), so it moves by at most half a step; the
    blocks that keep llama.cpp's rule move by amax_b / 254 plus the fp16 error of their step (2^-11, times
    |q| <= 127). Summed with |W|: bound_n = sum_k |W_nk| * amax_b(k) * (1.035 / 254 + 2^-11). Float weights
    take x as it is. Plus float32 accumulation slack.
    """
    fmt = Q.REGISTRY[qtype].act
    absW = np.abs(W)
    if fmt in ("Q8_1", "Q8_K"):
        blk = 32 if fmt == "Q8_1" else 256
        amax = np.abs(x).reshape(x.shape[0], -1, blk).max(-1)
        per_value = np.repeat(amax, blk, axis=1) * (1.035 / 254 + 2.0**-11)
    else:
        per_value = np.zeros_like(x)
    slack = 1e-5 * (np.abs(x) @ absW.T) + 1e-6
    return per_value @ absW.T + slack


CASES = [
    # (N, K, M): N not a multiple of the thread count or of the row chunk; M = 1, 3, 129 hit the 4-row
    # microkernel and its 1-row tail; K = 512 is two super-blocks / sixteen 32-blocks
    (37, 512, 1),
    (37, 512, 3),
    (21, 512, 129),
]


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids(ALL_TYPES))
def test_matvec_matmul_against_float64(qtype):
    rng = np.random.default_rng(7)
    for N, K, M in CASES:
        w = random_weights(qtype, N, K, rng)
        W = Q.dequantize(w, qtype).astype(np.float64)
        x = rng.standard_normal((M, K)).astype(np.float32)
        x[:, : K // 4] *= 10  # blocks of different magnitudes
        qx = Q.quantize_activations(x, qtype)
        Y = Q.matmul(w, qtype, x) if M > 1 else Q.matvec(w, qtype, x[0])[None, :]
        scale = np.abs(_dequantized_activations(qx)) @ np.abs(W).T + 1e-30

        # tight: the same quantized activations in float64; only float32 rounding differs
        exact = _dequantized_activations(qx) @ W.T
        err = np.abs(Y - exact)
        assert np.all(err <= 2e-6 * scale + 1e-30), (qtype.name, N, K, M, err.max())

        # against the float activations: within what the activation rounding explains, and not trivially
        ref = x.astype(np.float64) @ W.T
        bound = _activation_error_bound(W, x.astype(np.float64), qtype)
        assert np.all(np.abs(Y - ref) <= bound), (qtype.name, N, K, M)
        assert np.abs(Y - ref).mean() < 0.05 * np.abs(ref).mean() + 1e-6


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=_ids(ALL_TYPES))
def test_matmul_rows_equal_matvec_bit_for_bit(qtype):
    """Batch invariance: a row's product is the same bits whatever M is and wherever the row falls (4-row
    microkernel, its 1-row tail, another activation tile) and whatever the thread count."""
    rng = np.random.default_rng(8)
    N, K = 45, 512  # K = 512: two super-blocks; the activation tile is 64 rows
    w = random_weights(qtype, N, K, rng)
    x = rng.standard_normal((70, K)).astype(np.float32)
    x[:, :100] *= 10
    rows = np.stack([Q.matvec(w, qtype, x[m]) for m in range(70)])
    for M in (1, 2, 3, 4, 5, 7, 8, 70):
        assert_bit_exact(Q.matmul(w, qtype, x[:M]), rows[:M])
    assert_bit_exact(Q.matmul(w, qtype, x[3:9]), rows[3:9])
    qx = Q.quantize_activations(x[5], qtype)
    assert_bit_exact(Q.matvec_q(w, qtype, qx), rows[5])
    with _ThreadCount(1):
        y1 = Q.matmul(w, qtype, x[:9])
    with _ThreadCount(min(2, numba.config.NUMBA_NUM_THREADS)):
        assert_bit_exact(Q.matmul(w, qtype, x[:9]), y1)


K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS]


@pytest.mark.parametrize("qtype", K_QUANTS, ids=_ids(K_QUANTS))
def test_k_quant_row_in_a_group_of_8_or_alone_same_bits(qtype):
    """Decode computes K-quant weight rows of ROWK8_MIN_K values or more 8 at a time (lane r = row r, the rows'
    integer sums folded into one vector) and the rows outside a group of 8 one at a time: the same row gives the
    same bits either way, whatever the activations (large and tiny magnitudes, an all-zero super-block)."""
    rng = np.random.default_rng(11)
    N, K = 29, max(768, -(-Q.dot.ROWK8_MIN_K // 256) * 256)
    w = random_weights(qtype, N, K, rng)
    x = rng.standard_normal(K).astype(np.float32)
    x[:256] *= 1000.0
    x[256:512] = 0.0
    x[512:] *= 1e-3
    qx = Q.quantize_activations(x, qtype)
    full = Q.matvec_q(w, qtype, qx)
    W = Q.dequantize(w, qtype).astype(np.float64)
    xq = _dequantized_activations(qx)[0]
    assert np.all(np.abs(full - W @ xq) <= 2e-6 * (np.abs(W) @ np.abs(xq)) + 1e-30)
    for start in (1, 3, 5, 8, 21):  # shift rows between the groups of 8 and the per-row tail
        assert_bit_exact(Q.matvec_q(np.ascontiguousarray(w[start:]), qtype, qx), full[start:])
    y = Q.matmul_q(w, qtype, Q.quantize_activations(np.stack([x] * 5), qtype))  # rows 0-3 4 at a time, row 4 alone
    assert_bit_exact(y, np.stack([full] * 5))


def test_matmul_q_shares_activations_across_types():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    qx = Q.quantize_activations(x, T.Q4_0)
    for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL):
        w = random_weights(t, 5, 256, rng)
        np.testing.assert_array_equal(Q.matmul_q(w, t, qx), Q.matmul(w, t, x))


def test_matmul_dequant_strategy_matches_float_product():
    rng = np.random.default_rng(10)
    w = random_weights(T.Q4_K, 300, 512, rng)
    x = rng.standard_normal((9, 512)).astype(np.float32)
    W = Q.dequantize(w, T.Q4_K).astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    np.testing.assert_allclose(Q.matmul_dequant(w, T.Q4_K, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_out_arguments_and_shape_errors():
    rng = np.random.default_rng(11)
    w = random_weights(T.Q8_0, 8, 64, rng)
    x = rng.standard_normal(64).astype(np.float32)
    out = np.empty(8, np.float32)
    assert Q.matvec(w, T.Q8_0, x, out) is out
    with pytest.raises(ValueError, match="shape"):
        Q.matvec(w, T.Q8_0, x, np.empty(9, np.float32))
    with pytest.raises(ValueError, match="K=96"):
        Q.matvec(w, T.Q8_0, np.ones(96, np.float32))
    with pytest.raises(ValueError, match="whole 34-byte blocks"):
        Q.matvec(w[:, :40], T.Q8_0, x)


WARM_TYPES = "Q8_0,F16"
WARMUP_CODE = """
import sys
from gguf import GGMLQuantizationType as T
from ggufrun import quants
print(quants.warmup([T[n] for n in sys.argv[1].split(",")]))
"""
# A model's first calls: read-only weights (as the reader's mmap views), every entry point warmup promises.
FORWARD_CODE = """
import sys
import numba
import numpy as np
from numba.core.event import install_recorder
from gguf import GGMLQuantizationType as T
from ggufrun import quants
with install_recorder("numba:compile") as rec:
    for name in sys.argv[1].split(","):
        e = quants.REGISTRY[T[name]]
        w = np.zeros((3, 256 // e.block_size * e.type_size), np.uint8).view(e.weight_dtype)
        w.setflags(write=False)
        quants.get_rows(w, e.qtype, [2, 0])
        quants.matvec(w, e.qtype, np.ones(256, np.float32))
        quants.matmul(w, e.qtype, np.ones((5, 256), np.float32))
with install_recorder("numba:compile") as control:  # a function no cache holds: the recorder does see compiles
    numba.njit(lambda v: v + 1)(1)
print(len(rec.buffer), len(control.buffer))
"""


def _run_python(code: str, cache_dir, *args: str) -> str:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def test_warmup_leaves_every_kernel_in_the_cache(tmp_path):
    """warmup in one process; a second process runs get_rows / matvec / matmul without compiling anything."""
    cache = tmp_path / "numba-cache"
    assert float(_run_python(WARMUP_CODE, cache, WARM_TYPES)) > 0.0
    assert _run_python(FORWARD_CODE, cache, WARM_TYPES) == "0 2"
