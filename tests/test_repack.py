"""Weights in the interleaved layouts of ggufrun.quants.repack (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K) give the same
bits as in the file's, through each layout's kernel and its one-row kernel."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_quants import random_weights

import ggufrun.quants as Q
from ggufrun.model import Transformer
from ggufrun.model.linear import Linear
from ggufrun.model.weights import FUSED
from ggufrun.quants import dot
from ggufrun.quants.repack import (
    EXPERTS,
    EXPERTS_STREAM,
    ONE_ROW,
    REPACKED_TYPES,
    ROW_LOOKUP_TYPES,
    STREAM_ROW,
    get_rows,
    repack,
)
from ggufrun.reader import GGUFFile

K_TYPES = {T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS}  # 256-value super-blocks (IQ4_XS repacked on AVX-512 only)


def _random_blocks(qtype: T, n: int, k: int, rng) -> np.ndarray:
    """n rows of k values: quantized by gguf-py (real scales and codes) for the 32-value types; K-quants and IQ4_NL
    (which gguf-py does not quantize) as random codes and scale bytes with normal fp16 d / dmin."""
    from gguf.quants import quantize

    if qtype in K_TYPES or qtype == T.IQ4_NL:  # gguf-py does not quantize IQ4_NL either
        return random_weights(qtype, n, k, rng)
    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


SHAPES_32 = [(8, 32), (64, 96), (40, 2048)]
SHAPES_K = [(8, 256), (64, 512), (40, 4096)]


@pytest.mark.parametrize(
    ("qtype", "n", "k"),
    [(t, n, k) for t in sorted(REPACKED_TYPES) for n, k in (SHAPES_K if t in K_TYPES else SHAPES_32)],
)
def test_repacked_kernel_gives_the_file_layouts_bits(qtype, n, k):
    rng = np.random.default_rng(n + k)
    w = _random_blocks(qtype, n, k, rng)
    w8, kernel = repack(w, qtype)
    # scales and mins unpacked: Q4_K / Q5_K 16 bytes, not 12 (per row and super-block); IQ4_XS 8 + 2, not 6 + 2
    extra = {T.Q4_K: 32, T.Q5_K: 32, T.IQ4_XS: 16}.get(qtype, 0) * (k // 256) * n // 8
    assert w8.shape == (n // 8, w.shape[1] * 8 + 8 * extra // n) and w8.nbytes == w.nbytes + extra
    for m in (1, 2, 3, 4, 5, 8, 12, 70):  # decode, two rows (_group_x8_two on AVX2), odd pairs, tiles
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] = 0.0  # a block of zeros (d = 0)
        qx = Q.quantize_activations(x, qtype)
        want, got = np.zeros((m, n), np.float32), np.full((m, n), np.nan, np.float32)
        Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
        kernel(w8, *qx.arrays, got)
        assert np.array_equal(want.view(np.int32), got.view(np.int32)), (m, np.abs(want - got).max())
        got[:] = np.nan
        ONE_ROW[kernel](w8, *qx.arrays, got)  # one row at a time: decode's kernel, the tiles' first-run stand-in
        assert np.array_equal(want.view(np.int32), got.view(np.int32)), ("one row", m, np.abs(want - got).max())
        got[:] = np.nan
        STREAM_ROW[kernel](w8, *qx.arrays, got)  # decode's kernel for weights read from DRAM (one group at a time)
        assert np.array_equal(want.view(np.int32), got.view(np.int32)), ("stream", m, np.abs(want - got).max())


@pytest.mark.parametrize("qtype", sorted(REPACKED_TYPES))
def test_experts_kernel_gives_each_experts_one_row_bits(qtype):
    """A stack of 5 experts of 24 rows (3 groups of 8: an odd last group per expert); a decode step's 3 chosen
    experts in one call (repack.EXPERTS): row r is expert sel[r] times activation row 0 (shared) or row r, the bits
    dot_one gives that expert alone; the same from the experts kernel for weights read from DRAM (EXPERTS_STREAM)."""
    n_expert, n, k = 5, 24, 512 if qtype in K_TYPES else 96
    rng = np.random.default_rng(7)
    w8, kernel = repack(_random_blocks(qtype, n_expert * n, k, rng), qtype)
    experts, one_row = EXPERTS[kernel], ONE_ROW[kernel]
    sel = np.array([3, 0, 4], np.int32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    for shared, f in ((True, experts), (False, experts), (True, EXPERTS_STREAM[experts]),
                      (False, EXPERTS_STREAM[experts])):  # fmt: skip
        rows = x[:1] if shared else x
        got = np.full((3, n), np.nan, np.float32)
        f(w8, *Q.quantize_activations(rows, qtype).arrays, got, sel, int(shared))
        for r, e in enumerate(sel):
            want = np.zeros((1, n), np.float32)
            qx = Q.quantize_activations(rows[0 if shared else r][None], qtype)
            one_row(w8[e * n // 8 : (e + 1) * n // 8], *qx.arrays, want)
            assert np.array_equal(want[0].view(np.int32), got[r].view(np.int32)), (shared, r, f.py_func.__name__)


def test_repack_layout_holds_every_byte_once():
    w = np.arange(16 * 2 * 20, dtype=np.int64).astype(np.uint8).reshape(16, 40)  # Q4_1: 16 rows x 2 blocks
    w8, _ = repack(w, T.Q4_1)
    assert sorted(w8.ravel().tolist()) == sorted(w.ravel().tolist())
    block = w8[1, 160:320]  # group 1 (rows 8..15), block 1
    rows = w[8:16, 20:40]
    assert block[:16].tolist() == rows[:, 0:2].ravel().tolist()  # d of the 8 rows
    assert block[16:32].tolist() == rows[:, 2:4].ravel().tolist()  # m
    assert block[32 + 32 * 2 : 32 + 32 * 3].tolist() == rows[:, 4 + 8 : 4 + 12].ravel().tolist()  # chunk 2


def test_repack_leaves_other_types_and_shapes_alone():
    assert repack(np.zeros((12, 20), np.uint8), T.Q4_1) is None  # 12 rows: not groups of 8
    assert repack(np.zeros((16, 110), np.uint8), T.Q3_K) is None  # no interleaved layout
    assert repack(np.zeros((16, 21), np.uint8), T.Q4_1) is None  # not whole blocks


GOLDEN = Path(__file__).parent / "data" / "golden"


@pytest.mark.parametrize("qtype", sorted(ROW_LOOKUP_TYPES))
def test_rows_read_back_from_the_interleaved_layout(qtype):
    rng = np.random.default_rng(3)
    w = _random_blocks(qtype, 48, 512 if qtype in K_TYPES else 64, rng)
    w8, _ = repack(w, qtype)
    ids = np.array([0, 47, 8, 7, 7, 33])
    assert np.array_equal(get_rows(w8, qtype, ids), Q.get_rows(w, qtype, ids))
    with pytest.raises(IndexError):
        get_rows(w8, qtype, [48])
    with pytest.raises(ValueError, match="Q5_0"):
        get_rows(repack(_random_blocks(T.Q5_0, 8, 32, rng), T.Q5_0)[0], T.Q5_0, [0])
    with pytest.raises(ValueError, match="Q4_K"):  # its scales are unpacked, not moved
        get_rows(repack(_random_blocks(T.Q4_K, 8, 256, rng), T.Q4_K)[0], T.Q4_K, [0])


def test_q4_k_layout_unpacks_scales_and_mins():
    # 6-bit scales and mins (llama.cpp's get_scale_min_k4), as pairs of sub-blocks row by row: byte 32 + 16 k + 2 r + e
    # of a super-block of 8 rows is row r's scale of sub-block 2k + e, byte 96 + ... its min
    from gguf.quants import dequantize

    rng = np.random.default_rng(5)
    w = random_weights(T.Q4_K, 8, 256, rng)
    w8, _ = repack(w, T.Q4_K)
    sc, mn = w8[0, 32:96].reshape(4, 8, 2).astype(np.int32), w8[0, 96:160].reshape(4, 8, 2).astype(np.int32)
    for r in range(8):
        one = w[r].copy()
        one[:4] = np.array([1.0, 1.0], np.float16).view(np.uint8)  # d = dmin = 1: value = scale x code - min
        one[16:144] = 0  # codes 0: every value is -min
        assert np.array_equal(-dequantize(one, T.Q4_K).reshape(8, 32)[:, 0], mn[:, r].reshape(8))
        one[16:144] = 0x11  # codes 1: scale - min
        assert np.array_equal(dequantize(one, T.Q4_K).reshape(8, 32)[:, 0], (sc[:, r] - mn[:, r]).reshape(8))


@pytest.mark.parametrize(
    "name",
    [
        "small-llama-q4_0",
        "small-llama-q4_1",
        "small-llama-q5_0",
        "small-llama-tied-q8_0",
        "small-llama-q4_k_s",
        "small-llama-q6_k",
        "small-llama-tied-q4_k_s",
    ],
)
def test_model_matrices_are_repacked_and_their_file_pages_released(name, monkeypatch):
    path = GOLDEN / f"{name}.gguf"
    released = []
    original = GGUFFile.release_pages
    monkeypatch.setattr(GGUFFile, "release_pages", lambda self, v: (released.append(v.nbytes), original(self, v)))
    tf = Transformer(GGUFFile(path))
    w = tf.weights
    matrices = {id(lin): lin for L in w.layers for lin in L.matrices} | {id(w.token_embd): w.token_embd}
    matrices[id(w.output)] = w.output
    packed = [lin for lin in matrices.values() if lin.packed]
    # every byte of every repacked matrix's file copy
    assert sum(released) == sum(tf.gguf.tensors[lin.name].data.nbytes for lin in packed) > 0
    for lin in matrices.values():
        # the embedding table: only as a tied output, and where the embedding lookup can read its rows back
        table_ok = lin is not w.token_embd or (w.output is w.token_embd and lin.qtype in ROW_LOOKUP_TYPES)
        assert lin.packed == (lin.qtype in REPACKED_TYPES and table_ok)
    ids = [1, 2, 3, 4, 5]
    logits = tf.logits(ids)
    plain = Transformer(GGUFFile(path))  # the same model with the file's layout everywhere
    file_layout = {f: Linear.of(plain.gguf.tensors[lin.name]) for f, lin in vars(plain.weights).items()
                   if isinstance(lin, Linear)}  # fmt: skip
    for L in plain.weights.layers:
        for f in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            object.__setattr__(L, f, Linear.of(plain.gguf.tensors[getattr(L, f).name]))
        for f in FUSED:
            object.__setattr__(L, f, None)
    for f, lin in file_layout.items():
        object.__setattr__(plain.weights, f, lin)
    assert not any(lin.packed for L in plain.weights.layers for lin in L.matrices) and not plain.weights.output.packed
    assert np.array_equal(plain.logits(ids).view(np.int32), logits.view(np.int32))
    # decode (one row: the fused Q/K/V and gate/up products where the block has them) against the file's layout
    a, b = tf.new_cache(), plain.new_cache()
    for i in ids:
        assert np.array_equal(tf.forward([i], cache=a).view(np.int32), plain.forward([i], cache=b).view(np.int32))


@pytest.mark.parametrize("name", ["small-llama-q4_1", "small-llama-q4_k_s"])
def test_a_blocks_q_k_v_and_gate_up_are_views_of_one_fused_matrix(name):
    tf = Transformer(GGUFFile(GOLDEN / f"{name}.gguf"))
    fused = 0
    for L in tf.weights.layers:
        for f, parts in FUSED.items():
            whole = getattr(L, f)
            if whole is None:
                continue
            fused += 1
            lins = [getattr(L, p) for p in parts]
            assert whole.n_out == sum(lin.n_out for lin in lins) and whole.packed and all(lin.packed for lin in lins)
            assert all(np.shares_memory(lin.w, whole.w) for lin in lins)  # views: no second copy
            assert np.array_equal(np.concatenate([lin.w for lin in lins]), whole.w)
        assert not any(m is L.attn_qkv or m is L.ffn_gate_up for m in L.matrices)  # not counted twice
    assert fused > 0


def test_release_pages_only_touches_its_own_map():
    with GGUFFile(GOLDEN / "small-llama-q4_1.gguf") as f:
        t = next(t for t in f.tensors.values() if t.data.nbytes >= 2 * mmap.PAGESIZE)
        before = t.data.copy()
        f.release_pages(t.data)
        assert np.array_equal(t.data, before)  # read again from the file
        f.release_pages(np.zeros(4 * mmap.PAGESIZE, np.uint8))  # not a view of the file: nothing happens


PORTABLE = """
import numpy as np
import ggufrun.quants as Q
from ggufrun.quants import dot
from ggufrun.quants.repack import REPACKED_TYPES, repack
from gguf.quants import quantize
assert not dot.HAS_AVX2 and not dot.SIGNED_PAIRS
rng = np.random.default_rng(0)
import sys
sys.path.insert(0, TESTS)
from test_quants import random_weights
for qtype in sorted(REPACKED_TYPES):
    k = 512 if qtype.name.endswith("_K") else 96
    if k == 512:
        w = random_weights(qtype, 64, k, rng)
    else:
        w = quantize(rng.standard_normal((64, k)).astype(np.float32), qtype)
    w8, kernel = repack(w, qtype)
    for m in (1, 5):
        qx = Q.quantize_activations(rng.standard_normal((m, k)).astype(np.float32), qtype)
        want, got = np.zeros((m, 64), np.float32), np.zeros((m, 64), np.float32)
        Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
        kernel(w8, *qx.arrays, got)
        assert np.array_equal(want.view(np.int32), got.view(np.int32)), (qtype, m)
