"""Weights repacked at load into layouts the dot kernels read faster: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K
(and IQ4_XS and IQ4_NL on CPUs with AVX-512, whose kernels for them are written for AVX-512 only) with 8 rows
interleaved.

    w8, dot = repack(w, qtype)   # w [N, row_bytes] uint8 blocks, N % 8 == 0 -> a new array and its kernel,
                                 # or None when qtype has no interleaved layout (or N % 8 != 0)
    dot(w8, *qx.arrays, out)     # the same activation arrays and the same out[m, n] bits as REGISTRY[qtype].dot
    ONE_ROW[dot](w8, ...)        # the same again, one activation row at a time (decode's kernel)
    STREAM_ROW[dot](w8, ...)     # the same again, for a model larger than the CPU's cache: one stream a thread
    EXPERTS[dot](w8, ..., sel, shared)   # a decode step's chosen experts of a stack (EXPERTS_STREAM: from DRAM)

Layout (ggufrun.quants.dot section 4, `_rows_x8`): row group g (rows 8g..8g+7) is one row of the new array; per
32-value block: the 8 rows' d (8 halves), for Q4_1 their m (8 halves), for Q5_0 a 32-byte plane of the fifth bits
(bit j of byte 4r + k: the fifth bit of the value that code vector j holds at that byte, see below), then 4 chunks of
32 bytes, chunk c holding bytes 4c..4c+3 of each row's 16 nibble bytes (row r at bytes 4r..4r+3): code vector 2c is
their low nibbles (values 4c..4c+3), 2c + 1 their high nibbles (values 16+4c..16+4c+3). llama.cpp repacks Q4_0
the same way for its AVX2 / NEON GEMM kernels (ggml-cpu/repack.cpp, block_q4_0x8 with 8-byte groups; ggufrun uses
4-byte groups, one dword of activations per vpmaddubsw). IQ4_NL's blocks are Q4_0's bytes (d, 16 bytes of nibbles,
looked up in the code book by the kernels) and take Q4_0's layout.

Q4_K, Q5_K and Q6_K (ggufrun.quants.dot, `_rowsk_x8`), per 256-value super-block of the 8 rows: their d (8 halves),
Q4_K's dmin (8 halves), the integer scales as bytes in pairs of sub-blocks ([pair][row][2]; Q4_K: the 8 scales, then
the 8 mins, unpacked from their 12 bytes of 6-bit fields, 1184 bytes per super-block instead of 8 x 144; Q6_K: its 16
int8 scales, moved), then the codes in chunks of 32 bytes, 4 bytes of each row: Q4_K: per 64-value group (32 bytes of
qs per row) its 8 chunks, low nibbles values 4c.. of the group, high nibbles 32 + 4c..; Q6_K: per 128-value half, 8
chunks of ql bytes 0-31 of the half, 8 of ql bytes 32-63, 8 of qh (1680 bytes, the same as 8 x 210). Q5_K: Q4_K's
fields (its 12 bytes of scales and mins are Q4_K's), then per 64-value group and half of it a 32-byte plane of the
fifth bits (as Q5_0's, from qh) before its 4 code chunks (1440 bytes against 8 x 176). IQ4_XS: d (8 halves), the 8
sub-block scales minus 32 as int8 in pairs ([pair][row][2]), then per 32-value sub-block 4 chunks of its nibble bytes
as the 32-value types' (1104 bytes against 8 x 136).

The repacked copy is ordinary memory of the same size as the blocks (Q4_K: 2.8% more, its scales unpacked); the model
file's pages it was made from are no longer needed by the kernels (GGUFFile.release_pages lets the OS drop them from
this process).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from gguf import GGMLQuantizationType as T

from . import dot
from . import get_rows as get_rows_file_layout

# type -> (bytes of the scale fields per row and block, bytes per original block, the kernel of the new layout)
_LAYOUTS: dict[T, tuple[int, int, Callable]] = {
    T.Q4_0: (2, 18, dot.dot_q4_0_x8),
    T.Q4_1: (4, 20, dot.dot_q4_1_x8),
    T.Q5_0: (2, 22, dot.dot_q5_0_x8),  # d only among the 8-row fields; qh becomes the fifth-bit plane
    T.Q8_0: (2, 34, dot.dot_q8_0_x8),
}
# K-quants: type -> (bytes per original super-block, bytes per super-block of 8 interleaved rows, the kernel)
_K_LAYOUTS: dict[T, tuple[int, int, Callable]] = {
    T.Q4_K: (144, dot.Q4_K_X8_BYTES, dot.dot_q4_k_x8),
    T.Q5_K: (176, dot.Q5_K_X8_BYTES, dot.dot_q5_k_x8),
    T.Q6_K: (210, dot.Q6_K_X8_BYTES, dot.dot_q6_k_x8),
}
if dot.HAS_ZMM:  # IQ4_XS's and IQ4_NL's kernels on their layouts: AVX-512's batched tiles, 16-row and streaming decode
    _K_LAYOUTS[T.IQ4_XS] = (136, dot.IQ4_XS_X8_BYTES, dot.dot_iq4_xs_x8)
    _LAYOUTS[T.IQ4_NL] = (2, 18, dot.dot_iq4_nl_x8)  # Q4_0's bytes: d, then 16 bytes of nibbles
REPACKED_TYPES = frozenset(_LAYOUTS) | frozenset(_K_LAYOUTS)
# each layout's kernel -> its one-row kernel (the same bits, one activation row at a time; compiles faster)
ONE_ROW: dict[Callable, Callable] = dot.ONE_ROW
# each layout's kernel -> its one-row kernel for weights that stream from DRAM at every token (on AMD Zen 4 with
# AVX-512 one group of 8 rows at a time, a single sequential stream a thread: dot.DECODE_STREAM; else ONE_ROW's)
STREAM_ROW: dict[Callable, Callable] = dot.STREAM_ROW
# each layout's kernel -> its experts kernel (a decode step's k chosen experts of a stack in one call, each expert's
# rows the bits of the one-row kernel: ggufrun.model.linear.Experts)
EXPERTS: dict[Callable, Callable] = dot.EXPERTS
# each experts kernel -> the same for experts that stream from DRAM at every token (one group at a time where
# dot.DECODE_STREAM; else itself)
EXPERTS_STREAM: dict[Callable, Callable] = dot.EXPERTS_STREAM
# layouts that only move bytes (not Q5_0's bit plane, not Q4_K's unpacked scales): rows can be read back (get_rows)
ROW_LOOKUP_TYPES = frozenset({T.Q4_0, T.Q4_1, T.Q8_0, T.Q6_K} | ({T.IQ4_NL} & set(_LAYOUTS)))


def _blocks_of(qtype: T) -> tuple[int, int, Callable]:
    """(bytes per block of one row in the file, bytes per block of 8 interleaved rows, the layout's kernel)."""
    if qtype in _K_LAYOUTS:
        return _K_LAYOUTS[qtype]
    _, bsize, kernel = _LAYOUTS[qtype]
    return bsize, 8 * bsize, kernel


def packed_shape(w: np.ndarray, qtype: T) -> tuple[int, int] | None:
    """The shape of w [N, row_bytes] in the interleaved layout ([N / 8, bytes of 8 rows]), or None if `qtype` has
    none or w has not 8k rows of whole blocks."""
    if qtype not in REPACKED_TYPES or w.ndim != 2 or w.dtype != np.uint8 or w.shape[0] % 8:
        return None
    bsize, sbytes, _ = _blocks_of(qtype)
    return None if w.shape[1] % bsize else (w.shape[0] // 8, w.shape[1] // bsize * sbytes)


def repack(w: np.ndarray, qtype: T, release: Callable[[np.ndarray], object] | None = None, out=None):
    """(w in the interleaved layout, its dot kernel), or None if `qtype` has none or w has not 8k rows.

    release(part): called with each part of w (consecutive rows, about PART_BYTES) once it is copied, so that the
    caller can drop the pages it came from (GGUFFile.release_pages) while the rest is copied: the process then never
    holds much more than one copy of a large matrix (a 262,144-row embedding table). out: where to write it (uint8,
    C-contiguous, packed_shape(w, qtype)), e.g. rows of a larger matrix; default a new array."""
    shape = packed_shape(w, qtype)
    if shape is None:
        return None
    bsize, _, kernel = _blocks_of(qtype)
    blocks = w.reshape(w.shape[0] // 8, 8, -1, bsize)
    g = blocks.shape[0]
    if out is None:
        out = np.empty(shape, np.uint8)
    elif out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(f"repack: out must be uint8 C-contiguous {shape}, got {out.dtype} {out.shape}")
    step = max(1, PART_BYTES // max(1, 8 * w.shape[1]))  # groups per part
    cuts = list(range(0, g, step)) + [g]

    def part(k: int) -> None:
        a, b = cuts[k], cuts[k + 1]
        _interleave(blocks[a:b], qtype, out[a:b])
        if release is not None:
            release(w[8 * a : 8 * b])

    # parts on several threads (np.copyto releases the GIL; most of the time is first touches of the file's pages
    # and of the new ones), at most PARALLEL_PARTS at a time
    if len(cuts) == 2:
        part(0)
    else:
        with ThreadPoolExecutor(min(PARALLEL_PARTS, len(cuts) - 1)) as pool:
            list(pool.map(part, range(len(cuts) - 1)))
    return out, kernel


PART_BYTES = 1 << 23  # matrices are copied (and their file pages released) 8 MB at a time
PARALLEL_PARTS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _interleave(blocks: np.ndarray, qtype: T, out: np.ndarray | None = None) -> np.ndarray:
    """blocks [groups, 8 rows, blocks per row, bsize] (any dtype for the byte-moving layouts) -> out [groups, row
    bytes x 8] in the interleaved layout."""
    if qtype == T.Q4_K:
        return _interleave_q4_k(blocks, out)
    if qtype == T.Q5_K:
        return _interleave_q5_k(blocks, out)
    if qtype == T.Q6_K:
        return _interleave_q6_k(blocks, out)
    if qtype == T.IQ4_XS:
        return _interleave_iq4_xs(blocks, out)
    scales, bsize, _ = _LAYOUTS[qtype]
    g, _, nb, _ = blocks.shape
    if out is None:
        out = np.empty((g, nb * 8 * bsize), blocks.dtype)
    out = out.reshape(g, nb, 8 * bsize)  # each field copied in one strided pass (np.copyto of views)
    # d (and m): each fp16 field of the 8 rows, contiguous
    np.copyto(_words(out, 0, 8 * scales, 2, (scales // 2, 8)), _pairs(blocks[:, :, :, :scales]))
    at = 8 * scales
    if qtype == T.Q5_0:  # the fifth bits: plane byte 4r + k, bit j = bit 16 (j % 2) + 4 (j // 2) + k of row r's qh
        qh = blocks[:, :, :, 2:6].copy().view("<u4")[..., 0].transpose(0, 2, 1)  # [group, block, row]
        plane = out[:, :, at : at + 32].reshape(g, nb, 8, 4)
        for k in range(4):
            v = (qh >> np.uint32(k)) & np.uint32(0x11111111)  # bit 4i: j = 2i; bit 16 + 4i: j = 2i + 1
            v = (v | (v >> np.uint32(15))) & np.uint32(0x3333)  # bits 0, 1, 4, 5, 8, 9, 12, 13: j = 0..7
            v = (v | (v >> np.uint32(2))) & np.uint32(0x0F0F)
            plane[:, :, :, k] = v | (v >> np.uint32(4))  # uint8 assignment keeps bits 0-7
        at, scales = at + 32, 6
    chunks = (bsize - scales) // 4
    qs = _units(blocks[:, :, :, scales:], 4)  # [group, row, block, chunk] 4-byte chunks
    np.copyto(_words(out, at, 8 * bsize, 4, (chunks, 8)), qs.transpose(0, 2, 3, 1))
    return out.reshape(g, nb * bsize * 8)


def _pairs(x: np.ndarray) -> np.ndarray:
    """[g, 8 rows, nb, 2n] per-row bytes -> [g, nb, n, 8 rows] uint16: pair k of every row, row by row (an fp16
    field, or the scales of two sub-blocks), for a destination viewed by _words."""
    return _units(x, 2).transpose(0, 2, 3, 1)


def _units(x: np.ndarray, size: int) -> np.ndarray:
    """x [..., n * size] bytes (its last axis contiguous) as [..., n] units of `size` bytes, without copying: a
    strided copy of whole 2- or 4-byte units runs several times faster than one of their bytes (NumPy's inner loops
    are then over rows, not over a unit's bytes)."""
    if x.dtype == np.uint8:
        return x.view(np.uint16 if size == 2 else np.uint32)
    return x.view(np.dtype((np.void, size * x.dtype.itemsize)))  # any dtype (_row_positions traces int32 bytes)


def _words(o: np.ndarray, start: int, stop: int, size: int, shape: tuple) -> np.ndarray:
    """Bytes start..stop of each [g, nb, row bytes] super-block of o as units of `size` bytes in `shape`."""
    g, nb = o.shape[:2]
    return _units(o[:, :, start:stop], size).reshape(g, nb, *shape)


def _interleave_q4_k(blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Q4_K blocks [g, 8, nb, 144] -> [g, nb x 1184]: d, dmin, scale pairs, min pairs, code chunks (module doc)."""
    g, _, nb, _ = blocks.shape
    if out is None:
        out = np.empty((g, nb * dot.Q4_K_X8_BYTES), np.uint8)
    o = out.reshape(g, nb, dot.Q4_K_X8_BYTES)
    _k4_fields(blocks, o)
    qs = _units(blocks[:, :, :, 16:144], 4).reshape(g, 8, nb, 4, 8)  # [g, row, block, 64-value group, chunk]
    np.copyto(_words(o, 160, dot.Q4_K_X8_BYTES, 4, (4, 8, 8)), qs.transpose(0, 2, 3, 4, 1))
    return out


def _k4_fields(blocks: np.ndarray, o: np.ndarray) -> None:
    """Bytes 0-159 of each super-block of o [g, nb, bytes] from Q4_K / Q5_K blocks [g, 8, nb, >= 16] (the two types'
    first 16 bytes are the same fields): d, dmin, the 8 scale pairs and the 8 min pairs, unpacked."""
    g, _, nb, _ = blocks.shape
    np.copyto(_words(o, 0, 32, 2, (2, 8)), _pairs(blocks[:, :, :, 0:4]))  # d, dmin
    # llama.cpp's get_scale_min_k4: the 6-bit scales and mins of the 8 sub-blocks from 12 bytes, four bytes at a
    # time (the masks and shifts keep every byte's bits within it)
    q = _units(blocks[:, :, :, 4:16], 4)  # [g, row, block, 3]
    low6, high2, low4 = np.uint32(0x3F3F3F3F), np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    six, four = np.uint32(6), np.uint32(4)
    sc = np.empty((g, 8, nb, 2), np.uint32)  # bytes: the 8 scales
    mn = np.empty((g, 8, nb, 2), np.uint32)  # the 8 mins
    sc[..., 0], mn[..., 0] = q[..., 0] & low6, q[..., 1] & low6
    sc[..., 1] = (q[..., 2] & low4) | (((q[..., 0] >> six) & high2) << four)
    mn[..., 1] = ((q[..., 2] >> four) & low4) | (((q[..., 1] >> six) & high2) << four)
    np.copyto(_words(o, 32, 96, 2, (4, 8)), _pairs(sc.view(np.uint8)))
    np.copyto(_words(o, 96, 160, 2, (4, 8)), _pairs(mn.view(np.uint8)))


def _interleave_q5_k(blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Q5_K blocks [g, 8, nb, 176] -> [g, nb x 1440]: Q4_K's d, dmin, scale and min pairs (its 12 bytes of fields are
    at the same place), then per 64-value group and half its fifth-bit plane (plane byte 4r + k, bit 2c + e: bit
    2 jj + e of row r's qh byte 16 half + 4c + k, e = 0 for the low nibble's value, 1 for the high one's: llama.cpp's
    dequantize_row_q5_K) and its 4 code chunks, as Q4_K's (module doc)."""
    g, _, nb, _ = blocks.shape
    if out is None:
        out = np.empty((g, nb * dot.Q5_K_X8_BYTES), np.uint8)
    o = out.reshape(g, nb, dot.Q5_K_X8_BYTES)
    _k4_fields(blocks, o)
    parts = o[:, :, 160:].reshape(g, nb, 4, 2, 160)  # [group jj, half, 32-byte plane + 4 chunks of 32 bytes]
    qs = _units(blocks[:, :, :, 48:176], 4).reshape(g, 8, nb, 4, 2, 4)  # [g, row, block, jj, half, chunk]
    np.copyto(_units(parts[..., 32:], 4).reshape(g, nb, 4, 2, 4, 8), qs.transpose(0, 2, 3, 4, 5, 1))
    qh = np.ascontiguousarray(blocks[..., 16:48]).reshape(g, 8, nb, 2, 4, 4)  # [g, row, block, half, chunk c, k]
    for jj in range(4):
        for half in range(2):
            plane = np.zeros((g, 8, nb, 4), np.uint8)  # [g, row r, block, k]
            for c in range(4):
                for e in range(2):
                    bit = (qh[:, :, :, half, c, :] >> np.uint8(2 * jj + e)) & np.uint8(1)
                    plane |= bit << np.uint8(2 * c + e)
            parts[:, :, jj, half, :32] = plane.transpose(0, 2, 1, 3).reshape(g, nb, 32)
    return out


def _interleave_q6_k(blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Q6_K blocks [g, 8, nb, 210] (any dtype: bytes only move) -> [g, nb x 1680]: d, scale pairs, per half the
    chunks of ql's two 32-byte runs and of qh (module doc)."""
    g, _, nb, _ = blocks.shape
    if out is None:
        out = np.empty((g, nb * dot.Q6_K_X8_BYTES), blocks.dtype)
    o = out.reshape(g, nb, dot.Q6_K_X8_BYTES)
    np.copyto(_words(o, 0, 16, 2, (1, 8)), _pairs(blocks[:, :, :, 208:210]))  # d
    np.copyto(_words(o, 16, 144, 2, (8, 8)), _pairs(blocks[:, :, :, 192:208]))
    # [g, block, half, run (ql 0-31, ql 32-63, qh), chunk, row] 4-byte chunks
    codes = _words(o, 144, dot.Q6_K_X8_BYTES, 4, (2, 3, 8, 8))
    ql = _units(blocks[:, :, :, 0:128], 4).reshape(g, 8, nb, 2, 2, 8)  # [g, row, block, half, run, chunk]
    np.copyto(codes[:, :, :, 0:2], ql.transpose(0, 2, 3, 4, 5, 1))
    qh = _units(blocks[:, :, :, 128:192], 4).reshape(g, 8, nb, 2, 8)  # [g, row, block, half, chunk]
    np.copyto(codes[:, :, :, 2], qh.transpose(0, 2, 3, 4, 1))
    return out


def _interleave_iq4_xs(blocks: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """IQ4_XS blocks [g, 8, nb, 136] -> [g, nb x 1104]: d (8 halves), the 8 sub-block scales minus 32 as int8 in
    pairs ([pair][row][2], unpacked from scales_h / scales_l as llama.cpp's dequantize_row_iq4_xs reads them), then
    per 32-value sub-block its 16 nibble bytes per row in 4 chunks of 32 bytes (row r's bytes 4c..4c+3 at 4r: low
    nibbles values 4c.., high ones 16 + 4c..)."""
    g, _, nb, _ = blocks.shape
    if out is None:
        out = np.empty((g, nb * dot.IQ4_XS_X8_BYTES), np.uint8)
    o = out.reshape(g, nb, dot.IQ4_XS_X8_BYTES)
    np.copyto(_words(o, 0, 16, 2, (1, 8)), _pairs(blocks[:, :, :, 0:2]))  # d
    sh = _units(np.ascontiguousarray(blocks[:, :, :, 2:4]), 2)[..., 0].astype(np.int32)  # [g, row, block]
    sl = blocks[:, :, :, 4:8].astype(np.int32)
    sc = np.empty((g, 8, nb, 8), np.uint8)  # [g, row, block, sub-block]
    for j in range(8):
        ls = ((sl[..., j // 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
        sc[..., j] = (ls - 32).astype(np.int8).view(np.uint8)
    np.copyto(_words(o, 16, 80, 2, (4, 8)), _pairs(sc))
    qs = _units(blocks[:, :, :, 8:136], 4).reshape(g, 8, nb, 8, 4)  # [g, row, block, sub-block, chunk]
    np.copyto(_words(o, 80, dot.IQ4_XS_X8_BYTES, 4, (8, 4, 8)), qs.transpose(0, 2, 3, 4, 1))
    return out


def _row_positions(qtype: T) -> np.ndarray:
    """[8, bsize]: where byte j of row r's block sits within the 8 rows' interleaved block (ROW_LOOKUP_TYPES)."""
    bsize = _block_bytes(qtype)
    moved = _interleave(np.arange(8 * bsize, dtype=np.int32).reshape(1, 8, 1, bsize), qtype)[0]
    return np.argsort(moved).reshape(8, bsize)


def _block_bytes(qtype: T) -> int:
    return _K_LAYOUTS[qtype][0] if qtype in _K_LAYOUTS else _LAYOUTS[qtype][1]


_ROW_POSITIONS = {t: _row_positions(t) for t in ROW_LOOKUP_TYPES}  # once: get_rows runs at every forward pass


def get_rows(w8: np.ndarray, qtype: T, ids, out: np.ndarray | None = None) -> np.ndarray:
    """quants.get_rows for a matrix in the interleaved layout: rows `ids` as float32 [len(ids), K], the same values
    (each row's blocks are gathered back into the file's byte order, then dequantized by the type's kernel)."""
    if qtype not in ROW_LOOKUP_TYPES:
        raise ValueError(f"rows cannot be read back from the interleaved {qtype.name} layout")
    bsize = _block_bytes(qtype)
    rows = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    n = w8.shape[0] * 8
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise IndexError(f"row ids must be in [0, {n}), got {rows.min()}..{rows.max()}")
    nb = w8.shape[1] // (8 * bsize)
    blocks = w8[rows // 8].reshape(rows.size, nb, 8 * bsize)
    where = _ROW_POSITIONS[qtype][rows % 8][:, None, :]  # [n, 1, bsize]
    file_layout = np.take_along_axis(blocks, np.broadcast_to(where, (rows.size, nb, bsize)), axis=2)
    return get_rows_file_layout(file_layout.reshape(rows.size, nb * bsize), qtype, np.arange(rows.size), out)
