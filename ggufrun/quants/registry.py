"""The tables of ggufrun.quants: one entry per supported weight type (block geometry, byte layout, activation
format, kernels) and one per activation format (how the dot kernels want their input prepared).

Byte layouts follow llama.cpp's ggml-common.h (multi-byte fields little-endian; d/dmin/m are IEEE halves).
Activation formats follow the vec_dot_type of each type in llama.cpp's ggml-cpu/ggml-cpu.c type_traits_cpu.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from . import dequant as dq
from . import dot


@dataclass(frozen=True)
class QuantType:
    qtype: T
    block_size: int  # values per block
    type_size: int  # bytes per block
    act: str  # activation format its dot kernel takes: "Q8_1", "Q8_K" or "F32"
    weight_dtype: np.dtype  # dtype of the weight view the kernels take: [N, row_bytes] uint8, or typed
    dequant: Callable  # njit deq(w, rows int64 [R], out float32 [R, K]), one thread
    dot: Callable  # njit dot(w, *activation arrays, out float32 [M, N]), parallel over weight rows
    f16_fields: tuple[int, ...] = ()  # byte offsets of the IEEE-half scale fields within a block

    def row_bytes(self, n_values: int) -> int:
        return n_values // self.block_size * self.type_size


def _q(qtype, act, deq, dotk, f16_fields):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return QuantType(qtype, block_size, type_size, act, np.dtype(np.uint8), deq, dotk, f16_fields)


def _f(qtype, view, deq, dotk):
    # the float kernels multiply float32 activations as they are (llama.cpp rounds them to F16 / BF16 first)
    return QuantType(qtype, 1, np.dtype(view).itemsize, "F32", np.dtype(view), deq, dotk)


REGISTRY: dict[T, QuantType] = {
    # F32: plain float32 values
    T.F32: _f(T.F32, np.float32, dq.deq_f32, dot.dot_f32),
    # F16: IEEE half values (viewed as uint16)
    T.F16: _f(T.F16, np.uint16, dq.deq_f16, dot.dot_f16),
    # BF16: bfloat16 values, the high 16 bits of a float32 (viewed as uint16)
    T.BF16: _f(T.BF16, np.uint16, dq.deq_bf16, dot.dot_bf16),
    # Q4_0: 32 values per 18-byte block (d:2, qs:16); x = d * (nibble - 8), low nibbles are values 0-15
    T.Q4_0: _q(T.Q4_0, "Q8_1", dq.deq_q4_0, dot.dot_q4_0, (0,)),
    # Q4_1: 32 values per 20-byte block (d:2, m:2, qs:16); x = d * nibble + m
    T.Q4_1: _q(T.Q4_1, "Q8_1", dq.deq_q4_1, dot.dot_q4_1, (0, 2)),
    # Q5_0: 32 values per 22-byte block (d:2, qh:4, qs:16); x = d * ((nibble | bit j of qh << 4) - 16)
    T.Q5_0: _q(T.Q5_0, "Q8_1", dq.deq_q5_0, dot.dot_q5_0, (0,)),
    # Q5_1: 32 values per 24-byte block (d:2, m:2, qh:4, qs:16); x = d * (nibble | bit j of qh << 4) + m
    T.Q5_1: _q(T.Q5_1, "Q8_1", dq.deq_q5_1, dot.dot_q5_1, (0, 2)),
    # Q8_0: 32 values per 34-byte block (d:2, qs:32 int8); x = d * q
    T.Q8_0: _q(T.Q8_0, "Q8_1", dq.deq_q8_0, dot.dot_q8_0, (0,)),
    # Q2_K: 256 values per 84-byte block (scales:16 (sc | min << 4 per 16 values), qs:64, d:2, dmin:2)
    T.Q2_K: _q(T.Q2_K, "Q8_K", dq.deq_q2_k, dot.dot_q2_k, (80, 82)),
    # Q3_K: 256 values per 110-byte block (hmask:32, qs:64, scales:12 (16 x 6 bits), d:2)
    T.Q3_K: _q(T.Q3_K, "Q8_K", dq.deq_q3_k, dot.dot_q3_k, (108,)),
    # Q4_K: 256 values per 144-byte block (d:2, dmin:2, scales:12 (8 x 6-bit scale + min), qs:128)
    T.Q4_K: _q(T.Q4_K, "Q8_K", dq.deq_q4_k, dot.dot_q4_k, (0, 2)),
    # Q5_K: 256 values per 176-byte block (d:2, dmin:2, scales:12, qh:32, qs:128)
    T.Q5_K: _q(T.Q5_K, "Q8_K", dq.deq_q5_k, dot.dot_q5_k, (0, 2)),
    # Q6_K: 256 values per 210-byte block (ql:128, qh:64, scales:16 int8 (per 16 values), d:2)
    T.Q6_K: _q(T.Q6_K, "Q8_K", dq.deq_q6_k, dot.dot_q6_k, (208,)),
    # IQ4_NL: 32 values per 18-byte block (d:2, qs:16); x = d * kvalues_iq4nl[nibble]
    T.IQ4_NL: _q(T.IQ4_NL, "Q8_1", dq.deq_iq4_nl, dot.dot_iq4_nl, (0,)),
    # IQ4_XS: 256 values per 136-byte block (d:2, scales_h:2, scales_l:4 (8 x 6-bit scales), qs:128)
    T.IQ4_XS: _q(T.IQ4_XS, "Q8_K", dq.deq_iq4_xs, dot.dot_iq4_xs, (0,)),
    # ---- grid types: each 8 (IQ2) or 4 (IQ3) values an entry of a code book (ggml-common.h iq2xxs_grid ..
    # iq3s_grid, all values positive) with a sign bit per value; x = d * (2 * scale + 1) / 8 (IQ2), / 4 (IQ3_XXS)
    # or d * (2 * scale + 1) (IQ3_S) times the entry's value, negated where its sign bit is set
    # IQ2_XXS: 256 values per 66-byte block (d:2, qs:64 = per 32 values 4 entry bytes + uint32 of 4 x 7-bit sign
    # indices (ksigns_iq2xs) and a 4-bit scale)
    T.IQ2_XXS: _q(T.IQ2_XXS, "Q8_K", dq.deq_iq2_xxs, dot.dot_iq2_xxs, (0,)),
    # IQ2_XS: 256 values per 74-byte block (d:2, qs:64 = 32 uint16 of 9-bit entry + 7-bit sign index,
    # scales:8 = a 4-bit scale per 16 values)
    T.IQ2_XS: _q(T.IQ2_XS, "Q8_K", dq.deq_iq2_xs, dot.dot_iq2_xs, (0,)),
    # IQ2_S: 256 values per 82-byte block (d:2, qs:32 entry low bytes, signs:32 (a bit per value), qh:8 (2 high
    # entry bits each), scales:8 = a 4-bit scale per 16 values)
    T.IQ2_S: _q(T.IQ2_S, "Q8_K", dq.deq_iq2_s, dot.dot_iq2_s, (0,)),
    # IQ3_XXS: 256 values per 98-byte block (d:2, qs:64 entry bytes (4 values each), then per 32 values a uint32
    # of 4 x 7-bit sign indices and a 4-bit scale)
    T.IQ3_XXS: _q(T.IQ3_XXS, "Q8_K", dq.deq_iq3_xxs, dot.dot_iq3_xxs, (0,)),
    # IQ3_S: 256 values per 110-byte block (d:2, qs:64 entry low bytes (4 values each), qh:8 (the 9th entry bit),
    # signs:32 (a bit per value), scales:4 = a 4-bit scale per 32 values)
    T.IQ3_S: _q(T.IQ3_S, "Q8_K", dq.deq_iq3_s, dot.dot_iq3_s, (0,)),
    # ---- IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4 (grid: iq1s_grid, 8 values in {-1, 0, 1} per entry; delta = 1/8)
    # IQ1_S: 256 values per 50-byte block (d:2, qs:32, qh:16 (8 x uint16)); group g of 32: grid indices
    # qs[4g + l] | ((qh[g] >> 3l) & 7) << 8, x = d * (2 * ((qh[g] >> 12) & 7) + 1) * (grid + (-delta if bit 15 of
    # qh[g] else delta))
    T.IQ1_S: _q(T.IQ1_S, "Q8_K", dq.deq_iq1_s, dot.dot_iq1_s, (0,)),
    # IQ1_M: 256 values per 56-byte block (qs:32, qh:16, scales:8 (4 x uint16)), no d field: the fp16 d is the top
    # nibbles of the four scale words; group g: indices qs[4g + l] | (nibble l of qh[2g:2g+2] & 7) << 8, nibble
    # bit 3: -delta; 3-bit scales s at bits 6(g%2) + 3h of scales word g//2 for its halves h, x = d * (2s + 1) * (...)
    T.IQ1_M: _q(T.IQ1_M, "Q8_K", dq.deq_iq1_m, dot.dot_iq1_m, ()),
    # TQ1_0: 256 values per 54-byte block (qs:48, qh:4, d:2 at the end); 5 trits per byte of qs, 4 per byte of qh
    # (digit n of byte v: ((v * 3^n mod 256) * 3) >> 8), x = d * (trit - 1)
    T.TQ1_0: _q(T.TQ1_0, "Q8_K", dq.deq_tq1_0, dot.dot_tq1_0, (52,)),
    # TQ2_0: 256 values per 66-byte block (qs:64 (2 bits per value, as Q2_K), d:2 at the end); x = d * (q - 1)
    T.TQ2_0: _q(T.TQ2_0, "Q8_K", dq.deq_tq2_0, dot.dot_tq2_0, (64,)),
    # MXFP4: 32 values per 17-byte block (e:1 E8M0 exponent, qs:16 E2M1 nibbles, low nibbles values 0-15);
    # x = kvalues_mxfp4[nibble] * 2^(e - 128) (GGML_E8M0_TO_FP32_HALF; the values are doubled); vec_dot_type Q8_0
    T.MXFP4: _q(T.MXFP4, "Q8_1", dq.deq_mxfp4, dot.dot_mxfp4, ()),
}

SUPPORTED_TYPES: frozenset[T] = frozenset(REGISTRY)


@dataclass(frozen=True)
class ActivationFormat:
    """The input a family of dot kernels takes: the arrays `quantize` fills (layouts in ggufrun.quants.dot)."""

    name: str  # "Q8_1", "Q8_K" or "F32" (QuantType.act)
    block: int  # K must be a multiple of this (values per activation scale; 1 for float formats)
    quantize: Callable | None  # njit quantize(x float32 [M, K], *arrays); None: the arrays are (x,) itself
    arrays: tuple[tuple[int, np.dtype], ...]  # per array: (values of K per element, dtype); shape [M, K // that]
    # the same with the rows shared among the threads (the same bits), for many rows (prefill); None: quantize
    quantize_rows: Callable | None = None

    def empty(self, M: int, K: int) -> tuple[np.ndarray, ...]:
        """Fresh buffers for M rows of K activations."""
        return tuple(np.empty((M, K // per), dtype) for per, dtype in self.arrays)


_f32, _i32, _i8, _u8 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int8), np.dtype(np.uint8)

ACTIVATIONS: dict[str, ActivationFormat] = {
    # d (fp16-rounded scale) and s (Q8_1's d * sum) per 32 values, qs the int8 quants, sums their sum per 32
    "Q8_1": ActivationFormat(
        "Q8_1", 32, dot.quantize_q8_1, ((32, _f32), (32, _f32), (1, _i8), (32, _i32)), dot.quantize_q8_1_rows
    ),
    # qu = qs + 128, d per 256 values, bsums16 / bsums32 (sums of qs per 16 / 32 values), qs the int8 quants
    "Q8_K": ActivationFormat(
        "Q8_K",
        256,
        dot.quantize_q8_k,
        ((1, _u8), (256, _f32), (16, _i32), (32, _i32), (1, _i8)),
        dot.quantize_q8_k_rows,
    ),
    # float32 as given, for F32 / F16 / BF16 weights
    "F32": ActivationFormat("F32", 1, None, ((1, _f32),)),
}
