"""The grid weight types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) beyond what tests/test_quants.py checks for
every type (random and hand-built blocks vs gguf-py, get_rows, products vs float64, batch invariance):

- the code books and sign table, in both copies (dequant.py and dot.py), equal gguf-py's (which builds them
  from its own transcription of llama.cpp's ggml-common.h);
- every code book entry and every sign index / sign byte dequantizes as gguf-py does (random blocks reach only
  some of the 1024 IQ2_S entries);
- the products at their integer limits: the largest entries, the largest scales and +-127 activation quants
  lined up with the weights' signs, where an int16 pair sum (AVX2's vpmaddubsw saturates) or a 16-bit scale
  product would overflow if the kernels' bounds were wrong;
- real quantizer output: the golden small-llama-<type>.gguf files (llama-quantize) go through
  test_quants.py's test_dequantize_golden_files and tests/test_model_golden.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq
from test_quants import assert_bit_exact, reference_dequantize

import ggufrun.quants as Q
from ggufrun.quants import dequant as dq
from ggufrun.quants import dot

GRID_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]
# gguf-py's class and our table's name
CODE_BOOKS = {
    T.IQ2_XXS: (gq.IQ2_XXS, "IQ2XXS_GRID"),
    T.IQ2_XS: (gq.IQ2_XS, "IQ2XS_GRID"),
    T.IQ2_S: (gq.IQ2_S, "IQ2S_GRID"),
    T.IQ3_XXS: (gq.IQ3_XXS, "IQ3XXS_GRID"),
    T.IQ3_S: (gq.IQ3_S, "IQ3S_GRID"),
}


def _d(value: float) -> np.ndarray:
    return np.array([value], np.float16).view(np.uint8)


@pytest.mark.parametrize("qtype", GRID_TYPES, ids=[t.name for t in GRID_TYPES])
def test_code_books_match_gguf_py(qtype):
    cls, name = CODE_BOOKS[qtype]
    cls.init_grid()
    ref = np.asarray(cls.grid, np.float32).reshape(getattr(dq, name).shape)
    for table in (getattr(dq, name), getattr(dot, name)):
        assert table.dtype == np.uint8 and table.flags.c_contiguous
        np.testing.assert_array_equal(table.astype(np.float32), ref)
    assert len(np.unique(getattr(dq, name), axis=0)) == len(ref)  # no entry twice: every one reachable


def test_sign_table_matches_gguf_py():
    ref = np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8)
    np.testing.assert_array_equal(dq.KSIGNS, ref)
    np.testing.assert_array_equal(dot.KSIGNS, ref)
    assert all(bin(int(v)).count("1") % 2 == 0 for v in ref)  # an even number of negative values per 8
    bits = (ref[:, None] >> np.arange(8)) & 1
    np.testing.assert_array_equal(dot.KSIGNS_PM1.view(np.int8), np.where(bits, -1, 1))  # the kernels' +-1 form


def _every_entry_blocks(qtype: T) -> np.ndarray:
    """Blocks [n, type_size] whose entries run through the whole code book, with every sign index / sign byte
    and every scale nibble somewhere, and d = 1 or -0.5."""
    e = Q.REGISTRY[qtype]
    rng = np.random.default_rng(int(qtype))
    n_entries = getattr(dq, CODE_BOOKS[qtype][1]).shape[0]
    per_block = 32 if qtype in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S) else 64  # entries per 256 values
    n_blocks = max(n_entries // per_block, 4)
    entries = np.resize(np.arange(n_entries), (n_blocks, per_block))
    blocks = rng.integers(0, 256, (n_blocks, e.type_size), dtype=np.uint8)
    blocks[:, :2] = np.where(np.arange(n_blocks)[:, None] % 2, _d(-0.5), _d(1.0))
    signs7 = np.resize(np.arange(128), (n_blocks, 32))  # IQ2_XXS / IQ2_XS / IQ3_XXS: 7-bit sign indices
    scales = np.resize(np.arange(16), (n_blocks, 32))
    if qtype == T.IQ2_XXS:  # per 32 values: 4 entry bytes, uint32 of 4 x 7 sign bits + 4-bit scale
        aux = sum(signs7[:, k::4][:, :8].astype(np.uint32) << (7 * k) for k in range(4)) | (
            scales[:, :8].astype(np.uint32) << 28
        )
        qs = np.concatenate(
            [entries.reshape(n_blocks, 8, 4).astype(np.uint8), aux.view(np.uint8).reshape(-1, 8, 4)], -1
        )
        blocks[:, 2:66] = qs.reshape(n_blocks, 64)
    elif qtype == T.IQ2_XS:  # 32 uint16: 9-bit entry | 7-bit sign index << 9; 8 scale bytes
        q = (entries | (signs7 << 9)).astype(np.uint16)
        blocks[:, 2:66] = q.view(np.uint8)
        blocks[:, 66:74] = scales[:, :8] | (scales[:, 8:16] << 4)
    elif qtype == T.IQ2_S:  # qs low bytes, sign bytes, 2 high bits per entry in qh, scales
        blocks[:, 2:34] = entries & 255
        blocks[:, 34:66] = np.resize(np.arange(256), (n_blocks, 32))
        hi = (entries >> 8).reshape(n_blocks, 8, 4)
        blocks[:, 66:74] = sum(hi[..., k] << (2 * k) for k in range(4))
        blocks[:, 74:82] = scales[:, :8] | (scales[:, 8:16] << 4)
    elif qtype == T.IQ3_XXS:  # 64 entry bytes, then per 32 values 4 x 7 sign bits + 4-bit scale
        blocks[:, 2:66] = entries
        aux = sum(signs7[:, k::4][:, :8].astype(np.uint32) << (7 * k) for k in range(4)) | (
            scales[:, :8].astype(np.uint32) << 28
        )
        blocks[:, 66:98] = aux.view(np.uint8)
    else:  # IQ3_S: 64 entry low bytes, 9th bits in qh, sign bytes, 4 scale bytes
        blocks[:, 2:66] = entries & 255
        hi = (entries >> 8).reshape(n_blocks, 8, 8)
        blocks[:, 66:74] = sum(hi[..., k] << k for k in range(8))
        blocks[:, 74:106] = np.resize(np.arange(256), (n_blocks, 32))
        blocks[:, 106:110] = scales[:, :4] | (scales[:, 4:8] << 4)
    return blocks


@pytest.mark.parametrize("qtype", GRID_TYPES, ids=[t.name for t in GRID_TYPES])
def test_dequantize_every_entry_and_sign(qtype):
    blocks = _every_entry_blocks(qtype)
    ref = reference_dequantize(blocks, qtype)
    assert_bit_exact(Q.dequantize(blocks, qtype), ref)
    # the construction reaches what it claims: many distinct magnitudes, both signs
    assert len(np.unique(np.abs(ref))) > 40
    assert (ref < 0).any() and (ref > 0).any()


def _extreme_row(qtype: T) -> np.ndarray:
    """One row of 2 super-blocks whose entries all have the largest value sum and whose scales are all 15."""
    e = Q.REGISTRY[qtype]
    grid = getattr(dq, CODE_BOOKS[qtype][1])
    top = int(np.argmax(grid.astype(np.int32).sum(1)))
    blocks = _every_entry_blocks(qtype)[:2].copy()
    blocks[:, :2] = _d(1.0)
    if qtype == T.IQ2_XXS:
        qs = blocks[:, 2:66].reshape(2, 8, 8)
        qs[:, :, :4] = top
        qs[:, :, 7] |= 0xF0
    elif qtype == T.IQ2_XS:
        q = blocks[:, 2:66].copy().view(np.uint16)
        blocks[:, 2:66] = ((q & ~np.uint16(511)) | top).view(np.uint8)
        blocks[:, 66:74] = 0xFF
    elif qtype == T.IQ2_S:
        blocks[:, 2:34] = top & 255
        blocks[:, 66:74] = sum((top >> 8) << (2 * k) for k in range(4))
        blocks[:, 74:82] = 0xFF
    elif qtype == T.IQ3_XXS:
        blocks[:, 2:66] = top
        blocks[:, 66:98].reshape(2, 8, 4)[:, :, 3] |= 0xF0
    else:
        blocks[:, 2:66] = top & 255
        blocks[:, 66:74] = 0xFF if top >> 8 else 0
        blocks[:, 106:110] = 0xFF
    assert e.type_size == blocks.shape[1]
    return blocks.reshape(1, -1)


@pytest.mark.parametrize("qtype", GRID_TYPES, ids=[t.name for t in GRID_TYPES])
def test_products_at_the_integer_limits(qtype):
    w = np.repeat(_extreme_row(qtype), 9, axis=0)  # 9 rows: a group of 8 and a rest
    W = Q.dequantize(w, qtype).astype(np.float64)
    # activations whose quants are +-127 with the weights' signs: every product at its largest, all adding up
    x = np.where(W[:1] < 0, -1.0, 1.0).astype(np.float32) * np.float32(3.0)
    x = np.concatenate([x, -x, x * 0.5])
    qx = Q.quantize_activations(x, qtype)
    assert np.abs(qx.arrays[4]).max() == 127
    xq = (qx.arrays[4].astype(np.float64).reshape(3, -1, 256) * qx.arrays[1][..., None]).reshape(3, -1)
    exact = xq @ W.T
    Y = Q.matmul(w, qtype, x)
    np.testing.assert_allclose(Y, exact, rtol=2e-6)
    for m in range(3):
        assert_bit_exact(Q.matvec(w, qtype, x[m]), Y[m])
    np.testing.assert_allclose(exact[0], np.abs(W) @ np.abs(xq[0]))  # every product positive: no cancellation
