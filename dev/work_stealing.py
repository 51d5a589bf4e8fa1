"""Work stealing against a static split, on cores that may run at different speeds right now.

    PYTHONPATH=. python dev/work_stealing.py --rows 1,8,16 --iterations 300
    PYTHONPATH=. python dev/work_stealing.py --quick        # a few iterations (tests/test_dev_scripts.py)

The kernels' parallel loop (ggufrun.quants.launch.parallel_items) deals a region's items by work stealing: each
thread starts on an equal run of them and, its run done, takes the back half of another thread's remaining run. This
times it against the split prange makes (OpenMP's static schedule: thread t runs the t-th equal run, nothing more),
on the same worker and items (a batched decode step's product, Q4_1 3,072 x 576, weights in cache), in one process.
Each iteration first times the product on 1 thread pinned to each CPU in turn (Linux: os.sched_setaffinity), which
says how far apart the CPUs run at that moment, then on 2 threads with the static split and with stealing (the
order alternating). The iterations are then grouped by that skew. On the 2-core Intel Xeon VM of 2026-12-06 one
core at times ran the product 1.35-1.7x slower than the other (another tenant on it); with 2 threads the static
split then took 39.1 / 86.4 / 182.6 us at 1 / 8 / 16 rows and stealing 32.2 / 69.4 / 138.3 (0.80-0.83x); where the
cores ran within 1.15x of each other, 0.98-1.00x.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
from numba import njit, prange

import ggufrun.quants as Q
from ggufrun.quants import dot
from ggufrun.quants.launch import call_worker
from ggufrun.quants.repack import repack
from ggufrun.runtime import on_compute_thread, set_threads


@njit(parallel=True, nogil=True)
def static_split(w, d, s, qs, sums, out, per):
    """dot_q4_1_x8's items dealt as prange deals them (each thread an equal run), the worker called by name."""
    G = w.shape[0]
    for c in prange((G + per - 1) // per):  # (every route of Q4_1 takes the activations as they are)
        call_worker("_rows_q4_1_x8", (w, d, s, qs, sums, out, c * per, min(G, c * per + per)))


def best_us(fn, args, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def measure(rows: int, iterations: int, reps: int) -> None:
    rng = np.random.default_rng(0)
    w, product = repack(quantize(rng.standard_normal((3072, 576)).astype(np.float32), T.Q4_1), T.Q4_1)
    qx = Q.quantize_activations(rng.standard_normal((rows, 576)).astype(np.float32), T.Q4_1)
    out, ref = np.empty((rows, 3072), np.float32), np.empty((rows, 3072), np.float32)
    args = (w, *qx.arrays, out)
    per = dot._x8_chunk(w.shape[0], w.shape[1], rows, 576, T.Q4_1)
    product(w, *qx.arrays, ref)  # compiled or loaded, and the worker exported for static_split
    static_split(*args, per)
    assert np.array_equal(out, ref), "the static split must give the launcher's bits"
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = len(cpus) >= 2
    found = []
    for i in range(iterations):
        one = []
        if pinned:
            set_threads(1)
            for cpu in cpus[:2]:
                os.sched_setaffinity(0, {cpu})
                one.append(best_us(product, args, reps))
            os.sched_setaffinity(0, set(cpus))
        set_threads(2)
        timed = {}
        for how in ("static", "stealing") if i % 2 else ("stealing", "static"):
            if how == "static":
                timed[how] = best_us(static_split, (*args, per), reps)
            else:
                timed[how] = best_us(product, args, reps)
        skew = max(one) / min(one) if one else 1.0
        found.append((skew, min(one, default=0.0), max(one, default=0.0), timed["static"], timed["stealing"]))
    a = np.array(found)
    for lo, hi in ((1.0, 1.15), (1.15, 1.35), (1.35, np.inf)):
        sel = a[(a[:, 0] >= lo) & (a[:, 0] < hi)]
        if len(sel):
            print(f"{rows:3d} rows, CPUs {lo:.2f}-{hi:.2f}x apart ({len(sel)} iterations): 1 thread "
                  f"{np.median(sel[:, 1]):6.1f} / {np.median(sel[:, 2]):6.1f} us; 2 threads static "
                  f"{np.median(sel[:, 3]):6.1f}, stealing {np.median(sel[:, 4]):6.1f} us "
                  f"({np.median(sel[:, 4] / sel[:, 3]):.3f}x)", flush=True)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,8,16", help="activation rows, comma-separated (under 32)")
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--reps", type=int, default=5, help="calls per timing (the fastest counts)")
    p.add_argument("--quick", action="store_true", help="a few iterations (tests)")
    a = p.parse_args()
    if a.quick:
        a.rows, a.iterations, a.reps = "8", 2, 1
    for rows in (int(r) for r in a.rows.split(",")):
        if not 0 < rows < 32:
            raise SystemExit(f"--rows: {rows} is not in 1..31 (from 32 rows the product takes other tiles)")
        on_compute_thread(measure, rows, a.iterations, a.reps)


if __name__ == "__main__":
    main()
