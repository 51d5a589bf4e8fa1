"""Kernel benchmark: matvec / matmul throughput per weight type and shape, read bandwidth, compile times.

    python benchmarks/kernels.py                                  # all types and shapes, 1 and 2 threads
    python benchmarks/kernels.py --types Q4_0,Q4_K --shapes 4096x4096 --threads 2
    python benchmarks/kernels.py --compile --json kernels.json    # plus cold compile / cache-load per kernel

Per (type, N x K shape, threads): matvec time, weight GB/s (bytes of W read per second) and GFLOP/s
(2*N*K per call); 128-row matmul by integer dots (the `matmul` path) and by dequantized tiles + BLAS
(`matmul_dequant`), GFLOP/s each. The machine's read bandwidth is measured by the same script (a parallel
sum over a 1 GiB buffer) so the GB/s figures have a scale. Shapes are N x K (rows x row length), as GGUF
stores them. Weights are random blocks with valid fp16 scales; speed does not depend on the values.
Times are the best of several batches of calls (other processes on the shared cores only add time).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf import GGMLQuantizationType as T  # noqa: E402

import ggufrun.quants as Q  # noqa: E402

SHAPES = [(576, 1536), (1536, 576), (2048, 2048), (4096, 4096), (49152, 576)]
TYPES = [t.name for t in Q.REGISTRY]


def _openblas_threads():
    """numpy's OpenBLAS thread setter (so the BLAS path runs on the same thread count), or None."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "libscipy_openblas*.so"))
    for lib in libs:
        dll = ctypes.CDLL(lib)
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(dll, name):
                return getattr(dll, name)
    return None


_SET_BLAS_THREADS = _openblas_threads()


def set_threads(n: int) -> None:
    numba.set_num_threads(n)
    if _SET_BLAS_THREADS is not None:
        _SET_BLAS_THREADS(n)


