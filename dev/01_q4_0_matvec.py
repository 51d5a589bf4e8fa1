"""Q4_0 matvec: plain Numba loops vs the explicit vector intrinsics of ggufrun.quants.dot.

v1 scalar:     per block, an int32 dot over the 32 nibbles and int8 activations, one float FMA.
               LLVM does not vectorise the block reductions the way we want: ~3 GMAC/s.
v2 intrinsics: what ggufrun.quants uses (dpbusd on 32 x u8 codes . 32 x s8 activations): ~25 GMAC/s.
(Numba's SLP vectoriser, off by default since Numba 0.57 because of miscompilations, gets v1 to ~6 GMAC/s.)

Both are checked against a float64 product of the dequantized weights and activations (the script fails if
either is off by more than float32 rounding). --quick: 256 x 512, a few timing runs (tests/test_dev_scripts.py).
"""

import argparse
import time

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit

import ggufrun.quants as Q
from ggufrun.quants.jit import FAST


@njit(inline="always", **FAST)
def _f16(lo, hi):
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = h & 0x7C00
    if e == 0:
        f = np.float32(h & 0x3FF) * np.float32(2.0**-24)
    elif e == 0x7C00:
        f = np.uint32(((h & 0x3FF) << 13) | 0x7F800000).view(np.float32)
    else:
        f = np.uint32(((h & 0x7FFF) << 13) + 0x38000000).view(np.float32)
    return -f if h & 0x8000 else f


@njit(**FAST)
def v1_scalar(w, qs, d, out):
    N = w.shape[0]
    nb = w.shape[1] // 18
    for n in range(N):
        acc = np.float32(0.0)
        for b in range(nb):
            o = b * 18
            s = np.int32(0)
            for j in range(16):
                v = np.int32(w[n, o + 2 + j])
                s += ((v & 15) - 8) * np.int32(qs[0, b * 32 + j])
                s += ((v >> 4) - 8) * np.int32(qs[0, b * 32 + 16 + j])
            acc += _f16(w[n, o], w[n, o + 1]) * d[0, b] * np.float32(s)
        out[n] = acc


def best(fn, reps=20):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main(argv=None) -> None:
    import numba

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small matrix, few runs (a smoke test)")
    args = p.parse_args(argv)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    N, K, reps = (256, 512, 3) if args.quick else (4096, 4096, 20)
    W = rng.standard_normal((N, K)).astype(np.float32)
    w = Q._weights(gguf.quants.quantize(W, T.Q4_0), Q.REGISTRY[T.Q4_0])
    x = rng.standard_normal(K).astype(np.float32)
    qx = Q.quantize_activations(x, T.Q4_0)
    d, _, qs, _ = qx.arrays
    ref = qs[0].astype(np.float64).reshape(-1, 32) * d[0, :, None]
    ref = Q.dequantize(w, T.Q4_0).astype(np.float64) @ ref.reshape(-1)
    y1 = np.empty(N, np.float32)
    v1_scalar(w, qs, d, y1)
    y2 = Q.matvec_q(w, T.Q4_0, qx)
    for name, y, fn in [
        ("v1 scalar loops", y1, lambda: v1_scalar(w, qs, d, y1)),
        ("v2 intrinsics", y2, lambda: Q.matvec_q(w, T.Q4_0, qx, y2)),
    ]:
        err = np.abs(y - ref).max() / np.abs(ref).max()
        assert err < 1e-5, f"{name}: max relative error {err:.1e} against the float64 reference"
        t = best(fn, reps)
        print(f"{name:16s} max rel err {err:.1e}  {t * 1e3:7.3f} ms  {N * K / t / 1e9:5.1f} GMAC/s")


if __name__ == "__main__":
    main()
