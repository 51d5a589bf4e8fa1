"""128-row matmul, Q4_0 / Q4_K / Q6_K weights: one activation row per weight-block decode (v1), four (v2, the
package's kernels), or dequantized tiles + BLAS (v3, `matmul_dequant`, float activations).

One thread, OPENBLAS_CORETYPE=Haswell as set on the target machine, 4096 x 4096, GFLOP/s (measured there):
    Q4_0: v1 ~54, v2 ~90, v3 ~65      Q4_K: v1 ~50, v2 ~75, v3 ~55      Q6_K: v1 ~37, v2 ~52, v3 ~45

v1 and v3 are checked against v2 (v1 bit for bit: the kernels are batch-invariant). --quick: 256 x 256 x 8, a
few timing runs (tests/test_dev_scripts.py).
"""

import argparse
import time

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

import ggufrun.quants as Q


def best(fn, reps=5):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def run(qtype, rng, N=4096, K=4096, M=128, reps=5):
    e = Q.REGISTRY[qtype]
    raw = rng.integers(0, 256, (N, K // e.block_size, e.type_size), dtype=np.uint8)
    for off in e.f16_fields:
        half = (rng.standard_normal(raw.shape[:2]) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = half[..., None].view(np.uint8)
    w = Q._weights(raw.reshape(N, -1), e)
    X = rng.standard_normal((M, K)).astype(np.float32)
    qx = Q.quantize_activations(X, qtype)
    ref = Q.matmul_q(w, qtype, qx)
    Y = np.empty_like(ref)
    # v1: the kernel called one activation row at a time (its M = 1 path decodes per row)
    rows = [Q.QuantizedActivations(qx.format, 1, K, tuple(a[m : m + 1] for a in qx.arrays)) for m in range(M)]

    def v1():
        for m in range(M):
            Q.matvec_q(w, qtype, rows[m], Y[m])

    v1()
    np.testing.assert_array_equal(Y, ref)
    Q.matmul_dequant(w, qtype, X, Y)  # float activations: differs from v2 by the 8-bit activation rounding
    np.testing.assert_allclose(Y, ref, rtol=0.05, atol=0.02 * np.abs(ref).max())
    flop = 2 * M * N * K / 1e9
    t1 = best(v1, reps)
    t2 = best(lambda: Q.matmul_q(w, qtype, qx, Y), reps)
    t3 = best(lambda: Q.matmul_dequant(w, qtype, X, Y), reps)
    print(
        f"{qtype.name}: v1 1-row {flop / t1:5.1f}  v2 4-row {flop / t2:5.1f}  v3 dequant+BLAS {flop / t3:5.1f} GFLOP/s"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small matrices, few runs (a smoke test)")
    args = p.parse_args(argv)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    shape = dict(N=256, K=256, M=8, reps=2) if args.quick else {}
    for qtype in (T.Q4_0, T.Q4_K, T.Q6_K):
        run(qtype, rng, **shape)


if __name__ == "__main__":
    main()
