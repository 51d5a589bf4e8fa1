"""Weights repacked at load into layouts the dot kernels read faster: Q4_0, Q4_1 and Q5_0 with 8 rows interleaved.

    w8, dot = repack(w, qtype)   # w [N, row_bytes] uint8 blocks, N % 8 == 0 -> a new array and its kernel,
                                 # or None when qtype has no interleaved layout (or N % 8 != 0)
    dot(w8, *qx.arrays, out)     # the same activation arrays and the same out[m, n] bits as REGISTRY[qtype].dot

Layout (ggufrun.quants.dot section 4, `_rows_x8`): row group g (rows 8g..8g+7) is one row of the new array; per
32-value block: the 8 rows' d (8 halves), for Q4_1 their m (8 halves), for Q5_0 a 32-byte plane of the fifth bits
(bit j of byte 4r + k: the fifth bit of the value that code vector j holds at that byte, see below), then 4 chunks of
32 bytes, chunk c holding bytes 4c..4c+3 of each row's 16 nibble bytes (row r at bytes 4r..4r+3): code vector 2c is
their low nibbles (values 4c..4c+3), 2c + 1 their high nibbles (values 16+4c..16+4c+3). llama.cpp repacks Q4_0
the same way for its AVX2 / NEON GEMM kernels (ggml-cpu/repack.cpp, block_q4_0x8 with 8-byte groups; ggufrun uses
4-byte groups, one dword of activations per vpmaddubsw).

The repacked copy is ordinary memory of the same size as the blocks; the model file's pages it was made from are no
longer needed by the kernels (GGUFFile.release_pages lets the OS drop them from this process).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from . import dot

# type -> (bytes of the scale fields per row and block, bytes per original block, the kernel of the new layout)
_LAYOUTS: dict[T, tuple[int, int, Callable]] = {
    T.Q4_0: (2, 18, dot.dot_q4_0_x8),
    T.Q4_1: (4, 20, dot.dot_q4_1_x8),
    T.Q5_0: (2, 22, dot.dot_q5_0_x8),  # d only among the 8-row fields; qh becomes the fifth-bit plane
}
REPACKED_TYPES = frozenset(_LAYOUTS)


def repack(w: np.ndarray, qtype: T) -> tuple[np.ndarray, Callable] | None:
    """(w in the interleaved layout, its dot kernel), or None if `qtype` has none or w has not 8k rows."""
    if qtype not in _LAYOUTS or w.ndim != 2 or w.dtype != np.uint8 or w.shape[0] % 8:
        return None
    scales, bsize, kernel = _LAYOUTS[qtype]
    n, row_bytes = w.shape
    if row_bytes % bsize:
        return None
    nb, g = row_bytes // bsize, n // 8
    blocks = w.reshape(g, 8, nb, bsize)
    out = np.empty((g, nb, 8 * bsize), np.uint8)
    for f in range(0, scales, 2):  # d (and m): field f of the 8 rows, contiguous
        out[:, :, 8 * f : 8 * f + 16] = blocks[:, :, :, f : f + 2].transpose(0, 2, 1, 3).reshape(g, nb, 16)
    at = 8 * scales
    if qtype == T.Q5_0:  # the fifth bits: plane byte 4r + k, bit j = bit 16 (j % 2) + 4 (j // 2) + k of row r's qh
        qh = blocks[:, :, :, 2:6].copy().view("<u4")[..., 0]  # [group, row, block]
        bits = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1  # [group, row, block, value]
        j = np.arange(8)
        value = 16 * (j % 2)[:, None] + 4 * (j // 2)[:, None] + np.arange(4)[None, :]  # [j, k]
        plane = (bits[..., value] << j[:, None].astype(np.uint32)).sum(axis=3)  # [group, row, block, k]
        out[:, :, at : at + 32] = plane.transpose(0, 2, 1, 3).reshape(g, nb, 32).astype(np.uint8)
        at, scales = at + 32, 6
    qs = blocks[:, :, :, scales:].reshape(g, 8, nb, 4, 4)  # [group, row, block, chunk, byte]
    out[:, :, at:] = qs.transpose(0, 2, 3, 1, 4).reshape(g, nb, 128)
    return out.reshape(g, nb * bsize * 8), kernel
