"""One entry per supported weight type: block geometry, byte layout, activation format, kernels.

Byte layouts follow llama.cpp's ggml-common.h (multi-byte fields little-endian; d/dmin/m are IEEE halves).
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
    act: str  # activation format its dot kernel takes: "Q8_1", "Q8_K", "F32", "F16" or "BF16"
    weight_dtype: np.dtype  # dtype of the weight view the kernels take: [N, row_bytes] uint8, or typed
    dequant: Callable  # njit deq(w, rows int64 [R], out float32 [R, K]), parallel over rows
    dot: Callable  # njit dot(w, *activation arrays, out float32 [M, N]), parallel over weight rows
    f16_fields: tuple[int, ...] = ()  # byte offsets of the IEEE-half scale fields within a block
    kind: int = -1  # the compile-time constant dot.row32 / dot.rowk take for this type (see dot.py)

    def row_bytes(self, n_values: int) -> int:
        return n_values // self.block_size * self.type_size


def _q(qtype, act, deq, dotk, f16_fields):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    kind = getattr(dot, qtype.name)
    return QuantType(qtype, block_size, type_size, act, np.dtype(np.uint8), deq, dotk, f16_fields, kind)


def _f(qtype, view, deq, dotk):
    return QuantType(qtype, 1, np.dtype(view).itemsize, qtype.name, np.dtype(view), deq, dotk)


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
}

SUPPORTED_TYPES: frozenset[T] = frozenset(REGISTRY)
