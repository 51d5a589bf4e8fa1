"""The forward pass's matrix products, run through ggufrun.quants without per-call Python dispatch.

Each weight matrix is prepared once at load (`Linear`: the 2-D view its dot kernel takes, the kernel, the
activation format it wants). An input that feeds several matrices (Q/K/V, FFN gate/up) is quantized once per
activation format, into buffers kept from one decode step to the next; then each kernel writes its output.
This saves the ~6 us of checks per product that `quants.matvec` spends, about 200 times per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGMLQuantizationType

from .. import quants
from ..quants import repack
from ..reader import TensorInfo


@dataclass(frozen=True)
class Linear:
    """y = x @ W.T for one GGUF weight matrix W [n_out, n_in]."""

    name: str  # GGUF tensor name
    w: np.ndarray  # [n_out, row_bytes] uint8 blocks, or [n_out, n_in] typed: the zero-copy view `dot` takes
    qtype: GGMLQuantizationType
    act: str  # activation format of the dot kernel (quants.REGISTRY[qtype].act)
    dot: Callable  # njit dot(w, *activation arrays, out float32 [M, n_out])
    n_out: int
    n_in: int
    packed: bool = False  # w is in ggufrun.quants.repack's interleaved layout [n_out / 8, 8 x row_bytes]
    # the same product one activation row at a time, the same bits (repack.ONE_ROW: the interleaved layouts'
    # decode kernels, which compile in a third of their tiles' time; repack.STREAM_ROW's for weights that stream from
    # DRAM, Linear.streaming); else dot itself
    dot_one: Callable | None = None

    def __post_init__(self):
        if self.dot_one is None:
            object.__setattr__(self, "dot_one", self.dot)

    @classmethod
    def of(cls, t: TensorInfo, expert: int | None = None, rows: tuple[int, int] | None = None) -> Linear:
        """The matrix of tensor `t` (shape-checked by the caller): t itself [n_out, n_in]; with `expert`, that
        expert's slice of a 3-D [n_expert, n_out, n_in] tensor (a view: no copy); with rows=(1, n_in), a 1-D
        tensor [n_in] as a one-row matrix."""
        quants.check_supported(t.name, t.type)
        e = quants.REGISTRY[t.type]
        w = t.data if t.data.dtype == e.weight_dtype else t.data.view(e.weight_dtype)  # F16: uint16 bits
        shape = t.shape
        if expert is not None:
            w, shape = w[expert], shape[1:]
        elif rows is not None:
            w, shape = w.reshape(1, -1), rows
        assert w.ndim == 2 and w.flags.c_contiguous and len(shape) == 2, t.name
        return cls(t.name, w, t.type, e.act, e.dot, shape[0], shape[1])

    def repacked(self, rows_too: bool = False, release=None, out: np.ndarray | None = None) -> Linear:
        """This matrix copied into the interleaved layout of ggufrun.quants.repack, with that layout's kernel
        (the same output bits, faster), when its type has one (and, with rows_too, its rows can still be read
        back by `rows`: an embedding table); else itself. release(part) is called with each copied part of the
        file's matrix (repack.repack); out: where to copy it (rows of a larger array), default a new array."""
        if rows_too and self.qtype not in repack.ROW_LOOKUP_TYPES:
            return self
        r = repack.repack(self.w, self.qtype, release, out=out)
        return self if r is None else replace(self, w=r[0], dot=r[1], dot_one=repack.ONE_ROW.get(r[1]), packed=True)

    def streaming(self) -> Linear:
        """This matrix with decode's kernel for weights read from DRAM at every token (repack.STREAM_ROW: one
        sequential stream a thread; the same bits), where its layout has one; else itself."""
        one = repack.STREAM_ROW.get(self.dot)  # keyed by the interleaved layouts' kernels: packed matrices only
        return self if one is None or one is self.dot_one else replace(self, dot_one=one)

    @staticmethod
    def _packed_shapes(parts: list[Linear | None]) -> list[tuple[int, int]] | None:
        """Each part's shape in the interleaved layout, or None where the parts cannot be fused."""
        if any(p is None or p.packed for p in parts) or len({(p.qtype, p.n_in, p.w.shape[1]) for p in parts}) != 1:
            return None
        shapes = [repack.packed_shape(p.w, p.qtype) for p in parts]
        return None if None in shapes else shapes

    @staticmethod
    def packed_rows(parts: list[Linear | None]) -> tuple[int, int] | None:
        """The shape of repacked_together(parts)'s fused matrix, or None where they cannot be fused."""
        shapes = Linear._packed_shapes(parts)
        return None if shapes is None else (sum(g for g, _ in shapes), shapes[0][1])

    @staticmethod
    def repacked_together(
        parts: list[Linear | None], release=None, out: np.ndarray | None = None
    ) -> tuple[Linear, ...] | None:
        """(fused, *parts): the matrices `parts` (one type with an interleaved layout, the same n_in, not packed yet)
        copied into consecutive rows of one matrix in that layout, `fused` (`out` if given: packed_rows(parts)'s
        shape, rows of a larger array), and each of them as a view of its rows; None where they cannot be (another
        type, a missing part...)."""
        shapes = Linear._packed_shapes(parts)
        if shapes is None:
            return None
        fused = np.empty((sum(g for g, _ in shapes), shapes[0][1]), np.uint8) if out is None else out
        views, g0 = [], 0
        for p, (g, _) in zip(parts, shapes):
            _, kernel = repack.repack(p.w, p.qtype, release, out=fused[g0 : g0 + g])
            views.append(replace(p, w=fused[g0 : g0 + g], dot=kernel, dot_one=repack.ONE_ROW.get(kernel), packed=True))
            g0 += g
        name = "+".join(p.name for p in parts)
        first = views[0]
        return (replace(first, name=name, w=fused, n_out=sum(p.n_out for p in parts)), *views)

    def rows(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows `ids` of the matrix as float32 (the token-embedding lookup), whatever its layout."""
        if self.packed:
            return repack.get_rows(self.w, self.qtype, ids, out=out)
        return quants.get_rows(self.w, self.qtype, ids, out=out)


@dataclass(frozen=True)
class Experts:
    """The matrices of a block's experts (each expert's ffn_down, or its fused gate / up) stacked in one array in an
    interleaved layout, expert e's rows at groups e * n_out / 8 ..: a decode step runs its token's k chosen experts
    in one kernel call (repack.EXPERTS; ggml's mul_mat_id for one token), expert by expert the bits of their own
    Linear.dot_one. out[r] = x[0 if shared else r] @ W_{sel[r]}.T."""

    w: np.ndarray  # [n_expert * n_out / 8, 8 x row_bytes] uint8
    qtype: GGMLQuantizationType
    act: str  # activation format
    kernel: Callable  # kernel(w, *activation arrays, out float32 [k, n_out], sel int32 [k], shared int)
    n_out: int  # rows of one expert
    n_in: int

    @classmethod
    def of(cls, stack: np.ndarray, first: Linear) -> Experts | None:
        """The experts in `stack`, whose first n_out rows are the (packed) Linear `first`; None where its layout has
        no experts kernel."""
        kernel = repack.EXPERTS.get(first.dot)
        if kernel is None or not first.packed or stack.shape[0] * 8 % first.n_out:
            return None
        return cls(stack, first.qtype, first.act, kernel, first.n_out, first.n_in)

    def streaming(self) -> Experts:
        """These experts with the kernel for weights read from DRAM (repack.EXPERTS_STREAM: one group of 8 rows at a
        time; the same bits), as Linear.streaming."""
        return replace(self, kernel=repack.EXPERTS_STREAM.get(self.kernel, self.kernel))


KEEP_ROWS = 16  # Projector keeps quantized-activation buffers for up to this many rows (decode, experts, batches)


class Projector:
    """Runs Linear products, quantizing each input once per activation format.

    Quantized-activation buffers for up to KEEP_ROWS rows (decode, a step's experts, batched decode) and for
    `max_rows` rows (full prefill chunks) are kept and reused; other row counts (a last prefill chunk) get fresh
    ones. One row goes to each matrix's dot_one; several to its dot, or to dot_one too while `tiles` is False (the
    first run ever, while a helper process still compiles the tiled kernels: Transformer.pending).
    """

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.tiles = True
        self._buffers: dict[tuple[str, int, int], quants.QuantizedActivations] = {}

    def quantize(self, x: np.ndarray, lin: Linear | Experts) -> quants.QuantizedActivations:
        """x: float32 [M, K], C-contiguous. Several rows with `tiles` on: the format's multi-row quantizer (the same
        bits; compiled in the background with the tiles on the first run), which shares out more rows than one work item
        (dot.QUANTIZE_ROWS) among the threads and quantizes one item's on this thread (launch.run_items: a parallel
        region of one work item only costs more: 1 row of 576 / 1,536 values, 1.1 / 2.1 us against 2.5 / 3.6; 8 rows,
        two items, 4.6 / 8.8 us against 5.4 / 13.6 here); one row, the serial quantizer."""
        key = (lin.act, x.shape[0], x.shape[1])
        fmt = quants.ACTIVATIONS[lin.act]
        quantize = fmt.quantize_rows if self.tiles and x.shape[0] > 1 and fmt.quantize_rows else fmt.quantize
        qx = self._buffers.get(key)
        if qx is None:
            if fmt.quantize is None or x.shape[1] % fmt.block:
                return quants.quantize_activations(x, lin.qtype)  # F32: x itself; a K it cannot take: its error
            qx = quants.QuantizedActivations(fmt.name, x.shape[0], x.shape[1], fmt.empty(*x.shape))
            if x.shape[0] <= KEEP_ROWS or x.shape[0] == self.max_rows:
                self._buffers[key] = qx  # reused; other row counts (a last prefill chunk) get fresh buffers
        quantize(x, *qx.arrays)
        return qx

    def __call__(self, x: np.ndarray, *pairs: tuple[Linear, np.ndarray]) -> None:
        """out = x @ W.T for each (W, out) pair; x [M, K], each out float32 [M, n_out] C-contiguous."""
        qx = None
        tiles = self.tiles and x.shape[0] > 1
        for lin, out in pairs:
            if qx is None or qx.format != lin.act:
                qx = self.quantize(x, lin)
            (lin.dot if tiles else lin.dot_one)(lin.w, *qx.arrays, out)

    def experts(self, x: np.ndarray, stack: Experts, out: np.ndarray, sel: np.ndarray, shared: bool) -> None:
        """out[r] = x[0 if shared else r] @ (expert sel[r] of `stack`).T for each rank r: x [1 or k, K], out float32
        [k, stack.n_out]."""
        qx = self.quantize(x, stack)
        stack.kernel(stack.w, *qx.arrays, out, sel, int(shared))