print("ok")
"""


def _portable_kernels(folder: Path) -> tuple[list[str], dict]:
    """(argv, env) of PORTABLE compiling for a generic x86-64 target with a Numba cache of its own in `folder`: ~90 s
    on one core, run from the end of collection on (conftest's `background`)."""
    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(folder / "cache"))
    return [sys.executable, "-c", PORTABLE.replace("TESTS", repr(str(Path(__file__).parent)))], env


@pytest.mark.background.with_args(_portable_kernels)  # with_args: a lone function argument would be decorated
def test_interleaved_kernels_on_a_cpu_without_avx2(background):
    # the portable LLVM IR paths (no vpmaddubsw; Q8_0's codes + 128 against dpbusd, as on VNNI CPUs)
    returncode, stdout, stderr = background
    assert returncode == 0 and stdout.strip() == "ok", stderr[-3000:]


def test_the_interleaved_kernels_can_be_cached_on_disk():
    """Every compiled version of the interleaved kernels, their one-row twins and experts kernels can go to Numba's
    on-disk cache: a launcher that reads a dynamic global (numba.get_num_threads, a ctypes pointer) is compiled again
    in every process, with a NumbaWarning 'Cannot cache' nobody sees. Compiles what the other tests of this file have
    not."""
    rng = np.random.default_rng(3)
    for qtype in sorted(REPACKED_TYPES):
        k = 256
        w8, kernel = repack(_random_blocks(qtype, 16, k, rng), qtype)
        for m in (1, 9):  # one row, and the tiles with their multi-row work items
            qx = Q.quantize_activations(rng.standard_normal((m, k)).astype(np.float32), qtype)
            for f in (kernel, ONE_ROW[kernel], STREAM_ROW[kernel]):
                f(w8, *qx.arrays, np.zeros((m, 16), np.float32))
        experts = (EXPERTS[kernel], EXPERTS_STREAM[EXPERTS[kernel]])
        for f in experts:  # a stack of two experts of 8 rows, both chosen
            f(w8, *qx.arrays, np.zeros((2, 8), np.float32), np.array([1, 0], np.int32), 1)
        for f in (kernel, ONE_ROW[kernel], STREAM_ROW[kernel], *experts):
            assert f.overloads, f
            for cres in f.overloads.values():
                assert not cres.library.has_dynamic_globals, (qtype, f.py_func.__name__)