def random_weights(qtype: T, N: int, K: int, rng) -> np.ndarray:
    """Random [N, row_bytes] blocks whose fp16 scale fields hold small normal values (typed for float types)."""
    e = Q.REGISTRY[qtype]
    if e.weight_dtype != np.uint8:
        W = (rng.standard_normal((N, K), dtype=np.float32) * 0.05).astype(np.float32)
        if qtype == T.F16:
            return W.astype(np.float16)
        if qtype == T.BF16:
            return (W.view(np.uint32) >> 16).astype(np.uint16)
        return W
    nb = K // e.block_size
    raw = rng.integers(0, 256, (N, nb, e.type_size), dtype=np.uint8)
    for off in e.f16_fields:
        h = (rng.standard_normal((N, nb), dtype=np.float32) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = h.view(np.uint8).reshape(N, nb, 2)
    if qtype == T.IQ1_M:  # its fp16 d is the top nibbles of the four scale words (bytes 49, 51, 53, 55)
        h = (rng.standard_normal((N, nb), dtype=np.float32) * 0.01).astype(np.float16).view(np.uint16).astype(np.int32)
        for k in range(4):
            raw[:, :, 49 + 2 * k] = (raw[:, :, 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
    if qtype == T.MXFP4:  # E8M0 exponent byte: scales around 2^-7
        raw[:, :, 0] = rng.integers(118, 123, (N, nb))
    return raw.reshape(N, nb * e.type_size)


def timeit(fn, min_time=0.02, batches=7, budget=1.5) -> float:
    """Seconds per call: the best batch (of calls lasting >= min_time) among at least `batches` batches,
    sampling on for up to `budget` seconds.

    The best, not the median: the 2 cores are shared with other processes, which only ever add time, and a
    2-thread parallel region stalls whenever one core is busy elsewhere; sampling over a longer window finds
    the moments both cores are free."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(min_time / one))
    best = float("inf")
    start = time.perf_counter()
    n = 0
    while n < batches or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
        n += 1
        if n >= batches and time.perf_counter() - start > budget:
            break
    return best


@numba.njit(parallel=True, cache=True)
def _sum_i64(a):
    s = 0
    for i in numba.prange(a.shape[0]):
        s += a[i]
    return s


def read_bandwidth(threads: int, nbytes: int) -> float:
    """GB/s of a parallel read-only sum over `nbytes`."""
    buf = np.ones(nbytes // 8, np.int64)
    set_threads(threads)
    t = timeit(lambda: _sum_i64(buf), min_time=0.2, batches=5, budget=3.0)
    return nbytes / t / 1e9


def bench_one(qtype: T, N: int, K: int, threads: int, rng, M: int = 128, matmul=True) -> dict:
    set_threads(threads)
    w = random_weights(qtype, N, K, rng)
    x = rng.standard_normal(K, dtype=np.float32)
    X = rng.standard_normal((M, K), dtype=np.float32)
    y = np.empty(N, np.float32)
    Y = np.empty((M, N), np.float32)
    qx = Q.quantize_activations(x, qtype)
    res = {"type": qtype.name, "N": N, "K": K, "threads": threads, "weight_bytes": int(w.nbytes)}
    w_ro = Q._weights(w, Q.REGISTRY[qtype])  # what the model passes: a read-only reader view
    t = timeit(lambda: Q.matvec_q(w_ro, qtype, qx, y))
    res["matvec_q_s"] = t
    res["matvec_s"] = timeit(lambda: Q.matvec(w_ro, qtype, x, y))
    res["matvec_GBps"] = w.nbytes / t / 1e9
    res["matvec_GFLOPs"] = 2 * N * K / t / 1e9
    if matmul:
        t = timeit(lambda: Q.matmul(w_ro, qtype, X, Y), min_time=0.05, batches=3, budget=1.0)
        res["matmul_int_s"] = t
        res["matmul_int_GFLOPs"] = 2 * M * N * K / t / 1e9
        t = timeit(lambda: Q.matmul_dequant(w_ro, qtype, X, Y), min_time=0.05, batches=3, budget=1.0)
        res["matmul_blas_s"] = t
        res["matmul_blas_GFLOPs"] = 2 * M * N * K / t / 1e9
    return res


# ---- compile times (each probe runs in a fresh interpreter) -----------------------------------------------


def _probe(types: list[str]) -> dict:
    """First call of each kernel: compile when the cache is empty, load when it is warm.

    CPU seconds of this process (compilation is single-threaded, and CPU time does not count the other
    processes on the shared cores); the wall-clock total is reported alongside."""
    w0, c0 = time.perf_counter(), time.process_time()
    import ggufrun.quants as q  # noqa: F811 (already imported with this script: startup_s covers it)

    out = {"startup_s": c0}  # CPU seconds from interpreter start: Python, NumPy, Numba, ggufrun imports
    rng = np.random.default_rng(0)

    def timed(fn):
        c = time.process_time()
        fn()
        return time.process_time() - c

    for name in types:
        qtype = T[name]
        e = q.REGISTRY[qtype]
        K = max(256, e.block_size)
        w = q._weights(random_weights(qtype, 4, K, rng), e)
        x = np.ones((1, K), np.float32)
        r = {"dequant_s": timed(lambda: e.dequant(w, np.zeros(1, np.int64), np.empty((1, K), np.float32)))}  # noqa: B023
        r["act_" + e.act + "_s"] = timed(lambda: q.quantize_activations(x, qtype))  # noqa: B023
        qx = q.quantize_activations(x, qtype)
        r["dot_s"] = timed(lambda: e.dot(w, *qx.arrays, np.empty((1, 4), np.float32)))  # noqa: B023
        out[name] = r
    out["wall_s"] = time.perf_counter() - w0
    out["cpu_s"] = time.process_time() - c0
    return out


def compile_times(types: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        runs = {}
        for label in ("cold", "cached"):
            cmd = [sys.executable, __file__, "--probe", ",".join(types)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[label] = json.loads(p.stdout.strip().splitlines()[-1])
    return runs


# ---- report -----------------------------------------------------------------------------------------------

HEADER = (
    f"{'type':7s} {'N x K':>11s} {'thr':>3s} | {'matvec us':>9s} {'GB/s':>6s} {'%bw':>4s} {'GFLOP/s':>7s}"
    f" {'+quant us':>9s} | {'mm128 int ms':>12s} {'GFLOP/s':>7s} | {'mm128 blas ms':>13s} {'GFLOP/s':>7s}"
)


def format_row(r: dict, bw: dict) -> str:
    """One table line; %bw is the matvec's weight GB/s over the read bandwidth of a 32 MiB buffer."""
    t = r["threads"]
    shape = f"{r['N']}x{r['K']}"
    line = (
        f"{r['type']:7s} {shape:>11s} {t:3d} | {r['matvec_q_s'] * 1e6:9.1f} "
        f"{r['matvec_GBps']:6.1f} {100 * r['matvec_GBps'] / bw[t]:4.0f} {r['matvec_GFLOPs']:7.1f}"
        f" {r['matvec_s'] * 1e6:9.1f} |"
    )
    if "matmul_int_s" in r:
        line += (
            f" {r['matmul_int_s'] * 1e3:12.2f} {r['matmul_int_GFLOPs']:7.1f} |"
            f" {r['matmul_blas_s'] * 1e3:13.2f} {r['matmul_blas_GFLOPs']:7.1f}"
        )
    return line


def print_bandwidth(bw: dict, bw_cache: dict) -> None:
    print("read bandwidth, parallel sum: 1 GiB: " + ", ".join(f"{t} thr {g:.1f} GB/s" for t, g in bw.items()))
    print("                             32 MiB: " + ", ".join(f"{t} thr {g:.1f} GB/s" for t, g in bw_cache.items()))
    print("(%bw: matvec weight GB/s as a share of the 32 MiB figure: the benchmark's weights, 0.5-64 MB, are")
    print(" read again and again and stay cache-resident, like the 32 MiB buffer)")


def print_compile(ct: dict, names: list[str]) -> None:
    print("\nfirst-call CPU seconds per kernel: cold = empty cache (compile), cached = load from the cache")
    su = ct["cold"]["startup_s"], ct["cached"]["startup_s"]
    print(f"process start-up incl. imports: cold {su[0]:.2f}, cached {su[1]:.2f}")
    print(f"{'type':7s} | {'dequant':>15s} | {'activations':>15s} | {'dot':>15s}")
    tot = {"cold": 0.0, "cached": 0.0}
    for name in names:
        cells = []
        for kind in ("dequant_s", None, "dot_s"):
            key = kind or next(k for k in ct["cold"][name] if k.startswith("act_"))
            cells.append(f"{ct['cold'][name][key]:6.2f} / {ct['cached'][name][key]:6.3f}")
            for lab in tot:
                tot[lab] += ct[lab][name][key]
        print(f"{name:7s} | " + " | ".join(f"{c:>15s}" for c in cells))
    print(
        f"total: cold {tot['cold']:.1f} s, cached {tot['cached']:.2f} s (CPU); whole probe process: cold "
        f"{ct['cold']['cpu_s']:.1f} s CPU / {ct['cold']['wall_s']:.1f} s wall, cached "
        f"{ct['cached']['cpu_s']:.2f} s CPU / {ct['cached']['wall_s']:.2f} s wall"
    )


def merge(paths: list[str]) -> dict:
    """Best of several --json runs (each figure the fastest seen): on shared cores no single run is clean."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    out = {"env": runs[0]["env"], "merged_from": paths}
    for key in ("read_GBps", "read_GBps_32MiB"):  # JSON made the thread counts strings
        seen = [{int(t): g for t, g in r[key].items()} for r in runs if key in r]
        out[key] = {t: max(b[t] for b in seen if t in b) for t in seen[0]}
    best: dict = {}
    for r in (r for run in runs for r in run["results"]):
        k = (r["type"], r["N"], r["K"], r["threads"])
        if k not in best:
            best[k] = dict(r)
            continue
        for f in ("matvec_q_s", "matvec_s", "matmul_int_s", "matmul_blas_s"):
            if f in r:
                best[k][f] = min(best[k][f], r[f])
    for r in best.values():
        N, K, M = r["N"], r["K"], 128
        r["matvec_GBps"] = r["weight_bytes"] / r["matvec_q_s"] / 1e9
        r["matvec_GFLOPs"] = 2 * N * K / r["matvec_q_s"] / 1e9
        if "matmul_int_s" in r:
            r["matmul_int_GFLOPs"] = 2 * M * N * K / r["matmul_int_s"] / 1e9
            r["matmul_blas_GFLOPs"] = 2 * M * N * K / r["matmul_blas_s"] / 1e9
    out["results"] = list(best.values())
    out["compile"] = next(
        (r["compile"] for r in reversed(runs) if "startup_s" in r.get("compile", {}).get("cold", {})), None
    )
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated, e.g. Q4_0,Q4_K (default: all)")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="N x K list")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-matmul", action="store_true", help="matvec only (quick)")
    ap.add_argument("--compile", action="store_true", help="also measure cold compile / cache-load times")
    ap.add_argument("--json", help="write all results to this file")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="print the best of earlier --json runs")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        print(json.dumps(_probe(args.probe.split(","))))
        return
    if args.merge:
        report = merge(args.merge)
        print(f"best of {len(args.merge)} runs, OPENBLAS_CORETYPE={report['env']['OPENBLAS_CORETYPE']}")
        print_bandwidth(report["read_GBps"], report["read_GBps_32MiB"])
        print(HEADER)
        print("-" * len(HEADER))
        for r in report["results"]:
            print(format_row(r, report["read_GBps_32MiB"]))
        if report["compile"]:
            print_compile(report["compile"], list(dict.fromkeys(r["type"] for r in report["results"])))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return

    types = [T[t.strip().upper()] for t in args.types.split(",")]
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    rng = np.random.default_rng(0)
    report = {"env": {"OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"), "numba": numba.__version__}}

    print("compiling kernels ...", flush=True)
    print(f"  warmup: {Q.warmup(types):.1f} s (compile, or load from the cache)")
    _sum_i64(np.ones(8, np.int64))
    bw = {t: read_bandwidth(t, 1 << 30) for t in threads}  # memory, beyond the caches
    bw_cache = {t: read_bandwidth(t, 32 << 20) for t in threads}  # cache-resident, like the repeated weights
    report["read_GBps"] = bw
    report["read_GBps_32MiB"] = bw_cache
    print_bandwidth(bw, bw_cache)

    rows = []
    print(HEADER)
    print("-" * len(HEADER))
    for qtype in types:
        for N, K in shapes:
            if K % Q.REGISTRY[qtype].block_size or K % 256 and Q.REGISTRY[qtype].act == "Q8_K":
                continue
            for t in threads:
                r = bench_one(qtype, N, K, t, rng, matmul=not args.no_matmul)
                rows.append(r)
                print(format_row(r, bw_cache), flush=True)
    report["results"] = rows
    print("matvec us: matvec_q (activations already quantized); +quant us: matvec incl. quantizing x")

    if args.compile:
        report["compile"] = compile_times([t.name for t in types])
        print_compile(report["compile"], [t.name for t in types])

    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
