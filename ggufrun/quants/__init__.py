"""Quantized weight types: dequantization and fused quantized matrix-vector / matrix-matrix products.

Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4 (`SUPPORTED_TYPES`; one `REGISTRY` entry
per type). Weights are the raw views the reader hands out: `w` is [N, row_bytes] uint8 for quantized types, [N, K]
float32 / float16 / uint16 (BF16) for float types.

    dequantize(data, qtype) -> float32 [..., K]          whole tensor (or any run of whole blocks)
    get_rows(w, qtype, ids, out=None) -> float32 [R, K]  token-embedding gather, ids int [R]
    matvec(w, qtype, x, out=None) -> float32 [N]         y = W @ x, x float32 [K]
    matmul(w, qtype, X, out=None) -> float32 [M, N]      Y = X @ W.T, X float32 [M, K]

As llama.cpp does, the products quantize the activations to 8 bits first (Q8_1 blocks of 32 for Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4; Q8_K blocks of 256 for the K-quants, IQ4_XS, the IQ2 / IQ3 grid
types, IQ1_S, IQ1_M, TQ1_0, TQ2_0) and then run integer dot products straight from the quantized blocks; W is
never expanded to float32. Each block's scale is the one of a few candidates that reproduces its values best
(ggufrun.quants.dot, section 3), not llama.cpp's amax / 127 alone. F32 / F16 / BF16 weights multiply the float32
activations as they are (llama.cpp rounds them to F16 / BF16 first). To quantize once and reuse for several
matrices sharing an input (Q/K/V, FFN gate/up):

    qx = quantize_activations(x, qtype)       # x [K] or [M, K]; qx.format == REGISTRY[qtype].act
    matvec_q(w_q, qtype, qx, out)             # out [N]      (qx from x [K])
    matmul_q(w_q, qtype, qx, out)             # out [M, N]   (qx from X [M, K])

Any weight type with the same `REGISTRY[t].act` format can share one `qx`.

Kernels compile lazily on first use (or load from Numba's on-disk cache); `warmup(qtypes)` does it up front.
To skip the checks here: `REGISTRY[t].dot(w, *qx.arrays, out2d)` (parallel over rows; from Python only, as its
worker is linked by name when the kernel is compiled or loaded: ggufrun.quants.dot, section 5), and for Numba code
too `REGISTRY[t].dequant(w, rows, out)`, `ACTIVATIONS[REGISTRY[t].act].quantize(x2d, *qx.arrays)` (None
for F32, whose arrays are (x2d,)), and per output row `dot.row32(int(t), e.type_size, w, row_byte_offset, m,
d, s, qs, sums)` (32-value block types) / `dot.rowk(int(t), e.type_size, w, row_byte_offset, qu, m, d,
bsums16, bsums32, qs)` (K-quants, IQ4_XS) / `dot.rowiq(int(t), e.type_size, w, row_byte_offset, m, d, qs)`
(IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) / `dot.rowt(int(t), e.type_size, w, row_byte_offset, m, d, bsums16,
bsums32, qs)` (IQ1_S, IQ1_M, TQ1_0, TQ2_0), e = REGISTRY[t], the arrays those of qx.
Threads: the caller's `numba.set_num_threads`.

>>> from ggufrun.reader import GGUFFile
>>> t = GGUFFile("model.gguf").tensors["blk.0.ffn_up.weight"]
>>> y = matvec(t.data, t.type, np.ones(t.shape[-1], np.float32))
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from ..errors import GGUFError
from .registry import ACTIVATIONS, REGISTRY, SUPPORTED_TYPES, ActivationFormat, QuantType

__all__ = [
    "ACTIVATIONS",
    "ActivationFormat",
    "REGISTRY",
    "SUPPORTED_TYPES",
    "QuantType",
    "QuantizedActivations",
    "check_supported",
    "dequantize",
    "get_rows",
    "matvec",
    "matmul",
    "quantize_activations",
    "matvec_q",
    "matmul_q",
    "warmup",
]


def _type_name(qtype) -> str:
    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return f"unknown ggml type {int(qtype)}"


def check_supported(tensor_name: str, qtype) -> None:
    """Raise GGUFError if ggufrun has no kernels for `qtype` (names the tensor and the type)."""
    try:
        supported = GGMLQuantizationType(qtype) in SUPPORTED_TYPES
    except ValueError:
        supported = False
    if not supported:
        names = ", ".join(t.name for t in REGISTRY)
        raise GGUFError(
            f"tensor {tensor_name!r} has type {_type_name(qtype)}, which ggufrun does not support (supported: {names})"
        )


def _entry(qtype) -> QuantType:
    e = REGISTRY.get(qtype)
    if e is not None:
        return e
    try:
        return REGISTRY[GGMLQuantizationType(qtype)]
    except (KeyError, ValueError):
        names = ", ".join(t.name for t in REGISTRY)
        raise GGUFError(f"type {_type_name(qtype)} is not supported by ggufrun (supported: {names})") from None


def _weights(w: np.ndarray, e: QuantType) -> np.ndarray:
    """The 2-D, C-contiguous, read-only view the kernels are compiled for (no copy for reader views)."""
    if type(w) is np.ndarray and w.dtype == e.weight_dtype and w.ndim == 2:
        f = w.flags
        if f.c_contiguous and not f.writeable and w.shape[1] % e.type_size == 0:
            return w  # the common case, a quantized reader view: nothing to do (this runs ~200x per token)
    w = np.asarray(w)
    if w.dtype == np.float16 and e.weight_dtype == np.uint16:
        w = w.view(np.uint16)
    elif w.dtype != e.weight_dtype:
        if w.dtype != np.uint8:
            raise ValueError(f"{e.qtype.name} weights must be {e.weight_dtype} (or raw uint8 bytes), got {w.dtype}")
        w = np.ascontiguousarray(w).view(e.weight_dtype)
    if w.ndim != 2:
        w = w.reshape(-1, w.shape[-1]) if w.ndim > 2 else w.reshape(1, -1)
    if e.weight_dtype == np.uint8 and w.shape[1] % e.type_size:
        raise ValueError(f"{e.qtype.name} rows of {w.shape[1]} bytes are not whole {e.type_size}-byte blocks")
    if not w.flags.c_contiguous:
        w = np.ascontiguousarray(w)
    if w.flags.writeable:
        w = w.view()
        w.flags.writeable = False
    return w


def _n_values(w2: np.ndarray, e: QuantType) -> int:
    return w2.shape[1] // e.type_size * e.block_size if e.weight_dtype == np.uint8 else w2.shape[1]


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """Raw tensor data -> float32 in the tensor's logical shape (..., K).

    data: a TensorInfo.data view (uint8 [..., row_bytes] for quantized types; float32 / float16 / uint16
    (BF16) [..., K] for float types), or any run of whole blocks (1-D). F32 input comes back as is.
    """
    e = _entry(qtype)
    data = np.asarray(data)
    if e.qtype == GGMLQuantizationType.F32 and data.dtype == np.float32:
        return data
    lead = data.shape[:-1] if data.ndim > 1 else ()
    w = _weights(data, e)
    out = np.empty((w.shape[0], _n_values(w, e)), np.float32)
    e.dequant(w, np.arange(w.shape[0], dtype=np.int64), out)
    return out.reshape(*lead, out.shape[1]) if lead else out.reshape(-1)


def get_rows(w: np.ndarray, qtype, ids, out: np.ndarray | None = None) -> np.ndarray:
    """Rows `ids` of a weight matrix as float32 [len(ids), K] (the token-embedding lookup)."""
    e = _entry(qtype)
    w2 = _weights(w, e)
    rows = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= w2.shape[0]):
        raise IndexError(f"row ids must be in [0, {w2.shape[0]}), got {rows.min()}..{rows.max()}")
    out = _out(out, (rows.size, _n_values(w2, e)), "out")
    if qtype in _ROWS_IN_NUMPY:
        _rows_numpy(w2[rows], qtype, e.type_size, out)
    else:
        e.dequant(w2, rows, out)
    return out


# the embedding lookup of these types is a few NumPy operations with the dequant kernels' exact roundings (one per
# product, one per sum): the kernel would compile on the first run (~0.8 s CPU) only to read a few rows per step
_ROWS_IN_NUMPY = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0})


def _rows_numpy(b: np.ndarray, qtype, bsize: int, out: np.ndarray) -> None:
    """Rows b [n, row bytes] of Q4_0 / Q4_1 / Q8_0 blocks (bsize bytes each) dequantized into out [n, K] as
    deq_q4_0 / deq_q4_1 / deq_q8_0 do: Q4_0 d * (q - 8), Q4_1 d * q + m, Q8_0 q * d, in float32."""
    n = b.shape[0]
    blocks = b.reshape(n, -1, bsize)
    d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32)  # [n, nb, 1]
    y = out.reshape(n, -1, 32)
    if qtype == GGMLQuantizationType.Q8_0:
        np.multiply(blocks[:, :, 2:].view(np.int8).astype(np.float32), d, out=y)
        return
    qs = blocks[:, :, bsize - 16 :]
    q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.float32)  # values 0-15: low nibbles, 16-31: high
    if qtype == GGMLQuantizationType.Q4_0:
        np.multiply(d, q - np.float32(8.0), out=y)
    else:
        np.multiply(d, q, out=y)
        y += blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32)


def _out(out, shape, what) -> np.ndarray:
    if out is None:
        return np.empty(shape, np.float32)
    if out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"{what} must be a C-contiguous float32 array of shape {shape}, got {out.dtype} {out.shape}")
    return out


# ---- activations ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantizedActivations:
    """M rows of K activations in the format a weight type's dot kernel takes (`ACTIVATIONS[format]`).

    format "Q8_1": arrays = (d float32 [M, K/32], s float32 [M, K/32], qs int8 [M, K] (quant),
                             sums int32 [M, K/32])
    format "Q8_K": arrays = (qu uint8 [M, K] (quant + 128), d float32 [M, K/256], bsums16 int32 [M, K/16],
                             bsums32 int32 [M, K/32], qs int8 [M, K] (quant))
    format "F32" (F32, F16 and BF16 weights): arrays = (x float32 [M, K],)
    """

    format: str
    M: int
    K: int
    arrays: tuple[np.ndarray, ...]


def quantize_activations(x: np.ndarray, qtype, out: QuantizedActivations | None = None) -> QuantizedActivations:
    """Quantize x (float32 [K] or [M, K]) once for weights of type `qtype` (and any type sharing its format).

    `out`: a previous result of the same format and shape whose buffers are reused.
    """
    fmt = ACTIVATIONS[_entry(qtype).act]
    x2 = np.ascontiguousarray(x, dtype=np.float32)
    x2 = x2.reshape(1, -1) if x2.ndim == 1 else x2
    if x2.ndim != 2:
        raise ValueError(f"activations must be [K] or [M, K], got shape {np.shape(x)}")
    M, K = x2.shape
    if out is not None and (out.format != fmt.name or out.M != M or out.K != K):
        raise ValueError(f"out holds {out.format} [{out.M}, {out.K}], need {fmt.name} [{M}, {K}]")
    if K % fmt.block:
        raise ValueError(f"{fmt.name} activations need K divisible by {fmt.block}, got K={K}")
    if fmt.quantize is None:
        # F32: x itself. The dot kernel is compiled for writable arrays; a read-only x would compile a second variant
        return QuantizedActivations(fmt.name, M, K, (x2 if x2.flags.writeable else x2.copy(),))
    if out is None:
        out = QuantizedActivations(fmt.name, M, K, fmt.empty(M, K))
    fmt.quantize(x2, *out.arrays)
    return out


# ---- products ---------------------------------------------------------------------------------------------


def _check_act(e: QuantType, w2: np.ndarray, qx: QuantizedActivations) -> None:
    if qx.format != e.act:
        raise ValueError(f"{e.qtype.name} weights take {e.act} activations, got {qx.format}")
    K = _n_values(w2, e)
    if qx.K != K:
        raise ValueError(f"activations have K={qx.K}, weights have rows of {K} values")


def matvec_q(w: np.ndarray, qtype, qx: QuantizedActivations, out: np.ndarray | None = None) -> np.ndarray:
    """y = W @ x with x already quantized (qx from quantize_activations(x [K], qtype)); out float32 [N]."""
    e = _entry(qtype)
    w2 = _weights(w, e)
    _check_act(e, w2, qx)
    if qx.M != 1:
        raise ValueError(f"matvec_q takes one activation row, got M={qx.M}; use matmul_q")
    out = _out(out, (w2.shape[0],), "out")
    e.dot(w2, *qx.arrays, out.reshape(1, -1))
    return out


def matmul_q(w: np.ndarray, qtype, qx: QuantizedActivations, out: np.ndarray | None = None) -> np.ndarray:
    """Y = X @ W.T with X already quantized; out float32 [M, N].

    The dot kernels decode each weight block once per 4 activation rows and compute every row exactly as
    matvec_q would (bit for bit), so results never depend on M. For quantized weights they run on 8-bit
    activations as llama.cpp's do and beat dequantize + BLAS here (benchmarks/kernels.py, `matmul_dequant`).
    """
    e = _entry(qtype)
    w2 = _weights(w, e)
    _check_act(e, w2, qx)
    out = _out(out, (qx.M, w2.shape[0]), "out")
    e.dot(w2, *qx.arrays, out)
    return out


def matvec(w: np.ndarray, qtype, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """y = W @ x: w [N, row_bytes] (or [N, K] float), x float32 [K] -> out float32 [N]."""
    return matvec_q(w, qtype, quantize_activations(np.asarray(x).reshape(1, -1), qtype), out)


def matmul(w: np.ndarray, qtype, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Y = X @ W.T: X float32 [M, K] -> out float32 [M, N]."""
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"matmul takes X of shape [M, K], got {X.shape}")
    return matmul_q(w, qtype, quantize_activations(X, qtype), out)