@pytest.mark.skipif(not dot.AMX_PERMITTED, reason="this CPU or kernel gives no AMX tiles (Sapphire Rapids+, Linux)")
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.IQ4_NL, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS])
def test_amx_tiles_give_the_same_bits(qtype):
    """The AMX routes (dot._rows_amx, _rowsk_amx: 16 x 16 tiles, a partial last tile, an odd last group, work items
    of several pairs of groups) against the same product with AMX off (the K-quants' pair tiles, the 32-value types'
    two pairs of groups at a time: dot._z8_tiles) and the file layout's kernel, bit for bit."""
    rng = np.random.default_rng(int(qtype))
    # 1048 rows: work items of several pairs of groups (dot._x8_chunk), the last one with an odd group
    for n, k in ((40, 256), (64, 2048), (1048, 256)) if qtype in K_TYPES else ((40, 96), (64, 2048), (1048, 256)):
        w = _random_blocks(qtype, n, k, rng)
        w8, kernel = repack(w, qtype)
        for m in (dot.AMX_MIN_ROWS, dot.AMX_MIN_ROWS + 5, 70, 128):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x[3, :32] = 0.0
            qx = Q.quantize_activations(x, qtype)
            want, no_amx, tiles = (np.full((m, n), np.nan, np.float32) for _ in range(3))
            Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
            try:
                dot.use_amx(False)
                kernel(w8, *qx.arrays, no_amx)
            finally:
                assert dot.use_amx(True)
            kernel(w8, *qx.arrays, tiles)
            assert np.array_equal(want.view(np.int32), no_amx.view(np.int32)), (m, n, k)
            assert np.array_equal(want.view(np.int32), tiles.view(np.int32)), (m, n, k)


