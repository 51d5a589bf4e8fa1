"""Q4_0 / Q4_1 weights in the interleaved layout of ggufrun.quants.repack give the same bits as in the file's."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import ggufrun.quants as Q
from ggufrun.model import Transformer
from ggufrun.model.linear import Linear
from ggufrun.quants.repack import REPACKED_TYPES, ROW_LOOKUP_TYPES, get_rows, repack
from ggufrun.reader import GGUFFile


def _random_blocks(qtype: T, n: int, k: int, rng) -> np.ndarray:
    """n rows of k values quantized by gguf-py (real scales and codes, not random bytes)."""
    from gguf.quants import quantize

    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", sorted(REPACKED_TYPES))
@pytest.mark.parametrize(("n", "k"), [(8, 32), (64, 96), (40, 2048)])
def test_repacked_kernel_gives_the_file_layouts_bits(qtype, n, k):
    rng = np.random.default_rng(n + k)
    w = _random_blocks(qtype, n, k, rng)
    w8, kernel = repack(w, qtype)
    assert w8.shape == (n // 8, w.shape[1] * 8) and w8.nbytes == w.nbytes
    for m in (1, 3, 4, 5, 8, 70):  # decode, the rows8x1 / tile split of the file layout, several tiles
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :32] = 0.0  # a block of zeros (d = 0)
        qx = Q.quantize_activations(x, qtype)
        want, got = np.zeros((m, n), np.float32), np.full((m, n), np.nan, np.float32)
        Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
        kernel(w8, *qx.arrays, got)
        assert np.array_equal(want.view(np.int32), got.view(np.int32)), (m, np.abs(want - got).max())


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
    assert repack(np.zeros((16, 210), np.uint8), T.Q6_K) is None  # no interleaved layout
    assert repack(np.zeros((16, 21), np.uint8), T.Q4_1) is None  # not whole blocks


GOLDEN = Path(__file__).parent / "data" / "golden"


@pytest.mark.parametrize("qtype", sorted(ROW_LOOKUP_TYPES))
def test_rows_read_back_from_the_interleaved_layout(qtype):
    rng = np.random.default_rng(3)
    w = _random_blocks(qtype, 48, 64, rng)
    w8, _ = repack(w, qtype)
    ids = np.array([0, 47, 8, 7, 7, 33])
    assert np.array_equal(get_rows(w8, qtype, ids), Q.get_rows(w, qtype, ids))
    with pytest.raises(IndexError):
        get_rows(w8, qtype, [48])
    with pytest.raises(ValueError, match="Q5_0"):
        get_rows(repack(_random_blocks(T.Q5_0, 8, 32, rng), T.Q5_0)[0], T.Q5_0, [0])


@pytest.mark.parametrize("name", ["small-llama-q4_0", "small-llama-q4_1", "small-llama-q5_0", "small-llama-tied-q8_0"])
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
    assert sum(released) == sum(lin.w.nbytes for lin in packed) > 0  # every byte of every repacked matrix
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
    for f, lin in file_layout.items():
        object.__setattr__(plain.weights, f, lin)
    assert not any(lin.packed for L in plain.weights.layers for lin in L.matrices) and not plain.weights.output.packed
    assert np.array_equal(plain.logits(ids).view(np.int32), logits.view(np.int32))


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
for qtype in sorted(REPACKED_TYPES):
    w = quantize(rng.standard_normal((64, 96)).astype(np.float32), qtype)
    w8, kernel = repack(w, qtype)
    for m in (1, 5):
        qx = Q.quantize_activations(rng.standard_normal((m, 96)).astype(np.float32), qtype)
        want, got = np.zeros((m, 64), np.float32), np.zeros((m, 64), np.float32)
        Q.REGISTRY[qtype].dot(w, *qx.arrays, want)
        kernel(w8, *qx.arrays, got)
        assert np.array_equal(want.view(np.int32), got.view(np.int32)), (qtype, m)
print("ok")
"""


def test_interleaved_kernels_on_a_cpu_without_avx2(tmp_path):
    # the portable LLVM IR paths (no vpmaddubsw; Q8_0's codes + 128 against dpbusd, as on VNNI CPUs), compiled for a
    # generic x86-64 target in a subprocess with its own Numba cache
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", PORTABLE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