def matmul_dequant(w: np.ndarray, qtype, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Y = X @ W.T by dequantizing W in row tiles and calling BLAS on float activations (no 8-bit rounding).

    The alternative strategy to matmul's integer dots, kept for measurement (benchmarks/kernels.py).
    """
    e = _entry(qtype)
    w2 = _weights(w, e)
    X = np.ascontiguousarray(X, dtype=np.float32)
    out = _out(out, (X.shape[0], w2.shape[0]), "out")
    return _blas_tiles(w2, e, X, out)


def _blas_tiles(w2: np.ndarray, e: QuantType, X: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = X @ W.T, W dequantized ~1 MB of rows at a time (a tile stays in L2 while BLAS reads it)."""
    N, K = w2.shape[0], _n_values(w2, e)
    tn = max(16, min(N, (1 << 20) // (4 * K)))
    tile = np.empty((tn, K), np.float32)
    part = np.empty((X.shape[0], tn), np.float32)
    for n0 in range(0, N, tn):
        n1 = min(N, n0 + tn)
        e.dequant(w2, np.arange(n0, n1, dtype=np.int64), tile[: n1 - n0])
        np.matmul(X, tile[: n1 - n0].T, out=part[:, : n1 - n0])
        out[:, n0:n1] = part[:, : n1 - n0]
    return out


# ---- compilation ------------------------------------------------------------------------------------------


def warmup(qtypes, dequant: bool = True) -> float:
    """Compile (or load from Numba's cache) every kernel the given weight types need; returns seconds spent.

    The weights are read-only, as the reader's mmap views are, so these are the kernels a model's forward pass
    calls. dequant=False: only the products (activation quantizer and dot kernel), not dequantize / get_rows.
    """
    t0 = time.perf_counter()
    for qtype in dict.fromkeys(GGMLQuantizationType(t) for t in qtypes):
        e = _entry(qtype)
        K = max(e.block_size, 256)  # one Q8_K block at least
        w = np.zeros((8, K // e.block_size * e.type_size), np.uint8)
        w.setflags(write=False)
        w2 = _weights(w if e.weight_dtype == np.uint8 else w.view(e.weight_dtype), e)
        if dequant:
            e.dequant(w2, np.zeros(1, np.int64), np.empty((1, K), np.float32))
        qx = quantize_activations(np.zeros((1, K), np.float32), qtype)
        e.dot(w2, *qx.arrays, np.empty((1, 8), np.float32))
    return time.perf_counter() - t0