def _assert_kernels_agree(qtype, w, w8, kernel, m, n, k, rng):
    """m random activation rows (with a block of zeros, d = 0, and a row of large quants against the codes' offsets)
    through the file layout's kernel, the interleaved layout's `kernel` and its one-row kernel: the same bits."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[min(3, m - 1), :32] = 0.0
    x[min(5, m - 1)] *= 1e3
    qx = Q.quantize_activations(x, qtype)
    want, got, one = (np.full((m, n), np.nan, np.float32) for _ in range(3))
    Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
    kernel(w8, *qx.arrays, got)
    ONE_ROW[kernel](w8, *qx.arrays, one)
    assert np.array_equal(want.view(np.int32), got.view(np.int32)), (m, n, k, np.abs(want - got).max())
    assert np.array_equal(want.view(np.int32), one.view(np.int32)), (m, n, k)


@pytest.mark.skipif(not dot.VNNI_TILES, reason="the VNNI tiles run on AVX-512 VNNI CPUs")
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.IQ4_NL, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS])
def test_vnni_tiles_give_the_same_bits(qtype):
    """The VNNI tiles (dot._rows_vnni: 8 activation rows at a time, a partial last 8; _rowsk_vnni: 4 rows against two
    pairs of groups at a time, a partial last 4, an odd last pair; an odd last group, work items of several pairs of
    groups, K up to 8,192) against the file layout's kernel and decode's one-row kernel, bit for bit; one row fewer
    than the VNNI tiles' minimum takes the pair tiles (the K-quants) or two pairs of groups at a time (the 32-value
    types), the same bits again. With AMX, the VNNI tiles take the rows below
    the AMX tiles' minimum (the K-quants from 16 rows; the 32-value types never: theirs is the AMX tiles' minimum)."""
    lo = dot.VNNI_MIN_ROWS if qtype in K_TYPES else dot.VNNI_MIN_ROWS_32
    hi = dot.AMX_MIN_ROWS if dot.AMX_CPU else 1 << 30
    if dot.AMX_CPU:  # from the AMX tiles' minimum on, never the VNNI tiles (a worker tells the two apart by rows)
        assert not dot._vnni_tiles(hi, qtype.value) and not dot._vnni_tiles(128, qtype.value)
    if lo >= hi:
        pytest.skip("with AMX the 32-value types go from two pairs of groups at a time to the AMX tiles")
    rng = np.random.default_rng(int(qtype))
    shapes = (
        ((40, 256), (64, 2048), (1048, 256), (24, 8192)) if qtype in K_TYPES else ((40, 96), (64, 2048), (1048, 256))
    )
    for n, k in shapes:
        w = _random_blocks(qtype, n, k, rng)
        w8, kernel = repack(w, qtype)
        for m in [m for m in (lo - 1, lo, lo + 7, lo + 13, 128) if m < hi]:
            assert dot._vnni_tiles(m, qtype.value) == (m >= lo)  # the products below do take the VNNI tiles
            _assert_kernels_agree(qtype, w, w8, kernel, m, n, k, rng)


@pytest.mark.skipif(not dot.HAS_ZMM, reason="rows of 8 run on AVX-512 VNNI CPUs")
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.IQ4_NL])
def test_rows_of_8_give_the_same_bits(qtype):
    """From Z8_MIN_ROWS rows up to the VNNI / AMX tiles' minimum, two pairs of groups at a time against every
    activation row (dot._rows_zq, its m terms 8 rows at a time): one 8, several, a partial last 8, work items of whole
    fours and with 1 or 3 groups left, against the file layout's kernel and decode's one-row kernel, bit for bit; one
    row fewer than the minimum (one row) takes decode's kernel, the same bits again."""
    rng = np.random.default_rng(int(qtype) + 100)
    lo = dot.Z8_MIN_ROWS
    rows = [m for m in (lo - 1, lo, lo + 5, 2 * lo, 2 * lo + 3, dot.Z8_MAX_ROWS - 1) if m < dot.Z8_MAX_ROWS]
    for n, k in ((40, 96), (64, 2048), (1048, 256)):
        w = _random_blocks(qtype, n, k, rng)
        w8, kernel = repack(w, qtype)
        for m in rows:
            assert dot._z8_tiles(m, qtype.value) == (m >= lo)  # the products at and above lo do take the rows of 8
            _assert_kernels_agree(qtype, w, w8, kernel, m, n, k, rng)


@pytest.mark.skipif(not dot.AMX_PERMITTED, reason="this CPU or kernel gives no AMX tiles (Sapphire Rapids+, Linux)")
def test_amx_q8_0_tiles_give_the_same_bits():
    """Q8_0 products of AMX_Q8_0_MIN_ROWS to AMX_Q8_0_ROWS (16) rows on the AMX tiles, the layout's code chunks staged
    as B tiles (dot._rows_amx_q8_0: a tile of fewer than 16 rows, an odd last group, work items of several pairs of
    groups, rows of 1, 2, 3 and more blocks: the pipeline's even and odd ends) against the file layout's kernel,
    decode's one-row kernel and the same product with the tiles off (_rows_zq), bit for bit; a row fewer than the
    minimum or more than 16 stays on _rows_zq."""
    rng = np.random.default_rng(11)
    lo, hi = dot.AMX_Q8_0_MIN_ROWS, dot.AMX_Q8_0_ROWS
    for n, k in ((24, 32), (16, 64), (40, 96), (64, 2048), (1048, 256)):
        w = _random_blocks(T.Q8_0, n, k, rng)
        w8, kernel = repack(w, T.Q8_0)
        for m in (lo - 1, lo, lo + 3, hi, hi + 1):
            assert dot._amx_q8_0_tiles(m) == (lo <= m <= hi)  # the products from lo to 16 rows do take the tiles
            _assert_kernels_agree(T.Q8_0, w, w8, kernel, m, n, k, rng)
            qx = Q.quantize_activations(rng.standard_normal((m, k)).astype(np.float32), T.Q8_0)
            tiles, zq = np.full((m, n), np.nan, np.float32), np.full((m, n), np.nan, np.float32)
            kernel(w8, *qx.arrays, tiles)
            try:
                dot.use_amx(False)
                assert not dot._amx_q8_0_tiles(m)
                kernel(w8, *qx.arrays, zq)
            finally:
                assert dot.use_amx(True)
            assert np.array_equal(tiles.view(np.int32), zq.view(np.int32)), (m, n, k)


@pytest.mark.skipif(not dot.AMX_PERMITTED, reason="this CPU or kernel gives no AMX tiles (Sapphire Rapids+, Linux)")
def test_amx_switched_while_products_run():
    """use_amx flipped from another thread between a launcher's choice and its workers' never changes a product's
    bits: a worker takes the route its launcher's layout says (dot._amx_given), not the flag."""
    import threading

    rng = np.random.default_rng(7)
    for qtype in (T.Q4_0, T.Q4_K):
        n, k = (64, 512) if qtype == T.Q4_K else (64, 96)
        w = _random_blocks(qtype, n, k, rng)
        w8, kernel = repack(w, qtype)
        qx = Q.quantize_activations(rng.standard_normal((dot.AMX_MIN_ROWS + 5, k)).astype(np.float32), qtype)
        want = np.zeros((dot.AMX_MIN_ROWS + 5, n), np.float32)
        Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
        stop = threading.Event()
        t = threading.Thread(target=_flip_amx, args=(stop,))
        t.start()
        try:
            for _ in range(300):
                got = np.full_like(want, np.nan)
                kernel(w8, *qx.arrays, got)
                assert np.array_equal(want.view(np.int32), got.view(np.int32))
        finally:
            stop.set()
            t.join()
            dot.use_amx(True)


def _flip_amx(stop) -> None:
    on = False
    while not stop.is_set():
        dot.use_amx(on)
        on = not on
